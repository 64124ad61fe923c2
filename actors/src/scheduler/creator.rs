//! Creating instances: the one place an instance comes into existence, for cron fires, manual
//! triggers and (later) backfills.
//!
//! Each instance is created with a create-if-absent on its id (job + expected time) in the
//! instances bucket, so however many Schedulers fire the same tick, exactly one record is
//! written; the losers see `AlreadyExists` and count the tick as de-duplicated. The winner then
//! hands the attempt to the DagCoordinator on `ax.internal.created.<job>`.
//!
//! Creations are pipelined in stages, each a task of its own: the records are published
//! (`expected last subject sequence = 0` on the record's key) a chunk of [`CHUNK`] at a time
//! without waiting for their acks; as each record's ack comes, its hand-off goes out in one
//! burst (a fast-ingest batch, [`crate::jetstream::burst`]: answered every so many messages)
//! that stays open while more chunks wait; the hand-offs held for their instants go out at
//! them; and the hand-offs' answers are awaited last. So the
//! first hand-offs of a thousand fires go out while the last records are still being stored,
//! and 10,000 fires at one instant are no longer ten batches one after another. The overlap
//! policies read what earlier creations noted, so what comes in with one to apply waits for
//! everything before it to settle, as when the batches ran in turn.
//!
//! A cron fire is taken [`AHEAD`] before its instant: its record is written then, the event of
//! its creation published and its hand-off encoded, and the hand-off is held until the instant
//! and goes out to the millisecond (`submit_ahead`). So at the instant only the hand-offs are
//! left to send, and a thousand fires due together are handed on in one quick burst rather
//! than after a thousand creations (the steady second of `ax bench --only lateness`). Held creations go through a pipeline of their own, so that a
//! manual trigger never waits behind them; a fire whose overlap policy is not `allow` waits
//! for its instant before anything is written, because its policy looks at the job's previous
//! instance as it is then. A held creation counts as unfinished from the start, so the settled
//! tick a failover resumes from stays before it: a Scheduler that dies holding one leaves a
//! record its successor finds created and watches as an orphan.
//!
//! A cron tick fired on time needs no tick record: its instance record is its entry in the
//! ledger, and [`InFlight`] tells how far the fires are settled (see
//! [`crate::scheduler::partitions`]). A fire is never dropped for a transient failure: the
//! failed ones are queued again with backoff until NATS answers. A retry after a lost ack finds
//! the record with *its own* trace id and goes on to the hand-off, so an instance is never left
//! created but not handed on by its own creator. The stages outlive restarts of the Scheduler
//! actor. An instance found already created is watched for a while, in case its creator died
//! before handing it on (see [`crate::scheduler::orphans`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::context::{PublishAckFuture, PublishError, PublishErrorKind};
use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use ax_bus::client::record_writes::wrong_last_sequence;
use ax_bus::error::{During, NatsError, Reason};
use ax_bus::ids::NodeId;
use ax_bus::messages::{AlertKind, StoredRecord, TickOutcome};
use ax_bus::spec::Overlap;
use ax_bus::{AxClient, InstanceRecord, State, Tag};

use crate::jetstream::burst;
use crate::jetstream::publish::{self, AckDue};
use crate::scheduler::delayed;
use crate::scheduler::new_instance::NewInstance;
use crate::scheduler::orphans;
use crate::scheduler::overlap::{self, Decision};
use crate::scheduler::store::{Instances, Registry};
use crate::scheduler::ticks::{self, Tick};
use crate::ActorError;

/// Most creations taken in at once (their overlap policies applied together).
const BATCH: usize = 1024;
/// Records published before their hand-offs may start: small enough that the first hand-off
/// of a big batch goes out soon, large enough that a chunk costs little to pass on.
const CHUNK: usize = 128;
/// Chunks published ahead of their hand-offs: bounds the records written but not handed on.
const CHUNKS_AHEAD: usize = 8;
/// The same for the held creations, whose records are all written before their instants: a
/// hand-off the hand-off stage itself must hold (a fire found created by another Scheduler)
/// does not stop the records of the fires due after it from being written ahead.
const CHUNKS_HELD: usize = 1024;
/// How long before its instant a cron fire is taken: long enough to write the records of ten
/// thousand fires due together on two cores, short enough that an instance is not listed long
/// before its time, and that a pause, edit or deletion landing in it (the fire goes out as it
/// was taken) is rare.
pub(crate) const AHEAD: Duration = Duration::from_millis(250);
/// Longest wait before a creation that failed for a transient reason is tried again.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How soon a hand-off refused as "being stored by another publisher" is published again.
const IN_PROCESS_RETRY: Duration = Duration::from_millis(200);

