//! What the Scheduler's decisions need of the store and the bus — the control handlers, the
//! overlap policy — narrowed to traits so that the decisions (refusals, transitions, what is
//! told) are unit-tested against memory, while the integration tests keep the real
//! nats-server. [`AxClient`](ax_bus::AxClient) is the implementation that runs ([`client`]);
//! `memory` holds the in-memory ones the unit tests drive.

mod client;
#[cfg(test)]
pub(crate) mod memory;

use std::collections::BTreeMap;

use chrono::NaiveDate;

use ax_bus::auth::approval::Approval;
use ax_bus::auth::audit::AuditRecord;
use ax_bus::auth::token::TokenRecord;
use ax_bus::client::deps::Days;
use ax_bus::client::reports::{Delivery, Report, ReportState};
use ax_bus::client::Updated;
use ax_bus::dead_letter::DeadLetter;
use ax_bus::ids::{ApprovalId, InstanceId, JobName, Namespace, TokenName, TraceId};
use ax_bus::instance::TransitionRefused;
use ax_bus::messages::{DateInstances, JobRecord, NamespaceSettings, QueueState, WorkItem};
use ax_bus::spec::{JobSpec, Priority};
use ax_bus::InstanceRecord;

use crate::ActorError;

/// The instance records an operator's command reads and moves, and how it tells an end.
pub(crate) trait Instances {
    /// The record of `id`, if there is one.
    async fn record(&self, id: &InstanceId) -> Result<Option<InstanceRecord>, ActorError>;
    /// Moves `id`'s record by `transition`, with a compare-and-swap that decides again on a
    /// record that moved meanwhile.
    async fn update<F>(&self, id: &InstanceId, transition: F) -> Result<Updated, ActorError>
    where
        F: Fn(&InstanceRecord) -> Result<InstanceRecord, TransitionRefused>;
    /// Tells that `record` ended: its result (under `msg_id`) and its event.
    async fn ended(&self, record: &InstanceRecord, msg_id: &str) -> Result<(), ActorError>;
    /// Asks `worker` to stop attempt `trace` (best effort).
    async fn stop_attempt(&self, worker: &str, trace: &TraceId);
    /// Hands a new attempt of `record` (a re-run's) to the DagCoordinator as `work`, and tells
    /// its event.
    async fn hand_on(&self, record: &InstanceRecord, work: &WorkItem) -> Result<(), ActorError>;
}

/// The reports awaited of attempts whose endpoint answered `202 Accepted` (the claims bucket's
/// `report.<trace>` keys).
pub(crate) trait Reports {
    /// What became of attempt `trace`'s report, if any attempt ever waited for one.
    async fn report_state(&self, trace: &TraceId) -> Result<Option<ReportState>, ActorError>;
    /// Hands `report` to the attempt waiting for it, with a compare-and-swap on its key.
    async fn deliver_report(
        &self,
        trace: &TraceId,
        report: &Report,
    ) -> Result<Delivery, ActorError>;
}

/// Each job's latest instance (bucket `ax_latest`, kept for the jobs whose overlap policy is
/// not `allow`).
pub(crate) trait Latest {
    /// The latest instance noted for `job`, if one is (a value that is no instance id is none).
    async fn latest(&self, job: &JobName) -> Result<Option<InstanceId>, ActorError>;
}

