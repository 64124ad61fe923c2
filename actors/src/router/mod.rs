//! # Router
//! Owns the view of live workers and their load ([`fleet`]), the dispatches awaiting an
//! acknowledgement ([`acks`]), and which priority queues are paused. Reads the workers bucket
//! (heartbeats, replayed on start), the queues bucket (paused priorities),
//! `ax.internal.ready.<priority>` (one consumer per priority) and `ax.internal.ack.<node>`; writes
//! `ax.internal.dispatch.<worker>.<priority>`, re-dispatch reservations, and the `no_worker` and
//! `worker_lost` outcomes. On the node that holds the janitor lease it also hands over the work of
//! workers that died ([`janitor`]), and every Router keeps the dead letters ([`dead_letters`]).
//!
//! The actor owns that state and changes it only in its message handlers; its pumps ([`pumps`])
//! read the streams and deliver to it — a heartbeat, a paused queue, an acknowledgement, a
//! batch of attempts to place — and its [`Dispatcher`] does the
//! publishing, asking the actor whenever a choice depends on its state.
//!
//! Each attempt goes to the eligible worker with the lowest score; a worker that does not
//! acknowledge within `ack_timeout` loses it to the next best (the reservation written in the
//! record makes sure the first dispatch can never start it afterwards). With no eligible worker the
//! attempt stays `running` with tag `no_worker` and is looked at again every second. A paused
//! priority's queue is not consumed: its messages wait in the stream.

pub(crate) mod acks;
pub(crate) mod backlog;
mod consistency;
pub(crate) mod dead_letters;
mod dispatch;
pub(crate) mod fleet;
mod in_flight;
pub(crate) mod janitor;
mod pumps;
mod retention;
pub(crate) mod split;

use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::watch;

use ax_bus::ids::{NodeId, WorkerId};
use ax_bus::messages::{DispatchAck, WorkerInfo};
use ax_bus::spec::resources::Resources;
use ax_bus::spec::Priority;
use ax_bus::AxClient;

use crate::runtime::supervision::{note_restart, spawn_pump};
use acks::{AckTracker, Pending};
use ax_bus::routing::RoutingPolicy;
pub(crate) use dispatch::Dispatcher;
use fleet::Fleet;
pub(crate) use fleet::{Request, Target};

/// The actor's name in counters, logs and `ax nodes`.
pub(crate) const ACTOR: &str = "router";
/// How often acknowledgement deadlines are checked.
const DEADLINE_CHECK: Duration = Duration::from_millis(100);

/// The Router's settings.
#[derive(Clone, Debug)]
pub struct RouterConfig {
    /// How workers are scored, and how long one may be silent before it is dead.
    pub policy: RoutingPolicy,
    /// How long a worker has to acknowledge a dispatch.
    pub ack_timeout: Duration,
    /// The backlog control (run where the janitor runs).
    pub backlog: backlog::BacklogConfig,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            policy: RoutingPolicy::default(),
            ack_timeout: Duration::from_secs(5),
            backlog: backlog::BacklogConfig::default(),
        }
    }
}

/// The Router actor.
#[derive(Debug)]
pub struct Router {
    client: AxClient,
    node: NodeId,
    config: RouterConfig,
    fleet: Fleet,
    /// Kept across restarts: nothing else in the system knows that these are in the air.
    acks: AckTracker,
    /// Whether each priority's queue is open; the ready pumps wait on them.
    gates: Vec<(Priority, watch::Sender<bool>)>,
}

impl Router {
    /// A router on `client`, named `node` (its acknowledgements come on `ax.internal.ack.<node>`).
    pub fn new(client: AxClient, node: NodeId, config: RouterConfig) -> Self {
        Self {
            fleet: Fleet::new(config.policy.clone()),
            client,
            node,
            config,
            acks: AckTracker::default(),
            gates: Priority::ALL
                .into_iter()
                .map(|p| (p, watch::channel(true).0))
                .collect(),
        }
    }

    fn dispatcher(&self, ctx: &Context<Self>) -> Dispatcher {
        Dispatcher {
            client: self.client.clone(),
            node: self.node.clone(),
            config: self.config.clone(),
            router: ctx.address(),
        }
    }

    /// Hands each dispatch whose deadline passed to a task that checks its record and
    /// re-dispatches it if nobody started it.
    fn check_deadlines(&mut self, ctx: &mut Context<Self>) {
        let expired = self.acks.expired(Instant::now());
        if expired.is_empty() {
            return;
        }
        let dispatcher = self.dispatcher(ctx);
        for pending in expired {
            dispatcher.recheck_in_background(pending);
        }
    }
}

impl Actor for Router {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let dispatcher = self.dispatcher(ctx);
        spawn_pump(ACTOR, "workers", ctx, pumps::workers(dispatcher.clone()));
        spawn_pump(ACTOR, "acks", ctx, pumps::acks(dispatcher.clone()));
        spawn_pump(ACTOR, "janitor", ctx, janitor::run(dispatcher.clone()));
        spawn_pump(
            ACTOR,
            "dead_letters",
            ctx,
            dead_letters::keep(self.client.clone(), self.node.clone()),
        );
        for (priority, gate) in &self.gates {
            let ready = pumps::ready(dispatcher.clone(), *priority, gate.subscribe());
            spawn_pump(ACTOR, "ready", ctx, ready);
        }
        spawn_pump(ACTOR, "queues", ctx, pumps::queues(dispatcher));
        ctx.run_interval(DEADLINE_CHECK, |act, ctx| act.check_deadlines(ctx));
        tracing::info!(node = %self.node, "router started");
    }
}

