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
    split, Acknowledged, Dispatcher, Ended, NamespaceSeen, Place, QueueGate, Request, Settings,
    Target, WorkerNews, ACTOR,
};
use crate::jetstream::consume::{self, ConsumerSpec};
use crate::runtime::progress;
use crate::ActorError;
use ax_bus::ids::{JobName, Namespace};
use ax_bus::messages::NamespaceSettings;

const BATCH: usize = 256;
/// How soon an attempt with no eligible worker is looked at again.
const NO_WORKER_RETRY: Duration = Duration::from_secs(1);
/// How often the messages a pump holds for the share are kept in progress (a third of the
/// ready consumers' ack wait).
const HELD_PROGRESS_EVERY: Duration = Duration::from_secs(10);

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
        let (key, value) = match item? {
            FeedItem::Put { key, value, .. } => (key, Some(value)),
            FeedItem::Deleted { key } => (key, None),
            FeedItem::Current => continue,
        };
        if let Some(namespace) = NamespaceSettings::namespace_of(&key) {
            let settings = value.and_then(|v| codec::decode::<NamespaceSettings>(&v).ok());
            let set = Settings {
                namespace,
                settings,
            };
            dispatcher.router.send(set).await?;
            continue;
        }
        let paused = value
            .and_then(|v| codec::decode::<QueueState>(&v).ok())
            .is_some_and(|q| q.paused);
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
        let (acks, ended) = match codec::decode::<DispatchAcks>(&message.payload) {
            Ok(batch) => (batch.acks, batch.ended),
            Err(_) => match codec::decode::<DispatchAck>(&message.payload) {
                Ok(ack) => (vec![ack], Vec::new()),
                Err(e) => {
                    tracing::warn!(error = %e, "undecodable acknowledgement ignored");
                    continue;
                }
            },
        };
        for ack in acks {
            dispatcher.router.send(Acknowledged(ack)).await?;
        }
        for end in ended {
            dispatcher.router.send(Ended(end)).await?;
        }
    }
    Ok(())
}

/// Follows which namespaces other than `default` exist — those with jobs in the registry,
/// and those whose ready queues still hold work (of jobs deleted since) — so that their ready
/// queues are pulled.
pub(super) async fn namespaces(dispatcher: Dispatcher) -> Result<(), ActorError> {
    let client = &dispatcher.client;
    for namespace in namespaces_with_work(client).await? {
        dispatcher.router.send(NamespaceSeen(namespace)).await?;
    }
    let feed = KvFeed::open(&client.js, &client.layout.jobs_bucket(), ">").await?;
    let pump = progress::register(ACTOR, "namespaces", None);
    let mut feed = progress::Progressed::new(feed.into_stream(), pump);
    let mut seen = std::collections::BTreeSet::new();
    while let Some(item) = feed.next().await {
        let FeedItem::Put { key, .. } = item? else {
            continue;
        };
        let Ok(job) = JobName::parse(&key) else {
            continue;
        };
        if job.namespace() == ax_bus::ids::DEFAULT_NAMESPACE || seen.contains(job.namespace()) {
            continue;
        }
        seen.insert(job.namespace().to_string());
        if let Ok(namespace) = Namespace::parse(job.namespace()) {
            dispatcher.router.send(NamespaceSeen(namespace)).await?;
        }
    }
    Ok(())
}

/// The namespaces whose ready queues hold messages now.
async fn namespaces_with_work(
    client: &ax_bus::AxClient,
) -> Result<std::collections::BTreeSet<Namespace>, ActorError> {
    let flow = client
        .js
        .get_stream(client.layout.flow_stream())
        .await
        .during(|| "open the flow stream")?;
    let filter = format!("{}.*", client.subjects().ready_all().trim_end_matches(".>"));
    let filter = format!("{filter}.*");
    let mut subjects = flow
        .info_with_subjects(filter)
        .await
        .during(|| "read the ready queues' subjects")?;
    let mut namespaces = std::collections::BTreeSet::new();
    while let Some(entry) = subjects.next().await {
        let (subject, _) = entry.during(|| "read the ready queues' subjects")?;
        if let Some(namespace) = client.subjects().namespace_of_ready(&subject) {
            namespaces.insert(namespace);
        }
    }
    Ok(namespaces)
}

/// The durable consumer of `namespace`'s ready queue of `priority`: `router-ready-<priority>`
/// for `default` (as before namespaces), `router-ready-<priority>-<namespace>` for another.
pub(super) fn ready_consumer(priority: Priority, namespace: &Namespace) -> String {
    if namespace.as_str() == ax_bus::ids::DEFAULT_NAMESPACE {
        format!("router-ready-{}", priority.as_str())
    } else {
        format!("router-ready-{}-{namespace}", priority.as_str())
    }
}

