//! Supervision at ax's boundaries.
//!
//! actix restarts a supervised actor only when it stops itself; a panic in a handler or in a
//! context future kills it for good. Every handler body and every long-running pump of an actor
//! therefore runs through [`guard`] or [`spawn_pump`]: a panic is caught, counted and turned into
//! `ctx.stop()`, and the [`actix::Supervisor`] restarts the actor, which re-subscribes and
//! rebuilds its view from JetStream in `started()`. A pump that returns (its subscription ended,
//! NATS went away for good) stops the actor the same way.
//!
//! actix's [`Supervisor`] restarts a stopped actor only while an address of it is alive (it
//! checks that the mailbox still has senders); an actor nobody addresses stays dead after its
//! first stop. [`start_supervised`] therefore hands back an address that must be held for as
//! long as the actor should live.
//!
//! [`counters`] gives panics, restarts, ended pumps and stalls per actor; every node publishes
//! them in its heartbeat (see [`crate::node::heartbeat`]), which `ax nodes` shows.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use actix::prelude::*;
use ax_bus::messages::ActorHealth;
use dashmap::DashMap;
use futures::FutureExt;

/// How long an actor whose pump ended waits before it restarts.
pub(crate) const RESTART_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

/// Panics and restarts of one actor kind.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Panics caught at the actor's boundaries.
    pub panics: AtomicU64,
    /// Times the actor was restarted by its supervisor.
    pub restarts: AtomicU64,
    /// Times a pump ended and stopped the actor.
    pub pump_exits: AtomicU64,
    /// Times it left a watchdog ping unanswered past the stall limit (see [`crate::runtime::watchdog`]).
    pub stalls: AtomicU64,
}

fn registry() -> &'static DashMap<&'static str, Arc<Counters>> {
    static REGISTRY: OnceLock<DashMap<&'static str, Arc<Counters>>> = OnceLock::new();
    REGISTRY.get_or_init(DashMap::new)
}

/// The counters of `actor`.
pub(crate) fn counters_of(actor: &'static str) -> Arc<Counters> {
    registry().entry(actor).or_default().clone()
}

/// What befell each actor of this process.
pub(crate) fn counters() -> BTreeMap<String, ActorHealth> {
    registry()
        .iter()
        .map(|e| {
            let c = e.value();
            let health = ActorHealth {
                panics: c.panics.load(Ordering::Relaxed),
                restarts: c.restarts.load(Ordering::Relaxed),
                pump_exits: c.pump_exits.load(Ordering::Relaxed),
                stalls: c.stalls.load(Ordering::Relaxed),
            };
            (e.key().to_string(), health)
        })
        .collect()
}

/// Records a restart (call from `Supervised::restarting`).
pub(crate) fn note_restart(actor: &'static str) {
    counters_of(actor).restarts.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(actor, "restarting");
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".to_string())
}

/// Runs a handler body, catching a panic: `None` means it panicked (logged and counted), and
/// the caller must `ctx.stop()` so that the supervisor restarts the actor with a clean view.
pub(crate) fn guard<R>(actor: &'static str, body: impl FnOnce() -> R) -> Option<R> {
    match std::panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => Some(r),
        Err(payload) => {
            counters_of(actor).panics.fetch_add(1, Ordering::Relaxed);
            tracing::error!(actor, panic = %panic_text(&*payload), "handler panicked; restarting");
            None
        }
    }
}

/// Starts `make()`'s actor under a [`Supervisor`] on `arbiter`. Hold the returned address:
/// when the last one is dropped, the next stop of the actor is its last.
pub(crate) fn start_supervised<A, F>(arbiter: &ArbiterHandle, make: F) -> Addr<A>
where
    A: Actor<Context = Context<A>> + Supervised,
    F: FnOnce() -> A + Send + 'static,
{
    Supervisor::start_in_arbiter(arbiter, move |_| make())
}

