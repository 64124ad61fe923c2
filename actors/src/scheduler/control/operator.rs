//! An operator's hand on one instance: `cancel` a waiting one, `kill` a running one, `mark`
//! an ended or waiting one `success` or `failed` (a marked success releases its downstream).
//!
//! Both end the record with a compare-and-swap that checks, at the moment of writing, that the
//! instance is still in a state the action applies to: a cancel that races a worker starting the
//! attempt is refused ("kill it instead"), never written over an executing record. The end is
//! then told as any other (a result on `ax.result.<job>`, so the DagCoordinator cancels waiting
//! downstream instances of the same date as for a failed upstream; an event), and the action
//! goes to the audit stream with who asked, when and why. What was waiting elsewhere for the
//! instance (a delayed release, a retry, a queued dispatch) finds the record ended and drops it.

use ax_bus::client::Updated;
use ax_bus::instance::TransitionRefused;
use ax_bus::messages::commands::Command;
use ax_bus::messages::{InstanceRequest, MarkRequest};
use ax_bus::{msg_id, InstanceRecord, State, Tag};

use ax_bus::messages::typed::Done;

use super::CommandError;
use crate::scheduler::store::Instances;

/// Gives an operator's verdict: the instance ends `success` or `failed` with tag `marked`, and
/// the verdict is told as a result (a success releases the downstream waiting on it).
pub(super) async fn mark(
    store: &impl Instances,
    who: &str,
    request: MarkRequest,
) -> Result<Done, CommandError> {
    let id = &request.instance;
    if !matches!(request.state, State::Success | State::Failed) {
        return Err(CommandError::refused(format!(
            "state: an instance is marked success or failed, not {}",
            request.state
        )));
    }
    if request.reason.trim().is_empty() {
        return Err(CommandError::refused(
            "reason: a verdict needs one (it is kept in the record and the audit)",
        ));
    }
    let Some(before) = store.record(id).await? else {
        return Err(CommandError::refused(ax_bus::client::retention::missing(
            id,
        )));
    };
    let message = format!("marked {} by {who}: {}", request.state, request.reason);
    let record = match store
        .update(id, |r| r.marked(request.state, &message))
        .await?
    {
        Updated::Written(record, _) => record,
        Updated::Refused(TransitionRefused::AlreadyStarted) => {
            return Err(CommandError::refused(format!(
                "instance {id} is executing; kill it first (ax instance kill)"
            )))
        }
        Updated::Refused(_) => {
            return Err(CommandError::refused(format!(
                "instance {id} is {} already",
                request.state
            )))
        }
        Updated::Missing => {
            return Err(CommandError::refused(ax_bus::client::retention::missing(
                id,
            )))
        }
    };
    let marked = msg_id::marked(&record.trace_id, record.state.as_str());
    store.ended(&record, &marked).await?;
    answered(&before, &record)
}

/// Why `action` does not apply to `record`, if it does not.
fn refusal(action: Command, record: &InstanceRecord) -> Option<String> {
    let id = &record.instance_id;
    if record.state.is_final() {
        return Some(format!(
            "instance {id} has ended ({}); there is nothing to {action}",
            record.state
        ));
    }
    match (action, record.executing()) {
        (Command::Cancel, true) => Some(format!(
            "instance {id} is executing on {}; kill it instead (ax instance kill)",
            record.worker.as_deref().unwrap_or("a worker")
        )),
        (Command::Kill, false) => Some(format!(
            "instance {id} is not executing ({} {}); cancel it instead (ax instance cancel)",
            record.state, record.tag
        )),
        _ => None,
    }
}

