//! The Router's pumps: each reads one source and delivers what it reads to the actor (or
//! publishes what the actor decided). A pump that ends or fails stops the actor, which its
//! supervisor restarts; each reports its progress to the watchdog.

use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::watch;

use ax_bus::client::kv_view::{FeedItem, KvFeed};
use ax_bus::codec;
use ax_bus::error::During;
use ax_bus::ids::WorkerId;
use ax_bus::messages::{AlertKind, DispatchAck, DispatchAcks, QueueState, WorkItem, WorkerInfo};
use ax_bus::spec::Priority;

use super::acks::Pending;
use super::{
    split, Acknowledged, Choose, Dispatcher, QueueGate, Request, Target, WorkerNews, ACTOR,
};
use crate::jetstream::consume::{self, ConsumerSpec};
use crate::runtime::progress;
use crate::ActorError;

const BATCH: usize = 256;
/// How soon an attempt with no eligible worker is looked at again.
const NO_WORKER_RETRY: Duration = Duration::from_secs(1);

/// Follows the workers bucket: heartbeats and removals.
pub(super) async fn workers(dispatcher: Dispatcher) -> Result<(), ActorError> {
    let client = &dispatcher.client;
    let feed = KvFeed::open(&client.js, &client.layout.workers_bucket(), ">").await?;
    let pump = progress::register(ACTOR, "workers", None);
    let mut feed = progress::Progressed::new(feed.into_stream(), pump);
    let ttl = dispatcher.config.policy.worker_ttl();
    let mut live = false;
    while let Some(item) = feed.next().await {
        let news = match item? {
            FeedItem::Put { key, value, .. } => match codec::decode::<WorkerInfo>(&value) {
                // A heartbeat replayed at start may be old: count it as seen half a TTL ago,
                // so that a live worker is back within one heartbeat and a dead one stays dead.
                Ok(info) => {
                    let seen = if live {
                        Instant::now()
                    } else {
                        Instant::now()
                            .checked_sub(ttl / 2)
                            .unwrap_or_else(Instant::now)
                    };
                    WorkerNews::Heartbeat(Box::new(info), seen)
                }
                Err(e) => {
                    tracing::warn!(worker = %key, error = %e, "undecodable heartbeat ignored");
                    continue;
                }
            },
            FeedItem::Deleted { key } => match WorkerId::parse(&key) {
                Ok(id) => WorkerNews::Gone(id),
                Err(e) => {
                    tracing::warn!(error = %e, "a workers entry of no worker ignored");
                    continue;
                }
            },
            FeedItem::Current => {
                live = true;
                WorkerNews::Loaded
            }
        };
        dispatcher.router.send(news).await?;
    }
    Ok(())
}

/// Follows the paused flags of the priority queues.
pub(super) async fn queues(dispatcher: Dispatcher) -> Result<(), ActorError> {
    let client = &dispatcher.client;
    let feed = KvFeed::open(&client.js, &client.layout.queues_bucket(), ">").await?;
    let pump = progress::register(ACTOR, "queues", None);
    let mut feed = progress::Progressed::new(feed.into_stream(), pump);
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
        if let Some(priority) = Priority::ALL.into_iter().find(|p| p.as_str() == key) {
            dispatcher
                .router
                .send(QueueGate { priority, paused })
                .await?;
        }
    }
    Ok(())
}

/// Delivers the acknowledgements of this Router's dispatches (`ax.internal.ack.<node>`).
pub(super) async fn acks(dispatcher: Dispatcher) -> Result<(), ActorError> {
    let client = &dispatcher.client;
    let subscription = client
        .nats
        .subscribe(client.subjects().ack(&dispatcher.node))
        .await
        .during(|| "subscribe to acknowledgements")?;
    let pump = progress::register(ACTOR, "acks", None);
    let mut acks = progress::Progressed::new(subscription, pump);
    while let Some(message) = acks.next().await {
        let acks = match codec::decode::<DispatchAcks>(&message.payload) {
            Ok(batch) => batch.acks,
            Err(_) => match codec::decode::<DispatchAck>(&message.payload) {
                Ok(ack) => vec![ack],
                Err(e) => {
                    tracing::warn!(error = %e, "undecodable acknowledgement ignored");
                    continue;
                }
            },
        };
        for ack in acks {
            dispatcher.router.send(Acknowledged(ack)).await?;
        }
    }
    Ok(())
}

