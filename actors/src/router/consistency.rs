//! The consistency sweep: every instance that is not final has an owner of its next step, and
//! one that has none is found, alerted and resumed within 30 s ([`DETECTED_WITHIN_SECS`]) of
//! its last change or its fire time — 45 s for a first attempt never handed on, which a
//! Scheduler's orphan watch may be about to adopt.
//!
//! Each rule of ax gives every step a durable owner — a message in a work-queue stream, a record
//! started by a live worker (then a claim with a lease), a re-dispatch in flight — so a stranded
//! instance means a rule was broken somewhere (issue #15 found two such places). This sweep is the
//! net under the rules: on the node that holds the janitor lease, it knows which records are not
//! final (in memory, from the instances buckets) and checks every record unchanged for
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
//! The cost: at its start, the headers of every record (a snapshot); then the headers of each
//! record write still stored once it is [`STRANDED_AFTER`] old ([`AgedWrites`]: a write naming
//! a final state ends its record's watch, and the sweep never reads the record). A finished
//! no-op instance has one write left by then — its final write rolled up the two before it —
//! where following every write as it was made cost three deliveries an instance. Otherwise
//! one read of each record still open when its last write comes by (once per revision), and
//! every [`CHECK_EVERY`] one read of each waiting message's headers in the two streams and a
//! claim read per executing record left over.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_nats::jetstream::kv::Operation;
use async_nats::jetstream::stream::DirectGetErrorKind;
use ax_bus::client::kv_view::{FeedItem, KvFeed};
use ax_bus::client::record_writes::state_of;
use ax_bus::error::{During, NatsError};
use ax_bus::ids::{InstanceId, WorkerId};
use ax_bus::messages::{AlertKind, WorkItem};
use ax_bus::{codec, InstanceRecord, State, Tag};
use chrono::{DateTime, Utc};

use super::aged_writes::AgedWrites;
use super::{Dispatcher, Knows};
use crate::jetstream::publish;
use crate::ActorError;

/// How long a record must have stayed unchanged before its owner is checked.
const STRANDED_AFTER: Duration = Duration::from_secs(15);
/// How often the records are checked.
const CHECK_EVERY: Duration = Duration::from_secs(5);
/// How long after a record write the sweep has read it, at the latest: what a
/// count of the messages an instance causes must wait for.
pub const WRITES_READ_WITHIN: Duration =
    Duration::from_secs(STRANDED_AFTER.as_secs() + CHECK_EVERY.as_secs());
/// The most records read in one check (each once, when it has stayed open and unchanged for
/// [`STRANDED_AFTER`]; a backlog — the records of an earlier version, which name no state in
/// their headers — is read over the following checks).
const READS_PER_CHECK: usize = 2048;
/// The longest a stranded instance goes unnoticed, in seconds: unchanged for
/// [`STRANDED_AFTER`], then found twice, [`CHECK_EVERY`] apart, without an owner.
const DETECTED_WITHIN_SECS: u64 = 30;
const _: () = assert!(STRANDED_AFTER.as_secs() + 2 * CHECK_EVERY.as_secs() <= DETECTED_WITHIN_SECS);
const _: () = assert!(
    STRANDED_AFTER.as_secs() + crate::outcome::ORPHAN_GRACE.as_secs() + 2 * CHECK_EVERY.as_secs()
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
    /// The record, once read: the feed carries only the headers of each write.
    record: Option<InstanceRecord>,
    revision: u64,
    changed: DateTime<Utc>,
}

/// Reads the open records (a snapshot of every bucket, the headers of each record), then the
/// writes made since, each once it is [`STRANDED_AFTER`] old ([`AgedWrites`]), and checks the
/// open records every [`CHECK_EVERY`], until a read fails.
pub(super) async fn watch(shared: Dispatcher) -> Result<(), ActorError> {
    let client = &shared.client;
    let mut open: HashMap<InstanceId, Watched> = HashMap::new();
    let mut positions = Vec::new();
    for bucket in client.instances.buckets() {
        let mut feed = KvFeed::open_headers_only(&client.js, bucket, ">").await?;
        loop {
            match feed.next().await {
                Some(Ok(FeedItem::Current)) => break,
                Some(item) => follow(&mut open, item?),
                None => return Err(ActorError::Stopped("the instances feed")),
            }
        }
        positions.push((bucket.to_string(), feed.position()));
    }
    let mut writes = AgedWrites::open(&client.js, positions).await?;
    let mut suspects: HashMap<InstanceId, u64> = HashMap::new();
    let mut every = tokio::time::interval(CHECK_EVERY);
    loop {
        every.tick().await;
        let cutoff = ax_bus::time::now() - since(STRANDED_AFTER);
        for item in writes.older_than(cutoff).await? {
            follow(&mut open, item);
        }
        suspects = check(&shared, &mut open, &suspects).await?;
    }
}

