//! # DagCoordinator
//! Owns the dependency state per business date ([`DagState`]): which instances of which job
//! exist for which date and how they ended, which instances wait, and which instances split
//! into shards wait for them (read from `ax.internal.split.>`). Reads the job registry,
//! `ax.internal.created.>` (new attempts) and `ax.result.>` (how attempts ended); writes
//! `ax.internal.ready.<priority>` (released attempts), cancellations and `deps_timeout` failures
//! (records, results and events), the instances of jobs that run on their dependencies alone,
//! and its own state: the `ax_deps` bucket (instances per date and job) and the `ax_waiting`
//! bucket (held attempts).
//!
//! Decisions come from memory, so one coordinator leads at a time (a lease); others stand by
//! and take over within seconds. On taking the lead, the view is rebuilt by replaying the
//! registry and the two buckets, and whatever arrived while no coordinator ran is still in the
//! durable consumers. A source message is acknowledged only once everything it caused is
//! stored; after a crash it is processed again, and every action is idempotent (message ids,
//! compare-and-swap on records, create-if-absent).

pub mod day_store;
pub mod state;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use async_nats::jetstream;
use chrono::NaiveDate;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};

use ax_bus::client::kv_view::{FeedItem, KvFeed};
use ax_bus::client::Updated;
use ax_bus::error::During;
use ax_bus::ids::{InstanceId, NodeId};
use ax_bus::instance::{State, Tag, Trigger};
use ax_bus::messages::{AlertKind, JobRecord, ResultMessage, SplitPlan, Waiting, WorkItem};
use ax_bus::msg_id;
use ax_bus::spec::JobSpec;
use ax_bus::{codec, AxClient, InstanceRecord};

use crate::jetstream::consume::{self, ConsumerSpec};
use crate::scheduler::creator::NewInstance;
use state::{Action, DagState};

use crate::jetstream::publish;
use crate::jetstream::publish::AckWindow;
use crate::node::lease::Lease;
use crate::node::supervision::{note_restart, spawn_pump};
use crate::ActorError;
use ax_bus::time::start_of_day;

/// The actor's name in counters, logs and `ax nodes`.
pub const ACTOR: &str = "dag";
const LEASE: &str = "dag";
const BATCH: usize = 256;
/// Days of (job, date) history kept in memory and in the deps bucket.
const KEEP_DAYS: i64 = 40;
const RECORD_UPDATES_IN_FLIGHT: usize = 64;
const CREATES_IN_FLIGHT: usize = 64;
const ACK_WINDOW: usize = 1024;

/// The DagCoordinator actor.
pub struct DagCoordinator {
    client: AxClient,
    node: NodeId,
}

impl DagCoordinator {
    /// A coordinator on `client`, named `node` for its lease.
    pub fn new(client: AxClient, node: NodeId) -> Self {
        Self { client, node }
    }
}

impl Actor for DagCoordinator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        spawn_pump(
            ACTOR,
            "lead",
            ctx,
            lead(self.client.clone(), self.node.clone()),
        );
        tracing::info!(node = %self.node, "dag coordinator started");
    }
}

crate::answers_ping!(DagCoordinator);

impl Supervised for DagCoordinator {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        note_restart(ACTOR);
    }
}

/// Waits for the lead, then coordinates until the lease or a subscription is lost.
async fn lead(client: AxClient, node: NodeId) -> Result<(), ActorError> {
    let lease = Lease::acquire(&client, LEASE, &node).await?;
    let coordinator = Coordinator {
        client,
        node,
        state: DagState::new(),
    };
    tokio::select! {
        lost = lease.keep() => Err(lost),
        ended = coordinator.run() => ended,
    }
}

struct Coordinator {
    client: AxClient,
    node: NodeId,
    state: DagState,
}

/// A record update that may run alongside the others of its batch.
type RecordJob = BoxFuture<'static, Result<(), ActorError>>;

