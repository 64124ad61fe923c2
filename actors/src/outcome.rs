//! An attempt's end, recorded: the one way an outcome becomes the instance's state, its
//! result, its alerts, its dead letter and its retry hand-off. The Reporter runs it for every
//! outcome of its outbox; the worker runs it directly when its outbox cannot take an outcome,
//! and the dead-letter keeper for a dispatch that was never settled. An attempt lost with its
//! worker ([`lost`]) — the janitor finds one of a dead worker, a restarted worker finds one its
//! previous process started — ends the same way, and its instance moves to a new attempt.
//!
//! Both are idempotent: the record moves with a compare-and-swap (a stale attempt is refused
//! and its result dropped, a repeat changes nothing), and the result, dead letter, retry and
//! hand-off are published under message ids derived from the trace id, so JetStream drops a
//! repeat. They may therefore be run again until they succeed.

use serde::{Deserialize, Serialize};

use ax_bus::client::Updated;
use ax_bus::ids::{InstanceId, NodeId, TraceId, WorkerId};
use ax_bus::instance::{AttemptEnd, State, Tag, TransitionRefused};
use ax_bus::messages::{AlertKind, ResultMessage, StoredRecord, WorkItem};
use ax_bus::msg_id;
use ax_bus::AxClient;

use crate::jetstream::burst::Item;
use crate::jetstream::gathered::Gathered;
use crate::jetstream::publish;
use crate::ActorError;

/// How long an instance may stay untouched after its creation before it counts as an orphan:
/// the Scheduler's orphan watch waits this long for its hand-off, and the Router's consistency
/// sweep leaves a new instance to that watch as long.
pub(crate) const ORPHAN_GRACE: std::time::Duration = std::time::Duration::from_secs(15);

/// An attempt's outcome, waiting to be reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// What was run.
    pub work: WorkItem,
    /// How it ended.
    pub end: AttemptEnd,
    /// The instance record as the worker last wrote it, with its revision: saves the Reporter a
    /// read when nothing changed it since. Kept in memory only (an outcome read back from the
    /// file after a restart reads the record).
    #[serde(skip)]
    pub written: Option<StoredRecord>,
}

/// Reports one outcome, its result published with the bursts of `results` if given. Ok also
/// when there is nothing left to do (stale or unknown attempt).
pub(crate) async fn report(
    client: &AxClient,
    outcome: &Outcome,
    results: Option<&Gathered>,
) -> Result<(), ActorError> {
    let (work, end) = (&outcome.work, &outcome.end);
    let retry_at = retry_at(outcome);
    let Some(state) = write_end(client, outcome, retry_at).await? else {
        return Ok(());
    };
    let next_attempt_at = retry_at.filter(|_| state == State::WaitingRetry);
    let result = ResultMessage::new(work, end, state, next_attempt_at);
    let (subject, msg_id) = (
        client.subjects().result(work.job()),
        msg_id::result(&end.trace_id),
    );
    match results {
        Some(results) => {
            results
                .publish(Item::new(subject, &msg_id, &result)?)
                .await?
        }
        None => publish::to_stream_acked(client, subject, &msg_id, &result).await?,
    }
    if end.tag == Tag::Timeout {
        let message = format!(
            "attempt {} of instance {} timed out: {}",
            work.attempt, work.instance_id, end.message
        );
        publish::instance_alert(client, &end.worker, AlertKind::Timeout, message, work).await;
    }
    match state {
        State::Failed => failed_for_good(client, outcome).await,
        // The Schedulers hear only of the attempts they must retry.
        State::WaitingRetry => {
            publish::to_stream_acked(
                client,
                client.subjects().retry(work.job()),
                &msg_id::retry(&end.trace_id),
                &result,
            )
            .await
        }
        _ => Ok(()),
    }
}

