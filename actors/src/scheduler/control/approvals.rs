//! Two-person approval of risky re-runs ([`ax_bus::auth::approval`]), and `ax.control.approval`.
//!
//! With auth on, a re-run that forces succeeded downstream instances or takes a whole business
//! date is carried out at once only for an admin (recorded as self-approved), unless `[auth]
//! require_second_admin` — then, as for an operator, it becomes a pending approval holding its
//! dry-run plan. Approving it plans again, refuses a changed plan, takes the approval by
//! compare-and-swap and runs the re-run; the audit gets the approval and a `rerun` record whose
//! actor is the requester and `approved_by` the approver.

use chrono::Duration;

use ax_bus::auth::approval::{Approval, ApprovalState};
use ax_bus::auth::{self, Role};
use ax_bus::ids::{ApprovalId, NodeId};
use ax_bus::messages::commands::Command;
use ax_bus::messages::typed::{Approvals, Planned};
use ax_bus::messages::{ApprovalRequest, PlanStep, RerunRequest};

use super::caller::Caller;
use super::{audit, rerun, AuthSettings, CommandError};
use crate::scheduler::store::{ApprovalStore, AuditLog, History, Instances, Registry};

/// What re-runs and their approvals read and write: the approvals, the audit, and what a
/// re-run plans from and starts again.
pub(crate) trait Store: ApprovalStore + AuditLog + Registry + Instances + History {}

impl<T: ApprovalStore + AuditLog + Registry + Instances + History> Store for T {}

/// What deciding re-runs and approvals needs: the store, the node's `[auth]` rules and the
/// node that records.
pub(crate) struct Clerk<'a, S> {
    pub(crate) store: &'a S,
    pub(crate) auth: AuthSettings,
    pub(crate) node: &'a NodeId,
}

/// How long an approval waits for a decision unless the node says otherwise.
pub(crate) const DEFAULT_TTL: std::time::Duration = std::time::Duration::from_secs(3600);

/// Refuses a re-run by a token of single namespaces whose plan reaches past them: a chain's
/// downstream may be another namespace's job, which nothing of this one re-runs.
async fn within_namespaces(
    clerk: &Clerk<'_, impl Store>,
    caller: &Caller,
    request: &RerunRequest,
) -> Result<(), CommandError> {
    let needed = auth::role_of(Command::Rerun);
    let plan = rerun::rerun(clerk.store, &dry(request)).await?;
    let who = &caller.principal;
    match plan
        .iter()
        .filter(|step| step.will_run)
        .find(|step| who.role_in(step.job.namespace()) < Some(needed))
    {
        Some(step) => Err(CommandError::Denied(format!(
            "the re-run reaches {} of namespace `{}`, which needs the {needed} role there; token \
             `{}` is {}; nothing was re-run",
            step.instance_id,
            step.job.namespace(),
            who.name,
            who.roles()
        ))),
        None => Ok(()),
    }
}

