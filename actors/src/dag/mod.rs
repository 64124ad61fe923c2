//! # DagCoordinator
//! Owns the dependency state per business date ([`DagState`]): which instances of which job
//! exist for which date and how they ended, which instances wait, and which instances split
//! into shards wait for them (read from `ax.internal.split.>`). Reads the job registry,
//! `ax.internal.created.>` (new attempts) and `ax.result.>` (how attempts ended); writes
//! `ax.internal.ready.<priority>` (released attempts), cancellations and `deps_timeout` failures
//! (records, results and events), the instances of jobs that run on their dependencies alone,
//! and its own state: the `ax_deps` bucket (instances per date and job) and the `ax_waiting`
//! bucket (held attempts). While it leads it also watches the datasets' freshness
//! ([`freshness`]) and makes every attempt's OpenLineage events ([`openlineage`]).
//!
//! Decisions come from memory, so one coordinator leads at a time (a lease); others stand by
//! and take over within seconds. Taking the lead ([`lead`]) rebuilds the view by replaying the
//! registry and the two buckets, away from the actor; the view is then handed to the actor,
//! which owns it and changes it only in its handlers: each batch its pumps deliver (created
//! attempts, results, split plans, registry changes, the expiry tick) is decided on the view and
//! carried out ([`execute`]) before the next one is handled. A source message is acknowledged
//! only once everything it caused is stored; after a crash it is processed again, and every
//! action is idempotent (message ids, compare-and-swap on records, create-if-absent).

pub(crate) mod day_store;
mod execute;
mod freshness;
mod lead;
mod openlineage;
pub(crate) mod state;
mod summary;

use std::time::Duration;

use actix::prelude::*;
use async_nats::jetstream;
use futures::StreamExt;

use ax_bus::client::kv_view::FeedItem;
use ax_bus::error::During;
use ax_bus::ids::NodeId;
use ax_bus::messages::{AlertKind, JobRecord, ResultMessage, SplitPlan, WorkItem};
use ax_bus::{codec, AxClient};

use crate::jetstream::consume::{self, ConsumerSpec, Cumulative};
use crate::runtime::lease::Lease;
use crate::runtime::progress::{self, Progressed};
use crate::runtime::supervision::{note_restart, spawn_pump, spawn_task};
use crate::ActorError;
use state::{Action, DagState, DayKey};

/// The actor's name in counters, logs and `ax nodes`.
pub(crate) const ACTOR: &str = "dag";
const BATCH: usize = 256;
/// The consumers of results, one per term of leadership (see [`Cumulative`]).
pub(crate) const RESULTS: Cumulative = Cumulative {
    family: "dag-results",
};
/// Days of (job, date) history kept in memory and in the deps bucket.
const KEEP_DAYS: i64 = 40;
/// How often deps timeouts and stale history are looked at.
const EXPIRE_EVERY: Duration = Duration::from_secs(1);

/// The DagCoordinator actor: standing by, or leading with its view.
#[derive(Debug)]
pub struct DagCoordinator {
    client: AxClient,
    node: NodeId,
    /// The time zone of the day summaries' dates.
    summary_tz: chrono_tz::Tz,
    /// The namespace of ax's jobs in the OpenLineage events it makes (none without).
    lineage_namespace: Option<String>,
    /// The view, while this coordinator leads.
    state: Option<DagState>,
    /// Told the days held each time it takes the lead, if anyone asked.
    leading: Option<tokio::sync::watch::Sender<Option<usize>>>,
}

impl DagCoordinator {
    /// A coordinator on `client`, named `node` for its lease.
    pub fn new(client: AxClient, node: NodeId) -> Self {
        Self {
            client,
            node,
            summary_tz: chrono_tz::UTC,
            lineage_namespace: None,
            state: None,
            leading: None,
        }
    }

    /// Tells `leading` the number of (job, date) days held each time it takes the lead.
    pub fn reporting_lead(
        mut self,
        leading: Option<tokio::sync::watch::Sender<Option<usize>>>,
    ) -> Self {
        self.leading = leading;
        self
    }

