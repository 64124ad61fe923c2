//! # WorkerSupervisor
//! Owns the worker's slots ([`slots`]), its executors and the processes they start. Reads
//! `ax.internal.dispatch.<id>.<priority>` (one consumer per priority) and
//! `ax.internal.cancel.<id>`; writes its heartbeat (workers bucket), the attempt's claim and its
//! lease, the acknowledgement to the dispatching Router, the record's `executing` state and,
//! through its Reporter, the outcome.
//!
//! For each dispatch the worker takes a slot its priority may use, then **claims** the attempt for
//! that dispatch (see [`ax_bus::client::claims`]): a dispatch that lost its claim — reserved for another
//! dispatch after this worker was too slow to acknowledge, revoked after this worker was declared
//! dead, or held by another worker — never runs. Having claimed, it **acknowledges** to the
//! Router ("received, about to run"), marks the record `executing` and runs. While the attempt
//! runs, the claim's lease is renewed and the dispatch message is kept alive with progress acks;
//! a renewal that fails (the claim was revoked) stops the process at once. The dispatch is
//! acknowledged to JetStream once the outcome is durable in the outbox.
//!
//! A redelivered dispatch never runs twice: an outcome already in the outbox is acknowledged at
//! once, an attempt claimed by another dispatch or already ended is skipped. This worker's own
//! claim on an attempt not running here means the worker restarted mid-attempt; the attempt runs
//! again (its instance id lets business code de-duplicate).

pub mod executor;
pub mod process;
pub mod slots;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use async_nats::jetstream::{self, AckKind};
use dashmap::DashMap;
use futures::StreamExt;
use tokio::sync::Notify;

use ax_bus::client::claims::ClaimOutcome;
use ax_bus::client::Updated;
use ax_bus::error::During;
use ax_bus::ids::{DispatchId, InstanceId, TraceId, WorkerId};
use ax_bus::instance::{AttemptEnd, Tag};
use ax_bus::messages::{
    AlertKind, DispatchAck, Reserved, RunningAttempt, StoredRecord, WorkItem, WorkerInfo,
};
use ax_bus::spec::Priority;
use ax_bus::{codec, AxClient};

use crate::jetstream::consume::{self, ConsumerSpec};
use crate::jetstream::publish;
use crate::node::clock_guard::ClockGuard;
use crate::node::supervision::{note_restart, spawn_pump};
use crate::outcome::report;
use crate::outcome::Outcome;
use crate::reporter::ReporterHandle;
use crate::ActorError;
use executor::values::Values;
use executor::{AttemptContext, ExecResult, ExecutorsConfig, Registry};
use slots::Slots;

/// The actor's name in counters, logs and `ax nodes`.
pub const ACTOR: &str = "worker";
/// How often a worker announces itself.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);
/// Ack wait of dispatches when the config sets none.
pub const DEFAULT_DISPATCH_ACK_WAIT: Duration = Duration::from_secs(30);
/// A claim's lease, renewed three times per period while the attempt runs.
pub const CLAIM_LEASE: Duration = Duration::from_secs(15);
/// The window of the average attempt duration.
const DURATION_WINDOW: Duration = Duration::from_secs(300);

/// A worker's settings.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Worker id: `[A-Za-z0-9_-]+`, stable across restarts (its dispatch queue is named by it).
    pub id: WorkerId,
    /// Attempts run at once.
    pub slots: u32,
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
    /// Test hook: hold every dispatch this long before claiming it — a worker that receives
    /// but does not acknowledge in time.
    pub test_stall: Option<Duration>,
    /// Databases, plugin directory and interpreter of the executors.
    pub executors: ExecutorsConfig,
}

impl WorkerConfig {
    /// A worker named `id` keeping its files in `data_dir`, with the defaults: 4 slots, no tag,
    /// no reserved slot, the default dispatch ack wait and executors.
    pub fn new(id: WorkerId, data_dir: PathBuf) -> Self {
        Self {
            id,
            slots: 4,
            reserved: Reserved::default(),
            tags: Vec::new(),
            data_dir,
            dispatch_ack_wait: DEFAULT_DISPATCH_ACK_WAIT,
            test_stall: None,
            executors: ExecutorsConfig::default(),
        }
    }
}

