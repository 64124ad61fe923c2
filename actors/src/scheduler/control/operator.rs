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
use ax_bus::{msg_id, AxClient, InstanceRecord, State, Tag};

use super::{CommandError, ControlReply};
use crate::jetstream::publish;

/// Gives an operator's verdict: the instance ends `success` or `failed` with tag `marked`, and
/// the verdict is told as a result (a success releases the downstream waiting on it).
pub(super) async fn mark(
    client: &AxClient,
    who: &str,
    request: MarkRequest,
) -> Result<ControlReply, CommandError> {
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
    let Some((before, _)) = client.instance(id).await? else {
        return Err(CommandError::refused(ax_bus::client::retention::missing(
            id,
        )));
    };
    let message = format!("marked {} by {who}: {}", request.state, request.reason);
    let record = match client
        .update_instance(id, |r| r.marked(request.state, &message))
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
    publish::ended(client, &record, &marked).await?;
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
    client: &AxClient,
    who: &str,
    request: InstanceRequest,
    action: Command,
) -> Result<ControlReply, CommandError> {
    let id = &request.instance;
    let Some((before, _)) = client.instance(id).await? else {
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
    let updated = client
        .update_instance(id, |r| match refusal(action, r) {
            Some(_) if r.state.is_final() => Err(TransitionRefused::AlreadyEnded(r.state)),
            Some(_) => Err(TransitionRefused::AlreadyStarted),
            None => r.ended_early(&r.trace_id, state, tag, &message),
        })
        .await?;
    let record = match updated {
        Updated::Written(record, _) => record,
        Updated::Refused(_) => {
            let now = client.instance(id).await?.map(|(r, _)| r);
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
        publish::stop_attempt(client, worker, &before.trace_id).await;
    }
    publish::ended(client, &record, &msg_id::result(&record.trace_id)).await?;
    answered(&before, &record)
}

/// The answer: what became of the instance, and (for the audit) its state before and after.
fn answered(
    before: &InstanceRecord,
    record: &InstanceRecord,
) -> Result<ControlReply, CommandError> {
    Ok(ControlReply {
        ok: true,
        instance_id: Some(record.instance_id.clone()),
        message: record.message.clone(),
        detail: serde_json::json!({
            "before": format!("{} {}", before.state, before.tag),
            "after": format!("{} {}", record.state, record.tag),
        }),
        ..ControlReply::default()
    })
}
