//! An attempt's end, recorded: the one way an outcome becomes the instance's state, its
//! result, its alerts, its dead letter and its retry hand-off. The Reporter runs it for every
//! outcome of its outbox; the worker runs it directly when its outbox cannot take an outcome,
//! and the dead-letter keeper for a dispatch that was never settled.
//!
//! [`report`] is idempotent: the record moves with a compare-and-swap (a stale attempt is
//! refused and its result dropped, a repeat changes nothing), and the result, dead letter and
//! retry are published under message ids derived from the trace id, so JetStream drops a
//! repeat. It may therefore be run again until it succeeds.

use serde::{Deserialize, Serialize};

use ax_bus::client::Updated;
use ax_bus::instance::{AttemptEnd, State, Tag, TransitionRefused};
use ax_bus::messages::{AlertKind, ResultMessage, StoredRecord, WorkItem};
use ax_bus::msg_id;
use ax_bus::AxClient;

use crate::jetstream::publish;
use crate::ActorError;

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

/// Reports one outcome. Ok also when there is nothing left to do (stale or unknown attempt).
pub(crate) async fn report(client: &AxClient, outcome: &Outcome) -> Result<(), ActorError> {
    let (work, end) = (&outcome.work, &outcome.end);
    let retry_at = retry_at(outcome);
    let Some(state) = write_end(client, outcome, retry_at).await? else {
        return Ok(());
    };
    let next_attempt_at = retry_at.filter(|_| state == State::WaitingRetry);
    let result = ResultMessage::new(work, end, state, next_attempt_at);
    publish::to_stream_acked(
        client,
        client.subjects().result(work.job()),
        &msg_id::result(&end.trace_id),
        &result,
    )
    .await?;
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
    if end.success {
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
    let updated = client
        .update_instance_from(&work.instance_id, outcome.written.clone(), |r| {
            r.ended(end, retry_at)
        })
        .await?;
    Ok(match updated {
        Updated::Written(record, _) => {
            publish::event(client, &record).await;
            Some(record.state)
        }
        Updated::Refused(TransitionRefused::AlreadyEnded(state)) => Some(state),
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
