//! `ax.control.report`: the business's report of an attempt whose endpoint answered `202
//! Accepted` (see [`ax_bus::client::reports`]).
//!
//! Checked twice before it is handed on: the key of the trace must say an attempt waits for it
//! (else the trace is unknown, already reported, or ended without a report), and the instance
//! record must still be on that attempt and not ended (a worker lost meanwhile moved it on, and
//! nobody waits any more). The hand-off itself is a compare-and-swap on the key, so a report
//! and the attempt's timeout never both win.

use ax_bus::client::reports::{Delivery, Report, ReportState};
use ax_bus::ids::Namespace;
use ax_bus::messages::typed::Done;
use ax_bus::messages::ReportRequest;

use super::CommandError;
use crate::scheduler::store::{Instances, Reports};

/// What a second report of a trace is answered.
pub(crate) const ALREADY_REPORTED: &str = "already reported: this report is ignored";

pub(crate) async fn report(
    store: &(impl Instances + Reports),
    request: ReportRequest,
    namespace: Option<&Namespace>,
) -> Result<Done, CommandError> {
    let trace = &request.trace_id;
    let instance_id = match store.report_state(trace).await? {
        None => return Err(CommandError::refused(unknown(trace))),
        Some(ReportState::Reported(_)) => return Ok(answer(None, ALREADY_REPORTED)),
        Some(ReportState::Closed { reason }) => {
            return Err(CommandError::refused(ended(trace, &reason)))
        }
        Some(ReportState::Waiting { instance_id, .. }) => instance_id,
    };
    match store.record(&instance_id).await? {
        // Told as unknown: a service of one namespace learns nothing of another's attempts.
        Some(record) if namespace.is_some_and(|ns| record.job.namespace() != ns.as_str()) => {
            return Err(CommandError::refused(unknown(trace)))
        }
        Some(record) if record.trace_id == *trace && !record.state.is_final() => {}
        Some(record) => {
            return Err(CommandError::refused(format!(
                "stale trace id {trace}: instance {instance_id} is on attempt {} ({}, {}) and \
                 no longer waits for it",
                record.attempt, record.state, record.trace_id
            )))
        }
        None => return Err(CommandError::refused(unknown(trace))),
    }
    let report = Report {
        success: request.success,
        message: request.message,
        output: request.output,
        at: ax_bus::time::now(),
    };
    match store.deliver_report(trace, &report).await? {
        Delivery::Accepted => Ok(answer(Some(instance_id), "reported")),
        Delivery::AlreadyReported => Ok(answer(Some(instance_id), ALREADY_REPORTED)),
        Delivery::Closed(reason) => Err(CommandError::refused(ended(trace, &reason))),
        Delivery::Unknown => Err(CommandError::refused(unknown(trace))),
    }
}

fn answer(instance_id: Option<ax_bus::ids::InstanceId>, message: &str) -> Done {
    Done {
        instance_id,
        message: message.to_string(),
        ..Done::default()
    }
}

fn unknown(trace: &ax_bus::ids::TraceId) -> String {
    format!(
        "unknown trace id {trace}: no attempt waits for its report (only an http job whose \
         endpoint answered 202 Accepted does)"
    )
}

fn ended(trace: &ax_bus::ids::TraceId, reason: &str) -> String {
    format!("stale trace id {trace}: its attempt ended ({reason}) before a report came")
}

#[cfg(test)]
mod tests {
    use ax_bus::ids::TraceId;
    use ax_bus::{InstanceRecord, State, Tag};

    use super::*;
    use crate::scheduler::store::memory::Memory;

    /// An http attempt executing on `w1`, whose endpoint answered 202: its record, and memory
    /// holding it with its report awaited.
    fn awaiting() -> (InstanceRecord, Memory) {
        let now = ax_bus::time::now();
        let mut record = InstanceRecord::first(
            &crate::test_fixtures::spec("call", None, &[]),
            now,
            "2026-12-07".into(),
            Default::default(),
            ax_bus::instance::Trigger::Manual,
            now,
        );
        record.tag = Tag::Executing;
        let memory = Memory::with([record.clone()]);
        memory.reports.lock().unwrap().insert(
            record.trace_id.clone(),
            ReportState::Waiting {
                instance_id: record.instance_id.clone(),
                worker: "w1".parse().unwrap(),
            },
        );
        (record, memory)
    }

    fn of(trace: &TraceId) -> ReportRequest {
        ReportRequest {
            trace_id: trace.clone(),
            success: true,
            message: "done".into(),
            output: serde_json::json!({"rows": 3}),
        }
    }

    fn refused(outcome: Result<Done, CommandError>) -> String {
        match outcome {
            Err(CommandError::Refused(reasons)) => reasons.join("; "),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[tokio::test]
    async fn the_first_report_is_taken_and_a_second_ignored() {
        let (record, memory) = awaiting();
        let reply = report(&memory, of(&record.trace_id), None).await.unwrap();
        assert_eq!(
            (reply.message.as_str(), reply.instance_id.as_ref()),
            ("reported", Some(&record.instance_id))
        );
        match &memory.reports.lock().unwrap()[&record.trace_id] {
            ReportState::Reported(taken) => {
                assert!(taken.success && taken.message == "done" && taken.output["rows"] == 3)
            }
            other => panic!("{other:?}"),
        }
        let again = report(&memory, of(&record.trace_id), None).await.unwrap();
        assert_eq!(again.message, ALREADY_REPORTED);
    }

    #[tokio::test]
    async fn a_report_confined_to_another_namespace_is_told_the_trace_is_unknown() {
        let (record, memory) = awaiting();
        let payments = Namespace::parse("payments").unwrap();
        let why = refused(report(&memory, of(&record.trace_id), Some(&payments)).await);
        assert!(why.starts_with("unknown trace id"), "{why}");
        assert!(matches!(
            memory.reports.lock().unwrap()[&record.trace_id],
            ReportState::Waiting { .. }
        ));
        // Its own namespace (`default`, the job's) takes it.
        let default = Namespace::default_namespace();
        let reply = report(&memory, of(&record.trace_id), Some(&default))
            .await
            .unwrap();
        assert_eq!(reply.message, "reported");
    }

    #[tokio::test]
    async fn an_unknown_closed_or_stale_trace_is_refused_saying_which() {
        let (record, memory) = awaiting();
        let why = refused(report(&memory, of(&TraceId::random()), None).await);
        assert!(why.starts_with("unknown trace id"), "{why}");
        // The attempt timed out before the report.
        memory.reports.lock().unwrap().insert(
            record.trace_id.clone(),
            ReportState::Closed {
                reason: "timeout".into(),
            },
        );
        let why = refused(report(&memory, of(&record.trace_id), None).await);
        assert!(
            why.contains("its attempt ended (timeout) before a report came"),
            "{why}"
        );
        // Awaited, but the instance moved on (a worker lost: a new attempt).
        let (record, memory) = awaiting();
        let moved = {
            let mut records = memory.records.lock().unwrap();
            let next = records.get_mut(&record.instance_id).unwrap();
            next.trace_id = TraceId::random();
            next.attempt = 2;
            next.state = State::Running;
            next.clone()
        };
        let why = refused(report(&memory, of(&record.trace_id), None).await);
        assert!(
            why.contains(&format!("is on attempt 2 (running, {})", moved.trace_id)),
            "{why}"
        );
        // Nothing was delivered.
        assert!(matches!(
            memory.reports.lock().unwrap()[&record.trace_id],
            ReportState::Waiting { .. }
        ));
    }
}