/// Applies one write to the open records. A write whose header names a final state closes its
/// record; any other write (no header: an earlier version's or a foreign writer's) leaves it
/// open, to be read when it has stayed unchanged. A write older than what a read of the record
/// already gave changes nothing: the later one comes by in its turn.
fn follow(open: &mut HashMap<InstanceId, Watched>, item: FeedItem) {
    match item {
        FeedItem::Put {
            key,
            revision,
            at,
            headers,
            ..
        } => match InstanceId::parse(&key) {
            Ok(id) if open.get(&id).is_some_and(|w| w.revision > revision) => {}
            Ok(id) if state_of(headers.as_ref()).is_some_and(State::is_final) => {
                open.remove(&id);
            }
            Ok(id) => {
                let watched = Watched {
                    record: None,
                    revision,
                    changed: at,
                };
                open.insert(id, watched);
            }
            Err(e) => tracing::debug!(%key, error = %e, "a record of no instance not watched"),
        },
        FeedItem::Deleted { key } => {
            if let Ok(id) = InstanceId::parse(&key) {
                open.remove(&id);
            }
        }
        FeedItem::Current => {}
    }
}

/// Reads the records unchanged for [`STRANDED_AFTER`] that were not read yet (at most
/// [`READS_PER_CHECK`]).
async fn read_quiet(
    shared: &Dispatcher,
    open: &mut HashMap<InstanceId, Watched>,
    now: DateTime<Utc>,
) -> Result<(), ActorError> {
    let unread: Vec<InstanceId> = open
        .iter()
        .filter(|(_, w)| w.record.is_none() && w.changed + since(STRANDED_AFTER) < now)
        .map(|(id, _)| id.clone())
        .take(READS_PER_CHECK)
        .collect();
    for id in unread {
        let entry = shared
            .client
            .instances
            .entry(&id)
            .await
            .during(|| format!("read instance {id}"))?;
        let read = entry
            .filter(|e| e.operation == Operation::Put)
            .map(|e| (codec::decode::<InstanceRecord>(&e.value), e.revision));
        note_read(open, &id, read, now);
    }
    Ok(())
}