/// Attempt durations of the last five minutes.
#[derive(Default)]
struct Durations(Mutex<VecDeque<(Instant, f64)>>);

impl Durations {
    fn add(&self, ms: f64) {
        if let Ok(mut window) = self.0.lock() {
            window.push_back((Instant::now(), ms));
        }
    }

    fn average(&self) -> f64 {
        let Ok(mut window) = self.0.lock() else {
            return 0.0;
        };
        while window
            .front()
            .is_some_and(|(at, _)| at.elapsed() > DURATION_WINDOW)
        {
            window.pop_front();
        }
        if window.is_empty() {
            0.0
        } else {
            window.iter().map(|(_, ms)| ms).sum::<f64>() / window.len() as f64
        }
    }
}

/// An attempt running here.
struct InFlight {
    instance_id: InstanceId,
    dispatch: DispatchId,
    stop: Arc<Notify>,
}

/// Everything the pumps and attempts share.
#[derive(Clone)]
struct Attempts {
    client: AxClient,
    config: WorkerConfig,
    reporter: ReporterHandle,
    slots: Arc<Slots>,
    in_flight: Arc<DashMap<TraceId, InFlight>>,
    durations: Arc<Durations>,
    clock: Option<ClockGuard>,
    executors: Registry,
}

/// The WorkerSupervisor actor.
pub struct WorkerSupervisor {
    attempts: Attempts,
    started_at: chrono::DateTime<chrono::Utc>,
    /// True until the dispatch pumps first start in this process.
    first_start: bool,
}

impl WorkerSupervisor {
    /// A worker on `client` reporting through `reporter`; with a `clock` guard, it refuses
    /// dispatches while the node's clock is off.
    pub fn new(
        client: AxClient,
        config: WorkerConfig,
        executors: Registry,
        reporter: ReporterHandle,
        clock: Option<ClockGuard>,
    ) -> Self {
        Self {
            attempts: Attempts {
                client,
                slots: Slots::new(config.slots, config.reserved),
                config,
                reporter,
                in_flight: Arc::default(),
                durations: Arc::default(),
                clock,
                executors,
            },
            started_at: ax_bus::time::now(),
            first_start: true,
        }
    }
}

impl Actor for WorkerSupervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let attempts = &self.attempts;
        spawn_pump(ACTOR, "cancel", ctx, follow_cancels(attempts.clone()));
        spawn_pump(
            ACTOR,
            "heartbeat",
            ctx,
            heartbeat(attempts.clone(), self.started_at),
        );
        let reclaim = std::mem::replace(&mut self.first_start, false);
        for priority in Priority::ALL {
            spawn_pump(
                ACTOR,
                "dispatch",
                ctx,
                take_dispatches(attempts.clone(), priority, reclaim),
            );
        }
        tracing::info!(worker = %attempts.config.id, slots = attempts.config.slots, "worker started");
    }
}

crate::answers_ping!(WorkerSupervisor);

impl Supervised for WorkerSupervisor {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        note_restart(ACTOR);
    }
}

async fn heartbeat(
    attempts: Attempts,
    started_at: chrono::DateTime<chrono::Utc>,
) -> Result<(), ActorError> {
    let config = &attempts.config;
    let executors = attempts.executors.names();
    let described = attempts.executors.describe_all();
    let mut every = tokio::time::interval(HEARTBEAT_EVERY);
    loop {
        every.tick().await;
        let info = WorkerInfo {
            id: config.id.clone(),
            host: crate::node::heartbeat::host(),
            cores: std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1),
            slots: config.slots,
            tags: config.tags.clone(),
            executors: executors.clone(),
            described: described.clone(),
            running: attempts.slots.running(),
            avg_duration_ms: attempts.durations.average(),
            reserved: config.reserved,
            attempts: attempts
                .in_flight
                .iter()
                .map(|e| RunningAttempt {
                    trace_id: e.key().clone(),
                    instance_id: e.value().instance_id.clone(),
                    dispatch: e.value().dispatch.clone(),
                })
                .collect(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            started_at,
        };
        if let Err(e) = attempts
            .client
            .workers
            .put(&info.id, codec::encode(&info)?)
            .await
        {
            tracing::warn!(error = %e, "heartbeat not stored");
        }
    }
}