/// What happened to a creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Created {
    /// This call created the instance.
    Fired,
    /// The instance already existed (another Scheduler, or an earlier call).
    Deduplicated,
    /// The overlap policy skipped it.
    Skipped,
    /// It cannot be created or handed on for a reason no retry changes (it is larger than the
    /// server takes); set aside: its record, if written, ended `failed`, and an alert raised.
    SetAside,
}

#[derive(Debug)]
struct Request {
    /// Boxed: a request moves through a channel and three stages, a pointer rather than its
    /// 1.6 KB each time.
    instance: Box<NewInstance>,
    reply: Option<oneshot::Sender<Created>>,
    /// How long to wait before the next try, once one has failed.
    backoff: Duration,
    /// A fire taken ahead: the instant its hand-off waits for.
    hold: Option<Instant>,
    /// Counts the request among the creator's unfinished ones until it is dropped.
    _unfinished: Unfinished,
}

/// The ticks of the cron fires (and of the tick records) a creator has not finished yet: what
/// says how far a Scheduler's fires are settled.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    ticks: Mutex<BTreeMap<DateTime<Utc>, usize>>,
}

impl InFlight {
    /// The oldest tick still unfinished.
    pub(crate) fn oldest_tick(&self) -> Option<DateTime<Utc>> {
        self.ticks().keys().next().copied()
    }

