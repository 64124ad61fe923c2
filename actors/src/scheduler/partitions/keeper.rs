//! The partition keeper: one task per Scheduler node that keeps its member key alive, watches
//! the owners, takes and hands over partitions (see [`super::assign`]) and tells the Scheduler
//! actor which partitions are its own.
//!
//! It runs beside the actor, not in its context, so that ownership outlives a restart of the
//! actor (which then reloads its partitions' jobs from the registry). Every change of an owner
//! is a create-if-absent or a compare-and-swap on the revision read, so two Schedulers never
//! both believe they took the same partition in the same round; a partition of a Scheduler
//! counted gone (no renewal of its member key seen for [`MEMBER_TTL`]) is taken only after the
//! server confirms it holds no later renewal.
//!
//! A handover is ordered: the actor first drops the partition's jobs from its wheel and says up
//! to which tick it fired them; only then is the partition stored as handed over with that
//! tick, and the next owner fires the ticks after it. A rebalance hands on only partitions
//! that are ready (loaded, caught up): one still loading has some jobs firing and others not
//! yet, and no single tick would say what was fired. A Scheduler that cannot renew its member
//! key drops all its partitions before the key can have expired (self-fencing); the
//! create-if-absent of instance records covers the moment both may fire. A Scheduler whose
//! clock is off (see the clock guard) hands its partitions over and leaves the members until
//! its clock is back, so that Schedulers with good clocks fire its jobs meanwhile.
//!
//! Each round the keeper also writes how far this node's fires are settled (`fired.<node>`,
//! from the actor's [`super::Progress`]) — what a taker counts missed ticks from, should this
//! node die — and keeps each held partition's `covered` start point up with it, so that a
//! handover or the owner record of a take carries it on.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{CreateErrorKind, Operation};
use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot, watch};

use ax_bus::client::kv_view::{FeedItem, KvFeed};
use ax_bus::ids::NodeId;
use ax_bus::partition::{self, FiredThrough, PartitionId, PartitionOwner};
use ax_bus::{codec, AxClient};

use super::assign::{self, Owner};
use super::{lock, Applied, Ownership, SharedProgress, Start};
use crate::runtime::clock_guard::ClockGuard;
use crate::ActorError;

/// How often the keeper renews its member key and rebalances.
const ROUND: Duration = Duration::from_millis(500);
/// A Scheduler whose member key no renewal has reached this node for this long (by this node's
/// own monotonic clock, whatever the clocks say) counts as gone once the server confirms no
/// later renewal: its partitions are taken within about three seconds of its death, and the
/// ticks it missed are fired by the taker. (The bucket drops the key itself after the
/// longer lease age.)
const MEMBER_TTL: Duration = Duration::from_millis(2500);
/// How long before the others may count it gone a Scheduler that cannot renew its member key
/// drops its partitions.
const FENCE_MARGIN: Duration = Duration::from_millis(1000);
/// How long a handover waits for the actor to drop the partitions' jobs before it says that
/// nothing is known of what was fired (the next owner then catches up by the misfire policy
/// from the instant this node last said its fires were settled).
const ACTOR_ANSWER: Duration = Duration::from_secs(5);

/// A partition's owner as last read, with the revision to compare-and-swap on.
#[derive(Clone, Debug)]
struct Stored {
    owner: Owner,
    revision: u64,
    fired_through: Option<DateTime<Utc>>,
    covered_through: Option<DateTime<Utc>>,
}

/// The last renewal of a Scheduler's member key this node saw.
#[derive(Clone, Copy, Debug)]
struct Renewal {
    /// Its revision in the leases bucket.
    revision: u64,
    /// When it reached this node (for a key read at the start of the feed: when the server
    /// stored it, by this node's clock).
    seen: Instant,
}