/// Cancels a waiting instance (`cancel`: it ends `cancelled`, tag `operator`) or kills an
/// executing one (`kill`: its process group is stopped; it ends `failed`, tag `killed`, with no
/// retry).
pub(super) async fn act(
    store: &impl Instances,
    who: &str,
    request: InstanceRequest,
    action: Command,
) -> Result<Done, CommandError> {
    let id = &request.instance;
    let Some(before) = store.record(id).await? else {
        return Err(CommandError::refused(ax_bus::client::retention::missing(
            id,
        )));
    };
    if let Some(why) = refusal(action, &before) {
        return Err(CommandError::refused(why));
    }
    let verb = if action == Command::Kill {
        "killed"
    } else {
        "cancelled"
    };
    let message = match request.reason.as_deref().filter(|r| !r.is_empty()) {
        Some(reason) => format!("{verb} by {who}: {reason}"),
        None => format!("{verb} by {who}"),
    };
    let (state, tag) = if action == Command::Kill {
        (State::Failed, Tag::Killed)
    } else {
        (State::Cancelled, Tag::Operator)
    };
    // Checked again at the moment of writing: the record may have moved since it was read.
    let updated = store
        .update(id, |r| match refusal(action, r) {
            Some(_) if r.state.is_final() => Err(TransitionRefused::AlreadyEnded(r.state)),
            Some(_) => Err(TransitionRefused::AlreadyStarted),
            None => r.ended_early(&r.trace_id, state, tag, &message),
        })
        .await?;
    let record = match updated {
        Updated::Written(record, _) => record,
        Updated::Refused(_) => {
            let now = store.record(id).await?;
            let why = now
                .as_ref()
                .and_then(|r| refusal(action, r))
                .unwrap_or_else(|| format!("instance {id} changed meanwhile; try again"));
            return Err(CommandError::refused(why));
        }
        Updated::Missing => {
            return Err(CommandError::refused(ax_bus::client::retention::missing(
                id,
            )))
        }
    };
    if let (Command::Kill, Some(worker)) = (action, &before.worker) {
        // The worker stops the attempt's process group (dump signal, grace, SIGKILL).
        store.stop_attempt(worker, &before.trace_id).await;
    }
    store
        .ended(&record, &msg_id::result(&record.trace_id))
        .await?;
    answered(&before, &record)
}

