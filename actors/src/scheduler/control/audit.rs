//! Recording what a control command did on `ax.audit.<action>` ([`ax_bus::auth::audit`]).
//!
//! The record is written before the command is acknowledged, under a message id made of the
//! command's stream sequence: a command redelivered after a crash is recorded once however
//! often it is carried out, and one that could not be recorded is not acknowledged.

use async_nats::jetstream;

use ax_bus::auth::audit::{AuditRecord, Outcome};
use ax_bus::auth::Via;
use ax_bus::ids::NodeId;
use ax_bus::messages::commands::{Command, Request};
use ax_bus::messages::{ApprovalRequest, AuthRequest, ControlReply};
use ax_bus::{codec, spec};

use super::caller::Caller;
use crate::scheduler::store::AuditLog;
use crate::ActorError;

/// The action a command is recorded as: the command, or for `auth` and `approval` the
/// operation (`token.create`, `approval.approve`, …); `None` for what changes nothing and is
/// not recorded (listings). A request that does not decode is recorded under its command
/// (`token`, `approval` for those two), an unknown command under the name it came with.
pub(crate) fn action_of(
    kind: Option<Command>,
    request: Option<&Request>,
    name: &str,
) -> Option<String> {
    Some(match (kind, request) {
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
        (Some(Command::Instance), _) => return None,
        _ => name.to_string(),
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
    node: &ax_bus::ids::NodeId,
    (caller, namespaces): (&Caller, Vec<String>),
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
        role: caller
            .principal
            .highest()
            .unwrap_or(ax_bus::auth::Role::Viewer),
        verified: caller.principal.verified,
        via: caller.via,
        namespaces,
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
        node: node.clone(),
    }
}

/// Records an action of ax's own (an approval's expiry, the backlog control), not a command's.
pub(crate) async fn publish_system(
    log: &impl AuditLog,
    node: &NodeId,
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
        namespaces: Vec::new(),
        request,
        outcome: Outcome::Done,
        message,
        approval,
        approved_by: None,
        dry_run: false,
        detail: serde_json::Value::Null,
        at: ax_bus::time::now(),
        node: node.clone(),
    };
    log.audit(0, &record).await
}

#[cfg(test)]
mod tests {
    use ax_bus::auth::approval::ApprovalState;
    use ax_bus::auth::Principal;
    use ax_bus::messages::commands::Request;
    use ax_bus::messages::{ApprovalRequest, AuthRequest, ControlReply};

    use super::*;

    fn decoded(kind: Command, json: serde_json::Value) -> Request {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Content-Type", "application/json");
        Request::decode(kind, Some(&headers), json.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn an_action_is_its_command_or_its_operation_and_a_listing_none() {
        let pause = decoded(Command::Pause, serde_json::json!({"name": "etl"}));
        assert_eq!(
            action_of(Some(Command::Pause), Some(&pause), "pause").as_deref(),
            Some("pause")
        );
        let revoke = Request::Auth(AuthRequest::Revoke {
            name: "ops".parse().unwrap(),
        });
        assert_eq!(
            action_of(Some(Command::Auth), Some(&revoke), "auth").as_deref(),
            Some("token.revoke")
        );
        let list = Request::Approval(ApprovalRequest::List);
        assert_eq!(
            action_of(Some(Command::Approval), Some(&list), "approval"),
            None
        );
        // A request that does not decode is still recorded, under its command.
        assert_eq!(
            action_of(Some(Command::Auth), None, "auth").as_deref(),
            Some("token")
        );
        assert_eq!(action_of(None, None, "reboot").as_deref(), Some("reboot"));
    }

    #[test]
    fn the_audit_keeps_no_secret_and_an_apply_by_the_names_it_applied() {
        let token =
            serde_json::json!({"op": "create", "name": "ops", "role": "operator", "hash": "ab12"});
        let kept = request_of(Some(Command::Auth), token);
        assert!(kept.get("hash").is_none(), "{kept}");
        assert_eq!(kept["name"], "ops");
        let apply = serde_json::json!({
            "jobs": [{"version": "v1", "job": {"name": "etl", "exec": {"type": "noop"}}}],
            "yaml": "version: v1\njob:\n  name: report\n  exec: { type: noop }\n",
        });
        let kept = request_of(Some(Command::Apply), apply);
        assert_eq!(kept["jobs"], serde_json::json!(["etl", "report"]));
        assert!(kept.get("yaml").is_none(), "{kept}");
    }

    #[test]
    fn the_outcome_says_done_refused_denied_or_pending_and_a_dry_run_is_marked() {
        let node: ax_bus::ids::NodeId = "n1".parse().unwrap();
        let caller = super::super::caller::Caller {
            principal: Principal::unverified("ops@host"),
            via: Via::Cli,
        };
        let outcome = |reply: ControlReply, request: serde_json::Value| {
            record(
                &node,
                (&caller, Vec::new()),
                "rerun".into(),
                request,
                &reply,
            )
        };
        let done = outcome(
            ControlReply {
                ok: true,
                message: "1 started".into(),
                ..ControlReply::default()
            },
            serde_json::json!({"dry_run": true}),
        );
        assert_eq!((done.outcome, done.dry_run), (Outcome::Done, true));
        assert_eq!(
            (done.actor.as_str(), done.message.as_str()),
            ("ops@host", "1 started")
        );
        let refused = outcome(
            ControlReply::refused(vec!["biz_date: no".into()]),
            serde_json::Value::Null,
        );
        assert_eq!(
            (refused.outcome, refused.message.as_str()),
            (Outcome::Refused, "biz_date: no")
        );
        let denied = outcome(
            ControlReply {
                denied: true,
                ..ControlReply::refused(vec!["denied: no token".into()])
            },
            serde_json::Value::Null,
        );
        assert_eq!(denied.outcome, Outcome::Denied);
        let mut pending = ControlReply {
            ok: true,
            ..ControlReply::default()
        };
        pending.approval = Some(ax_bus::auth::approval::Approval {
            id: ax_bus::ids::ApprovalId::random(),
            request: Default::default(),
            plan: Vec::new(),
            requested_by: caller.principal.clone(),
            via: Via::Cli,
            created_at: ax_bus::time::now(),
            expires_at: ax_bus::time::now(),
            state: ApprovalState::Pending,
            decided_by: None,
            decided_at: None,
            reason: None,
            taken_by_command: None,
        });
        let pending = outcome(pending, serde_json::Value::Null);
        assert_eq!(pending.outcome, Outcome::Pending);
        assert!(pending.approval.is_some());
    }
}