/// When the next attempt is due, if the attempt failed and the job has a retry left for it.
fn retry_at(outcome: &Outcome) -> Option<chrono::DateTime<chrono::Utc>> {
    let (work, end) = (&outcome.work, &outcome.end);
    // A definition the registry does not hold is not retried either: its retry rule is part
    // of what could not be trusted.
    if end.success || end.tag == Tag::Unregistered {
        return None;
    }
    let attempt_of_run = work.attempt.saturating_sub(work.run_start) + 1;
    work.spec
        .retry
        .as_ref()
        .and_then(|r| r.next_attempt_at(attempt_of_run, &end.trace_id, end.finished_at))
}

/// Moves the record to the attempt's end: the instance's state after it, or `None` when the
/// attempt is not the record's any more (stale) or the record is gone.
async fn write_end(
    client: &AxClient,
    outcome: &Outcome,
    retry_at: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<Option<State>, ActorError> {
    let (work, end) = (&outcome.work, &outcome.end);
    // Ended by someone else while it ran (a kill, a superseding fire): what the attempt did is
    // added to their end, which carries its result already.
    let updated = client
        .update_instance_from(&work.instance_id, outcome.written.clone(), |r| {
            match r.ended(end, retry_at) {
                Err(TransitionRefused::AlreadyEnded(_)) if !r.ended_by(end) => r.with_facts_of(end),
                ended => ended,
            }
        })
        .await?;
    Ok(match updated {
        Updated::Written(record, _) if !record.ended_by(end) => {
            tracing::debug!(trace = %end.trace_id, instance = %work.instance_id, "the exit and tails of an attempt ended by another added to its record");
            None
        }
        Updated::Written(record, _) => {
            publish::event(client, &record).await;
            Some(record.state)
        }
        Updated::Refused(TransitionRefused::AlreadyEnded(state)) => Some(state),
        // Its ender published its result; the record tells what it did.
        Updated::Refused(TransitionRefused::EndedByAnother(_)) => None,
        Updated::Refused(refused) => {
            tracing::warn!(trace = %end.trace_id, instance = %work.instance_id, %refused, "result of a superseded attempt dropped");
            None
        }
        Updated::Missing => {
            tracing::warn!(instance = %work.instance_id, "result for an unknown instance dropped");
            None
        }
    })
}

/// An instance failed for good: an alert, and (unless it is a shard, whose parent fails in
/// its place) a dead letter.
async fn failed_for_good(client: &AxClient, outcome: &Outcome) -> Result<(), ActorError> {
    let (work, end) = (&outcome.work, &outcome.end);
    let message = format!(
        "instance {} failed for good after attempt {}: {}: {}",
        work.instance_id,
        work.attempt,
        end.tag.as_str(),
        end.message
    );
    publish::instance_alert(client, &end.worker, AlertKind::Failure, message, work).await;
    if work.shard.is_some() {
        return Ok(());
    }
    publish::failed_for_good(client, &end.worker, work, end.tag, &end.message).await
}

/// Attempts an instance may lose with their worker before it fails.
pub(crate) const MAX_WORKER_LOSSES: u32 = 3;

/// Attempt `trace` of `instance_id`, started by `worker`, was lost with it (the worker died, or a
/// process of it was killed while the command ran): its claim is revoked (written revoked, if the
/// attempt had not renewed one yet) — so that it can never run or report again — and the instance
/// moves to a new attempt under a new trace id (tag `worker_lost`; after [`MAX_WORKER_LOSSES`] it
/// fails), whose result says the attempt was lost. Resumable: run again after a failure halfway, it
/// finishes what is left.
pub(crate) async fn lost(
    client: &AxClient,
    node: &NodeId,
    instance_id: &InstanceId,
    trace: &TraceId,
    worker: &WorkerId,
) -> Result<(), ActorError> {
    if !client.revoke_claim(instance_id, trace, worker).await? {
        return Ok(());
    }
    let new_trace = TraceId::random();
    let record = match client
        .update_instance(instance_id, |r| {
            r.worker_lost(trace, &new_trace, worker, MAX_WORKER_LOSSES)
        })
        .await?
    {
        Updated::Written(record, _) => {
            tracing::warn!(instance = %instance_id, %worker, state = %record.state, "attempt lost with its worker");
            publish::event(client, &record).await;
            *record
        }
        // Moved on already: by an earlier run of this that stopped halfway, the hand-off may
        // be missing (sent again, it is dropped or fenced); or anew, and then it is not queued.
        Updated::Refused(_) => {
            return match client.instance(instance_id).await? {
                Some((record, _)) => hand_on_after_loss(client, node, &record).await,
                None => Ok(()),
            };
        }
        Updated::Missing => return Ok(()),
    };
    // The lost attempt's result: its own trace and number, the instance's state after it.
    let mut lost = record.clone();
    lost.trace_id = trace.clone();
    if record.state == State::Running {
        lost.attempt = lost.attempt.saturating_sub(1);
    }
    lost.tag = Tag::WorkerLost;
    publish::to_stream_acked(
        client,
        client.subjects().result(&record.job),
        &msg_id::result(trace),
        &ResultMessage::from_record(&lost),
    )
    .await?;
    hand_on_after_loss(client, node, &record).await
}

/// After a loss: the new attempt goes to the Router (a second hand-off of it is dropped by its
/// message id, and a second dispatch fenced by its claim), or the instance that failed for
/// good becomes a dead letter.
async fn hand_on_after_loss(
    client: &AxClient,
    node: &NodeId,
    record: &ax_bus::InstanceRecord,
) -> Result<(), ActorError> {
    let queued = record.state == State::Running && record.tag == Tag::Queued;
    let failed = record.state == State::Failed && record.tag == Tag::WorkerLost;
    if !queued && !failed {
        return Ok(());
    }
    let Some((job, _)) = client.job(&record.job).await? else {
        return Ok(());
    };
    let work = WorkItem::for_attempt(record, job.spec);
    if failed {
        if work.shard.is_some() {
            return Ok(());
        }
        return publish::failed_for_good(client, node, &work, record.tag, &record.message).await;
    }
    publish::to_stream_acked(
        client,
        client.subjects().ready_for(&work),
        &msg_id::ready(&work.trace_id),
        &work,
    )
    .await
}

/// Ends attempt `trace` of `instance_id` `cancelled` (tag `job_deleted`) because its job is
/// gone: nothing could run it. Its event goes out; a repeat finds it ended and does nothing.
pub(crate) async fn cancel_for_deleted_job(
    client: &AxClient,
    instance_id: &InstanceId,
    trace: &TraceId,
    why: &str,
) -> Result<(), ActorError> {
    let cancelled = client
        .update_instance(instance_id, |r| {
            r.ended_early(trace, State::Cancelled, Tag::JobDeleted, why)
        })
        .await?;
    if let Updated::Written(record, _) = cancelled {
        publish::event(client, &record).await;
    }
    Ok(())
}

/// Moves an instance from `waiting_retry` (attempt `from_trace`) to its next attempt and sends
/// that attempt to the Router. Idempotent: once done, the transition is refused and nothing
/// is sent again.
pub(crate) async fn run_retry(
    client: &AxClient,
    instance_id: &InstanceId,
    from_trace: &TraceId,
) -> Result<(), ActorError> {
    let new_trace = TraceId::random();
    let record = match client
        .update_instance(instance_id, |r| r.retried(from_trace, &new_trace))
        .await?
    {
        Updated::Written(record, _) => *record,
        Updated::Refused(_) | Updated::Missing => return Ok(()),
    };
    crate::metrics::metrics().retries.inc();
    let Some((job, _)) = client.job(&record.job).await? else {
        let why = "the job was deleted before its retry";
        return cancel_for_deleted_job(client, instance_id, &new_trace, why).await;
    };
    let work = WorkItem::for_attempt(&record, job.spec);
    publish::to_stream_acked(
        client,
        client.subjects().ready_for(&work),
        &msg_id::ready(&work.trace_id),
        &work,
    )
    .await?;
    publish::event(client, &record).await;
    Ok(())
}
