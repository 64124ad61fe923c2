//! The instance history (`ax instance history`): every step of every attempt, in order, each
//! with its time and node — the article's first troubleshooting question (how many times was
//! this attempt dispatched, to which workers, at what intervals).
//!
//! - [`Revision`]: one stored version of an instance record, with the server's time of it;
//! - [`History::of`]: the steps the revisions tell, in order;
//! - [`Step`], [`StepKind`]: one step.
//!
//! Nothing is written for the history: it is read from what is written anyway. The instances
//! bucket keeps the last [`crate::client::provision::RECORD_REVISIONS`] revisions of each
//! record, every writer stamps the revision with its node (`written_by`), and the one step
//! that has no write of its own — the dispatch, its deliveries and the workers passed over —
//! is folded into the worker's `executing` write ([`DispatchNote`]). So the history costs no
//! message on the hot path, and lasts as long as the record does. Times are the server's
//! (the revision's timestamp) except where only a node knew the moment (the end of the
//! attempt on its worker, the acknowledgement).
//!
//! Most instances go straight from their creation to a worker and end there: their final
//! record keeps every field the two earlier revisions told their steps by (the creator, the
//! trigger, the dispatch note, the start), so the final write folds them into itself
//! ([`prepare_write`], [`Folded`]) and replaces them in the store: one revision of a finished
//! instance is kept instead of three. Such a history is told the same, except that its
//! creation is timed by the creator's clock (`created_at`) instead of the server's. An instance with any other write (a release,
//! a retry, a reservation, an operator's) keeps every revision.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{InstanceId, NodeId, TraceId, WorkerId};
use crate::instance::{DispatchNote, Folded, InstanceRecord, State, Tag};

/// One stored version of an instance record.
#[derive(Clone, Debug, PartialEq)]
pub struct Revision {
    /// Its revision in the instances bucket.
    pub revision: u64,
    /// When the server stored it.
    pub at: DateTime<Utc>,
    /// The record as written.
    pub record: InstanceRecord,
}

/// What happened at a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// The instance was created (which node, which trigger).
    Created,
    /// A delayed instance fell due, or the DagCoordinator released a waiting one.
    Released,
    /// It waits for its dependencies (or the instance it is queued behind).
    WaitingDeps,
    /// No live worker could take it.
    NoWorker,
    /// A Router sent the attempt to a worker (the delivery the worker claimed).
    Dispatched,
    /// The worker claimed the attempt (its fence) and acknowledged the dispatch.
    Claimed,
    /// The worker started the attempt.
    Started,
    /// The attempt was split into shards (or broadcast runs).
    Split,
    /// The attempt ended on its worker (outcome, exit code).
    Ended,
    /// The outcome was recorded (the worker's report reached the record).
    Reported,
    /// A failed attempt's retry was scheduled (its due time).
    RetryScheduled,
    /// A retry's attempt was queued, under a new trace.
    Retried,
    /// The attempt was lost with its worker; a new one was queued (or the instance failed).
    Lost,
    /// A manual re-run queued a new attempt.
    Rerun,
    /// Cancelled (an operator, an upstream that failed, its job deleted, superseded).
    Cancelled,
    /// Killed (by an operator, or by a signal on its worker).
    Killed,
    /// An operator's verdict (`ax instance mark`).
    Marked,
    /// Any other change of the record.
    Updated,
}

impl StepKind {
    /// The step as written (`created`, `dispatched`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Created => "created",
            StepKind::Released => "released",
            StepKind::WaitingDeps => "waiting_deps",
            StepKind::NoWorker => "no_worker",
            StepKind::Dispatched => "dispatched",
            StepKind::Claimed => "claimed",
            StepKind::Started => "started",
            StepKind::Split => "split",
            StepKind::Ended => "ended",
            StepKind::Reported => "reported",
            StepKind::RetryScheduled => "retry_scheduled",
            StepKind::Retried => "retried",
            StepKind::Lost => "lost",
            StepKind::Rerun => "rerun",
            StepKind::Cancelled => "cancelled",
            StepKind::Killed => "killed",
            StepKind::Marked => "marked",
            StepKind::Updated => "updated",
        }
    }
}