crate::runtime::watchdog::answers_ping!(Router);

impl Supervised for Router {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        note_restart(ACTOR);
        // The fleet is rebuilt from the heartbeats; the unacknowledged dispatches and the
        // gates stay.
        self.fleet = Fleet::new(self.config.policy.clone());
    }
}

/// Chooses a worker for each attempt (see [`Fleet::choose`]), none of them `excluded` unless
/// no other can take it. Each chosen worker is charged, so the next choice sees its load.
#[derive(Debug, Message)]
#[rtype(result = "Vec<Target>")]
pub(crate) struct Choose {
    pub(crate) works: Vec<Request>,
    pub(crate) excluded: Vec<WorkerId>,
}

impl Handler<Choose> for Router {
    type Result = MessageResult<Choose>;

    fn handle(&mut self, msg: Choose, _: &mut Self::Context) -> Self::Result {
        let targets = msg
            .works
            .iter()
            .map(|request| self.fleet.choose(request, &msg.excluded))
            .collect();
        MessageResult(targets)
    }
}

/// Every live worker offering the executor with all the tags that can ever hold the
/// resources asked (a broadcast's runs); none: what those of its tags and executor lack.
#[derive(Debug, Message)]
#[rtype(result = "Result<Vec<WorkerId>, Vec<ax_bus::room::Lack>>")]
pub(crate) struct Eligible {
    pub(crate) tags: Vec<String>,
    pub(crate) kind: String,
    pub(crate) resources: Resources,
}

impl Handler<Eligible> for Router {
    type Result = MessageResult<Eligible>;

    fn handle(&mut self, msg: Eligible, _: &mut Self::Context) -> Self::Result {
        MessageResult(
            self.fleet
                .eligible_all(&msg.tags, &msg.kind, &msg.resources),
        )
    }
}

/// Dispatches to track until their acknowledgement, or `after` from now.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Track {
    pub(crate) pending: Vec<Pending>,
    pub(crate) after: Duration,
}

impl Handler<Track> for Router {
    type Result = ();

    fn handle(&mut self, msg: Track, _: &mut Self::Context) {
        for pending in msg.pending {
            self.acks.track(pending, msg.after);
        }
    }
}

/// A worker's acknowledgement of a dispatch.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Acknowledged(pub(crate) DispatchAck);

impl Handler<Acknowledged> for Router {
    type Result = ();

    fn handle(&mut self, msg: Acknowledged, _: &mut Self::Context) {
        self.acks.acknowledged(&msg.0.trace_id, &msg.0.dispatch);
    }
}

/// What the workers bucket says.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) enum WorkerNews {
    /// A heartbeat, counted as seen at that instant.
    Heartbeat(Box<WorkerInfo>, Instant),
    /// A worker's entry is gone.
    Gone(WorkerId),
    /// The registry is loaded; what follows is live.
    Loaded,
}

impl Handler<WorkerNews> for Router {
    type Result = ();

    fn handle(&mut self, msg: WorkerNews, _: &mut Self::Context) {
        match msg {
            WorkerNews::Heartbeat(info, seen) => self.fleet.heartbeat(*info, seen),
            WorkerNews::Gone(id) => {
                self.fleet.remove(&id);
            }
            WorkerNews::Loaded => {
                tracing::info!(workers = self.fleet.len(), "worker registry loaded")
            }
        }
    }
}

/// A priority's queue was paused or resumed.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct QueueGate {
    pub(crate) priority: Priority,
    pub(crate) paused: bool,
}

impl Handler<QueueGate> for Router {
    type Result = ();

    fn handle(&mut self, msg: QueueGate, _: &mut Self::Context) {
        for (priority, open) in &self.gates {
            if *priority == msg.priority {
                tracing::info!(queue = %priority.as_str(), paused = msg.paused, "queue state");
                open.send_replace(!msg.paused);
            }
        }
    }
}

/// The janitor's sweep: the workers silent for longer than the TTL. With `grace`, every
/// worker's silence is counted from now first (the janitor was deaf until now: its lease is
/// new, or its connection came back).
#[derive(Debug, Message)]
#[rtype(result = "Vec<(WorkerId, WorkerInfo)>")]
pub(crate) struct Silent {
    pub(crate) grace: bool,
}

impl Handler<Silent> for Router {
    type Result = MessageResult<Silent>;

    fn handle(&mut self, msg: Silent, _: &mut Self::Context) -> Self::Result {
        if msg.grace {
            self.fleet.grant_grace();
        }
        MessageResult(self.fleet.silent())
    }
}

/// The workers whose heartbeat is recent (the backlog control's consumers).
#[derive(Debug, Message)]
#[rtype(result = "Vec<WorkerId>")]
pub(crate) struct Live;

impl Handler<Live> for Router {
    type Result = MessageResult<Live>;

    fn handle(&mut self, _: Live, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.fleet.live())
    }
}

/// A dead worker whose work was handed over: forgotten.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Forget(pub(crate) WorkerId);

impl Handler<Forget> for Router {
    type Result = ();

    fn handle(&mut self, msg: Forget, _: &mut Self::Context) {
        self.fleet.remove(&msg.0);
    }
}

/// Whether the Router knows the worker (alive, or silent and not yet handed over by the
/// janitor).
#[derive(Debug, Message)]
#[rtype(result = "bool")]
pub(crate) struct Knows(pub(crate) WorkerId);

impl Handler<Knows> for Router {
    type Result = bool;

    fn handle(&mut self, msg: Knows, _: &mut Self::Context) -> bool {
        self.fleet.knows(&msg.0)
    }
}