/// Applies what reading `id` gave: a record found final, deleted or undecodable is no longer
/// watched; one older than the feed's last word on it (a replica behind) is read again later;
/// one newer is taken as changed now.
fn note_read(
    open: &mut HashMap<InstanceId, Watched>,
    id: &InstanceId,
    read: Option<(Result<InstanceRecord, codec::CodecError>, u64)>,
    now: DateTime<Utc>,
) {
    let (record, revision) = match read {
        Some((Ok(record), revision)) if !record.state.is_final() => (record, revision),
        Some((Err(e), _)) => {
            tracing::debug!(instance = %id, error = %e, "undecodable record not watched");
            open.remove(id);
            return;
        }
        _ => {
            open.remove(id);
            return;
        }
    };
    let Some(watched) = open.get_mut(id).filter(|w| revision >= w.revision) else {
        return;
    };
    if revision > watched.revision {
        watched.revision = revision;
        watched.changed = now;
    }
    watched.record = Some(record);
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
fn quiet_since(watched: &Watched, record: &InstanceRecord) -> DateTime<Utc> {
    watched.changed.max(record.expected_time)
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
        STRANDED_AFTER + crate::outcome::ORPHAN_GRACE
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
    open: &mut HashMap<InstanceId, Watched>,
    before: &HashMap<InstanceId, u64>,
) -> Result<HashMap<InstanceId, u64>, ActorError> {
    let now = ax_bus::time::now();
    read_quiet(shared, open, now).await?;
    let stale: Vec<(&InstanceRecord, u64, Step)> = open
        .values()
        .filter_map(|w| w.record.as_ref().map(|record| (w, record)))
        .filter(|(w, record)| quiet_since(w, record) + since(quiet_for(record)) < now)
        .filter_map(|(w, record)| step_of(record, now).map(|step| (record, w.revision, step)))
        .collect();
    if stale.is_empty() {
        return Ok(HashMap::new());
    }
    let waiting = attempts_in_queues(shared).await?;
    let mut suspects = HashMap::new();
    for (record, revision, step) in stale {
        if owned(shared, record, &step, &waiting, now).await? {
            continue;
        }
        if before.get(&record.instance_id) == Some(&revision) {
            resume(shared, record, &step).await?;
        } else {
            suspects.insert(record.instance_id.clone(), revision);
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
            crate::outcome::run_retry(client, &record.instance_id, &record.trace_id).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ax_bus::instance::Trigger;

    fn record() -> InstanceRecord {
        let doc: ax_bus::spec::JobDocument = serde_json::from_value(serde_json::json!({
            "version": "v1",
            "job": {"name": "j", "exec": {"type": "noop"}}
        }))
        .unwrap();
        let now = ax_bus::time::now();
        InstanceRecord::first(
            &doc.job,
            now,
            "2026-12-03".into(),
            Default::default(),
            Trigger::Manual,
            now,
        )
    }

    fn put(record: &InstanceRecord, revision: u64, state: Option<&str>) -> FeedItem {
        let headers = state.map(|state| {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(ax_bus::client::record_writes::STATE_HEADER, state);
            headers
        });
        FeedItem::Put {
            key: record.instance_id.to_string(),
            value: bytes::Bytes::new(),
            revision,
            at: ax_bus::time::now(),
            headers,
        }
    }

    #[test]
    fn a_write_naming_a_final_state_ends_the_watch_and_any_other_keeps_it() {
        let (mut open, r) = (HashMap::new(), record());
        follow(&mut open, put(&r, 1, Some("running")));
        assert_eq!(open[&r.instance_id].revision, 1);
        follow(&mut open, put(&r, 2, Some("success")));
        assert!(open.is_empty());
        // Without the header (an earlier version's write), or naming no state: open, unread.
        follow(&mut open, put(&r, 3, None));
        follow(&mut open, put(&r, 4, Some("bogus")));
        assert!(open[&r.instance_id].record.is_none());
        let junk = FeedItem::Put {
            key: "not an id!".into(),
            value: bytes::Bytes::new(),
            revision: 5,
            at: ax_bus::time::now(),
            headers: None,
        };
        follow(&mut open, junk);
        assert_eq!(open.len(), 1);
        follow(
            &mut open,
            FeedItem::Deleted {
                key: r.instance_id.to_string(),
            },
        );
        assert!(open.is_empty());
    }

    #[test]
    fn a_write_older_than_a_read_of_the_record_changes_nothing() {
        let (mut open, r) = (HashMap::new(), record());
        let id = r.instance_id.clone();
        follow(&mut open, put(&r, 3, Some("running")));
        // A read of the record found revision 7 (written since): the aged writes 4 to 6 come
        // by later and neither reopen nor close it.
        note_read(
            &mut open,
            &id,
            Some((Ok(r.clone()), 7)),
            ax_bus::time::now(),
        );
        follow(&mut open, put(&r, 5, Some("success")));
        follow(&mut open, put(&r, 6, Some("running")));
        assert_eq!(open[&id].revision, 7);
        assert!(open[&id].record.is_some(), "not read again");
        // Its own write, or a later one, is applied.
        follow(&mut open, put(&r, 8, Some("failed")));
        assert!(open.is_empty());
    }

    #[test]
    fn a_read_record_is_kept_only_while_open_decodable_and_not_older_than_the_feed() {
        let r = record();
        let id = r.instance_id.clone();
        let now = ax_bus::time::now();
        let watched = |open: &mut HashMap<InstanceId, Watched>| {
            follow(open, put(&r, 5, None));
        };
        let mut open = HashMap::new();
        watched(&mut open);
        let changed = open[&id].changed;
        // A replica behind the feed: not taken, read again later.
        note_read(&mut open, &id, Some((Ok(r.clone()), 4)), now);
        assert!(open[&id].record.is_none());
        note_read(&mut open, &id, Some((Ok(r.clone()), 5)), now);
        assert_eq!((open[&id].revision, open[&id].changed), (5, changed));
        assert!(open[&id].record.is_some());
        // Written since the feed's last word: changed now.
        let later = now + chrono::Duration::seconds(1);
        note_read(&mut open, &id, Some((Ok(r.clone()), 7)), later);
        assert_eq!((open[&id].revision, open[&id].changed), (7, later));
        // Final, deleted, or undecodable (hostile bytes in the bucket): no longer watched.
        let mut done = r.clone();
        done.state = State::Success;
        for read in [
            Some((Ok(done), 8)),
            None,
            Some((codec::decode::<InstanceRecord>(b"\xc1"), 8)),
        ] {
            watched(&mut open);
            note_read(&mut open, &id, read, now);
            assert!(open.is_empty());
        }
    }
}
