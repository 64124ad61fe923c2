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
mod aged_writes;
pub(crate) mod backlog;
mod consistency;
pub use consistency::WRITES_READ_WITHIN;
pub(crate) mod dead_letters;
mod dispatch;
pub(crate) mod fleet;
mod in_flight;
pub(crate) mod janitor;
mod pumps;
mod retention;
mod share;
pub(crate) mod split;

use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::watch;

use std::collections::{BTreeSet, HashMap};

use ax_bus::ids::{Namespace, NodeId, TraceId, WorkerId};
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

/// Why an attempt waits at the Router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// No worker it may go to has room.
    Room,
    /// Its namespace runs its quota of attempts.
    Quota(u32),
}

/// How many attempts of `namespace` are dispatched or running: what this Router sent and has
/// not heard end of, or what the workers' heartbeats say they run (every Router's), whichever
/// is more.
fn running(
    outstanding: &share::Outstanding,
    heard: &HashMap<WorkerId, HashMap<Namespace, u32>>,
    namespace: &Namespace,
) -> u32 {
    let heard: u32 = heard.values().filter_map(|n| n.get(namespace)).sum();
    outstanding.of(namespace).max(heard)
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
    /// The namespaces other than `default` whose ready queues this Router pulls from.
    namespaces: BTreeSet<Namespace>,
    /// The namespaces' waiting attempts and their weights.
    share: share::Share,
    /// What this Router has at each worker while namespaces share them.
    outstanding: share::Outstanding,
    /// What each worker's last heartbeat says it runs of each namespace (all Routers' work).
    heard_running: HashMap<WorkerId, HashMap<Namespace, u32>>,
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
            namespaces: BTreeSet::new(),
            share: share::Share::default(),
            outstanding: share::Outstanding::default(),
            heard_running: HashMap::new(),
        }
    }

    /// Whether namespaces share the workers: jobs of one other than `default` exist, or a
    /// namespace has a quota of running attempts.
    fn sharing(&self) -> bool {
        !self.namespaces.is_empty() || self.share.has_quotas()
    }

    /// Hands freed slots to the waiting attempts (see [`share`]).
    fn grant(&mut self) {
        if self.share.is_empty() {
            return;
        }
        let (fleet, outstanding, heard) =
            (&mut self.fleet, &mut self.outstanding, &self.heard_running);
        self.share.grant(|namespace, quota, waiter| {
            if quota.is_some_and(|most| running(outstanding, heard, namespace) >= most) {
                return None;
            }
            let free = |info: &WorkerInfo| {
                outstanding.at(&info.id).max(info.running) < share::capacity(info)
            };
            let worker = fleet.choose_with_room(&waiter.request, &free)?;
            outstanding.sent(
                &worker,
                waiter.trace.clone(),
                namespace.clone(),
                Instant::now(),
            );
            Some(Target::Worker(worker))
        });
    }

    /// Where `request` (attempt `trace`) goes while namespaces share the workers: a worker
    /// with room, or why it must wait.
    fn place_shared(
        &mut self,
        namespace: &Namespace,
        priority: Priority,
        request: &Request,
        trace: &TraceId,
    ) -> Result<Target, Wait> {
        if let Some(most) = self.share.quota(namespace) {
            if running(&self.outstanding, &self.heard_running, namespace) >= most {
                return Err(Wait::Quota(most));
            }
        }
        let target = if priority == Priority::High || request.pin.is_some() {
            self.fleet.choose(request, &[])
        } else if let Some(nowhere) = self.fleet.unplaceable(request) {
            return Ok(nowhere);
        } else if self.share.waits(namespace, priority) {
            return Err(Wait::Room);
        } else {
            let outstanding = &self.outstanding;
            let free = |info: &WorkerInfo| {
                outstanding.at(&info.id).max(info.running) < share::capacity(info)
            };
            let worker = self.fleet.choose_with_room(request, &free);
            Target::Worker(worker.ok_or(Wait::Room)?)
        };
        if let Target::Worker(worker) = &target {
            self.outstanding
                .sent(worker, trace.clone(), namespace.clone(), Instant::now());
            self.share.charge(namespace);
        }
        Ok(target)
    }

    /// Starts pulling from `namespace`'s ready queues.
    fn pull_namespace(&mut self, namespace: Namespace, ctx: &mut Context<Self>) {
        if namespace.as_str() == ax_bus::ids::DEFAULT_NAMESPACE
            || !self.namespaces.insert(namespace.clone())
        {
            return;
        }
        tracing::info!(%namespace, "pulling the ready queues of a namespace");
        let dispatcher = self.dispatcher(ctx);
        for (priority, gate) in &self.gates {
            let ready = pumps::ready(
                dispatcher.clone(),
                *priority,
                namespace.clone(),
                gate.subscribe(),
            );
            spawn_pump(ACTOR, "ready", ctx, ready);
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
            let ready = pumps::ready(
                dispatcher.clone(),
                *priority,
                Namespace::default_namespace(),
                gate.subscribe(),
            );
            spawn_pump(ACTOR, "ready", ctx, ready);
        }
        spawn_pump(
            ACTOR,
            "namespaces",
            ctx,
            pumps::namespaces(dispatcher.clone()),
        );
        spawn_pump(ACTOR, "queues", ctx, pumps::queues(dispatcher));
        ctx.run_interval(DEADLINE_CHECK, |act, ctx| {
            act.check_deadlines(ctx);
            act.grant();
        });
        tracing::info!(node = %self.node, "router started");
    }
}

