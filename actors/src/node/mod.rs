//! A node: the actors of the roles it runs ([`Role`]), each on an arbiter (thread) of its own,
//! under a supervisor and the watchdog, with the node's helpers beside them (clock guard,
//! heartbeat, alert webhook).

pub(crate) mod heartbeat;
mod roles;
pub(crate) mod webhook;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;

use ax_bus::ids::NodeId;
use ax_bus::messages::AlertKind;
use ax_bus::AxClient;

use crate::dag::DagCoordinator;
use crate::reporter::Reporter;
use crate::router::{Router, RouterConfig};
use crate::runtime::clock::Clock;
use crate::runtime::clock_guard::ClockGuard;
use crate::runtime::watchdog::{OnStall, Supervisee, Watched, STALL_EXIT_CODE};
use crate::runtime::{clock_guard, progress, watchdog};
use crate::scheduler::partitions::Partitions;
use crate::scheduler::Scheduler;
use crate::worker::executor::Registry;
use crate::worker::{WorkerConfig, WorkerSupervisor};
use crate::ActorError;
use crate::{dag, reporter, router, scheduler, worker};
pub use roles::{parse_roles, Role, RoleError};
use webhook::{Feed, WebhookConfig};

use crate::jetstream::publish;

/// A node's settings.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Node name (logs, alerts).
    pub name: NodeId,
    /// Roles to run.
    pub roles: BTreeSet<Role>,
    /// Worker settings (used with the worker role).
    pub worker: WorkerConfig,
    /// Router settings (used with the router role).
    pub router: RouterConfig,
    /// Told the number of jobs each time the Scheduler has (re)loaded the registry: readiness,
    /// for whoever starts the node and wants to know.
    pub scheduler_loaded: Option<tokio::sync::watch::Sender<Option<usize>>>,
    /// Told the number of (job, date) days held each time the DagCoordinator has rebuilt its
    /// view and leads: readiness, likewise.
    pub dag_leading: Option<tokio::sync::watch::Sender<Option<usize>>>,
    /// The clock guard's limit; `None` turns the guard off (a test's manual clock).
    pub max_clock_skew: Option<Duration>,
    /// Where this node POSTs alerts (shared with every node that has one).
    pub alert_webhook: Option<WebhookConfig>,
    /// Where this node POSTs the attempts' OpenLineage events (shared likewise).
    pub lineage_endpoint: Option<WebhookConfig>,
    /// With a namespace, this node's DagCoordinator makes every attempt's OpenLineage events
    /// (naming ax's jobs in that namespace) while it leads; without, none.
    pub lineage_namespace: Option<String>,
    /// How long an actor may leave the watchdog's ping unanswered before it counts as stalled.
    pub stall_after: Duration,
    /// How far ahead the Scheduler lets a delayed trigger or a job's `at` be due.
    pub max_delay: Duration,
    /// The time zone of the day summaries' dates (the DagCoordinator's).
    pub summary_timezone: chrono_tz::Tz,
    /// Who may send which command (`[auth]`), checked by the Scheduler.
    pub auth: crate::AuthSettings,
    /// The number of partitions of the cron jobs, if this node's Scheduler is the deployment's
    /// first (fixed from then on).
    pub partitions: u16,
}

impl NodeConfig {
    /// A node named `name` running `roles`, its worker (if any) named after it and keeping its
    /// files in `data_dir`, everything else by default: the clock guard at its default limit,
    /// no webhook, the default stall limit and Router settings.
    pub fn new(name: NodeId, roles: BTreeSet<Role>, data_dir: PathBuf) -> Self {
        Self {
            worker: WorkerConfig::new(name.clone(), data_dir),
            name,
            roles,
            router: RouterConfig::default(),
            scheduler_loaded: None,
            dag_leading: None,
            max_clock_skew: Some(clock_guard::DEFAULT_MAX_CLOCK_SKEW),
            alert_webhook: None,
            lineage_endpoint: None,
            lineage_namespace: None,
            stall_after: watchdog::DEFAULT_STALL_AFTER,
            max_delay: crate::scheduler::delayed::DEFAULT_MAX_DELAY,
            summary_timezone: chrono_tz::UTC,
            auth: crate::AuthSettings::default(),
            partitions: ax_bus::partition::DEFAULT_COUNT,
        }
    }
}

/// Running actors; stopped on [`Node::stop`] or drop.
pub struct Node {
    /// The arbiters of the helpers (clock guard, alert forwarder, heartbeat, watchdog).
    arbiters: Vec<Arbiter>,
    /// The actors, each on an arbiter of its own, under the watchdog.
    actors: Arc<Mutex<Vec<Box<dyn Watched>>>>,
    /// The Scheduler's partitions (with the scheduler role).
    partitions: Option<Partitions>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let actors: Vec<&'static str> = match self.actors.lock() {
            Ok(actors) => actors.iter().map(|a| a.actor()).collect(),
            Err(_) => Vec::new(),
        };
        f.debug_struct("Node").field("actors", &actors).finish()
    }
}