/// The job registry and the queues' states, as `apply`, `delete`, `pause`, `resume` and
/// `queue` change them.
pub(crate) trait Registry {
    /// Job `name`'s record and its revision, if it has one.
    async fn job(&self, name: &JobName) -> Result<Option<(JobRecord, u64)>, ActorError>;
    /// Writes `record` over revision `revision` of `name`; `false` when the entry moved on
    /// since (read it again).
    async fn swap_job(
        &self,
        name: &JobName,
        record: &JobRecord,
        revision: u64,
    ) -> Result<bool, ActorError>;
    /// Whether an entry is registered under `name` (a valid job or not).
    async fn job_exists(&self, name: &JobName) -> Result<bool, ActorError>;
    /// Writes `record` as job `name`, never registered before; `false` when another write got
    /// there first.
    async fn create_job(&self, name: &JobName, record: &JobRecord) -> Result<bool, ActorError>;
    /// Removes job `name`.
    async fn delete_job(&self, name: &JobName) -> Result<(), ActorError>;
    /// Every valid job's spec, by name.
    async fn specs(&self) -> Result<BTreeMap<JobName, JobSpec>, ActorError>;
    /// Sets a priority's queue's state.
    async fn set_queue(&self, priority: Priority, state: &QueueState) -> Result<(), ActorError>;
    /// Every namespace's stored settings.
    async fn namespaces(&self) -> Result<BTreeMap<Namespace, NamespaceSettings>, ActorError>;
    /// How many of `namespace`'s instances wait to run: the messages of its ready queues.
    async fn waiting(&self, namespace: &str) -> Result<u64, ActorError>;
    /// Stores `namespace`'s settings, or removes them (`None`).
    async fn set_namespace(
        &self,
        namespace: &Namespace,
        settings: Option<&NamespaceSettings>,
    ) -> Result<(), ActorError>;
}

/// The API tokens (bucket `ax_tokens`), as `auth` makes, lists and revokes them.
pub(crate) trait TokenStore {
    /// Every token (the bootstrap marker is none).
    async fn tokens(&self) -> Result<Vec<TokenRecord>, ActorError>;
    /// Token `name` and its revision, if there is one.
    async fn token(&self, name: &TokenName) -> Result<Option<(TokenRecord, u64)>, ActorError>;
    /// Marks that `auth bootstrap` was run; `false` when it was already.
    async fn mark_bootstrap(&self) -> Result<bool, ActorError>;
    /// Writes `record` as a name never written (`over: None`) or over revision `over`; `false`
    /// when another write got there first.
    async fn put_token(&self, record: &TokenRecord, over: Option<u64>) -> Result<bool, ActorError>;
}

/// The dependency history (bucket `ax_deps`): each job's instances of each business date, as a
/// re-run follows them down.
pub(crate) trait History {
    /// The instances of `job` for `date`.
    async fn day(&self, job: &JobName, date: NaiveDate) -> Result<DateInstances, ActorError>;
    /// Every job's instances for `date`.
    async fn date(&self, date: NaiveDate) -> Result<Days, ActorError>;
}

/// The approvals of risky re-runs (bucket `ax_approvals`).
pub(crate) trait ApprovalStore {
    /// Every approval, pending first.
    async fn approvals(&self) -> Result<Vec<Approval>, ActorError>;
    /// Approval `id` and its revision, if there is one.
    async fn approval(&self, id: &ApprovalId) -> Result<Option<(Approval, u64)>, ActorError>;
    /// Stores a new approval; `false` when its id is taken (draw another).
    async fn create_approval(&self, approval: &Approval) -> Result<bool, ActorError>;
    /// Writes `approval` over `revision`: its new revision, or none when someone else wrote it
    /// first.
    async fn swap_approval(
        &self,
        approval: &Approval,
        revision: u64,
    ) -> Result<Option<u64>, ActorError>;
}

/// The audit stream (`ax.audit.<action>`).
pub(crate) trait AuditLog {
    /// Records `record`, once under `key` (a command's stream sequence; 0: an action of ax's
    /// own, once per record), retrying a moment before giving up.
    async fn audit(&self, key: u64, record: &AuditRecord) -> Result<(), ActorError>;
}

/// The dead letters (stream `AX_DEAD`), as `replay` reads, puts back and removes them.
pub(crate) trait DeadLetters {
    /// Dead letter `id`, as it describes itself, if there is one.
    async fn letter(&self, id: u64) -> Result<Option<DeadLetter>, ActorError>;
    /// Puts dead letter `id` back on `subject` as it came, de-duplicated by the letter (a
    /// replay repeated after a lost answer publishes it once).
    async fn put_back(&self, id: u64, subject: &str) -> Result<(), ActorError>;
    /// Removes dead letter `id`, its replay stored.
    async fn remove_letter(&self, id: u64) -> Result<(), ActorError>;
}