/// The keeper's state.
pub(crate) struct Keeper {
    client: AxClient,
    node: NodeId,
    count: u16,
    owners: BTreeMap<PartitionId, Stored>,
    /// Schedulers' member keys, with the last renewal seen of each.
    members: BTreeMap<NodeId, Renewal>,
    /// What this node holds: the revision it wrote and where its fires start (its `covered`
    /// kept up with what this node has settled since).
    held: BTreeMap<PartitionId, (u64, Start)>,
    /// The version of the ownership that first told the actor each start point: once the
    /// actor has applied it, the start point is forgotten (an actor built afresh later, after a
    /// stall, starts from now and the misfire policy, as at a process start).
    told: BTreeMap<PartitionId, u64>,
    /// The latest version the actor said it applied.
    applied_version: u64,
    renewed: Option<Instant>,
    version: u64,
    ownership: watch::Sender<Ownership>,
    applied: mpsc::UnboundedReceiver<Applied>,
    /// While it says the node's clock is off, this Scheduler owns nothing.
    clock_guard: Option<ClockGuard>,
    /// Whether it stepped aside for its clock (partitions handed over, member key removed).
    aside: bool,
    /// How far the actor's fires are settled.
    progress: SharedProgress,
    /// What this node's previous process said it had settled, read at the start: where the
    /// partitions it takes back start.
    previous: Option<FiredThrough>,
    /// What this process said it had settled of each partition it held: where a partition it
    /// dropped (it could not renew its member key) and takes back starts.
    said: BTreeMap<PartitionId, DateTime<Utc>>,
}

impl Keeper {
    pub(crate) fn new(
        client: AxClient,
        node: NodeId,
        ownership: watch::Sender<Ownership>,
        applied: mpsc::UnboundedReceiver<Applied>,
        clock_guard: Option<ClockGuard>,
        progress: SharedProgress,
    ) -> Self {
        Self {
            client,
            node,
            count: 0,
            owners: BTreeMap::new(),
            members: BTreeMap::new(),
            held: BTreeMap::new(),
            told: BTreeMap::new(),
            applied_version: 0,
            renewed: None,
            version: 0,
            ownership,
            applied,
            clock_guard,
            aside: false,
            progress,
            previous: None,
            said: BTreeMap::new(),
        }
    }