    /// Dates the day summaries in `tz` (UTC unless said otherwise).
    pub fn summarizing_in(mut self, tz: chrono_tz::Tz) -> Self {
        self.summary_tz = tz;
        self
    }

    /// Makes every attempt's OpenLineage events while it leads, naming ax's jobs in
    /// `namespace` (no events when `None`).
    pub fn naming_lineage(mut self, namespace: Option<String>) -> Self {
        self.lineage_namespace = namespace;
        self
    }

    /// Decides with the view and carries the actions out; no other message is handled until
    /// they are stored (the next decision must see what this one did).
    fn decide(
        &mut self,
        decide: impl FnOnce(&mut DagState) -> Vec<Action>,
    ) -> AtomicResponse<Self, Result<(), ActorError>> {
        AtomicResponse::new(self.decision(decide))
    }

    /// The future of [`DagCoordinator::decide`]: the view travels with it and comes back
    /// into the actor when the actions are stored.
    fn decision(
        &mut self,
        decide: impl FnOnce(&mut DagState) -> Vec<Action>,
    ) -> ResponseActFuture<Self, Result<(), ActorError>> {
        let Some(mut state) = self.state.take() else {
            let idle: Result<(), ActorError> = Err(ActorError::Stopped("the DAG view"));
            return Box::pin(fut::ready(idle));
        };
        let actions = decide(&mut state);
        let (client, node) = (self.client.clone(), self.node.clone());
        Box::pin(
            async move {
                let done = execute::execute(&client, &node, &mut state, actions).await;
                (state, done)
            }
            .into_actor(self)
            .map(|(state, done), act, ctx| {
                act.state = Some(state);
                let reads = done?;
                if !reads.is_empty() {
                    act.read_days(reads, ctx);
                }
                Ok(())
            }),
        )
    }
}

impl DagCoordinator {
    /// Reads days a wait named and the view does not hold whole, beside the decisions (a read
    /// scans part of the deps bucket), then merges them in one decision; a failed read restarts
    /// the coordinator, which rebuilds its view.
    fn read_days(&mut self, keys: Vec<DayKey>, ctx: &mut Context<Self>) {
        let (client, addr) = (self.client.clone(), ctx.address());
        let read = async move {
            let days = day_store::read(&client, &keys).await?;
            addr.send(DaysRead { keys, days }).await?
        };
        spawn_task(ACTOR, "days", ctx, read);
    }
}

/// Days read for the view ([`DagCoordinator::read_days`]).
#[derive(Debug, Message)]
#[rtype(result = "Result<(), ActorError>")]
struct DaysRead {
    keys: Vec<DayKey>,
    days: ax_bus::client::deps::Days,
}

impl Handler<DaysRead> for DagCoordinator {
    type Result = AtomicResponse<Self, Result<(), ActorError>>;

    fn handle(&mut self, msg: DaysRead, _: &mut Self::Context) -> Self::Result {
        self.decide(move |state| state.merge_days(msg.keys, msg.days, ax_bus::time::now()))
    }
}

impl Actor for DagCoordinator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.state = None;
        let led = lead::lead(self.client.clone(), self.node.clone(), ctx.address());
        spawn_task(ACTOR, "lead", ctx, led);
        tracing::info!(node = %self.node, "dag coordinator started");
    }
}

crate::runtime::watchdog::answers_ping!(DagCoordinator);

impl Supervised for DagCoordinator {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        note_restart(ACTOR);
    }
}

/// The lead is taken: the view rebuilt from JetStream, what it decided on the way, the lease to
/// keep and the registry to follow from where the replay stopped.
#[derive(Message)]
#[rtype(result = "Result<(), ActorError>")]
pub(crate) struct Lead {
    pub(crate) state: DagState,
    pub(crate) actions: Vec<Action>,
    pub(crate) lease: Lease,
    pub(crate) registry: ax_bus::client::kv_view::KvFeed,
}

impl std::fmt::Debug for Lead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lead")
            .field("held", &self.state.held_count())
            .field("actions", &self.actions.len())
            .finish_non_exhaustive()
    }
}