    /// Waits until no tick through `through` is unfinished (false once `limit` has passed).
    async fn settled(&self, through: DateTime<Utc>, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while self.oldest_tick().is_some_and(|t| t <= through) {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    fn ticks(&self) -> std::sync::MutexGuard<'_, BTreeMap<DateTime<Utc>, usize>> {
        // A panic while holding it leaves nothing half-done: a map of counts.
        self.ticks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One unfinished piece of work (a request, or a tick record to write): counted from its
/// submission until it is dropped (done, set aside, or given up), whatever the path.
#[derive(Debug)]
pub(crate) struct Unfinished {
    in_flight: Arc<InFlight>,
    tick: Option<DateTime<Utc>>,
}

impl Unfinished {
    pub(crate) fn new(in_flight: &Arc<InFlight>, tick: Option<DateTime<Utc>>) -> Self {
        if let Some(tick) = tick {
            *in_flight.ticks().entry(tick).or_insert(0) += 1;
        }
        Self {
            in_flight: in_flight.clone(),
            tick,
        }
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(tick) = self.tick {
            let mut ticks = self.in_flight.ticks();
            if let Some(count) = ticks.get_mut(&tick) {
                *count -= 1;
                if *count == 0 {
                    ticks.remove(&tick);
                }
            }
        }
    }
}

/// Handle to the creation task.
#[derive(Clone, Debug)]
pub(crate) struct Creator {
    tx: mpsc::UnboundedSender<Request>,
    /// The pipeline of the fires taken ahead (see [`AHEAD`]).
    held: mpsc::UnboundedSender<Request>,
    in_flight: Arc<InFlight>,
    /// Stamps this node's `[retention] instances` on the records it creates.
    client: AxClient,
}

impl Creator {
    /// Starts the creation task on the current runtime; `node` signs the tick records.
    pub(crate) fn start(client: AxClient, node: NodeId) -> Self {
        Self {
            tx: pipeline(&client, &node, CHUNKS_AHEAD),
            held: pipeline(&client, &node, CHUNKS_HELD),
            in_flight: Arc::default(),
            client,
        }
    }

    /// What it has not finished yet.
    pub(crate) fn in_flight(&self) -> Arc<InFlight> {
        self.in_flight.clone()
    }

    /// Counts tick `tick` as unfinished until the token is dropped (a skipped tick on its way
    /// to the ledger).
    pub(crate) fn hold(&self, tick: DateTime<Utc>) -> Unfinished {
        Unfinished::new(&self.in_flight, Some(tick))
    }

    /// Waits until every tick through `through` submitted has ended (or `limit` has passed;
    /// false then): how a Scheduler handing a partition over makes sure the ticks it fired are
    /// recorded before it says so. The fires taken later — a kept partition's next ones, held
    /// for their instants while this waits — are not waited for: with a job firing every
    /// second, some fire is always held.
    pub(crate) async fn settled(&self, through: DateTime<Utc>, limit: Duration) -> bool {
        self.in_flight.settled(through, limit).await
    }

    /// The request creating `instance`, counted as unfinished from now.
    fn request(
        &self,
        mut instance: NewInstance,
        reply: Option<oneshot::Sender<Created>>,
    ) -> Request {
        self.client.stamp_retention(&mut instance.record);
        let tick = instance.tick.map(|_| instance.record.expected_time);
        Request {
            _unfinished: Unfinished::new(&self.in_flight, tick),
            instance: Box::new(instance),
            reply,
            backoff: Duration::from_millis(100),
            hold: None,
        }
    }

    fn send(
        &self,
        instance: NewInstance,
        reply: Option<oneshot::Sender<Created>>,
    ) -> Result<(), ActorError> {
        self.tx
            .send(self.request(instance, reply))
            .map_err(|_| ActorError::Stopped("instance creator"))
    }

    /// Queues a creation without waiting.
    pub(crate) fn submit(&self, instance: NewInstance) {
        let _ = self.send(instance, None);
    }

    /// Queues the creation of a cron fire taken before its instant `due` (see [`AHEAD`]): its
    /// record is written now and its hand-off held until `due`; with an overlap policy other
    /// than `allow`, nothing is done before `due`.
    pub(crate) fn submit_ahead(&self, instance: NewInstance, due: Instant) {
        let mut request = self.request(instance, None);
        if request.instance.overlap() == Overlap::Allow {
            request.hold = Some(due);
            let _ = self.held.send(request);
            return;
        }
        let tx = self.tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(due).await;
            // Created at its instant, not when it was taken.
            let record = &mut request.instance.record;
            record.created_at = record.expected_time;
            let _ = tx.send(request);
        });
    }
}

/// What creates an instance and says what became of it: the [`Creator`] as it runs, or memory
/// in the handlers' unit tests.
pub(crate) trait Creates {
    /// Creates `instance` and waits for the outcome.
    async fn create(&self, instance: NewInstance) -> Result<Created, ActorError>;
}

impl Creates for Creator {
    async fn create(&self, instance: NewInstance) -> Result<Created, ActorError> {
        let (reply, outcome) = oneshot::channel();
        self.send(instance, Some(reply))?;
        outcome
            .await
            .map_err(|_| ActorError::Stopped("instance creator"))
    }
}

/// Starts the stages of a creation pipeline (the records, the hand-offs, the held ones at
/// their instants, their answers),
/// with at most `chunks_ahead` chunks of records written before their hand-offs; the way in.
fn pipeline(
    client: &AxClient,
    node: &NodeId,
    chunks_ahead: usize,
) -> mpsc::UnboundedSender<Request> {
    let (tx, rx) = mpsc::unbounded_channel::<Request>();
    let (published_tx, published_rx) = mpsc::channel(chunks_ahead);
    let (outgoing_tx, outgoing_rx) = mpsc::unbounded_channel();
    let (sent_tx, sent_rx) = mpsc::unbounded_channel();
    let (settled_tx, settled_rx) = watch::channel(0);
    let stage = Stage {
        client: client.clone(),
        node: node.clone(),
        again: tx.clone(),
    };
    tokio::spawn(stage.clone().publish_records(rx, published_tx, settled_rx));
    tokio::spawn(stage.clone().hand_on_chunks(published_rx, outgoing_tx));
    tokio::spawn(stage.clone().release_chunks(outgoing_rx, sent_tx));
    tokio::spawn(stage.settle_chunks(sent_rx, settled_tx));
    tx
}

fn finish(request: Request, created: Created) {
    if let Some(reply) = request.reply {
        let _ = reply.send(created);
    }
}

/// A publish whose ack is still to be awaited.
type Pending = Result<AckDue, ActorError>;
/// A hand-off sent: the request, what its creation came to, whether to watch it for an
/// orphan, and the acks to await.
type Sent = (Request, Created, bool, Result<Vec<Ack>, ActorError>);

/// The hand-off of a cron fire taken ahead of its instant, its record stored: made ready
/// before the instant (its message encoded, the event of its creation published), to be sent
/// at `due`, so that the fires due together go out in one quick burst.
struct Held {
    request: Request,
    item: Result<burst::Item, ActorError>,
    due: Instant,
}

/// What the hand-off stage passes on: a hand-off sent, or one held until its instant.
enum Outgoing {
    Sent(Sent),
    Held(Held),
}

/// The ack of one publish of a hand-off: the hand-off itself goes in the batch's burst, a
/// delayed schedule and a tick record are plain publishes (other streams).
enum Ack {
    Plain(AckDue),
    Burst(burst::Stored),
}

impl Ack {
    /// A plain publish's ack, due from now.
    fn plain(ack: PublishAckFuture) -> Self {
        Ack::Plain(publish::due(ack))
    }

    async fn stored(self) -> Result<(), NatsError> {
        match self {
            Ack::Plain(ack) => ack.await.map(drop).during(|| "hand off"),
            Ack::Burst(stored) => stored.await,
        }
    }
}

/// What the three stages of the creator share: the client, the node that signs, and the way
/// back for the requests that failed for a transient reason.
#[derive(Clone)]
struct Stage {
    client: AxClient,
    node: NodeId,
    again: mpsc::UnboundedSender<Request>,
}

/// A chunk of records published, their acks pending.
type Published = Vec<(Request, Pending)>;

impl Stage {
    fn batch(&self) -> Batch<'_> {
        Batch {
            client: &self.client,
            node: &self.node,
            failed: Vec::new(),
            set_aside: Vec::new(),
        }
    }

