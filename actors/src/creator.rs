//! Creating instances: the one place an instance comes into existence, for cron fires, manual
//! triggers and (later) backfills.
//!
//! Each instance is created with a create-if-absent on its id (job + expected time) in the
//! instances bucket, so however many Schedulers fire the same tick, exactly one record is
//! written; the losers see `AlreadyExists` and count the tick as de-duplicated. The winner then
//! hands the attempt to the DagCoordinator on `ax.internal.created.<job>`.
//!
//! A fire is never dropped for a transient failure: creation is retried with backoff until NATS
//! answers. A retry after a lost ack finds the record with *its own* trace id and goes on to the
//! hand-off, so an instance is never left created but not handed on by its own creator.
//! Creations run 64 at a time on a task of their own, which outlives restarts of the Scheduler
//! actor.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::kv::CreateErrorKind;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};

use ax_bus::instance::Trigger;
use ax_bus::messages::{TickOutcome, WorkItem};
use ax_bus::spec::{JobSpec, Overlap};
use ax_bus::{codec, ids, AxClient, InstanceRecord, State, Tag};

use crate::overlap::{self, Decision};
use crate::{publish, ticks, ActorError};

const IN_FLIGHT: usize = 64;

/// What happened to a creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Created {
    /// This call created the instance.
    Fired,
    /// The instance already existed (another Scheduler, or an earlier call).
    Deduplicated,
    /// The overlap policy skipped it.
    Skipped,
}

/// A new instance and its first attempt.
#[derive(Clone, Debug)]
pub struct NewInstance {
    /// The record to create.
    pub record: InstanceRecord,
    /// The first attempt.
    pub work: WorkItem,
    /// Whether the attempt goes straight to the Router: only when nothing in the DAG can
    /// concern it (no dependencies, no gate, no job depending on it).
    pub skip_coordinator: bool,
    /// For a cron tick: how it is recorded when created (`fired` or `caught_up`); the overlap
    /// policy applies to ticks only.
    pub tick: Option<TickOutcome>,
}

impl NewInstance {
    /// The first attempt of `spec`'s instance expected at `expected`.
    pub fn new(
        spec: &JobSpec,
        expected: DateTime<Utc>,
        biz_date: String,
        params: BTreeMap<String, serde_json::Value>,
        trigger: Trigger,
        now: DateTime<Utc>,
    ) -> Self {
        let instance_id = ids::instance_id(&spec.name, expected);
        let trace_id = ids::new_trace_id();
        let record = InstanceRecord {
            instance_id: instance_id.clone(),
            trace_id: trace_id.clone(),
            job: spec.name.clone(),
            biz_date: biz_date.clone(),
            attempt: 1,
            run_start: 1,
            state: State::Running,
            tag: Tag::Queued,
            expected_time: expected,
            created_at: now,
            started_at: None,
            finished_at: None,
            worker: None,
            message: "queued".to_string(),
            output: serde_json::Value::Null,
            trigger,
            params: params.clone(),
            priority: spec.priority,
            next_attempt_at: None,
            exit_code: None,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
        };
        let work = WorkItem {
            instance_id,
            trace_id,
            attempt: 1,
            run_start: 1,
            biz_date,
            expected_time: expected,
            params,
            spec: spec.clone(),
            worker: None,
            gate: None,
        };
        Self {
            record,
            work,
            skip_coordinator: false,
            tick: None,
        }
    }
}

struct Request {
    instance: NewInstance,
    reply: Option<oneshot::Sender<Created>>,
}

/// Handle to the creation task.
#[derive(Clone)]
pub struct Creator {
    tx: mpsc::UnboundedSender<Request>,
}

impl Creator {
    /// Starts the creation task on the current runtime; `node` signs the tick records.
    pub fn start(client: AxClient, node: String) -> Self {
        let (tx, rx) = mpsc::unbounded_channel::<Request>();
        tokio::spawn(async move {
            tokio_stream_of(rx)
                .for_each_concurrent(IN_FLIGHT, |request| {
                    let client = client.clone();
                    let node = node.clone();
                    async move {
                        let outcome = create_until_done(&client, &node, &request.instance).await;
                        if let Some(reply) = request.reply {
                            let _ = reply.send(outcome);
                        }
                    }
                })
                .await;
        });
        Self { tx }
    }

