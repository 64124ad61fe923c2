//! The hand-offs of an attempt, created → ready → dispatch ([`WorkItem`]), and what the actors
//! keep about work on its way: delayed triggers, ticks, instances waiting for their
//! dependencies, dispatches and their acknowledgements, reservations.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{DispatchId, InstanceId, JobName, NodeId, TraceId, WorkerId};
use crate::instance::ShardRef;
use crate::instance::{InstanceRecord, State};
use crate::spec::JobSpec;

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
    /// Whether the worker tells its Router when the attempt ends (in [`DispatchAcks`]): set by
    /// a Router that sends it while namespaces contend for full workers, to hand the freed
    /// slot on at once. Absent from older messages (false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tell_end: bool,
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
            tell_end: false,
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
            tell_end: false,
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
    /// The job it was created under ([`super::JobRecord::defined_at`]): released only while the
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
    /// The attempts of this Router's that ended on the worker, whose dispatch asked to hear
    /// of it ([`WorkItem::tell_end`]): the Router holding namespaces' work back for room hands
    /// the freed slot on at once, not at the next heartbeat.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ended: Vec<DispatchAck>,
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
    /// For the note of a day of a job nothing depends on (no instances listed: they are read
    /// from their records, see [`crate::client::deps`]), when its first instance was noted.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::time::wire_opt"
    )]
    pub noted_at: Option<DateTime<Utc>>,
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