    /// Keeps the partitions until told to hand them over (`hand_over` then gets its answer once
    /// they are). Feeds that break are opened again.
    pub(crate) async fn run(
        mut self,
        configured: u16,
        mut hand_over: mpsc::Receiver<oneshot::Sender<()>>,
    ) {
        self.count = self.agree_count(configured).await;
        self.previous = self.read_fired(&self.node).await;
        loop {
            match self.follow(&mut hand_over).await {
                Ok(Some(done)) => {
                    self.hand_over_all().await;
                    let _ = done.send(());
                    return;
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "partition views broke; reading them again");
                    tokio::time::sleep(ROUND).await;
                }
            }
        }
    }

    /// The deployment's number of partitions: the stored one, or `configured` if this is the
    /// first Scheduler.
    async fn agree_count(&self, configured: u16) -> u16 {
        let configured = configured.max(1);
        loop {
            let bucket = &self.client.partitions;
            match bucket
                .create(partition::COUNT_KEY, configured.to_string().into())
                .await
            {
                Ok(_) => return configured,
                Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {
                    match bucket.get(partition::COUNT_KEY).await {
                        Ok(Some(value)) => {
                            match std::str::from_utf8(&value).ok().and_then(|t| t.parse().ok()) {
                                Some(stored) => {
                                    if stored != configured {
                                        tracing::warn!(stored, configured, "this deployment has {stored} partitions, fixed when its first Scheduler started: partitions = {configured} is ignored");
                                    }
                                    return stored;
                                }
                                None => tracing::error!(
                                    "the partitions bucket's `count` is not a number; waiting for it to be fixed"
                                ),
                            }
                        }
                        Ok(None) => continue,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot read the number of partitions")
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot read the number of partitions"),
            }
            tokio::time::sleep(ROUND).await;
        }
    }

    /// Follows the owners and the members and plays a round every [`ROUND`]; returns the
    /// hand-over request when one comes, `None` when nobody can ask any more.
    async fn follow(
        &mut self,
        hand_over: &mut mpsc::Receiver<oneshot::Sender<()>>,
    ) -> Result<Option<oneshot::Sender<()>>, ActorError> {
        let layout = &self.client.layout;
        let mut owners = KvFeed::open(&self.client.js, &layout.partitions_bucket(), "p.>").await?;
        let members_pattern = format!("{}>", partition::MEMBER_PREFIX);
        let mut members =
            KvFeed::open(&self.client.js, &layout.leases_bucket(), &members_pattern).await?;
        self.owners.clear();
        self.members.clear();
        let (mut owners_current, mut members_current) = (false, false);
        let mut round = tokio::time::interval(ROUND);
        round.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                item = owners.next() => match item {
                    Some(item) => {
                        if self.owner(item?) {
                            owners_current = true;
                        }
                    }
                    None => return Err(ActorError::Stopped("the partition owners' feed")),
                },
                item = members.next() => match item {
                    Some(item) => {
                        if self.member(item?, members_current) {
                            members_current = true;
                        }
                    }
                    None => return Err(ActorError::Stopped("the Scheduler members' feed")),
                },
                _ = round.tick(), if owners_current && members_current => self.round().await,
                request = hand_over.recv() => return Ok(request),
            }
        }
    }

    /// Applies a change of an owner; true once the feed caught up.
    fn owner(&mut self, item: FeedItem) -> bool {
        match item {
            FeedItem::Put {
                key,
                value,
                revision,
                ..
            } => {
                let Some(p) = partition::from_key(&key) else {
                    return false;
                };
                let stored: PartitionOwner = match codec::decode(&value) {
                    Ok(stored) => stored,
                    Err(e) => {
                        tracing::warn!(partition = %p, error = %e, "unreadable partition owner; taken as handed over");
                        PartitionOwner {
                            node: None,
                            fired_through: None,
                            covered_through: None,
                            since: ax_bus::time::now(),
                        }
                    }
                };
                let owner = match &stored.node {
                    Some(node) => Owner::Node(node.clone()),
                    None => Owner::Nobody,
                };
                if let Some((held_revision, _)) = self.held.get(&p) {
                    if revision > *held_revision && owner != Owner::Node(self.node.clone()) {
                        tracing::warn!(partition = %p, owner = ?owner, "partition taken by another Scheduler; dropping it");
                        self.held.remove(&p);
                        handover("lost");
                        self.publish();
                    }
                }
                self.owners.insert(
                    p,
                    Stored {
                        owner,
                        revision,
                        fired_through: stored.fired_through,
                        covered_through: stored.covered_through,
                    },
                );
                false
            }
            FeedItem::Deleted { key } => {
                if let Some(p) = partition::from_key(&key) {
                    self.owners.remove(&p);
                }
                false
            }
            FeedItem::Current => true,
        }
    }

    /// Applies a change of a member key (`live`: a renewal as it happens, not one read at the
    /// start of the feed); true once the feed caught up.
    fn member(&mut self, item: FeedItem, live: bool) -> bool {
        match item {
            FeedItem::Put {
                key, revision, at, ..
            } => {
                if let Some(node) = partition::member_of(&key) {
                    let age = if live {
                        Duration::ZERO
                    } else {
                        (ax_bus::time::now() - at)
                            .to_std()
                            .unwrap_or(Duration::ZERO)
                    };
                    let seen = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
                    self.members.insert(node, Renewal { revision, seen });
                }
                false
            }
            FeedItem::Deleted { key } => {
                if let Some(node) = partition::member_of(&key) {
                    self.members.remove(&node);
                }
                false
            }
            FeedItem::Current => true,
        }
    }

    /// The Schedulers whose member key was renewed recently enough.
    fn live_members(&self) -> BTreeSet<NodeId> {
        self.members
            .iter()
            .filter(|(_, renewal)| renewal.seen.elapsed() < MEMBER_TTL)
            .map(|(node, _)| node.clone())
            .collect()
    }

    /// Whether the server confirms that Scheduler `node`, gone by this node's view, renewed
    /// its member key no later than this node last saw (the view may lag behind the server).
    async fn confirmed_gone(&mut self, node: &NodeId) -> bool {
        let key = partition::member_key(node);
        match self.client.leases.entry(key).await {
            Ok(None) => true,
            Ok(Some(entry)) if entry.operation != Operation::Put => true,
            Ok(Some(entry)) => {
                let seen = self.members.get(node).map(|r| r.revision);
                if seen.is_some_and(|seen| entry.revision <= seen) {
                    true
                } else {
                    let renewal = Renewal {
                        revision: entry.revision,
                        seen: Instant::now(),
                    };
                    self.members.insert(node.clone(), renewal);
                    false
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot check a Scheduler's member key");
                false
            }
        }
    }

    /// Tells the actor what it owns now.
    fn publish(&mut self) {
        self.version += 1;
        let held: BTreeMap<PartitionId, Start> = self
            .held
            .iter()
            .map(|(p, (_, start))| (*p, *start))
            .collect();
        if let Some(metrics) = crate::metrics::recording() {
            metrics
                .partitions_owned
                .set(i64::try_from(held.len()).unwrap_or(i64::MAX));
        }
        self.ownership.send_replace(Ownership {
            count: self.count,
            held,
            version: self.version,
            settled: true,
        });
    }

    /// One round: step aside while the clock is off; renew the member key, fence if it could
    /// not be renewed for too long; rebalance.
    async fn round(&mut self) {
        if self.clock_guard.as_ref().is_some_and(|g| g.skewed()) {
            if !self.aside {
                tracing::warn!(
                    "this node's clock is off: handing its partitions over until it is back"
                );
                self.hand_over_all().await;
                self.aside = true;
            }
            if !self.ownership.borrow().settled {
                self.publish();
            }
            return;
        }
        if std::mem::take(&mut self.aside) {
            tracing::info!("this node's clock is back: taking a share of the partitions again");
        }
        let value = self.node.as_str().to_string().into();
        match self
            .client
            .leases
            .put(partition::member_key(&self.node), value)
            .await
        {
            Ok(_) => self.renewed = Some(Instant::now()),
            Err(e) => tracing::warn!(error = %e, "member key not renewed"),
        }
        let fresh = self
            .renewed
            .is_some_and(|at| at.elapsed() + FENCE_MARGIN < MEMBER_TTL);
        if !fresh {
            if !self.held.is_empty() {
                tracing::warn!(
                    partitions = self.held.len(),
                    "cannot renew this Scheduler's member key: dropping its partitions"
                );
                self.held.clear();
                self.publish();
            } else if !self.ownership.borrow().settled {
                self.publish();
            }
            return;
        }
        let owners: BTreeMap<PartitionId, Owner> = self
            .owners
            .iter()
            .map(|(p, s)| (*p, s.owner.clone()))
            .collect();
        let members = self.live_members();
        self.forget_start_points();
        let held: BTreeSet<PartitionId> = self.held.keys().copied().collect();
        let view = assign::View {
            count: self.count,
            owners: &owners,
            members: &members,
        };
        let moves = assign::moves(&view, &self.node, &held);
        self.write_fired().await;
        let mut changed = !self.ownership.borrow().settled;
        let release = self.ready_of(&moves.release);
        if !release.is_empty() {
            self.release(&release).await;
            changed = false;
        }
        for p in moves.take {
            changed |= self.take(p).await;
        }
        if changed {
            self.publish();
        }
    }

    /// Those of `partitions` that are ready to hand on: their jobs loaded and their missed
    /// ticks looked at. Until then the wheel fires the jobs read so far from where the previous
    /// owner left off and the others not at all, so no single tick says what was fired: a
    /// rebalance waits a round or a few (a graceful stop does not wait, see
    /// [`Keeper::hand_over_all`]).
    fn ready_of(&self, partitions: &[PartitionId]) -> Vec<PartitionId> {
        let progress = lock(&self.progress);
        let ready: Vec<PartitionId> = partitions
            .iter()
            .filter(|p| progress.ready.contains(p))
            .copied()
            .collect();
        if ready.len() < partitions.len() {
            tracing::debug!(
                held_back = partitions.len() - ready.len(),
                "partitions still loading are handed on once loaded"
            );
        }
        ready
    }

    /// Hands over `partitions`: the actor drops their jobs, then each is stored as handed over
    /// with the tick its fires went up to.
    async fn release(&mut self, partitions: &[PartitionId]) {
        let mut revisions = Vec::new();
        for p in partitions {
            if let Some((revision, start)) = self.held.remove(p) {
                revisions.push((*p, revision, start.covered));
            }
        }
        self.publish();
        let fired = self.actor_answer(self.version).await;
        for (p, revision, covered) in revisions {
            let owner = PartitionOwner {
                node: None,
                fired_through: fired.get(&p).copied().flatten(),
                covered_through: covered,
                since: ax_bus::time::now(),
            };
            let value = match codec::encode(&owner) {
                Ok(value) => value,
                Err(e) => {
                    tracing::error!(error = %e, "partition owner not encoded");
                    continue;
                }
            };
            match self
                .client
                .partitions
                .update(partition::key(p), value, revision)
                .await
            {
                Ok(_) => {
                    tracing::info!(partition = %p, fired_through = ?owner.fired_through, "partition handed over");
                    handover("released");
                }
                // Taken meanwhile (this node counted as gone): the taker catches up.
                Err(e) => {
                    tracing::warn!(partition = %p, error = %e, "partition not stored as handed over")
                }
            }
        }
    }

    /// What the actor answered for `version`: up to which tick it fired each partition it
    /// dropped (empty if it did not answer in time).
    async fn actor_answer(&mut self, version: u64) -> BTreeMap<PartitionId, Option<DateTime<Utc>>> {
        let deadline = tokio::time::Instant::now() + ACTOR_ANSWER;
        loop {
            match tokio::time::timeout_at(deadline, self.applied.recv()).await {
                Ok(Some(applied)) if applied.version >= version => {
                    self.applied_version = self.applied_version.max(applied.version);
                    return applied.fired_through;
                }
                Ok(Some(applied)) => {
                    self.applied_version = self.applied_version.max(applied.version);
                }
                Ok(None) | Err(_) => {
                    tracing::warn!(
                        "the Scheduler did not say what it fired; the next owner catches up by the misfire policy"
                    );
                    return BTreeMap::new();
                }
            }
        }
    }

    /// Tries to take `p`; true when taken.
    async fn take(&mut self, p: PartitionId) -> bool {
        let stored = self.owners.get(&p).cloned();
        if let Some(Stored {
            owner: Owner::Node(other),
            ..
        }) = &stored
        {
            // Gone by this node's view: make sure the server agrees.
            if *other != self.node && !self.confirmed_gone(other).await {
                return false;
            }
        }
        let covered = self.covered(p, stored.as_ref()).await;
        let owner = PartitionOwner {
            node: Some(self.node.clone()),
            fired_through: None,
            covered_through: covered,
            since: ax_bus::time::now(),
        };
        let Ok(value) = codec::encode(&owner) else {
            return false;
        };
        let bucket = &self.client.partitions;
        let written = match &stored {
            None => bucket.create(partition::key(p), value).await.ok(),
            Some(s) => bucket
                .update(partition::key(p), value, s.revision)
                .await
                .ok(),
        };
        let Some(revision) = written else {
            return false;
        };
        let base = match &stored {
            Some(Stored {
                owner: Owner::Nobody,
                fired_through,
                ..
            }) => *fired_through,
            _ => None,
        };
        tracing::info!(partition = %p, from = ?stored.as_ref().map(|s| &s.owner), fired_through = ?base, covered_through = ?covered, "partition taken");
        handover("taken");
        let failover = matches!(&stored, Some(Stored { owner: Owner::Node(other), .. }) if *other != self.node);
        let start = Start {
            fired_through: base,
            covered,
            failover,
        };
        self.held.insert(p, (revision, start));
        if base.is_some() {
            self.told.insert(p, self.version + 1);
        }
        true
    }

    /// Up to which tick partition `p`, stored as `stored`, was settled by its earlier owners:
    /// what a handover said it fired, what a Scheduler gone said it had settled (for the
    /// partitions it listed), and what the owner before those said, whichever is latest.
    async fn covered(&self, p: PartitionId, stored: Option<&Stored>) -> Option<DateTime<Utc>> {
        let stored = stored?;
        let said = match &stored.owner {
            Owner::Nobody => stored.fired_through,
            Owner::Node(node) => {
                let fired = if *node == self.node {
                    self.previous.clone()
                } else {
                    self.read_fired(node).await
                };
                let said = fired
                    .filter(|f| f.partitions.contains(&p))
                    .map(|f| f.through);
                if *node == self.node {
                    said.max(self.said.get(&p).copied())
                } else {
                    said
                }
            }
        };
        said.max(stored.covered_through)
            .map(|t| t.min(ax_bus::time::now()))
    }

    /// What Scheduler `node` last said it had settled (`None` if nothing, or unreadable).
    async fn read_fired(&self, node: &NodeId) -> Option<FiredThrough> {
        match self.client.partitions.get(partition::fired_key(node)).await {
            Ok(Some(value)) => match codec::decode::<FiredThrough>(&value) {
                Ok(fired) => Some(fired),
                Err(e) => {
                    tracing::warn!(%node, error = %e, "unreadable settled tick of a Scheduler; its partitions are caught up from the ledger");
                    None
                }
            },
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(%node, error = %e, "cannot read the settled tick of a Scheduler; its partitions are caught up from the ledger");
                None
            }
        }
    }

    /// Writes how far this node's fires are settled, for the partitions it holds that are ready,
    /// and keeps their start points up with it.
    async fn write_fired(&mut self) {
        let fired = {
            let progress = lock(&self.progress);
            let Some((through, ready)) = progress.settled() else {
                return;
            };
            let partitions: Vec<PartitionId> = ready
                .iter()
                .filter(|p| self.held.contains_key(p))
                .copied()
                .collect();
            FiredThrough {
                through,
                partitions,
            }
        };
        if fired.partitions.is_empty() {
            return;
        }
        for p in &fired.partitions {
            if let Some((_, start)) = self.held.get_mut(p) {
                start.covered = start.covered.max(Some(fired.through));
            }
            self.said.insert(*p, fired.through);
        }
        let value = match codec::encode(&fired) {
            Ok(value) => value,
            Err(e) => {
                tracing::error!(error = %e, "settled tick not encoded");
                return;
            }
        };
        if let Err(e) = self
            .client
            .partitions
            .put(partition::fired_key(&self.node), value)
            .await
        {
            tracing::warn!(error = %e, "settled tick not written; a taker would catch up from an earlier one");
        }
    }

    /// Forgets the start points the actor has applied (see [`Keeper::told`]).
    fn forget_start_points(&mut self) {
        while let Ok(applied) = self.applied.try_recv() {
            self.applied_version = self.applied_version.max(applied.version);
        }
        let applied = self.applied_version;
        let done: Vec<PartitionId> = self
            .told
            .iter()
            .filter(|(_, version)| **version <= applied)
            .map(|(p, _)| *p)
            .collect();
        if done.is_empty() {
            return;
        }
        for p in done {
            self.told.remove(&p);
            if let Some((_, start)) = self.held.get_mut(&p) {
                start.fired_through = None;
            }
        }
        self.publish();
    }

    /// A graceful stop: hands every partition over and removes the member key, so that the
    /// others take them at their next round.
    async fn hand_over_all(&mut self) {
        let all: Vec<PartitionId> = self.held.keys().copied().collect();
        if !all.is_empty() {
            self.release(&all).await;
        }
        if let Err(e) = self
            .client
            .leases
            .delete(partition::member_key(&self.node))
            .await
        {
            tracing::warn!(error = %e, "member key not removed; the others wait for it to expire");
        }
    }
}

/// Counts a handover of kind `kind`.
fn handover(kind: &str) {
    if let Some(metrics) = crate::metrics::recording() {
        metrics
            .partition_handovers
            .get_or_create(&crate::metrics::Kind {
                kind: kind.to_string(),
            })
            .inc();
    }
}
