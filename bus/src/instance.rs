//! Instance records: one per (job, expected fire time), the source of truth for "what happened".
//!
//! - [`State`]: the five states, nothing more;
//! - [`Tag`]: the detail beside the state (`queued`, `dispatched`, `timeout`, ...);
//! - [`InstanceRecord`]: what `ax instance get --json` prints and what events carry;
//! - the transition rules every writer applies before a compare-and-swap, so a stale attempt
//!   can never write over a newer one and a repeated report changes nothing.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{DispatchId, InstanceId, JobName, NodeId, TraceId, WorkerId};
use crate::spec::Priority;

/// The five states of an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Created and not finished: waiting, queued or executing (see the tag).
    Running,
    /// The last attempt succeeded.
    Success,
    /// The last attempt failed and no retry is left.
    Failed,
    /// An attempt failed; another one is scheduled (`next_attempt_at`).
    WaitingRetry,
    /// Stopped without running to the end.
    Cancelled,
}

impl State {
    /// All states.
    pub const ALL: [State; 5] = [
        State::Running,
        State::Success,
        State::Failed,
        State::WaitingRetry,
        State::Cancelled,
    ];

    /// `running`, `success`, `failed`, `waiting_retry` or `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Success => "success",
            State::Failed => "failed",
            State::WaitingRetry => "waiting_retry",
            State::Cancelled => "cancelled",
        }
    }

    /// Whether nothing more will happen to the instance (until a manual re-run).
    pub fn is_final(self) -> bool {
        matches!(self, State::Success | State::Failed | State::Cancelled)
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for State {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        State::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| {
                format!("unknown state `{s}` (running, success, failed, waiting_retry, cancelled)")
            })
    }
}

/// Detail beside the state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tag {
    /// Created, waiting to be routed.
    Queued,
    /// A delayed trigger's instance, waiting for its due time (its `expected_time`).
    Scheduled,
    /// An operator cancelled it (`ax instance cancel`).
    Operator,
    /// An operator gave its verdict (`ax instance mark`).
    Marked,
    /// No live worker can take it; it is dispatched as soon as one appears.
    NoWorker,
    /// A worker claimed the attempt and runs it.
    Executing,
    /// The attempt succeeded.
    Completed,
    /// The process exited with a non-zero code.
    ExitCode,
    /// The process was killed by a signal it did not ask for.
    Killed,
    /// The attempt ran past its timeout; the process group was killed.
    Timeout,
    /// The kernel's OOM killer ended a process of the attempt: it went over its `resources`
    /// memory limit.
    OomKilled,
    /// The executor could not start the work.
    SpawnFailed,
    /// The job was deleted while the instance waited.
    JobDeleted,
    /// Waiting for its dependencies (or for the instance it is queued behind).
    WaitingDeps,
    /// An upstream instance for the same business date failed or was cancelled.
    UpstreamFailed,
    /// It waited for its dependencies longer than `deps_timeout`.
    DepsTimeout,
    /// A newer fire of the job cancelled it (`overlap: cancel_previous`).
    Superseded,
    /// Its worker died during the attempt.
    WorkerLost,
    /// Its shards (or broadcast runs) are running; it ends when they all have.
    Sharded,
    /// Some of its shards (or broadcast runs) failed.
    ShardsFailed,
    /// Its dispatch was delivered as often as allowed without being settled; it was moved to
    /// the dead letters.
    DeadLetter,
    /// Its worker's clock was off the NATS server's by more than `max_clock_skew`.
    ClockSkew,
    /// Its dispatch carried a definition the job registry does not hold (forged, or of a job
    /// deleted or edited more than the registry remembers since): not run, not retried.
    Unregistered,
    /// The counterpart said no: an HTTP status or condition, a SQL error, a plugin's failure.
    Rejected,
    /// The executor could not do its part: not offered by the worker, misconfigured (a
    /// database not in the worker's config), a plugin that crashed or answered garbage.
    ExecutorError,
    /// A tag written by a newer ax.
    #[serde(other)]
    Other,
}

impl Tag {
    /// Every tag but `other` (what a newer version's unknown tag reads as), for the choices of
    /// a filter. The test below matches every variant, so a new tag is added here too.
    pub const ALL: [Tag; 25] = [
        Tag::Queued,
        Tag::Scheduled,
        Tag::WaitingDeps,
        Tag::NoWorker,
        Tag::Executing,
        Tag::Completed,
        Tag::ExitCode,
        Tag::Killed,
        Tag::Timeout,
        Tag::OomKilled,
        Tag::SpawnFailed,
        Tag::Rejected,
        Tag::ExecutorError,
        Tag::Operator,
        Tag::Marked,
        Tag::JobDeleted,
        Tag::UpstreamFailed,
        Tag::DepsTimeout,
        Tag::Superseded,
        Tag::WorkerLost,
        Tag::Sharded,
        Tag::ShardsFailed,
        Tag::DeadLetter,
        Tag::ClockSkew,
        Tag::Unregistered,
    ];

    /// The tag as written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Tag::Queued => "queued",
            Tag::Scheduled => "scheduled",
            Tag::Operator => "operator",
            Tag::Marked => "marked",
            Tag::NoWorker => "no_worker",
            Tag::Executing => "executing",
            Tag::Completed => "completed",
            Tag::ExitCode => "exit_code",
            Tag::Killed => "killed",
            Tag::Timeout => "timeout",
            Tag::OomKilled => "oom_killed",
            Tag::SpawnFailed => "spawn_failed",
            Tag::JobDeleted => "job_deleted",
            Tag::WaitingDeps => "waiting_deps",
            Tag::UpstreamFailed => "upstream_failed",
            Tag::DepsTimeout => "deps_timeout",
            Tag::Superseded => "superseded",
            Tag::WorkerLost => "worker_lost",
            Tag::Sharded => "sharded",
            Tag::ShardsFailed => "shards_failed",
            Tag::DeadLetter => "dead_letter",
            Tag::ClockSkew => "clock_skew",
            Tag::Unregistered => "unregistered",
            Tag::Rejected => "rejected",
            Tag::ExecutorError => "executor_error",
            Tag::Other => "other",
        }
    }
}

