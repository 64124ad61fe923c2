//! Timer memory: the resident memory a million pending timers add to the Scheduler's time wheel
//! (the same wheel and payload as in production: a job slot and a generation), read from
//! /proc/self/statm before and after.

use ax_actors::bench::LoadedWheel;

use crate::Figure;

/// This process's resident memory (from `/proc/self/statm`).
pub(crate) fn resident_bytes() -> u64 {
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

pub(crate) fn measure() -> Vec<Figure> {
    let n = TIMERS;
    let before = resident_bytes();
    // Spread over a day, as cron fires of many jobs would be.
    let wheel = LoadedWheel::new(n, 1_800_000_000_000, 7);
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
