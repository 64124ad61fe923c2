//! Recording what a control command did on `ax.audit.<action>` ([`ax_bus::auth::audit`]).
//!
//! The record is written before the command is acknowledged, under a message id made of the
//! command's stream sequence: a command redelivered after a crash is recorded once however
//! often it is carried out, and one that could not be recorded is not acknowledged.

use async_nats::jetstream;

use ax_bus::auth::audit::{AuditRecord, Outcome};
use ax_bus::auth::Via;
use ax_bus::messages::commands::{Command, Request};
use ax_bus::messages::{ApprovalRequest, AuthRequest, ControlReply};
use ax_bus::{codec, spec};

use super::caller::Caller;
use super::{Desk, Received};
use crate::jetstream::publish;
use crate::ActorError;

/// The action a command is recorded as: the command, or for `auth` and `approval` the
/// operation (`token.create`, `approval.approve`, …); `None` for what changes nothing and is
/// not recorded (listings). A request that does not decode is recorded under its command
/// (`token`, `approval` for those two), an unknown command under the name it came with.
pub(crate) fn action_of(received: &Received) -> Option<String> {
    let request = received.request.as_ref().ok();
    Some(match (received.kind, request) {
        (Some(Command::Auth), Some(Request::Auth(auth))) => match auth {
            AuthRequest::List => return None,
            AuthRequest::Bootstrap { .. } => "token.bootstrap".into(),
            AuthRequest::Create { .. } => "token.create".into(),
            AuthRequest::Revoke { .. } => "token.revoke".into(),
        },
        (Some(Command::Auth), _) => "token".into(),
        (Some(Command::Approval), Some(Request::Approval(approval))) => match approval {
            ApprovalRequest::List => return None,
            ApprovalRequest::Approve { .. } => "approval.approve".into(),
            ApprovalRequest::Reject { .. } => "approval.reject".into(),
        },
        (Some(Command::Approval), _) => "approval".into(),
        _ => received.name().to_string(),
    })
}

/// The payload of a command whose request does not decode, as JSON if it is any, for the
/// caller's claim and the audit (`null` when it is none; the command is refused with the
/// reason).
pub(crate) fn decoded(message: &jetstream::Message) -> serde_json::Value {
    codec::decode_by_header(message.headers.as_ref(), &message.payload)
        .unwrap_or(serde_json::Value::Null)
}

/// What was asked, as the audit keeps it: the request without secrets (a token's hash) and
/// without job definitions (an apply is recorded by the names it applied; the registry's
/// history keeps the definitions).
pub(crate) fn request_of(
    kind: Option<Command>,
    mut request: serde_json::Value,
) -> serde_json::Value {
    if let Some(map) = request.as_object_mut() {
        map.remove("hash");
        if kind == Some(Command::Apply) {
            let mut names: Vec<serde_json::Value> = map
                .get("jobs")
                .and_then(|jobs| jobs.as_array())
                .into_iter()
                .flatten()
                .filter_map(|doc| doc.pointer("/job/name").cloned())
                .collect();
            if let Some(serde_json::Value::String(text)) = map.remove("yaml") {
                let parsed =
                    spec::yaml::parse_str(super::jobs::YAML_SOURCE, &text).unwrap_or_default();
                names.extend(
                    parsed
                        .into_iter()
                        .map(|job| job.doc.job.name.to_string().into()),
                );
            }
            map.insert("jobs".into(), serde_json::Value::Array(names));
        }
    }
    request
}

/// The record of one decided command.
pub(crate) fn record(
    desk: &Desk,
    caller: &Caller,
    action: String,
    request: serde_json::Value,
    reply: &ControlReply,
) -> AuditRecord {
    let outcome = if reply.denied {
        Outcome::Denied
    } else if !reply.ok {
        Outcome::Refused
    } else if reply
        .approval
        .as_ref()
        .is_some_and(|a| a.state == ax_bus::auth::approval::ApprovalState::Pending)
    {
        Outcome::Pending
    } else {
        Outcome::Done
    };
    let dry_run = request
        .get("dry_run")
        .and_then(|d| d.as_bool())
        .unwrap_or(false);
    let detail = match (reply.plan.is_empty(), &reply.detail) {
        (true, detail) => detail.clone(),
        (false, serde_json::Value::Null) => serde_json::json!({ "plan": reply.plan }),
        (false, detail) => serde_json::json!({ "plan": reply.plan, "detail": detail }),
    };
    AuditRecord {
        action,
        actor: caller.principal.name.clone(),
        role: caller.principal.role,
        verified: caller.principal.verified,
        via: caller.via,
        request,
        outcome,
        message: if reply.ok {
            reply.message.clone()
        } else {
            reply.errors.join("; ")
        },
        approval: reply.approval.as_ref().map(|a| a.id.clone()),
        approved_by: reply.approval.as_ref().and_then(|a| a.decided_by.clone()),
        dry_run,
        detail,
        at: ax_bus::time::now(),
        node: desk.node.clone(),
    }
}

/// Publishes `record`, once per (command, action): `key` is the command's stream sequence. A
/// slow or failed ack is tried again (the message id makes a repeat harmless) before giving up:
/// a command not acknowledged for its audit comes back later, behind the commands sent after it.
pub(crate) async fn publish(desk: &Desk, key: u64, record: &AuditRecord) -> Result<(), ActorError> {
    let client = &desk.client;
    let msg_id = if key == 0 {
        ax_bus::msg_id::audit(&record.action)
    } else {
        format!("audit:{key}:{}", record.action)
    };
    let subject = client.subjects().audit(&record.action);
    let mut pause = std::time::Duration::from_millis(250);
    for _ in 1..PUBLISH_TRIES {
        match publish::to_stream_acked(client, subject.clone(), &msg_id, record).await {
            Ok(()) => return Ok(()),
            Err(e) => {
                tracing::debug!(error = %e, retry_in = ?pause, "audit record not stored yet");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
        }
    }
    publish::to_stream_acked(client, subject, &msg_id, record).await
}

/// How often an audit record is tried before its command is handed back for redelivery.
const PUBLISH_TRIES: usize = 4;

/// Records an action of ax's own (an approval's expiry, the backlog control), not a command's.
pub(crate) async fn publish_system(
    desk: &Desk,
    action: &str,
    request: serde_json::Value,
    message: String,
    approval: Option<ax_bus::ids::ApprovalId>,
) -> Result<(), ActorError> {
    let record = AuditRecord {
        action: action.to_string(),
        actor: "ax".into(),
        role: ax_bus::auth::Role::Admin,
        verified: false,
        via: Via::System,
        request,
        outcome: Outcome::Done,
        message,
        approval,
        approved_by: None,
        dry_run: false,
        detail: serde_json::Value::Null,
        at: ax_bus::time::now(),
        node: desk.node.clone(),
    };
    publish(desk, 0, &record).await
}