/// Spawns a long-running future in the actor's context. When it ends — error, panic or plain
/// return — the actor stops and its supervisor restarts it.
pub(crate) fn spawn_pump<A, F, E>(
    actor: &'static str,
    pump: &'static str,
    ctx: &mut Context<A>,
    fut: F,
) where
    A: Actor<Context = Context<A>>,
    F: Future<Output = Result<(), E>> + 'static,
    E: std::fmt::Display,
{
    spawn_watched(actor, pump, ctx, fut, true);
}

/// Spawns a future in the actor's context that is meant to end: when it fails or panics, the
/// actor stops and its supervisor restarts it; when it succeeds, nothing more happens.
pub(crate) fn spawn_task<A: Actor<Context = Context<A>>>(
    actor: &'static str,
    task: &'static str,
    ctx: &mut Context<A>,
    fut: impl Future<Output = Result<(), impl std::fmt::Display>> + 'static,
) {
    spawn_watched(actor, task, ctx, fut, false);
}

/// Spawns `fut`, catching a panic; its failure, its panic and (with `ends_in_restart`) its
/// plain end are counted and stop the actor, a pause later.
fn spawn_watched<A, F, E>(
    actor: &'static str,
    name: &'static str,
    ctx: &mut Context<A>,
    fut: F,
    ends_in_restart: bool,
) where
    A: Actor<Context = Context<A>>,
    F: Future<Output = Result<(), E>> + 'static,
    E: std::fmt::Display,
{
    let guarded = AssertUnwindSafe(fut).catch_unwind();
    ctx.spawn(actix::fut::wrap_future::<_, A>(guarded).map(move |result, _act, ctx| {
        let counters = counters_of(actor);
        match result {
            Ok(Ok(())) if !ends_in_restart => return,
            Ok(Ok(())) => tracing::warn!(actor, name, "pump ended; restarting the actor"),
            Ok(Err(e)) => tracing::warn!(actor, name, error = %e, "failed; restarting the actor"),
            Err(payload) => {
                counters.panics.fetch_add(1, Ordering::Relaxed);
                tracing::error!(actor, name, panic = %panic_text(&*payload), "panicked; restarting the actor");
            }
        }
        counters.pump_exits.fetch_add(1, Ordering::Relaxed);
        // A pause before the restart: when NATS is away, re-subscribing at once would spin.
        ctx.run_later(RESTART_PAUSE, |_act, ctx| ctx.stop());
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::{Duration, Instant};

    /// An actor whose pump fails at once on each of its first starts.
    struct Flaky {
        starts: Arc<AtomicUsize>,
    }

    impl Actor for Flaky {
        type Context = Context<Self>;

        fn started(&mut self, ctx: &mut Self::Context) {
            let start = self.starts.fetch_add(1, Ordering::SeqCst);
            spawn_pump("flaky", "pump", ctx, async move {
                if start < 2 {
                    Err("the broker went away")
                } else {
                    std::future::pending().await
                }
            });
        }
    }

    impl Supervised for Flaky {}

    fn starts_within(limit: Duration, keep_address: bool) -> usize {
        let starts = Arc::new(AtomicUsize::new(0));
        let counted = starts.clone();
        System::new().block_on(async move {
            let arbiter = Arbiter::new();
            let address = start_supervised(&arbiter.handle(), move || Flaky { starts: counted });
            let held = keep_address.then_some(address);
            let deadline = Instant::now() + limit;
            while starts.load(Ordering::SeqCst) < 3 && Instant::now() < deadline {
                actix::clock::sleep(Duration::from_millis(50)).await;
            }
            drop(held);
            arbiter.stop();
            let _ = arbiter.join();
            starts.load(Ordering::SeqCst)
        })
    }

    #[test]
    fn a_held_actor_is_restarted_after_every_failed_pump() {
        // Two failures, each followed by the restart pause: the third start comes within ~2 s.
        assert_eq!(starts_within(Duration::from_secs(20), true), 3);
    }

    #[test]
    fn an_actor_nobody_addresses_is_not_restarted() {
        // The reason `start_supervised` returns what it does.
        assert_eq!(starts_within(RESTART_PAUSE * 4, false), 1);
    }
}
