//! Timer memory: the resident memory a million pending timers add to the Scheduler's time wheel
//! (the same wheel and payload as in production: a job slot and a generation), read from
//! /proc/self/statm before and after.

use ax_actors::scheduler::time_wheel::TimeWheel;
use rand::{Rng, SeedableRng};

use super::Figure;

fn resident_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .unwrap_or(0);
    pages * 4096
}

/// A million timers, quick or not: the measure is cheap.
const TIMERS: u64 = 1_000_000;

pub fn measure() -> Vec<Figure> {
    let n = TIMERS;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let now = 1_800_000_000_000u64;
    let before = resident_bytes();
    let mut wheel: TimeWheel<(u32, u32)> = TimeWheel::new(now);
    for i in 0..n {
        // Spread over a day, as cron fires of many jobs would be.
        wheel.insert(now + rng.random_range(1..86_400_000), (i as u32, 0));
    }
    let after = resident_bytes();
    let per_timer = after.saturating_sub(before) as f64 / n as f64;
    let pending = wheel.len();
    drop(wheel);
    vec![Figure {
        section: "memory",
        name: "bytes per pending timer".into(),
        value: per_timer,
        unit: "B",
        note: format!("{pending} timers spread over a day (RSS difference)"),
    }]
}