impl std::str::FromStr for Tag {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Tag::ALL
            .into_iter()
            .find(|tag| tag.as_str() == s)
            .ok_or_else(|| {
                let all: Vec<&str> = Tag::ALL.iter().map(|t| t.as_str()).collect();
                format!("unknown tag `{s}` ({})", all.join(", "))
            })
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an instance exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// A cron tick.
    Cron,
    /// A cron tick missed while no Scheduler ran, caught up by the misfire policy.
    CatchUp,
    /// `ax job trigger` or a trigger message.
    Manual,
    /// An upstream instance appeared for a job that runs on its dependencies alone.
    Deps,
    /// `ax backfill`.
    Backfill,
}

fn first_attempt() -> u32 {
    1
}

/// The record of one instance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstanceRecord {
    /// Job name + expected fire time.
    pub instance_id: InstanceId,
    /// The current (latest) attempt.
    pub trace_id: TraceId,
    /// The job.
    pub job: JobName,
    /// Business date, YYYY-MM-DD in the job's time zone.
    pub biz_date: String,
    /// 1-based attempt number of `trace_id`.
    pub attempt: u32,
    /// The attempt the current run started with: 1, or the first attempt of a manual re-run
    /// (retries are counted from it).
    #[serde(default = "first_attempt")]
    pub run_start: u32,
    /// One of the five states.
    pub state: State,
    /// Detail beside the state.
    pub tag: Tag,
    /// When the instance was due.
    #[serde(with = "crate::time::wire")]
    pub expected_time: DateTime<Utc>,
    /// When the record was created.
    #[serde(with = "crate::time::wire")]
    pub created_at: DateTime<Utc>,
    /// When the current attempt started executing.
    #[serde(default, with = "crate::time::wire_opt")]
    pub started_at: Option<DateTime<Utc>>,
    /// When the current attempt finished.
    #[serde(default, with = "crate::time::wire_opt")]
    pub finished_at: Option<DateTime<Utc>>,
    /// The worker of the current attempt.
    pub worker: Option<WorkerId>,
    /// Human-readable detail of the current state.
    pub message: String,
    /// Structured output of the last finished attempt (JSON).
    pub output: serde_json::Value,
    /// Why the instance exists.
    pub trigger: Trigger,
    /// Parameters of this instance (the job's, overridden by the trigger's).
    pub params: BTreeMap<String, serde_json::Value>,
    /// The queue it goes through.
    pub priority: Priority,
    /// When the next attempt is due (state `waiting_retry`).
    #[serde(default, with = "crate::time::wire_opt")]
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Exit code of the last process, when there was one.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// Last bytes of the last attempt's stdout.
    #[serde(default)]
    pub stdout_tail: String,
    /// Last bytes of the last attempt's stderr.
    #[serde(default)]
    pub stderr_tail: String,
    /// What the last attempt's processes used, counted in its cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// For a shard: its parent and place.
    #[serde(default)]
    pub shard: Option<ShardRef>,
    /// How many attempts were lost with their worker.
    #[serde(default)]
    pub worker_losses: u32,
    /// The one worker this instance may run on (one run of a broadcast).
    #[serde(default)]
    pub pin: Option<WorkerId>,
    /// The Scheduler that wrote the record, when one did: with `created_at`, how a creator
    /// tells its own record (an earlier try whose ack was lost) from one another Scheduler
    /// wrote for the same fire at the same millisecond.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<NodeId>,
    /// How the current attempt reached the worker running it, written with `executing`: the
    /// instance history's dispatch step, folded into a write that happens anyway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch: Option<DispatchNote>,
    /// A re-dispatch's reservation of an attempt: only that dispatch may start it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved: Option<Reserved>,
    /// The node that wrote this revision of the record (stamped by the client of a node): with
    /// the revision's server time, who did each step of the instance history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_by: Option<NodeId>,
    /// How long the record is kept once it is final, in seconds, decided when the instance is
    /// created (its job's `retention`, else the creating node's `[retention] instances`);
    /// absent (a record of an earlier version): [`crate::client::provision::INSTANCES_MAX_AGE`].
    /// See [`crate::client::retention`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<u64>,
    /// How many times the record was written since it was created as queued work (0: the
    /// creation); absent when it was created otherwise (scheduled, waiting) or an earlier
    /// version wrote it. Counted by every write ([`crate::AxClient::update_instance`]); 1 on
    /// an `executing` record says its only earlier revision is its creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writes: Option<u32>,
    /// On a final record written straight over its creation and its `executing` write: those
    /// two revisions, which this write removed (see [`crate::history`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folded: Option<Folded>,
    /// How many attempts of a job run by its data were started for an input updated again
    /// (`rerun: always | if_succeeded`); at [`MAX_DATA_RERUNS`] no update starts another.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub data_reruns: u32,
    /// When the current attempt became due, where that is not its expected time: the release
    /// of an instance that waited for its dependencies, or that its inputs' updates started
    /// (its expected time is its business date's midnight). Written with `executing`, from
    /// the work item the DagCoordinator released; trigger latency counts from it
    /// ([`crate::figures`]).
    #[serde(
        default,
        with = "crate::time::wire_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub due_at: Option<DateTime<Utc>>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The most attempts one instance of a job run by its data (one job, one business date) starts
/// for its inputs updated again. Datasets can close a loop the registry does not show (an
/// attempt's output may name datasets its job does not `produce`): two jobs each run by the
/// other's output, `rerun: always`, would start each other for ever. This bound ends any such
/// chain; an operator's `ax rerun` is not counted.
pub const MAX_DATA_RERUNS: u32 = 100;

/// The two revisions a final write folded into itself: its creation and the worker's
/// `executing` write, whose steps the final record tells on its own (it keeps every field
/// they told them by), so the store keeps one revision of a finished instance instead of three.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Folded {
    /// The creation's revision.
    pub created: u64,
    /// The `executing` write's revision.
    pub executing: u64,
    /// The node that wrote `executing`, when it is not the worker itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executing_by: Option<NodeId>,
}

