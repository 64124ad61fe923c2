//! What an instance tells the world: results (`ax.result.<job>`), events
//! (`ax.event.<job>.<state>`, the [`InstanceRecord`] itself) and alerts
//! (`ax.alert.<kind>`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::WorkItem;
use crate::ids::{InstanceId, JobName, NodeId, TraceId, WorkerId};
use crate::instance::ShardRef;
use crate::instance::{AttemptEnd, InstanceRecord, State, Tag};

/// One finished attempt, published on `ax.result.<job>`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResultMessage {
    /// The instance.
    pub instance_id: InstanceId,
    /// The attempt.
    pub trace_id: TraceId,
    /// The job.
    pub job: JobName,
    /// Business date.
    pub biz_date: String,
    /// 1-based attempt number.
    pub attempt: u32,
    /// The instance's state after this attempt (`success`, `failed`, `waiting_retry`).
    pub state: State,
    /// Detail of the end (`completed`, `exit_code`, `timeout`, ...).
    pub tag: Tag,
    /// Human-readable detail.
    pub message: String,
    /// Structured output (JSON).
    pub output: serde_json::Value,
    /// The worker that ran it (an empty string on the wire when none did).
    #[serde(with = "crate::codec::empty_as_none")]
    pub worker: Option<WorkerId>,
    /// When the instance was due.
    #[serde(with = "crate::time::wire")]
    pub expected_time: DateTime<Utc>,
    /// When the attempt started.
    #[serde(default, with = "crate::time::wire_opt")]
    pub started_at: Option<DateTime<Utc>>,
    /// When it finished.
    #[serde(with = "crate::time::wire")]
    pub finished_at: DateTime<Utc>,
    /// `finished_at - started_at` in milliseconds.
    pub duration_ms: Option<i64>,
    /// Exit code, when a process ran.
    pub exit_code: Option<i32>,
    /// When the next attempt is due (state `waiting_retry`).
    #[serde(default, with = "crate::time::wire_opt")]
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Last bytes of the attempt's stdout.
    pub stdout_tail: String,
    /// Last bytes of the attempt's stderr.
    pub stderr_tail: String,
    /// For a shard: its parent and place.
    #[serde(default)]
    pub shard: Option<ShardRef>,
    /// What made the instance (`cron`, `catch_up`, `manual`, `deps`, `backfill`); absent from
    /// results of older versions.
    #[serde(default)]
    pub trigger: Option<crate::instance::Trigger>,
    /// When the attempt became due, where that is not its expected time (see
    /// [`InstanceRecord::due_at`]).
    #[serde(
        default,
        with = "crate::time::wire_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub due_at: Option<DateTime<Utc>>,
    /// What the attempt's processes used, counted in its cgroup (absent where it had none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::instance::Usage>,
}

impl ResultMessage {
    /// The result of `end` for the instance described by `work`, given the state it led to.
    pub fn new(
        work: &WorkItem,
        end: &AttemptEnd,
        state: State,
        next_attempt_at: Option<DateTime<Utc>>,
    ) -> Self {
        Self {
            instance_id: work.instance_id.clone(),
            trace_id: end.trace_id.clone(),
            job: work.job().clone(),
            biz_date: work.biz_date.clone(),
            attempt: work.attempt,
            state,
            tag: end.tag,
            message: end.message.clone(),
            output: end.output.clone(),
            worker: Some(end.worker.clone()),
            expected_time: work.expected_time,
            started_at: end.started_at,
            finished_at: end.finished_at,
            duration_ms: end
                .started_at
                .map(|s| (end.finished_at - s).num_milliseconds()),
            exit_code: end.exit_code,
            next_attempt_at,
            stdout_tail: end.stdout_tail.clone(),
            stderr_tail: end.stderr_tail.clone(),
            usage: end.usage,
            shard: work.shard.clone(),
            trigger: work.trigger,
            due_at: work.due_at,
        }
    }
}