impl Coordinator {
    async fn run(mut self) -> Result<(), ActorError> {
        let client = self.client.clone();
        let mut registry = KvFeed::open(&client.js, &client.layout.jobs_bucket(), ">").await?;
        while let Some(item) = registry.next().await {
            if !self.registry_change(item?) {
                break;
            }
        }
        self.restore().await?;
        let created = ConsumerSpec {
            ack_wait: Duration::from_secs(60),
            max_ack_pending: 4 * BATCH as i64,
            ..ConsumerSpec::new(
                client.layout.flow_stream(),
                "dag-created",
                client.subjects().created_all(),
            )
        };
        let results = ConsumerSpec {
            ack_wait: Duration::from_secs(60),
            max_ack_pending: 4 * BATCH as i64,
            ..ConsumerSpec::new(
                client.layout.results_stream(),
                "dag-results",
                client.subjects().result_all(),
            )
        };
        let splits = ConsumerSpec {
            ack_wait: Duration::from_secs(60),
            max_ack_pending: 4 * BATCH as i64,
            ..ConsumerSpec::new(
                client.layout.flow_stream(),
                "dag-split",
                client.subjects().split_all(),
            )
        };
        let mut splits = consume::messages(&client, &splits, BATCH)
            .await?
            .ready_chunks(BATCH);
        let mut created = consume::messages(&client, &created, BATCH)
            .await?
            .ready_chunks(BATCH);
        let mut results = consume::messages(&client, &results, BATCH)
            .await?
            .ready_chunks(BATCH);
        let mut expiry = tokio::time::interval(Duration::from_secs(1));
        tracing::info!(node = %self.node, held = self.state.held_count(), "leading the DAG");
        loop {
            tokio::select! {
                item = registry.next() => match item {
                    Some(item) => { self.registry_change(item?); }
                    None => return Ok(()),
                },
                batch = created.next() => {
                    let Some(batch) = batch else { return Ok(()) };
                    let now = ax_bus::time::now();
                    let mut actions = Vec::new();
                    let mut sources = Vec::with_capacity(batch.len());
                    for message in batch {
                        let message = message.during(|| "created consumer")?;
                        if let Some(work) = consume::decode_or_dead_letter::<WorkItem>(&client, &self.node, AlertKind::Flow, &message).await {
                            actions.extend(self.state.on_created(work, now));
                        }
                        sources.push(message);
                    }
                    self.execute(actions).await?;
                    ack_all(sources).await;
                }
                batch = splits.next() => {
                    let Some(batch) = batch else { return Ok(()) };
                    let mut actions = Vec::new();
                    let mut sources = Vec::with_capacity(batch.len());
                    for message in batch {
                        let message = message.during(|| "split consumer")?;
                        if let Some(plan) = consume::decode_or_dead_letter::<SplitPlan>(&client, &self.node, AlertKind::Flow, &message).await {
                            actions.extend(self.state.on_split(plan.parent, plan.children));
                        }
                        sources.push(message);
                    }
                    self.execute(actions).await?;
                    ack_all(sources).await;
                }
                batch = results.next() => {
                    let Some(batch) = batch else { return Ok(()) };
                    let mut actions = Vec::new();
                    let mut sources = Vec::with_capacity(batch.len());
                    for message in batch {
                        let message = message.during(|| "results consumer")?;
                        match codec::decode::<ResultMessage>(&message.payload) {
                            Ok(result) => actions.extend(self.state.on_result(&result, ax_bus::time::now())),
                            Err(e) => tracing::warn!(subject = %message.subject, error = %e, "undecodable result ignored"),
                        }
                        sources.push(message);
                    }
                    self.execute(actions).await?;
                    ack_all(sources).await;
                }
                _ = expiry.tick() => {
                    let actions = self.state.expire(ax_bus::time::now(), KEEP_DAYS);
                    self.execute(actions).await?;
                }
            }
        }
    }

    /// Applies a registry change; false once the initial values are all in.
    fn registry_change(&mut self, item: FeedItem) -> bool {
        match item {
            FeedItem::Put { key, value, .. } => match codec::decode::<JobRecord>(&value) {
                Ok(record) => self.state.upsert_job(record.spec),
                Err(e) => tracing::error!(job = %key, error = %e, "registry value does not decode"),
            },
            FeedItem::Deleted { key } => self.state.remove_job(&key),
            FeedItem::Current => return false,
        }
        true
    }

