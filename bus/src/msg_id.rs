//! The message ids ax publishes under, defined once: JetStream drops a second message with the
//! same id inside the stream's de-duplication window, so a hand-off, a result or a record
//! published again by another node (or by the same one after a lost ack) is stored once. Each
//! id names what makes the message unique.

use chrono::{DateTime, Utc};

use crate::ids::{DispatchId, JobName, NodeId, TraceId};

/// The hand-off of an attempt to the Router (`ax.internal.ready.<priority>`).
pub fn ready(trace: &TraceId) -> String {
    format!("ready:{trace}")
}

/// An attempt going back to the ready queue after its re-dispatch found no worker: its
/// reservation (the dispatch) makes it a message of its own.
pub fn ready_again(trace: &TraceId, dispatch: &DispatchId) -> String {
    format!("ready:{trace}:{dispatch}")
}

/// The result an operator's verdict publishes (the attempt's own result may be in the
/// de-duplication window still).
pub fn marked(trace: &TraceId, state: &str) -> String {
    format!("marked:{trace}:{state}")
}

/// The schedule (or the due message) of a delayed first attempt.
pub fn delayed(trace: &TraceId) -> String {
    format!("delayed:{trace}")
}

/// The hand-off of an attempt to the DagCoordinator (`ax.internal.created.<job>`).
pub fn created(trace: &TraceId) -> String {
    format!("created:{trace}")
}

/// One dispatch of an attempt to a worker.
pub fn dispatch(trace: &TraceId, dispatch: &DispatchId) -> String {
    format!("dispatch:{trace}:{dispatch}")
}

/// The result of an attempt (`ax.result.<job>`).
pub fn result(trace: &TraceId) -> String {
    format!("result:{trace}")
}

/// A failed attempt with a retry left, for the Schedulers (`ax.internal.retry.<job>`).
pub fn retry(trace: &TraceId) -> String {
    format!("retry:{trace}")
}

/// The split of a parent attempt into sub-instances.
pub fn split(parent: &TraceId) -> String {
    format!("split:{parent}")
}

/// One Scheduler's record of one tick.
pub fn tick(job: &JobName, tick: DateTime<Utc>, node: &NodeId, outcome: &str) -> String {
    format!("tick:{job}:{}:{node}:{outcome}", tick.timestamp_millis())
}

/// A message moved to the dead letters, by where it was (`<stream>:<sequence>`).
pub fn dead(source: &str) -> String {
    format!("dead:{source}")
}

/// An instance that failed for good, kept as a dead letter once per attempt.
pub fn dead_exhausted(trace: &TraceId) -> String {
    format!("dead:exhausted:{trace}")
}

/// A dead letter put back on its subject: once per letter.
pub fn replay(dead_stream: &str, letter: u64) -> String {
    format!("replay:{dead_stream}:{letter}")
}

/// An audit record of `what` (each one unique).
pub fn audit(what: &str) -> String {
    format!("{what}:{}", TraceId::random())
}