/// One step of an instance's history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// When it happened.
    #[serde(with = "crate::time::wire")]
    pub at: DateTime<Utc>,
    /// What happened.
    pub step: StepKind,
    /// The node that did it, when known.
    pub node: Option<NodeId>,
    /// The attempt it belongs to (1-based).
    pub attempt: u32,
    /// That attempt's trace id.
    pub trace_id: TraceId,
    /// The worker concerned, if any.
    pub worker: Option<WorkerId>,
    /// The record's state after the step.
    pub state: State,
    /// The record's tag after the step.
    pub tag: Tag,
    /// What there is to say about it, on one line.
    pub detail: String,
    /// The record's revision that tells it (a dispatch and a claim are told by the worker's
    /// `executing` revision).
    pub revision: u64,
}

/// An instance's history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct History {
    /// The instance.
    pub instance_id: InstanceId,
    /// Whether the oldest steps are gone: the record was written more often than the bucket
    /// keeps revisions, and the history starts at the oldest one kept.
    pub truncated: bool,
    /// The steps, oldest first.
    pub steps: Vec<Step>,
    /// Each attempt as its own last revision tells it, oldest first: its outcome, never
    /// another attempt's.
    #[serde(default)]
    pub attempts: Vec<Attempt>,
}

/// One attempt of an instance, as the last revision written under its trace id tells it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// Its number (1-based).
    pub attempt: u32,
    /// Its trace id.
    pub trace_id: TraceId,
    /// The instance's state when the attempt's last revision was written (`waiting_retry`
    /// for a failure that was retried).
    pub state: State,
    /// Its tag then.
    pub tag: Tag,
    /// The worker that ran it, if one did.
    pub worker: Option<WorkerId>,
    /// When it started executing.
    #[serde(default, with = "crate::time::wire_opt")]
    pub started_at: Option<DateTime<Utc>>,
    /// When it ended.
    #[serde(default, with = "crate::time::wire_opt")]
    pub finished_at: Option<DateTime<Utc>>,
    /// Its exit code, when a process of it exited.
    pub exit_code: Option<i32>,
    /// What was said of it last.
    pub message: String,
    /// The last bytes of its stderr.
    pub stderr_tail: String,
    /// What its processes used, where its worker counted it (see [`crate::Usage`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::Usage>,
}

impl Attempt {
    fn of(record: &InstanceRecord) -> Self {
        Self {
            attempt: record.attempt,
            trace_id: record.trace_id.clone(),
            state: record.state,
            tag: record.tag,
            worker: record.worker.clone(),
            started_at: record.started_at,
            finished_at: record.finished_at,
            exit_code: record.exit_code,
            message: record.message.clone(),
            stderr_tail: record.stderr_tail.clone(),
            usage: record.usage,
        }
    }
}

/// Each attempt of the revisions (oldest first), by its last revision.
fn attempts_of(revisions: &[Revision]) -> Vec<Attempt> {
    let mut attempts: Vec<Attempt> = Vec::new();
    for revision in revisions {
        let record = &revision.record;
        match attempts.last_mut() {
            Some(last) if last.trace_id == record.trace_id => *last = Attempt::of(record),
            _ => attempts.push(Attempt::of(record)),
        }
    }
    attempts
}

impl History {
    /// The history the revisions of one record tell (oldest first); `kept` is how many
    /// revisions the bucket keeps of a record, so that a full set says older ones are gone.
    pub fn of(instance_id: InstanceId, revisions: &[Revision], kept: usize) -> Self {
        let mut steps = Vec::new();
        let mut previous: Option<&Revision> = None;
        let unfolded = revisions.first().and_then(unfold);
        for revision in unfolded.iter().flatten().chain(revisions) {
            steps.extend(steps_of(previous.map(|p| &p.record), revision));
            previous = Some(revision);
        }
        Self {
            instance_id,
            truncated: revisions.len() >= kept,
            steps,
            attempts: attempts_of(revisions),
        }
    }
}

