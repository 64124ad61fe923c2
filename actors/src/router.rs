//! # Router
//! Owns the view of live workers and their load. Reads the workers bucket (heartbeats,
//! replayed on start) and `ax.internal.ready.>`; writes `ax.internal.dispatch.<worker>` and the
//! instance's `no_worker` tag when no worker can take it.
//!
//! A worker is eligible for an attempt when it is alive (a heartbeat within
//! [`WORKER_TTL`]), offers the job's executor and has every tag the job asks for. Among the
//! eligible, the least loaded — running plus recently dispatched attempts per slot — wins, ties
//! broken at random. With no eligible worker the attempt stays `running` with tag `no_worker`
//! and its ready message is redelivered every second until one appears.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use async_nats::jetstream::AckKind;
use dashmap::DashMap;
use futures::StreamExt;
use rand::Rng;

use ax_bus::client::Updated;
use ax_bus::kv_view::{FeedItem, KvFeed};
use ax_bus::messages::{WorkItem, WorkerInfo};
use ax_bus::{codec, AxClient};

use crate::consume::{self, ConsumerSpec};
use crate::supervision::{note_restart, spawn_pump};
use crate::{publish, ActorError};

const ACTOR: &str = "router";
const BATCH: usize = 256;
/// A worker without a heartbeat for this long is dead.
pub const WORKER_TTL: Duration = Duration::from_secs(10);
/// How soon an attempt with no eligible worker is looked at again.
const NO_WORKER_RETRY: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
struct WorkerView {
    info: WorkerInfo,
    last_seen: Instant,
    /// Dispatched since its last heartbeat (the heartbeat's `running` does not count them yet).
    recent: u32,
}

impl WorkerView {
    fn load(&self) -> f64 {
        f64::from(self.info.running + self.recent) / f64::from(self.info.slots.max(1))
    }

    fn can_run(&self, work: &WorkItem) -> bool {
        self.last_seen.elapsed() < WORKER_TTL
            && self.info.executors.contains(&work.spec.exec.kind)
            && work.spec.tags.iter().all(|t| self.info.tags.contains(t))
    }
}

type Workers = Arc<DashMap<String, WorkerView>>;

/// The Router actor.
pub struct Router {
    client: AxClient,
    node: String,
    workers: Workers,
}

impl Router {
    /// A router on `client`.
    pub fn new(client: AxClient, node: String) -> Self {
        Self {
            client,
            node,
            workers: Arc::default(),
        }
    }
}

impl Actor for Router {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        spawn_pump(
            ACTOR,
            "workers",
            ctx,
            follow_workers(self.client.clone(), self.workers.clone()),
        );
        spawn_pump(
            ACTOR,
            "ready",
            ctx,
            route(self.client.clone(), self.node.clone(), self.workers.clone()),
        );
        tracing::info!(node = %self.node, "router started");
    }
}

impl Supervised for Router {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        note_restart(ACTOR);
        self.workers.clear();
    }
}

async fn follow_workers(client: AxClient, workers: Workers) -> Result<(), ActorError> {
    let mut feed = KvFeed::open(&client.js, &client.layout.workers_bucket(), ">").await?;
    while let Some(item) = feed.next().await {
        match item? {
            FeedItem::Put { key, value, .. } => match codec::decode::<WorkerInfo>(&value) {
                Ok(info) => {
                    workers.insert(
                        key,
                        WorkerView {
                            info,
                            last_seen: Instant::now(),
                            recent: 0,
                        },
                    );
                }
                Err(e) => {
                    tracing::warn!(worker = %key, error = %e, "undecodable heartbeat ignored")
                }
            },
            FeedItem::Deleted { key } => {
                workers.remove(&key);
            }
            FeedItem::Current => tracing::info!(workers = workers.len(), "worker registry loaded"),
        }
    }
    Ok(())
}

/// The least loaded eligible worker, ties at random.
fn pick(workers: &Workers, work: &WorkItem) -> Option<String> {
    let mut best: Option<(f64, String)> = None;
    let mut ties = 0u32;
    let mut rng = rand::rng();
    for entry in workers.iter() {
        let view = entry.value();
        if !view.can_run(work) {
            continue;
        }
        let load = view.load();
        match &best {
            Some((best_load, _)) if load > *best_load => {}
            Some((best_load, _)) if load == *best_load => {
                ties += 1;
                if rng.random_range(0..=ties) == 0 {
                    best = Some((load, entry.key().clone()));
                }
            }
            _ => {
                ties = 0;
                best = Some((load, entry.key().clone()));
            }
        }
    }
    let (_, id) = best?;
    if let Some(mut view) = workers.get_mut(&id) {
        view.recent += 1;
    }
    Some(id)
}

async fn route(client: AxClient, node: String, workers: Workers) -> Result<(), ActorError> {
    let spec = ConsumerSpec {
        stream: client.layout.flow_stream(),
        durable: "router-ready".into(),
        filter: client.subjects().ready_all(),
        ack_wait: Duration::from_secs(30),
        max_ack_pending: 4 * BATCH as i64,
    };
    let mut batches = consume::messages(&client, &spec, BATCH)
        .await?
        .ready_chunks(BATCH);
    while let Some(batch) = batches.next().await {
        let mut pending = Vec::with_capacity(batch.len());
        for message in batch {
            let message = message.map_err(|e| ActorError::Nats(format!("ready consumer: {e}")))?;
            let Some(mut work) =
                consume::decode_or_drop::<WorkItem>(&client, &node, "flow", &message).await
            else {
                continue;
            };
            let Some(worker) = pick(&workers, &work) else {
                let first_time = message.info().map(|i| i.delivered == 1).unwrap_or(true);
                if first_time {
                    note_no_worker(&client, &work).await;
                }
                let _ = message.ack_with(AckKind::Nak(Some(NO_WORKER_RETRY))).await;
                continue;
            };
            work.worker = Some(worker.clone());
            let ack = publish::to_stream(
                &client,
                client.subjects().dispatch(&worker),
                &format!("dispatch:{}", work.trace_id),
                &work,
            )
            .await?;
            pending.push((message, ack, work));
        }
        // The record is not touched on the way: the worker tags it `executing` when it starts.
        consume::settle(pending).await;
    }
    Ok(())
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
