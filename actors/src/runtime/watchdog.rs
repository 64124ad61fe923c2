//! Stall detection: the other half of supervision.
//!
//! [`crate::runtime::supervision`] turns panics and ended pumps into restarts, but an actor can also stop
//! making progress without failing: a handler that blocks its thread (a deadlock, a blocking
//! call) or a pump whose awaited future never ends. actix notices neither. Every actor owns its
//! state and changes it only in its handlers, so the watchdog measures progress in two places,
//! each second:
//! - it sends every actor a [`Ping`]; one that has not answered within the stall limit has a
//!   handler running past its limit (or a blocked thread);
//! - it reads every pump's [`crate::runtime::progress`] — a pump working on one message
//!   for longer than the limit hangs, and so does one that has waited longer than the limit on a
//!   source with messages pending (its consumer's `num_pending`).
//!
//! Either is a stall: counted, logged as an error and raised as an `actor_stalled` alert, then
//! recovered.
//!
//! A stalled thread cannot be taken back in Rust, so recovery never waits for it:
//! - the Scheduler, the DagCoordinator and the Router keep nothing that JetStream does not hold
//!   (multi-active copies already race for the same work), so a stalled one is **replaced**: a
//!   fresh actor on a fresh arbiter rebuilds its view from JetStream, exactly as after a
//!   restart, and the stalled arbiter is told to stop (it exits if its thread ever returns;
//!   until then anything it does is de-duplicated like another node's copy);
//! - the WorkerSupervisor and the Reporter own what lives only on their thread (the attempts'
//!   child processes, the outbox's commit pump), so a stalled one **ends the process** (exit code
//!   70) for its service manager to start again: a worker node killed at any instant loses
//!   nothing (claims, the outbox on disk and the Router's hand-over make that safe, and the
//!   chaos suite kills workers with `kill -9` to prove it).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use crate::runtime::progress::{self, PumpState, Source};
use crate::runtime::supervision::{counters_of, start_supervised};

/// How often every actor is pinged.
pub(crate) const PING_EVERY: Duration = Duration::from_secs(1);
/// How long an actor may leave a ping unanswered before it counts as stalled.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(30);
/// The exit code of a node that ends itself because a worker-side actor stalled (EX_SOFTWARE).
pub(crate) const STALL_EXIT_CODE: i32 = 70;

/// Asks an actor to show that its mailbox moves; every watched actor answers it.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Ping;

/// Makes `$actor` answer [`Ping`].
macro_rules! answers_ping {
    ($actor:ty) => {
        impl actix::Handler<$crate::runtime::watchdog::Ping> for $actor {
            type Result = ();

            fn handle(&mut self, _: $crate::runtime::watchdog::Ping, _: &mut Self::Context) {}
        }
    };
}
pub(crate) use answers_ping;

/// What the watchdog does with a stalled actor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnStall {
    /// Start a fresh copy on a fresh arbiter.
    Replace,
    /// End the process (see the module docs for which actors and why).
    EndProcess,
}

type PingFuture = Pin<Box<dyn Future<Output = bool> + Send>>;

/// One actor under the watchdog: a way to ping it and a way to start it again.
pub(crate) trait Watched: Send {
    /// The actor's name (counters, logs).
    fn actor(&self) -> &'static str;
    /// What to do when it stalls.
    fn on_stall(&self) -> OnStall;
    /// Resolves to whether the actor answered within `limit`.
    fn ping(&self, limit: Duration) -> PingFuture;
    /// Starts a fresh copy on a new arbiter and tells the stalled one's arbiter to stop.
    fn replace(&mut self);
    /// Stops the actor and waits for its thread.
    fn stop(self: Box<Self>);
}

/// A supervised actor on an arbiter of its own, restartable from its factory.
pub(crate) struct Supervisee<A: Actor> {
    actor: &'static str,
    on_stall: OnStall,
    make: Arc<dyn Fn() -> A + Send + Sync>,
    arbiter: Arbiter,
    /// Held, it keeps the supervisor restarting the actor (see [`start_supervised`]).
    address: Addr<A>,
}