/// Prepares `next` to be written over `before` (stored at `revision`): counts the write
/// ([`InstanceRecord::writes`]) and, when `next` is final and `before` is the `executing`
/// write made straight over a Scheduler's creation of queued work, folds those two revisions
/// into it ([`InstanceRecord::folded`]), provided that `next` keeps every field their steps
/// are told by. A folded record is written as a rollup: it replaces them in the store.
pub fn prepare_write(before: &InstanceRecord, revision: u64, next: &mut InstanceRecord) {
    next.writes = match before.writes {
        Some(0) if before.tag != Tag::Queued => None,
        writes => writes.map(|n| n.saturating_add(1)),
    };
    next.folded = None;
    let tells_them = next.state.is_final()
        && before.tag == Tag::Executing
        && before.writes == Some(1)
        && before.created_by.is_some()
        && before.created_by == next.created_by
        && before.trace_id == next.trace_id
        && before.attempt == next.attempt
        && before.worker.is_some()
        && before.worker == next.worker
        && before.worker_losses == next.worker_losses
        && before.started_at.is_some()
        && before.started_at == next.started_at
        && before.dispatch == next.dispatch
        && before.trigger == next.trigger
        && before.expected_time == next.expected_time
        && before.created_at == next.created_at;
    if let (true, Some(note)) = (tells_them, &before.dispatch) {
        next.folded = Some(Folded {
            created: note.fence,
            executing: revision,
            executing_by: before
                .written_by
                .clone()
                .filter(|by| Some(by) != before.worker.as_ref()),
        });
    }
}

/// The two revisions a folded record replaced, as they were in every field their steps are
/// told by; none when `revision` folds nothing.
fn unfold(revision: &Revision) -> Option<[Revision; 2]> {
    let record = &revision.record;
    let folded = record.folded.as_ref()?;
    let started_at = record.started_at?;
    let created = InstanceRecord {
        state: State::Running,
        tag: Tag::Queued,
        worker: None,
        started_at: None,
        finished_at: None,
        dispatch: None,
        exit_code: None,
        next_attempt_at: None,
        message: "queued".into(),
        written_by: record.created_by.clone(),
        writes: Some(0),
        folded: None,
        data_reruns: 0,
        due_at: None,
        ..record.clone()
    };
    let executing = InstanceRecord {
        tag: Tag::Executing,
        started_at: Some(started_at),
        dispatch: record.dispatch.clone(),
        worker: record.worker.clone(),
        written_by: folded.executing_by.clone().or(record.worker.clone()),
        writes: Some(1),
        ..created.clone()
    };
    Some([
        Revision {
            revision: folded.created,
            at: record.created_at,
            record: created,
        },
        Revision {
            revision: folded.executing,
            at: started_at,
            record: executing,
        },
    ])
}

/// The steps one revision tells, after `before` (none for the oldest one).
fn steps_of(before: Option<&InstanceRecord>, now: &Revision) -> Vec<Step> {
    let record = &now.record;
    let step = |step: StepKind, detail: String| Step {
        at: now.at,
        step,
        node: record.written_by.clone().or(record.created_by.clone()),
        attempt: record.attempt,
        trace_id: record.trace_id.clone(),
        worker: record.worker.clone(),
        state: record.state,
        tag: record.tag,
        detail,
        revision: now.revision,
    };
    let Some(before) = before else {
        return vec![step(StepKind::Created, created(record))];
    };
    if before.trace_id != record.trace_id {
        let kind = if record.worker_losses > before.worker_losses {
            StepKind::Lost
        } else if before.state == State::WaitingRetry {
            StepKind::Retried
        } else {
            StepKind::Rerun
        };
        let mut lost = step(kind, record.message.clone());
        if kind == StepKind::Lost {
            lost.worker = before.worker.clone();
        }
        return vec![lost];
    }
    if record.tag == Tag::Executing && before.tag != Tag::Executing {
        return executing(record, now, step(StepKind::Started, String::new()));
    }
    if record.worker_losses > before.worker_losses {
        // The last loss allowed: no new attempt, the instance failed.
        return vec![step(StepKind::Lost, record.message.clone())];
    }
    if record.state == before.state && record.tag == before.tag {
        return vec![step(StepKind::Updated, record.message.clone())];
    }
    let ended_now = record.state.is_final() || record.state == State::WaitingRetry;
    if !ended_now {
        let kind = match record.tag {
            Tag::WaitingDeps => StepKind::WaitingDeps,
            Tag::NoWorker => StepKind::NoWorker,
            Tag::Sharded => StepKind::Split,
            Tag::Queued if matches!(before.tag, Tag::Scheduled | Tag::WaitingDeps) => {
                StepKind::Released
            }
            _ => StepKind::Updated,
        };
        return vec![step(kind, record.message.clone())];
    }
    match record.tag {
        Tag::Operator => vec![step(StepKind::Cancelled, record.message.clone())],
        Tag::Marked => vec![step(StepKind::Marked, record.message.clone())],
        // An operator's kill is written by the node that carried it out, not the worker.
        Tag::Killed if record.written_by != record.worker => {
            vec![step(StepKind::Killed, record.message.clone())]
        }
        _ if before.tag == Tag::Executing => ended(record, now, step),
        _ if record.state == State::Cancelled => {
            vec![step(
                StepKind::Cancelled,
                format!("{}: {}", record.tag, record.message),
            )]
        }
        _ => vec![step(
            StepKind::Ended,
            format!("{}: {}", record.tag, record.message),
        )],
    }
}