    /// Rebuilds the view from the deps and waiting buckets.
    async fn restore(&mut self) -> Result<(), ActorError> {
        let client = &self.client;
        let days = day_store::restore(client).await?.into_iter().collect();
        let waiting: Vec<Waiting> = KvFeed::open(&client.js, &client.layout.waiting_bucket(), ">")
            .await?
            .snapshot()
            .await?
            .into_iter()
            .filter_map(|(key, value, _)| match codec::decode(&value) {
                Ok(waiting) => Some(waiting),
                Err(e) => {
                    tracing::error!(instance = %key, error = %e, "undecodable waiting entry ignored");
                    None
                }
            })
            .collect();
        let (splits, waiting): (Vec<Waiting>, Vec<Waiting>) =
            waiting.into_iter().partition(|w| w.children.is_some());
        let mut actions = self.state.restore(days, waiting, ax_bus::time::now());
        for split in splits {
            let mut children = Vec::new();
            for child in split.children.unwrap_or_default() {
                let state = client
                    .instance(&child)
                    .await?
                    .map(|(r, _)| r.state)
                    .filter(|s| s.is_final());
                children.push((child, state));
            }
            actions.extend(self.state.restore_split(split.work, children));
        }
        self.execute(actions).await
    }

    /// Carries out actions: stores and hand-offs are pipelined and awaited together; record
    /// updates run 64 at a time; instances of jobs without cron are created and fed back in.
    async fn execute(&mut self, actions: Vec<Action>) -> Result<(), ActorError> {
        let client = self.client.clone();
        let layout = &client.layout;
        let mut queue: VecDeque<Action> = actions.into();
        let mut acks = AckWindow::new(ACK_WINDOW);
        // One record update per instance: the last action decides it.
        let mut records: BTreeMap<InstanceId, RecordJob> = BTreeMap::new();
        let mut creates: Vec<(Arc<JobSpec>, NaiveDate)> = Vec::new();
        let mut created_here: HashSet<InstanceId> = HashSet::new();
        loop {
            while let Some(action) = queue.pop_front() {
                match action {
                    Action::SaveEntry {
                        job,
                        date,
                        instance_id,
                        attempt,
                        state,
                    } => {
                        acks.push(
                            client
                                .kv_put_pipelined(
                                    &layout.deps_bucket(),
                                    &ax_bus::client::deps::entry_key(&job, date, &instance_id),
                                    ax_bus::client::deps::encode_entry(attempt, state)?,
                                )
                                .await?,
                        )
                        .await?
                    }
                    Action::Hold {
                        work,
                        since,
                        reason,
                    } => {
                        let id = work.instance_id.clone();
                        acks.push(
                            client
                                .kv_put_pipelined(
                                    &layout.waiting_bucket(),
                                    &id,
                                    codec::encode(&Waiting {
                                        work: work.clone(),
                                        since,
                                        children: None,
                                    })?,
                                )
                                .await?,
                        )
                        .await?;
                        // Instances created here are born tagged `waiting_deps`.
                        if !created_here.contains(&id) {
                            records.insert(id, tag_waiting(client.clone(), work, reason).boxed());
                        }
                    }
                    Action::Release { work, held } => {
                        acks.push(
                            publish::to_stream(
                                &client,
                                client.subjects().ready(work.spec.priority),
                                &msg_id::ready(&work.trace_id),
                                &work,
                            )
                            .await?,
                        )
                        .await?;
                        if held {
                            acks.push(
                                client
                                    .kv_delete_pipelined(
                                        &layout.waiting_bucket(),
                                        &work.instance_id,
                                    )
                                    .await?,
                            )
                            .await?;
                        }
                        // The record keeps its tag until the worker tags it `executing`.
                        records.remove(&work.instance_id);
                    }
                    Action::End {
                        work,
                        state,
                        tag,
                        message,
                        held,
                    } => {
                        if held {
                            acks.push(
                                client
                                    .kv_delete_pipelined(
                                        &layout.waiting_bucket(),
                                        &work.instance_id,
                                    )
                                    .await?,
                            )
                            .await?;
                        }
                        records.insert(
                            work.instance_id.clone(),
                            end_instance(
                                client.clone(),
                                self.node.clone(),
                                work,
                                state,
                                tag,
                                message,
                            )
                            .boxed(),
                        );
                    }
                    Action::Forget { instance_id } => {
                        acks.push(
                            client
                                .kv_delete_pipelined(&layout.waiting_bucket(), &instance_id)
                                .await?,
                        )
                        .await?
                    }
                    Action::HoldSplit { work, children } => {
                        let id = work.instance_id.clone();
                        acks.push(
                            client
                                .kv_put_pipelined(
                                    &layout.waiting_bucket(),
                                    &id,
                                    codec::encode(&Waiting {
                                        work,
                                        since: ax_bus::time::now(),
                                        children: Some(children),
                                    })?,
                                )
                                .await?,
                        )
                        .await?;
                    }
                    Action::Create { spec, date } => creates.push((spec, date)),
                }
            }
            if creates.is_empty() {
                break;
            }
            let made: Vec<_> = futures::stream::iter(creates.drain(..))
                .map(|(spec, date)| create_for_date(client.clone(), spec, date))
                .buffered(CREATES_IN_FLIGHT)
                .collect()
                .await;
            let now = ax_bus::time::now();
            for work in made {
                if let Some(work) = work? {
                    created_here.insert(work.instance_id.clone());
                    queue.extend(self.state.on_created(work, now));
                }
            }
        }
        acks.flush().await?;
        let mut updates =
            futures::stream::iter(records.into_values()).buffer_unordered(RECORD_UPDATES_IN_FLIGHT);
        while let Some(done) = updates.next().await {
            done?;
        }
        Ok(())
    }
}