/// An attempt reserved for one of its dispatches: the Router re-dispatching an attempt whose
/// first worker never acknowledged writes it, so that the first dispatch can never start it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reserved {
    /// The attempt.
    pub trace_id: TraceId,
    /// The only dispatch that may start it.
    pub dispatch: DispatchId,
}

/// How an attempt reached its worker, as the worker saw its dispatch when it started it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DispatchNote {
    /// The Router that dispatched it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<NodeId>,
    /// When the dispatch was stored (the server's timestamp of the dispatch message).
    #[serde(with = "crate::time::wire")]
    pub at: DateTime<Utc>,
    /// Which delivery of the dispatch message the worker claimed (1 = the first; more: it was
    /// redelivered).
    pub delivery: u64,
    /// The dispatch the worker started (none in records of earlier versions): the only one
    /// of the attempt's dispatches that may run it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch: Option<DispatchId>,
    /// The record's revision the `executing` write was made from: the fence a second dispatch
    /// of the attempt cannot pass.
    pub fence: u64,
    /// When the worker acknowledged the dispatch to its Router.
    #[serde(with = "crate::time::wire")]
    pub acknowledged_at: DateTime<Utc>,
    /// Workers this attempt was dispatched to before, which did not acknowledge it in time or
    /// died: the Router passed them over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passed_over: Vec<WorkerId>,
}

/// A sub-instance of a sharded or broadcast instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRef {
    /// The parent instance.
    pub parent: InstanceId,
    /// The parent's attempt that made this split (a re-run of the parent splits again).
    pub parent_trace: TraceId,
    /// 0-based index (`AX_SHARD_INDEX`).
    pub index: u32,
    /// How many (`AX_SHARD_TOTAL`).
    pub total: u32,
}

/// Why a transition was not applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransitionRefused {
    /// The record belongs to another attempt: the report is stale (or from the future).
    #[error("attempt {reported} is not the current attempt {current}")]
    StaleAttempt {
        /// The trace id of the refused write.
        reported: TraceId,
        /// The record's trace id.
        current: TraceId,
    },
    /// The attempt already ended (a repeated report).
    #[error("attempt already ended in state {0}")]
    AlreadyEnded(State),
    /// A worker already started the attempt; routing news is out of date.
    #[error("attempt already executing")]
    AlreadyStarted,
    /// The attempt is reserved for another of its dispatches (a re-dispatch).
    #[error("attempt reserved for another dispatch")]
    ReservedElsewhere,
    /// A re-run needs an instance that has ended.
    #[error("the instance is still {0}; only an ended instance can be re-run")]
    NotEnded(State),
    /// A delayed instance already released (or never delayed).
    #[error("the instance is {0}, not scheduled")]
    NotScheduled(Tag),
    /// Only an instance cancelled before it was due (its job deleted or its time moved) is
    /// brought back for its job applied again.
    #[error("the instance is {0} ({1}), not withdrawn before its time")]
    NotWithdrawn(State, Tag),
    /// Its latest attempt started after the input's update: it read that data already.
    #[error("its latest attempt started after the update")]
    RanSince,
    /// A re-run for an input's update is only of an instance that succeeded (`rerun:
    /// if_succeeded`).
    #[error("the instance is {0}, not success")]
    NotSucceeded(State),
    /// Someone else ended the attempt while it ran, and its record says what it did already
    /// (or there is nothing to say).
    #[error("the attempt was ended by another ({0}) and its record tells what it did")]
    EndedByAnother(State),
    /// The instance was started again for its inputs' updates as often as one may be.
    #[error(
        "it was started again {0} times for its inputs' updates, the most for one business date"
    )]
    DataRerunsSpent(u32),
}

/// How an attempt ended, as its worker saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttemptEnd {
    /// The attempt.
    pub trace_id: TraceId,
    /// Whether it succeeded.
    pub success: bool,
    /// Tag of the end (`completed`, `exit_code`, `timeout`, ...).
    pub tag: Tag,
    /// Detail.
    pub message: String,
    /// Structured output.
    pub output: serde_json::Value,
    /// The worker.
    pub worker: WorkerId,
    /// When the attempt started executing.
    #[serde(default, with = "crate::time::wire_opt")]
    pub started_at: Option<DateTime<Utc>>,
    /// When it ended.
    #[serde(with = "crate::time::wire")]
    pub finished_at: DateTime<Utc>,
    /// Exit code, when a process ran.
    pub exit_code: Option<i32>,
    /// Last bytes of stdout.
    pub stdout_tail: String,
    /// Last bytes of stderr.
    pub stderr_tail: String,
    /// What its processes used, counted in its cgroup (none where it had none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// What an attempt's processes used, as its cgroup counted them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// CPU time, user and system, of all its processes (milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    /// The most memory its processes held at once (bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
}

impl std::fmt::Display for Usage {
    /// `cpu 1.234 s, peak memory 63.9Mi`; a figure not counted is left out (`-`: neither).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut said = Vec::new();
        if let Some(ms) = self.cpu_ms {
            said.push(format!("cpu {:.3} s", ms as f64 / 1000.0));
        }
        if let Some(bytes) = self.peak_memory_bytes {
            said.push(format!("peak memory {}", crate::room::about(bytes)));
        }
        if said.is_empty() {
            return f.write_str("-");
        }
        f.write_str(&said.join(", "))
    }
}

impl AttemptEnd {
    /// An end at `finished_at` with nothing more to say: no message, output, process or start
    /// (a refusal, a dead letter; the rest set by the caller where there is more).
    pub fn new(
        trace_id: TraceId,
        worker: WorkerId,
        success: bool,
        tag: Tag,
        finished_at: DateTime<Utc>,
    ) -> Self {
        Self {
            trace_id,
            success,
            tag,
            message: String::new(),
            output: serde_json::Value::Null,
            worker,
            started_at: None,
            finished_at,
            exit_code: None,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            usage: None,
        }
    }
}

impl InstanceRecord {
    /// Whether its attempt is executing on a worker: what `kill` stops.
    pub fn executing(&self) -> bool {
        self.state == State::Running && self.tag == Tag::Executing
    }

    /// Whether `cancel` applies: it waits (for its time, dependencies, a worker, a retry) and
    /// has not ended.
    pub fn cancellable(&self) -> bool {
        !self.state.is_final() && !self.executing()
    }