/// What the creation says: the trigger, who, and what it waits for.
fn created(record: &InstanceRecord) -> String {
    let trigger = serde_json::to_value(record.trigger)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let by = record
        .created_by
        .as_ref()
        .map(|n| format!(" by {n}"))
        .unwrap_or_default();
    let waits = match record.tag {
        Tag::Scheduled => format!(
            "; scheduled for {}",
            crate::time::rfc3339(record.expected_time)
        ),
        Tag::WaitingDeps => "; waiting for its dependencies".to_string(),
        _ => String::new(),
    };
    format!("{trigger}{by}, attempt {}{waits}", record.attempt)
}

/// The worker's `executing` write: dispatched, claimed, started.
fn executing(record: &InstanceRecord, now: &Revision, started: Step) -> Vec<Step> {
    let worker = record.worker.as_ref().map(|w| w.as_str()).unwrap_or("?");
    let mut steps = Vec::with_capacity(3);
    if let Some(note) = &record.dispatch {
        steps.push(Step {
            at: note.at,
            step: StepKind::Dispatched,
            node: note.router.clone(),
            detail: dispatched(worker, note),
            ..started.clone()
        });
        steps.push(Step {
            at: note.acknowledged_at,
            step: StepKind::Claimed,
            node: record.worker.clone(),
            detail: format!(
                "fence {}; acknowledged to {}",
                note.fence,
                note.router
                    .as_ref()
                    .map(|r| r.as_str())
                    .unwrap_or("no router")
            ),
            ..started.clone()
        });
    }
    steps.push(Step {
        at: record.started_at.unwrap_or(now.at),
        detail: format!("on {worker}"),
        ..started
    });
    steps
}

fn dispatched(worker: &str, note: &DispatchNote) -> String {
    let mut detail = format!("to {worker}, delivery {}", note.delivery);
    if note.delivery > 1 {
        detail.push_str(" (redelivered)");
    }
    if !note.passed_over.is_empty() {
        let passed: Vec<&str> = note.passed_over.iter().map(|w| w.as_str()).collect();
        detail.push_str(&format!(
            "; re-dispatched, passed over {}",
            passed.join(", ")
        ));
    }
    detail
}

