//! The payloads of ax's subjects.
//!
//! - control (`ax.control.<command>`): [`ApplyRequest`], [`JobNameRequest`] (delete, pause,
//!   resume), [`TriggerRequest`]; answered with a [`ControlReply`] on the subject named by the
//!   `Ax-Reply-To` header (JetStream uses the NATS reply subject for its own acks);
//! - job registry values: [`JobRecord`];
//! - the hand-offs created → ready → dispatch: [`WorkItem`];
//! - results (`ax.result.<job>`): [`ResultMessage`];
//! - events (`ax.event.<job>.<state>`): the [`InstanceRecord`] itself.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{DispatchId, InstanceId, JobName, NodeId, TraceId, WorkerId};
pub use crate::instance::ShardRef;
use crate::instance::{AttemptEnd, InstanceRecord, State, Tag};
use crate::spec::{JobDocument, JobSpec};

/// Header naming the core subject a control command's reply goes to.
pub const REPLY_TO_HEADER: &str = "Ax-Reply-To";

/// Control command names (the last token of `ax.control.<command>`).
pub mod commands {
    /// Create or update jobs.
    pub const APPLY: &str = "apply";
    /// Delete a job.
    pub const DELETE: &str = "delete";
    /// Stop firing a job.
    pub const PAUSE: &str = "pause";
    /// Fire a paused job again.
    pub const RESUME: &str = "resume";
    /// Run one instance now.
    pub const TRIGGER: &str = "trigger";
    /// Re-run instances.
    pub const RERUN: &str = "rerun";
    /// Create instances for past dates.
    pub const BACKFILL: &str = "backfill";
    /// Pause or resume a priority's queue.
    pub const QUEUE: &str = "queue";
    /// End a waiting instance `cancelled`.
    pub const CANCEL: &str = "cancel";
    /// Stop a running attempt; the instance ends `failed`.
    pub const KILL: &str = "kill";
    /// An operator's verdict: the instance ends `success` or `failed`.
    pub const MARK: &str = "mark";
    /// Submit a dead letter again.
    pub const REPLAY: &str = "replay";
    /// List, approve or reject re-runs waiting for a second person.
    pub const APPROVAL: &str = "approval";
    /// Make, list or revoke API tokens.
    pub const AUTH: &str = "auth";
    /// The business's report of an attempt whose endpoint answered `202 Accepted`.
    pub const REPORT: &str = "report";
    /// Every command, as `ax.control.<command>` names it.
    pub const ALL: [&str; 15] = [
        APPLY, DELETE, PAUSE, RESUME, TRIGGER, RERUN, BACKFILL, QUEUE, CANCEL, KILL, MARK, REPLAY,
        APPROVAL, AUTH, REPORT,
    ];

