//! # WorkerSupervisor
//! Owns the worker's slots, its executors and the processes they start. Reads
//! `ax.internal.dispatch.<id>`; writes its heartbeat (workers bucket), the attempt's claim
//! (claims bucket), the record's `executing` state and, through its Reporter, the outcome.
//!
//! An attempt runs only after the worker has *claimed* it — a create-if-absent on its trace id —
//! and moved its record to `executing` with a compare-and-swap. A redelivered dispatch therefore
//! never runs twice: an outcome already in the outbox is acknowledged at once, an attempt claimed
//! by another worker or already ended is skipped. The one exception is deliberate: this worker's
//! own claim on an attempt that is not running here and did not end means the worker died
//! mid-attempt and restarted; the attempt runs again (its instance id lets business code
//! de-duplicate).
//!
//! While an attempt runs, its dispatch message is kept alive with in-progress acks; it is
//! acknowledged once the outcome is durable in the outbox.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use async_nats::jetstream::{self, kv::CreateErrorKind, AckKind};
use dashmap::DashMap;
use futures::StreamExt;
use tokio::sync::{Notify, Semaphore};

use ax_bus::client::Updated;
use ax_bus::instance::{AttemptEnd, Tag};
use ax_bus::messages::{WorkItem, WorkerInfo};
use ax_bus::{codec, AxClient};

use crate::consume::{self, ConsumerSpec};
use crate::outbox::Outcome;
use crate::reporter::{report_once, ReporterHandle};
use crate::supervision::{note_restart, spawn_pump};
use crate::{publish, shell, ActorError};

const ACTOR: &str = "worker";
/// How often a worker announces itself.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);
/// Ack wait of dispatches; a running attempt sends progress acks three times per period.
const DISPATCH_ACK_WAIT: Duration = Duration::from_secs(30);

/// A worker's settings.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Worker id: `[A-Za-z0-9_-]+`, stable across restarts (its dispatch queue is named by it).
    pub id: String,
    /// Attempts run at once.
    pub slots: u32,
    /// Its tags.
    pub tags: Vec<String>,
    /// Where the outbox and scratch files live.
    pub data_dir: PathBuf,
}

/// The WorkerSupervisor actor.
pub struct WorkerSupervisor {
    client: AxClient,
    config: WorkerConfig,
    reporter: ReporterHandle,
    slots: Arc<Semaphore>,
    running: Arc<AtomicU32>,
    in_flight: Arc<DashMap<String, Arc<Notify>>>,
    started_at: chrono::DateTime<chrono::Utc>,
    /// True until the dispatch pump first starts in this process.
    first_start: bool,
}

impl WorkerSupervisor {
    /// A worker on `client` reporting through `reporter`.
    pub fn new(client: AxClient, config: WorkerConfig, reporter: ReporterHandle) -> Self {
        Self {
            client,
            slots: Arc::new(Semaphore::new(config.slots.max(1) as usize)),
            config,
            reporter,
            running: Arc::default(),
            in_flight: Arc::default(),
            started_at: ax_bus::time::now(),
            first_start: true,
        }
    }

    fn info(&self) -> WorkerInfo {
        WorkerInfo {
            id: self.config.id.clone(),
            host: nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default(),
            cores: std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1),
            slots: self.config.slots,
            tags: self.config.tags.clone(),
            executors: ax_bus::spec::BUILTIN_EXECUTORS
                .iter()
                .map(|e| e.to_string())
                .collect(),
            running: 0,
            version: env!("CARGO_PKG_VERSION").to_string(),
            started_at: self.started_at,
        }
    }
}