/// The answer: what became of the instance, and (for the audit) its state before and after.
fn answered(before: &InstanceRecord, record: &InstanceRecord) -> Result<Done, CommandError> {
    Ok(Done {
        instance_id: Some(record.instance_id.clone()),
        message: record.message.clone(),
        detail: serde_json::json!({
            "before": format!("{} {}", before.state, before.tag),
            "after": format!("{} {}", record.state, record.tag),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::store::memory::Memory;

    /// A queued first attempt of job `job`.
    fn queued(job: &str) -> InstanceRecord {
        let now = ax_bus::time::now();
        InstanceRecord::first(
            &crate::test_fixtures::spec(job, None, &[]),
            now,
            "2026-12-07".into(),
            Default::default(),
            ax_bus::instance::Trigger::Manual,
            now,
        )
    }

    /// `queued(job)` executing on worker `w1`.
    fn executing(job: &str) -> InstanceRecord {
        let mut record = queued(job);
        record.tag = Tag::Executing;
        record.worker = Some("w1".parse().unwrap());
        record.started_at = Some(ax_bus::time::now());
        record
    }

    fn asked(record: &InstanceRecord, reason: &str) -> InstanceRequest {
        InstanceRequest {
            instance: record.instance_id.clone(),
            reason: Some(reason.into()),
            requested_by: "ops@host".into(),
        }
    }

    fn verdict(record: &InstanceRecord, state: State, reason: &str) -> MarkRequest {
        MarkRequest {
            instance: record.instance_id.clone(),
            state,
            reason: reason.into(),
            requested_by: "ops@host".into(),
        }
    }

    fn refused(outcome: Result<Done, CommandError>) -> String {
        match outcome {
            Err(CommandError::Refused(reasons)) => reasons.join("; "),
            other => panic!("not refused: {other:?}"),
        }
    }

    fn stored(memory: &Memory, record: &InstanceRecord) -> InstanceRecord {
        memory.records.lock().unwrap()[&record.instance_id].clone()
    }

    #[tokio::test]
    async fn a_cancel_ends_a_waiting_instance_and_tells_it() {
        let waiting = queued("etl");
        let memory = Memory::with([waiting.clone()]);
        let reply = act(
            &memory,
            "ops",
            asked(&waiting, "not today"),
            Command::Cancel,
        )
        .await
        .unwrap();
        let after = stored(&memory, &waiting);
        assert_eq!((after.state, after.tag), (State::Cancelled, Tag::Operator));
        assert_eq!(after.message, "cancelled by ops: not today");
        assert_eq!(reply.detail["before"], "running queued");
        assert_eq!(reply.detail["after"], "cancelled operator");
        assert_eq!(memory.ended.lock().unwrap().len(), 1);
        assert!(memory.stopped.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_kill_stops_an_executing_attempt_and_fails_it_without_a_retry() {
        let running = executing("etl");
        let memory = Memory::with([running.clone()]);
        act(&memory, "ops", asked(&running, "stuck"), Command::Kill)
            .await
            .unwrap();
        let after = stored(&memory, &running);
        assert_eq!((after.state, after.tag), (State::Failed, Tag::Killed));
        assert_eq!(
            memory.stopped.lock().unwrap().as_slice(),
            [("w1".to_string(), running.trace_id.clone())]
        );
        let ended = memory.ended.lock().unwrap();
        assert_eq!(ended[0].1, msg_id::result(&running.trace_id));
    }

    #[tokio::test]
    async fn cancel_and_kill_refuse_the_state_the_other_is_for_and_an_ended_instance() {
        let running = executing("a");
        let waiting = queued("b");
        let mut ended = queued("c");
        ended.state = State::Success;
        ended.tag = Tag::Completed;
        let memory = Memory::with([running.clone(), waiting.clone(), ended.clone()]);
        let why = refused(act(&memory, "ops", asked(&running, "x"), Command::Cancel).await);
        assert!(why.contains("is executing on w1; kill it instead"), "{why}");
        let why = refused(act(&memory, "ops", asked(&waiting, "x"), Command::Kill).await);
        assert!(
            why.contains("is not executing (running queued); cancel it"),
            "{why}"
        );
        let why = refused(act(&memory, "ops", asked(&ended, "x"), Command::Kill).await);
        assert!(
            why.contains("has ended (success); there is nothing to kill"),
            "{why}"
        );
        // Nothing moved, nothing told, nothing stopped.
        assert_eq!(stored(&memory, &running), running);
        assert_eq!(stored(&memory, &waiting), waiting);
        assert!(memory.ended.lock().unwrap().is_empty());
        assert!(memory.stopped.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_unknown_instance_is_refused_by_its_id() {
        let nowhere = queued("gone");
        let memory = Memory::default();
        let why = refused(act(&memory, "ops", asked(&nowhere, "x"), Command::Cancel).await);
        assert!(why.contains(nowhere.instance_id.as_str()), "{why}");
        let why = refused(mark(&memory, "ops", verdict(&nowhere, State::Success, "x")).await);
        assert!(why.contains(nowhere.instance_id.as_str()), "{why}");
    }

    #[tokio::test]
    async fn a_mark_ends_the_instance_in_its_verdict_and_tells_it_as_marked() {
        let mut failed = queued("etl");
        failed.state = State::Failed;
        failed.tag = Tag::ExitCode;
        let memory = Memory::with([failed.clone()]);
        mark(
            &memory,
            "ops",
            verdict(&failed, State::Success, "fixed by hand"),
        )
        .await
        .unwrap();
        let after = stored(&memory, &failed);
        assert_eq!((after.state, after.tag), (State::Success, Tag::Marked));
        assert_eq!(after.message, "marked success by ops: fixed by hand");
        let ended = memory.ended.lock().unwrap();
        assert_eq!(ended[0].1, msg_id::marked(&failed.trace_id, "success"));
    }

    #[tokio::test]
    async fn a_mark_is_refused_without_a_reason_for_no_verdict_on_an_executing_or_same_state() {
        let running = executing("a");
        let mut done = queued("b");
        done.state = State::Success;
        done.tag = Tag::Completed;
        let memory = Memory::with([running.clone(), done.clone()]);
        let why = refused(mark(&memory, "ops", verdict(&done, State::Failed, " ")).await);
        assert!(why.starts_with("reason: a verdict needs one"), "{why}");
        let why = refused(mark(&memory, "ops", verdict(&done, State::Running, "x")).await);
        assert!(
            why.starts_with("state: an instance is marked success or failed"),
            "{why}"
        );
        let why = refused(mark(&memory, "ops", verdict(&running, State::Failed, "x")).await);
        assert!(why.contains("is executing; kill it first"), "{why}");
        let why = refused(mark(&memory, "ops", verdict(&done, State::Success, "x")).await);
        assert!(why.contains("is success already"), "{why}");
        assert!(memory.ended.lock().unwrap().is_empty());
    }
}
