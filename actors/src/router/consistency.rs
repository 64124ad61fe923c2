//! The consistency sweep: every instance that is not final has an owner of its next step, and
//! one that has none is found, alerted and resumed within 30 s ([`DETECTED_WITHIN_SECS`]) of
//! its last change or its fire time — 45 s for a first attempt never handed on, which a
//! Scheduler's orphan watch may be about to adopt.
//!
//! Each rule of ax gives every step a durable owner — a message in a work-queue stream, a record
//! started by a live worker (then a claim with a lease), a re-dispatch in flight — so a stranded
//! instance means a rule was broken somewhere (issue #15 found two such places). This sweep is the
//! net under the rules: it follows the instances bucket (the records that are not final, in memory)
//! and, on the node that holds the janitor lease, checks every record unchanged for
//! [`STRANDED_AFTER`] (see [`quiet_for`]):
//! - **queued** (`queued`, `no_worker`): owned while a message of its attempt waits in
//!   `AX_FLOW` or `AX_DISPATCH` (any of them: created, ready, dispatch), or while a re-dispatch
//!   of it is in flight (its record reserved for it). Resumed by a re-dispatch, under a new
//!   reservation.
//! - **executing**: owned while its worker holds the claim with a live lease, or is still
//!   known to the Router (the janitor judges a silent worker) and holds the claim or has not
//!   renewed one yet (an attempt writes its claim at its first renewal). Resumed as a lost
//!   attempt (tag `worker_lost`, a new attempt under a new trace id).
//! - **waiting for its retry** past its due time: owned while its retry message waits in
//!   `AX_FLOW`. Resumed by running the retry.
//!
//! Waiting for dependencies (the DagCoordinator's, with `deps_timeout`), and a parent waiting
//! for its shards, are not the sweep's. A record found without an owner is resumed only when a
//! second check, one period later, finds it unchanged and still without one: a step between
//! two owners (a message consumed, its successor not yet written) is not a stranding.
//!
//! The cost: nothing while every open record changes within [`STRANDED_AFTER`]; otherwise one
//! read of each waiting message's headers in the two streams, and a claim read per executing
//! record left over, every [`CHECK_EVERY`].

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_nats::jetstream::stream::DirectGetErrorKind;
use chrono::{DateTime, Utc};
use futures::StreamExt;

use ax_bus::client::kv_view::{FeedItem, KvFeed};
use ax_bus::error::NatsError;
use ax_bus::ids::{InstanceId, WorkerId};
use ax_bus::messages::{AlertKind, WorkItem};
use ax_bus::{codec, InstanceRecord, State, Tag};

use super::{Dispatcher, Knows};
use crate::jetstream::publish;
use crate::ActorError;

/// How long a record must have stayed unchanged before its owner is checked.
const STRANDED_AFTER: Duration = Duration::from_secs(15);
/// How often the records are checked.
const CHECK_EVERY: Duration = Duration::from_secs(5);
/// The longest a stranded instance goes unnoticed, in seconds: unchanged for
/// [`STRANDED_AFTER`], then found twice, [`CHECK_EVERY`] apart, without an owner.
const DETECTED_WITHIN_SECS: u64 = 30;
const _: () = assert!(STRANDED_AFTER.as_secs() + 2 * CHECK_EVERY.as_secs() <= DETECTED_WITHIN_SECS);
const _: () = assert!(
    STRANDED_AFTER.as_secs()
        + crate::scheduler::orphans::ORPHAN_GRACE.as_secs()
        + 2 * CHECK_EVERY.as_secs()
        <= DETECTED_WITHIN_SECS + 15
);

/// The step a record waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    /// A worker to start it.
    Queued,
    /// Its worker to finish it.
    Executing(WorkerId),
    /// Its retry, now due.
    Retry,
}

/// An open record as last seen.
#[derive(Debug)]
struct Watched {
    record: InstanceRecord,
    revision: u64,
    changed: DateTime<Utc>,
}

