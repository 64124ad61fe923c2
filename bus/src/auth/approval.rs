//! Two-person approval of risky re-runs.
//!
//! An operator's forced re-run (or one of a whole business date) is not carried out: it
//! becomes a pending [`Approval`] holding the request and its dry-run plan, in the approvals
//! bucket under its id. A different admin approves it; the Scheduler computes the plan again
//! and refuses if it changed (the instances moved since the requester looked), then moves the
//! approval from `pending` to `approved` by compare-and-swap — so of two admins approving at
//! once, one wins — and carries the re-run out. The approve command's stream sequence is kept
//! in the approval: if the Scheduler dies between the swap and the re-run, the redelivered
//! command recognises its own approval and finishes the work instead of finding it taken.
//! An approval not decided within its time (1 h by default) expires.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Principal, Via};
use crate::ids::ApprovalId;
use crate::messages::{PlanStep, RerunRequest};

/// Where an approval stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    /// Waiting for an admin.
    Pending,
    /// Approved; its re-run is being carried out.
    Approved,
    /// Approved and carried out.
    Done,
    /// Refused by an admin.
    Rejected,
    /// Not decided in time.
    Expired,
}

impl ApprovalState {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::Approved => "approved",
            ApprovalState::Done => "done",
            ApprovalState::Rejected => "rejected",
            ApprovalState::Expired => "expired",
        }
    }
}

/// A re-run waiting for (or past) a second person's decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    /// Its id.
    pub id: ApprovalId,
    /// The re-run asked for.
    pub request: RerunRequest,
    /// Its plan when asked.
    pub plan: Vec<PlanStep>,
    /// Who asked.
    pub requested_by: Principal,
    /// Through which door.
    pub via: Via,
    /// When.
    #[serde(with = "crate::time::wire")]
    pub created_at: DateTime<Utc>,
    /// When it expires if still pending.
    #[serde(with = "crate::time::wire")]
    pub expires_at: DateTime<Utc>,
    /// Where it stands.
    pub state: ApprovalState,
    /// Who approved or rejected it.
    #[serde(default)]
    pub decided_by: Option<String>,
    /// When.
    #[serde(default, with = "crate::time::wire_opt")]
    pub decided_at: Option<DateTime<Utc>>,
    /// A rejection's reason.
    #[serde(default)]
    pub reason: Option<String>,
    /// The stream sequence of the approve command that took it.
    #[serde(default)]
    pub taken_by_command: Option<u64>,
}

impl Approval {
    /// The namespaces its re-run reaches, its plan's jobs'; `None` for a whole date's re-run,
    /// which reaches every namespace.
    pub fn namespaces(&self) -> Option<std::collections::BTreeSet<&str>> {
        let r = &self.request;
        if r.instance.is_none() && r.root.is_none() {
            return None;
        }
        Some(self.plan.iter().map(|step| step.job.namespace()).collect())
    }

    /// Whether it is still pending at `now` (a pending one past its time has expired, even
    /// before the sweep marks it).
    pub fn pending_at(&self, now: DateTime<Utc>) -> bool {
        self.state == ApprovalState::Pending && self.expires_at > now
    }

    /// The re-run asked for, in a few words (`instance x`, `load on 2026-12-01, forced
    /// downstream`), for listings.
    pub fn describe(&self) -> String {
        let r = &self.request;
        let what = match (&r.instance, &r.biz_date, &r.root) {
            (Some(instance), _, _) => format!("instance {instance}"),
            (None, Some(date), Some(root)) => format!("{root} on {date}"),
            (None, Some(date), None) => format!("every job on {date}"),
            _ => "nothing".to_string(),
        };
        if r.force_downstream {
            format!("{what}, forced downstream")
        } else {
            what
        }
    }
}