impl<A> Supervisee<A>
where
    A: Actor<Context = Context<A>> + Supervised + Handler<Ping>,
{
    /// Starts `make()`'s actor under a supervisor on a new arbiter.
    pub(crate) fn start(
        actor: &'static str,
        on_stall: OnStall,
        make: impl Fn() -> A + Send + Sync + 'static,
    ) -> Self {
        // Registered now, so that a node's heartbeat lists the actor before anything befalls it.
        counters_of(actor);
        let make: Arc<dyn Fn() -> A + Send + Sync> = Arc::new(make);
        let (arbiter, address) = launch(&make);
        Self {
            actor,
            on_stall,
            make,
            arbiter,
            address,
        }
    }
}

impl<A: Actor> Supervisee<A> {
    /// The actor's address (for a worker-side actor, never replaced, its address for good).
    pub(crate) fn address(&self) -> &Addr<A> {
        &self.address
    }
}

fn launch<A>(make: &Arc<dyn Fn() -> A + Send + Sync>) -> (Arbiter, Addr<A>)
where
    A: Actor<Context = Context<A>> + Supervised + Handler<Ping>,
{
    let arbiter = Arbiter::new();
    let factory = make.clone();
    let address = start_supervised(&arbiter.handle(), move || factory());
    (arbiter, address)
}

impl<A> Watched for Supervisee<A>
where
    A: Actor<Context = Context<A>> + Supervised + Handler<Ping>,
{
    fn actor(&self) -> &'static str {
        self.actor
    }

    fn on_stall(&self) -> OnStall {
        self.on_stall
    }

    fn ping(&self, limit: Duration) -> PingFuture {
        let answer = self.address.send(Ping);
        Box::pin(async move { matches!(tokio::time::timeout(limit, answer).await, Ok(Ok(()))) })
    }

    fn replace(&mut self) {
        // The fresh copy registers its own pumps; the stalled copy's are no longer watched.
        progress::forget(self.actor);
        let (arbiter, address) = launch(&self.make);
        let stalled = std::mem::replace(&mut self.arbiter, arbiter);
        // Dropping the stalled copy's address ends its supervision too.
        self.address = address;
        // Not joined: its thread may never come back.
        stalled.stop();
    }

    fn stop(self: Box<Self>) {
        let this = *self;
        this.arbiter.stop();
        let _ = this.arbiter.join();
    }
}

/// Whether a source has messages waiting (`None` when it cannot be told).
pub(crate) type PendingOf =
    Arc<dyn Fn(Source) -> Pin<Box<dyn Future<Output = Option<u64>> + Send>> + Send + Sync>;

/// A stall: which actor, and what showed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stall {
    /// The actor.
    pub actor: &'static str,
    /// What was seen, for logs and the alert.
    pub reason: String,
}

/// The stalled pumps of `actor`: one working on a message past `limit`, or waiting past `limit`
/// on a source with messages pending.
async fn stalled_pumps(
    actor: &'static str,
    limit: Duration,
    pending_of: &PendingOf,
) -> Option<String> {
    for pump in progress::pumps_of(actor) {
        let (state, for_how_long) = pump.state();
        if for_how_long < limit {
            continue;
        }
        match state {
            PumpState::Working => {
                return Some(format!(
                    "pump {} of {actor} has worked on one message for {for_how_long:?}",
                    pump.name()
                ))
            }
            PumpState::Waiting => {
                let Some(source) = pump.source().cloned() else {
                    continue;
                };
                if let Some(waiting) = pending_of(source.clone()).await.filter(|n| *n > 0) {
                    return Some(format!(
                        "pump {} of {actor} has read nothing for {for_how_long:?} while {waiting} \
                         messages wait in {}/{}",
                        pump.name(),
                        source.stream,
                        source.durable
                    ));
                }
            }
            PumpState::Held => {}
        }
    }
    None
}