/// Routes one namespace's ready attempts of one priority, while its queue is open.
pub(super) async fn ready(
    dispatcher: Dispatcher,
    priority: Priority,
    namespace: Namespace,
    mut open: watch::Receiver<bool>,
) -> Result<(), ActorError> {
    let client = dispatcher.client.clone();
    let spec = ConsumerSpec {
        max_ack_pending: 4 * BATCH as i64,
        ..ConsumerSpec::new(
            client.layout.flow_stream(),
            ready_consumer(priority, &namespace),
            client.subjects().ready_in(priority, namespace.as_str()),
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
    let tracking = dispatcher.clone();
    let track = move |handed_off| tracking.track(handed_off, tracking.config.ack_timeout);
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
        // Placed as far as the share lets; each attempt that must wait for a slot is held
        // (kept in progress) until one is granted to it.
        let (sent, later, why) = place(&dispatcher, &namespace, priority, &mut works).await?;
        settling.settle(sent, track.clone()).await;
        if later.is_empty() {
            continue;
        }
        if let Some(why) = why {
            for (work, message) in &works {
                // Said once, on the attempt's first wait.
                if message.info().map(|i| i.delivered == 1).unwrap_or(true) {
                    dispatcher.note_held(work, &why).await;
                }
            }
        }
        pump.held();
        for later in later {
            let target = held(later, &works).await?;
            if works.is_empty() {
                break;
            }
            let (work, message) = works.remove(0);
            let sent = send_placed(&dispatcher, work, message, target, true).await?;
            settling.settle(sent, track.clone()).await;
        }
        pump.working();
    }
}

type Sent = (
    async_nats::jetstream::Message,
    async_nats::jetstream::context::PublishAckFuture,
    Pending,
);

/// Asks the Router where each of `works` goes (one message for the batch) and publishes the
/// dispatches of those placed now, taking them out of `works`; returns what was sent, for
/// settling, where each of the rest will go once it is granted a slot, and why they wait where
/// it is more than room.
async fn place(
    dispatcher: &Dispatcher,
    namespace: &Namespace,
    priority: Priority,
    works: &mut Vec<(WorkItem, async_nats::jetstream::Message)>,
) -> Result<Placing, ActorError> {
    let asked = Place {
        namespace: namespace.clone(),
        priority,
        works: works
            .iter()
            .map(|(w, _)| (Request::of(w), w.trace_id.clone()))
            .collect(),
    };
    let placed = dispatcher.router.send(asked).await?;
    let mut sent = Vec::with_capacity(placed.now.len());
    for ((work, message), target) in works.drain(..placed.now.len()).zip(placed.now) {
        sent.extend(send_placed(dispatcher, work, message, target, placed.tell_end).await?);
    }
    Ok((sent, placed.later, placed.why))
}

/// What [`place`] sent, where the rest will go once granted, and why they wait where it is
/// more than room.
type Placing = (
    Vec<Sent>,
    Vec<tokio::sync::oneshot::Receiver<Target>>,
    Option<String>,
);

/// Publishes `work`'s dispatch to `target`'s worker, or does what else its target says.
async fn send_placed(
    dispatcher: &Dispatcher,
    mut work: WorkItem,
    message: async_nats::jetstream::Message,
    target: Target,
    tell_end: bool,
) -> Result<Vec<Sent>, ActorError> {
    match target {
        Target::Worker(worker) => {
            work.tell_end = tell_end;
            let (work, ack) = dispatcher.send(work, &worker).await?;
            return Ok(vec![(message, ack, Pending::new(work, worker, Vec::new()))]);
        }
        Target::NoWorker => no_worker_yet(dispatcher, &work, &message, None).await,
        Target::NoRoom(why) => no_worker_yet(dispatcher, &work, &message, Some(&why)).await,
        Target::PinnedGone(worker) => {
            dispatcher.fail_pinned(&work, &worker).await?;
            consume::ack(&message).await;
        }
    }
    Ok(Vec::new())
}

/// Waits for the slot granted to the first of `works`, keeping every message of them in
/// progress meanwhile, so that JetStream hands none of them to another Router while the
/// share holds them.
async fn held(
    later: tokio::sync::oneshot::Receiver<Target>,
    works: &[(WorkItem, async_nats::jetstream::Message)],
) -> Result<Target, ActorError> {
    tokio::pin!(later);
    let every = HELD_PROGRESS_EVERY;
    let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tokio::select! {
            biased;
            target = &mut later => {
                // The Router restarted: its share, and the slot it would grant, are gone.
                return target.map_err(|_| ActorError::Stopped("the Router's share"));
            }
            _ = progress.tick() => {
                for (_, message) in works {
                    consume::in_progress(message).await;
                }
            }
        }
    }
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