    /// Queues a creation without waiting.
    pub fn submit(&self, instance: NewInstance) {
        let _ = self.tx.send(Request {
            instance,
            reply: None,
        });
    }

    /// Creates and waits for the outcome.
    pub async fn create(&self, instance: NewInstance) -> Result<Created, ActorError> {
        let (reply, outcome) = oneshot::channel();
        self.tx
            .send(Request {
                instance,
                reply: Some(reply),
            })
            .map_err(|_| ActorError::Stopped("instance creator"))?;
        outcome
            .await
            .map_err(|_| ActorError::Stopped("instance creator"))
    }
}

fn tokio_stream_of<T: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

async fn create_until_done(client: &AxClient, node: &str, instance: &NewInstance) -> Created {
    let mut backoff = Duration::from_millis(100);
    loop {
        match create_once(client, node, instance).await {
            Ok(created) => return created,
            Err(e) => {
                tracing::warn!(
                    instance = %instance.record.instance_id,
                    error = %e,
                    retry_in = ?backoff,
                    "cannot create instance yet"
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

async fn create_once(
    client: &AxClient,
    node: &str,
    instance: &NewInstance,
) -> Result<Created, ActorError> {
    let job = instance.work.job();
    let tick = instance.record.expected_time;
    let overlap = match instance.tick {
        Some(_) => instance.work.spec.overlap,
        None => Overlap::Allow,
    };
    let mut instance = instance.clone();
    match overlap::decide(client, &instance.work, overlap).await? {
        Decision::Proceed => {}
        Decision::Skip(reason) => {
            ticks::record(client, node, job, tick, TickOutcome::Skipped, None, reason).await?;
            return Ok(Created::Skipped);
        }
        Decision::Queue(gate) => {
            instance.work.gate = Some(gate);
            instance.skip_coordinator = false;
        }
    }
    let id = instance.record.instance_id.clone();
    if !create_record(client, &instance.record).await? {
        if instance.tick.is_some() {
            let reason = "created by another Scheduler".to_string();
            ticks::record(
                client,
                node,
                job,
                tick,
                TickOutcome::Deduplicated,
                Some(id),
                reason,
            )
            .await?;
        }
        return Ok(Created::Deduplicated);
    }
    let work = &instance.work;
    if instance.skip_coordinator {
        publish::to_stream_acked(
            client,
            client.subjects().ready(work.spec.priority),
            &format!("ready:{}", work.trace_id),
            work,
        )
        .await?;
    } else {
        publish::to_stream_acked(
            client,
            client.subjects().created(work.job()),
            &format!("created:{}", work.trace_id),
            work,
        )
        .await?;
    }
    publish::event(client, &instance.record).await;
    if work.spec.overlap != Overlap::Allow {
        overlap::note_latest(client, job, &id).await?;
    }
    if let Some(outcome) = instance.tick {
        ticks::record(client, node, job, tick, outcome, Some(id), String::new()).await?;
    }
    Ok(Created::Fired)
}

/// Writes a new instance record if none exists under its id; true when this call's record is
/// the one stored. A record already there with the same trace id is this creation's own earlier
/// write (its ack was lost): true too.
pub async fn create_record(client: &AxClient, record: &InstanceRecord) -> Result<bool, ActorError> {
    let id = &record.instance_id;
    match client.instances.create(id, codec::encode(record)?).await {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {
            let ours = client
                .instance(id)
                .await?
                .is_some_and(|(r, _)| r.trace_id == record.trace_id);
            if !ours {
                tracing::debug!(instance = %id, "already created elsewhere: deduplicated");
            }
            Ok(ours)
        }
        Err(e) => Err(ActorError::Nats(format!("create instance {id}: {e}"))),
    }
}