impl Actor for WorkerSupervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        spawn_pump(
            ACTOR,
            "cancel",
            ctx,
            follow_cancels(
                self.client.clone(),
                self.config.id.clone(),
                self.in_flight.clone(),
            ),
        );
        spawn_pump(
            ACTOR,
            "heartbeat",
            ctx,
            heartbeat(self.client.clone(), self.info(), self.running.clone()),
        );
        let attempts = Attempts {
            client: self.client.clone(),
            config: self.config.clone(),
            reporter: self.reporter.clone(),
            running: self.running.clone(),
            in_flight: self.in_flight.clone(),
        };
        let reclaim = std::mem::replace(&mut self.first_start, false);
        spawn_pump(
            ACTOR,
            "dispatch",
            ctx,
            take_dispatches(attempts, self.slots.clone(), reclaim),
        );
        tracing::info!(worker = %self.config.id, slots = self.config.slots, "worker started");
    }
}

impl Supervised for WorkerSupervisor {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        note_restart(ACTOR);
    }
}

async fn heartbeat(
    client: AxClient,
    mut info: WorkerInfo,
    running: Arc<AtomicU32>,
) -> Result<(), ActorError> {
    let mut every = tokio::time::interval(HEARTBEAT_EVERY);
    loop {
        every.tick().await;
        info.running = running.load(Ordering::Relaxed);
        match codec::encode(&info) {
            Ok(value) => {
                if let Err(e) = client.workers.put(&info.id, value).await {
                    tracing::warn!(error = %e, "heartbeat not stored");
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Runs an attempt with its executor.
async fn execute(
    work: &WorkItem,
    worker: &str,
    scratch: &std::path::Path,
    stop: &Notify,
) -> AttemptEnd {
    match work.spec.exec.kind.as_str() {
        "noop" => {
            let now = ax_bus::time::now();
            AttemptEnd {
                trace_id: work.trace_id.clone(),
                success: true,
                tag: Tag::Completed,
                message: "noop".into(),
                output: serde_json::Value::Null,
                worker: worker.to_string(),
                started_at: Some(now),
                finished_at: now,
                exit_code: None,
                stdout_tail: String::new(),
                stderr_tail: String::new(),
            }
        }
        _ => shell::run(work, worker, scratch, Some(stop)).await,
    }
}

/// Stops attempts whose instance was cancelled (`ax.internal.cancel.<id>`, payload: trace id).
async fn follow_cancels(
    client: AxClient,
    id: String,
    in_flight: Arc<DashMap<String, Arc<Notify>>>,
) -> Result<(), ActorError> {
    let mut cancels = client
        .nats
        .subscribe(client.subjects().cancel(&id))
        .await
        .map_err(|e| ActorError::Nats(format!("subscribe to cancels: {e}")))?;
    while let Some(message) = cancels.next().await {
        let trace = String::from_utf8_lossy(&message.payload).to_string();
        if let Some(stop) = in_flight.get(&trace) {
            tracing::info!(%trace, "stopping a cancelled attempt");
            stop.notify_one();
        }
    }
    Ok(())
}

/// Everything an attempt needs, shared by all of them.
#[derive(Clone)]
struct Attempts {
    client: AxClient,
    config: WorkerConfig,
    reporter: ReporterHandle,
    running: Arc<AtomicU32>,
    in_flight: Arc<DashMap<String, Arc<Notify>>>,
}

/// Takes dispatches. With `reclaim` (the first start of this worker process), the consumer is
/// first deleted: dispatches a previous process of this worker received and never finished are
/// then delivered again at once instead of after their ack wait. (One process per worker id.)
async fn take_dispatches(
    attempts: Attempts,
    slots: Arc<Semaphore>,
    reclaim: bool,
) -> Result<(), ActorError> {
    let client = &attempts.client;
    let id = &attempts.config.id;
    let spec = ConsumerSpec {
        stream: client.layout.dispatch_stream(),
        durable: format!("worker-{id}"),
        filter: client.subjects().dispatch(id),
        ack_wait: DISPATCH_ACK_WAIT,
        max_ack_pending: i64::from(attempts.config.slots.max(1)),
    };
    if reclaim {
        reclaim_dispatches(client, &spec).await?;
    }
    let scratch = attempts.config.data_dir.join("scratch");
    std::fs::create_dir_all(&scratch)?;
    let mut messages =
        consume::messages(client, &spec, attempts.config.slots.max(1) as usize).await?;
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| ActorError::Nats(format!("dispatch consumer: {e}")))?;
        let permit = slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ActorError::Stopped("worker slots"))?;
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
        .map_err(|e| ActorError::Nats(format!("open stream {}: {e}", spec.stream)))?;
    let pending = match stream.consumer_info(&spec.durable).await {
        Ok(info) => info.num_ack_pending,
        Err(_) => return Ok(()),
    };
    if pending > 0 {
        tracing::warn!(
            dispatches = pending,
            "taking back dispatches a previous process of this worker left unfinished"
        );
    }
    stream
        .delete_consumer(&spec.durable)
        .await
        .map(|_| ())
        .map_err(|e| ActorError::Nats(format!("reset consumer {}: {e}", spec.durable)))
}

impl Attempts {
    async fn run(&self, message: jetstream::Message, scratch: &std::path::Path) {
        let client = &self.client;
        let me = self.config.id.as_str();
        let Some(work) =
            consume::decode_or_drop::<WorkItem>(client, me, "dispatch", &message).await
        else {
            return;
        };
        let trace = work.trace_id.clone();
        if self.reporter.has_pending(&trace) {
            let _ = message.ack().await;
            return;
        }
        if self.in_flight.contains_key(&trace) {
            // A redelivery while the attempt runs here; the running one acknowledges it.
            return;
        }
        match self.claim(&trace).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!(%trace, "attempt claimed by another worker; skipped");
                let _ = message.ack().await;
                return;
            }
            Err(e) => {
                tracing::warn!(%trace, error = %e, "cannot claim; redelivering");
                let _ = message
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                    .await;
                return;
            }
        }
        let now = ax_bus::time::now();
        match client
            .update_instance(&work.instance_id, |r| r.started(&trace, me, now))
            .await
        {
            Ok(Updated::Written(record, _)) => publish::event(client, &record).await,
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
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                    .await;
                return;
            }
        }
        let stop = Arc::new(Notify::new());
        self.in_flight.insert(trace.clone(), stop.clone());
        self.running.fetch_add(1, Ordering::Relaxed);
        let end = {
            let execution = execute(&work, me, scratch, &stop);
            tokio::pin!(execution);
            let mut progress = tokio::time::interval(DISPATCH_ACK_WAIT / 3);
            progress.tick().await;
            loop {
                tokio::select! {
                    end = &mut execution => break end,
                    _ = progress.tick() => {
                        let _ = message.ack_with(AckKind::Progress).await;
                    }
                }
            }
        };
        self.running.fetch_sub(1, Ordering::Relaxed);
        let outcome = Outcome { work, end };
        if let Err(e) = self.reporter.record(outcome.clone()).await {
            publish::alert(
                client,
                me,
                "outbox",
                format!("outcome of {trace} not durable ({e}); reporting it directly"),
                None,
            )
            .await;
            while let Err(e) = report_once(client, &outcome).await {
                tracing::warn!(%trace, error = %e, "direct report failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        self.in_flight.remove(&trace);
        let _ = message.ack().await;
    }

    /// Claims an attempt for this worker. True when it is ours to run.
    async fn claim(&self, trace: &str) -> Result<bool, ActorError> {
        let me = self.config.id.as_str();
        match self
            .client
            .claims
            .create(trace, bytes::Bytes::copy_from_slice(me.as_bytes()))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {
                let owner = self
                    .client
                    .claims
                    .get(trace)
                    .await
                    .map_err(|e| ActorError::Nats(format!("read claim {trace}: {e}")))?;
                Ok(owner.as_deref() == Some(me.as_bytes()))
            }
            Err(e) => Err(ActorError::Nats(format!("claim {trace}: {e}"))),
        }
    }
}