    /// A control command by kind, one variant per `ax.control.<command>`. Matched exhaustively
    /// where a command's treatment is decided — the role it needs
    /// ([`crate::auth::needed`]), the Scheduler's dispatch — so that a new command cannot be
    /// added without deciding each.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum Command {
        /// [`APPLY`].
        Apply,
        /// [`DELETE`].
        Delete,
        /// [`PAUSE`].
        Pause,
        /// [`RESUME`].
        Resume,
        /// [`TRIGGER`].
        Trigger,
        /// [`RERUN`].
        Rerun,
        /// [`BACKFILL`].
        Backfill,
        /// [`QUEUE`].
        Queue,
        /// [`CANCEL`].
        Cancel,
        /// [`KILL`].
        Kill,
        /// [`MARK`].
        Mark,
        /// [`REPLAY`].
        Replay,
        /// [`APPROVAL`].
        Approval,
        /// [`AUTH`].
        Auth,
        /// [`REPORT`].
        Report,
    }

    impl Command {
        /// Every command.
        pub const ALL: [Command; 15] = [
            Command::Apply,
            Command::Delete,
            Command::Pause,
            Command::Resume,
            Command::Trigger,
            Command::Rerun,
            Command::Backfill,
            Command::Queue,
            Command::Cancel,
            Command::Kill,
            Command::Mark,
            Command::Replay,
            Command::Approval,
            Command::Auth,
            Command::Report,
        ];

        /// Its name, the last token of its subject.
        pub const fn name(self) -> &'static str {
            match self {
                Command::Apply => APPLY,
                Command::Delete => DELETE,
                Command::Pause => PAUSE,
                Command::Resume => RESUME,
                Command::Trigger => TRIGGER,
                Command::Rerun => RERUN,
                Command::Backfill => BACKFILL,
                Command::Queue => QUEUE,
                Command::Cancel => CANCEL,
                Command::Kill => KILL,
                Command::Mark => MARK,
                Command::Replay => REPLAY,
                Command::Approval => APPROVAL,
                Command::Auth => AUTH,
                Command::Report => REPORT,
            }
        }

        /// The command named `name`, if there is one.
        pub fn parse(name: &str) -> Option<Self> {
            Self::ALL.into_iter().find(|c| c.name() == name)
        }
    }

    impl std::fmt::Display for Command {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.name())
        }
    }

    /// A control command with what it asks, decoded: one variant per command, so that the one
    /// match that carries commands out takes each request in its type (a new command is a new
    /// variant here, then every match the compiler points at).
    #[derive(Clone, Debug)]
    pub enum Request {
        /// [`APPLY`].
        Apply(super::ApplyRequest),
        /// [`DELETE`].
        Delete(super::JobNameRequest),
        /// [`PAUSE`].
        Pause(super::JobNameRequest),
        /// [`RESUME`].
        Resume(super::JobNameRequest),
        /// [`TRIGGER`].
        Trigger(super::TriggerRequest),
        /// [`RERUN`].
        Rerun(super::RerunRequest),
        /// [`BACKFILL`].
        Backfill(super::BackfillRequest),
        /// [`QUEUE`].
        Queue(super::QueueRequest),
        /// [`CANCEL`].
        Cancel(super::InstanceRequest),
        /// [`KILL`].
        Kill(super::InstanceRequest),
        /// [`MARK`].
        Mark(super::MarkRequest),
        /// [`REPLAY`].
        Replay(super::ReplayRequest),
        /// [`APPROVAL`].
        Approval(super::ApprovalRequest),
        /// [`AUTH`].
        Auth(super::AuthRequest),
        /// [`REPORT`].
        Report(super::ReportRequest),
    }

    impl Request {
        /// The request of command `kind` in `payload` (MessagePack, or JSON when the headers
        /// say so).
        pub fn decode(
            kind: Command,
            headers: Option<&async_nats::HeaderMap>,
            payload: &[u8],
        ) -> Result<Self, crate::codec::CodecError> {
            use crate::codec::decode_request as read;
            Ok(match kind {
                Command::Apply => Self::Apply(read(headers, payload)?),
                Command::Delete => Self::Delete(read(headers, payload)?),
                Command::Pause => Self::Pause(read(headers, payload)?),
                Command::Resume => Self::Resume(read(headers, payload)?),
                Command::Trigger => Self::Trigger(read(headers, payload)?),
                Command::Rerun => Self::Rerun(read(headers, payload)?),
                Command::Backfill => Self::Backfill(read(headers, payload)?),
                Command::Queue => Self::Queue(read(headers, payload)?),
                Command::Cancel => Self::Cancel(read(headers, payload)?),
                Command::Kill => Self::Kill(read(headers, payload)?),
                Command::Mark => Self::Mark(read(headers, payload)?),
                Command::Replay => Self::Replay(read(headers, payload)?),
                Command::Approval => Self::Approval(read(headers, payload)?),
                Command::Auth => Self::Auth(read(headers, payload)?),
                Command::Report => Self::Report(read(headers, payload)?),
            })
        }

        /// Which command it is.
        pub fn kind(&self) -> Command {
            match self {
                Self::Apply(_) => Command::Apply,
                Self::Delete(_) => Command::Delete,
                Self::Pause(_) => Command::Pause,
                Self::Resume(_) => Command::Resume,
                Self::Trigger(_) => Command::Trigger,
                Self::Rerun(_) => Command::Rerun,
                Self::Backfill(_) => Command::Backfill,
                Self::Queue(_) => Command::Queue,
                Self::Cancel(_) => Command::Cancel,
                Self::Kill(_) => Command::Kill,
                Self::Mark(_) => Command::Mark,
                Self::Replay(_) => Command::Replay,
                Self::Approval(_) => Command::Approval,
                Self::Auth(_) => Command::Auth,
                Self::Report(_) => Command::Report,
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn every_command_is_one_kind_and_back() {
            assert_eq!(Command::ALL.map(Command::name), ALL);
            for command in Command::ALL {
                assert_eq!(Command::parse(command.name()), Some(command));
            }
            assert_eq!(Command::parse("reboot"), None);
            assert_eq!(Command::parse("Apply"), None);
        }

        #[test]
        fn a_request_decodes_as_its_command_and_says_which() {
            let json = |text: &str| {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Content-Type", "application/json");
                (headers, text.as_bytes().to_vec())
            };
            let (headers, payload) = json(r#"{"name": "nightly"}"#);
            for kind in [Command::Delete, Command::Pause, Command::Resume] {
                let request = Request::decode(kind, Some(&headers), &payload).unwrap();
                assert_eq!(request.kind(), kind);
            }
            let (headers, payload) = json(r#"{"instance": "nightly.k"}"#);
            let request = Request::decode(Command::Kill, Some(&headers), &payload).unwrap();
            assert!(matches!(request, Request::Kill(ref r) if r.instance.as_str() == "nightly.k"));
            assert!(Request::decode(Command::Trigger, Some(&headers), &payload).is_err());
        }
    }
}

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
        /// What it may do.
        role: crate::auth::Role,
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

/// The value stored per job in the registry bucket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// The definition.
    pub spec: JobSpec,
    /// Paused jobs do not fire on their cron.
    pub paused: bool,
    /// Last change.
    #[serde(with = "crate::time::wire")]
    pub updated_at: DateTime<Utc>,
    /// When a job of this name was created; every later apply keeps it. A job deleted and
    /// applied again is another job: what the first one left waiting (a delayed trigger) is
    /// cancelled, not run under the second one's name. Absent on records written before it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::time::wire_opt"
    )]
    pub defined_at: Option<DateTime<Utc>>,
}

