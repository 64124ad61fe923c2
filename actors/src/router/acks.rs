//! Dispatches waiting for their worker's acknowledgement, ordered by deadline.
//!
//! A worker acknowledges a dispatch ("received, about to run") before it starts the attempt.
//! A dispatch still unacknowledged at its deadline is checked against its record — the
//! acknowledgement itself is a core message and may be lost while the attempt started — and,
//! if nobody started it, re-dispatched elsewhere under a reservation in the record that the
//! first dispatch can never pass.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use ax_bus::ids::{DispatchId, TraceId, WorkerId};
use ax_bus::messages::WorkItem;

/// An unacknowledged dispatch.
#[derive(Clone, Debug)]
pub(crate) struct Pending {
    /// The attempt as dispatched.
    pub work: WorkItem,
    /// The worker it was sent to.
    pub worker: WorkerId,
    /// Workers that already failed to acknowledge this attempt.
    pub excluded: Vec<WorkerId>,
}

impl Pending {
    /// `work` as dispatched to `worker`, which `excluded` failed to take before.
    pub(crate) fn new(work: WorkItem, worker: WorkerId, excluded: Vec<WorkerId>) -> Self {
        Self {
            work,
            worker,
            excluded,
        }
    }
}

/// Unacknowledged dispatches.
#[derive(Debug, Default)]
pub(crate) struct AckTracker {
    /// Boxed: a dispatch is about a kilobyte, and the map moves every entry when it grows or
    /// clears its deleted slots — inline, that was most of the Router's time under load.
    pending: HashMap<TraceId, (Box<Pending>, Instant)>,
    deadlines: BTreeSet<(Instant, TraceId)>,
}

impl AckTracker {
    /// Tracks a dispatch of `work` (keyed by its trace id) until `timeout` from now.
    pub(crate) fn track(&mut self, pending: Pending, timeout: Duration) {
        let trace = pending.work.trace_id.clone();
        self.forget(&trace);
        let deadline = Instant::now() + timeout;
        self.deadlines.insert((deadline, trace.clone()));
        self.pending.insert(trace, (Box::new(pending), deadline));
    }

    /// An acknowledgement arrived: forgets the dispatch if it is the one tracked.
    pub(crate) fn acknowledged(&mut self, trace: &TraceId, dispatch: &DispatchId) -> bool {
        let matches = self
            .pending
            .get(trace)
            .is_some_and(|(p, _)| p.work.dispatch.as_deref() == Some(dispatch));
        if matches {
            self.forget(trace);
        }
        matches
    }

    fn forget(&mut self, trace: &TraceId) {
        if let Some((_, deadline)) = self.pending.remove(trace) {
            self.deadlines.remove(&(deadline, trace.clone()));
        }
    }

    /// The dispatches whose deadline has passed (no longer tracked).
    pub(crate) fn expired(&mut self, now: Instant) -> Vec<Pending> {
        let mut out = Vec::new();
        while let Some((deadline, trace)) = self.deadlines.first().cloned() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some((pending, _)) = self.pending.remove(&trace) {
                out.push(*pending);
            }
        }
        out
    }

    /// How many are waiting.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether none is waiting.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ax_bus::ids::InstanceId;

    /// A valid trace (or dispatch) id named by `name`.
    fn tr(name: &str) -> TraceId {
        TraceId::first_of(&InstanceId::parse(name).unwrap())
    }

    fn di(name: &str) -> DispatchId {
        DispatchId::parse(&tr(name)).unwrap()
    }

    fn work(trace: &str, dispatch: &str) -> WorkItem {
        let spec: ax_bus::spec::JobDocument =
            serde_json::from_str(r#"{"version":"v1","job":{"name":"j","exec":{"type":"noop"}}}"#)
                .unwrap();
        WorkItem {
            dispatch: Some(di(dispatch)),
            ..WorkItem::first(
                InstanceId::parse("j.x").unwrap(),
                tr(trace),
                "2026-01-01",
                spec.job,
            )
        }
    }

    fn pending(trace: &str, dispatch: &str) -> Pending {
        Pending {
            work: work(trace, dispatch),
            worker: WorkerId::parse("w").unwrap(),
            excluded: vec![],
        }
    }

    #[test]
    fn acknowledged_dispatches_never_expire() {
        let mut tracker = AckTracker::default();
        tracker.track(pending("t1", "d1"), Duration::ZERO);
        tracker.track(pending("t2", "d2"), Duration::ZERO);
        assert!(!tracker.acknowledged(&tr("t1"), &di("an-older-dispatch")));
        assert!(tracker.acknowledged(&tr("t1"), &di("d1")));
        let expired = tracker.expired(Instant::now() + Duration::from_millis(1));
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].work.trace_id, tr("t2"));
        assert!(tracker.is_empty());
    }

    #[test]
    fn deadlines_come_in_order() {
        let mut tracker = AckTracker::default();
        tracker.track(pending("late", "d"), Duration::from_secs(60));
        tracker.track(pending("soon", "d"), Duration::ZERO);
        let expired = tracker.expired(Instant::now() + Duration::from_millis(1));
        assert_eq!(expired.len(), 1);
        assert_eq!(tracker.len(), 1);
    }
}