async fn ack_all(messages: Vec<jetstream::Message>) {
    for message in messages {
        if let Err(e) = message.ack().await {
            tracing::warn!(error = %e, "ack failed; the message will be processed again");
        }
    }
}

/// Tags the record `waiting_deps` (informational: a refusal means it moved on).
async fn tag_waiting(client: AxClient, work: WorkItem, reason: String) -> Result<(), ActorError> {
    if let Updated::Written(record, _) = client
        .update_instance(&work.instance_id, |r| r.waiting(&work.trace_id, &reason))
        .await?
    {
        publish::event(&client, &record).await;
    }
    Ok(())
}

/// Ends an instance that will not run, and publishes its result (which cascades further).
async fn end_instance(
    client: AxClient,
    node: NodeId,
    work: WorkItem,
    state: State,
    tag: Tag,
    message: String,
) -> Result<(), ActorError> {
    let updated = client
        .update_instance(&work.instance_id, |r| {
            r.ended_early(&work.trace_id, state, tag, &message)
        })
        .await?;
    let record: InstanceRecord = match updated {
        Updated::Written(record, _) => *record,
        Updated::Refused(_) | Updated::Missing => return Ok(()),
    };
    publish::to_stream_acked(
        &client,
        client.subjects().result(&record.job),
        &msg_id::result(&record.trace_id),
        &ResultMessage::from_record(&record),
    )
    .await?;
    if record.state == State::Failed && work.shard.is_none() {
        publish::failed_for_good(&client, &node, &work, record.tag, &record.message).await?;
    }
    publish::event(&client, &record).await;
    Ok(())
}

/// Creates the instance of a job without cron for `date`. When it exists already (a crash after
/// creating it), its record tells whether it still waits.
async fn create_for_date(
    client: AxClient,
    spec: Arc<JobSpec>,
    date: NaiveDate,
) -> Result<Option<WorkItem>, ActorError> {
    let tz: chrono_tz::Tz = spec.timezone.parse().unwrap_or(chrono_tz::UTC);
    let expected = start_of_day(tz, date);
    let mut instance = NewInstance::new(
        &spec,
        expected,
        date.format("%Y-%m-%d").to_string(),
        spec.params.clone(),
        Trigger::Deps,
        ax_bus::time::now(),
    );
    instance.record.tag = Tag::WaitingDeps;
    let deps: Vec<String> = spec
        .deps
        .iter()
        .filter_map(|d| {
            let at = date + chrono::Duration::days(d.offset_days().ok()?);
            Some(format!("`{}` for {at}", d.name))
        })
        .collect();
    instance.record.message = format!("waiting for {}", deps.join(", "));
    match client.create_instance(&instance.record).await? {
        true => {
            publish::event(&client, &instance.record).await;
            Ok(Some(instance.work))
        }
        false => {
            let existing = client.instance(&instance.record.instance_id).await?;
            Ok(existing.and_then(|(record, _)| {
                let waits = record.state == State::Running
                    && matches!(record.tag, Tag::Queued | Tag::WaitingDeps);
                waits.then(|| WorkItem {
                    instance_id: record.instance_id,
                    trace_id: record.trace_id,
                    attempt: record.attempt,
                    run_start: record.run_start,
                    biz_date: record.biz_date,
                    expected_time: record.expected_time,
                    params: record.params,
                    spec: (*spec).clone(),
                    worker: None,
                    gate: None,
                    dispatch: None,
                    router: None,
                    shard: record.shard.clone(),
                    pin: record.pin.clone(),
                    stored: None,
                })
            }))
        }
    }
}