impl JobRecord {
    /// A registry value, decoded and checked by the rules of apply. Only the Schedulers write
    /// the registry, after those checks; but whoever may write its bucket could put anything
    /// there, and what the actors read from it is executed — so each reader checks again.
    pub fn from_registry(value: &[u8]) -> Result<Self, RegistryValueError> {
        let record: Self = crate::codec::decode(value)?;
        let errors = crate::spec::validate_spec(&record.spec);
        if errors.is_empty() {
            Ok(record)
        } else {
            Err(RegistryValueError::Invalid(
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            ))
        }
    }
}

/// Why a registry value is not taken as a job.
#[derive(Debug, thiserror::Error)]
pub enum RegistryValueError {
    /// Not a job record.
    #[error("does not decode as a job: {0}")]
    Decode(#[from] crate::codec::CodecError),
    /// A job that breaks the spec's rules (each `field: reason`).
    #[error("is not a valid job: {0}")]
    Invalid(String),
}

/// One attempt of one instance on its way to a worker: what the Scheduler creates, the
/// DagCoordinator releases and the Router dispatches. It carries the job definition as it was
/// when the attempt was created, so a later edit never changes work already in flight.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkItem {
    /// The instance.
    pub instance_id: InstanceId,
    /// The attempt.
    pub trace_id: TraceId,
    /// 1-based attempt number.
    pub attempt: u32,
    /// The attempt the current run started with (retries are counted from it).
    #[serde(default = "first_attempt")]
    pub run_start: u32,
    /// Business date.
    pub biz_date: String,
    /// When the instance was due.
    #[serde(with = "crate::time::wire")]
    pub expected_time: DateTime<Utc>,
    /// Effective params.
    pub params: BTreeMap<String, serde_json::Value>,
    /// The job definition: shared, not copied, by the attempts made of one definition (a
    /// thousand fires of a job at one instant hold one copy).
    pub spec: std::sync::Arc<JobSpec>,
    /// The worker it was dispatched to (set by the Router).
    #[serde(default)]
    pub worker: Option<WorkerId>,
    /// An instance that must end before this one runs (`overlap: queue`, backfill order).
    #[serde(default)]
    pub gate: Option<Gate>,
    /// This dispatch of the attempt (set by the Router): the one allowed to claim it.
    #[serde(default)]
    pub dispatch: Option<DispatchId>,
    /// The Router that dispatched it and awaits its acknowledgement.
    #[serde(default)]
    pub router: Option<NodeId>,
    /// For a shard (or one run of a broadcast): which one, of how many, of which instance.
    #[serde(default)]
    pub shard: Option<ShardRef>,
    /// The one worker this attempt may run on (one run of a broadcast).
    #[serde(default)]
    pub pin: Option<WorkerId>,
    /// The record as the attempt's creator stored it, so that the worker's first write to it
    /// needs no read (a compare-and-swap on this revision; when the record moved on since, the
    /// write is refused and the worker reads it). Dropped where the record changes on the way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored: Option<StoredRecord>,
    /// Workers this attempt went to before without being acknowledged in time (or that died
    /// with it queued): set by the Router that re-dispatches it, written into the record by
    /// the worker that claims it (the instance history's re-dispatch step).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passed_over: Vec<WorkerId>,
    /// What made the instance (a cron tick, a trigger, a backfill…), carried to its result:
    /// the day's summary leaves backfills out of trigger latency. Absent from older messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<crate::instance::Trigger>,
    /// When this attempt became due, where that is not its expected time: set by the
    /// DagCoordinator that releases an instance which waited for its dependencies, or which
    /// its inputs' updates started; the worker writes it into the record as it starts it.
    #[serde(
        default,
        with = "crate::time::wire_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub due_at: Option<DateTime<Utc>>,
}