    /// Ends what a stage's batch failed at: the permanent failures set aside, the transient
    /// ones queued again after their backoff.
    async fn finish(&self, mut batch: Batch<'_>) {
        batch.set_aside().await;
        for mut failed in batch.failed {
            let wait = failed.backoff;
            failed.backoff = (wait * 2).min(MAX_BACKOFF);
            let again = self.again.clone();
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                let _ = again.send(failed);
            });
        }
    }

    /// Stage 1: applies the overlap policies of what came in together, then publishes the
    /// records (create-if-absent on each instance id) a chunk at a time, each chunk passed on
    /// at once with its acks pending. An overlap policy reads the job's latest instance, which
    /// a creation notes once it is settled: what comes in with one to apply waits until every
    /// chunk passed on before is settled (`settled` counts them), as when batches ran one
    /// after another.
    async fn publish_records(
        self,
        mut requests: mpsc::UnboundedReceiver<Request>,
        published: mpsc::Sender<Published>,
        mut settled: watch::Receiver<u64>,
    ) {
        let mut taken = Vec::with_capacity(BATCH);
        let mut chunks = 0u64;
        while requests.recv_many(&mut taken, BATCH).await > 0 {
            if taken.iter().any(|r| r.instance.overlap() != Overlap::Allow)
                && settled.wait_for(|n| *n >= chunks).await.is_err()
            {
                return;
            }
            let mut batch = self.batch();
            // Overlap policies (cron ticks of jobs whose policy is not `allow`; rare, one by one).
            let mut candidates = Vec::with_capacity(taken.len());
            for request in taken.drain(..) {
                candidates.extend(batch.apply_overlap(request).await);
            }
            self.finish(batch).await;
            let mut candidates = candidates.into_iter().peekable();
            while candidates.peek().is_some() {
                let mut chunk = Vec::with_capacity(CHUNK);
                for mut request in candidates.by_ref().take(CHUNK) {
                    request.instance.record.created_by = Some(self.node.clone());
                    request.instance.record.written_by = Some(self.node.clone());
                    let publish = publish_record(&self.client, &request).await;
                    chunk.push((request, publish));
                }
                if published.send(chunk).await.is_err() {
                    return;
                }
                chunks += 1;
                // The hand-offs of this chunk may start while the next one is published.
                tokio::task::yield_now().await;
            }
        }
    }

    /// Stage 2: as each record is stored, its hand-off and tick record go out (the hand-offs
    /// in one burst, kept open while more chunks wait and ended once none does), or, for a
    /// fire taken ahead, are made ready to go out at its instant; each chunk's hand-offs are
    /// passed on.
    async fn hand_on_chunks(
        self,
        mut published: mpsc::Receiver<Published>,
        sent: mpsc::UnboundedSender<Vec<Outgoing>>,
    ) {
        while let Some(mut chunk) = published.recv().await {
            let hand_offs = burst::Open::new(&self.client);
            loop {
                let mut batch = self.batch();
                let mut handed = Vec::with_capacity(chunk.len());
                for (request, publish) in chunk {
                    handed.extend(batch.hand_on(request, publish, &hand_offs).await);
                }
                self.finish(batch).await;
                if sent.send(handed).is_err() {
                    return;
                }
                match published.try_recv() {
                    Ok(next) => chunk = next,
                    Err(_) => break,
                }
            }
            drop(hand_offs);
        }
    }

    /// Stage 3: sends the held hand-offs at their instants, in a burst of their own (ended
    /// before each wait, kept open while more chunks come without one), and passes every
    /// chunk's hand-offs on to have their answers awaited.
    async fn release_chunks(
        self,
        mut outgoing: mpsc::UnboundedReceiver<Vec<Outgoing>>,
        sent: mpsc::UnboundedSender<Vec<Sent>>,
    ) {
        let mut hand_offs: Option<burst::Open> = None;
        while let Some(chunk) = outgoing.recv().await {
            let mut released = Vec::with_capacity(chunk.len());
            for item in chunk {
                let held = match item {
                    Outgoing::Sent(done) => {
                        released.push(done);
                        continue;
                    }
                    Outgoing::Held(held) => held,
                };
                if held.due > Instant::now() {
                    hand_offs = None;
                    tokio::time::sleep_until(held.due).await;
                }
                let burst = hand_offs.get_or_insert_with(|| burst::Open::new(&self.client));
                let acks = held.item.map(|item| vec![Ack::Burst(burst.push(item))]);
                released.push((held.request, Created::Fired, false, acks));
            }
            if sent.send(released).is_err() {
                return;
            }
            if outgoing.is_empty() {
                hand_offs = None;
            }
        }
    }

    /// Stage 4: once a hand-off is stored, its creation is done; counts the chunks settled.
    async fn settle_chunks(
        self,
        mut sent: mpsc::UnboundedReceiver<Vec<Sent>>,
        settled: watch::Sender<u64>,
    ) {
        while let Some(chunk) = sent.recv().await {
            let mut batch = self.batch();
            for sent in chunk {
                batch.settle(sent).await;
            }
            self.finish(batch).await;
            settled.send_modify(|n| *n += 1);
        }
    }
}

