//! The adaptive budget: how many slots a worker offers, following the machine's pressure.
//!
//! A fixed number of slots is wrong both ways: CPU-bound attempts beyond the cores only slow
//! each other down (and the high-priority attempt among them), while attempts that wait on a
//! database or a remote service leave the machine idle at the same count. With
//! `[worker.adaptive]` the worker samples the machine twice a second ([`super::pressure`]) and
//! decides every `every`:
//!
//! - available memory under `memory_min` → one slot fewer (`memory_low`);
//! - else more runnable tasks per core than `load_high` → one slot fewer (`load_high`);
//! - else dispatches waiting for a slot while the load is under `load_low` → one more (`room`);
//! - else kept (`steady`).
//!
//! Always within `min..=max`. One step per decision, with a band between the two loads, so a
//! worker of CPU-bound attempts settles about one attempt per core instead of swinging. The
//! decision is pure (this module); the actor samples, applies it to [`super::slots::Slots`] and
//! publishes it in its heartbeat and metrics.

use std::time::Duration;

use ax_bus::messages::{BudgetReason, SlotBudget};

/// `[worker.adaptive]`: the bounds and thresholds of the budget.
#[derive(Clone, Debug, PartialEq)]
pub struct Adaptive {
    /// The smallest budget.
    pub min: u32,
    /// The largest budget.
    pub max: u32,
    /// Runnable tasks per core above which the budget shrinks.
    pub load_high: f64,
    /// Runnable tasks per core under which it may grow (while work waits).
    pub load_low: f64,
    /// Available memory (bytes) under which it shrinks.
    pub memory_min: u64,
    /// Time between decisions.
    pub every: Duration,
}

impl Adaptive {
    /// Between `min` and `max`, with the default thresholds: shrink above 1.25 runnable tasks
    /// per core or under 256 MiB available, grow under 0.9, a decision every 2 s.
    pub fn new(min: u32, max: u32) -> Self {
        Self {
            min,
            max,
            load_high: 1.25,
            load_low: 0.9,
            memory_min: 256 << 20,
            every: Duration::from_secs(2),
        }
    }
}

/// What the machine looked like at one sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Pressure {
    /// Runnable tasks per core (the sampler itself not counted).
    pub(crate) load_per_core: f64,
    /// `MemAvailable`, in bytes.
    pub(crate) memory_available: u64,
}

/// The budget's state between decisions: the samples since the last one and where it stands.
#[derive(Debug)]
pub(crate) struct Budget {
    policy: Adaptive,
    load_sum: f64,
    samples: u32,
    memory_least: u64,
    last: SlotBudget,
}

impl Budget {
    /// Before any sample.
    pub(crate) fn new(policy: Adaptive) -> Self {
        let last = SlotBudget {
            min: policy.min,
            max: policy.max,
            reason: BudgetReason::Start,
            load_per_core: 0.0,
            memory_available_bytes: 0,
            waiting: 0,
        };
        Self {
            policy,
            load_sum: 0.0,
            samples: 0,
            memory_least: u64::MAX,
            last,
        }
    }

    /// The policy.
    pub(crate) fn policy(&self) -> &Adaptive {
        &self.policy
    }

    /// Adds a sample.
    pub(crate) fn observe(&mut self, pressure: Pressure) {
        self.load_sum += pressure.load_per_core.max(0.0);
        self.samples += 1;
        self.memory_least = self.memory_least.min(pressure.memory_available);
    }