/// An instance record and the revision it was stored under.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredRecord {
    /// The record.
    pub record: Box<InstanceRecord>,
    /// Its revision in the instances bucket.
    pub revision: u64,
}

impl WorkItem {
    /// The work item of a record's current attempt, on its way to routing again (no worker,
    /// gate, dispatch or router yet).
    pub fn for_attempt(
        record: &InstanceRecord,
        spec: impl Into<std::sync::Arc<crate::spec::JobSpec>>,
    ) -> Self {
        Self {
            instance_id: record.instance_id.clone(),
            trace_id: record.trace_id.clone(),
            attempt: record.attempt,
            run_start: record.run_start,
            biz_date: record.biz_date.clone(),
            expected_time: record.expected_time,
            params: record.params.clone(),
            worker: None,
            gate: None,
            dispatch: None,
            router: None,
            shard: record.shard.clone(),
            pin: record.pin.clone(),
            stored: None,
            passed_over: Vec::new(),
            spec: spec.into(),
            trigger: Some(record.trigger),
            due_at: record.due_at,
        }
    }

    /// A first attempt of `spec` for `biz_date`, due now with the job's own params, on its way
    /// to routing (no worker, gate, dispatch or router yet): what a benchmark hands a Router.
    pub fn first(
        instance_id: InstanceId,
        trace_id: TraceId,
        biz_date: impl Into<String>,
        spec: impl Into<std::sync::Arc<crate::spec::JobSpec>>,
    ) -> Self {
        let spec = spec.into();
        Self {
            instance_id,
            trace_id,
            attempt: 1,
            run_start: 1,
            biz_date: biz_date.into(),
            expected_time: crate::time::now(),
            params: spec.params.clone(),
            spec,
            worker: None,
            gate: None,
            dispatch: None,
            router: None,
            shard: None,
            pin: None,
            stored: None,
            passed_over: Vec::new(),
            trigger: None,
            due_at: None,
        }
    }
}

