//! # Scheduler
//! Owns the job registry view and the time wheel of pending fires (next cron fires, delayed
//! retries). Reads the registry bucket (replayed in full on every start), the control subjects
//! and `ax.internal.retry.>` (failed attempts with a retry left). Writes instance records (create-if-absent) and
//! `ax.internal.created.<job>` (through the [`Creator`]), and next attempts on
//! `ax.internal.ready.<priority>`.
//!
//! Any number of Schedulers may run: the cron jobs are split into partitions, each owned by
//! one live Scheduler (see [`partitions`]), which alone keeps that partition's jobs in its wheel.
//! When a partition changes hands, its jobs are loaded from the registry by the new owner, which
//! fires the ticks after those its previous owner fired (or, if that one died, catches up by
//! each job's misfire policy from the instant the dead one last said its fires were settled). Should two Schedulers fire one tick while
//! ownership moves, the instances bucket still lets exactly one create it.
//!
//! A retry is remembered twice: in the wheel, for millisecond precision, and in JetStream — the
//! retry message is negatively acknowledged with a delay just past its due time, so if this
//! Scheduler dies the message comes back to another one, which runs the retry then.

pub(crate) mod control;
pub(crate) mod creator;
pub(crate) mod delayed;
pub(crate) mod fire_schedule;
pub(crate) mod graph;
pub(crate) mod misfire;
pub(crate) mod new_instance;
pub(crate) mod one_off;
pub(crate) mod orphans;
pub(crate) mod overlap;
pub(crate) mod partitions;
pub(crate) mod planner;
pub(crate) mod store;
pub(crate) mod ticks;
pub(crate) mod time_wheel;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::StreamExt;

use ax_bus::error::During;
use ax_bus::ids::{InstanceId, JobName, NodeId};
use ax_bus::partition::{self, PartitionId};
use std::collections::HashMap;

use ax_bus::client::kv_view::{FeedItem, KvFeed};
use ax_bus::instance::{State, Trigger};
use ax_bus::messages::{AlertKind, JobRecord, ResultMessage, TickOutcome, TickRecord};
use ax_bus::spec::Misfire;
use ax_bus::{codec, AxClient};

use crate::jetstream::consume::{self, ConsumerSpec};
use crate::runtime::clock::Clock;
use crate::runtime::clock_guard::ClockGuard;
use crate::runtime::progress;
use crate::runtime::supervision::{guard, note_restart, spawn_pump};
use crate::ActorError;
use creator::Creator;
use graph::Graph;
use new_instance::NewInstance;
use partitions::handover::Handover;
use partitions::{Applied, Covered, Ownership, Partitions};
use planner::{CatchUpCandidate, DueRetry, Planner};

use crate::jetstream::publish;

/// The actor's name in counters, logs and `ax nodes`.
pub(crate) const ACTOR: &str = "scheduler";
/// The longest the wheel sleeps, so that a jump of the wall clock is noticed.
const MAX_SLEEP: Duration = Duration::from_millis(500);
/// How long a handover waits for the creations already submitted to be recorded.
const HANDOVER_SETTLE: Duration = Duration::from_secs(3);
/// How long after its due time a retry's result comes back to any Scheduler.
const RETRY_BACKSTOP: chrono::Duration = chrono::Duration::seconds(3);

