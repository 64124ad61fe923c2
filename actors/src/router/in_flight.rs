//! The janitor's sweep of re-dispatches in flight (see [`ax_bus::client::in_flight`]): what a
//! Router that died mid-re-dispatch left behind is finished here.
//!
//! A Router alive re-dispatches again itself at an entry's deadline, so the sweep waits one
//! more acknowledgement timeout before it looks at an entry. Then: an attempt started since
//! (its record `executing`, its worker's lease owns it), or revoked (its loss moved the
//! instance on), or no longer the instance's current attempt, only loses its entry; one still
//! not started is stranded — alerted and re-dispatched under a new reservation in its record,
//! which fences every older dispatch off.

use ax_bus::client::in_flight::InFlight;
use ax_bus::messages::AlertKind;

use super::Dispatcher;
use crate::jetstream::publish;
use crate::ActorError;

/// Finishes every overdue re-dispatch.
pub(super) async fn sweep(shared: &Dispatcher) -> Result<(), ActorError> {
    let grace = chrono::Duration::from_std(shared.config.ack_timeout).unwrap_or_default();
    let now = ax_bus::time::now();
    for entry in shared.client.in_flight().await? {
        if entry.ack_by + grace <= now {
            finish(shared, entry).await?;
        }
    }
    Ok(())
}

async fn finish(shared: &Dispatcher, entry: InFlight) -> Result<(), ActorError> {
    let client = &shared.client;
    let trace = &entry.work.trace_id;
    // Read again: its Router may have moved on since the listing.
    match client.in_flight_of(trace).await? {
        Some(current) if current.work.dispatch == entry.work.dispatch => {}
        _ => return Ok(()),
    }
    let instance = &entry.work.instance_id;
    // Started (by this dispatch or another of the attempt) or moved on: nothing to dispatch.
    let current = client
        .instance(instance)
        .await?
        .is_some_and(|(record, _)| record.awaits_start(trace));
    if !current {
        client.settle_in_flight(trace).await?;
        return Ok(());
    }
    let to = entry
        .to
        .as_ref()
        .map_or_else(|| "the ready queue".to_string(), |w| format!("worker {w}"));
    publish::instance_alert(
        client,
        &shared.node,
        AlertKind::Stranded,
        format!(
            "attempt {trace} was re-dispatched to {to} by {} and not started by {}; dispatching it again",
            entry.by, entry.ack_by
        ),
        &entry.work,
    )
    .await;
    let mut excluded = entry.excluded;
    excluded.extend(entry.to);
    let mut work = entry.work;
    work.dispatch = None;
    work.worker = None;
    work.router = None;
    shared.redispatch(work, excluded).await
}