    /// The record of `spec`'s instance expected at `expected`, on its first attempt (tag
    /// `queued`). Its trace id is derived from the instance id ([`TraceId::first_of`]), the same
    /// for every creator: Schedulers racing for a fire all hold the same attempt.
    pub fn first(
        spec: &crate::spec::JobSpec,
        expected: DateTime<Utc>,
        biz_date: String,
        params: BTreeMap<String, serde_json::Value>,
        trigger: Trigger,
        now: DateTime<Utc>,
    ) -> Self {
        let instance_id = InstanceId::for_fire(&spec.name, expected);
        Self {
            trace_id: TraceId::first_of(&instance_id),
            instance_id,
            job: spec.name.clone(),
            biz_date,
            attempt: 1,
            run_start: 1,
            state: State::Running,
            tag: Tag::Queued,
            expected_time: expected,
            created_at: now,
            started_at: None,
            finished_at: None,
            worker: None,
            message: "queued".to_string(),
            output: serde_json::Value::Null,
            trigger,
            params,
            priority: spec.priority,
            next_attempt_at: None,
            exit_code: None,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            usage: None,
            shard: None,
            worker_losses: 0,
            pin: None,
            created_by: None,
            dispatch: None,
            reserved: None,
            written_by: None,
            retention: spec.retention,
            writes: Some(0),
            folded: None,
            data_reruns: 0,
            due_at: None,
        }
    }

    /// How long this record is kept once it is final.
    pub fn kept_for(&self) -> std::time::Duration {
        self.retention
            .map(std::time::Duration::from_secs)
            .unwrap_or(crate::client::provision::INSTANCES_MAX_AGE)
    }

    /// The record of a new attempt under `new_trace`: nothing of the attempt before it is kept
    /// as this one's — its worker, times, exit code, output and tails are in its own revisions
    /// ([`crate::history`]), and shown as its own.
    fn next_attempt(&self, new_trace: &TraceId) -> Self {
        let mut next = self.clone();
        next.trace_id = new_trace.clone();
        next.attempt += 1;
        next.state = State::Running;
        next.tag = Tag::Queued;
        next.next_attempt_at = None;
        next.started_at = None;
        next.finished_at = None;
        next.worker = None;
        next.dispatch = None;
        next.exit_code = None;
        next.output = serde_json::Value::Null;
        next.stdout_tail = String::new();
        next.stderr_tail = String::new();
        next.due_at = None;
        next.usage = None;
        next
    }

    /// Whether this record is attempt `end`'s own end, as `end` wrote it (a repeat of it finds
    /// it so), rather than an end written by someone else while it ran (a kill, a superseding
    /// fire).
    pub fn ended_by(&self, end: &AttemptEnd) -> bool {
        self.trace_id == end.trace_id
            && self.finished_at == Some(end.finished_at)
            && self.message == end.message
    }

    /// What attempt `end` did, added to the record of an instance that someone else ended
    /// while the attempt ran (a kill, a superseding fire, a deleted job): its exit code and
    /// tails (the worker drained them as it stopped the process), and its start if the
    /// record has none. The state, tag, message and end stay those of whoever ended it, and
    /// its result is theirs. Refused for another attempt, another worker, an instance not
    /// ended, and when there is nothing to add.
    pub fn with_facts_of(&self, end: &AttemptEnd) -> Result<Self, TransitionRefused> {
        if self.trace_id != end.trace_id {
            return Err(TransitionRefused::StaleAttempt {
                reported: end.trace_id.clone(),
                current: self.trace_id.clone(),
            });
        }
        if !self.state.is_final() {
            return Err(TransitionRefused::NotEnded(self.state));
        }
        if self.worker.as_ref().is_some_and(|w| *w != end.worker) {
            return Err(TransitionRefused::AlreadyStarted);
        }
        let told = self.exit_code.is_some()
            || !self.stdout_tail.is_empty()
            || !self.stderr_tail.is_empty();
        let nothing = end.exit_code.is_none()
            && end.stdout_tail.is_empty()
            && end.stderr_tail.is_empty()
            && (self.started_at.is_some() || end.started_at.is_none());
        if told || nothing {
            return Err(TransitionRefused::EndedByAnother(self.state));
        }
        let mut next = self.clone();
        next.exit_code = end.exit_code;
        next.stdout_tail = end.stdout_tail.clone();
        next.stderr_tail = end.stderr_tail.clone();
        next.usage = end.usage;
        next.started_at = self.started_at.or(end.started_at);
        Ok(next)
    }

    /// The worker that started attempt `trace_id`, if it is the current one and executing.
    pub fn started_by(&self, trace_id: &TraceId) -> Option<&WorkerId> {
        let started = self.trace_id == *trace_id
            && self.state == State::Running
            && self.tag == Tag::Executing;
        self.worker.as_ref().filter(|_| started)
    }

    /// Whether attempt `trace_id` is the current one and no dispatch has started it yet: what
    /// a re-dispatch of it is still for.
    pub fn awaits_start(&self, trace_id: &TraceId) -> bool {
        self.trace_id == *trace_id && self.state == State::Running && self.tag != Tag::Executing
    }

    fn check_current(&self, trace_id: &TraceId) -> Result<(), TransitionRefused> {
        if self.trace_id != trace_id {
            return Err(TransitionRefused::StaleAttempt {
                reported: trace_id.clone(),
                current: self.trace_id.clone(),
            });
        }
        if self.state != State::Running {
            return Err(TransitionRefused::AlreadyEnded(self.state));
        }
        Ok(())
    }

    /// The Router found no live worker for the current attempt (`why`, where it is more than
    /// none offering its executor and tags: no room for its resources); it keeps trying.
    pub fn no_worker(
        &self,
        trace_id: &TraceId,
        why: Option<&str>,
    ) -> Result<Self, TransitionRefused> {
        self.check_current(trace_id)?;
        if self.tag == Tag::Executing {
            return Err(TransitionRefused::AlreadyStarted);
        }
        let mut next = self.clone();
        next.tag = Tag::NoWorker;
        next.message = why
            .unwrap_or("no live worker offers this job's executor and tags")
            .into();
        Ok(next)
    }