/// The Scheduler actor.
#[derive(Debug)]
pub struct Scheduler {
    client: AxClient,
    clock: Arc<dyn Clock>,
    node: NodeId,
    planner: Planner,
    /// The dependency graph over the whole registry, shared with the control desk.
    graph: Graph,
    creator: Creator,
    wake: Option<SpawnHandle>,
    /// After a restart: the time of the last completed tick, from which the registry replay
    /// schedules fires, so the ticks of the restart gap still fire.
    replay_from: Option<chrono::DateTime<chrono::Utc>>,
    /// The instant through which the last tick took the fires (its time plus
    /// [`creator::AHEAD`]): where a restart, or a partition's next owner, goes on from.
    taken_through: chrono::DateTime<chrono::Utc>,
    /// When this Scheduler was built: the ticks a partition's dead owner missed after it are
    /// a failover's, fired whatever the misfire policy (see [`misfire::with_failover`]).
    running_since: chrono::DateTime<chrono::Utc>,
    /// This node's partitions of the cron jobs.
    partitions: Partitions,
    /// The partitions whose jobs this Scheduler keeps, each loading, catching up or ready.
    handover: Handover,
    /// Bumped to make the registry feed read everything again (partitions were taken).
    reload: Option<tokio::sync::watch::Sender<u64>>,
    /// Told the number of jobs each time the registry has been (re)loaded.
    loaded: Option<tokio::sync::watch::Sender<Option<usize>>>,
    /// While it says the node's clock is off, nothing fires.
    clock_guard: Option<ClockGuard>,
    /// Whether fires were held for the clock since the last tick.
    held_for_clock: bool,
    /// How far ahead a delayed trigger or a job's `at` may be due.
    max_delay: std::time::Duration,
    /// Who may send which command.
    auth: control::AuthSettings,
}

impl Scheduler {
    /// A Scheduler on `client`, reading time from `clock`. Must be built on the runtime it
    /// runs on (its creation task is spawned there).
    pub fn new(
        client: AxClient,
        clock: Arc<dyn Clock>,
        node: NodeId,
        partitions: Partitions,
    ) -> Self {
        let now = clock.now();
        let creator = Creator::start(client.clone(), node.clone());
        partitions.attach(creator.in_flight());
        Self {
            client,
            clock,
            node,
            planner: Planner::new(now),
            graph: Graph::default(),
            creator,
            wake: None,
            replay_from: None,
            taken_through: now,
            running_since: now,
            partitions,
            handover: Handover::default(),
            reload: None,
            loaded: None,
            clock_guard: None,
            held_for_clock: false,
            max_delay: delayed::DEFAULT_MAX_DELAY,
            auth: control::AuthSettings::default(),
        }
    }

    /// Checks every command's token and role (`[auth]`), and how risky re-runs are approved.
    pub fn with_auth(mut self, auth: control::AuthSettings) -> Self {
        self.auth = auth;
        self
    }

    /// Refuses delayed triggers and one-off jobs due more than `max_delay` ahead (a year
    /// unless said otherwise).
    pub fn limiting_delays_to(mut self, max_delay: std::time::Duration) -> Self {
        self.max_delay = max_delay;
        self
    }

    /// Holds every fire and retry while `guard` says the node's clock is off: they stay in the
    /// wheel and go out once it is back (other Schedulers, with good clocks, fire them
    /// meanwhile; the instance ids make sure each fire runs once).
    pub fn guarded_by(mut self, guard: ClockGuard) -> Self {
        self.clock_guard = Some(guard);
        self
    }

    /// Reports on `loaded` the number of jobs once the registry is loaded (after every start
    /// and restart): how benchmarks and tests see that a Scheduler is ready.
    pub fn reporting_load(mut self, loaded: tokio::sync::watch::Sender<Option<usize>>) -> Self {
        self.loaded = Some(loaded);
        self
    }

    /// Records skipped ticks, counted among the unfinished work (so the settled tick waits
    /// for them) until they are.
    fn record_skipped(&self, job: &JobName, skipped: Vec<(chrono::DateTime<chrono::Utc>, String)>) {
        let (client, node, job) = (self.client.clone(), self.node.clone(), job.clone());
        let held = skipped.first().map(|(tick, _)| self.creator.hold(*tick));
        actix::spawn(async move {
            record_skipped(&client, &node, &job, skipped).await;
            drop(held);
        });
    }

    /// Tells the keeper which partitions are ready: loaded, their missed ticks looked at.
    fn tell_ready(&self) {
        self.partitions.set_ready(self.handover.ready());
    }

