//! `ax.control.report`: the business's report of an attempt whose endpoint answered `202
//! Accepted` (see [`ax_bus::client::reports`]).
//!
//! Checked twice before it is handed on: the key of the trace must say an attempt waits for it
//! (else the trace is unknown, already reported, or ended without a report), and the instance
//! record must still be on that attempt and not ended (a worker lost meanwhile moved it on, and
//! nobody waits any more). The hand-off itself is a compare-and-swap on the key, so a report
//! and the attempt's timeout never both win.

use ax_bus::client::reports::{Delivery, Report, ReportState};
use ax_bus::messages::{ControlReply, ReportRequest};
use ax_bus::AxClient;

use super::CommandError;

/// What a second report of a trace is answered.
pub(crate) const ALREADY_REPORTED: &str = "already reported: this report is ignored";

pub(crate) async fn report(
    client: &AxClient,
    request: ReportRequest,
) -> Result<ControlReply, CommandError> {
    let trace = &request.trace_id;
    let instance_id = match client.report_state(trace).await? {
        None => return Err(CommandError::refused(unknown(trace))),
        Some((ReportState::Reported(_), _)) => return Ok(answer(None, ALREADY_REPORTED)),
        Some((ReportState::Closed { reason }, _)) => {
            return Err(CommandError::refused(ended(trace, &reason)))
        }
        Some((ReportState::Waiting { instance_id, .. }, _)) => instance_id,
    };
    match client.instance(&instance_id).await? {
        Some((record, _)) if record.trace_id == *trace && !record.state.is_final() => {}
        Some((record, _)) => {
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
    match client.deliver_report(trace, &report).await? {
        Delivery::Accepted => Ok(answer(Some(instance_id), "reported")),
        Delivery::AlreadyReported => Ok(answer(Some(instance_id), ALREADY_REPORTED)),
        Delivery::Closed(reason) => Err(CommandError::refused(ended(trace, &reason))),
        Delivery::Unknown => Err(CommandError::refused(unknown(trace))),
    }
}

fn answer(instance_id: Option<ax_bus::ids::InstanceId>, message: &str) -> ControlReply {
    ControlReply {
        ok: true,
        instance_id,
        message: message.to_string(),
        ..ControlReply::default()
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
