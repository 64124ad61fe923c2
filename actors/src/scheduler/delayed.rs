//! Delayed triggers (`--at`, `--in`): an instance created now that runs at its due time.
//!
//! The record is created at once (`running`, tag `scheduled`, its due time as `expected_time`),
//! so a delayed instance is visible, listed and durable from the moment it is accepted. The
//! wait itself is kept by JetStream, not by a Scheduler's memory: the attempt goes into
//! `<AX>_DELAYED` as a message schedule (`Nats-Schedule: @at …`), and the server publishes it
//! on `ax.internal.due.<job>` when its time comes, whether or not a Scheduler runs then. A
//! million pending delayed instances cost the Schedulers nothing.
//!
//! The server's schedules fire within about a quarter of a second; ax promises milliseconds.
//! So a schedule fires [`LEAD`] before the due time, and the Scheduler that receives it holds
//! it to the millisecond and then releases it: the record moves to `queued` (a
//! compare-and-swap: one cancelled meanwhile stays cancelled) and the attempt is handed on as
//! any other. A due time closer than the lead skips the schedule and goes to the Schedulers at
//! once. A Scheduler killed while holding one leaves it unacknowledged; it comes again after
//! [`ACK_WAIT`] to another Scheduler, which releases it at once with its lateness recorded. One
//! found past due (every Scheduler was down) is released at once the same way, never dropped
//! by a misfire policy.

use std::time::Duration;

use async_nats::jetstream::context::PublishAckFuture;
use chrono::{DateTime, Utc};
use futures::StreamExt;

use ax_bus::client::Updated;
use ax_bus::error::During;
use ax_bus::ids::NodeId;
use ax_bus::messages::{AlertKind, DelayedWork, StoredRecord, WorkItem};
use ax_bus::{codec, msg_id, AxClient, State, Tag};

use crate::jetstream::consume::{self, ConsumerSpec};
use crate::jetstream::publish;
use crate::scheduler::new_instance::NewInstance;
use crate::ActorError;

/// How long before its due time a schedule fires (the server's schedules fire within about
/// 250 ms; the rest of the wait is held by the Scheduler that receives it).
pub(crate) const LEAD: Duration = Duration::from_secs(1);
/// How long before its due time a held attempt's record is read.
const READ_AHEAD: Duration = Duration::from_millis(50);
/// How long a Scheduler may hold a due attempt before JetStream gives it to another.
const ACK_WAIT: Duration = Duration::from_secs(10);
/// The farthest ahead a delayed trigger or a job's `at` may be due unless the node's config
/// says otherwise (`[scheduler] max_delay_days`): a year.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(366 * 24 * 3600);

/// Publishes the wait of a delayed instance's first attempt: a schedule in `<AX>_DELAYED`, or,
/// when it is due within [`LEAD`], the due message itself.
pub(crate) async fn schedule(
    client: &AxClient,
    instance: &NewInstance,
) -> Result<PublishAckFuture, ActorError> {
    let work = &instance.work;
    let delayed = DelayedWork {
        work: work.clone(),
        skip_coordinator: instance.skip_coordinator,
        defined_at: instance.defined_at,
    };
    let subjects = client.subjects();
    let mut headers = codec::msgpack_headers();
    let fire_at = work.expected_time - chrono::Duration::from_std(LEAD).unwrap_or_default();
    let subject = if fire_at > ax_bus::time::now() {
        headers.insert(
            "Nats-Schedule",
            format!("@at {}", ax_bus::time::rfc3339(fire_at)).as_str(),
        );
        headers.insert("Nats-Schedule-Target", subjects.due(work.job()).as_str());
        subjects.delayed(&work.instance_id)
    } else {
        subjects.due(work.job())
    };
    let id = msg_id::delayed(&work.trace_id);
    publish::to_stream_with(client, subject, &id, headers, &delayed).await
}