    /// Records the ticks a misfire policy skipped (oldest first) — except the first ones that
    /// already have a record: orphans, whose creator died after writing the record and before
    /// handing it on and recording its tick (else that tick would be the last recorded one).
    /// Creations go out in tick order, so they come first, and the first tick without a record
    /// ends them. Each is handed on through the creator (`catch_up` builds it), which hands on
    /// an untouched first attempt and leaves one that moved on.
    fn hand_on_orphans_then_skip(
        &self,
        job: &JobName,
        catch_up: impl Fn(chrono::DateTime<chrono::Utc>) -> NewInstance + 'static,
        mut skipped: Vec<(chrono::DateTime<chrono::Utc>, String)>,
    ) {
        let (client, node, job) = (self.client.clone(), self.node.clone(), job.clone());
        let creator = self.creator.clone();
        let held = skipped.first().map(|(tick, _)| creator.hold(*tick));
        actix::spawn(async move {
            let _held = held;
            let mut orphans = 0;
            for (tick, _) in &skipped {
                let id = InstanceId::for_fire(&job, *tick);
                match client.instance(&id).await {
                    Ok(Some(_)) => {
                        // Fired in the second before the settled tick its previous owner
                        // wrote, or an orphan: handed on in case nobody did.
                        tracing::info!(instance = %id, "a skipped tick has a record: handing it on in case nobody did");
                        creator.submit(catch_up(*tick));
                        orphans += 1;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(instance = %id, error = %e, "cannot tell whether a skipped tick left an orphan; recording it skipped");
                        break;
                    }
                }
            }
            skipped.drain(..orphans);
            record_skipped(&client, &node, &job, skipped).await;
        });
    }

    /// Fires what is due and sleeps until the next timer.
    fn tick(&mut self, ctx: &mut Context<Self>) {
        if self.clock_guard.as_ref().is_some_and(|g| g.skewed()) {
            self.held_for_clock = true;
            self.arm(ctx);
            return;
        }
        let now = self.clock.now();
        if std::mem::take(&mut self.held_for_clock) && now + ahead() < self.taken_through {
            // The clock came back from ahead: the wheel was laid out on the wrong time. A
            // restart rebuilds it from the registry, from now.
            tracing::warn!(node = %self.node, "clock back from ahead; rebuilding the wheel");
            self.taken_through = now;
            ctx.stop();
            return;
        }
        // Fires are taken ahead of their instants (see `creator::AHEAD`), retries at theirs.
        let horizon = now + ahead();
        let Some(due) = guard(ACTOR, || self.planner.advance(horizon)) else {
            ctx.stop();
            return;
        };
        if let Some(metrics) = crate::metrics::recording() {
            metrics
                .wheel_timers
                .set(i64::try_from(self.planner.timers()).unwrap_or(i64::MAX));
        }
        if self.replay_from.is_none() {
            // Only a tick made with the whole registry loaded covers every job: a restart
            // replays from it.
            self.taken_through = horizon;
        }
        let started = tokio::time::Instant::now();
        let mut fires = due.fires;
        // A fire taken ahead holds up the hand-offs queued behind it until its instant.
        fires.sort_by_key(|fire| fire.expected);
        for fire in fires {
            if fire.paused {
                self.record_skipped(&fire.spec.name, vec![(fire.expected, "paused".to_string())]);
                continue;
            }
            let params = fire.spec.params.clone();
            let mut instance = NewInstance::of_shared(
                &fire.spec,
                fire.expected,
                fire.biz_date,
                params,
                Trigger::Cron,
                now,
            );
            instance.skip_coordinator = !self.graph.needs_coordinator(&fire.spec);
            instance.tick = Some(TickOutcome::Fired);
            match until(now, fire.expected) {
                Some(wait) => self.creator.submit_ahead(instance, started + wait),
                None => self.creator.submit(instance),
            }
        }
        if self.replay_from.is_none() {
            self.partitions.fired_through(self.taken_through);
        }
        for retry in due.retries {
            let client = self.client.clone();
            let wait = until(now, retry.due);
            actix::spawn(async move {
                if let Some(wait) = wait {
                    tokio::time::sleep(wait).await;
                }
                if let Err(e) =
                    crate::outcome::run_retry(&client, &retry.instance_id, &retry.from_trace).await
                {
                    tracing::warn!(instance = %retry.instance_id, error = %e, "retry not started; the result's redelivery will try again");
                }
            });
        }
        self.arm(ctx);
    }