/// What [`Node::start`] builds, piece by piece.
struct Starting {
    client: AxClient,
    config: NodeConfig,
    clock: Arc<dyn Clock>,
    arbiters: Vec<Arbiter>,
    actors: Vec<Box<dyn Watched>>,
    partitions: Option<Partitions>,
}

impl Starting {
    fn runs(&self, role: Role) -> bool {
        self.config.roles.contains(&role)
    }

    /// The clock guard of a node whose roles act on time (Scheduler, worker), on a thread of
    /// its own.
    fn clock_guard(&mut self) -> Option<ClockGuard> {
        let timed = self.runs(Role::Scheduler) || self.runs(Role::Worker);
        let limit = self.config.max_clock_skew.filter(|_| timed)?;
        let guard = ClockGuard::new(limit);
        let arbiter = Arbiter::new();
        let (client, clock, name) = (
            self.client.clone(),
            self.clock.clone(),
            self.config.name.clone(),
        );
        arbiter.spawn(guard.clone().run(client, clock, name));
        self.arbiters.push(arbiter);
        Some(guard)
    }

    fn webhook(&mut self) {
        let endpoints = [
            (self.config.alert_webhook.clone(), Feed::Alerts),
            (self.config.lineage_endpoint.clone(), Feed::Lineage),
        ];
        for (endpoint, feed) in endpoints {
            if let Some(endpoint) = endpoint {
                let arbiter = Arbiter::new();
                let (client, name) = (self.client.clone(), self.config.name.clone());
                arbiter.spawn(forward(client, endpoint, name, feed));
                self.arbiters.push(arbiter);
            }
        }
    }

    fn scheduler(&mut self, guard: Option<ClockGuard>) {
        let (client, clock, name) = (
            self.client.clone(),
            self.clock.clone(),
            self.config.name.clone(),
        );
        let loaded = self.config.scheduler_loaded.clone();
        let max_delay = self.config.max_delay;
        let auth = self.config.auth;
        let (partitions, keeper) = Partitions::new(
            client.clone(),
            name.clone(),
            self.config.partitions,
            guard.clone(),
        );
        let arbiter = Arbiter::new();
        arbiter.spawn(keeper);
        self.arbiters.push(arbiter);
        self.partitions = Some(partitions.clone());
        let make = move || {
            let mut scheduler = Scheduler::new(
                client.clone(),
                clock.clone(),
                name.clone(),
                partitions.clone(),
            )
            .limiting_delays_to(max_delay)
            .with_auth(auth);
            if let Some(guard) = guard.clone() {
                scheduler = scheduler.guarded_by(guard);
            }
            match loaded.clone() {
                Some(loaded) => scheduler.reporting_load(loaded),
                None => scheduler,
            }
        };
        let supervised = Supervisee::start(scheduler::ACTOR, OnStall::Replace, make);
        self.actors.push(Box::new(supervised));
    }

    fn dag(&mut self) {
        let (client, name) = (self.client.clone(), self.config.name.clone());
        let tz = self.config.summary_timezone;
        let namespace = self.config.lineage_namespace.clone();
        let leading = self.config.dag_leading.clone();
        let make = move || {
            DagCoordinator::new(client.clone(), name.clone())
                .summarizing_in(tz)
                .naming_lineage(namespace.clone())
                .reporting_lead(leading.clone())
        };
        self.actors.push(Box::new(Supervisee::start(
            dag::ACTOR,
            OnStall::Replace,
            make,
        )));
    }

    fn router(&mut self) {
        let (client, name) = (self.client.clone(), self.config.name.clone());
        let router = self.config.router.clone();
        let make = move || Router::new(client.clone(), name.clone(), router.clone());
        self.actors.push(Box::new(Supervisee::start(
            router::ACTOR,
            OnStall::Replace,
            make,
        )));
    }

    /// The worker and its Reporter. Built once: a stalled worker-side actor ends the process
    /// rather than being replaced (see the watchdog), so neither factory runs twice, and the
    /// Reporter's address stays the worker's for the life of the process.
    fn worker(&mut self, guard: Option<ClockGuard>) -> Result<(), ActorError> {
        let (client, name) = (self.client.clone(), self.config.name.clone());
        let outbox = self.config.worker.data_dir.join("outbox.log");
        let reporter = Mutex::new(Some(Reporter::open(client.clone(), name, &outbox)?));
        let executors = Registry::load(&self.config.worker.executors)?;
        let reporter = Supervisee::start(reporter::ACTOR, OnStall::EndProcess, move || {
            take_once(&reporter, reporter::ACTOR)
        });
        let reporter_address = reporter.address().clone();
        self.actors.push(Box::new(reporter));
        let worker = WorkerSupervisor::new(
            client,
            self.config.worker.clone(),
            executors,
            reporter_address,
            guard,
        );
        let worker = Mutex::new(Some(worker));
        let make = move || take_once(&worker, worker::ACTOR);
        self.actors.push(Box::new(Supervisee::start(
            worker::ACTOR,
            OnStall::EndProcess,
            make,
        )));
        Ok(())
    }