    /// The current attempt waits to be routed for `why` (its namespace's quota of running
    /// attempts); refused once it started.
    pub fn held(&self, trace_id: &TraceId, why: &str) -> Result<Self, TransitionRefused> {
        self.check_current(trace_id)?;
        if self.tag == Tag::Executing {
            return Err(TransitionRefused::AlreadyStarted);
        }
        let mut next = self.clone();
        next.tag = Tag::Queued;
        next.message = why.into();
        Ok(next)
    }

    /// A worker started the current attempt, which reached it as `dispatch` says; refused
    /// once any dispatch of the attempt started it.
    pub fn started(
        &self,
        trace_id: &TraceId,
        worker: &WorkerId,
        at: DateTime<Utc>,
        dispatch: &DispatchNote,
    ) -> Result<Self, TransitionRefused> {
        self.check_current(trace_id)?;
        if self.tag == Tag::Executing {
            // The `executing` write is the attempt's fence: one dispatch passes it, once.
            return Err(TransitionRefused::AlreadyStarted);
        }
        if let Some(reserved) = &self.reserved {
            if reserved.trace_id == *trace_id
                && dispatch.dispatch.as_ref() != Some(&reserved.dispatch)
            {
                return Err(TransitionRefused::ReservedElsewhere);
            }
        }
        let mut next = self.clone();
        // Spent: the record names the dispatch that started the attempt from now on.
        next.reserved = None;
        next.tag = Tag::Executing;
        next.worker = Some(worker.clone());
        next.started_at = Some(at);
        next.dispatch = Some(dispatch.clone());
        next.message = format!("executing on {worker}");
        Ok(next)
    }

    /// The current attempt, not started yet, is reserved for the re-dispatch `dispatch`.
    pub fn reserved_for(
        &self,
        trace_id: &TraceId,
        dispatch: &DispatchId,
    ) -> Result<Self, TransitionRefused> {
        self.check_current(trace_id)?;
        if self.tag == Tag::Executing {
            return Err(TransitionRefused::AlreadyStarted);
        }
        let mut next = self.clone();
        next.reserved = Some(Reserved {
            trace_id: trace_id.clone(),
            dispatch: dispatch.clone(),
        });
        Ok(next)
    }

    /// The current attempt ended, as reported by the worker that started it (or, refused
    /// before it started, by any). `retry_at` is when the next attempt runs, if one is left.
    pub fn ended(
        &self,
        end: &AttemptEnd,
        retry_at: Option<DateTime<Utc>>,
    ) -> Result<Self, TransitionRefused> {
        self.check_current(&end.trace_id)?;
        if self.tag == Tag::Executing && self.worker.as_ref() != Some(&end.worker) {
            // Another dispatch of the attempt started it there: only that worker ends it (a
            // second dispatch refused, say for a skewed clock, must not end it here).
            return Err(TransitionRefused::AlreadyStarted);
        }
        let mut next = self.clone();
        next.state = match (end.success, retry_at) {
            (true, _) => State::Success,
            (false, Some(_)) => State::WaitingRetry,
            (false, None) => State::Failed,
        };
        next.next_attempt_at = if end.success { None } else { retry_at };
        next.tag = end.tag;
        next.message = end.message.clone();
        next.output = end.output.clone();
        next.worker = Some(end.worker.clone());
        next.started_at = end.started_at.or(self.started_at);
        next.finished_at = Some(end.finished_at);
        next.exit_code = end.exit_code;
        next.stdout_tail = end.stdout_tail.clone();
        next.stderr_tail = end.stderr_tail.clone();
        next.usage = end.usage;
        Ok(next)
    }

    /// The current attempt was split into `children` sub-instances.
    pub fn split(&self, trace_id: &TraceId, children: usize) -> Result<Self, TransitionRefused> {
        self.check_current(trace_id)?;
        let mut next = self.clone();
        next.tag = Tag::Sharded;
        next.message = format!("split into {children}; ends when they all have");
        Ok(next)
    }

    /// The current attempt waits for its dependencies.
    pub fn waiting(&self, trace_id: &TraceId, message: &str) -> Result<Self, TransitionRefused> {
        self.check_current(trace_id)?;
        if self.tag != Tag::Queued && self.tag != Tag::WaitingDeps {
            return Err(TransitionRefused::AlreadyStarted);
        }
        let mut next = self.clone();
        next.tag = Tag::WaitingDeps;
        next.message = message.to_string();
        Ok(next)
    }

    /// The worker of the current attempt died: the instance moves to a new attempt under
    /// `new_trace` (not counted against its retries), or fails with tag `worker_lost` once
    /// `max_losses` attempts have been lost this way.
    pub fn worker_lost(
        &self,
        trace_id: &TraceId,
        new_trace: &TraceId,
        worker: &WorkerId,
        max_losses: u32,
    ) -> Result<Self, TransitionRefused> {
        self.check_current(trace_id)?;
        let mut next = self.clone();
        next.worker_losses += 1;
        if next.worker_losses > max_losses {
            next.state = State::Failed;
            next.tag = Tag::WorkerLost;
            next.message = format!(
                "worker {worker} died during attempt {}; {} attempts lost, giving up",
                self.attempt, next.worker_losses
            );
            next.finished_at = Some(crate::time::now());
            return Ok(next);
        }
        let mut next = next.next_attempt(new_trace);
        next.run_start += 1;
        next.message = format!(
            "worker {worker} died during attempt {}; attempt {} queued",
            self.attempt, next.attempt
        );
        Ok(next)
    }

    /// A manual re-run: a new attempt of an instance that has ended.
    pub fn rerun(&self, new_trace: &TraceId) -> Result<Self, TransitionRefused> {
        if !self.state.is_final() {
            return Err(TransitionRefused::NotEnded(self.state));
        }
        let mut next = self.next_attempt(new_trace);
        next.run_start = next.attempt;
        next.message = format!("re-run: attempt {} queued", next.attempt);
        Ok(next)
    }

