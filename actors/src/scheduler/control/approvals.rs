//! Two-person approval of risky re-runs ([`ax_bus::auth::approval`]), and `ax.control.approval`.
//!
//! With auth on, a re-run that forces succeeded downstream instances or takes a whole business
//! date is carried out at once only for an admin (recorded as self-approved), unless `[auth]
//! require_second_admin` — then, as for an operator, it becomes a pending approval holding its
//! dry-run plan. Approving it plans again, refuses a changed plan, takes the approval by
//! compare-and-swap and runs the re-run; the audit gets the approval and a `rerun` record whose
//! actor is the requester and `approved_by` the approver.

use async_nats::jetstream::kv::{CreateErrorKind, UpdateErrorKind};
use chrono::Duration;

use ax_bus::auth::approval::{Approval, ApprovalState};
use ax_bus::auth::{self, Role};
use ax_bus::codec;
use ax_bus::error::NatsError;
use ax_bus::ids::ApprovalId;
use ax_bus::messages::typed::{Approvals, Planned};
use ax_bus::messages::{ApprovalRequest, PlanStep, RerunRequest};

use super::caller::Caller;
use super::{audit, rerun, CommandError, Desk};
use crate::ActorError;

/// How long an approval waits for a decision unless the node says otherwise.
pub(crate) const DEFAULT_TTL: std::time::Duration = std::time::Duration::from_secs(3600);

/// A re-run as `caller` asked for it: carried out, or waiting for approval.
pub(crate) async fn rerun(
    desk: &Desk,
    caller: &Caller,
    request: RerunRequest,
) -> Result<Planned, CommandError> {
    let risky = desk.auth.enabled && auth::needs_approval(&request);
    let self_approved = caller.principal.role == Role::Admin && !desk.auth.require_second_admin;
    if !risky || self_approved {
        let plan = rerun::rerun(&desk.client, &request).await?;
        return Ok(Planned {
            plan,
            message: if risky {
                format!("self-approved by admin {}", caller.principal.name)
            } else {
                String::new()
            },
            ..Planned::default()
        });
    }
    let plan = rerun::rerun(&desk.client, &dry(&request)).await?;
    let now = ax_bus::time::now();
    let ttl = Duration::from_std(desk.auth.approval_ttl).unwrap_or(Duration::hours(1));
    let mut approval = Approval {
        id: ApprovalId::random(),
        request,
        plan: plan.clone(),
        requested_by: caller.principal.clone(),
        via: caller.via,
        created_at: now,
        expires_at: now + ttl,
        state: ApprovalState::Pending,
        decided_by: None,
        decided_at: None,
        reason: None,
        taken_by_command: None,
    };
    loop {
        match desk
            .client
            .approvals
            .create(approval.id.as_str(), codec::encode(&approval)?)
            .await
        {
            Ok(_) => break,
            // 64 random bits drawn twice: draw again.
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {
                approval.id = ApprovalId::random();
            }
            Err(e) => return Err(ActorError::from(NatsError::new("store approval", e)).into()),
        }
    }
    Ok(Planned {
        message: format!(
            "waiting for approval {id}: another admin approves it with `ax approvals approve {id}` \
             before {}",
            ax_bus::time::rfc3339(approval.expires_at),
            id = approval.id
        ),
        plan,
        approval: Some(approval),
        ..Planned::default()
    })
}

fn dry(request: &RerunRequest) -> RerunRequest {
    RerunRequest {
        dry_run: true,
        ..request.clone()
    }
}

/// Carries out an `approval` command; `sequence` is the command's stream sequence.
pub(crate) async fn decide(
    desk: &Desk,
    caller: &Caller,
    request: ApprovalRequest,
    sequence: u64,
) -> Result<Approvals, CommandError> {
    if !matches!(request, ApprovalRequest::List)
        && desk.auth.enabled
        && caller.principal.role < Role::Admin
    {
        return Err(CommandError::Denied(format!(
            "deciding an approval needs the admin role; token `{}` is {}",
            caller.principal.name, caller.principal.role
        )));
    }
    match request {
        ApprovalRequest::List => {
            let mut approvals = desk.client.approvals().await?;
            for approval in &mut approvals {
                if approval.state == ApprovalState::Pending
                    && !approval.pending_at(ax_bus::time::now())
                {
                    if let Some((current, revision)) = desk.client.approval(&approval.id).await? {
                        expire(desk, current, revision).await?;
                    }
                    approval.state = ApprovalState::Expired;
                }
            }
            approvals.sort_by_key(|a| a.state != ApprovalState::Pending);
            Ok(Approvals {
                message: format!("{} approvals", approvals.len()),
                approvals,
                ..Approvals::default()
            })
        }
        ApprovalRequest::Approve { id } => approve(desk, caller, &id, sequence).await,
        ApprovalRequest::Reject { id, reason } => reject(desk, caller, &id, &reason).await,
    }
}

/// Marks a pending approval past its time expired (once, whoever sees it first) and audits it.
async fn expire(desk: &Desk, mut approval: Approval, revision: u64) -> Result<(), CommandError> {
    if approval.state != ApprovalState::Pending {
        return Ok(());
    }
    approval.state = ApprovalState::Expired;
    if write(desk, &approval, revision).await? {
        audit::publish_system(
            desk,
            "approval.expire",
            serde_json::json!({ "id": approval.id }),
            format!(
                "approval {} for {} expired undecided",
                approval.id, approval.requested_by.name
            ),
            Some(approval.id.clone()),
        )
        .await?;
    }
    Ok(())
}