/// A delayed trigger's first attempt waiting for its due time (its `expected_time`) in
/// `<AX>_DELAYED`: what the Scheduler releases then.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DelayedWork {
    /// The attempt.
    pub work: WorkItem,
    /// Whether it goes straight to the Router when released (nothing in the DAG concerns it).
    pub skip_coordinator: bool,
    /// The job it was created under ([`JobRecord::defined_at`]): released only while the
    /// registry holds that job, cancelled once it was deleted, whatever was applied since.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::time::wire_opt"
    )]
    pub defined_at: Option<DateTime<Utc>>,
}

/// An instance split into sub-instances by the Router, on `ax.internal.split.<job>`: the
/// DagCoordinator ends the parent once every child has ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SplitPlan {
    /// The parent attempt.
    pub parent: WorkItem,
    /// The children's instance ids.
    pub children: Vec<InstanceId>,
}

/// A worker's acknowledgement of a dispatch ("received, about to run"), on
/// `ax.internal.ack.<router>` (core NATS).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DispatchAck {
    /// The attempt.
    pub trace_id: TraceId,
    /// The dispatch acknowledged.
    pub dispatch: DispatchId,
    /// The worker.
    pub worker: WorkerId,
}

/// Several acknowledgements for one Router in one message on `ax.internal.ack.<router>`: a
/// worker sends together the acknowledgements that gathered while it sent the previous ones
/// (a Router also takes a lone [`DispatchAck`], as earlier workers send).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DispatchAcks {
    /// The acknowledgements, in the order the worker made them.
    pub acks: Vec<DispatchAck>,
}

/// Whether a priority's queue is consumed (bucket `ax_queues`, key = priority).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    /// Paused queues keep their messages; nothing is dispatched from them.
    pub paused: bool,
    /// Who paused it: empty for an operator (`ax queue pause`), `backlog control` when the
    /// Routers' backlog control did, which alone resumes it by itself.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub by: String,
}

impl QueueState {
    /// Who pauses a queue when the backlog control does.
    pub const BY_BACKLOG: &'static str = "backlog control";
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

fn first_attempt() -> u32 {
    1
}

/// An instance another one waits for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gate {
    /// Its id.
    pub instance_id: InstanceId,
    /// Its job.
    pub job: JobName,
    /// Its business date.
    pub biz_date: String,
}

impl WorkItem {
    /// The job name.
    pub fn job(&self) -> &JobName {
        &self.spec.name
    }
}

/// What became of one cron tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TickOutcome {
    /// An instance was created on time.
    Fired,
    /// A tick missed while no Scheduler ran, created late by the misfire policy.
    CaughtUp,
    /// No instance, on purpose (paused, misfire or overlap policy); `reason` says which.
    Skipped,
    /// Another Scheduler created the instance.
    Deduplicated,
}

impl TickOutcome {
    /// The outcome as written.
    pub fn as_str(self) -> &'static str {
        match self {
            TickOutcome::Fired => "fired",
            TickOutcome::CaughtUp => "caught_up",
            TickOutcome::Skipped => "skipped",
            TickOutcome::Deduplicated => "deduplicated",
        }
    }
}

/// A tick's record on `ax.internal.tick.<job>` (`ax job history`). A tick fired on time has no
/// message there: its instance record stands for it ([`TickRecord::fired`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TickRecord {
    /// The job.
    pub job: JobName,
    /// The tick (expected fire time).
    #[serde(with = "crate::time::wire")]
    pub tick: DateTime<Utc>,
    /// What became of it.
    pub outcome: TickOutcome,
    /// The instance, when one exists.
    pub instance_id: Option<InstanceId>,
    /// Why, for skipped ticks.
    pub reason: String,
    /// The Scheduler that recorded it.
    pub node: NodeId,
    /// When it was recorded.
    #[serde(with = "crate::time::wire")]
    pub at: DateTime<Utc>,
}

