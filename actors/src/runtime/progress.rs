//! Pump progress: what the watchdog reads to tell a pump that waits from one that hangs.
//!
//! Every actor's state changes only in its message handlers, so a handler that blocks shows up
//! as a ping left unanswered (see [`crate::runtime::watchdog`]). What a ping cannot see is a pump
//! — the future that reads a stream and delivers its messages to the actor — that hangs while
//! the mailbox still answers: a subscription that never yields again, an await that never
//! ends. Each pump therefore reports where it is through a [`Pump`] handle:
//! - **waiting** for its source (polling the stream for the next message);
//! - **working** on a message it received (decoding, asking the actor, publishing, settling);
//! - **held**: waiting on purpose (a paused queue, a slot to free up) — never a stall.
//!
//! [`Progressed`] wraps a pump's message stream and keeps the handle up to date by itself: it
//! is *waiting* while the stream is polled and *working* from the moment it yields a message
//! until the pump polls again. The watchdog counts a pump as stalled when it has been working
//! on one message for longer than the stall limit, or has waited longer than the limit for a
//! source that has messages pending (its consumer's `num_pending`, read from JetStream).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use futures::Stream;

/// Where a pump is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PumpState {
    /// Waiting for the next message from its source.
    Waiting,
    /// Working on a message it received.
    Working,
    /// Waiting on purpose (a paused queue, a free slot): not a stall however long.
    Held,
}

/// The JetStream consumer a pump reads, so that the watchdog can ask whether it has messages
/// pending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// The stream.
    pub stream: String,
    /// The durable consumer.
    pub durable: String,
}

/// One pump's progress, shared by the pump and the watchdog.
#[derive(Debug)]
pub struct Pump {
    actor: &'static str,
    name: String,
    source: Option<Source>,
    state: AtomicU8,
    /// Milliseconds since [`epoch`] when the state last changed.
    since: AtomicU64,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64
}

impl Pump {
    /// The actor the pump delivers to.
    pub fn actor(&self) -> &'static str {
        self.actor
    }

    /// The pump's name (`ready-high`, `results`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The consumer it reads, when it reads one.
    pub fn source(&self) -> Option<&Source> {
        self.source.as_ref()
    }

    fn set(&self, state: PumpState) {
        let code = state as u8;
        if self.state.swap(code, Ordering::Relaxed) != code {
            self.since.store(now_ms(), Ordering::Relaxed);
        }
    }

    /// The pump waits for its source.
    pub fn waiting(&self) {
        self.set(PumpState::Waiting);
    }

    /// The pump works on a message.
    pub fn working(&self) {
        self.set(PumpState::Working);
    }

    /// The pump waits on purpose; [`Pump::working`] or [`Pump::waiting`] ends it.
    pub fn held(&self) {
        self.set(PumpState::Held);
    }

    /// The state and how long it has lasted.
    pub fn state(&self) -> (PumpState, Duration) {
        let state = match self.state.load(Ordering::Relaxed) {
            0 => PumpState::Waiting,
            1 => PumpState::Working,
            _ => PumpState::Held,
        };
        let since = self.since.load(Ordering::Relaxed);
        (state, Duration::from_millis(now_ms().saturating_sub(since)))
    }
}

type Key = (&'static str, String);

/// The pumps that run: held weakly, so that a pump that ended — its future finished, failed or
/// was dropped with its actor's context — is no longer watched. (Held strongly, a pump that
/// failed while working on a message would look stuck on it for ever, and its actor, standing
/// by without that pump, would be replaced as stalled.)
fn registry() -> &'static DashMap<Key, Weak<Pump>> {
    static REGISTRY: OnceLock<DashMap<Key, Weak<Pump>>> = OnceLock::new();
    REGISTRY.get_or_init(DashMap::new)
}

/// The handle of `actor`'s pump `name`, reading `source`; a pump started again (after a
/// restart) replaces its old handle. The pump is watched while the handle lives.
pub(crate) fn register(
    actor: &'static str,
    name: impl Into<String>,
    source: Option<Source>,
) -> Arc<Pump> {
    let name = name.into();
    let pump = Arc::new(Pump {
        actor,
        name: name.clone(),
        source,
        state: AtomicU8::new(PumpState::Waiting as u8),
        since: AtomicU64::new(now_ms()),
    });
    registry().insert((actor, name), Arc::downgrade(&pump));
    pump
}

/// Forgets `actor`'s pumps (its copy was replaced: the new one registers its own).
pub(crate) fn forget(actor: &'static str) {
    registry().retain(|(owner, _), _| *owner != actor);
}

/// The running pumps of `actor` (those that ended are forgotten on the way).
pub(crate) fn pumps_of(actor: &'static str) -> Vec<Arc<Pump>> {
    registry().retain(|_, pump| pump.strong_count() > 0);
    registry()
        .iter()
        .filter(|e| e.key().0 == actor)
        .filter_map(|e| e.value().upgrade())
        .collect()
}

/// A stream that keeps its pump's handle up to date (see the module docs).
#[derive(Debug)]
pub struct Progressed<S> {
    inner: S,
    pump: Arc<Pump>,
}

impl<S> Progressed<S> {
    /// Wraps `inner`, reporting to `pump`.
    pub fn new(inner: S, pump: Arc<Pump>) -> Self {
        Self { inner, pump }
    }

    /// The handle (to mark a deliberate wait with [`Pump::held`]).
    pub fn pump(&self) -> &Arc<Pump> {
        &self.pump
    }
}

impl<S: Stream + Unpin> Stream for Progressed<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<S::Item>> {
        self.pump.waiting();
        let polled = Pin::new(&mut self.inner).poll_next(cx);
        if let Poll::Ready(Some(_)) = &polled {
            self.pump.working();
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[tokio::test]
    async fn a_progressed_stream_is_waiting_while_polled_and_working_after_an_item() {
        let pump = register("progress-test", "numbers", None);
        let mut numbers = Progressed::new(futures::stream::iter([1, 2]), pump.clone());
        assert_eq!(numbers.next().await, Some(1));
        assert_eq!(pump.state().0, PumpState::Working);
        pump.held();
        assert_eq!(pump.state().0, PumpState::Held);
        assert_eq!(numbers.next().await, Some(2));
        assert_eq!(numbers.next().await, None);
        assert_eq!(pump.state().0, PumpState::Waiting);
        assert_eq!(pumps_of("progress-test").len(), 1);
        forget("progress-test");
        assert!(pumps_of("progress-test").is_empty());
    }

    #[test]
    fn a_pump_that_ended_while_working_is_not_watched() {
        let pump = register("progress-ended", "registry", None);
        pump.working();
        assert_eq!(pumps_of("progress-ended").len(), 1);
        drop(pump);
        assert!(pumps_of("progress-ended").is_empty());
    }
}