/// Follows the instances bucket and checks the open records every [`CHECK_EVERY`], until the
/// feed fails.
pub(super) async fn watch(shared: Dispatcher) -> Result<(), ActorError> {
    let client = &shared.client;
    let bucket = client.layout.instances_bucket();
    let mut feed = KvFeed::open(&client.js, &bucket, ">").await?.into_stream();
    let mut open: HashMap<InstanceId, Watched> = HashMap::new();
    let mut suspects: HashMap<InstanceId, u64> = HashMap::new();
    let mut every = tokio::time::interval(CHECK_EVERY);
    let mut loaded = false;
    loop {
        tokio::select! {
            item = feed.next() => match item {
                Some(item) => loaded |= follow(&mut open, item?),
                None => return Err(ActorError::Stopped("the instances feed")),
            },
            _ = every.tick(), if loaded => {
                suspects = check(&shared, &open, &suspects).await?;
            }
        }
    }
}

/// Applies one feed item to the open records; true once the snapshot is in.
fn follow(open: &mut HashMap<InstanceId, Watched>, item: FeedItem) -> bool {
    match item {
        FeedItem::Put {
            key,
            value,
            revision,
            at,
        } => match codec::decode::<InstanceRecord>(&value) {
            Ok(record) if !record.state.is_final() => {
                let id = record.instance_id.clone();
                let changed = at;
                open.insert(
                    id,
                    Watched {
                        record,
                        revision,
                        changed,
                    },
                );
            }
            Ok(record) => {
                open.remove(&record.instance_id);
            }
            Err(e) => tracing::debug!(%key, error = %e, "undecodable record not watched"),
        },
        FeedItem::Deleted { key } => {
            if let Ok(id) = InstanceId::parse(&key) {
                open.remove(&id);
            }
        }
        FeedItem::Current => return true,
    }
    false
}

/// The step `record` waits for, if it is one the sweep owns.
fn step_of(record: &InstanceRecord, now: DateTime<Utc>) -> Option<Step> {
    match (record.state, record.tag) {
        (State::Running, Tag::Queued | Tag::NoWorker) => Some(Step::Queued),
        (State::Running, Tag::Executing) => record.worker.clone().map(Step::Executing),
        (State::WaitingRetry, _) => record
            .next_attempt_at
            .is_some_and(|due| due + since(STRANDED_AFTER) < now)
            .then_some(Step::Retry),
        _ => None,
    }
}

/// Since when a record has waited: its last change, or its fire time if that is later (a
/// Scheduler hands an instance created ahead of its tick on at the tick).
fn quiet_since(watched: &Watched) -> DateTime<Utc> {
    watched.changed.max(watched.record.expected_time)
}

/// How long a record may wait before its owner is checked: [`STRANDED_AFTER`], and for a
/// first attempt never handed on the orphan watch's grace on top, so that a Scheduler watching
/// it (it lost the race to create it) adopts it first, as its overlap policy allows.
fn quiet_for(record: &InstanceRecord) -> Duration {
    let untouched = record.state == State::Running
        && record.tag == Tag::Queued
        && record.attempt == 1
        && record.run_start == 1;
    if untouched {
        STRANDED_AFTER + crate::scheduler::orphans::ORPHAN_GRACE
    } else {
        STRANDED_AFTER
    }
}

fn since(duration: Duration) -> chrono::Duration {
    chrono::Duration::from_std(duration).unwrap_or_default()
}

/// Checks the records unchanged for long enough; resumes those found without an owner twice
/// in a row (at the same revision) and returns those found so for the first time.
async fn check(
    shared: &Dispatcher,
    open: &HashMap<InstanceId, Watched>,
    before: &HashMap<InstanceId, u64>,
) -> Result<HashMap<InstanceId, u64>, ActorError> {
    let now = ax_bus::time::now();
    let stale: Vec<(&Watched, Step)> = open
        .values()
        .filter(|w| quiet_since(w) + since(quiet_for(&w.record)) < now)
        .filter_map(|w| step_of(&w.record, now).map(|step| (w, step)))
        .collect();
    if stale.is_empty() {
        return Ok(HashMap::new());
    }
    let waiting = attempts_in_queues(shared).await?;
    let mut suspects = HashMap::new();
    for (watched, step) in stale {
        let record = &watched.record;
        if owned(shared, record, &step, &waiting, now).await? {
            continue;
        }
        if before.get(&record.instance_id) == Some(&watched.revision) {
            resume(shared, record, &step).await?;
        } else {
            suspects.insert(record.instance_id.clone(), watched.revision);
        }
    }
    Ok(suspects)
}