impl Handler<Lead> for DagCoordinator {
    type Result = AtomicResponse<Self, Result<(), ActorError>>;

    fn handle(&mut self, msg: Lead, ctx: &mut Self::Context) -> Self::Result {
        tracing::info!(node = %self.node, held = msg.state.held_count(), "leading the DAG");
        if let Some(leading) = &self.leading {
            leading.send_replace(Some(msg.state.days_count()));
        }
        self.state = Some(msg.state);
        let addr = ctx.address();
        let term = msg.lease.revision();
        spawn_pump(ACTOR, "lease", ctx, async move {
            Err::<(), _>(msg.lease.keep().await)
        });
        spawn_pump(
            ACTOR,
            "registry",
            ctx,
            follow_registry(msg.registry, addr.clone()),
        );
        spawn_pump(
            ACTOR,
            "freshness",
            ctx,
            freshness::watch(self.client.clone(), self.node.clone()),
        );
        if let Some(namespace) = self.lineage_namespace.clone() {
            spawn_pump(
                ACTOR,
                "openlineage",
                ctx,
                openlineage::translate(self.client.clone(), self.node.clone(), namespace),
            );
        }
        for source in Source::ALL {
            let pump = follow(
                self.client.clone(),
                self.node.clone(),
                source.consumer(&self.client, term),
                source,
                addr.clone(),
                self.summary_tz,
            );
            spawn_pump(ACTOR, source.name(), ctx, pump);
        }
        // Through the mailbox, not `ctx.notify`: actix polls one item of the context (a notified
        // message is one) right after a mailbox message has started an atomic decision and
        // before it merges that decision's wait, so a notified expiry could find the view away
        // in the decision; the mailbox is read only while no decision is under way.
        ctx.run_interval(EXPIRE_EVERY, |_, ctx| ctx.address().do_send(Expire));
        let actions = msg.actions;
        self.decide(move |_| actions)
    }
}

/// A batch from one of the coordinator's sources.
#[derive(Debug, Message)]
#[rtype(result = "Result<(), ActorError>")]
pub(crate) enum Batch {
    /// New attempts.
    Created(Vec<WorkItem>),
    /// How attempts ended.
    Results(Vec<ResultMessage>),
    /// Instances split into shards.
    Splits(Vec<SplitPlan>),
}

impl Handler<Batch> for DagCoordinator {
    type Result = AtomicResponse<Self, Result<(), ActorError>>;

    fn handle(&mut self, msg: Batch, _: &mut Self::Context) -> Self::Result {
        self.decide(move |state| {
            let now = ax_bus::time::now();
            match msg {
                Batch::Created(works) => works
                    .into_iter()
                    .flat_map(|w| state.on_created(w, now))
                    .collect(),
                Batch::Results(results) => results
                    .iter()
                    .flat_map(|r| state.on_result(r, now))
                    .collect(),
                Batch::Splits(plans) => plans
                    .into_iter()
                    .flat_map(|p| state.on_split(p.parent, p.children))
                    .collect(),
            }
        })
    }
}

/// The expiry tick: deps timeouts and history to forget.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct Expire;

impl Handler<Expire> for DagCoordinator {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, _: Expire, _: &mut Self::Context) -> Self::Result {
        if let Some(state) = &self.state {
            crate::metrics::metrics()
                .deps_waiting
                .set(i64::try_from(state.held_count()).unwrap_or(i64::MAX));
        }
        let expired = self.decision(|state| state.expire(ax_bus::time::now(), KEEP_DAYS));
        AtomicResponse::new(Box::pin(expired.map(|done, _, ctx| {
            if let Err(e) = done {
                tracing::warn!(error = %e, "expiry not carried out; restarting the coordinator");
                ctx.stop();
            }
        })))
    }
}

/// A change of the job registry (live, after the replay).
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct RegistryChange(FeedItem);

impl Handler<RegistryChange> for DagCoordinator {
    type Result = ();

    fn handle(&mut self, msg: RegistryChange, _: &mut Self::Context) {
        if let Some(state) = self.state.as_mut() {
            lead::apply_registry_change(state, msg.0);
        }
    }
}

