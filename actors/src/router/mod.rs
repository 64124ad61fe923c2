//! # Router
//! Owns the view of live workers and their load ([`fleet`]), the dispatches awaiting an
//! acknowledgement ([`acks`]), and — on the node that holds the janitor lease — the handling of
//! workers that died ([`janitor`]). Reads the workers bucket (heartbeats, replayed on start), the
//! queues bucket (paused priorities), `ax.internal.ready.<priority>` (one consumer per priority)
//! and `ax.internal.ack.<node>`; writes `ax.internal.dispatch.<worker>.<priority>`, claim
//! reservations, and the `no_worker` and `worker_lost` outcomes.
//!
//! Each attempt goes to the eligible worker with the lowest score; a worker that does not
//! acknowledge within `ack_timeout` loses it to the next best (the claim reservation makes sure
//! the first dispatch can never run afterwards). With no eligible worker the attempt stays
//! `running` with tag `no_worker` and is looked at again every second. A paused priority's queue
//! is not consumed: its messages wait in the stream.

pub mod acks;
pub mod dead_letters;
pub mod fleet;
pub mod janitor;
pub mod split;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use async_nats::jetstream::AckKind;
use futures::StreamExt;
use tokio::sync::watch;

use ax_bus::client::claims::Reservation;
use ax_bus::client::kv_view::{FeedItem, KvFeed};
use ax_bus::client::Updated;
use ax_bus::error::During;
use ax_bus::ids::{DispatchId, NodeId, WorkerId};
use ax_bus::messages::{AlertKind, DispatchAck, QueueState, WorkItem, WorkerInfo};
use ax_bus::msg_id;
use ax_bus::spec::Priority;
use ax_bus::{codec, AxClient};

use crate::jetstream::consume::{self, ConsumerSpec};

use crate::jetstream::publish;
use crate::node::supervision::{note_restart, spawn_pump};
use crate::ActorError;
use acks::{AckTracker, Pending};
use fleet::{Fleet, Weights};

/// The actor's name in counters, logs and `ax nodes`.
pub const ACTOR: &str = "router";
const BATCH: usize = 256;
/// How soon an attempt with no eligible worker is looked at again.
const NO_WORKER_RETRY: Duration = Duration::from_secs(1);
/// How often acknowledgement deadlines are checked.
const DEADLINE_CHECK: Duration = Duration::from_millis(100);
/// How soon an unacknowledged dispatch whose handling failed is looked at again.
const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// The Router's settings.
#[derive(Clone, Debug)]
pub struct RouterConfig {
    /// Score weights.
    pub weights: Weights,
    /// A worker without a heartbeat for this long is dead.
    pub worker_ttl: Duration,
    /// How long a worker has to acknowledge a dispatch.
    pub ack_timeout: Duration,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            weights: Weights::default(),
            worker_ttl: Duration::from_secs(10),
            ack_timeout: Duration::from_secs(5),
        }
    }
}

/// What the Router's pumps share.
#[derive(Clone)]
pub struct Shared {
    client: AxClient,
    node: NodeId,
    config: RouterConfig,
    fleet: Arc<Mutex<Fleet>>,
    acks: Arc<Mutex<AckTracker>>,
}

/// The Router actor.
pub struct Router {
    shared: Shared,
}

impl Router {
    /// A router on `client`, named `node` (its acknowledgements come on `ax.internal.ack.<node>`).
    pub fn new(client: AxClient, node: NodeId, config: RouterConfig) -> Self {
        let fleet = Fleet::new(config.weights.clone(), config.worker_ttl);
        Self {
            shared: Shared {
                client,
                node,
                config,
                fleet: Arc::new(Mutex::new(fleet)),
                acks: Arc::default(),
            },
        }
    }
}

impl Actor for Router {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let shared = &self.shared;
        spawn_pump(ACTOR, "workers", ctx, follow_workers(shared.clone()));
        spawn_pump(ACTOR, "acks", ctx, follow_acks(shared.clone()));
        spawn_pump(ACTOR, "deadlines", ctx, watch_deadlines(shared.clone()));
        spawn_pump(ACTOR, "janitor", ctx, janitor::run(shared.clone()));
        spawn_pump(
            ACTOR,
            "dead_letters",
            ctx,
            dead_letters::keep(shared.client.clone(), shared.node.clone()),
        );
        let mut gates = Vec::new();
        for priority in Priority::ALL {
            let (open_tx, open) = watch::channel(true);
            gates.push((priority, open_tx));
            spawn_pump(ACTOR, "ready", ctx, route(shared.clone(), priority, open));
        }
        spawn_pump(ACTOR, "queues", ctx, follow_queues(shared.clone(), gates));
        tracing::info!(node = %shared.node, "router started");
    }
}