/// Watches every actor of `watched` each [`PING_EVERY`] (its ping and its pumps, see the module
/// docs) and recovers the stalled ones; runs until the list is empty (the node stopped). `alert`
/// is awaited for each stall before its recovery ends; `end_process` is called for a stalled
/// actor whose policy is [`OnStall::EndProcess`].
pub(crate) async fn watch<F, Fut>(
    watched: Arc<std::sync::Mutex<Vec<Box<dyn Watched>>>>,
    stall_after: Duration,
    pending_of: PendingOf,
    alert: F,
    end_process: impl Fn(&'static str),
) where
    F: Fn(Stall) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut every = tokio::time::interval(PING_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let pings: Vec<_> = {
            let Ok(list) = watched.lock() else { return };
            if list.is_empty() {
                return;
            }
            list.iter()
                .map(|w| (w.actor(), w.ping(stall_after)))
                .collect()
        };
        let asked = Instant::now();
        let mut verdicts = Vec::with_capacity(pings.len());
        let answers = futures::future::join_all(pings.into_iter().map(|(_, p)| p)).await;
        let silent = asked.elapsed();
        let actors: Vec<&'static str> = {
            let Ok(list) = watched.lock() else { return };
            list.iter().map(|w| w.actor()).collect()
        };
        for (actor, answered) in actors.iter().zip(answers) {
            let reason = if answered {
                stalled_pumps(actor, stall_after, &pending_of).await
            } else {
                Some(format!(
                    "actor {actor} left a ping unanswered for {silent:?}"
                ))
            };
            verdicts.push(reason);
        }
        let mut stalled = Vec::new();
        {
            let Ok(mut list) = watched.lock() else { return };
            // Emptied meanwhile (the node is stopping): zip stops at once.
            for (entry, verdict) in list.iter_mut().zip(verdicts) {
                let Some(reason) = verdict else { continue };
                let actor = entry.actor();
                counters_of(actor).stalls.fetch_add(1, Ordering::Relaxed);
                if entry.on_stall() == OnStall::Replace {
                    tracing::error!(actor, %reason, "actor stalled; replacing it with a fresh copy that rebuilds from JetStream");
                    entry.replace();
                }
                stalled.push((Stall { actor, reason }, entry.on_stall()));
            }
        }
        for (stall, on_stall) in stalled {
            let actor = stall.actor;
            let reason = stall.reason.clone();
            alert(stall).await;
            if on_stall == OnStall::EndProcess {
                tracing::error!(actor, %reason, "actor stalled; ending the process for its service manager to start it again");
                end_process(actor);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;

    /// An actor that blocks its thread when told to, on its first start only.
    struct Sleepy {
        starts: Arc<AtomicUsize>,
    }

    impl Actor for Sleepy {
        type Context = Context<Self>;

        fn started(&mut self, _: &mut Self::Context) {
            self.starts.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Supervised for Sleepy {}
    crate::runtime::watchdog::answers_ping!(Sleepy);

    #[derive(Message)]
    #[rtype(result = "()")]
    struct Block(Duration);

    impl Handler<Block> for Sleepy {
        type Result = ();

        fn handle(&mut self, msg: Block, _: &mut Self::Context) {
            std::thread::sleep(msg.0);
        }
    }

    struct Outcome {
        starts: usize,
        stalls_counted: u64,
        alerts: Vec<&'static str>,
        ended: Vec<&'static str>,
    }

    /// Starts a watched `Sleepy` named `actor`, blocks its thread for `block` (or, with
    /// `hang_pump`, leaves a pump of it working on one message), and lets the watchdog (stall
    /// limit 1 s) run for `run`.
    fn watch_a_blocked_actor(
        actor: &'static str,
        on_stall: OnStall,
        block: Duration,
        run: Duration,
    ) -> Outcome {
        watch_a_stuck_actor(actor, on_stall, block, false, run)
    }

    fn watch_a_stuck_actor(
        actor: &'static str,
        on_stall: OnStall,
        block: Duration,
        hang_pump: bool,
        run: Duration,
    ) -> Outcome {
        let starts = Arc::new(AtomicUsize::new(0));
        let alerts = Arc::new(Mutex::new(Vec::new()));
        let ended = Arc::new(Mutex::new(Vec::new()));
        let (counted, alerted, ends) = (starts.clone(), alerts.clone(), ended.clone());
        System::new().block_on(async move {
            let supervisee = Supervisee::start(actor, on_stall, move || Sleepy {
                starts: counted.clone(),
            });
            supervisee.address.do_send(Block(block));
            // A pump that took a message and never comes back to its source, on the first copy
            // only (the replacement registers its pumps afresh, and forgets this one).
            let _stuck = hang_pump.then(|| {
                let pump = progress::register(actor, "stuck", None);
                pump.working();
                pump
            });
            let list: Arc<Mutex<Vec<Box<dyn Watched>>>> =
                Arc::new(Mutex::new(vec![Box::new(supervisee)]));
            let no_source: PendingOf = Arc::new(|_| Box::pin(std::future::ready(None)));
            let watchdog = actix::spawn(watch(
                list.clone(),
                Duration::from_secs(1),
                no_source,
                move |stall: Stall| {
                    alerted.lock().unwrap().push(stall.actor);
                    std::future::ready(())
                },
                move |actor| ends.lock().unwrap().push(actor),
            ));
            actix::clock::sleep(run).await;
            let entries: Vec<_> = list.lock().unwrap().drain(..).collect();
            for entry in entries {
                entry.stop();
            }
            let _ = watchdog.await;
        });
        let alerts = alerts.lock().unwrap().clone();
        let ended = ended.lock().unwrap().clone();
        Outcome {
            starts: starts.load(Ordering::SeqCst),
            stalls_counted: counters_of(actor).stalls.load(Ordering::Relaxed),
            alerts,
            ended,
        }
    }

    #[test]
    fn a_stalled_core_actor_is_replaced_once_and_the_copy_answers() {
        // Blocked for 6 s with a 1 s limit: noticed within ~2 s, replaced once; the fresh copy
        // answers every later ping, so nothing more happens.
        let outcome = watch_a_blocked_actor(
            "sleepy-replaced",
            OnStall::Replace,
            Duration::from_secs(6),
            Duration::from_secs(5),
        );
        assert_eq!(outcome.starts, 2, "the first start and one replacement");
        assert_eq!(outcome.stalls_counted, 1);
        assert_eq!(outcome.alerts, vec!["sleepy-replaced"]);
        assert!(outcome.ended.is_empty());
    }

    #[test]
    fn a_stalled_worker_side_actor_ends_the_process() {
        let outcome = watch_a_blocked_actor(
            "sleepy-ending",
            OnStall::EndProcess,
            Duration::from_secs(3),
            Duration::from_millis(2500),
        );
        assert_eq!(outcome.starts, 1, "never replaced");
        assert!(!outcome.ended.is_empty());
        assert_eq!(outcome.ended[0], "sleepy-ending");
    }

    #[test]
    fn a_hung_pump_is_noticed_while_the_mailbox_answers() {
        let outcome = watch_a_stuck_actor(
            "sleepy-pump",
            OnStall::Replace,
            Duration::ZERO,
            true,
            Duration::from_secs(4),
        );
        assert_eq!(outcome.starts, 2, "the first start and one replacement");
        assert_eq!(outcome.stalls_counted, 1);
        assert_eq!(outcome.alerts, vec!["sleepy-pump"]);
    }

    #[test]
    fn a_pump_waiting_on_a_source_with_nothing_pending_is_left_alone() {
        let pump = progress::register("idle-pump", "empty", None);
        pump.waiting();
        let no_source: PendingOf = Arc::new(|_| Box::pin(std::future::ready(Some(0))));
        let found =
            futures::executor::block_on(stalled_pumps("idle-pump", Duration::ZERO, &no_source));
        assert_eq!(found, None);
        let backlog: PendingOf = Arc::new(|_| Box::pin(std::future::ready(Some(3))));
        let sourced = progress::register(
            "idle-pump",
            "backlogged",
            Some(Source {
                stream: "S".into(),
                durable: "d".into(),
            }),
        );
        sourced.waiting();
        let found =
            futures::executor::block_on(stalled_pumps("idle-pump", Duration::ZERO, &backlog));
        assert!(found.is_some_and(|r| r.contains("3 messages wait in S/d")));
    }

    #[test]
    fn a_busy_but_answering_actor_is_left_alone() {
        // Blocked for less than the limit: slow, not stalled.
        let outcome = watch_a_blocked_actor(
            "sleepy-slow",
            OnStall::Replace,
            Duration::from_millis(500),
            Duration::from_secs(3),
        );
        assert_eq!(outcome.starts, 1);
        assert_eq!(outcome.stalls_counted, 0);
        assert!(outcome.alerts.is_empty());
    }
}
