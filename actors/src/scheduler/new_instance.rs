//! A new instance and its first attempt, as a Scheduler creates it: the record, the work item
//! handed on, and what the creator needs to know of it (whether it may skip the
//! DagCoordinator, how its tick is recorded).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use ax_bus::instance::Trigger;
use ax_bus::messages::{TickOutcome, WorkItem};
use ax_bus::spec::JobSpec;
use ax_bus::InstanceRecord;

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
        let record = InstanceRecord::first(spec, expected, biz_date, params, trigger, now);
        let work = WorkItem::for_attempt(&record, spec.clone());
        Self {
            record,
            work,
            skip_coordinator: false,
            tick: None,
        }
    }

    /// Where the first attempt is handed on, and under which message id: to the Router, or to
    /// the DagCoordinator when the DAG may concern it. The message id is the attempt's, so a
    /// second hand-off of the same attempt within the de-duplication window is dropped.
    pub(crate) fn hand_off_to(&self, subjects: &ax_bus::Subjects) -> (String, String) {
        let work = &self.work;
        if self.skip_coordinator {
            (
                subjects.ready(work.spec.priority),
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