/// Routes one priority's ready attempts, while its queue is open.
pub(super) async fn ready(
    dispatcher: Dispatcher,
    priority: Priority,
    mut open: watch::Receiver<bool>,
) -> Result<(), ActorError> {
    let client = dispatcher.client.clone();
    let spec = ConsumerSpec {
        max_ack_pending: 4 * BATCH as i64,
        ..ConsumerSpec::new(
            client.layout.flow_stream(),
            format!("router-ready-{}", priority.as_str()),
            client.subjects().ready(priority),
        )
    };
    let pump = progress::register(
        ACTOR,
        format!("ready-{}", priority.as_str()),
        Some(spec.source()),
    );
    let messages = consume::messages(&client, &spec, BATCH).await?;
    let mut batches = progress::Progressed::new(messages.ready_chunks(BATCH), pump.clone());
    // A batch's dispatches settle (and are then tracked) while the next batch is routed.
    let mut settling = consume::SettleBehind::default();
    loop {
        // A paused queue is not pulled from: its messages stay in the stream.
        if !*open.borrow() {
            pump.held();
        }
        if open.wait_for(|open| *open).await.is_err() {
            return Ok(());
        }
        let Some(batch) = batches.next().await else {
            return Ok(());
        };
        let mut works = Vec::with_capacity(batch.len());
        for message in batch {
            let message = message.during(|| "ready consumer")?;
            let Some(work) = consume::decode_or_dead_letter::<WorkItem>(
                &client,
                &dispatcher.node,
                AlertKind::Flow,
                &message,
            )
            .await
            else {
                continue;
            };
            if !*open.borrow() {
                // Paused while the batch was in hand: put it back for later.
                consume::nak(&message, NO_WORKER_RETRY).await;
                continue;
            }
            if !ax_bus::spec::is_executor_name(work.spec.exec.name()) {
                dispatcher.fail_unknown_executor(&work).await?;
                consume::ack(&message).await;
                continue;
            }
            if work.spec.splits() && work.shard.is_none() {
                split_one(&dispatcher, work, message).await?;
                continue;
            }
            works.push((work, message));
        }
        let pending = place(&dispatcher, works).await?;
        let tracking = dispatcher.clone();
        settling
            .settle(pending, move |handed_off| {
                tracking.track(handed_off, tracking.config.ack_timeout)
            })
            .await;
    }
}

type Sent = (
    async_nats::jetstream::Message,
    async_nats::jetstream::context::PublishAckFuture,
    Pending,
);

/// Asks the Router where each attempt goes (one message for the batch) and publishes the
/// dispatches; returns what was sent, for settling.
async fn place(
    dispatcher: &Dispatcher,
    works: Vec<(WorkItem, async_nats::jetstream::Message)>,
) -> Result<Vec<Sent>, ActorError> {
    if works.is_empty() {
        return Ok(Vec::new());
    }
    let choice = Choose {
        works: works.iter().map(|(w, _)| Request::of(w)).collect(),
        excluded: Vec::new(),
    };
    let targets = dispatcher.router.send(choice).await?;
    let mut sent = Vec::with_capacity(works.len());
    for ((work, message), target) in works.into_iter().zip(targets) {
        match target {
            Target::Worker(worker) => {
                let (work, ack) = dispatcher.send(work, &worker).await?;
                sent.push((message, ack, Pending::new(work, worker, Vec::new())));
            }
            Target::NoWorker => no_worker_yet(dispatcher, &work, &message, None).await,
            Target::NoRoom(why) => no_worker_yet(dispatcher, &work, &message, Some(&why)).await,
            Target::PinnedGone(worker) => {
                dispatcher.fail_pinned(&work, &worker).await?;
                consume::ack(&message).await;
            }
        }
    }
    Ok(sent)
}

/// Nobody can take `work` now (`why`, where it is more than no worker offering its tags and
/// executor): tagged `no_worker` the first time, looked at again in a second.
async fn no_worker_yet(
    dispatcher: &Dispatcher,
    work: &WorkItem,
    message: &async_nats::jetstream::Message,
    why: Option<&str>,
) {
    let first_time = message.info().map(|i| i.delivered == 1).unwrap_or(true);
    if first_time {
        dispatcher.note_no_worker(work, why).await;
    }
    consume::nak(message, NO_WORKER_RETRY).await;
}

/// Splits an attempt into its shards or broadcast runs and dispatches them.
async fn split_one(
    dispatcher: &Dispatcher,
    work: WorkItem,
    message: async_nats::jetstream::Message,
) -> Result<(), ActorError> {
    match split::expand(dispatcher, &work).await? {
        split::Split::Children(children) => {
            for child in children {
                dispatcher.dispatch_now(child).await?;
            }
            consume::ack(&message).await;
        }
        split::Split::NoWorker(why) => {
            no_worker_yet(dispatcher, &work, &message, why.as_deref()).await
        }
    }
    Ok(())
}
