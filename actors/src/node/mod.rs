//! A node: the actors of the roles it runs, each on an arbiter (thread) of its own.
//!
//! Roles: `scheduler`, `dag`, `router`, `worker` and `reporter`. A worker's outcomes go through
//! the reporter on the same node (its outbox is a local file), so `worker` brings `reporter`
//! with it and `reporter` is refused without `worker`.

pub(crate) mod alert_webhook;
pub(crate) mod clock;
pub(crate) mod clock_guard;
pub(crate) mod heartbeat;
pub(crate) mod lease;
pub(crate) mod progress;
pub(crate) mod supervision;
pub(crate) mod watchdog;

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;

use ax_bus::ids::NodeId;
use ax_bus::messages::AlertKind;
use ax_bus::AxClient;

use crate::dag::DagCoordinator;
use crate::reporter::Reporter;
use crate::router::{Router, RouterConfig};
use crate::scheduler::Scheduler;
use crate::worker::executor::Registry;
use crate::worker::{WorkerConfig, WorkerSupervisor};
use crate::ActorError;
use crate::{dag, reporter, router, scheduler, worker};
use alert_webhook::WebhookConfig;
use clock::Clock;
use clock_guard::ClockGuard;
use watchdog::{OnStall, Supervisee, Watched, STALL_EXIT_CODE};

use crate::jetstream::publish;

/// What a node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Cron, time wheel, control commands, retries.
    Scheduler,
    /// Dependencies.
    Dag,
    /// Routing to workers.
    Router,
    /// Executing attempts.
    Worker,
    /// Reporting outcomes (beside a worker).
    Reporter,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 5] = [
        Role::Scheduler,
        Role::Dag,
        Role::Router,
        Role::Worker,
        Role::Reporter,
    ];

    /// The name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Scheduler => "scheduler",
            Role::Dag => "dag",
            Role::Router => "router",
            Role::Worker => "worker",
            Role::Reporter => "reporter",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a list of roles is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RoleError {
    /// A name that is no role.
    #[error("unknown role `{0}` (scheduler, dag, router, worker, reporter)")]
    Unknown(String),
    /// An empty list.
    #[error("no role given")]
    None,
    /// A reporter without its worker.
    #[error("role `reporter` reports a worker's outcomes and needs `worker` on the same node")]
    ReporterWithoutWorker,
}

impl FromStr for Role {
    type Err = RoleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| RoleError::Unknown(s.to_string()))
    }
}

/// Parses `scheduler,dag,...` (or `all`), adding `reporter` to `worker`.
pub fn parse_roles(text: &str) -> Result<BTreeSet<Role>, RoleError> {
    let mut roles = BTreeSet::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part == "all" {
            roles.extend(Role::ALL);
        } else {
            roles.insert(part.parse()?);
        }
    }
    if roles.is_empty() {
        return Err(RoleError::None);
    }
    if roles.contains(&Role::Reporter) && !roles.contains(&Role::Worker) {
        return Err(RoleError::ReporterWithoutWorker);
    }
    if roles.contains(&Role::Worker) {
        roles.insert(Role::Reporter);
    }
    Ok(roles)
}

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
    /// The clock guard's limit; `None` turns the guard off (a test's manual clock).
    pub max_clock_skew: Option<Duration>,
    /// Where this node POSTs alerts (shared with every node that has one).
    pub alert_webhook: Option<WebhookConfig>,
    /// How long an actor may leave the watchdog's ping unanswered before it counts as stalled.
    pub stall_after: Duration,
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
            max_clock_skew: Some(clock_guard::DEFAULT_MAX_CLOCK_SKEW),
            alert_webhook: None,
            stall_after: watchdog::DEFAULT_STALL_AFTER,
        }
    }
}

