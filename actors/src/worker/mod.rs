//! # WorkerSupervisor
//! Owns the worker's slots ([`slots`]), its executors, the attempts running here and their
//! processes. Reads `ax.internal.dispatch.<id>.<priority>` (one consumer per priority) and
//! `ax.internal.cancel.<id>`; writes its heartbeat (workers bucket), the acknowledgement to the
//! dispatching Router, the record's `executing` state, the attempt's claim and its lease and,
//! through its Reporter, the outcome.
//!
//! For each dispatch the worker takes a slot its priority may use, **acknowledges** to the
//! Router ("received, about to run") and **starts** the attempt: a compare-and-swap of the
//! record to `executing` from the revision it was dispatched with, which only one dispatch of
//! an attempt passes (see [`ax_bus::client::claims`]) — a dispatch of an attempt started by
//! another dispatch, moved on after this worker was declared dead, or ended never runs. Then it
//! runs ([`attempt`]). While the attempt runs, its claim's lease is renewed — the first renewal,
//! a third of the lease in, writes the claim, so an attempt shorter than that writes none — and
//! the dispatch message is kept alive with progress acks; a renewal that fails (the claim was
//! revoked) stops the process at once. The dispatch is acknowledged to JetStream once the
//! outcome is durable in the outbox.
//!
//! A redelivered dispatch never runs twice: an outcome already in the outbox is acknowledged at
//! once, an attempt started by another dispatch or already ended is skipped. An attempt whose
//! record says this worker started it, though it does not run here, means a previous process
//! of the worker was killed with it: its command may have run, so the attempt is **lost** — it
//! ends with tag `worker_lost` and the instance moves to a new attempt under a new trace id, as
//! when the janitor finds a dead worker's attempts — so that one trace id is one execution at
//! most; only an attempt that provably did not start runs under its trace.
//!
//! The actor owns what runs here (for its heartbeat, cancellations and average durations) and
//! changes it in its handlers; the attempts run on tasks of their own and tell it when they start
//! and end; the slots are semaphores the dispatch pumps wait on.

mod acks;
mod attempt;
pub(crate) mod budget;
pub(crate) mod cgroup;
mod contact;
pub(crate) mod executor;
mod leftovers;
mod lifeline;
pub(crate) mod local_run;
pub(crate) mod logs;
mod pressure;
pub(crate) mod process;
mod pumps;
mod registered;
pub(crate) mod slots;

pub use budget::Adaptive;
pub use logs::DEFAULT_LOG_MAX_BYTES;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::Notify;

use ax_bus::ids::{DispatchId, InstanceId, TraceId, WorkerId};
use ax_bus::instance::AttemptEnd;
use ax_bus::messages::{Reserved, RunningAttempt, WorkerInfo};
use ax_bus::room::Requested;
use ax_bus::spec::Priority;
use ax_bus::{codec, AxClient};

use crate::reporter::Reporter;
use crate::runtime::clock_guard::ClockGuard;
use crate::runtime::supervision::{note_restart, spawn_pump};
use attempt::Attempts;
use contact::Contact;
use executor::{ExecutorsConfig, Registry};
use slots::Slots;

/// The actor's name in counters, logs and `ax nodes`.
pub(crate) const ACTOR: &str = "worker";
/// How often a worker announces itself.
pub(crate) const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);
/// Ack wait of dispatches when the config sets none.
pub const DEFAULT_DISPATCH_ACK_WAIT: Duration = Duration::from_secs(30);
/// A claim's lease, renewed three times per period while the attempt runs.
pub(crate) const CLAIM_LEASE: Duration = Duration::from_secs(15);
/// How often the adaptive budget samples the machine.
const PRESSURE_SAMPLE_EVERY: Duration = Duration::from_millis(500);
/// The window of the average attempt duration.
const DURATION_WINDOW: Duration = Duration::from_secs(300);

