//! `ax.control.replay` (`ax dlq replay`): a dead letter submitted again, by a Scheduler so
//! that the caller's rights are checked where it happens.
//!
//! One that belongs to an instance (retries exhausted, a dispatch delivered too often) is
//! replayed as a re-run of that instance — a new attempt with its original params, so its
//! cancelled downstream runs again too — and only while the instance is still at the attempt
//! that died. Any other message is put back on its subject as it came. An undecodable one is
//! not replayed: it would die the same way. The letter is removed once its replay is stored;
//! the replay is audited like any command.

use ax_bus::dead_letter::{self, DeadLetter};
use ax_bus::ids::InstanceId;
use ax_bus::messages::typed::Planned;
use ax_bus::messages::{DlqReplay, ReplayRequest, RerunRequest};
use ax_bus::AxClient;

use super::{rerun, CommandError};

/// Replays dead letter `request.id`.
pub(crate) async fn replay(
    client: &AxClient,
    request: &ReplayRequest,
) -> Result<Planned, CommandError> {
    let id = request.id;
    let not_found = || {
        CommandError::refused(format!(
            "dead letter {id}: no such dead letter (ax dlq list shows them)"
        ))
    };
    // Stream sequences start at 1; the server refuses to look up 0.
    if id == 0 {
        return Err(not_found());
    }
    let stored = client.dead_letter(id).await?.ok_or_else(not_found)?;
    let letter = DeadLetter::from_stored(&stored);
    if letter.kind == dead_letter::UNDECODABLE {
        return Err(CommandError::refused(format!(
            "dead letter {id}: undecodable ({}); replaying it would fail the same way — fix \
             what published it on {} and publish it again",
            letter.reason, letter.subject
        )));
    }
    let (action, plan) = match (&letter.instance, &letter.trace) {
        (Some(instance), Some(trace)) => {
            let plan = rerun_dead(client, request, instance, trace).await?;
            ("rerun", plan)
        }
        _ => {
            if letter.subject.is_empty() {
                return Err(CommandError::refused(format!(
                    "dead letter {id}: it does not say which subject it came from"
                )));
            }
            client
                .republish_dead_letter(id, &letter.subject, &stored)
                .await?;
            ("republished", Vec::new())
        }
    };
    client.remove_dead_letter(id).await?;
    let message = match action {
        "rerun" => format!(
            "dead letter {id}: {} runs again",
            letter.instance.as_deref().unwrap_or_default()
        ),
        _ => format!("dead letter {id}: published again on {}", letter.subject),
    };
    let detail = serde_json::to_value(DlqReplay {
        letter,
        action: action.to_string(),
    })
    .unwrap_or_default();
    Ok(Planned {
        message,
        plan,
        detail,
        ..Planned::default()
    })
}

async fn rerun_dead(
    client: &AxClient,
    request: &ReplayRequest,
    instance: &str,
    trace: &str,
) -> Result<Vec<ax_bus::messages::PlanStep>, CommandError> {
    let id = request.id;
    let instance = InstanceId::parse(instance)
        .map_err(|e| CommandError::refused(format!("dead letter {id}: {e}")))?;
    let Some((record, _)) = client.instance(&instance).await? else {
        return Err(CommandError::refused(format!(
            "dead letter {id}: instance {instance} no longer exists"
        )));
    };
    if record.trace_id != trace || !record.state.is_final() {
        return Err(CommandError::refused(format!(
            "dead letter {id}: instance {instance} has moved on since (attempt {}, {}); \
             nothing replayed",
            record.attempt, record.state
        )));
    }
    let rerun = RerunRequest {
        instance: Some(instance),
        failed_only: true,
        requested_by: format!("{} (ax dlq replay {id})", request.requested_by),
        ..RerunRequest::default()
    };
    let plan = rerun::rerun(client, &rerun).await?;
    if !plan.iter().any(|s| s.will_run) {
        return Err(CommandError::refused(format!(
            "dead letter {id}: nothing started again; it is kept"
        )));
    }
    Ok(plan)
}