/// Reads the attempts that are about to be due (`ax.internal.due.>`), holds each until its
/// time and releases it.
pub(crate) async fn follow(client: AxClient, node: NodeId) -> Result<(), ActorError> {
    let spec = ConsumerSpec {
        ack_wait: ACK_WAIT,
        max_ack_pending: 20_000,
        ..ConsumerSpec::new(
            client.layout.delayed_stream(),
            "scheduler-due",
            client.subjects().due_all(),
        )
    };
    let mut messages = consume::watched(super::ACTOR, "due", &client, &spec, 256).await?;
    while let Some(message) = messages.next().await {
        let message = message.during(|| "due consumer")?;
        let decoded = consume::decode_or_dead_letter(&client, &node, AlertKind::Flow, &message);
        let Some(delayed): Option<DelayedWork> = decoded.await else {
            continue;
        };
        // Held on a task of its own: a restart of the Scheduler does not cut the wait short,
        // and one slow release never holds up the next.
        let client = client.clone();
        tokio::spawn(async move {
            let due = delayed.work.expected_time;
            // Read shortly before the due time, so that then only the write and the hand-off
            // remain (a stale read costs a refused write and a read then); not at once, or the
            // reads of a whole second's schedules, which the server fires together, would
            // crowd the releases under way.
            let read_at = due - chrono::Duration::from_std(READ_AHEAD).unwrap_or_default();
            if let Ok(wait) = (read_at - ax_bus::time::now()).to_std() {
                tokio::time::sleep(wait).await;
            }
            let known = match client.instance(&delayed.work.instance_id).await {
                Ok(found) => found.map(|(record, revision)| StoredRecord {
                    record: Box::new(record),
                    revision,
                }),
                Err(_) => None,
            };
            if let Ok(wait) = (due - ax_bus::time::now()).to_std() {
                tokio::time::sleep(wait).await;
            }
            crate::test_hooks::failpoint::hit("delayed.due");
            match release(&client, delayed, due, known).await {
                Ok(()) => consume::ack(&message).await,
                Err(e) => {
                    tracing::warn!(error = %e, "delayed instance not released; again in 1 s");
                    consume::nak(&message, Duration::from_secs(1)).await;
                }
            }
        });
    }
    Ok(())
}

/// Whether the record shows `work` released (queued) and not yet taken further.
async fn released_unhanded(client: &AxClient, work: &WorkItem) -> Result<bool, ActorError> {
    Ok(client
        .instance(&work.instance_id)
        .await?
        .is_some_and(|(r, _)| {
            r.trace_id == work.trace_id && r.state == State::Running && r.tag == Tag::Queued
        }))
}

/// Whether the job a delayed instance was created under is still in the registry: an entry
/// of its name, and — when the instance knows which job it was created under — the same job,
/// not one deleted and applied again since (whose definition it does not carry).
async fn still_defined(
    client: &AxClient,
    job: &ax_bus::ids::JobName,
    defined_at: Option<DateTime<Utc>>,
) -> Result<bool, ax_bus::ClientError> {
    let Some(created_under) = defined_at else {
        return client.job_exists(job).await;
    };
    Ok(match client.job(job).await {
        Ok(Some((record, _))) => record.defined_at.is_none_or(|now| now == created_under),
        Ok(None) => false,
        // An entry that does not decode is not the job it was created under.
        Err(ax_bus::ClientError::Codec(_)) => false,
        Err(e) => return Err(e),
    })
}

/// Moves the record from `scheduled` to `queued` (from `known`, the record as read during the
/// wait) and hands the attempt on, unless its job is gone — asked at the same time as the
/// write, so the check adds no round trip to the lateness: the instance released for a job
/// deleted meanwhile is cancelled instead of handed on. A record that is gone, cancelled or
/// released already is left as it is.
async fn release(
    client: &AxClient,
    delayed: DelayedWork,
    due: DateTime<Utc>,
    known: Option<StoredRecord>,
) -> Result<(), ActorError> {
    let DelayedWork {
        mut work,
        skip_coordinator,
        defined_at,
    } = delayed;
    let late_ms = (ax_bus::time::now() - due).num_milliseconds().max(0);
    let (exists, released) = tokio::join!(
        still_defined(client, work.job(), defined_at),
        client.update_instance_from(&work.instance_id, known, |r| {
            r.released(&work.trace_id, late_ms)
        })
    );
    match released? {
        Updated::Written(record, revision) => {
            crate::test_hooks::failpoint::hit("delayed.released");
            publish::event(client, &record).await;
            work.stored = Some(StoredRecord { record, revision });
        }
        // Released by an earlier delivery that may have stopped before handing it on: handed
        // on again, under the same message id (JetStream keeps one; a second dispatch would be
        // fenced by the record's `executing` write).
        Updated::Refused(_) if released_unhanded(client, &work).await? => {}
        Updated::Refused(refused) => {
            tracing::debug!(instance = %work.instance_id, %refused, "delayed instance not released");
            return Ok(());
        }
        Updated::Missing => return Ok(()),
    }
    if !exists? {
        let why = "its job was deleted before the instance was due";
        return crate::outcome::cancel_for_deleted_job(
            client,
            &work.instance_id,
            &work.trace_id,
            why,
        )
        .await;
    }
    let subjects = client.subjects();
    let (subject, id) = if skip_coordinator {
        (subjects.ready_for(&work), msg_id::ready(&work.trace_id))
    } else {
        (
            subjects.created(work.job()),
            msg_id::created(&work.trace_id),
        )
    };
    publish::to_stream_acked(client, subject, &id, &work).await?;
    crate::metrics::fire_handed_on(due);
    Ok(())
}
