//! Partitioned Schedulers: each cron job belongs to one of a fixed number of partitions (see
//! [`ax_bus::partition`]), each partition to one live Scheduler, which alone keeps its jobs in
//! its wheel. Adding a Scheduler adds capacity: every fire costs one creation whatever the
//! number of Schedulers, and each holds only its share of the registry.
//!
//! - [`assign`]: the fair shares and which partitions move (pure);
//! - [`handover`]: where each partition a Scheduler keeps stands: loading, catching up, ready
//!   (pure);
//! - [`keeper`]: the task that keeps a node's member key and its partitions;
//! - [`Partitions`]: the handle the Scheduler actor (and the node, for a graceful stop) holds.
//!
//! Where a new owner starts: after a graceful handover, from the tick its previous owner fired
//! through; after a death, from the last instant the dead owner said its fires were settled
//! ([`Progress`], written every round under [`ax_bus::partition::fired_key`]; the tick ledger
//! records no tick fired on time, its instance record does): every tick after it that the
//! taker was running for is fired — a failover is not a misfire — and the misfire policy looks
//! at those before (see `misfire::with_failover`). The instant lags the fires by a round or so:
//! a tick fired in that moment and caught up again finds its instance created, and nothing runs
//! twice.
//!
//! What is not partitioned needs no partition: delayed triggers wait in JetStream and come to
//! whichever Scheduler pulls them from the shared consumer; commands (triggers, keyed triggers,
//! re-runs) go to one Scheduler of the shared control consumer; retries likewise.

pub(crate) mod assign;
pub(crate) mod handover;
pub(crate) mod keeper;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot, watch};

use ax_bus::ids::NodeId;
use ax_bus::partition::PartitionId;
use ax_bus::AxClient;

use crate::runtime::clock_guard::ClockGuard;
use crate::scheduler::creator::InFlight;

/// Where the fires of a partition start for its new owner.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Start {
    /// Set by a fresh handover: its previous owner fired every tick through this instant; the
    /// new one fires those after it as they come.
    pub fired_through: Option<DateTime<Utc>>,
    /// Every tick through this instant is settled by the earlier owners: the misfire policy
    /// looks at the ticks after it (`None`: unknown, each job's last tick in the ledger or its
    /// definition).
    pub covered: Option<DateTime<Utc>>,
    /// Taken from another Scheduler that died: the ticks it missed are a failover's, fired
    /// whatever the misfire policy. Not for a partition of this node's own taken back (after a
    /// restart, or after it could not reach NATS): no Scheduler could fire those ticks, and the
    /// policy decides.
    pub failover: bool,
}

/// Where a partition just taken stands, as the actor's catch-up sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Covered {
    /// See [`Start::covered`].
    pub through: Option<DateTime<Utc>>,
    /// See [`Start::failover`].
    pub failover: bool,
}

/// What a Scheduler owns, as its keeper last said.
#[derive(Clone, Debug, Default)]
pub(crate) struct Ownership {
    /// The deployment's number of partitions (0 until known).
    pub count: u16,
    /// The partitions owned, each with where its fires start.
    pub held: BTreeMap<PartitionId, Start>,
    /// Grows with every change.
    pub version: u64,
    /// Whether the keeper has played its first round (until then nothing is owned for sure).
    pub settled: bool,
}

/// The actor's answer to an ownership change: for each partition it dropped, the tick through
/// which it fired its jobs (`None`: they were still being loaded).
#[derive(Debug)]
pub(crate) struct Applied {
    pub version: u64,
    pub fired_through: BTreeMap<PartitionId, Option<DateTime<Utc>>>,
}

/// How far a Scheduler's fires are settled, as its actor and its creator say: what its keeper
/// writes under [`ax_bus::partition::fired_key`] every round.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// The last tick through which the wheel handed every fire due to the creator (`None`
    /// until the first such tick).
    through: Option<DateTime<Utc>>,
    /// The partitions whose jobs are loaded and whose missed ticks are looked at.
    ready: BTreeSet<PartitionId>,
    /// The creator's unfinished work.
    in_flight: Option<Arc<InFlight>>,
}

impl Progress {
    /// Every tick up to the instant returned is settled for the partitions returned: handed to
    /// the creator and not among its unfinished work.
    pub(crate) fn settled(&self) -> Option<(DateTime<Utc>, &BTreeSet<PartitionId>)> {
        let mut through = self.through?;
        // Read after `through`: whatever was handed over before it was set is either still
        // unfinished here or done.
        if let Some(oldest) = self.in_flight.as_ref().and_then(|f| f.oldest_tick()) {
            through = through.min(oldest - chrono::Duration::milliseconds(1));
        }
        Some((through, &self.ready))
    }
}

/// The shared [`Progress`].
pub(crate) type SharedProgress = Arc<Mutex<Progress>>;