    fn arm(&mut self, ctx: &mut Context<Self>) {
        if let Some(handle) = self.wake.take() {
            ctx.cancel_future(handle);
        }
        let now = self.clock.now();
        let sleep = self
            .planner
            .next_wake()
            .map(|at| (at - now - ahead()).to_std().unwrap_or(Duration::ZERO))
            .unwrap_or(MAX_SLEEP)
            .min(MAX_SLEEP);
        self.wake = Some(ctx.run_later(sleep, |act, ctx| {
            act.wake = None;
            act.tick(ctx);
        }));
    }
}

impl Actor for Scheduler {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let addr = ctx.address();
        let (reload, reloads) = tokio::sync::watch::channel(0);
        self.reload = Some(reload);
        spawn_pump(
            ACTOR,
            "partitions",
            ctx,
            follow_ownership(self.partitions.ownership(), addr.clone()),
        );
        spawn_pump(
            ACTOR,
            "registry",
            ctx,
            follow_registry(
                self.client.clone(),
                addr.clone(),
                self.partitions.ownership(),
                reloads,
            ),
        );
        let desk = control::Desk {
            client: self.client.clone(),
            creator: self.creator.clone(),
            graph: self.graph.clone(),
            node: self.node.clone(),
            max_delay: self.max_delay,
            auth: self.auth,
            admission: Default::default(),
        };
        spawn_pump(
            ACTOR,
            "requests",
            ctx,
            control::front_door::serve(desk.clone()),
        );
        spawn_pump(ACTOR, "control", ctx, control::serve(desk));
        spawn_pump(
            ACTOR,
            "retries",
            ctx,
            follow_retries(self.client.clone(), addr),
        );
        spawn_pump(
            ACTOR,
            "due",
            ctx,
            delayed::follow(self.client.clone(), self.node.clone()),
        );
        self.arm(ctx);
        tracing::info!(node = %self.node, "scheduler started");
    }
}

crate::runtime::watchdog::answers_ping!(Scheduler);

impl Supervised for Scheduler {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        note_restart(ACTOR);
        self.wake = None;
        // The view may be half-updated by whatever failed: rebuild it from the registry,
        // catching up from where the last completed tick took the fires (what it took ahead
        // is the creator's, which outlives the restart). Pending retries come back from
        // JetStream.
        self.planner = Planner::new(self.taken_through);
        self.replay_from = Some(self.taken_through);
        self.handover.restarted();
    }
}

/// [`creator::AHEAD`] as a span of the clock.
fn ahead() -> chrono::Duration {
    chrono::Duration::from_std(creator::AHEAD).unwrap_or_default()
}

/// How long from `now` until `at`, when it is later.
fn until(
    now: chrono::DateTime<chrono::Utc>,
    at: chrono::DateTime<chrono::Utc>,
) -> Option<Duration> {
    (at > now).then(|| (at - now).to_std().ok()).flatten()
}

/// A change of the job registry, from its `n`th reading (see [`follow_registry`]).
#[derive(Message)]
#[rtype(result = "()")]
struct RegistryChange(FeedItem, u64);

impl Handler<RegistryChange> for Scheduler {
    type Result = ();