/// A re-run as `caller` asked for it: carried out, or waiting for approval.
pub(crate) async fn rerun(
    clerk: &Clerk<'_, impl Store>,
    caller: &Caller,
    request: RerunRequest,
) -> Result<Planned, CommandError> {
    if clerk.auth.enabled && caller.principal.role < Some(auth::role_of(Command::Rerun)) {
        within_namespaces(clerk, caller, &request).await?;
    }
    let risky = clerk.auth.enabled && auth::needs_approval(&request);
    let self_approved =
        caller.principal.role == Some(Role::Admin) && !clerk.auth.require_second_admin;
    if !risky || self_approved {
        let plan = rerun::rerun(clerk.store, &request).await?;
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
    let plan = rerun::rerun(clerk.store, &dry(&request)).await?;
    let now = ax_bus::time::now();
    let ttl = Duration::from_std(clerk.auth.approval_ttl).unwrap_or(Duration::hours(1));
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
    // 64 random bits drawn twice: draw again.
    while !clerk.store.create_approval(&approval).await? {
        approval.id = ApprovalId::random();
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

/// Refuses a caller who may not decide approval `id`: an admin of every namespace may; an
/// admin of single namespaces may decide one whose plan stays within them (a whole date's
/// re-run reaches every namespace).
async fn may_decide(
    clerk: &Clerk<'_, impl Store>,
    caller: &Caller,
    id: &ApprovalId,
) -> Result<(), CommandError> {
    let who = &caller.principal;
    if who.role >= Some(Role::Admin) {
        return Ok(());
    }
    let denied = |place: String| {
        CommandError::Denied(format!(
            "deciding an approval needs the admin role {place}; token `{}` is {}",
            who.name,
            who.roles()
        ))
    };
    if who.highest() < Some(Role::Admin) {
        return Err(denied("where its plan reaches".into()));
    }
    let Some((approval, _)) = clerk.store.approval(id).await? else {
        return Err(no_such(id));
    };
    reach(&approval, caller, Role::Admin).map_err(denied)
}

/// Whether `caller` holds `role` wherever `approval`'s plan reaches; else where it does not
/// (`in namespace `b``, `in every namespace (a whole date's re-run)`).
fn reach(approval: &Approval, caller: &Caller, role: Role) -> Result<(), String> {
    caller
        .principal
        .holds(role, approval.namespaces())
        .map_err(|place| match approval.namespaces() {
            None => format!("{place} (a whole date's re-run)"),
            Some(_) => place,
        })
}

/// Carries out an `approval` command; `sequence` is the command's stream sequence.
pub(crate) async fn decide(
    clerk: &Clerk<'_, impl Store>,
    caller: &Caller,
    request: ApprovalRequest,
    sequence: u64,
) -> Result<Approvals, CommandError> {
    let deciding = match &request {
        ApprovalRequest::List => None,
        ApprovalRequest::Approve { id } | ApprovalRequest::Reject { id, .. } => Some(id),
    };
    if let Some(id) = deciding.filter(|_| clerk.auth.enabled) {
        may_decide(clerk, caller, id).await?;
    }
    match request {
        ApprovalRequest::List => {
            let mut approvals = clerk.store.approvals().await?;
            for approval in &mut approvals {
                if approval.state == ApprovalState::Pending
                    && !approval.pending_at(ax_bus::time::now())
                {
                    if let Some((current, revision)) = clerk.store.approval(&approval.id).await? {
                        expire(clerk, current, revision).await?;
                    }
                    approval.state = ApprovalState::Expired;
                }
            }
            // A caller of single namespaces sees the approvals whose plans stay within them.
            approvals.retain(|a| !clerk.auth.enabled || reach(a, caller, Role::Viewer).is_ok());
            approvals.sort_by_key(|a| a.state != ApprovalState::Pending);
            Ok(Approvals {
                message: format!("{} approvals", approvals.len()),
                approvals,
                ..Approvals::default()
            })
        }
        ApprovalRequest::Approve { id } => approve(clerk, caller, &id, sequence).await,
        ApprovalRequest::Reject { id, reason } => reject(clerk, caller, &id, &reason).await,
    }
}

/// Marks a pending approval past its time expired (once, whoever sees it first) and audits it.
async fn expire(
    clerk: &Clerk<'_, impl Store>,
    mut approval: Approval,
    revision: u64,
) -> Result<(), CommandError> {
    if approval.state != ApprovalState::Pending {
        return Ok(());
    }
    approval.state = ApprovalState::Expired;
    if write(clerk, &approval, revision).await?.is_some() {
        audit::publish_system(
            clerk.store,
            clerk.node,
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

/// Writes `approval` over `revision`: its new revision, or none when someone else wrote it
/// first.
async fn write(
    clerk: &Clerk<'_, impl Store>,
    approval: &Approval,
    revision: u64,
) -> Result<Option<u64>, CommandError> {
    Ok(clerk.store.swap_approval(approval, revision).await?)
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
    clerk: &Clerk<'_, impl Store>,
    caller: &Caller,
    id: &ApprovalId,
    sequence: u64,
) -> Result<Approvals, CommandError> {
    let now = ax_bus::time::now();
    loop {
        let Some((mut approval, revision)) = clerk.store.approval(id).await? else {
            return Err(no_such(id));
        };
        match approval.state {
            // This very command took it and died before finishing: finish.
            ApprovalState::Approved if approval.taken_by_command == Some(sequence) => {
                return carry_out(clerk, approval, revision, sequence).await
            }
            ApprovalState::Pending if !approval.pending_at(now) => {
                expire(clerk, approval.clone(), revision).await?;
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
        let plan = rerun::rerun(clerk.store, &dry(&approval.request)).await?;
        if plan != approval.plan {
            approval.state = ApprovalState::Rejected;
            approval.decided_by = Some(caller.principal.name.clone());
            approval.decided_at = Some(now);
            approval.reason = Some("the plan changed before it was approved".into());
            if write(clerk, &approval, revision).await?.is_none() {
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
        // Taken: the approval's new revision, for marking it done.
        if let Some(revision) = write(clerk, &approval, revision).await? {
            return carry_out(clerk, approval, revision, sequence).await;
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
    clerk: &Clerk<'_, impl Store>,
    mut approval: Approval,
    revision: u64,
    sequence: u64,
) -> Result<Approvals, CommandError> {
    let plan = rerun::rerun(clerk.store, &approval.request).await?;
    approval.state = ApprovalState::Done;
    // Best effort: `approved` already says it was taken; `done` says it finished.
    let _ = write(clerk, &approval, revision).await;
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
    let answered: ax_bus::messages::ControlReply = reply.clone().into();
    let namespaces: std::collections::BTreeSet<String> = answered
        .plan
        .iter()
        .map(|step| step.job.namespace().to_string())
        .collect();
    let by = (&requester, namespaces.into_iter().collect());
    let record = audit::record(clerk.node, by, "rerun".into(), request, &answered);
    clerk.store.audit(sequence, &record).await?;
    Ok(reply)
}

async fn reject(
    clerk: &Clerk<'_, impl Store>,
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
        let Some((mut approval, revision)) = clerk.store.approval(id).await? else {
            return Err(no_such(id));
        };
        if approval.state != ApprovalState::Pending {
            return Err(decided(&approval));
        }
        approval.state = ApprovalState::Rejected;
        approval.decided_by = Some(caller.principal.name.clone());
        approval.decided_at = Some(ax_bus::time::now());
        approval.reason = Some(reason.to_string());
        if write(clerk, &approval, revision).await?.is_some() {
            return Ok(Approvals {
                message: format!("approval {id} rejected: {reason}"),
                approval: Some(approval),
                ..Approvals::default()
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use ax_bus::auth::{Principal, Via};
    use ax_bus::ids::TokenName;
    use ax_bus::{InstanceRecord, State};

    use super::*;
    use crate::scheduler::store::memory::Memory;

    const DATE: &str = "2026-01-01";

    fn caller(name: &str, role: Role) -> Caller {
        Caller {
            principal: Principal::token(
                &TokenName::parse(name).unwrap(),
                Some(role),
                Default::default(),
            ),
            via: Via::Cli,
        }
    }

    /// An instance of `job` for [`DATE`] that ended `state`.
    fn ended(job: &str, state: State) -> InstanceRecord {
        crate::test_fixtures::ended(&crate::test_fixtures::spec(job, None, &[]), DATE, state)
    }

    /// The store with `records`, their jobs registered and their day in the history.
    fn store(records: &[InstanceRecord]) -> Memory {
        let specs = records
            .iter()
            .map(|r| crate::test_fixtures::spec(r.job.as_str(), None, &[]));
        Memory::with(records.iter().cloned())
            .registering(specs)
            .with_history()
    }

    /// A re-run of the whole date: risky, so it needs a second person with auth on.
    fn whole_date() -> RerunRequest {
        RerunRequest {
            biz_date: Some(DATE.into()),
            requested_by: "ops@host".into(),
            ..RerunRequest::default()
        }
    }

    fn clerk<'a>(memory: &'a Memory, node: &'a NodeId, second_admin: bool) -> Clerk<'a, Memory> {
        Clerk {
            store: memory,
            auth: AuthSettings {
                enabled: true,
                require_second_admin: second_admin,
                approval_ttl: DEFAULT_TTL,
            },
            node,
        }
    }

    fn refused<T: std::fmt::Debug>(outcome: Result<T, CommandError>) -> String {
        match outcome {
            Err(CommandError::Refused(why)) => why.join("; "),
            other => panic!("not refused: {other:?}"),
        }
    }

    fn handed(memory: &Memory) -> usize {
        memory.handed.lock().unwrap().len()
    }

    /// An operator's risky re-run waits, holding its dry-run plan; nothing runs.
    async fn asked(memory: &Memory, node: &NodeId) -> Approval {
        let clerk = clerk(memory, node, false);
        let ops = caller("ops", Role::Operator);
        let waiting = rerun(&clerk, &ops, whole_date()).await.unwrap();
        assert!(
            waiting.message.starts_with("waiting for approval"),
            "{waiting:?}"
        );
        assert_eq!(waiting.plan.len(), 1);
        assert_eq!(handed(memory), 0, "nothing runs before it is approved");
        let approval = waiting.approval.unwrap();
        assert_eq!(approval.state, ApprovalState::Pending);
        approval
    }

    #[tokio::test]
    async fn with_auth_off_a_rerun_runs_at_once() {
        let memory = store(&[ended("load", State::Failed)]);
        let node = NodeId::parse("n1").unwrap();
        let mut clerk = clerk(&memory, &node, true);
        clerk.auth.enabled = false;
        let ran = rerun(&clerk, &caller("ops", Role::Operator), whole_date())
            .await
            .unwrap();
        assert!(ran.approval.is_none());
        assert_eq!(handed(&memory), 1);
    }

    #[tokio::test]
    async fn an_admin_self_approves_unless_a_second_admin_is_required() {
        let memory = store(&[ended("load", State::Failed)]);
        let node = NodeId::parse("n1").unwrap();
        let admin = caller("root", Role::Admin);
        let ran = rerun(&clerk(&memory, &node, false), &admin, whole_date())
            .await
            .unwrap();
        assert_eq!(ran.message, "self-approved by admin root");
        assert_eq!(handed(&memory), 1);

        let memory = store(&[ended("load", State::Failed)]);
        let held = rerun(&clerk(&memory, &node, true), &admin, whole_date())
            .await
            .unwrap();
        assert!(held.approval.is_some());
        assert_eq!(handed(&memory), 0);
    }

    #[tokio::test]
    async fn another_admin_approves_it_and_the_requester_is_audited_as_its_actor() {
        let memory = store(&[ended("load", State::Failed)]);
        let node = NodeId::parse("n1").unwrap();
        let approval = asked(&memory, &node).await;
        let clerk = clerk(&memory, &node, false);
        let id = approval.id.clone();
        // Nobody approves their own.
        let own = decide(
            &clerk,
            &caller("ops", Role::Admin),
            ApprovalRequest::Approve { id: id.clone() },
            7,
        )
        .await;
        assert!(refused(own).contains("another admin must approve it"));
        // An operator may not decide at all.
        let operator = decide(
            &clerk,
            &caller("other", Role::Operator),
            ApprovalRequest::Approve { id: id.clone() },
            7,
        )
        .await;
        assert!(matches!(operator, Err(CommandError::Denied(_))));

        let approved = decide(
            &clerk,
            &caller("root", Role::Admin),
            ApprovalRequest::Approve { id: id.clone() },
            8,
        )
        .await
        .unwrap();
        assert_eq!(approved.plan.len(), 1);
        assert_eq!(handed(&memory), 1);
        let (stored, _) = memory.approval(&id).await.unwrap().unwrap();
        assert_eq!(stored.state, ApprovalState::Done);
        assert_eq!(stored.decided_by.as_deref(), Some("root"));
        let audited = memory.audited.lock().unwrap().clone();
        let (key, record) = &audited[0];
        assert_eq!((*key, record.action.as_str()), (8, "rerun"));
        assert_eq!(record.actor, "ops");
        assert_eq!(record.approved_by.as_deref(), Some("root"));

        // Approved once: a second approval is refused, and runs nothing.
        let again = decide(
            &clerk,
            &caller("root2", Role::Admin),
            ApprovalRequest::Approve { id },
            9,
        )
        .await;
        assert!(refused(again).contains("is done already"));
        assert_eq!(handed(&memory), 1);
    }

    #[tokio::test]
    async fn an_approval_redelivered_to_the_command_that_took_it_finishes_once() {
        let memory = store(&[ended("load", State::Failed)]);
        let node = NodeId::parse("n1").unwrap();
        let approval = asked(&memory, &node).await;
        let clerk = clerk(&memory, &node, false);
        // The command took it, then died before running it.
        let (mut taken, revision) = memory.approval(&approval.id).await.unwrap().unwrap();
        taken.state = ApprovalState::Approved;
        taken.decided_by = Some("root".into());
        taken.taken_by_command = Some(8);
        memory.swap_approval(&taken, revision).await.unwrap();
        let finished = decide(
            &clerk,
            &caller("root", Role::Admin),
            ApprovalRequest::Approve {
                id: approval.id.clone(),
            },
            8,
        )
        .await
        .unwrap();
        assert!(finished.message.contains("carried out"));
        assert_eq!(handed(&memory), 1);
        // Another command finds it decided.
        let other = decide(
            &clerk,
            &caller("root", Role::Admin),
            ApprovalRequest::Approve { id: approval.id },
            9,
        )
        .await;
        assert!(refused(other).contains("already"));
    }

    #[tokio::test]
    async fn a_plan_that_changed_before_approval_is_rejected_and_nothing_runs() {
        let memory = store(&[ended("load", State::Failed)]);
        let node = NodeId::parse("n1").unwrap();
        let approval = asked(&memory, &node).await;
        // Meanwhile the instance ran again and succeeded.
        let date = ax_bus::time::parse_biz_date(DATE).unwrap();
        if let Some(day) = memory
            .days
            .lock()
            .unwrap()
            .get_mut(&("load".parse().unwrap(), date))
        {
            for entry in day.instances.values_mut() {
                entry.1 = State::Success;
            }
        }
        let clerk = clerk(&memory, &node, false);
        let outcome = decide(
            &clerk,
            &caller("root", Role::Admin),
            ApprovalRequest::Approve {
                id: approval.id.clone(),
            },
            8,
        )
        .await;
        assert!(refused(outcome).contains("the plan changed since it was asked for"));
        assert_eq!(handed(&memory), 0);
        let (stored, _) = memory.approval(&approval.id).await.unwrap().unwrap();
        assert_eq!(stored.state, ApprovalState::Rejected);
    }

    #[tokio::test]
    async fn an_expired_approval_is_refused_recorded_once_and_listed_expired() {
        let memory = store(&[ended("load", State::Failed)]);
        let node = NodeId::parse("n1").unwrap();
        let approval = asked(&memory, &node).await;
        let (mut past, revision) = memory.approval(&approval.id).await.unwrap().unwrap();
        past.expires_at = ax_bus::time::now() - Duration::seconds(1);
        memory.swap_approval(&past, revision).await.unwrap();
        let clerk = clerk(&memory, &node, false);
        let listed = decide(&clerk, &caller("v", Role::Viewer), ApprovalRequest::List, 8)
            .await
            .unwrap();
        assert_eq!(listed.approvals[0].state, ApprovalState::Expired);
        let outcome = decide(
            &clerk,
            &caller("root", Role::Admin),
            ApprovalRequest::Approve { id: approval.id },
            9,
        )
        .await;
        assert!(refused(outcome).contains("expired"));
        assert_eq!(handed(&memory), 0);
        let audited = memory.audited.lock().unwrap().clone();
        let expiries: Vec<_> = audited
            .iter()
            .filter(|(_, r)| r.action == "approval.expire")
            .collect();
        assert_eq!(expiries.len(), 1, "{audited:?}");
        assert_eq!(expiries[0].1.actor, "ax");
    }

    #[tokio::test]
    async fn a_rejection_needs_a_reason_and_closes_the_approval() {
        let memory = store(&[ended("load", State::Failed)]);
        let node = NodeId::parse("n1").unwrap();
        let approval = asked(&memory, &node).await;
        let clerk = clerk(&memory, &node, false);
        let root = caller("root", Role::Admin);
        let reject = |reason: &str| ApprovalRequest::Reject {
            id: approval.id.clone(),
            reason: reason.into(),
        };
        let blank = decide(&clerk, &root, reject("  "), 8).await;
        assert!(refused(blank).starts_with("reason: "));
        let rejected = decide(&clerk, &root, reject("not during close"), 9)
            .await
            .unwrap();
        assert!(rejected.message.ends_with("rejected: not during close"));
        let late = decide(
            &clerk,
            &root,
            ApprovalRequest::Approve {
                id: approval.id.clone(),
            },
            10,
        )
        .await;
        assert!(refused(late).contains("is rejected already (by root)"));
        let unknown = decide(
            &clerk,
            &root,
            ApprovalRequest::Approve {
                id: ApprovalId::random(),
            },
            11,
        )
        .await;
        assert!(refused(unknown).contains("no approval"));
        assert_eq!(handed(&memory), 0);
    }
}