async fn follow_registry(
    feed: ax_bus::client::kv_view::KvFeed,
    addr: Addr<DagCoordinator>,
) -> Result<(), ActorError> {
    let pump = progress::register(ACTOR, "registry", None);
    let mut feed = Progressed::new(feed.into_stream(), pump);
    while let Some(item) = feed.next().await {
        addr.send(RegistryChange(item?)).await?;
    }
    Ok(())
}

/// One of the streams the coordinator consumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Created,
    Results,
    Splits,
}

impl Source {
    const ALL: [Source; 3] = [Source::Created, Source::Results, Source::Splits];

    fn name(self) -> &'static str {
        match self {
            Source::Created => "created",
            Source::Results => "results",
            Source::Splits => "splits",
        }
    }

    /// The consumer read while leading in term `term` (the lease's revision).
    fn consumer(self, client: &AxClient, term: u64) -> ConsumerSpec {
        let (stream, durable, filter) = match self {
            Source::Created => (
                client.layout.flow_stream(),
                "dag-created".to_string(),
                client.subjects().created_all(),
            ),
            Source::Results => (
                client.layout.results_stream(),
                RESULTS.durable(term),
                client.subjects().result_all(),
            ),
            Source::Splits => (
                client.layout.flow_stream(),
                "dag-split".to_string(),
                client.subjects().split_all(),
            ),
        };
        // Every attempt's result passes here: its batches are settled with one ack each.
        // (Created attempts and split plans may be set aside one by one as dead letters.)
        let cumulative = matches!(self, Source::Results).then_some(RESULTS);
        ConsumerSpec {
            ack_wait: Duration::from_secs(60),
            max_ack_pending: 4 * BATCH as i64,
            cumulative,
            ..ConsumerSpec::new(stream, durable, filter)
        }
    }

    /// Decodes a batch; what does not decode is set aside (dead letter) or, for results,
    /// logged and acknowledged with the rest.
    async fn decode(
        self,
        client: &AxClient,
        node: &NodeId,
        messages: &[jetstream::Message],
    ) -> Batch {
        match self {
            Source::Created => Batch::Created(decode_all(client, node, messages).await),
            Source::Splits => Batch::Splits(decode_all(client, node, messages).await),
            Source::Results => Batch::Results(
                messages
                    .iter()
                    .filter_map(|m| match codec::decode::<ResultMessage>(&m.payload) {
                        Ok(result) => Some(result),
                        Err(e) => {
                            tracing::warn!(subject = %m.subject, error = %e, "undecodable result ignored");
                            None
                        }
                    })
                    .collect(),
            ),
        }
    }
}

/// Delivers one source's batches to the coordinator; each batch's messages are acknowledged
/// once the coordinator has stored what they caused.
async fn follow(
    client: AxClient,
    node: NodeId,
    spec: ConsumerSpec,
    source: Source,
    addr: Addr<DagCoordinator>,
    summary_tz: chrono_tz::Tz,
) -> Result<(), ActorError> {
    let pump = progress::register(ACTOR, source.name(), Some(spec.source()));
    let messages = consume::messages(&client, &spec, BATCH).await?;
    let mut batches = Progressed::new(messages.ready_chunks(BATCH), pump);
    while let Some(batch) = batches.next().await {
        let messages: Vec<jetstream::Message> = batch
            .into_iter()
            .map(|m| m.during(|| format!("{} consumer", source.name())))
            .collect::<Result<_, _>>()?;
        let decoded = source.decode(&client, &node, &messages).await;
        addr.send(decoded).await??;
        if let Source::Results = source {
            // Before the acks: a batch seen again is added to the summary once.
            summary::add(&client, summary_tz, &messages).await?;
        }
        settle(&messages, spec.cumulative.is_some()).await;
    }
    Ok(())
}