    fn handle(&mut self, msg: RegistryChange, ctx: &mut Self::Context) {
        let now = self.clock.now();
        let loaded = matches!(msg.0, FeedItem::Current);
        let reading = msg.1;
        let changed = guard(ACTOR, || match msg.0 {
            FeedItem::Put { key, value, .. } => match JobRecord::from_registry(&value) {
                Ok(record) => {
                    self.graph.note_deps(&record.spec);
                    let Some(from) =
                        self.handover
                            .fires_from(&key, record.updated_at, self.replay_from, now)
                    else {
                        // Another Scheduler's (or handed over since the feed started).
                        self.planner.remove(&key);
                        return false;
                    };
                    if let Err(e) = self.planner.upsert(&record, from) {
                        tracing::error!(job = %key, error = %e, "registry holds an invalid job; not scheduled");
                    }
                    true
                }
                Err(e) => {
                    // Never executed, and what it replaced is not what the registry says now.
                    tracing::error!(job = %key, error = %e, "registry entry ignored");
                    self.planner.remove(&key);
                    self.graph.forget_deps(&key);
                    let (client, node) = (self.client.clone(), self.node.clone());
                    let message = format!("job registry entry `{key}` ignored: it {e}");
                    actix::spawn(async move {
                        publish::alert(&client, &node, AlertKind::Registry, message, None).await;
                    });
                    true
                }
            },
            FeedItem::Deleted { key } => {
                self.planner.remove(&key);
                self.graph.forget_deps(&key);
                true
            }
            FeedItem::Current => {
                self.graph.loaded();
                self.replay_from = None;
                tracing::info!(
                    jobs = self.planner.job_count(),
                    partitions = self.handover.kept(),
                    "job registry loaded"
                );
                if let Some(loaded) = &self.loaded {
                    loaded.send_replace(Some(self.planner.job_count()));
                }
                true
            }
        });
        self.partitions.set_jobs(self.planner.job_count());
        let taken = if loaded {
            self.handover.loaded(reading)
        } else {
            BTreeMap::new()
        };
        if !taken.is_empty() {
            // The partitions taken are loaded: catch up what their jobs missed.
            let (client, addr) = (self.client.clone(), ctx.address());
            actix::spawn(async move {
                loop {
                    match client.last_ticks().await {
                        Ok(last) => return addr.do_send(LastTicks(last, taken)),
                        Err(e) if addr.connected() => {
                            tracing::warn!(error = %e, "cannot read the last ticks; again in 1 s");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        Err(_) => return,
                    }
                }
            });
        }
        match changed {
            None => ctx.stop(),
            Some(true) => self.arm(ctx),
            Some(false) => {}
        }
    }
}

/// The last recorded tick of every job, read once the partitions just taken are loaded (each
/// with the instant its earlier owners settled it through).
#[derive(Message)]
#[rtype(result = "()")]
struct LastTicks(Vec<TickRecord>, BTreeMap<PartitionId, Covered>);

impl Handler<LastTicks> for Scheduler {
    type Result = ();

    /// Starts the catch-up of the jobs of the partitions just taken.
    fn handle(&mut self, msg: LastTicks, ctx: &mut Self::Context) {
        let mut last: HashMap<JobName, chrono::DateTime<chrono::Utc>> = HashMap::new();
        for record in msg.0 {
            let entry = last.entry(record.job).or_insert(record.tick);
            *entry = (*entry).max(record.tick);
        }
        let (count, taken) = (self.handover.count(), msg.1);
        let candidates: Vec<CatchUpCandidate> = self
            .planner
            .catch_up_candidates()
            .into_iter()
            .filter(|c| taken.contains_key(&partition::of(&c.spec.name, count)))
            .collect();
        ctx.notify(CatchUp {
            last,
            covered: taken,
            candidates,
            now: self.clock.now(),
        });
    }
}

/// Jobs whose missed ticks are still to be looked at, a chunk at a time so that the wheel
/// keeps firing meanwhile (a million jobs take seconds).
#[derive(Message)]
#[rtype(result = "()")]
struct CatchUp {
    last: HashMap<JobName, chrono::DateTime<chrono::Utc>>,
    /// The partitions looked at, each with where its earlier owners left it.
    covered: BTreeMap<PartitionId, Covered>,
    candidates: Vec<CatchUpCandidate>,
    now: chrono::DateTime<chrono::Utc>,
}

/// How many jobs one [`CatchUp`] message looks at.
const CATCH_UP_CHUNK: usize = 1000;

impl Handler<CatchUp> for Scheduler {
    type Result = ();