crate::answers_ping!(Router);

impl Supervised for Router {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        note_restart(ACTOR);
        // The unacknowledged dispatches stay tracked across the restart: nothing else in the
        // system knows that they are in the air. The fleet is rebuilt from the heartbeats.
        let config = &self.shared.config;
        self.shared.fleet = Arc::new(Mutex::new(Fleet::new(
            config.weights.clone(),
            config.worker_ttl,
        )));
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn follow_workers(shared: Shared) -> Result<(), ActorError> {
    let client = &shared.client;
    let mut feed = KvFeed::open(&client.js, &client.layout.workers_bucket(), ">").await?;
    let mut live = false;
    while let Some(item) = feed.next().await {
        match item? {
            FeedItem::Put { key, value, .. } => match codec::decode::<WorkerInfo>(&value) {
                Ok(info) => {
                    // A heartbeat replayed at start may be old: count it as seen a TTL ago, so
                    // that a live worker is back within one heartbeat and a dead one stays dead.
                    let seen = if live {
                        Instant::now()
                    } else {
                        Instant::now()
                            .checked_sub(shared.config.worker_ttl / 2)
                            .unwrap_or_else(Instant::now)
                    };
                    lock(&shared.fleet).heartbeat(info, seen);
                }
                Err(e) => {
                    tracing::warn!(worker = %key, error = %e, "undecodable heartbeat ignored")
                }
            },
            FeedItem::Deleted { key } => {
                lock(&shared.fleet).remove(&key);
            }
            FeedItem::Current => {
                live = true;
                tracing::info!(
                    workers = lock(&shared.fleet).len(),
                    "worker registry loaded"
                );
            }
        }
    }
    Ok(())
}

/// Follows the paused flags of the priority queues.
async fn follow_queues(
    shared: Shared,
    gates: Vec<(Priority, watch::Sender<bool>)>,
) -> Result<(), ActorError> {
    let client = &shared.client;
    let mut feed = KvFeed::open(&client.js, &client.layout.queues_bucket(), ">").await?;
    while let Some(item) = feed.next().await {
        let (key, paused) = match item? {
            FeedItem::Put { key, value, .. } => {
                let paused = codec::decode::<QueueState>(&value)
                    .map(|q| q.paused)
                    .unwrap_or(false);
                (key, paused)
            }
            FeedItem::Deleted { key } => (key, false),
            FeedItem::Current => continue,
        };
        for (priority, open) in &gates {
            if priority.as_str() == key {
                tracing::info!(queue = %key, paused, "queue state");
                open.send_replace(!paused);
            }
        }
    }
    Ok(())
}

/// Routes one priority's ready attempts, while its queue is open.
async fn route(
    shared: Shared,
    priority: Priority,
    mut open: watch::Receiver<bool>,
) -> Result<(), ActorError> {
    let client = shared.client.clone();
    let spec = ConsumerSpec {
        max_ack_pending: 4 * BATCH as i64,
        ..ConsumerSpec::new(
            client.layout.flow_stream(),
            format!("router-ready-{}", priority.as_str()),
            client.subjects().ready(priority),
        )
    };
    let mut batches = consume::messages(&client, &spec, BATCH)
        .await?
        .ready_chunks(BATCH);
    // A batch's dispatches settle (and are then tracked) while the next batch is routed.
    let mut settling = consume::SettleBehind::default();
    loop {
        // A paused queue is not pulled from: its messages stay in the stream.
        if open.wait_for(|open| *open).await.is_err() {
            return Ok(());
        }
        let Some(batch) = batches.next().await else {
            return Ok(());
        };
        let mut pending = Vec::with_capacity(batch.len());
        for message in batch {
            let message = message.during(|| "ready consumer")?;
            let Some(work) = consume::decode_or_dead_letter::<WorkItem>(
                &client,
                &shared.node,
                AlertKind::Flow,
                &message,
            )
            .await
            else {
                continue;
            };
            if !*open.borrow() {
                // Paused while the batch was in hand: put it back for later.
                let _ = message.ack_with(AckKind::Nak(Some(NO_WORKER_RETRY))).await;
                continue;
            }
            if work.spec.splits() && work.shard.is_none() {
                match split::expand(&shared, &work).await? {
                    Some(children) => {
                        for child in children {
                            shared.dispatch_now(child).await?;
                        }
                        let _ = message.ack().await;
                    }
                    None => {
                        let first_time = message.info().map(|i| i.delivered == 1).unwrap_or(true);
                        if first_time {
                            note_no_worker(&client, &work).await;
                        }
                        let _ = message.ack_with(AckKind::Nak(Some(NO_WORKER_RETRY))).await;
                    }
                }
                continue;
            }
            match shared.target(&work) {
                Target::Worker(worker) => {
                    let (work, ack) = shared.send(work, &worker).await?;
                    pending.push((message, ack, (work, worker)));
                }
                Target::NoWorker => {
                    let first_time = message.info().map(|i| i.delivered == 1).unwrap_or(true);
                    if first_time {
                        note_no_worker(&client, &work).await;
                    }
                    let _ = message.ack_with(AckKind::Nak(Some(NO_WORKER_RETRY))).await;
                }
                Target::PinnedGone(worker) => {
                    shared.fail_pinned(&work, &worker).await?;
                    let _ = message.ack().await;
                }
            }
        }
        let shared = shared.clone();
        settling
            .settle(pending, move |handed_off| {
                for (work, worker) in handed_off {
                    shared.track(work, worker, Vec::new());
                }
            })
            .await;
    }
}

/// Where an attempt goes.
enum Target {
    /// This worker.
    Worker(WorkerId),
    /// Nobody can take it now.
    NoWorker,
    /// It may run on this worker only, and that worker is gone.
    PinnedGone(WorkerId),
}

impl Shared {
    /// The worker for `work`: its pinned worker if it has one, else the best eligible one.
    fn target(&self, work: &WorkItem) -> Target {
        let mut fleet = lock(&self.fleet);
        match &work.pin {
            Some(worker) if fleet.alive(worker) => {
                fleet.charge(worker);
                Target::Worker(worker.clone())
            }
            Some(worker) => Target::PinnedGone(worker.clone()),
            None => fleet
                .pick(&work.spec.tags, &work.spec.exec.kind, &[])
                .map(Target::Worker)
                .unwrap_or(Target::NoWorker),
        }
    }