/// Stops attempts whose instance was cancelled (`ax.internal.cancel.<id>`, payload: trace id).
async fn follow_cancels(attempts: Attempts) -> Result<(), ActorError> {
    let client = &attempts.client;
    let mut cancels = client
        .nats
        .subscribe(client.subjects().cancel(&attempts.config.id))
        .await
        .during(|| "subscribe to cancels")?;
    while let Some(message) = cancels.next().await {
        let text = String::from_utf8_lossy(&message.payload);
        let Ok(trace) = TraceId::parse(&text) else {
            tracing::warn!(payload = %text, "a cancel that names no trace id ignored");
            continue;
        };
        if let Some(attempt) = attempts.in_flight.get(&trace) {
            tracing::info!(%trace, "stopping a cancelled attempt");
            attempt.stop.notify_one();
        }
    }
    Ok(())
}

/// Takes the dispatches of one priority. With `reclaim` (the first start of this worker
/// process), the consumer is first deleted: dispatches a previous process of this worker
/// received and never finished are then delivered again at once instead of after their ack
/// wait. (One process per worker id.)
async fn take_dispatches(
    attempts: Attempts,
    priority: Priority,
    reclaim: bool,
) -> Result<(), ActorError> {
    let client = &attempts.client;
    let id = &attempts.config.id;
    let spec = ConsumerSpec {
        ack_wait: attempts.config.dispatch_ack_wait,
        max_ack_pending: i64::from(attempts.slots.limit(priority)),
        max_deliver: consume::POISON_DELIVERIES,
        ..ConsumerSpec::new(
            client.layout.dispatch_stream(),
            format!("worker-{id}-{}", priority.as_str()),
            client.subjects().dispatch(id, priority),
        )
    };
    if reclaim {
        reclaim_dispatches(client, &spec).await?;
    }
    let scratch = attempts.config.data_dir.join("scratch");
    std::fs::create_dir_all(&scratch)?;
    let batch = attempts.slots.limit(priority) as usize;
    let mut messages = consume::messages(client, &spec, batch).await?;
    while let Some(message) = messages.next().await {
        let message = message.during(|| "dispatch consumer")?;
        let permit = attempts.slots.acquire(priority).await;
        let attempts = attempts.clone();
        let scratch = scratch.clone();
        // Attempts are not tied to the actor's context: a restart of the actor must not cut a
        // running process off from its outcome.
        tokio::spawn(async move {
            attempts.run(message, &scratch).await;
            drop(permit);
        });
    }
    Ok(())
}

async fn reclaim_dispatches(client: &AxClient, spec: &ConsumerSpec) -> Result<(), ActorError> {
    let stream = client
        .js
        .get_stream(&spec.stream)
        .await
        .during(|| format!("open stream {}", spec.stream))?;
    let pending = match stream.consumer_info(&spec.durable).await {
        Ok(info) => info.num_ack_pending,
        Err(_) => return Ok(()),
    };
    if pending > 0 {
        tracing::warn!(dispatches = pending, consumer = %spec.durable, "taking back dispatches a previous process of this worker left unfinished");
    }
    stream
        .delete_consumer(&spec.durable)
        .await
        .map(|_| ())
        .during(|| format!("reset consumer {}", spec.durable))
        .map_err(ActorError::from)
}