/// A worker's settings.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Worker id: `[A-Za-z0-9_-]+`, stable across restarts (its dispatch queue is named by it).
    pub id: WorkerId,
    /// Attempts run at once: with `adaptive`, the budget it starts with (within the bounds).
    pub slots: u32,
    /// Slots that follow the machine's pressure (`[worker.adaptive]`); `None`: `slots`, fixed.
    pub adaptive: Option<Adaptive>,
    /// Slots kept for higher priorities.
    pub reserved: Reserved,
    /// Its tags.
    pub tags: Vec<String>,
    /// Where the outbox and scratch files live.
    pub data_dir: PathBuf,
    /// How long JetStream waits for a dispatch's ack before delivering it again. A running
    /// attempt sends in-progress acks three times per period, so a long task is never
    /// redelivered while it runs.
    pub dispatch_ack_wait: Duration,
    /// Databases, plugin directory and interpreter of the executors.
    pub executors: ExecutorsConfig,
    /// The cap of an attempt's shipped log, in bytes (see [`ax_bus::log`]).
    pub log_max_bytes: usize,
    /// Where its attempts' cgroups are made (`[worker] cgroups`, see [`CgroupSetting`](crate::CgroupSetting)).
    pub cgroups: cgroup::CgroupSetting,
    /// The memory and CPU it offers attempts that ask for resources (`[worker] memory`, `cpu`).
    pub offer: cgroup::Offer,
    /// The limits of an attempt whose job sets none of a kind (`[worker.limits]`).
    pub default_limits: ax_bus::spec::resources::Resources,
}

impl WorkerConfig {
    /// A worker named `id` keeping its files in `data_dir`, with the defaults: 4 slots, no tag,
    /// no reserved slot, the default dispatch ack wait and executors.
    pub fn new(id: WorkerId, data_dir: PathBuf) -> Self {
        Self {
            id,
            slots: 4,
            adaptive: None,
            reserved: Reserved::default(),
            tags: Vec::new(),
            data_dir,
            dispatch_ack_wait: DEFAULT_DISPATCH_ACK_WAIT,
            executors: ExecutorsConfig::default(),
            log_max_bytes: logs::DEFAULT_LOG_MAX_BYTES,
            cgroups: cgroup::CgroupSetting::Auto,
            offer: cgroup::Offer::default(),
            default_limits: Default::default(),
        }
    }

    /// The slots it starts with, with `room` for what attempts ask for.
    fn new_slots(&self, room: Requested) -> Arc<Slots> {
        match &self.adaptive {
            Some(adaptive) => Slots::new(self.slots, adaptive.max, self.reserved, room),
            None => Slots::new(self.slots, self.slots, self.reserved, room),
        }
    }

    /// The name of the cgroup its attempts' cgroups go in: its id and a digest of its data
    /// directory, so that a restarted worker finds what its predecessor left, and two workers
    /// of one id on a host (tests, a mistake) never touch each other's.
    fn cgroup_name(&self) -> String {
        // FNV-1a: the same digest from one build to the next.
        let digest = self
            .data_dir
            .as_os_str()
            .as_encoded_bytes()
            .iter()
            .fold(0x811c_9dc5_u32, |hash, byte| {
                (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
            });
        format!("{}-{digest:08x}", self.id)
    }

    /// Where attempts keep their scratch files (and their process groups are recorded).
    pub(crate) fn scratch(&self) -> PathBuf {
        self.data_dir.join("scratch")
    }
}

/// An attempt running here.
#[derive(Debug)]
struct InFlight {
    instance: InstanceId,
    dispatch: DispatchId,
    /// Its job's `lease` (seconds).
    lease: Option<u64>,
    stop: Arc<Notify>,
}

/// The WorkerSupervisor actor.
#[derive(Debug)]
pub struct WorkerSupervisor {
    client: AxClient,
    config: WorkerConfig,
    executors: Registry,
    reporter: Addr<Reporter>,
    clock: Option<ClockGuard>,
    slots: Arc<Slots>,
    /// The adaptive budget's state, with `[worker.adaptive]`.
    budget: Option<budget::Budget>,
    /// When the budget last decided.
    decided_at: Instant,
    in_flight: HashMap<TraceId, InFlight>,
    /// Durations of the attempts that ended in the last five minutes (ms).
    durations: VecDeque<(Instant, f64)>,
    started_at: chrono::DateTime<chrono::Utc>,
    /// True until the dispatch pumps first start in this process.
    first_start: bool,
    /// The last confirmed heartbeat (the attempts fence themselves on it).
    contact: Contact,
    /// Definitions found in the registry, until their jobs change.
    registered: registered::Registered,
    /// The sender of acknowledgements to the Routers (from the first start on).
    acks: Option<acks::Acks>,
    /// How its attempts are kept apart: cgroups, or process groups only.
    confinement: Arc<cgroup::Confinement>,
    /// That, and the room it offers, as its heartbeat says them (read once, at its start).
    offered: ax_bus::room::Isolation,
}

impl WorkerSupervisor {
    /// A worker on `client` reporting through `reporter`; with a `clock` guard, it refuses
    /// dispatches while the node's clock is off.
    pub fn new(
        client: AxClient,
        config: WorkerConfig,
        executors: Registry,
        reporter: Addr<Reporter>,
        clock: Option<ClockGuard>,
    ) -> Self {
        let confinement = Arc::new(cgroup::Confinement::set_up(
            &config.cgroups,
            &config.cgroup_name(),
            config.default_limits,
        ));
        let offered = confinement.isolation(config.offer);
        let room = Requested {
            memory_bytes: offered.memory_bytes,
            cpu_millis: offered.cpu_millis,
        };
        Self {
            confinement,
            offered,
            client,
            slots: config.new_slots(room),
            budget: config.adaptive.clone().map(budget::Budget::new),
            decided_at: Instant::now(),
            config,
            executors,
            reporter,
            clock,
            in_flight: HashMap::new(),
            durations: VecDeque::new(),
            started_at: ax_bus::time::now(),
            first_start: true,
            contact: Contact::new(),
            registered: registered::Registered::default(),
            acks: None,
        }
    }