/// Whether someone owns `record`'s next step.
async fn owned(
    shared: &Dispatcher,
    record: &InstanceRecord,
    step: &Step,
    waiting: &HashSet<String>,
    now: DateTime<Utc>,
) -> Result<bool, ActorError> {
    let trace = &record.trace_id;
    let message_waits = waiting.contains(trace.as_str());
    let worker = match step {
        Step::Retry => return Ok(message_waits),
        Step::Queued if message_waits => return Ok(true),
        Step::Queued => {
            let reserved = record
                .reserved
                .as_ref()
                .is_some_and(|r| r.trace_id == *trace);
            return Ok(reserved && shared.client.in_flight_of(trace).await?.is_some());
        }
        Step::Executing(worker) => worker,
    };
    // An executing attempt's dispatch waits unacknowledged in its queue for as long as it
    // runs, so only its claim — or, before its first renewal wrote one, its worker — says
    // whether someone runs it.
    match shared.client.claim_of(trace).await? {
        None => Ok(shared.router.send(Knows(worker.clone())).await?),
        Some((claim, _)) if claim.revoked || claim.worker.as_ref() != Some(worker) => Ok(false),
        Some((claim, _)) => Ok(claim.lease_until.is_some_and(|l| l > now)
            || shared.router.send(Knows(worker.clone())).await?),
    }
}

/// The trace ids of the attempts that have a message waiting in `AX_FLOW` or `AX_DISPATCH`,
/// read from the message ids (`<kind>:<trace>[:<dispatch>]`).
async fn attempts_in_queues(shared: &Dispatcher) -> Result<HashSet<String>, ActorError> {
    let client = &shared.client;
    let mut traces = HashSet::new();
    for name in [client.layout.flow_stream(), client.layout.dispatch_stream()] {
        let failed = |e: ax_bus::error::BoxError| NatsError::new(format!("read {name}"), e);
        let stream = client
            .js
            .get_stream(&name)
            .await
            .map_err(|e| failed(e.into()))?;
        let mut next = None;
        loop {
            let message = match stream.direct_get_next_for_subject(">", next).await {
                Ok(message) => message,
                Err(e) if e.kind() == DirectGetErrorKind::NotFound => break,
                Err(e) => return Err(failed(e.into()).into()),
            };
            next = Some(message.sequence + 1);
            let id = message
                .headers
                .get(async_nats::header::NATS_MESSAGE_ID)
                .map(|v| v.as_str().to_string());
            if let Some(trace) = id.as_deref().and_then(|id| id.split(':').nth(1)) {
                traces.insert(trace.to_string());
            }
        }
    }
    Ok(traces)
}

/// Alerts and resumes a stranded record.
async fn resume(
    shared: &Dispatcher,
    record: &InstanceRecord,
    step: &Step,
) -> Result<(), ActorError> {
    let (client, node) = (&shared.client, &shared.node);
    let what = match step {
        Step::Queued => "queued, with no message or re-dispatch of its attempt",
        Step::Executing(_) => "executing, with no live claim of its worker",
        Step::Retry => "waiting for a retry past its due time, with no retry message",
    };
    let Some((job, _)) = client.job(&record.job).await? else {
        let why = "the job was deleted while the instance was stranded";
        let (id, trace) = (&record.instance_id, &record.trace_id);
        return crate::outcome::cancel_for_deleted_job(client, id, trace, why).await;
    };
    let work = WorkItem::for_attempt(record, job.spec);
    publish::instance_alert(
        client,
        node,
        AlertKind::Stranded,
        format!(
            "instance {} was {what} for over {:?}; resumed",
            record.instance_id, STRANDED_AFTER
        ),
        &work,
    )
    .await;
    match step {
        Step::Queued => shared.redispatch(work, Vec::new()).await,
        Step::Executing(worker) => {
            crate::outcome::lost(client, node, &record.instance_id, &record.trace_id, worker).await
        }
        Step::Retry => {
            crate::scheduler::run_retry(client, &record.instance_id, &record.trace_id).await
        }
    }
}