impl ResultMessage {
    /// The result of an instance that ended without its attempt running to the end
    /// (cancelled, or failed waiting for dependencies), built from its record.
    pub fn from_record(record: &InstanceRecord) -> Self {
        let finished_at = record.finished_at.unwrap_or_else(crate::time::now);
        Self {
            instance_id: record.instance_id.clone(),
            trace_id: record.trace_id.clone(),
            job: record.job.clone(),
            biz_date: record.biz_date.clone(),
            attempt: record.attempt,
            state: record.state,
            tag: record.tag,
            message: record.message.clone(),
            output: record.output.clone(),
            worker: record.worker.clone(),
            expected_time: record.expected_time,
            started_at: record.started_at,
            finished_at,
            duration_ms: record
                .started_at
                .map(|s| (finished_at - s).num_milliseconds()),
            exit_code: record.exit_code,
            next_attempt_at: record.next_attempt_at,
            stdout_tail: record.stdout_tail.clone(),
            stderr_tail: record.stderr_tail.clone(),
            usage: record.usage,
            shard: record.shard.clone(),
            trigger: Some(record.trigger),
            due_at: record.due_at,
        }
    }
}

/// Lifecycle event payload.
pub type EventMessage = InstanceRecord;

/// What an alert is about: the last token of `ax.alert.<kind>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    /// An instance failed for good (no retry left).
    Failure,
    /// An attempt ran past its timeout.
    Timeout,
    /// An instance failed for good, or a message reached its maximum deliveries.
    DeadLetter,
    /// A node's clock is off the NATS server's, or back.
    ClockSkew,
    /// A malformed or refused control command.
    Control,
    /// A malformed dispatch.
    Dispatch,
    /// A malformed message between the Scheduler, the DagCoordinator and the Router.
    Flow,
    /// A malformed alert (the webhook forwarder's own input).
    Alert,
    /// An outcome that could not be made durable on its worker.
    Outbox,
    /// An instance whose creator stopped before handing it on.
    Orphan,
    /// A worker declared dead; its attempts are handed over.
    Worker,
    /// An actor or one of its pumps made no progress for the stall limit.
    ActorStalled,
    /// An instance whose next step nobody owned (a dispatch or hand-off lost); it was resumed.
    Stranded,
    /// A job registry entry that does not decode or breaks a rule of the spec: ignored.
    Registry,
    /// A queue's backlog stayed above its limit (work waiting per worker).
    Backlog,
    /// JetStream refused a node's writes for want of storage, or has room again.
    Storage,
    /// A dataset with a `freshness` got no update in time for a business date, or got it late.
    Freshness,
    /// A job run by its data was started again for its inputs' updates as often as one
    /// business date allows (a loop through datasets, most likely): later updates start nothing.
    DataRuns,
    /// A kind written by a newer ax.
    #[serde(other)]
    Other,
}

impl AlertKind {
    /// The kind as written on the wire and in the subject.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::Failure => "failure",
            AlertKind::Timeout => "timeout",
            AlertKind::DeadLetter => "dead_letter",
            AlertKind::ClockSkew => "clock_skew",
            AlertKind::Control => "control",
            AlertKind::Dispatch => "dispatch",
            AlertKind::Flow => "flow",
            AlertKind::Alert => "alert",
            AlertKind::Outbox => "outbox",
            AlertKind::Orphan => "orphan",
            AlertKind::Worker => "worker",
            AlertKind::ActorStalled => "actor_stalled",
            AlertKind::Stranded => "stranded",
            AlertKind::Registry => "registry",
            AlertKind::Backlog => "backlog",
            AlertKind::Storage => "storage",
            AlertKind::Freshness => "freshness",
            AlertKind::DataRuns => "data_runs",
            AlertKind::Other => "other",
        }
    }
}

impl std::fmt::Display for AlertKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Something an operator should see, published on `ax.alert.<kind>`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    /// What it is about.
    pub kind: AlertKind,
    /// What happened.
    pub message: String,
    /// The node that saw it.
    pub node: NodeId,
    /// When.
    #[serde(with = "crate::time::wire")]
    pub at: DateTime<Utc>,
    /// The subject of the offending message, when there was one.
    #[serde(default)]
    pub subject: Option<String>,
    /// The instance it concerns, when it concerns one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<InstanceId>,
    /// That instance's job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobName>,
}

impl Alert {
    /// An alert of `kind` seen by `node` now, about a message on `subject` if there was one.
    pub fn new(kind: AlertKind, message: String, node: NodeId, subject: Option<String>) -> Self {
        Self {
            kind,
            message,
            node,
            at: crate::time::now(),
            subject,
            instance: None,
            job: None,
        }
    }
}
