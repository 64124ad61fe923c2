//! Measurement entry points for `ax bench` (feature `bench`): the mechanisms inside the actors
//! — the time wheel, the Router's choice, the DagCoordinator's logic — timed on their own,
//! without making them part of the crate's public surface.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use chrono::NaiveDate;
use rand::{Rng, SeedableRng};

use ax_bus::ids::WorkerId;
use ax_bus::instance::{AttemptEnd, State, Tag, Trigger};
use ax_bus::messages::{ResultMessage, WorkItem, WorkerInfo};
use ax_bus::spec::JobSpec;
use ax_bus::InstanceRecord;

use crate::dag::state::{Action, DagState};
use crate::jetstream::consume::Cumulative;
use crate::router::fleet::Fleet;
use crate::scheduler::time_wheel::TimeWheel;

/// The DagCoordinator's consumers of results, one per term of leadership.
pub const DAG_RESULTS: Cumulative = crate::dag::RESULTS;

/// A time wheel holding timers as the Scheduler's does (a job slot and a generation each), for
/// measuring what they cost in memory.
#[derive(Debug)]
pub struct LoadedWheel(TimeWheel<(u32, u32)>);

impl LoadedWheel {
    /// `n` timers spread over a day from `now_ms`, at random (seeded).
    pub fn new(n: u64, now_ms: u64, seed: u64) -> Self {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut wheel = TimeWheel::new(now_ms);
        for i in 0..n {
            wheel.insert(now_ms + rng.random_range(1..86_400_000), (i as u32, 0));
        }
        Self(wheel)
    }

    /// Timers pending.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none is pending.
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }
}

/// A simulated worker's heartbeat (`sim<index>`): one of `classes` tags, some load.
pub fn simulated_worker(index: usize, classes: usize) -> Option<WorkerInfo> {
    Some(WorkerInfo {
        id: WorkerId::parse(&format!("sim{index}")).ok()?,
        host: "bench".into(),
        cores: 4,
        slots: 64,
        tags: vec![format!("class{}", index % classes)],
        executors: vec!["noop".into(), "shell".into()],
        described: Vec::new(),
        running: (index % 7) as u32,
        avg_duration_ms: (index % 13) as f64 * 40.0,
        reserved: Default::default(),
        budget: None,
        attempts: Vec::new(),
        isolation: None,
        version: env!("CARGO_PKG_VERSION").into(),
        started_at: ax_bus::time::now(),
    })
}

/// `picks` choices of the Router among `workers` simulated workers of `classes` tag classes
/// (every other pick asks for a tag): the time they took and how many found a worker.
pub fn routing_picks(workers: usize, classes: usize, picks: usize) -> (Duration, usize) {
    let tag_sets: Vec<Vec<String>> = std::iter::once(Vec::new())
        .chain((0..classes).map(|c| vec![format!("class{c}")]))
        .collect();
    let mut fleet = Fleet::new(ax_bus::routing::RoutingPolicy::new(
        Default::default(),
        Duration::from_secs(3600),
    ));
    let now = Instant::now();
    for info in (0..workers).filter_map(|i| simulated_worker(i, classes)) {
        fleet.heartbeat(info, now);
    }
    let started = Instant::now();
    let mut found = 0usize;
    for i in 0..picks {
        let tags = &tag_sets[i % tag_sets.len()];
        found += usize::from(fleet.pick(tags, "noop", &[]).is_some());
    }
    (started.elapsed(), found)
}

fn first_attempt(spec: &JobSpec, date: NaiveDate) -> WorkItem {
    let expected = ax_bus::time::start_of_day(chrono_tz::UTC, date);
    let record = InstanceRecord::first(
        spec,
        expected,
        date.format("%Y-%m-%d").to_string(),
        Default::default(),
        Trigger::Manual,
        ax_bus::time::now(),
    );
    WorkItem::for_attempt(&record, spec.clone())
}

/// The result of `work` succeeding at once.
pub fn success(work: &WorkItem) -> ResultMessage {
    let now = ax_bus::time::now();
    let worker = WorkerId::parse("bench").expect("a valid worker id");
    let end = AttemptEnd {
        started_at: Some(now),
        exit_code: Some(0),
        ..AttemptEnd::new(work.trace_id.clone(), worker, true, Tag::Completed, now)
    };
    ResultMessage::new(work, &end, State::Success, None)
}

/// Resolves a graph of `specs` for `date` with the DagCoordinator's logic alone, every release
/// answered with a success at once: the time it took and the instances released.
pub fn dag_decisions(specs: &[JobSpec], date: NaiveDate) -> (Duration, usize) {
    let mut dag = DagState::new();
    for spec in specs {
        dag.upsert_job(spec.clone());
    }
    let started = Instant::now();
    let now = ax_bus::time::now();
    let mut actions: VecDeque<Action> = VecDeque::new();
    for spec in specs.iter().filter(|s| s.deps.is_empty()) {
        actions.extend(dag.on_created(first_attempt(spec, date), now));
    }
    let mut released = 0;
    let mut ready = VecDeque::new();
    loop {
        while let Some(action) = actions.pop_front() {
            match action {
                Action::Release { work, .. } => ready.push_back(work),
                Action::Create { spec, .. } => {
                    actions.extend(dag.on_created(first_attempt(&spec, date), now))
                }
                _ => {}
            }
        }
        let Some(work) = ready.pop_front() else {
            break;
        };
        released += 1;
        actions.extend(dag.on_result(&success(&work), now));
    }
    (started.elapsed(), released)
}