/// Publishes the record with `expected last subject sequence = 0`: a create-if-absent.
async fn publish_record(client: &AxClient, request: &Request) -> Pending {
    let record = &request.instance.record;
    Ok(publish::due(
        client
            .publish_record(&record.instance_id, record, 0)
            .await?,
    ))
}

/// What one stage did with the creations in its hands: those that failed for a transient
/// reason collect in `failed`, to be tried again.
struct Batch<'a> {
    client: &'a AxClient,
    node: &'a NodeId,
    failed: Vec<Request>,
    /// Failed for a permanent reason, with it.
    set_aside: Vec<(Request, String)>,
}

impl Batch<'_> {
    fn fail(&mut self, request: Request, error: &ActorError) {
        if permanent(error) {
            self.set_aside.push((request, error.to_string()));
            return;
        }
        warn_transient(&request, error);
        self.failed.push(request);
    }

    /// Ends what failed for good: the record (if it was written) `failed` with the reason, an
    /// alert, and the answer to whoever waits. Never tried again, so it holds nothing up.
    async fn set_aside(&mut self) {
        for (request, reason) in std::mem::take(&mut self.set_aside) {
            let (record, work) = (&request.instance.record, &request.instance.work);
            let message = format!(
                "instance {} of job {} cannot be handed on and is set aside: {reason}",
                record.instance_id,
                work.job()
            );
            tracing::error!(instance = %record.instance_id, "{message}");
            let ended = self
                .client
                .update_instance(&record.instance_id, |r| {
                    r.ended_early(&record.trace_id, State::Failed, Tag::Rejected, &message)
                })
                .await;
            if let Err(e) = ended {
                tracing::warn!(instance = %record.instance_id, error = %e, "set-aside instance not marked failed");
            }
            publish::instance_alert(self.client, self.node, AlertKind::Flow, message, work).await;
            finish(request, Created::SetAside);
        }
    }

    /// The same hand-off, published by another Scheduler that raced for this fire, is being
    /// stored at this moment (error 10158): not a failure, and no reason to back off. Tried
    /// again shortly, the publish finds that copy stored (and is acknowledged as a duplicate)
    /// or, if the other one failed, stores its own.
    fn again_soon(&mut self, mut request: Request) {
        tracing::debug!(instance = %request.instance.record.instance_id, "hand-off being stored by another Scheduler; publishing again shortly");
        request.backoff = IN_PROCESS_RETRY;
        self.failed.push(request);
    }

    /// The request, if it goes on to be created (with its gate when it queues).
    async fn apply_overlap(&mut self, mut request: Request) -> Option<Request> {
        let instance = &mut request.instance;
        let overlap = instance.overlap();
        match overlap::decide(self.client, &instance.work, overlap).await {
            Ok(Decision::Proceed) => Some(request),
            Ok(Decision::Queue(gate)) => {
                instance.work.gate = Some(gate);
                instance.skip_coordinator = false;
                Some(request)
            }
            Ok(Decision::Skip(reason)) => {
                let tick = Tick {
                    job: instance.work.job(),
                    at: instance.record.expected_time,
                    outcome: TickOutcome::Skipped,
                    instance_id: None,
                    reason,
                };
                match ticks::record(self.client, self.node, tick).await {
                    Ok(()) => finish(request, Created::Skipped),
                    Err(e) => self.fail(request, &e),
                }
                None
            }
            Err(e) => {
                self.fail(request, &e);
                None
            }
        }
    }

    /// Awaits the record's ack and hands the instance on as what was found calls for (a fire
    /// taken ahead that created its record: its hand-off made ready, to go out at its instant).
    async fn hand_on(
        &mut self,
        mut request: Request,
        publish: Pending,
        hand_offs: &burst::Open,
    ) -> Option<Outgoing> {
        let stored = match publish {
            Ok(ack) => ack.await,
            Err(e) => {
                self.fail(request, &e);
                return None;
            }
        };
        let found = match stored {
            Ok(ack) => {
                // The worker's first write to the record then needs no read.
                let record = Box::new(request.instance.record.clone());
                request.instance.work.stored = Some(StoredRecord {
                    record,
                    revision: ack.sequence,
                });
                Existing::Ours
            }
            Err(e) if wrong_last_sequence(&e) => {
                match existing(self.client, &request.instance.record).await {
                    Ok(found) => found,
                    Err(e) => {
                        self.fail(request, &e);
                        return None;
                    }
                }
            }
            Err(e) => {
                self.fail(request, &NatsError::new("create instance", e).into());
                return None;
            }
        };
        if let Some(due) = request.hold {
            crate::test_hooks::failpoint::hit("creator.held");
            if found == Existing::Ours {
                let item = ready_hand_off(self.client, &request.instance).await;
                return Some(Outgoing::Held(Held { request, item, due }));
            }
            if due > Instant::now() {
                tokio::time::sleep_until(due).await;
            }
        }
        let (outcome, sent) = self
            .hand_off_found(&request.instance, found, hand_offs)
            .await;
        Some(Outgoing::Sent((
            request,
            outcome,
            found == Existing::Other,
            sent,
        )))
    }

    async fn hand_off_found(
        &self,
        instance: &NewInstance,
        found: Existing,
        hand_offs: &burst::Open,
    ) -> (Created, Result<Vec<Ack>, ActorError>) {
        let (client, node) = (self.client, self.node);
        let sends = Sends::of(found, instance.tick);
        let mut sent = match sends.hand_off {
            HandOff::Whole => hand_off(client, node, instance, hand_offs).await,
            HandOff::Work => hand_off_work(client, instance, hand_offs).await,
            HandOff::Nothing => Ok(Vec::new()),
        };
        if sends.deduplicated {
            if let Ok(acks) = sent.as_mut() {
                let tick =
                    instance.tick_of(TickOutcome::Deduplicated, "created by another Scheduler");
                match ticks::publish(client, node, tick).await {
                    Ok(ack) => acks.push(Ack::plain(ack)),
                    Err(e) => sent = Err(e),
                }
            }
        }
        (sends.outcome, sent)
    }

    /// Awaits a hand-off's acks; then the creation is done (and the instance, if another
    /// attempt stood in its place, watched for an orphan).
    async fn settle(&mut self, (request, outcome, watch, sent): Sent) {
        let mut in_process = false;
        let stored = match sent {
            Ok(acks) => {
                let mut result = Ok(());
                for ack in acks {
                    if let Err(e) = ack.stored().await {
                        in_process |= duplicate_in_process(&e);
                        result = Err(e.into());
                    }
                }
                result
            }
            Err(e) => Err(e),
        };
        match stored {
            Ok(()) => {}
            Err(_) if in_process => return self.again_soon(request),
            Err(e) => return self.fail(request, &e),
        }
        let instance = &request.instance;
        if outcome == Created::Fired && !instance.delayed {
            crate::metrics::fire_handed_on(instance.record.expected_time);
        }
        if outcome == Created::Fired && instance.work.spec.overlap != Overlap::Allow {
            let (job, id) = (instance.work.job(), &instance.record.instance_id);
            if let Err(e) = overlap::note_latest(self.client, job, id).await {
                tracing::warn!(instance = %id, error = %e, "latest instance not noted");
            }
        }
        if watch {
            // A different attempt, whose creator may have died before handing it on.
            orphans::watch(self.client.clone(), self.node.clone(), (**instance).clone());
        }
        finish(request, outcome);
    }
}