    /// Dispatches `work` at once (a shard), or puts it back on the ready queue when nobody can
    /// take it now.
    async fn dispatch_now(&self, work: WorkItem) -> Result<(), ActorError> {
        match self.target(&work) {
            Target::Worker(worker) => {
                let (work, ack) = self.send(work, &worker).await?;
                ack.await.during(|| "dispatch")?;
                self.track(work, worker, Vec::new());
                Ok(())
            }
            Target::NoWorker => {
                publish::to_stream_acked(
                    &self.client,
                    self.client.subjects().ready(work.spec.priority),
                    &msg_id::ready(&work.trace_id),
                    &work,
                )
                .await
            }
            Target::PinnedGone(worker) => self.fail_pinned(&work, &worker).await,
        }
    }

    /// Fails an attempt pinned to a worker that is gone (one run of a broadcast).
    async fn fail_pinned(&self, work: &WorkItem, worker: &WorkerId) -> Result<(), ActorError> {
        let message = format!("its worker {worker} is gone");
        let updated = self
            .client
            .update_instance(&work.instance_id, |r| {
                r.ended_early(
                    &work.trace_id,
                    ax_bus::State::Failed,
                    ax_bus::Tag::WorkerLost,
                    &message,
                )
            })
            .await?;
        if let Updated::Written(record, _) = updated {
            publish::to_stream_acked(
                &self.client,
                self.client.subjects().result(&record.job),
                &msg_id::result(&record.trace_id),
                &ax_bus::messages::ResultMessage::from_record(&record),
            )
            .await?;
            publish::event(&self.client, &record).await;
        }
        Ok(())
    }

    /// Publishes `work` to `worker`; an attempt without a dispatch id gets a fresh one (a
    /// re-dispatched attempt keeps the one it was reserved for).
    async fn send(
        &self,
        mut work: WorkItem,
        worker: &WorkerId,
    ) -> Result<(WorkItem, async_nats::jetstream::context::PublishAckFuture), ActorError> {
        let dispatch = work.dispatch.get_or_insert_with(DispatchId::random).clone();
        work.worker = Some(worker.clone());
        work.router = Some(self.node.clone());
        let ack = publish::to_stream(
            &self.client,
            self.client.subjects().dispatch(worker, work.spec.priority),
            &msg_id::dispatch(&work.trace_id, &dispatch),
            &work,
        )
        .await?;
        Ok((work, ack))
    }

    fn track(&self, work: WorkItem, worker: WorkerId, excluded: Vec<WorkerId>) {
        lock(&self.acks).track(
            Pending {
                work,
                worker,
                excluded,
            },
            self.config.ack_timeout,
        );
    }