/// Locks `progress` (a panic elsewhere while holding it leaves plain values behind).
pub(crate) fn lock(progress: &SharedProgress) -> MutexGuard<'_, Progress> {
    progress
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A Scheduler node's partitions: built once per node, shared by every incarnation of its
/// Scheduler actor.
#[derive(Clone, Debug)]
pub struct Partitions {
    ownership: watch::Receiver<Ownership>,
    applied: mpsc::UnboundedSender<Applied>,
    hand_over: mpsc::Sender<oneshot::Sender<()>>,
    jobs: Arc<AtomicUsize>,
    progress: SharedProgress,
}

/// The longest a graceful stop waits for its handover.
const HAND_OVER_WAIT: Duration = Duration::from_secs(10);

impl Partitions {
    /// The partitions of node `node`, and their keeper to run (until it is dropped or has
    /// handed them over); `count` is the number of partitions if this is the deployment's
    /// first Scheduler. While `clock_guard` says the clock is off, the node owns none.
    pub fn new(
        client: AxClient,
        node: NodeId,
        count: u16,
        clock_guard: Option<ClockGuard>,
    ) -> (Self, impl std::future::Future<Output = ()> + Send + 'static) {
        let (ownership_tx, ownership) = watch::channel(Ownership::default());
        let (applied, applied_rx) = mpsc::unbounded_channel();
        let (hand_over, hand_over_rx) = mpsc::channel(1);
        let progress = SharedProgress::default();
        let keeper = keeper::Keeper::new(
            client,
            node,
            ownership_tx,
            applied_rx,
            clock_guard,
            progress.clone(),
        );
        let partitions = Self {
            ownership,
            applied,
            hand_over,
            jobs: Arc::new(AtomicUsize::new(0)),
            progress,
        };
        (partitions, keeper.run(count, hand_over_rx))
    }

    /// Hands every partition over to the other Schedulers, at once rather than when this
    /// node's member key expires (a graceful stop). Waits at most 10 s.
    pub async fn hand_over(&self) {
        let (done, answer) = oneshot::channel();
        if self.hand_over.send(done).await.is_ok() {
            let _ = tokio::time::timeout(HAND_OVER_WAIT, answer).await;
        }
    }

    /// The partitions owned now and the number of jobs they hold (for `ax nodes`).
    pub fn share(&self) -> (Vec<PartitionId>, usize) {
        let held = self.ownership.borrow().held.keys().copied().collect();
        (held, self.jobs.load(Ordering::Relaxed))
    }

    pub(crate) fn ownership(&self) -> watch::Receiver<Ownership> {
        self.ownership.clone()
    }

    pub(crate) fn applied(&self, applied: Applied) {
        let _ = self.applied.send(applied);
    }

    pub(crate) fn set_jobs(&self, jobs: usize) {
        self.jobs.store(jobs, Ordering::Relaxed);
    }

    /// The creator whose unfinished work holds the settled tick back.
    pub(crate) fn attach(&self, in_flight: Arc<InFlight>) {
        lock(&self.progress).in_flight = Some(in_flight);
    }

    /// Every fire due up to `tick` has been handed to the creator.
    pub(crate) fn fired_through(&self, tick: DateTime<Utc>) {
        lock(&self.progress).through = Some(tick);
    }

    /// The partitions whose jobs are loaded and whose missed ticks are looked at.
    pub(crate) fn set_ready(&self, ready: BTreeSet<PartitionId>) {
        lock(&self.progress).ready = ready;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::creator::Unfinished;
    use chrono::TimeZone;

    fn t(s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 3, 6, 0, s).unwrap()
    }

    #[test]
    fn the_settled_tick_waits_for_the_oldest_unfinished_fire() {
        let in_flight = Arc::new(InFlight::default());
        let mut progress = Progress {
            in_flight: Some(in_flight.clone()),
            ..Progress::default()
        };
        assert!(progress.settled().is_none(), "nothing fired yet");
        progress.through = Some(t(10));
        progress.ready.insert(PartitionId(3));
        let (through, ready) = progress.settled().unwrap();
        assert_eq!((through, ready.len()), (t(10), 1));
        // Fires of 8 s and 9 s still being created: settled up to just before 8 s.
        let eight = Unfinished::new(&in_flight, Some(t(8)));
        let nine = [
            Unfinished::new(&in_flight, Some(t(9))),
            Unfinished::new(&in_flight, Some(t(9))),
        ];
        let _manual = Unfinished::new(&in_flight, None);
        let just_before = |s| t(s) - chrono::Duration::milliseconds(1);
        assert_eq!(progress.settled().unwrap().0, just_before(8));
        drop(eight);
        assert_eq!(progress.settled().unwrap().0, just_before(9));
        let [first, second] = nine;
        drop(first);
        assert_eq!(progress.settled().unwrap().0, just_before(9));
        drop(second);
        // A manual trigger has no tick: it holds nothing back.
        assert_eq!(progress.settled().unwrap().0, t(10));
    }
}