/// Publishes the hand-off of the first attempt ([`hand_off_item`]), or a delayed instance's
/// schedule.
async fn hand_off_work(
    client: &AxClient,
    instance: &NewInstance,
    hand_offs: &burst::Open,
) -> Result<Vec<Ack>, ActorError> {
    if instance.delayed {
        return Ok(vec![Ack::plain(delayed::schedule(client, instance).await?)]);
    }
    let item = hand_off_item(client, instance)?;
    Ok(vec![Ack::Burst(hand_offs.push(item))])
}

/// A fire taken ahead, its record stored: its hand-off encoded and the event of its creation
/// published, for its [`Held`] hand-off.
async fn ready_hand_off(
    client: &AxClient,
    instance: &NewInstance,
) -> Result<burst::Item, ActorError> {
    let item = hand_off_item(client, instance)?;
    publish::event(client, &instance.record).await;
    Ok(item)
}

/// The hand-off of the first attempt, encoded: to the Router, or to the DagCoordinator when the
/// DAG may concern it. Its message id is the attempt's, so a second hand-off of the same
/// attempt (by another creator, or a retry) within the de-duplication window is dropped.
fn hand_off_item(client: &AxClient, instance: &NewInstance) -> Result<burst::Item, ActorError> {
    let (subject, msg_id) = instance.hand_off_to(client.subjects());
    Ok(burst::Item::new(subject, &msg_id, &instance.work)?)
}

/// Publishes the hand-off, the tick record of a caught-up tick and the event. A tick fired on
/// time has no record of its own: its instance record (its id is the job and the tick, it names
/// its creator) is the ledger's entry, which saves a store per fire.
async fn hand_off(
    client: &AxClient,
    node: &NodeId,
    instance: &NewInstance,
    hand_offs: &burst::Open,
) -> Result<Vec<Ack>, ActorError> {
    let mut acks = hand_off_work(client, instance, hand_offs).await?;
    if let Some(outcome) = instance.tick.filter(|t| *t != TickOutcome::Fired) {
        acks.push(Ack::plain(
            ticks::publish(client, node, instance.tick_of(outcome, "")).await?,
        ));
    }
    publish::event(client, &instance.record).await;
    Ok(acks)
}

