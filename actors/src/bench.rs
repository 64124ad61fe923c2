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

/// What a cgroup costs an attempt: the time to make and remove an attempt's cgroup alone, and
/// a command (`true`) run as the worker runs it, in a cgroup of its own and in its process
/// group only.
#[derive(Clone, Debug)]
pub struct CgroupCost {
    /// Making an attempt's cgroup (every hierarchy, limits written) and removing it.
    pub make_and_remove: Duration,
    /// One attempt of `true` in a cgroup of its own: made, entered, killed, read, removed.
    pub confined: Duration,
    /// One attempt of `true` in its process group only.
    pub plain: Duration,
    /// How this machine's worker would keep its attempts apart.
    pub said: String,
}

/// [`CgroupCost`], averaged over `n` of each; why not, where this process cannot make
/// cgroups (not root, a read-only `/sys/fs/cgroup`).
pub async fn cgroup_cost(n: u32) -> Result<CgroupCost, String> {
    use crate::worker::cgroup::{CgroupSetting, Cgroups};
    use crate::worker::process::{self, Confine, OnTimeout, ProcessSpec};
    use ax_bus::spec::resources::{Memory, Resources};
    let name = format!("bench-{}", std::process::id());
    let cgroups = std::sync::Arc::new(Cgroups::set_up(&CgroupSetting::Auto, &name)?);
    // A memory limit where it can be enforced: what a job with `resources` costs.
    let resources = Resources {
        memory: cgroups
            .refusal(&Resources {
                memory: Some(Memory(256 << 20)),
                ..Resources::default()
            })
            .is_none()
            .then_some(Memory(256 << 20)),
        ..Resources::default()
    };
    let n = n.max(1);
    let started = Instant::now();
    for i in 0..n {
        let made = cgroups
            .attempt(&format!("bench-{i}"), &resources)
            .map_err(|e| e.to_string())?;
        drop(made);
    }
    let make_and_remove = started.elapsed() / n;
    let spec = |confine: Option<Confine>| ProcessSpec {
        program: "/bin/true".into(),
        args: Vec::new(),
        env: Vec::new(),
        workdir: None,
        timeout: Duration::from_secs(30),
        on_timeout: OnTimeout::default(),
        stdin: None,
        stdout_limit: process::TAIL_BYTES,
        groups: None,
        log: None,
        confine,
    };
    let mut timed = [Duration::ZERO; 2];
    // Alternated, so that a machine's drift weighs on both alike.
    for i in 0..n {
        for (slot, confined) in [(0, true), (1, false)] {
            let confine = confined.then(|| Confine {
                cgroups: cgroups.clone(),
                name: format!("bench-run-{i}"),
                resources,
            });
            let spec = spec(confine);
            let started = Instant::now();
            let end = process::run(&spec, None).await;
            timed[slot] += started.elapsed();
            if end.exit != process::Exit::Code(0) {
                return Err(format!("`true` did not succeed: {end:?}"));
            }
        }
    }
    Ok(CgroupCost {
        make_and_remove,
        confined: timed[0] / n,
        plain: timed[1] / n,
        said: cgroups.describe(),
    })
}