/// Writes `approval` over `revision`; false when someone else wrote it first.
async fn write(desk: &Desk, approval: &Approval, revision: u64) -> Result<bool, CommandError> {
    match desk
        .client
        .approvals
        .update(approval.id.as_str(), codec::encode(approval)?, revision)
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Ok(false),
        Err(e) => Err(ActorError::from(NatsError::new(
            format!("update approval {}", approval.id),
            e,
        ))
        .into()),
    }
}

fn no_such(id: &ApprovalId) -> CommandError {
    CommandError::refused(format!("no approval `{id}` (ax approvals list shows them)"))
}

fn decided(approval: &Approval) -> CommandError {
    CommandError::refused(format!(
        "approval {} is {} already{}",
        approval.id,
        approval.state.as_str(),
        approval
            .decided_by
            .as_ref()
            .map(|by| format!(" (by {by})"))
            .unwrap_or_default()
    ))
}

async fn approve(
    desk: &Desk,
    caller: &Caller,
    id: &ApprovalId,
    sequence: u64,
) -> Result<Approvals, CommandError> {
    let now = ax_bus::time::now();
    loop {
        let Some((mut approval, revision)) = desk.client.approval(id).await? else {
            return Err(no_such(id));
        };
        match approval.state {
            // This very command took it and died before finishing: finish.
            ApprovalState::Approved if approval.taken_by_command == Some(sequence) => {
                return carry_out(desk, approval, revision, sequence).await
            }
            ApprovalState::Pending if !approval.pending_at(now) => {
                expire(desk, approval.clone(), revision).await?;
                return Err(CommandError::refused(format!(
                    "approval {id} expired at {}; ask again",
                    ax_bus::time::rfc3339(approval.expires_at)
                )));
            }
            ApprovalState::Pending => {}
            _ => return Err(decided(&approval)),
        }
        if approval.requested_by.name == caller.principal.name {
            return Err(CommandError::refused(format!(
                "approval {id}: {} asked for it; another admin must approve it",
                caller.principal.name
            )));
        }
        let plan = rerun::rerun(&desk.client, &dry(&approval.request)).await?;
        if plan != approval.plan {
            approval.state = ApprovalState::Rejected;
            approval.decided_by = Some(caller.principal.name.clone());
            approval.decided_at = Some(now);
            approval.reason = Some("the plan changed before it was approved".into());
            if !write(desk, &approval, revision).await? {
                continue;
            }
            return Err(CommandError::refused(format!(
                "approval {id}: the plan changed since it was asked for ({}); nothing was run — \
                 ask again",
                changes(&approval.plan, &plan)
            )));
        }
        approval.state = ApprovalState::Approved;
        approval.decided_by = Some(caller.principal.name.clone());
        approval.decided_at = Some(now);
        approval.taken_by_command = Some(sequence);
        if write(desk, &approval, revision).await? {
            let revision = revision + 1;
            return carry_out(desk, approval, revision, sequence).await;
        }
    }
}

/// What differs between two plans, in a few words.
fn changes(asked: &[PlanStep], now: &[PlanStep]) -> String {
    let differing: Vec<String> = now
        .iter()
        .filter(|step| !asked.contains(step))
        .take(3)
        .map(|s| format!("{} is {}", s.instance_id, s.state))
        .collect();
    if differing.is_empty() {
        format!("{} steps then, {} now", asked.len(), now.len())
    } else {
        differing.join(", ")
    }
}

/// Runs an approved re-run, marks the approval done and records the re-run as the requester's,
/// approved by the approver.
async fn carry_out(
    desk: &Desk,
    mut approval: Approval,
    revision: u64,
    sequence: u64,
) -> Result<Approvals, CommandError> {
    let plan = rerun::rerun(&desk.client, &approval.request).await?;
    approval.state = ApprovalState::Done;
    // Best effort: `approved` already says it was taken; `done` says it finished.
    let _ = write(desk, &approval, revision).await;
    let reply = Approvals {
        message: format!(
            "approval {}: re-run asked by {} approved by {} and carried out",
            approval.id,
            approval.requested_by.name,
            approval.decided_by.as_deref().unwrap_or_default()
        ),
        plan,
        approval: Some(approval.clone()),
        ..Approvals::default()
    };
    let requester = Caller {
        principal: approval.requested_by.clone(),
        via: approval.via,
    };
    let request = serde_json::to_value(&approval.request).unwrap_or_default();
    let answered = reply.clone().into();
    let record = audit::record(&desk.node, &requester, "rerun".into(), request, &answered);
    audit::publish(desk, sequence, &record).await?;
    Ok(reply)
}

async fn reject(
    desk: &Desk,
    caller: &Caller,
    id: &ApprovalId,
    reason: &str,
) -> Result<Approvals, CommandError> {
    if reason.trim().is_empty() {
        return Err(CommandError::refused(
            "reason: a rejection needs one (it goes to the requester and the audit)",
        ));
    }
    loop {
        let Some((mut approval, revision)) = desk.client.approval(id).await? else {
            return Err(no_such(id));
        };
        if approval.state != ApprovalState::Pending {
            return Err(decided(&approval));
        }
        approval.state = ApprovalState::Rejected;
        approval.decided_by = Some(caller.principal.name.clone());
        approval.decided_at = Some(ax_bus::time::now());
        approval.reason = Some(reason.to_string());
        if write(desk, &approval, revision).await? {
            return Ok(Approvals {
                message: format!("approval {id} rejected: {reason}"),
                approval: Some(approval),
                ..Approvals::default()
            });
        }
    }
}