/// Whether a publish was refused because a message with the same id is being stored right
/// now (a clustered stream, error 10158 "duplicate message id is in process").
fn duplicate_in_process(error: &NatsError) -> bool {
    error.server_code() == Some(async_nats::jetstream::ErrorCode::STREAM_DUPLICATE_MESSAGE_CONFLICT)
}

/// Whether a creation or hand-off failed for a reason no retry changes: the message is larger
/// than the server's `max_payload`, or the value does not encode.
fn permanent(error: &ActorError) -> bool {
    use async_nats::client::PublishErrorKind as Core;
    if matches!(error, ActorError::Codec(_)) {
        return true;
    }
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = next {
        if let Some(e) = e.downcast_ref::<PublishError>() {
            return e.kind() == PublishErrorKind::MaxPayloadExceeded;
        }
        if let Some(e) = e.downcast_ref::<async_nats::client::PublishError>() {
            return e.kind() == Core::MaxPayloadExceeded;
        }
        next = e.source();
    }
    false
}

fn warn_transient(request: &Request, error: &ActorError) {
    tracing::warn!(
        instance = %request.instance.record.instance_id,
        error = %error,
        retry_in = ?request.backoff,
        "cannot create instance yet"
    );
}

/// What was under an instance's id when its creation found one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Existing {
    /// This creation's own record (an earlier try whose ack was lost).
    Ours,
    /// Another creator's record of the same first attempt (same trace id), not moved on yet.
    SameAttempt,
    /// A different attempt.
    Other,
}

/// What a creation sends once it knows what stood under its instance's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sends {
    /// What the creation was.
    outcome: Created,
    /// The hand-off of the first attempt.
    hand_off: HandOff,
    /// A `deduplicated` tick for the ledger.
    deduplicated: bool,
}

/// Which hand-off a creation sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HandOff {
    /// The hand-off, a caught-up tick's record and the event of the creation.
    Whole,
    /// The hand-off alone (its message id makes a second one a no-op).
    Work,
    /// None.
    Nothing,
}

impl Sends {
    fn of(found: Existing, tick: Option<TickOutcome>) -> Self {
        // A live fire that finds its instance created was raced by another Scheduler (a
        // handover): the ledger says so. A catch-up that finds it created finds a tick that was
        // fired after all (the watermark it counted from lags the fires by a second or so): the
        // instance record says so, nothing more to record.
        let raced = tick == Some(TickOutcome::Fired);
        let (outcome, hand_off) = match found {
            Existing::Ours => (Created::Fired, HandOff::Whole),
            // Another creator wrote the same first attempt, and may have died before handing
            // it on: hand it on too.
            Existing::SameAttempt => (Created::Deduplicated, HandOff::Work),
            Existing::Other => (Created::Deduplicated, HandOff::Nothing),
        };
        Self {
            outcome,
            hand_off,
            deduplicated: raced && found != Existing::Ours,
        }
    }
}