impl TickRecord {
    /// The tick a cron instance's record stands for: fired on time, by its creator, when it
    /// was created (`None` for instances of other triggers, and records of no creator).
    pub fn fired(record: &InstanceRecord) -> Option<TickRecord> {
        if record.trigger != crate::instance::Trigger::Cron {
            return None;
        }
        Some(TickRecord {
            job: record.job.clone(),
            tick: record.expected_time,
            outcome: TickOutcome::Fired,
            instance_id: Some(record.instance_id.clone()),
            reason: String::new(),
            node: record.created_by.clone()?,
            at: record.created_at,
        })
    }
}

/// The instances of one job for one business date, as the DagCoordinator keeps them (bucket
/// `ax_deps`, key `<YYYYMMDD>.<job>`): the latest attempt number and state of each.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DateInstances {
    /// instance id → (attempt, state).
    pub instances: BTreeMap<InstanceId, (u32, State)>,
}

/// An instance held by the DagCoordinator (bucket `ax_waiting`, key instance id).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Waiting {
    /// The attempt waiting.
    pub work: WorkItem,
    /// Since when.
    #[serde(with = "crate::time::wire")]
    pub since: DateTime<Utc>,
    /// For an instance split into shards: the children it waits for.
    #[serde(default)]
    pub children: Option<Vec<InstanceId>>,
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

/// A worker's heartbeat, the value under its id in the workers bucket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// Worker id (`--id`).
    pub id: WorkerId,
    /// Host name.
    pub host: String,
    /// CPU cores.
    pub cores: u32,
    /// Concurrent attempts it runs.
    pub slots: u32,
    /// Its tags.
    pub tags: Vec<String>,
    /// Executor types it offers.
    pub executors: Vec<String>,
    /// What each of its executors says of itself (`describe`).
    #[serde(default)]
    pub described: Vec<ExecutorInfo>,
    /// Attempts running now.
    pub running: u32,
    /// Average duration of the attempts that ended in the last five minutes.
    #[serde(default)]
    pub avg_duration_ms: f64,
    /// Slots kept for higher priorities.
    #[serde(default)]
    pub reserved: Reserved,
    /// How its adaptive budget stands (absent: `slots` is fixed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<SlotBudget>,
    /// The attempts running now (for the Router, should the worker die).
    #[serde(default)]
    pub attempts: Vec<RunningAttempt>,
    /// ax version.
    pub version: String,
    /// When it started.
    #[serde(with = "crate::time::wire")]
    pub started_at: DateTime<Utc>,
}

/// A node's heartbeat, the value under its name in the nodes bucket (shown by `ax nodes`): what
/// it runs and how its actors have fared since the process started.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Node name (`--id`).
    pub node: NodeId,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// The roles it runs.
    pub roles: Vec<String>,
    /// ax version.
    pub version: String,
    /// When the process started.
    #[serde(with = "crate::time::wire")]
    pub started_at: DateTime<Utc>,
    /// When this heartbeat was written.
    #[serde(with = "crate::time::wire")]
    pub seen_at: DateTime<Utc>,
    /// Per actor: panics, restarts, ended pumps and stalls.
    pub actors: BTreeMap<String, ActorHealth>,
    /// What its Scheduler fires (nodes without one: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<SchedulerShare>,
    /// How its Router scores workers and judges them alive (nodes without one: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<crate::routing::RoutingPolicy>,
}

/// A Scheduler's share of the cron jobs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedulerShare {
    /// The partitions it owns.
    pub partitions: Vec<crate::partition::PartitionId>,
    /// The jobs of those partitions in its wheel.
    pub jobs: usize,
}

impl NodeStatus {
    /// One line per actor that restarted, panicked or stalled since the node started (what
    /// `ax nodes` and the console's nodes page show); none when all went well.
    pub fn troubles(&self) -> Vec<String> {
        self.actors
            .iter()
            .filter(|(_, h)| h.panics + h.restarts + h.stalls > 0)
            .map(|(actor, h)| {
                format!(
                    "{actor}: {} restarts, {} panics, {} stalls",
                    h.restarts, h.panics, h.stalls
                )
            })
            .collect()
    }
}