    /// Sends an attempt elsewhere under a new dispatch, unless a worker claimed it meanwhile.
    /// `excluded` workers are passed over (they did not acknowledge, or they died).
    pub async fn redispatch(
        &self,
        mut work: WorkItem,
        excluded: Vec<WorkerId>,
    ) -> Result<(), ActorError> {
        if let Some(pin) = work.pin.clone() {
            // A pinned attempt has nowhere else to go.
            if !lock(&self.fleet).alive(&pin) {
                return self.fail_pinned(&work, &pin).await;
            }
        }
        let dispatch = DispatchId::random();
        match self
            .client
            .reserve_attempt(&work.trace_id, &dispatch)
            .await?
        {
            Reservation::Held(claim) => {
                tracing::debug!(trace = %work.trace_id, worker = ?claim.worker, "claimed meanwhile; not re-dispatched");
                return Ok(());
            }
            Reservation::Reserved => {}
        }
        work.dispatch = Some(dispatch.clone());
        let picked = {
            let mut fleet = lock(&self.fleet);
            match &work.pin {
                Some(pin) => fleet.alive(pin).then(|| pin.clone()),
                None => fleet
                    .pick(&work.spec.tags, &work.spec.exec.kind, &excluded)
                    .or_else(|| fleet.pick(&work.spec.tags, &work.spec.exec.kind, &[])),
            }
        };
        match picked {
            Some(worker) => {
                tracing::info!(trace = %work.trace_id, to = %worker, passed_over = ?excluded, "re-dispatching");
                let (work, ack) = self.send(work, &worker).await?;
                ack.await.during(|| "re-dispatch")?;
                self.track(work, worker, excluded);
            }
            None => {
                // Nobody can take it now: back to the ready queue, with its reservation.
                publish::to_stream_acked(
                    &self.client,
                    self.client.subjects().ready(work.spec.priority),
                    &msg_id::ready_again(&work.trace_id, &dispatch),
                    &work,
                )
                .await?;
            }
        }
        Ok(())
    }
}

/// Records acknowledgements of this Router's dispatches.
async fn follow_acks(shared: Shared) -> Result<(), ActorError> {
    let mut acks = shared
        .client
        .nats
        .subscribe(shared.client.subjects().ack(&shared.node))
        .await
        .during(|| "subscribe to acknowledgements")?;
    while let Some(message) = acks.next().await {
        match codec::decode::<DispatchAck>(&message.payload) {
            Ok(ack) => {
                lock(&shared.acks).acknowledged(&ack.trace_id, &ack.dispatch);
            }
            Err(e) => tracing::warn!(error = %e, "undecodable acknowledgement ignored"),
        }
    }
    Ok(())
}

/// Re-dispatches what was not acknowledged in time (unless its claim shows it was received).
/// A check or a re-dispatch that fails (NATS away) is tried again a second later: the tracked
/// dispatch is the only thing that knows the attempt is in the air, so it is never dropped.
async fn watch_deadlines(shared: Shared) -> Result<(), ActorError> {
    let mut every = tokio::time::interval(DEADLINE_CHECK);
    loop {
        every.tick().await;
        let expired = lock(&shared.acks).expired(Instant::now());
        for pending in expired {
            if let Err(e) = recheck(&shared, pending.clone()).await {
                tracing::warn!(trace = %pending.work.trace_id, error = %e, "unacknowledged dispatch not handled yet; trying again");
                lock(&shared.acks).track(pending, RECHECK_AFTER);
            }
        }
    }
}

/// Re-dispatches `pending` unless its claim shows that its worker received it.
async fn recheck(shared: &Shared, pending: Pending) -> Result<(), ActorError> {
    let trace = pending.work.trace_id.clone();
    match shared.client.claim_of(&trace).await? {
        Some((claim, _)) if claim.dispatch == pending.work.dispatch && claim.worker.is_some() => {
            // Claimed: only its acknowledgement was lost or late.
            return Ok(());
        }
        _ => {}
    }
    tracing::warn!(%trace, worker = %pending.worker, "dispatch not acknowledged in time");
    let mut excluded = pending.excluded;
    excluded.push(pending.worker);
    shared.redispatch(pending.work, excluded).await
}

/// Tags the record `no_worker` and says so in an event (a refusal means the attempt moved on).
async fn note_no_worker(client: &AxClient, work: &WorkItem) {
    match client
        .update_instance(&work.instance_id, |r| r.no_worker(&work.trace_id))
        .await
    {
        Ok(Updated::Written(record, _)) => publish::event(client, &record).await,
        Ok(_) => {}
        Err(e) => {
            tracing::debug!(instance = %work.instance_id, error = %e, "no_worker tag not written")
        }
    }
}