    fn attempts(&mut self, ctx: &Context<Self>) -> Attempts {
        let client = &self.client;
        let acks = self
            .acks
            .get_or_insert_with(|| acks::Acks::start(client.clone()))
            .clone();
        Attempts {
            acks,
            client: self.client.clone(),
            config: self.config.clone(),
            reporter: self.reporter.clone(),
            worker: ctx.address(),
            slots: self.slots.clone(),
            clock: self.clock.clone(),
            executors: self.executors.clone(),
            contact: self.contact.clone(),
            registered: self.registered.clone(),
            confinement: self.confinement.clone(),
        }
    }

    /// The average duration of the attempts that ended in the last five minutes.
    fn average_duration_ms(&mut self) -> f64 {
        while self
            .durations
            .front()
            .is_some_and(|(at, _)| at.elapsed() > DURATION_WINDOW)
        {
            self.durations.pop_front();
        }
        if self.durations.is_empty() {
            0.0
        } else {
            self.durations.iter().map(|(_, ms)| ms).sum::<f64>() / self.durations.len() as f64
        }
    }

    /// Samples the machine for the adaptive budget and, every `every`, decides it.
    fn follow_pressure(&mut self) {
        let Some(budget) = &mut self.budget else {
            return;
        };
        let cores = crate::runtime::host::cores();
        if let Some(pressure) = pressure::sample(cores) {
            budget.observe(pressure);
        }
        if self.decided_at.elapsed() < budget.policy().every {
            return;
        }
        self.decided_at = Instant::now();
        let current = self.slots.budget();
        let Some(next) = budget.decide(current, self.slots.waiting()) else {
            return;
        };
        let state = budget.state();
        if next != current {
            tracing::info!(
                from = current,
                to = next,
                reason = state.reason.as_str(),
                load_per_core = state.load_per_core,
                memory_available = state.memory_available_bytes,
                waiting = state.waiting,
                "slot budget changed"
            );
            self.slots.set_budget(next);
        }
        crate::metrics::budget_decided(next, state, next != current);
    }

