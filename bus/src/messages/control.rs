//! The control subjects (`ax.control.<command>`): each command's request, the reply on the
//! subject its `Ax-Reply-To` header names (JetStream uses the NATS reply subject for its own
//! acks), and what a re-run plans.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{InstanceId, JobName};
use crate::instance::State;
use crate::spec::JobDocument;

/// Header naming the core subject a control command's reply goes to.
pub const REPLY_TO_HEADER: &str = "Ax-Reply-To";

/// `ax.control.report`: how the work of an attempt that was accepted for later (an http
/// `202`) ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportRequest {
    /// The attempt (`Ax-Trace-Id` of the request the endpoint accepted).
    pub trace_id: crate::ids::TraceId,
    /// Whether the work succeeded.
    pub success: bool,
    /// A line for people.
    #[serde(default)]
    pub message: String,
    /// Structured output, published with the result and readable downstream.
    #[serde(default)]
    pub output: serde_json::Value,
}

/// `ax.control.replay`: submit a dead letter again (`ax dlq replay`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    /// The dead letter (its sequence in the dead-letter stream).
    pub id: u64,
    /// Who asked (the CLI sends `user@host`).
    #[serde(default)]
    pub requested_by: String,
}

/// `ax.control.approval`: what to do with re-runs waiting for a second person.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ApprovalRequest {
    /// Every approval kept (pending first).
    List,
    /// Approve one: its re-run is planned again and carried out if the plan is unchanged.
    Approve {
        /// Which.
        id: crate::ids::ApprovalId,
    },
    /// Refuse one.
    Reject {
        /// Which.
        id: crate::ids::ApprovalId,
        /// Why (required).
        reason: String,
    },
}

/// `ax.control.auth`: API tokens. Whoever asks for a token makes its secret and sends only its
/// hash ([`crate::auth::token`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum AuthRequest {
    /// The first admin token: accepted without a token, once.
    Bootstrap {
        /// Its name.
        name: crate::ids::TokenName,
        /// SHA-256 of its secret, hex.
        hash: String,
    },
    /// A new token (an admin's).
    Create {
        /// Its name (unused, or a revoked token's).
        name: crate::ids::TokenName,
        /// What it may do: in every namespace, or in those of `namespaces` only.
        role: crate::auth::Role,
        /// The namespaces it may act in with `role`; none: every namespace.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        namespaces: Vec<crate::ids::Namespace>,
        /// SHA-256 of its secret, hex.
        hash: String,
        /// When it stops working.
        #[serde(default, with = "crate::time::wire_opt")]
        expires_at: Option<DateTime<Utc>>,
    },
    /// Every token, without hashes.
    List,
    /// Stop a token working, on every node at once.
    Revoke {
        /// Which.
        name: crate::ids::TokenName,
    },
}

/// `ax.control.mark`: an operator's verdict on an ended or waiting instance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarkRequest {
    /// The instance.
    pub instance: InstanceId,
    /// `success` or `failed`.
    pub state: State,
    /// Why (required: a verdict without one is refused).
    pub reason: String,
    /// Who asked (the CLI sends `user@host`).
    #[serde(default)]
    pub requested_by: String,
}

/// `ax.control.cancel` and `ax.control.kill`: an operator acting on one instance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceRequest {
    /// The instance.
    pub instance: InstanceId,
    /// Why (kept in the record and the audit).
    #[serde(default)]
    pub reason: Option<String>,
    /// Who asked (the CLI sends `user@host`).
    #[serde(default)]
    pub requested_by: String,
}

/// `ax.control.apply`: create or update jobs, all or nothing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyRequest {
    /// The documents to apply.
    #[serde(default)]
    pub jobs: Vec<JobDocument>,
    /// Job files' text (YAML, one job per document), applied with `jobs`: what a client
    /// without a YAML parser sends; a problem is answered as `yaml:<line>: <field>: <reason>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yaml: Option<String>,
}

/// `ax.control.delete|pause|resume`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobNameRequest {
    /// The job.
    pub name: JobName,
}

/// `ax.control.trigger`: one instance now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerRequest {
    /// The job.
    pub name: JobName,
    /// Business date (YYYY-MM-DD); today in the job's time zone when absent.
    #[serde(default)]
    pub biz_date: Option<String>,
    /// Params overriding the job's.
    #[serde(default)]
    pub params: BTreeMap<String, serde_json::Value>,
    /// The business's idempotency key: the instance is `<job>.key-<key>`, created once however
    /// often the trigger is sent.
    #[serde(default)]
    pub key: Option<crate::ids::TriggerKey>,
    /// Run at this instant (RFC 3339) instead of now.
    #[serde(default)]
    pub at: Option<String>,
    /// Run after this long (`250ms`, `30s`, `5m`, `2h`, `1d`) instead of now.
    #[serde(default, rename = "in")]
    pub delay: Option<String>,
}