/// Runs an attempt with the executor of its type: reads the upstream outputs its templates
/// use, lets the executor prepare, then runs it. Whatever fails ends the attempt with a reason.
async fn execute(
    attempts: &Attempts,
    work: &WorkItem,
    scratch: &std::path::Path,
    stop: &Notify,
) -> AttemptEnd {
    let worker = &attempts.config.id;
    let started_at = ax_bus::time::now();
    let result = match attempts.executors.get(&work.spec.exec.kind) {
        None => ExecResult::failed(
            Tag::ExecutorError,
            format!(
                "worker {worker} has no executor `{}` (it offers: {})",
                work.spec.exec.kind,
                attempts.executors.names().join(", ")
            ),
        ),
        Some(executor) => match Values::resolve(&attempts.client, work).await {
            Err(reason) => ExecResult::failed(Tag::ExecutorError, reason),
            Ok(values) => {
                let ctx = AttemptContext {
                    work,
                    worker,
                    scratch,
                    cancel: stop,
                    values: &values,
                };
                match executor.prepare(&ctx).await {
                    Err(reason) => ExecResult::failed(Tag::ExecutorError, reason),
                    Ok(()) => executor.run(&ctx).await,
                }
            }
        },
    };
    AttemptEnd {
        trace_id: work.trace_id.clone(),
        success: result.success,
        tag: result.tag,
        message: result.message,
        output: result.output,
        worker: worker.clone(),
        started_at: Some(started_at),
        finished_at: ax_bus::time::now(),
        exit_code: result.exit_code,
        stdout_tail: result.stdout_tail,
        stderr_tail: result.stderr_tail,
    }
}