    /// Writes the heartbeat: what this worker offers and what runs here now.
    fn heartbeat(&mut self) {
        let info = WorkerInfo {
            id: self.config.id.clone(),
            host: crate::runtime::host::host(),
            cores: crate::runtime::host::cores(),
            slots: self.slots.budget(),
            tags: self.config.tags.clone(),
            executors: self.executors.names(),
            described: self.executors.describe_all(),
            running: self.slots.running(),
            avg_duration_ms: self.average_duration_ms(),
            reserved: self.config.reserved,
            budget: self.budget.as_ref().map(|b| b.state().clone()),
            attempts: self
                .in_flight
                .iter()
                .map(|(trace, attempt)| RunningAttempt {
                    trace_id: trace.clone(),
                    instance_id: attempt.instance.clone(),
                    dispatch: attempt.dispatch.clone(),
                    lease_secs: attempt.lease,
                })
                .collect(),
            isolation: Some(ax_bus::room::Isolation {
                requested: self.slots.asked(),
                ..self.offered.clone()
            }),
            version: env!("CARGO_PKG_VERSION").to_string(),
            started_at: self.started_at,
        };
        let (client, contact) = (self.client.clone(), self.contact.clone());
        tokio::spawn(async move {
            let stored = match codec::encode(&info) {
                Ok(value) => client.workers.put(&info.id, value).await.map(|_| ()),
                Err(e) => {
                    tracing::warn!(error = %e, "heartbeat not encoded");
                    return;
                }
            };
            match stored {
                Ok(()) => contact.heard(),
                Err(e) => {
                    tracing::warn!(error = %e, silent_for = ?contact.silent_for(), "heartbeat not stored")
                }
            }
        });
    }
}

impl Actor for WorkerSupervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let attempts = self.attempts(ctx);
        spawn_pump(ACTOR, "cancel", ctx, pumps::cancels(attempts.clone()));
        self.heartbeat();
        ctx.run_interval(HEARTBEAT_EVERY, |act, _| act.heartbeat());
        if self.budget.is_some() {
            ctx.run_interval(PRESSURE_SAMPLE_EVERY, |act, _| act.follow_pressure());
        }
        let reclaim = std::mem::replace(&mut self.first_start, false);
        if reclaim {
            // Before any dispatch is taken, so no attempt is declared lost (and run again)
            // while processes of a previous process's attempts may still run.
            leftovers::reap(&leftovers::dir(&self.config.scratch()));
            match self.confinement.as_ref() {
                cgroup::Confinement::Cgroups(cgroups) => {
                    let reaped = cgroups.reap();
                    if reaped > 0 {
                        tracing::warn!(worker = %self.config.id, reaped, "killed and removed the cgroups of attempts an earlier run of this worker left");
                    }
                    tracing::info!(worker = %self.config.id, confinement = %cgroups.describe(), "attempts run in cgroups");
                }
                cgroup::Confinement::ProcessGroups { why } => {
                    tracing::warn!(worker = %self.config.id, %why, "attempts run in process groups only: no resource limits, and a command that leaves its process group escapes the kill");
                }
            }
            // Outlives restarts of the actor, as the memory it keeps up does.
            self.registered.follow(self.client.clone());
        }
        for priority in Priority::ALL {
            let dispatches = pumps::dispatches(attempts.clone(), priority, reclaim);
            spawn_pump(ACTOR, "dispatch", ctx, dispatches);
        }
        crate::metrics::slots_offered(self.slots.budget());
        tracing::info!(worker = %self.config.id, slots = self.slots.budget(), adaptive = ?self.config.adaptive, "worker started");
    }
}

crate::runtime::watchdog::answers_ping!(WorkerSupervisor);

impl Supervised for WorkerSupervisor {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        note_restart(ACTOR);
    }
}

/// An attempt started executing here.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct Running {
    trace: TraceId,
    instance: InstanceId,
    dispatch: DispatchId,
    lease: Option<u64>,
    stop: Arc<Notify>,
}

impl Handler<Running> for WorkerSupervisor {
    type Result = ();

    fn handle(&mut self, msg: Running, _: &mut Self::Context) {
        let attempt = InFlight {
            instance: msg.instance,
            dispatch: msg.dispatch,
            lease: msg.lease,
            stop: msg.stop,
        };
        self.in_flight.insert(msg.trace, attempt);
    }
}

/// An attempt ended here (`end` is `None` when its claim was revoked meanwhile).
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct Ended {
    trace: TraceId,
    end: Option<AttemptEnd>,
}

impl Handler<Ended> for WorkerSupervisor {
    type Result = ();

    fn handle(&mut self, msg: Ended, _: &mut Self::Context) {
        self.in_flight.remove(&msg.trace);
        if let Some(end) = msg.end {
            if let Some(started) = end.started_at {
                let ms = (end.finished_at - started).num_milliseconds().max(0) as f64;
                self.durations.push_back((Instant::now(), ms));
            }
        }
    }
}

/// Whether an attempt runs here now.
#[derive(Debug, Message)]
#[rtype(result = "bool")]
struct IsRunning(TraceId);

impl Handler<IsRunning> for WorkerSupervisor {
    type Result = bool;

    fn handle(&mut self, msg: IsRunning, _: &mut Self::Context) -> bool {
        self.in_flight.contains_key(&msg.0)
    }
}

/// Stops an attempt whose instance was cancelled, if it runs here.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct Cancel(TraceId);

impl Handler<Cancel> for WorkerSupervisor {
    type Result = ();

    fn handle(&mut self, msg: Cancel, _: &mut Self::Context) {
        if let Some(attempt) = self.in_flight.get(&msg.0) {
            tracing::info!(trace = %msg.0, "stopping a cancelled attempt");
            attempt.stop.notify_one();
        }
    }
}