    /// Decides about each job's ticks between the latest of: the instant its partition was
    /// settled through by its earlier owners, its last record in the tick ledger and its
    /// definition — and the instant this Scheduler started firing it: those missed by a
    /// failover are fired, the misfire policy decides about the others.
    fn handle(&mut self, mut msg: CatchUp, ctx: &mut Self::Context) {
        if self.clock_guard.as_ref().is_some_and(|g| g.skewed()) {
            // Held like every fire while the clock is off: the ticks it would count as missed
            // are measured on the wrong clock.
            ctx.notify_later(msg, MAX_SLEEP);
            return;
        }
        let rest = msg
            .candidates
            .split_off(msg.candidates.len().min(CATCH_UP_CHUNK));
        let now = msg.now;
        for candidate in std::mem::take(&mut msg.candidates) {
            let spec = &candidate.spec;
            let p = partition::of(&spec.name, self.handover.count());
            let Covered {
                through: covered,
                failover,
            } = msg.covered.get(&p).copied().unwrap_or_default();
            // With nothing known of its partition, a job with no tick recorded has missed those
            // since its definition (its owner may have died before firing its first).
            let last = [covered, msg.last.get(&spec.name).copied()]
                .into_iter()
                .flatten()
                .fold(candidate.defined_at, chrono::DateTime::max);
            let (policy, failover_from) = match (candidate.paused, failover) {
                (true, _) => (Misfire::Skip, None),
                (false, true) => (spec.misfire, covered.map(|c| c.max(self.running_since))),
                (false, false) => (spec.misfire, None),
            };
            let mut plan = misfire::with_failover(
                &candidate.schedule,
                policy,
                spec.catchup_window_secs(),
                last,
                failover_from,
                candidate.scheduled_from,
            );
            if plan.fire.is_empty() && plan.skip.is_empty() {
                continue;
            }
            if candidate.paused {
                plan.skip
                    .iter_mut()
                    .for_each(|(_, reason)| *reason = "paused".into());
            }
            if plan.more_skipped > 0 {
                if let Some((tick, _)) = plan.skip.last().cloned() {
                    plan.skip.push((
                        tick,
                        format!(
                            "and {} more missed ticks, not recorded one by one",
                            plan.more_skipped
                        ),
                    ));
                }
            }
            tracing::info!(job = %spec.name, caught_up = plan.fire.len(), skipped = plan.skip.len() + plan.more_skipped, "missed ticks");
            let catch_up = {
                let (spec, schedule) = (spec.clone(), candidate.schedule.clone());
                let skip_coordinator = !self.graph.needs_coordinator(&spec);
                move |tick| {
                    let biz_date = schedule.biz_date(tick);
                    let mut instance = NewInstance::of_shared(
                        &spec,
                        tick,
                        biz_date,
                        spec.params.clone(),
                        Trigger::CatchUp,
                        now,
                    );
                    instance.skip_coordinator = skip_coordinator;
                    instance.tick = Some(TickOutcome::CaughtUp);
                    instance
                }
            };
            for tick in plan.fire {
                self.creator.submit(catch_up(tick));
            }
            self.hand_on_orphans_then_skip(&spec.name, catch_up, plan.skip);
        }
        if !rest.is_empty() {
            msg.candidates = rest;
            ctx.notify(msg);
            return;
        }
        // Everything missed is handed to the creator: the partitions' fires are settled as
        // soon as it has finished.
        self.handover.caught_up(msg.covered.keys());
        self.tell_ready();
    }
}

/// How long the records of skipped ticks are tried again (NATS back from an outage may take
/// seconds more before its streams answer) before they are given up.
const RECORD_SKIPPED_FOR: Duration = Duration::from_secs(120);

/// Records skipped ticks, trying again with backoff while NATS does not take them (each record
/// has its message id: a repeat stores nothing twice). After [`RECORD_SKIPPED_FOR`] the failure
/// is logged: the ticks stay unrecorded, nothing else is lost.
async fn record_skipped(
    client: &AxClient,
    node: &NodeId,
    job: &JobName,
    skipped: Vec<(chrono::DateTime<chrono::Utc>, String)>,
) {
    if skipped.is_empty() {
        return;
    }
    let deadline = tokio::time::Instant::now() + RECORD_SKIPPED_FOR;
    let mut backoff = Duration::from_millis(250);
    loop {
        match ticks::record_skipped(client, node, job, skipped.clone()).await {
            Ok(()) => return,
            Err(e) if tokio::time::Instant::now() + backoff >= deadline => {
                tracing::warn!(%job, error = %e, "skipped ticks not recorded");
                return;
            }
            Err(e) => {
                tracing::debug!(%job, error = %e, retry_in = ?backoff, "skipped ticks not recorded yet");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// A retry to hold in the wheel.
#[derive(Message)]
#[rtype(result = "()")]
struct HoldRetry(DueRetry);

impl Handler<HoldRetry> for Scheduler {
    type Result = ();

    fn handle(&mut self, msg: HoldRetry, ctx: &mut Self::Context) {
        self.planner.add_retry(msg.0);
        self.arm(ctx);
    }
}

/// Reads the registry once this node's first partitions are known, then follows it; reads it
/// again from the start each time `reloads` changes (partitions were taken: their jobs are
/// among those already read).
async fn follow_registry(
    client: AxClient,
    addr: Addr<Scheduler>,
    mut ownership: tokio::sync::watch::Receiver<Ownership>,
    mut reloads: tokio::sync::watch::Receiver<u64>,
) -> Result<(), ActorError> {
    let keeper_gone = |_| ActorError::Stopped("the partition keeper");
    ownership
        .wait_for(|o| o.settled)
        .await
        .map_err(keeper_gone)?;
    let pump = progress::register(ACTOR, "registry", None);
    loop {
        let reading = *reloads.borrow_and_update();
        let feed = KvFeed::open(&client.js, &client.layout.jobs_bucket(), ">").await?;
        let mut feed = progress::Progressed::new(feed.into_stream(), pump.clone());
        loop {
            tokio::select! {
                item = feed.next() => match item {
                    Some(item) => {
                        let item = item?;
                        if let (FeedItem::Current, Some(delay)) = (&item, crate::test_hooks::load_delay()) {
                            tokio::select! {
                                () = tokio::time::sleep(delay) => {}
                                changed = reloads.changed() => {
                                    changed.map_err(|_| ActorError::Stopped("the Scheduler"))?;
                                    break;
                                }
                            }
                        }
                        addr.do_send(RegistryChange(item, reading));
                    }
                    None => return Ok(()),
                },
                changed = reloads.changed() => {
                    changed.map_err(|_| ActorError::Stopped("the Scheduler"))?;
                    break;
                }
            }
        }
    }
}

/// Tells the actor each change of its partitions (and what they are when it starts).
async fn follow_ownership(
    mut ownership: tokio::sync::watch::Receiver<Ownership>,
    addr: Addr<Scheduler>,
) -> Result<(), ActorError> {
    loop {
        let now = ownership.borrow_and_update().clone();
        addr.do_send(OwnershipChanged(now));
        ownership
            .changed()
            .await
            .map_err(|_| ActorError::Stopped("the partition keeper"))?;
    }
}

/// This node's partitions changed.
#[derive(Message)]
#[rtype(result = "()")]
struct OwnershipChanged(Ownership);

impl Handler<OwnershipChanged> for Scheduler {
    type Result = ();

    /// Drops the jobs of partitions lost, saying up to which tick they were fired; starts
    /// loading those of partitions taken.
    fn handle(&mut self, msg: OwnershipChanged, ctx: &mut Self::Context) {
        let ownership = msg.0;
        let now = self.clock.now();
        let Some(change) = self.handover.apply(&ownership, self.taken_through, now) else {
            return;
        };
        let mut fired_through = change.released;
        if !fired_through.is_empty() {
            let count = self.handover.count();
            self.planner
                .retain_jobs(|name| !fired_through.contains_key(&partition::of(name, count)));
            tracing::info!(
                partitions = fired_through.len(),
                jobs = self.planner.job_count(),
                "partitions handed over"
            );
        }
        if let (Some(reading), Some(reload)) = (change.reload, &self.reload) {
            tracing::info!(
                kept = self.handover.kept(),
                "partitions taken; loading their jobs"
            );
            reload.send_replace(reading);
        }
        self.tell_ready();
        self.partitions.set_jobs(self.planner.job_count());
        let (creator, partitions) = (self.creator.clone(), self.partitions.clone());
        let (version, taken_through) = (ownership.version, self.taken_through);
        actix::spawn(async move {
            // Fired means created and handed on: the next owner fires the ticks after.
            if !fired_through.is_empty() && !creator.settled(taken_through, HANDOVER_SETTLE).await {
                tracing::warn!("creations still unfinished at a handover; the next owner catches up by the misfire policy");
                fired_through.values_mut().for_each(|t| *t = None);
            }
            partitions.applied(Applied {
                version,
                fired_through,
            });
        });
        self.arm(ctx);
    }
}

/// Reads the attempts that failed with a retry left (`ax.internal.retry.>`, the same payload
/// as their result): each becomes a retry timer.
async fn follow_retries(client: AxClient, addr: Addr<Scheduler>) -> Result<(), ActorError> {
    let spec = ConsumerSpec {
        max_ack_pending: 10_000,
        ..ConsumerSpec::new(
            client.layout.flow_stream(),
            "scheduler-retries",
            client.subjects().retry_all(),
        )
    };
    let mut messages = consume::watched(ACTOR, "retries", &client, &spec, 256).await?;
    while let Some(message) = messages.next().await {
        let message = message.during(|| "results consumer")?;
        let result: ResultMessage = match codec::decode(&message.payload) {
            Ok(result) => result,
            Err(e) => {
                tracing::warn!(subject = %message.subject, error = %e, "undecodable result ignored");
                consume::ack(&message).await;
                continue;
            }
        };
        let due = match (result.state, result.next_attempt_at) {
            (State::WaitingRetry, Some(due)) => due,
            _ => {
                consume::ack(&message).await;
                continue;
            }
        };
        let now = ax_bus::time::now();
        if due <= now {
            match crate::outcome::run_retry(&client, &result.instance_id, &result.trace_id).await {
                Ok(()) => {
                    consume::ack(&message).await;
                }
                Err(e) => {
                    tracing::warn!(instance = %result.instance_id, error = %e, "retry not started; again in 1 s");
                    consume::nak(&message, Duration::from_secs(1)).await;
                }
            }
            continue;
        }
        addr.do_send(HoldRetry(DueRetry {
            instance_id: result.instance_id.clone(),
            from_trace: result.trace_id.clone(),
            due,
        }));
        let backstop = (due - now + RETRY_BACKSTOP)
            .to_std()
            .unwrap_or(Duration::from_secs(1));
        consume::nak(&message, backstop).await;
    }
    Ok(())
}
