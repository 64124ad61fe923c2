//! Partitioned Schedulers: each cron job belongs to one of a fixed number of partitions (see
//! [`ax_bus::partition`]), each partition to one live Scheduler, which alone keeps its jobs in
//! its wheel. Adding a Scheduler adds capacity: every fire costs one creation whatever the
//! number of Schedulers, and each holds only its share of the registry.
//!
//! - [`assign`]: the fair shares and which partitions move (pure);
//! - [`keeper`]: the task that keeps a node's member key and its partitions;
//! - [`Partitions`]: the handle the Scheduler actor (and the node, for a graceful stop) holds.
//!
//! What is not partitioned needs no partition: delayed triggers wait in JetStream and come to
//! whichever Scheduler pulls them from the shared consumer; commands (triggers, keyed triggers,
//! re-runs) go to one Scheduler of the shared control consumer; retries likewise.

pub(crate) mod assign;
pub(crate) mod keeper;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot, watch};

use ax_bus::ids::NodeId;
use ax_bus::partition::PartitionId;
use ax_bus::AxClient;

use crate::node::clock_guard::ClockGuard;

/// What a Scheduler owns, as its keeper last said.
#[derive(Clone, Debug, Default)]
pub(crate) struct Ownership {
    /// The deployment's number of partitions (0 until known).
    pub count: u16,
    /// The partitions owned, each with the tick through which its previous owner said it
    /// fired (`None`: unknown, the tick ledger and the misfire policy decide).
    pub held: BTreeMap<PartitionId, Option<DateTime<Utc>>>,
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

/// A Scheduler node's partitions: built once per node, shared by every incarnation of its
/// Scheduler actor.
#[derive(Clone, Debug)]
pub struct Partitions {
    ownership: watch::Receiver<Ownership>,
    applied: mpsc::UnboundedSender<Applied>,
    hand_over: mpsc::Sender<oneshot::Sender<()>>,
    jobs: Arc<AtomicUsize>,
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
        let keeper = keeper::Keeper::new(client, node, ownership_tx, applied_rx, clock_guard);
        let partitions = Self {
            ownership,
            applied,
            hand_over,
            jobs: Arc::new(AtomicUsize::new(0)),
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
}