/// Running actors; stopped on [`Node::stop`] or drop.
pub struct Node {
    /// The arbiters of the helpers (clock guard, alert forwarder, heartbeat, watchdog).
    arbiters: Vec<Arbiter>,
    /// The actors, each on an arbiter of its own, under the watchdog.
    actors: Arc<Mutex<Vec<Box<dyn Watched>>>>,
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

impl Node {
    /// Starts the actors of `config.roles`. Call inside an actix `System`.
    pub fn start(
        client: AxClient,
        config: NodeConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ActorError> {
        let mut arbiters = Vec::new();
        let mut actors: Vec<Box<dyn Watched>> = Vec::new();
        let name = config.name.clone();
        let timed_roles =
            config.roles.contains(&Role::Scheduler) || config.roles.contains(&Role::Worker);
        let clock_guard = match config.max_clock_skew {
            Some(limit) if timed_roles => {
                let guard = ClockGuard::new(limit);
                let arbiter = Arbiter::new();
                arbiter.spawn(
                    guard
                        .clone()
                        .run(client.clone(), clock.clone(), name.clone()),
                );
                arbiters.push(arbiter);
                Some(guard)
            }
            _ => None,
        };
        if let Some(webhook) = config.alert_webhook.clone() {
            let arbiter = Arbiter::new();
            arbiter.spawn(forward_alerts(client.clone(), webhook, name.clone()));
            arbiters.push(arbiter);
        }
        if config.roles.contains(&Role::Scheduler) {
            let (client, clock, name) = (client.clone(), clock.clone(), name.clone());
            let loaded = config.scheduler_loaded.clone();
            let guard = clock_guard.clone();
            actors.push(Box::new(Supervisee::start(
                scheduler::ACTOR,
                OnStall::Replace,
                move || {
                    let mut scheduler = Scheduler::new(client.clone(), clock.clone(), name.clone());
                    if let Some(guard) = guard.clone() {
                        scheduler = scheduler.guarded_by(guard);
                    }
                    match loaded.clone() {
                        Some(loaded) => scheduler.reporting_load(loaded),
                        None => scheduler,
                    }
                },
            )));
        }
        if config.roles.contains(&Role::Dag) {
            let (client, name) = (client.clone(), name.clone());
            actors.push(Box::new(Supervisee::start(
                dag::ACTOR,
                OnStall::Replace,
                move || DagCoordinator::new(client.clone(), name.clone()),
            )));
        }
        if config.roles.contains(&Role::Router) {
            let (client, name) = (client.clone(), name.clone());
            let router = config.router.clone();
            actors.push(Box::new(Supervisee::start(
                router::ACTOR,
                OnStall::Replace,
                move || Router::new(client.clone(), name.clone(), router.clone()),
            )));
        }
        if config.roles.contains(&Role::Worker) {
            let outbox = config.worker.data_dir.join("outbox.log");
            let reporter = Reporter::open(client.clone(), name.clone(), &outbox)?;
            let executors = Registry::load(&config.worker.executors)?;
            // Built once: a stalled worker-side actor ends the process rather than being
            // replaced (see the watchdog), so neither factory runs twice, and the Reporter's
            // address stays the worker's for the life of the process.
            let reporter = Mutex::new(Some(reporter));
            let reporter = Supervisee::start(reporter::ACTOR, OnStall::EndProcess, move || {
                take_once(&reporter, reporter::ACTOR)
            });
            let reporter_address = reporter.address().clone();
            actors.push(Box::new(reporter));
            let worker = Mutex::new(Some(WorkerSupervisor::new(
                client.clone(),
                config.worker.clone(),
                executors,
                reporter_address,
                clock_guard,
            )));
            actors.push(Box::new(Supervisee::start(
                worker::ACTOR,
                OnStall::EndProcess,
                move || take_once(&worker, worker::ACTOR),
            )));
        }
        let actors = Arc::new(Mutex::new(actors));
        let arbiter = Arbiter::new();
        arbiter.spawn(heartbeat::beat(
            client.clone(),
            name.clone(),
            config.roles.clone(),
        ));
        let pending_of = consumer_backlog(client.clone());
        arbiter.spawn(watchdog::watch(
            actors.clone(),
            config.stall_after,
            pending_of,
            move |stall: watchdog::Stall| {
                let (client, name) = (client.clone(), name.clone());
                async move {
                    let raised =
                        publish::alert(&client, &name, AlertKind::ActorStalled, stall.reason, None);
                    let _ = tokio::time::timeout(ALERT_BEFORE_EXIT, raised).await;
                }
            },
            |_actor| std::process::exit(STALL_EXIT_CODE),
        ));
        arbiters.push(arbiter);
        Ok(Self { arbiters, actors })
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

/// Runs the webhook forwarder for ever, starting it again a second after it fails.
async fn forward_alerts(client: AxClient, webhook: WebhookConfig, node: NodeId) {
    loop {
        if let Err(e) = alert_webhook::forward(client.clone(), webhook.clone(), node.clone()).await
        {
            tracing::warn!(error = %e, "alert webhook forwarder stopped; starting it again");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_and_worker_brings_its_reporter() {
        assert_eq!(parse_roles("all").unwrap().len(), 5);
        let roles = parse_roles("scheduler, worker").unwrap();
        assert!(roles.contains(&Role::Reporter));
        assert_eq!(
            parse_roles("reporter"),
            Err(RoleError::ReporterWithoutWorker)
        );
        assert!(parse_roles("scheduler,admin")
            .unwrap_err()
            .to_string()
            .contains("unknown role `admin`"));
        assert!(parse_roles("").is_err());
    }
}
