//! A new instance and its first attempt, as a Scheduler creates it: the record, the work item
//! handed on, and what the creator needs to know of it (whether it may skip the
//! DagCoordinator, how its tick is recorded).

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use ax_bus::ids::{InstanceId, TraceId, TriggerKey};
use ax_bus::instance::Trigger;
use ax_bus::messages::{TickOutcome, WorkItem};
use ax_bus::spec::{JobSpec, Overlap};
use ax_bus::{InstanceRecord, Tag};

use crate::scheduler::ticks::Tick;

/// A new instance and its first attempt.
#[derive(Clone, Debug)]
pub struct NewInstance {
    /// The record to create.
    pub record: InstanceRecord,
    /// The first attempt.
    pub work: WorkItem,
    /// Whether the attempt goes straight to the Router: only when nothing in the DAG can
    /// concern it (no dependencies, no gate, no job depending on it).
    pub skip_coordinator: bool,
    /// For a cron tick: how it is recorded when created (`fired` or `caught_up`); the overlap
    /// policy applies to ticks only.
    pub tick: Option<TickOutcome>,
    /// A delayed trigger's: its attempt waits for its due time (`expected_time`) in JetStream
    /// instead of being handed on (see the Scheduler's `delayed` module).
    pub delayed: bool,
    /// For a delayed trigger: the job it was created under ([`ax_bus::messages::JobRecord`]'s
    /// `defined_at`), so that a job deleted and applied again does not run it.
    pub defined_at: Option<DateTime<Utc>>,
}

impl NewInstance {
    /// The first attempt of `spec`'s instance expected at `expected`.
    pub fn new(
        spec: &JobSpec,
        expected: DateTime<Utc>,
        biz_date: String,
        params: BTreeMap<String, serde_json::Value>,
        trigger: Trigger,
        now: DateTime<Utc>,
    ) -> Self {
        let spec = Arc::new(spec.clone());
        Self::of_shared(&spec, expected, biz_date, params, trigger, now)
    }

    /// The same, its work item sharing `spec` rather than copying it: how a Scheduler fires
    /// the ticks of the definitions it holds (a definition is copied once, not once a fire).
    pub fn of_shared(
        spec: &Arc<JobSpec>,
        expected: DateTime<Utc>,
        biz_date: String,
        params: BTreeMap<String, serde_json::Value>,
        trigger: Trigger,
        now: DateTime<Utc>,
    ) -> Self {
        let record = InstanceRecord::first(spec, expected, biz_date, params, trigger, now);
        let work = WorkItem::for_attempt(&record, spec.clone());
        Self {
            record,
            work,
            skip_coordinator: false,
            tick: None,
            delayed: false,
            defined_at: None,
        }
    }

    /// The overlap policy its creation applies: its job's for a cron tick, `allow` for
    /// anything else.
    pub(crate) fn overlap(&self) -> Overlap {
        match self.tick {
            Some(_) => self.work.spec.overlap,
            None => Overlap::Allow,
        }
    }

    /// Its tick recorded as `outcome`, for `reason`.
    pub(crate) fn tick_of(&self, outcome: TickOutcome, reason: &str) -> Tick<'_> {
        Tick {
            job: self.work.job(),
            at: self.record.expected_time,
            outcome,
            instance_id: Some(self.record.instance_id.clone()),
            reason: reason.to_string(),
        }
    }

    /// The same instance, due at `due` rather than now: `scheduled` until then.
    pub(crate) fn delayed_until(mut self, due: DateTime<Utc>) -> Self {
        self.record.expected_time = due;
        self.work.expected_time = due;
        self.record.tag = Tag::Scheduled;
        self.record.message = format!("scheduled for {}", ax_bus::time::rfc3339(due));
        self.delayed = true;
        self
    }

    /// The same instance under the id of the trigger command it comes from (its publication
    /// time and stream sequence): one instance per command, however close two commands are.
    pub(crate) fn under_command(self, published: DateTime<Utc>, sequence: u64) -> Self {
        let id = InstanceId::for_command(&self.record.job, published, sequence);
        self.under_id(id)
    }

    /// The same instance under the id of idempotency key `key` (its first attempt's trace id
    /// derived from it, as for a fire): a second trigger with the key finds it created.
    pub(crate) fn under_key(self, key: &TriggerKey) -> Self {
        let id = InstanceId::for_key(&self.record.job, key);
        self.under_id(id)
    }

    /// The same instance under `id` (a one-off's incarnation, see
    /// [`InstanceId::for_incarnation`]).
    pub(crate) fn under_id(mut self, id: InstanceId) -> Self {
        let trace = TraceId::first_of(&id);
        self.record.instance_id = id.clone();
        self.record.trace_id = trace.clone();
        self.work.instance_id = id;
        self.work.trace_id = trace;
        self
    }

    /// The refusal, naming the limit, when the hand-off of this attempt (the work item with the
    /// record it carries) would be larger than the server's `max_payload`: it could never be
    /// sent, so a command that would create it is refused before anything is written.
    pub(crate) fn too_big_for(&self, max_payload: usize) -> Result<(), String> {
        // Headers (content type, message id) and the revision, generously.
        const OVERHEAD: usize = 512;
        let work = ax_bus::codec::encode(&self.work).map_or(usize::MAX, |b| b.len());
        let record = ax_bus::codec::encode(&self.record).map_or(usize::MAX, |b| b.len());
        let bytes = work.saturating_add(record).saturating_add(OVERHEAD);
        if bytes > max_payload {
            Err(format!(
                "an instance of job {} would be handed on in about {bytes} bytes (its definition \
                 and params), more than the NATS server's max_payload of {max_payload}",
                self.work.job()
            ))
        } else {
            Ok(())
        }
    }

    /// Where the first attempt is handed on, and under which message id: to the Router, or to
    /// the DagCoordinator when the DAG may concern it. The message id is the attempt's, so a
    /// second hand-off of the same attempt within the de-duplication window is dropped.
    pub(crate) fn hand_off_to(&self, subjects: &ax_bus::Subjects) -> (String, String) {
        let work = &self.work;
        if self.skip_coordinator {
            (
                subjects.ready_for(work),
                ax_bus::msg_id::ready(&work.trace_id),
            )
        } else {
            (
                subjects.created(work.job()),
                ax_bus::msg_id::created(&work.trace_id),
            )
        }
    }
}