/// What befell one actor of a node since its process started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActorHealth {
    /// Panics caught at its boundaries.
    pub panics: u64,
    /// Restarts by its supervisor.
    pub restarts: u64,
    /// Pumps that ended (NATS away, a subscription closed) and stopped it for a restart.
    pub pump_exits: u64,
    /// Times it left the watchdog's ping unanswered past the stall limit.
    pub stalls: u64,
}

/// An executor as it describes itself (shown by `ax executors`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutorInfo {
    /// The `exec.type` that selects it.
    pub name: String,
    /// `builtin` or `plugin`.
    pub kind: String,
    /// Its version.
    pub version: String,
    /// What it does, in a line.
    pub description: String,
}

/// Where a worker's adaptive budget stands: its bounds, the pressure it last read and why its
/// slots are what they are (`slots` in [`WorkerInfo`] is the budget now).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SlotBudget {
    /// The smallest budget.
    pub min: u32,
    /// The largest budget.
    pub max: u32,
    /// The last decision's reason.
    pub reason: BudgetReason,
    /// Runnable tasks per core on the machine, averaged over the last decision's samples.
    pub load_per_core: f64,
    /// The machine's available memory (`MemAvailable`), the lowest of those samples.
    pub memory_available_bytes: u64,
    /// Dispatches waiting for a slot when it decided.
    pub waiting: u32,
}

/// Why a worker's budget is what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetReason {
    /// No decision yet: the configured `slots`, within the bounds.
    Start,
    /// Shrunk (or kept at its minimum): available memory under `memory_min`.
    MemoryLow,
    /// Shrunk (or kept at its minimum): more runnable tasks per core than `load_high`.
    LoadHigh,
    /// Grown (or kept at its maximum): work waited while the load was under `load_low`.
    Room,
    /// Kept: the load between `load_low` and `load_high`, or nothing waiting.
    Steady,
}

impl BudgetReason {
    /// Its name (`load_high`), as in JSON and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::MemoryLow => "memory_low",
            Self::LoadHigh => "load_high",
            Self::Room => "room",
            Self::Steady => "steady",
        }
    }
}

/// Slots a worker keeps for higher priorities: `low` work may use at most
/// `slots - high - normal` of them, `normal` work at most `slots - high`, `high` work all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reserved {
    /// Kept for high-priority work.
    #[serde(default)]
    pub high: u32,
    /// Kept for normal- and high-priority work.
    #[serde(default)]
    pub normal: u32,
}

/// An attempt a worker runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningAttempt {
    /// The instance.
    pub instance_id: InstanceId,
    /// The attempt.
    pub trace_id: TraceId,
    /// The dispatch it came with.
    pub dispatch: DispatchId,
    /// Its job's `lease` in seconds: no Router hands it to another worker before this worker
    /// has been silent that long (absent: the worker TTL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_secs: Option<u64>,
}

#[cfg(test)]
mod node_status_tests {
    use super::*;

    #[test]
    fn a_node_names_only_the_actors_that_had_trouble() {
        let at = crate::time::now();
        let mut node = NodeStatus {
            node: "n1".parse().unwrap(),
            host: "h".into(),
            pid: 1,
            roles: vec!["scheduler".into()],
            version: "0".into(),
            started_at: at,
            seen_at: at,
            actors: BTreeMap::from([
                ("scheduler".to_string(), ActorHealth::default()),
                (
                    "router".to_string(),
                    ActorHealth {
                        restarts: 2,
                        panics: 1,
                        ..ActorHealth::default()
                    },
                ),
            ]),
            scheduler: None,
            router: None,
        };
        assert_eq!(node.troubles(), ["router: 2 restarts, 1 panics, 0 stalls"]);
        node.actors.clear();
        assert!(node.troubles().is_empty());
    }
}