/// Acknowledges a batch handled: its last message alone on a cumulative consumer, else each.
async fn settle(messages: &[jetstream::Message], cumulative: bool) {
    let settled = if cumulative {
        messages
            .last()
            .map(std::slice::from_ref)
            .unwrap_or_default()
    } else {
        messages
    };
    for message in settled {
        if let Err(e) = message.ack().await {
            tracing::warn!(error = %e, "ack failed; the message will be processed again");
        }
    }
}

/// The registry value of a job, decoded and checked (an invalid one is logged and skipped; the
/// Schedulers raise the alert).
fn decode_job(key: &str, value: &[u8]) -> Option<JobRecord> {
    match JobRecord::from_registry(value) {
        Ok(record) => Some(record),
        Err(e) => {
            tracing::error!(job = %key, error = %e, "registry entry ignored");
            None
        }
    }
}

/// Every message of a batch that decodes; the rest set aside as dead letters.
async fn decode_all<T: serde::de::DeserializeOwned>(
    client: &AxClient,
    node: &NodeId,
    messages: &[jetstream::Message],
) -> Vec<T> {
    let mut decoded = Vec::with_capacity(messages.len());
    for message in messages {
        decoded
            .extend(consume::decode_or_dead_letter(client, node, AlertKind::Flow, message).await);
    }
    decoded
}

#[cfg(test)]
mod tests {
    //! Why the expiry tick goes through the mailbox: the actix behaviour it steps around.

    use std::time::{Duration, Instant};

    use actix::prelude::*;

    /// A view taken away by an atomic decision, like the coordinator's; each look records
    /// whether it found the view away.
    #[derive(Default)]
    struct Toy {
        view: Option<()>,
        looks: Vec<(&'static str, bool)>,
    }

    impl Actor for Toy {
        type Context = Context<Self>;
    }

    #[derive(Message)]
    #[rtype(result = "()")]
    struct Decide;

    impl Handler<Decide> for Toy {
        type Result = AtomicResponse<Self, ()>;

        fn handle(&mut self, _: Decide, _: &mut Self::Context) -> Self::Result {
            let view = self.view.take();
            AtomicResponse::new(Box::pin(
                tokio::time::sleep(Duration::from_millis(20))
                    .into_actor(self)
                    .map(move |_, act, _| act.view = view),
            ))
        }
    }

    #[derive(Message)]
    #[rtype(result = "()")]
    struct Look(&'static str);

    impl Handler<Look> for Toy {
        type Result = ();

        fn handle(&mut self, msg: Look, _: &mut Self::Context) {
            self.looks.push((msg.0, self.view.is_none()));
        }
    }

    /// What the coordinator's interval meets: a tick (here a timer of the context) that asks
    /// for a look while a batch (the decision) reaches the mailbox.
    #[derive(Message)]
    #[rtype(result = "()")]
    struct Tick;

    impl Handler<Tick> for Toy {
        type Result = ();

        fn handle(&mut self, _: Tick, ctx: &mut Self::Context) {
            ctx.run_later(Duration::ZERO, |_, ctx| {
                ctx.notify(Look("notified"));
                ctx.address().do_send(Decide);
                ctx.address().do_send(Look("mailbox"));
            });
        }
    }

    #[derive(Message)]
    #[rtype(result = "Vec<(&'static str, bool)>")]
    struct Looks;

    impl Handler<Looks> for Toy {
        type Result = MessageResult<Looks>;

        fn handle(&mut self, _: Looks, _: &mut Self::Context) -> Self::Result {
            MessageResult(self.looks.clone())
        }
    }

    #[actix::test]
    async fn a_notified_message_can_run_inside_an_atomic_decision_a_mailbox_one_cannot() {
        let toy = Toy {
            view: Some(()),
            ..Toy::default()
        }
        .start();
        toy.send(Tick).await.expect("ticked");
        let deadline = Instant::now() + Duration::from_secs(10);
        let looks = loop {
            let looks = toy.send(Looks).await.expect("answered");
            if looks.len() == 2 || Instant::now() > deadline {
                break looks;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        // The notified look ran while the decision held the view; the mailbox one after it.
        assert_eq!(looks, vec![("notified", true), ("mailbox", false)]);
    }
}