    /// The next budget from `current`, with `waiting` dispatches held for a slot; `None` with
    /// no sample since the last decision. Starts a new round of samples.
    pub(crate) fn decide(&mut self, current: u32, waiting: u32) -> Option<u32> {
        if self.samples == 0 {
            return None;
        }
        let load = self.load_sum / f64::from(self.samples);
        let memory = self.memory_least;
        let (min, max) = (self.policy.min, self.policy.max);
        let (next, reason) = if memory < self.policy.memory_min {
            (current.saturating_sub(1), BudgetReason::MemoryLow)
        } else if load > self.policy.load_high {
            (current.saturating_sub(1), BudgetReason::LoadHigh)
        } else if waiting > 0 && load < self.policy.load_low {
            (current.saturating_add(1), BudgetReason::Room)
        } else {
            (current, BudgetReason::Steady)
        };
        self.last = SlotBudget {
            min,
            max,
            reason,
            load_per_core: load,
            memory_available_bytes: memory,
            waiting,
        };
        self.load_sum = 0.0;
        self.samples = 0;
        self.memory_least = u64::MAX;
        Some(next.clamp(min, max))
    }

    /// Where it stands, for the heartbeat.
    pub(crate) fn state(&self) -> &SlotBudget {
        &self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn budget() -> Budget {
        Budget::new(Adaptive::new(1, 8))
    }

    fn round(budget: &mut Budget, load: f64, memory: u64, current: u32, waiting: u32) -> u32 {
        budget.observe(Pressure {
            load_per_core: load,
            memory_available: memory,
        });
        budget.decide(current, waiting).expect("a sample was taken")
    }

    #[test]
    fn it_grows_only_while_work_waits_on_an_unloaded_machine() {
        let mut b = budget();
        assert_eq!(round(&mut b, 0.2, 8 * GIB, 4, 3), 5);
        assert_eq!(b.state().reason, BudgetReason::Room);
        assert_eq!(round(&mut b, 0.2, 8 * GIB, 5, 0), 5, "nothing waits");
        assert_eq!(b.state().reason, BudgetReason::Steady);
        assert_eq!(round(&mut b, 1.0, 8 * GIB, 5, 3), 5, "inside the band");
        assert_eq!(round(&mut b, 0.2, 8 * GIB, 8, 3), 8, "at its maximum");
        assert_eq!(b.state().reason, BudgetReason::Room);
    }

    #[test]
    fn it_shrinks_under_load_or_low_memory_down_to_its_minimum() {
        let mut b = budget();
        assert_eq!(round(&mut b, 1.6, 8 * GIB, 4, 9), 3);
        assert_eq!(b.state().reason, BudgetReason::LoadHigh);
        assert_eq!(round(&mut b, 0.1, 100 << 20, 3, 9), 2, "memory first");
        assert_eq!(b.state().reason, BudgetReason::MemoryLow);
        assert_eq!(round(&mut b, 3.0, 8 * GIB, 1, 9), 1, "at its minimum");
        assert_eq!(b.state().memory_available_bytes, 8 * GIB);
    }

    #[test]
    fn a_decision_weighs_every_sample_since_the_last_one() {
        let mut b = budget();
        assert_eq!(b.decide(4, 1), None, "no sample, no decision");
        for load in [2.0, 0.2, 0.2, 0.2] {
            b.observe(Pressure {
                load_per_core: load,
                memory_available: 8 * GIB,
            });
        }
        b.observe(Pressure {
            load_per_core: 0.2,
            memory_available: GIB / 8,
        });
        // Mean load 0.56, but one sample short of memory: memory decides.
        assert_eq!(b.decide(4, 1), Some(3));
        assert_eq!(b.state().reason, BudgetReason::MemoryLow);
        assert!((b.state().load_per_core - 0.56).abs() < 1e-9);
        assert_eq!(b.decide(3, 1), None, "the samples were used");
    }

    #[test]
    fn cpu_bound_work_settles_about_one_attempt_per_core() {
        // Two cores; each running attempt is one runnable task.
        let (mut b, cores) = (budget(), 2.0);
        let mut current = 8;
        for _ in 0..20 {
            let load = f64::from(current) / cores;
            current = round(&mut b, load, 8 * GIB, current, 5);
        }
        assert_eq!(current, 2);
        assert_eq!(b.state().reason, BudgetReason::Steady);
    }
}