/// What apply did to one job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// A new job.
    Created,
    /// An existing job with a different definition.
    Updated,
    /// The same definition as stored.
    Unchanged,
}

/// One job's change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobChange {
    /// The job.
    pub name: JobName,
    /// What happened.
    pub change: Change,
}

/// The answer to any control command.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ControlReply {
    /// Whether the command was carried out.
    pub ok: bool,
    /// Refused for who asked (no token, a bad one, a role too low), not for what was asked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub denied: bool,
    /// One line per problem when not.
    #[serde(default)]
    pub errors: Vec<String>,
    /// apply: what changed.
    #[serde(default)]
    pub changes: Vec<JobChange>,
    /// trigger: the instance created.
    #[serde(default)]
    pub instance_id: Option<InstanceId>,
    /// rerun and backfill: the plan, instance by instance.
    #[serde(default)]
    pub plan: Vec<PlanStep>,
    /// Detail for humans.
    #[serde(default)]
    pub message: String,
    /// A re-run that waits for a second person: its approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<crate::auth::approval::Approval>,
    /// `approval list`: the approvals.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<crate::auth::approval::Approval>,
    /// `auth list`: the tokens.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<crate::auth::token::TokenRecord>,
    /// `instance`: the record read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<Box<crate::instance::InstanceRecord>>,
    /// What the command touched (an instance's state before and after, a dead letter), as the
    /// audit records it.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub detail: serde_json::Value,
}

impl ControlReply {
    /// A refusal with its reasons.
    pub fn refused(errors: Vec<String>) -> Self {
        Self {
            ok: false,
            errors,
            ..Self::default()
        }
    }
}

/// `ax.control.queue`: pause or resume one priority's queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueRequest {
    /// `high`, `normal` or `low`.
    pub priority: crate::spec::Priority,
    /// Pause (true) or resume (false).
    pub paused: bool,
}

/// `ax.control.namespace`: store a namespace's settings (its weight in the fair share of
/// the workers, its quotas), or remove them (`settings` absent: back to weight 1, no quota).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceRequest {
    /// The namespace.
    pub namespace: crate::ids::Namespace,
    /// Its settings; absent: remove them.
    #[serde(default)]
    pub settings: Option<super::NamespaceSettings>,
}

/// `ax.control.instance`: read one instance's record. On a namespace's subject
/// (`ax.control.instance.<namespace>`) only the namespace's instances are found: the record
/// read a namespace's services have, since a bucket's read cannot be confined by subject.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadRequest {
    /// The instance.
    pub instance: InstanceId,
}

/// How `ax rerun` chooses instances.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct RerunRequest {
    /// One instance…
    pub instance: Option<InstanceId>,
    /// …or every instance of a business date…
    pub biz_date: Option<String>,
    /// …from this job and its downstream only.
    pub root: Option<JobName>,
    /// Re-run only failed and cancelled instances.
    pub failed_only: bool,
    /// Also re-run succeeded downstream instances.
    pub force_downstream: bool,
    /// Only say what would happen.
    pub dry_run: bool,
    /// Who asks (user@host).
    pub requested_by: String,
}

/// One line of a re-run plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanStep {
    /// The instance.
    pub instance_id: InstanceId,
    /// Its job.
    pub job: JobName,
    /// Its business date.
    pub biz_date: String,
    /// Its state when planned.
    pub state: State,
    /// Whether it runs again.
    pub will_run: bool,
    /// Why (or why not).
    pub why: String,
    /// The datasets its job `produces`: what running it again rewrites for its business date.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rewrites: Vec<crate::spec::dataset::DatasetUri>,
}

/// A dead letter submitted again: the `detail` of a replay's answer and audit record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DlqReplay {
    /// The dead letter as it was listed.
    pub letter: crate::dead_letter::DeadLetter,
    /// What was done: `rerun` (a new attempt of its instance) or `republished` (the message
    /// put back on its subject as it came).
    pub action: String,
}

/// `ax backfill`: one instance per date, in date order, at most `parallel` at once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackfillRequest {
    /// The job.
    pub job: JobName,
    /// First date (YYYY-MM-DD).
    pub from: String,
    /// Last date, included.
    pub to: String,
    /// Also create the instances of downstream jobs that run on a cron.
    #[serde(default)]
    pub with_downstream: bool,
    /// Most instances running at once (1 when absent).
    #[serde(default)]
    pub parallel: Option<u32>,
    /// Who asks.
    #[serde(default)]
    pub requested_by: String,
}