impl Attempts {
    /// Ends a claimed attempt `failed` with tag `clock_skew` without running it: times this
    /// node would write (start, end, lease expiries) cannot be trusted.
    async fn refuse_for_clock(&self, work: WorkItem, clock: &ClockGuard) {
        let now = ax_bus::time::now();
        let end = AttemptEnd {
            trace_id: work.trace_id.clone(),
            success: false,
            tag: Tag::ClockSkew,
            message: format!(
                "refused by worker {}: its clock is {} ms off the NATS server's (limit {} s)",
                self.config.id,
                clock.offset_ms(),
                clock.limit().as_secs_f64()
            ),
            output: serde_json::Value::Null,
            worker: self.config.id.clone(),
            started_at: None,
            finished_at: now,
            exit_code: None,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
        };
        let outcome = Outcome {
            work,
            end,
            written: None,
        };
        if let Err(e) = self.reporter.record(outcome.clone()).await {
            tracing::warn!(error = %e, "refusal not durable; reporting it directly");
            while let Err(e) = report(&self.client, &outcome).await {
                tracing::warn!(error = %e, "direct report failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }

    async fn run(&self, message: jetstream::Message, scratch: &std::path::Path) {
        let client = &self.client;
        let me = &self.config.id;
        let Some(mut work) =
            consume::decode_or_dead_letter::<WorkItem>(client, me, AlertKind::Dispatch, &message)
                .await
        else {
            return;
        };
        // Only for the first write; the outbox keeps the work item without it.
        let stored = work.stored.take();
        let trace = work.trace_id.clone();
        if self.reporter.has_pending(&trace) {
            let _ = message.ack().await;
            return;
        }
        if self.in_flight.contains_key(&trace) {
            // A redelivery while the attempt runs here; the running one acknowledges it.
            return;
        }
        if let Some(stall) = self.config.test_stall {
            tokio::time::sleep(stall).await;
        }
        let Some(dispatch) = work.dispatch.clone() else {
            tracing::warn!(%trace, "a dispatch without a dispatch id is not ours to run; skipped");
            let _ = message.ack().await;
            return;
        };
        let lease_revision = match client
            .claim_attempt(&trace, &dispatch, me, CLAIM_LEASE)
            .await
        {
            Ok(ClaimOutcome::Won { revision }) => revision,
            Ok(ClaimOutcome::Lost(holder)) => {
                tracing::info!(%trace, ?holder, "attempt not ours to run (claimed, reserved elsewhere or revoked); skipped");
                let _ = message.ack().await;
                return;
            }
            Err(e) => {
                tracing::warn!(%trace, error = %e, "cannot claim; redelivering");
                let _ = message
                    .ack_with(AckKind::Nak(Some(consume::backoff(&message))))
                    .await;
                return;
            }
        };
        self.acknowledge(&work).await;
        if let Some(clock) = self.clock.as_ref().filter(|c| c.skewed()) {
            self.refuse_for_clock(work, clock).await;
            let _ = message.ack().await;
            return;
        }
        let now = ax_bus::time::now();
        let written = match client
            .update_instance_from(&work.instance_id, stored, |r| r.started(&trace, me, now))
            .await
        {
            Ok(Updated::Written(record, revision)) => {
                publish::event(client, &record).await;
                StoredRecord { record, revision }
            }
            Ok(Updated::Refused(refused)) => {
                tracing::info!(%trace, %refused, "attempt no longer current; skipped");
                let _ = message.ack().await;
                return;
            }
            Ok(Updated::Missing) => {
                tracing::warn!(instance = %work.instance_id, "dispatch for an unknown instance; skipped");
                let _ = message.ack().await;
                return;
            }
            Err(e) => {
                tracing::warn!(%trace, error = %e, "cannot mark executing; redelivering");
                let _ = message
                    .ack_with(AckKind::Nak(Some(consume::backoff(&message))))
                    .await;
                return;
            }
        };
        let stop = Arc::new(Notify::new());
        self.in_flight.insert(
            trace.clone(),
            InFlight {
                instance_id: work.instance_id.clone(),
                dispatch: dispatch.clone(),
                stop: stop.clone(),
            },
        );
        let revoked = AtomicBool::new(false);
        let end = {
            let execution = execute(self, &work, scratch, &stop);
            tokio::pin!(execution);
            let mut progress = tokio::time::interval(self.config.dispatch_ack_wait / 3);
            progress.tick().await;
            let mut renewal = tokio::time::interval(CLAIM_LEASE / 3);
            renewal.tick().await;
            let mut revision = lease_revision;
            loop {
                tokio::select! {
                    end = &mut execution => break end,
                    _ = progress.tick() => {
                        let _ = message.ack_with(AckKind::Progress).await;
                    }
                    _ = renewal.tick(), if !revoked.load(Ordering::Relaxed) => {
                        match client.renew_claim(&trace, revision, &dispatch, me, CLAIM_LEASE).await {
                            Ok(Some(next)) => revision = next,
                            Ok(None) => {
                                tracing::warn!(%trace, "claim revoked: stopping the attempt");
                                revoked.store(true, Ordering::Relaxed);
                                stop.notify_one();
                            }
                            Err(e) => tracing::warn!(%trace, error = %e, "lease not renewed; trying again"),
                        }
                    }
                }
            }
        };
        self.in_flight.remove(&trace);
        if let Some(started) = end.started_at {
            self.durations
                .add((end.finished_at - started).num_milliseconds().max(0) as f64);
        }
        if revoked.load(Ordering::Relaxed) {
            // The attempt was taken away (this worker was declared dead): its outcome is moot.
            let _ = message.ack().await;
            return;
        }
        let outcome = Outcome {
            work,
            end,
            written: Some(written),
        };
        if let Err(e) = self.reporter.record(outcome.clone()).await {
            publish::alert(
                client,
                me,
                AlertKind::Outbox,
                format!("outcome of {trace} not durable ({e}); reporting it directly"),
                None,
            )
            .await;
            while let Err(e) = report(client, &outcome).await {
                tracing::warn!(%trace, error = %e, "direct report failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        let _ = message.ack().await;
    }

    /// Tells the dispatching Router the attempt was received and is about to run.
    async fn acknowledge(&self, work: &WorkItem) {
        let (Some(router), Some(dispatch)) = (&work.router, &work.dispatch) else {
            return;
        };
        let ack = DispatchAck {
            trace_id: work.trace_id.clone(),
            dispatch: dispatch.clone(),
            worker: self.config.id.clone(),
        };
        if let Ok(payload) = codec::encode(&ack) {
            let _ = self
                .client
                .nats
                .publish(self.client.subjects().ack(router), payload)
                .await;
        }
    }
}
