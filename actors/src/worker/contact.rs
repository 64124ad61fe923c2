//! When this worker last knew that the Routers could see it: the last heartbeat the NATS
//! server confirmed it stored. The Routers declare a worker dead `worker_ttl` (10 s) after its
//! last heartbeat and hand its attempts to others; a worker cut off from NATS cannot be told,
//! so it must stop its commands on its own first — **self-fencing** — or two executions of one
//! instance would overlap in time. Every running attempt checks the contact and stops its
//! command once it is older than its job's `fence_after`: 5 s short of its lease, the time
//! the Routers wait before they hand it to another worker (the worker TTL, 10 s, unless the
//! job's `lease` is longer) — 5 s without a lease, which with a heartbeat every 2 s leaves 3 s
//! before any Router can judge the worker dead.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The last confirmed heartbeat; cheap to clone, shared by the attempts.
#[derive(Clone, Debug)]
pub(crate) struct Contact(Arc<Mutex<Instant>>);

impl Contact {
    /// Contact as of now (a worker starting up counts as seen).
    pub(crate) fn new() -> Self {
        Self(Arc::new(Mutex::new(Instant::now())))
    }

    /// A heartbeat was stored.
    pub(crate) fn heard(&self) {
        if let Ok(mut last) = self.0.lock() {
            *last = Instant::now();
        }
    }

    /// How long since the last confirmed heartbeat.
    pub(crate) fn silent_for(&self) -> Duration {
        self.0
            .lock()
            .map(|last| last.elapsed())
            .unwrap_or(Duration::MAX)
    }

    /// Whether an attempt that must stop `fence_after` without contact must stop now.
    pub(crate) fn lost(&self, fence_after: Duration) -> bool {
        self.silent_for() > fence_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contact_is_lost_only_after_the_fence_delay() {
        let (short, long) = (Duration::from_secs(5), Duration::from_secs(55));
        let contact = Contact::new();
        assert!(!contact.lost(short));
        if let Ok(mut last) = contact.0.lock() {
            *last = Instant::now() - short - Duration::from_millis(1);
        }
        assert!(contact.lost(short));
        assert!(
            !contact.lost(long),
            "a long lease keeps its attempt running"
        );
        contact.heard();
        assert!(!contact.lost(short));
    }
}