    /// The heartbeat and the watchdog, on a thread of their own; the node is then running.
    fn watched(mut self) -> Node {
        let actors = Arc::new(Mutex::new(self.actors));
        let (client, name) = (self.client.clone(), self.config.name.clone());
        let arbiter = Arbiter::new();
        let routing =
            (self.config.roles.contains(&Role::Router)).then(|| self.config.router.policy.clone());
        arbiter.spawn(heartbeat::beat(
            client.clone(),
            name.clone(),
            self.config.roles.clone(),
            self.partitions.clone(),
            routing,
            self.config.worker.data_dir.clone(),
        ));
        let pending_of = consumer_backlog(client.clone());
        let alert = move |stall: watchdog::Stall| {
            let (client, name) = (client.clone(), name.clone());
            async move {
                let raised =
                    publish::alert(&client, &name, AlertKind::ActorStalled, stall.reason, None);
                // A node about to end itself waits this long for its alert, no longer.
                let _ = tokio::time::timeout(ALERT_BEFORE_EXIT, raised).await;
            }
        };
        arbiter.spawn(watchdog::watch(
            actors.clone(),
            self.config.stall_after,
            pending_of,
            alert,
            |_actor| std::process::exit(STALL_EXIT_CODE),
        ));
        self.arbiters.push(arbiter);
        Node {
            arbiters: self.arbiters,
            actors,
            partitions: self.partitions,
        }
    }
}

impl Node {
    /// Starts the actors of `config.roles`. Call inside an actix `System`.
    pub fn start(
        client: AxClient,
        config: NodeConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ActorError> {
        let mut starting = Starting {
            client: client.writing_as(config.name.clone()),
            config,
            clock,
            arbiters: Vec::new(),
            actors: Vec::new(),
            partitions: None,
        };
        let guard = starting.clock_guard();
        starting.webhook();
        if starting.runs(Role::Scheduler) {
            starting.scheduler(guard.clone());
        }
        if starting.runs(Role::Dag) {
            starting.dag();
        }
        if starting.runs(Role::Router) {
            starting.router();
        }
        if starting.runs(Role::Worker) {
            starting.worker(guard)?;
        }
        Ok(starting.watched())
    }

    /// Hands this node's partitions of the cron jobs over to the other Schedulers (a graceful
    /// stop; without it they wait for this node's member key to expire). Call before
    /// [`Node::stop`].
    pub async fn hand_over(&self) {
        if let Some(partitions) = &self.partitions {
            partitions.hand_over().await;
        }
    }

    /// Stops every actor and waits for their threads.
    pub fn stop(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        let actors: Vec<_> = match self.actors.lock() {
            Ok(mut actors) => actors.drain(..).collect(),
            Err(poisoned) => poisoned.into_inner().drain(..).collect(),
        };
        for actor in actors {
            actor.stop();
        }
        for arbiter in &self.arbiters {
            arbiter.stop();
        }
        for arbiter in self.arbiters.drain(..) {
            let _ = arbiter.join();
        }
    }
}

/// Hands out the actor built before supervision started. Its supervisor restarts the same
/// value in place (actix calls the factory once), and the watchdog never asks for a second
/// copy of a worker-side actor; should that change, this fails loudly rather than share the
/// outbox between two reporters.
fn take_once<A>(slot: &Mutex<Option<A>>, actor: &str) -> A {
    let taken = match slot.lock() {
        Ok(mut slot) => slot.take(),
        Err(poisoned) => poisoned.into_inner().take(),
    };
    taken.unwrap_or_else(|| panic!("{actor} cannot be built twice in one process"))
}

/// How the watchdog asks JetStream whether a pump's source has messages waiting.
fn consumer_backlog(client: AxClient) -> watchdog::PendingOf {
    Arc::new(move |source: progress::Source| {
        let client = client.clone();
        Box::pin(async move {
            let stream = client.js.get_stream(&source.stream).await.ok()?;
            let info = stream.consumer_info(&source.durable).await.ok()?;
            Some(info.num_pending)
        })
    })
}

/// How long a node that ends itself for a stall waits for its alert to be stored.
const ALERT_BEFORE_EXIT: Duration = Duration::from_secs(2);

/// Runs a webhook forwarder for ever, starting it again a second after it fails.
async fn forward(client: AxClient, endpoint: WebhookConfig, node: NodeId, feed: Feed) {
    loop {
        if let Err(e) = webhook::forward(client.clone(), endpoint.clone(), node.clone(), feed).await
        {
            tracing::warn!(error = %e, ?feed, "webhook forwarder stopped; starting it again");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop_all();
    }
}