/// An attempt that ended on its worker: ended (the worker's time), reported (the record's),
/// and the retry when one is due.
fn ended(
    record: &InstanceRecord,
    now: &Revision,
    step: impl Fn(StepKind, String) -> Step,
) -> Vec<Step> {
    // The attempt's outcome (the instance may still be waiting for a retry).
    let verdict = if record.state == State::Success {
        "success"
    } else {
        "failed"
    };
    let mut outcome = format!("{verdict} {}", record.tag);
    if let Some(code) = record.exit_code {
        outcome.push_str(&format!(", exit code {code}"));
    }
    if !record.message.is_empty() {
        outcome.push_str(&format!(": {}", record.message));
    }
    let finished = record.finished_at.unwrap_or(now.at);
    let mut steps = vec![
        Step {
            at: finished,
            node: record.worker.clone(),
            ..step(StepKind::Ended, outcome)
        },
        step(
            StepKind::Reported,
            format!(
                "recorded {} ms after the end",
                (now.at - finished).num_milliseconds().max(0)
            ),
        ),
    ];
    if let (State::WaitingRetry, Some(due)) = (record.state, record.next_attempt_at) {
        steps.push(step(
            StepKind::RetryScheduled,
            format!(
                "attempt {} due {}",
                record.attempt + 1,
                crate::time::rfc3339(due)
            ),
        ));
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance::tests::{record, tr};
    use crate::instance::AttemptEnd;

    fn node(name: &str) -> NodeId {
        NodeId::parse(name).unwrap()
    }

    fn at(second: u32) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(&format!("2026-12-02T10:00:{second:02}Z"))
            .unwrap()
            .with_timezone(&Utc)
    }

    fn created_record() -> InstanceRecord {
        InstanceRecord {
            instance_id: InstanceId::parse("j.20261202T100000000Z").unwrap(),
            biz_date: "2026-12-02".into(),
            expected_time: at(0),
            created_at: at(0),
            message: "queued".into(),
            created_by: Some(node("s1")),
            written_by: Some(node("s1")),
            ..record()
        }
    }

    fn note(router: &str, second: u32, delivery: u64, passed_over: &[&str]) -> DispatchNote {
        DispatchNote {
            router: Some(node(router)),
            at: at(second),
            delivery,
            dispatch: None,
            fence: 7,
            acknowledged_at: at(second),
            passed_over: passed_over.iter().map(|w| node(w)).collect(),
        }
    }

    fn end(trace: TraceId, worker: &str, second: u32, success: bool) -> AttemptEnd {
        let tag = [Tag::ExitCode, Tag::Completed][usize::from(success)];
        AttemptEnd {
            exit_code: Some(i32::from(!success)),
            ..AttemptEnd::new(trace, node(worker), success, tag, at(second))
        }
    }

    /// Revisions numbered from 1, each stored at its second, written by `by`.
    fn revisions(records: Vec<(u32, &str, InstanceRecord)>) -> Vec<Revision> {
        records
            .into_iter()
            .enumerate()
            .map(|(i, (second, by, mut record))| {
                record.written_by = Some(node(by));
                Revision {
                    revision: i as u64 + 1,
                    at: at(second),
                    record,
                }
            })
            .collect()
    }

    fn kinds(history: &History) -> Vec<&'static str> {
        history.steps.iter().map(|s| s.step.as_str()).collect()
    }

    #[test]
    fn a_failed_attempt_retried_elsewhere_tells_both_workers_and_the_redelivery() {
        let r0 = created_record();
        let r1 = r0
            .started(&tr(1), &node("w1"), at(2), &note("r1", 1, 1, &[]))
            .unwrap();
        let r2 = r1.ended(&end(tr(1), "w1", 3, false), Some(at(6))).unwrap();
        let r3 = r2.retried(&tr(1), &tr(2)).unwrap();
        let r4 = r3
            .started(&tr(2), &node("w2"), at(8), &note("r1", 7, 2, &["w1"]))
            .unwrap();
        let r5 = r4.ended(&end(tr(2), "w2", 9, true), None).unwrap();
        let history = History::of(
            r0.instance_id.clone(),
            &revisions(vec![
                (0, "s1", r0),
                (2, "w1", r1),
                (4, "w1", r2),
                (6, "s1", r3),
                (8, "w2", r4),
                (10, "w2", r5),
            ]),
            64,
        );
        assert_eq!(
            kinds(&history),
            [
                "created",
                "dispatched",
                "claimed",
                "started",
                "ended",
                "reported",
                "retry_scheduled",
                "retried",
                "dispatched",
                "claimed",
                "started",
                "ended",
                "reported"
            ]
        );
        let s = &history.steps;
        assert_eq!(s[0].node, Some(node("s1")));
        assert_eq!(s[1].node, Some(node("r1")));
        assert_eq!(s[1].worker, Some(node("w1")));
        assert_eq!(s[1].detail, "to w1, delivery 1");
        assert_eq!(s[4].detail, "failed exit_code, exit code 1");
        assert_eq!(s[5].detail, "recorded 1000 ms after the end");
        assert_eq!(s[6].detail, "attempt 2 due 2026-12-02T10:00:06.000Z");
        assert_eq!((s[7].attempt, &s[7].trace_id), (2, &tr(2)));
        assert_eq!(s[8].worker, Some(node("w2")));
        assert_eq!(
            s[8].detail,
            "to w2, delivery 2 (redelivered); re-dispatched, passed over w1"
        );
        assert!(!history.truncated);
    }

    /// `next` as `by` writes it over `before` (stored at revision `revision`), the way
    /// every writer does.
    fn written(
        before: &InstanceRecord,
        revision: u64,
        by: &str,
        mut next: InstanceRecord,
    ) -> InstanceRecord {
        next.written_by = Some(node(by));
        prepare_write(before, revision, &mut next);
        next
    }

    /// A Scheduler's creation of queued work, started by w1 (dispatched at 1, started at 2).
    fn created_and_started() -> (InstanceRecord, InstanceRecord) {
        let r0 = created_record();
        let started = r0
            .started(&tr(1), &node("w1"), at(2), &note("r1", 1, 1, &[]))
            .unwrap();
        let r1 = written(&r0, 1, "w1", started);
        (r0, r1)
    }

    #[test]
    fn a_final_write_straight_after_the_start_folds_both_and_tells_the_same_history() {
        let (r0, r1) = created_and_started();
        assert_eq!((r0.writes, r1.writes), (Some(0), Some(1)));
        let success = r1.ended(&end(tr(1), "w1", 3, true), None).unwrap();
        let failure = r1.ended(&end(tr(1), "w1", 3, false), None).unwrap();
        let killed = r1
            .ended_early(&tr(1), State::Failed, Tag::Killed, "killed by ann")
            .unwrap();
        for (by, next) in [("w1", success), ("w1", failure), ("console", killed)] {
            // The creation is stored at revision 7 (the dispatch note's fence), the start at 8.
            let r2 = written(&r1, 8, by, next);
            let folded = Folded {
                created: 7,
                executing: 8,
                executing_by: None,
            };
            assert_eq!((r2.folded.as_ref(), r2.writes), (Some(&folded), Some(2)));
            let stored = |revision, second, record: &InstanceRecord| Revision {
                revision,
                at: at(second),
                record: record.clone(),
            };
            let three = [stored(7, 0, &r0), stored(8, 2, &r1), stored(9, 4, &r2)];
            let told = History::of(r0.instance_id.clone(), &three, 64);
            let folded = History::of(r0.instance_id.clone(), &three[2..], 64);
            assert_eq!(folded, told, "written by {by}");
            assert!(kinds(&folded).starts_with(&["created", "dispatched", "claimed", "started"]));
        }
    }

    #[test]
    fn the_executing_write_s_own_node_is_kept_when_it_is_not_the_worker() {
        let r0 = created_record();
        let started = r0
            .started(&tr(1), &node("w1"), at(2), &note("r1", 1, 1, &[]))
            .unwrap();
        let r1 = written(&r0, 7, "n1", started);
        let r2 = written(
            &r1,
            8,
            "n1",
            r1.ended(&end(tr(1), "w1", 3, true), None).unwrap(),
        );
        let folded = r2.folded.clone().unwrap();
        assert_eq!(folded.executing_by, Some(node("n1")));
        let history = History::of(
            r0.instance_id.clone(),
            &[Revision {
                revision: 9,
                at: at(4),
                record: r2,
            }],
            64,
        );
        let started = &history.steps[3];
        assert_eq!(
            (started.step, &started.node),
            (StepKind::Started, &Some(node("n1")))
        );
    }

    #[test]
    fn anything_else_keeps_every_revision() {
        let (r0, r1) = created_and_started();
        // A retry is not final.
        let retry = written(
            &r1,
            2,
            "w1",
            r1.ended(&end(tr(1), "w1", 3, false), Some(at(6))).unwrap(),
        );
        assert_eq!(retry.folded, None);
        // A release, a reservation, a no-worker write: more than one write before the start.
        let mut scheduled = created_record();
        scheduled.tag = Tag::Scheduled;
        let released = written(&scheduled, 1, "s1", scheduled.released(&tr(1), 0).unwrap());
        assert_eq!(released.writes, None, "not created as queued");
        let no_worker = written(&r0, 1, "r1", r0.no_worker(&tr(1), None).unwrap());
        let started = no_worker
            .started(&tr(1), &node("w1"), at(2), &note("r1", 1, 1, &[]))
            .unwrap();
        let started = written(&no_worker, 2, "w1", started);
        assert_eq!(started.writes, Some(2));
        let ended = started.ended(&end(tr(1), "w1", 3, true), None).unwrap();
        assert_eq!(written(&started, 3, "w1", ended).folded, None);
        // A creation that no Scheduler made (a DAG's, a shard's) names no creator to tell.
        let mut dag = created_record();
        dag.created_by = None;
        let started = dag
            .started(&tr(1), &node("w1"), at(2), &note("r1", 1, 1, &[]))
            .unwrap();
        let started = written(&dag, 1, "w1", started);
        let ended = started.ended(&end(tr(1), "w1", 3, true), None).unwrap();
        assert_eq!(written(&started, 2, "w1", ended).folded, None);
        // An end that names another start than the record's.
        let mut other = end(tr(1), "w1", 3, true);
        other.started_at = Some(at(1));
        let ended = r1.ended(&other, None).unwrap();
        assert_eq!(written(&r1, 2, "w1", ended).folded, None);
        // A later write over a folded record folds nothing more, and keeps counting.
        let r2 = written(
            &r1,
            2,
            "w1",
            r1.ended(&end(tr(1), "w1", 3, true), None).unwrap(),
        );
        let rerun = written(&r2, 3, "s1", r2.rerun(&tr(2)).unwrap());
        assert_eq!((rerun.folded, rerun.writes), (None, Some(3)));
    }

    #[test]
    fn a_lost_attempt_names_the_dead_worker_and_the_node_that_found_it() {
        let r0 = created_record();
        let r1 = r0
            .started(&tr(1), &node("w1"), at(1), &note("r1", 1, 1, &[]))
            .unwrap();
        let r2 = r1.worker_lost(&tr(1), &tr(2), &node("w1"), 3).unwrap();
        let history = History::of(
            r0.instance_id.clone(),
            &revisions(vec![(0, "s1", r0), (1, "w1", r1), (20, "janitor", r2)]),
            64,
        );
        let lost = history.steps.last().unwrap();
        assert_eq!(lost.step, StepKind::Lost);
        assert_eq!(lost.worker, Some(node("w1")));
        assert_eq!(lost.node, Some(node("janitor")));
        assert_eq!((lost.attempt, lost.tag), (2, Tag::Queued));
    }

    #[test]
    fn operator_steps_and_releases_are_named() {
        let mut r0 = created_record();
        r0.tag = Tag::Scheduled;
        let r1 = r0.released(&tr(1), 0).unwrap();
        let r2 = r1
            .ended_early(&tr(1), State::Cancelled, Tag::Operator, "cancelled by ann")
            .unwrap();
        let r3 = r2
            .marked(State::Success, "marked success by ann: done")
            .unwrap();
        let history = History::of(
            r0.instance_id.clone(),
            &revisions(vec![
                (0, "s1", r0),
                (5, "s1", r1),
                (6, "s2", r2),
                (7, "s2", r3),
            ]),
            4,
        );
        assert_eq!(
            kinds(&history),
            ["created", "released", "cancelled", "marked"]
        );
        assert!(history.steps[0].detail.contains("scheduled for"));
        assert_eq!(history.steps[2].detail, "cancelled by ann");
        assert!(history.truncated, "as many revisions as the bucket keeps");
    }
}