/// Reads the record that stood in the way of creating `record`.
async fn existing(
    store: &(impl Instances + Registry),
    record: &InstanceRecord,
) -> Result<Existing, ActorError> {
    let Some(stored) = store.record(&record.instance_id).await? else {
        // Refused as existing, yet not there: deleted with its job in between (nothing to
        // hand on), or — the job still there — a refusal that must not be taken for another
        // Scheduler's record, or the fire is lost: the creation is tried again.
        if store.job(&record.job).await?.is_none() {
            return Ok(Existing::Other);
        }
        return Err(NatsError::new(
            format!("create instance {}", record.instance_id),
            Reason("refused as existing, but no record is there".into()),
        )
        .into());
    };
    let untouched = stored.state == State::Running
        && matches!(stored.tag, Tag::Queued | Tag::Scheduled)
        && stored.attempt == 1
        && stored.run_start == 1;
    Ok(if stored.trace_id != record.trace_id {
        Existing::Other
    } else if stored.created_at == record.created_at && stored.created_by == record.created_by {
        // Two Schedulers firing the same tick often write it at the same millisecond: only
        // the writer's own id tells its record from the other's.
        Existing::Ours
    } else if untouched {
        Existing::SameAttempt
    } else {
        // The attempt has moved on (or ended): handing it on again would be wrong.
        Existing::Other
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 6, 6, 0, s).unwrap()
    }

    #[tokio::test]
    async fn a_handover_waits_for_the_ticks_it_took_and_not_for_those_taken_after() {
        let in_flight = Arc::new(InFlight::default());
        let taken = Unfinished::new(&in_flight, Some(at(10)));
        let later = Unfinished::new(&in_flight, Some(at(11)));
        let trigger = Unfinished::new(&in_flight, None);
        let short = Duration::from_millis(50);
        assert!(
            !in_flight.settled(at(10), short).await,
            "tick 10 is unfinished"
        );
        let waiting = tokio::spawn({
            let in_flight = in_flight.clone();
            async move { in_flight.settled(at(10), Duration::from_secs(10)).await }
        });
        drop(taken);
        assert!(waiting.await.unwrap(), "tick 10 ended");
        assert!(in_flight.settled(at(10), short).await);
        assert!(!in_flight.settled(at(11), short).await);
        drop((later, trigger));
        assert!(in_flight.settled(at(11), short).await);
    }

    mod found {
        use ax_bus::InstanceRecord;

        use super::super::*;
        use crate::scheduler::store::memory::Memory;
        use crate::test_fixtures::spec;

        /// A first attempt of `job`, as a creator about to write it would hold it.
        fn fire(job: &str) -> InstanceRecord {
            let now = ax_bus::time::now();
            InstanceRecord::first(
                &spec(job, Some("* * * * *"), &[]),
                now,
                "2026-12-07".into(),
                Default::default(),
                ax_bus::instance::Trigger::Cron,
                now,
            )
        }

        /// `record` as another Scheduler wrote the same tick: same id and trace, its own
        /// creator.
        fn theirs(record: &InstanceRecord) -> InstanceRecord {
            InstanceRecord {
                created_by: Some("another-node".parse().unwrap()),
                ..record.clone()
            }
        }

        #[tokio::test]
        async fn a_record_is_ours_the_same_attempt_or_another() {
            let ours = fire("etl");
            let memory = Memory::with([ours.clone()]).registering([spec("etl", None, &[])]);
            assert_eq!(existing(&memory, &ours).await.unwrap(), Existing::Ours);

            let memory = Memory::with([theirs(&ours)]);
            assert_eq!(
                existing(&memory, &ours).await.unwrap(),
                Existing::SameAttempt
            );

            // The other creator's attempt has started: handing it on again would be wrong.
            let mut started = theirs(&ours);
            started.tag = Tag::Executing;
            let memory = Memory::with([started]);
            assert_eq!(existing(&memory, &ours).await.unwrap(), Existing::Other);

            // A retried or re-run attempt stands there: another trace.
            let mut other = theirs(&ours);
            other.trace_id = ax_bus::ids::TraceId::random();
            let memory = Memory::with([other]);
            assert_eq!(existing(&memory, &ours).await.unwrap(), Existing::Other);
        }

        #[tokio::test]
        async fn a_refusal_with_no_record_is_nothing_to_hand_on_only_with_its_job_gone() {
            let fire = fire("etl");
            // Deleted with its job in between.
            let gone = Memory::default();
            assert_eq!(existing(&gone, &fire).await.unwrap(), Existing::Other);
            // The job is there: the creation is tried again, never taken for another's.
            let there = Memory::default().registering([spec("etl", None, &[])]);
            let error = existing(&there, &fire).await.unwrap_err();
            assert!(error.to_string().contains("no record is there"), "{error}");
        }

        #[test]
        fn what_each_finding_sends() {
            let live = Some(TickOutcome::Fired);
            let catch_up = Some(TickOutcome::CaughtUp);
            let sends = |found, tick| {
                let s = Sends::of(found, tick);
                (s.outcome, s.hand_off, s.deduplicated)
            };
            use Created::{Deduplicated, Fired};
            use Existing::{Other, Ours, SameAttempt};
            assert_eq!(sends(Ours, live), (Fired, HandOff::Whole, false));
            assert_eq!(sends(Ours, None), (Fired, HandOff::Whole, false));
            // Raced by another Scheduler on a live fire: the ledger says so.
            assert_eq!(
                sends(SameAttempt, live),
                (Deduplicated, HandOff::Work, true)
            );
            assert_eq!(sends(Other, live), (Deduplicated, HandOff::Nothing, true));
            // A catch-up or a trigger that finds its instance: nothing more to record.
            assert_eq!(
                sends(SameAttempt, catch_up),
                (Deduplicated, HandOff::Work, false)
            );
            assert_eq!(
                sends(Other, catch_up),
                (Deduplicated, HandOff::Nothing, false)
            );
            assert_eq!(sends(Other, None), (Deduplicated, HandOff::Nothing, false));
        }

        #[test]
        fn only_what_no_retry_changes_is_set_aside() {
            let codec = ActorError::from(ax_bus::codec::CodecError::UnsupportedContentType(
                "text/plain".into(),
            ));
            assert!(permanent(&codec));
            let away = ActorError::from(NatsError::new(
                "create instance",
                Reason("timed out".into()),
            ));
            assert!(!permanent(&away));
        }
    }
}