crate::runtime::watchdog::answers_ping!(Router);

impl Supervised for Router {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        note_restart(ACTOR);
        // The fleet is rebuilt from the heartbeats, the namespaces and their weights from
        // their buckets (the waiting attempts' pullers died with the actor's context); the
        // unacknowledged dispatches and the gates stay.
        self.fleet = Fleet::new(self.config.policy.clone());
        self.namespaces.clear();
        self.share = share::Share::default();
        self.outstanding = share::Outstanding::default();
        self.heard_running.clear();
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
        self.outstanding
            .started(&msg.0.worker, &msg.0.trace_id, Instant::now());
    }
}

/// A worker's word that an attempt this Router sent it ended.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Ended(pub(crate) DispatchAck);

impl Handler<Ended> for Router {
    type Result = ();

    fn handle(&mut self, msg: Ended, _: &mut Self::Context) {
        self.outstanding.ended(&msg.0.worker, &msg.0.trace_id);
        self.grant();
    }
}

/// Where a batch of one namespace's attempts of one priority goes (see [`share`]): the
/// first ones placed now, and each of the others, which must wait for a slot, where its
/// worker will be told (in order: a namespace's slots are granted first come, first served).
#[derive(Debug, Message)]
#[rtype(result = "Placed")]
pub(crate) struct Place {
    pub(crate) namespace: Namespace,
    pub(crate) priority: Priority,
    pub(crate) works: Vec<(Request, TraceId)>,
}

/// The answer to [`Place`].
#[derive(Debug)]
pub(crate) struct Placed {
    /// Where the first attempts go, in order.
    pub(crate) now: Vec<Target>,
    /// The others' workers, each once a slot is granted to it.
    pub(crate) later: Vec<tokio::sync::oneshot::Receiver<Target>>,
    /// Whether the workers should tell of their ends (namespaces share them).
    pub(crate) tell_end: bool,
    /// Why the others wait, where it is more than room (their namespace's quota).
    pub(crate) why: Option<String>,
}

impl Handler<Place> for Router {
    type Result = MessageResult<Place>;

    fn handle(&mut self, msg: Place, _: &mut Self::Context) -> Self::Result {
        let mut now = Vec::with_capacity(msg.works.len());
        if !self.sharing() {
            for (request, _) in &msg.works {
                now.push(self.fleet.choose(request, &[]));
            }
            return MessageResult(Placed {
                now,
                later: Vec::new(),
                tell_end: false,
                why: None,
            });
        }
        // Those already waiting first.
        self.grant();
        let mut works = msg.works.into_iter();
        for (request, trace) in works.by_ref() {
            match self.place_shared(&msg.namespace, msg.priority, &request, &trace) {
                Ok(target) => now.push(target),
                Err(wait) => {
                    let first = std::iter::once((request, trace));
                    let later = first
                        .chain(works.by_ref())
                        .map(|(request, trace)| {
                            let (reply, later) = tokio::sync::oneshot::channel();
                            let waiter = share::Waiter {
                                request,
                                trace,
                                reply,
                            };
                            self.share.wait(msg.namespace.clone(), msg.priority, waiter);
                            later
                        })
                        .collect();
                    let why = match wait {
                        Wait::Room => None,
                        Wait::Quota(most) => Some(format!(
                            "waiting: namespace {} has {most} attempts running, its quota \
                             (`ax namespace set {} --max-running`)",
                            msg.namespace, msg.namespace
                        )),
                    };
                    return MessageResult(Placed {
                        now,
                        later,
                        tell_end: true,
                        why,
                    });
                }
            }
        }
        MessageResult(Placed {
            now,
            later: Vec::new(),
            tell_end: true,
            why: None,
        })
    }
}

/// A namespace other than `default` has jobs (or settings): its ready queues are pulled.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct NamespaceSeen(pub(crate) Namespace);

impl Handler<NamespaceSeen> for Router {
    type Result = ();

    fn handle(&mut self, msg: NamespaceSeen, ctx: &mut Self::Context) {
        self.pull_namespace(msg.0, ctx);
    }
}

/// A namespace's settings were stored (`None`: removed).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Settings {
    pub(crate) namespace: Namespace,
    pub(crate) settings: Option<ax_bus::messages::NamespaceSettings>,
}

impl Handler<Settings> for Router {
    type Result = ();

    fn handle(&mut self, msg: Settings, ctx: &mut Self::Context) {
        self.share.set(msg.namespace.clone(), msg.settings.as_ref());
        self.pull_namespace(msg.namespace, ctx);
        self.grant();
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
            WorkerNews::Heartbeat(info, seen) => {
                self.outstanding
                    .heard(&info.id, &info.attempts, Instant::now());
                let running = share::running_by_namespace(&info.attempts, &self.namespaces);
                self.heard_running.insert(info.id.clone(), running);
                self.fleet.heartbeat(*info, seen);
                self.grant();
            }
            WorkerNews::Gone(id) => {
                self.fleet.remove(&id);
                self.outstanding.forget(&id);
                self.heard_running.remove(&id);
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
        self.outstanding.forget(&msg.0);
        self.heard_running.remove(&msg.0);
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