    /// A new attempt of a job run by its data, for an input updated again at `updated_at`:
    /// refused when its latest attempt started at or after that (it read the data already —
    /// a redelivered or an older update), when it has not ended, with `only_success` when it
    /// did not succeed, and when it was started again [`MAX_DATA_RERUNS`] times already.
    pub fn rerun_for_update(
        &self,
        new_trace: &TraceId,
        updated_at: DateTime<Utc>,
        only_success: bool,
    ) -> Result<Self, TransitionRefused> {
        if self.started_at.unwrap_or(self.created_at) >= updated_at {
            return Err(TransitionRefused::RanSince);
        }
        if only_success && self.state.is_final() && self.state != State::Success {
            return Err(TransitionRefused::NotSucceeded(self.state));
        }
        if self.data_reruns >= MAX_DATA_RERUNS {
            return Err(TransitionRefused::DataRerunsSpent(self.data_reruns));
        }
        let mut next = self.rerun(new_trace)?;
        next.data_reruns += 1;
        next.message = format!(
            "re-run: attempt {} queued, an input updated at {}",
            next.attempt,
            crate::time::rfc3339(updated_at)
        );
        Ok(next)
    }

    /// A one-off job's instance brought back for the job applied again: a new attempt,
    /// `scheduled` for the same instant, of an instance that was cancelled before it was due
    /// (its job deleted, or its `at` moved away and back). The attempts before stay in its
    /// history.
    pub fn rearmed(&self, new_trace: &TraceId, why: &str) -> Result<Self, TransitionRefused> {
        if self.state != State::Cancelled || !matches!(self.tag, Tag::JobDeleted | Tag::Superseded)
        {
            return Err(TransitionRefused::NotWithdrawn(self.state, self.tag));
        }
        let mut next = self.next_attempt(new_trace);
        next.run_start = next.attempt;
        next.tag = Tag::Scheduled;
        next.message = format!(
            "scheduled for {}: {why}",
            crate::time::rfc3339(self.expected_time)
        );
        Ok(next)
    }

    /// The instance ends without its current attempt running to the end: `cancelled` (an
    /// upstream failed, a newer fire superseded it, its job was deleted) or `failed` (it waited
    /// for its dependencies too long).
    pub fn ended_early(
        &self,
        trace_id: &TraceId,
        state: State,
        tag: Tag,
        message: &str,
    ) -> Result<Self, TransitionRefused> {
        if self.trace_id != trace_id {
            return Err(TransitionRefused::StaleAttempt {
                reported: trace_id.clone(),
                current: self.trace_id.clone(),
            });
        }
        if self.state.is_final() {
            return Err(TransitionRefused::AlreadyEnded(self.state));
        }
        let mut next = self.clone();
        next.state = state;
        next.tag = tag;
        next.message = message.to_string();
        next.next_attempt_at = None;
        next.finished_at = Some(crate::time::now());
        Ok(next)
    }

    /// An operator's verdict (`success` or `failed`) on an ended or waiting instance: not on an
    /// executing one, nor one already in that state.
    pub fn marked(&self, state: State, message: &str) -> Result<Self, TransitionRefused> {
        if self.state == State::Running && self.tag == Tag::Executing {
            return Err(TransitionRefused::AlreadyStarted);
        }
        if self.state == state {
            return Err(TransitionRefused::AlreadyEnded(state));
        }
        let mut next = self.clone();
        next.state = state;
        next.tag = Tag::Marked;
        next.message = message.to_string();
        next.next_attempt_at = None;
        next.finished_at = Some(crate::time::now());
        Ok(next)
    }

    /// A delayed instance's first attempt, due now: queued for routing. `late_ms` is how long
    /// after its due time it was released (recorded when it is more than a second).
    pub fn released(&self, trace_id: &TraceId, late_ms: i64) -> Result<Self, TransitionRefused> {
        self.check_current(trace_id)?;
        if self.tag != Tag::Scheduled {
            return Err(TransitionRefused::NotScheduled(self.tag));
        }
        let mut next = self.clone();
        next.tag = Tag::Queued;
        next.message = if late_ms > 1000 {
            format!("queued, released {late_ms} ms after its due time")
        } else {
            "queued".to_string()
        };
        Ok(next)
    }

