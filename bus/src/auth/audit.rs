//! The audit trail: one [`AuditRecord`] per action on `ax.audit.<action>`, kept 400 days.
//!
//! Every control command a Scheduler takes is recorded there once it is decided — carried
//! out, refused for its content, or refused for lack of rights — with who (the token's name
//! and role, or what an unverified sender said with auth off), through which door, what was
//! asked (secrets and token hashes never), the result and, for a re-run that needed one, the
//! approval. A dry run is recorded as a dry run. ax's own actions (the backlog control pausing
//! a queue, an approval expiring) are recorded the same way with `via: system`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Role, Via};
use crate::ids::{ApprovalId, NodeId};

/// How an action ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Carried out (a dry run: planned).
    Done,
    /// Refused for what it asked (an unknown job, a state that does not allow it).
    Refused,
    /// Refused for who asked (no token, a bad one, a role too low).
    Denied,
    /// Waiting for a second person.
    Pending,
}

impl Outcome {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::Refused => "refused",
            Outcome::Denied => "denied",
            Outcome::Pending => "pending",
        }
    }
}

/// One action, as recorded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// The action: a control command (`trigger`, `rerun`, …) or `token.create`,
    /// `token.revoke`, `approval.request`, `approval.approve`, `approval.reject`,
    /// `approval.expire`, `queue.backlog`.
    pub action: String,
    /// Who: a token's name, or what an unverified sender said.
    pub actor: String,
    /// Their role (with auth off, everyone is an unverified admin).
    pub role: Role,
    /// Whether a token proved who they are.
    pub verified: bool,
    /// Through which door.
    pub via: Via,
    /// The namespaces it acted in (none: across namespaces, or nothing that exists).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// What was asked, as JSON, without secrets.
    pub request: serde_json::Value,
    /// How it ended.
    pub outcome: Outcome,
    /// What it did, or why not.
    pub message: String,
    /// The approval it needed, made or consumed.
    #[serde(default)]
    pub approval: Option<ApprovalId>,
    /// Who approved it (for an approved re-run: the second person).
    #[serde(default)]
    pub approved_by: Option<String>,
    /// A dry run: planned, nothing changed.
    #[serde(default)]
    pub dry_run: bool,
    /// What the action touched, as JSON (a plan, a state before and after, a dead letter).
    #[serde(default)]
    pub detail: serde_json::Value,
    /// When.
    #[serde(with = "crate::time::wire")]
    pub at: DateTime<Utc>,
    /// The node that decided it.
    pub node: NodeId,
}