    /// The next attempt starts (from `waiting_retry`), under a new trace id.
    pub fn retried(
        &self,
        from_trace: &TraceId,
        new_trace: &TraceId,
    ) -> Result<Self, TransitionRefused> {
        if self.trace_id != from_trace {
            return Err(TransitionRefused::StaleAttempt {
                reported: from_trace.clone(),
                current: self.trace_id.clone(),
            });
        }
        if self.state != State::WaitingRetry {
            return Err(TransitionRefused::AlreadyEnded(self.state));
        }
        let mut next = self.next_attempt(new_trace);
        next.message = format!("attempt {} queued", next.attempt);
        Ok(next)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Trace `n`: a valid trace id per number.
    pub(crate) fn tr(n: u8) -> TraceId {
        TraceId::parse(&format!("{n:032x}")).unwrap()
    }

    /// A queued first attempt, expected now.
    pub(crate) fn record() -> InstanceRecord {
        let t = crate::time::now();
        InstanceRecord {
            instance_id: InstanceId::parse("j.20260101T000000000Z").unwrap(),
            trace_id: tr(1),
            job: JobName::parse("j").unwrap(),
            biz_date: "2026-01-01".into(),
            attempt: 1,
            run_start: 1,
            state: State::Running,
            tag: Tag::Queued,
            expected_time: t,
            created_at: t,
            started_at: None,
            finished_at: None,
            worker: None,
            message: String::new(),
            output: serde_json::Value::Null,
            trigger: Trigger::Cron,
            params: BTreeMap::new(),
            priority: Priority::Normal,
            next_attempt_at: None,
            exit_code: None,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            shard: None,
            worker_losses: 0,
            pin: None,
            created_by: None,
            dispatch: None,
            reserved: None,
            written_by: None,
            retention: None,
            writes: Some(0),
            folded: None,
            data_reruns: 0,
            due_at: None,
            usage: None,
        }
    }

    fn end(trace: TraceId, success: bool) -> AttemptEnd {
        let tag = [Tag::ExitCode, Tag::Completed][usize::from(success)];
        AttemptEnd {
            output: serde_json::json!({"rows": 3}),
            exit_code: Some(i32::from(!success)),
            ..AttemptEnd::new(
                trace,
                WorkerId::parse("w1").unwrap(),
                success,
                tag,
                crate::time::now(),
            )
        }
    }

    /// How dispatch `dispatch` reached its worker, as a test needs it.
    fn note_of(dispatch: &DispatchId) -> DispatchNote {
        DispatchNote {
            router: None,
            at: crate::time::now(),
            delivery: 1,
            dispatch: Some(dispatch.clone()),
            fence: 1,
            acknowledged_at: crate::time::now(),
            passed_over: Vec::new(),
        }
    }

    #[test]
    fn a_stale_or_repeated_report_is_refused() {
        let r = record();
        assert!(matches!(
            r.ended(&end(tr(0), true), None),
            Err(TransitionRefused::StaleAttempt { .. })
        ));
        let done = r.ended(&end(tr(1), true), None).unwrap();
        assert_eq!(done.state, State::Success);
        assert_eq!(done.output["rows"], 3);
        assert_eq!(
            done.ended(&end(tr(1), false), None),
            Err(TransitionRefused::AlreadyEnded(State::Success))
        );
    }

    #[test]
    fn an_attempt_starts_once_whatever_dispatch_of_it_comes_second() {
        let note = note_of(&DispatchId::random());
        let w1 = WorkerId::parse("w1").unwrap();
        let started = record().started(&tr(1), &w1, crate::time::now(), &note);
        let started = started.unwrap();
        assert_eq!(started.tag, Tag::Executing);
        assert!(record().awaits_start(&tr(1)) && !started.awaits_start(&tr(1)));
        assert_eq!(started.started_by(&tr(1)), Some(&w1));
        assert_eq!(started.started_by(&tr(2)), None);
        let w2 = WorkerId::parse("w2").unwrap();
        for worker in [&w1, &w2] {
            assert_eq!(
                started.started(&tr(1), worker, crate::time::now(), &note),
                Err(TransitionRefused::AlreadyStarted)
            );
        }
        // Ended only by the worker that started it.
        let mut elsewhere = end(tr(1), false);
        elsewhere.worker = w2;
        assert_eq!(
            started.ended(&elsewhere, None),
            Err(TransitionRefused::AlreadyStarted)
        );
        assert_eq!(
            started.ended(&end(tr(1), true), None).unwrap().state,
            State::Success
        );
    }

    #[test]
    fn a_reserved_attempt_starts_only_with_its_reserved_dispatch() {
        let note = note_of;
        let (first, second) = (DispatchId::random(), DispatchId::random());
        let reserved = record().reserved_for(&tr(1), &second).unwrap();
        let w1 = WorkerId::parse("w1").unwrap();
        assert_eq!(
            reserved.started(&tr(1), &w1, crate::time::now(), &note(&first)),
            Err(TransitionRefused::ReservedElsewhere)
        );
        let started = reserved.started(&tr(1), &w1, crate::time::now(), &note(&second));
        let started = started.unwrap();
        assert_eq!(started.reserved, None, "spent once the attempt starts");
        // Once started, nothing can be reserved any more; a reservation of an earlier attempt
        // does not bind a later one.
        assert_eq!(
            started.reserved_for(&tr(1), &first),
            Err(TransitionRefused::AlreadyStarted)
        );
        let mut later = reserved.clone();
        later.trace_id = tr(2);
        assert!(later
            .started(&tr(2), &w1, crate::time::now(), &note(&first))
            .is_ok());
    }

    #[test]
    fn a_failure_with_a_retry_left_waits_then_moves_to_a_new_attempt() {
        let at = crate::time::now();
        let waiting = record().ended(&end(tr(1), false), Some(at)).unwrap();
        assert_eq!(waiting.state, State::WaitingRetry);
        assert_eq!(waiting.next_attempt_at, Some(at));
        assert!(waiting.retried(&tr(0), &tr(2)).is_err());
        let second = waiting.retried(&tr(1), &tr(2)).unwrap();
        assert_eq!(
            (second.attempt, second.state, &second.trace_id),
            (2, State::Running, &tr(2))
        );
        // The old attempt can no longer report.
        assert!(second.ended(&end(tr(1), true), None).is_err());
    }

    #[test]
    fn a_new_attempt_shows_nothing_of_the_attempt_before_it_as_its_own() {
        let mut failed = end(tr(1), false);
        failed.exit_code = Some(3);
        failed.stdout_tail = "attempt 1 says hi\n".into();
        failed.stderr_tail = "a1 fails\n".into();
        let waiting = record().ended(&failed, Some(crate::time::now())).unwrap();
        let second = waiting.retried(&tr(1), &tr(2)).unwrap();
        assert_eq!(second.exit_code, None);
        assert_eq!(
            (second.stdout_tail.as_str(), second.stderr_tail.as_str()),
            ("", "")
        );
        assert_eq!(second.output, serde_json::Value::Null);
        assert_eq!(
            (second.started_at, second.finished_at, &second.worker),
            (None, None, &None)
        );
        // A re-run of the failed instance starts clean too.
        let again = record()
            .ended(&failed, None)
            .unwrap()
            .rerun(&tr(3))
            .unwrap();
        assert_eq!((again.exit_code, again.stdout_tail.as_str()), (None, ""));
    }

    #[test]
    fn an_attempt_ended_by_a_kill_gets_its_own_exit_and_tails_once() {
        let note = note_of(&DispatchId::random());
        let w1 = WorkerId::parse("w1").unwrap();
        let running = record()
            .started(&tr(1), &w1, crate::time::now(), &note)
            .unwrap();
        let killed = running
            .ended_early(&tr(1), State::Failed, Tag::Killed, "killed by op: test")
            .unwrap();
        let mut stopped = end(tr(1), false);
        stopped.tag = Tag::Killed;
        stopped.exit_code = None;
        stopped.stdout_tail = "attempt 2 says hi\n".into();
        assert!(!killed.ended_by(&stopped));
        assert_eq!(
            killed.ended(&stopped, None),
            Err(TransitionRefused::AlreadyEnded(State::Failed))
        );
        let told = killed.with_facts_of(&stopped).unwrap();
        assert_eq!(
            (
                told.state,
                told.tag,
                told.message.as_str(),
                told.finished_at
            ),
            (
                State::Failed,
                Tag::Killed,
                "killed by op: test",
                killed.finished_at
            ),
            "the kill's end stays"
        );
        assert_eq!(told.stdout_tail, "attempt 2 says hi\n");
        // Told once; never for another attempt or another worker.
        assert_eq!(
            told.with_facts_of(&stopped),
            Err(TransitionRefused::EndedByAnother(State::Failed))
        );
        let mut stale = stopped.clone();
        stale.trace_id = tr(9);
        assert!(killed.with_facts_of(&stale).is_err());
        let mut elsewhere = stopped.clone();
        elsewhere.worker = WorkerId::parse("w2").unwrap();
        assert_eq!(
            killed.with_facts_of(&elsewhere),
            Err(TransitionRefused::AlreadyStarted)
        );
        // The worker's own end is its own.
        let own = running.ended(&stopped, None).unwrap();
        assert!(own.ended_by(&stopped));
    }

    #[test]
    fn only_an_instance_withdrawn_before_its_time_is_brought_back() {
        let mut waiting = record();
        waiting.tag = Tag::Scheduled;
        let refused = |r: &InstanceRecord| r.rearmed(&tr(2), "applied again").unwrap_err();
        assert_eq!(
            refused(&waiting),
            TransitionRefused::NotWithdrawn(State::Running, Tag::Scheduled)
        );
        let deleted = waiting
            .ended_early(
                &tr(1),
                State::Cancelled,
                Tag::JobDeleted,
                "its job was deleted",
            )
            .unwrap();
        let back = deleted
            .rearmed(&tr(2), "its job was applied again")
            .unwrap();
        assert_eq!(
            (
                back.attempt,
                back.run_start,
                back.state,
                back.tag,
                &back.trace_id
            ),
            (2, 2, State::Running, Tag::Scheduled, &tr(2))
        );
        assert_eq!(back.expected_time, waiting.expected_time);
        assert!(
            back.message.ends_with(": its job was applied again"),
            "{}",
            back.message
        );
        // The old attempt's release is refused; the new one's passes.
        assert!(back.released(&tr(1), 0).is_err());
        assert!(back.released(&tr(2), 0).is_ok());
        let moved = waiting
            .ended_early(&tr(1), State::Cancelled, Tag::Superseded, "its `at` moved")
            .unwrap();
        assert!(moved.rearmed(&tr(2), "moved back").is_ok());
        // Anything else that ended (it ran, an operator cancelled it) stays as it is.
        for (state, tag) in [
            (State::Cancelled, Tag::Operator),
            (State::Success, Tag::Completed),
            (State::Failed, Tag::ExitCode),
        ] {
            let mut ended = waiting.clone();
            (ended.state, ended.tag) = (state, tag);
            assert_eq!(refused(&ended), TransitionRefused::NotWithdrawn(state, tag));
        }
    }

    #[test]
    fn states_and_tags_are_snake_case_on_the_wire() {
        assert_eq!(
            serde_json::to_string(&State::WaitingRetry).unwrap(),
            "\"waiting_retry\""
        );
        assert_eq!(
            serde_json::to_string(&Tag::NoWorker).unwrap(),
            "\"no_worker\""
        );
        assert_eq!(
            serde_json::from_str::<Tag>("\"from_the_future\"").unwrap(),
            Tag::Other
        );
        assert_eq!("failed".parse::<State>(), Ok(State::Failed));
        assert!("done".parse::<State>().is_err());
    }
    #[test]
    fn an_inputs_update_reruns_only_an_ended_date_that_ran_before_it() {
        let start = crate::time::now();
        let mut ran = record();
        ran.started_at = Some(start);
        ran.state = State::Success;
        let later = start + chrono::Duration::seconds(5);
        let next = ran.rerun_for_update(&tr(2), later, true).unwrap();
        assert_eq!((next.attempt, next.trace_id.clone()), (2, tr(2)));
        assert!(
            next.message.contains("an input updated at"),
            "{}",
            next.message
        );
        // An update it had read already (redelivered, or older): nothing.
        assert_eq!(
            ran.rerun_for_update(&tr(2), start, false),
            Err(TransitionRefused::RanSince)
        );
        // Still running: nothing.
        let mut running = ran.clone();
        running.state = State::Running;
        assert!(matches!(
            running.rerun_for_update(&tr(2), later, false),
            Err(TransitionRefused::NotEnded(State::Running))
        ));
        // Failed: with `if_succeeded` nothing, with `always` a new attempt.
        let mut failed = ran.clone();
        failed.state = State::Failed;
        assert_eq!(
            failed.rerun_for_update(&tr(2), later, true),
            Err(TransitionRefused::NotSucceeded(State::Failed))
        );
        assert!(failed.rerun_for_update(&tr(2), later, false).is_ok());
    }
}

#[cfg(test)]
mod tag_tests {
    use super::Tag;

    #[test]
    fn every_tag_is_listed_once() {
        // Exhaustive: a new variant does not compile until it is placed here and in ALL.
        let listed = |tag: Tag| match tag {
            Tag::Other => false,
            Tag::Queued
            | Tag::Scheduled
            | Tag::Operator
            | Tag::Marked
            | Tag::NoWorker
            | Tag::Executing
            | Tag::Completed
            | Tag::ExitCode
            | Tag::Killed
            | Tag::Timeout
            | Tag::OomKilled
            | Tag::SpawnFailed
            | Tag::JobDeleted
            | Tag::WaitingDeps
            | Tag::UpstreamFailed
            | Tag::DepsTimeout
            | Tag::Superseded
            | Tag::WorkerLost
            | Tag::Sharded
            | Tag::ShardsFailed
            | Tag::DeadLetter
            | Tag::ClockSkew
            | Tag::Unregistered
            | Tag::Rejected
            | Tag::ExecutorError => true,
        };
        let mut names: Vec<&str> = Tag::ALL.iter().map(|t| t.as_str()).collect();
        assert!(Tag::ALL.iter().all(|t| listed(*t)));
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Tag::ALL.len(), "a tag listed twice");
    }
}
