//! # Reporter
//! Owns the worker's durable outbox. Reads the outcomes its WorkerSupervisor records; writes
//! `ax.result.<job>` (one message per finished attempt), the instance's final state and its
//! `ax.event.<job>.<state>`.
//!
//! An outcome is fsync'd to the outbox before the dispatch that caused it is acknowledged
//! ([`Record`] answers once it is): outcomes recorded together share one fsync — every
//! [`Record`] waiting in the mailbox is queued before the queued ones are committed. Then it is
//! reported ([`crate::outcome::report`]: the record moves with a compare-and-swap, the result is
//! published under the trace id as message id), and only then is it marked done
//! ([`Reported`]). Until then it is retried with backoff — through a NATS outage and across
//! restarts of the worker, since the outbox is replayed on start.
//!
//! The outbox is the actor's and changes only in its handlers; reports run as tasks of their
//! own (they outlive a restart of the actor) and tell the actor when they are done.

pub(crate) mod outbox;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::{oneshot, Semaphore};

use ax_bus::ids::{NodeId, TraceId};
use ax_bus::AxClient;

use crate::jetstream::gathered::Gathered;
use crate::outcome::{report, Outcome};
use crate::runtime::supervision::note_restart;
use crate::ActorError;
use outbox::Outbox;

/// The actor's name in counters, logs and `ax nodes`.
pub(crate) const ACTOR: &str = "reporter";
const REPORTS_IN_FLIGHT: usize = 32;

/// Why an outcome could not be made durable.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The outbox could not be written.
    #[error("outbox: {0}")]
    Outbox(String),
    /// The Reporter is gone (the process is stopping).
    #[error("the reporter stopped before the outcome was stored")]
    Gone,
}

type Waiter = oneshot::Sender<Result<(), RecordError>>;

/// The Reporter actor.
#[derive(Debug)]
pub struct Reporter {
    client: AxClient,
    node: NodeId,
    outbox: Outbox,
    /// Outcomes recorded and not yet committed, with who waits for them.
    queued: Vec<(Outcome, Waiter)>,
    commit_due: bool,
    /// Outcomes being reported now (their tasks outlive restarts of the actor).
    reporting: HashSet<TraceId>,
    reports: Arc<Semaphore>,
    /// The results of the reports, published together (made once the actor runs).
    results: Option<Gathered>,
}

impl Reporter {
    /// Opens the outbox at `path`, logging any damage skipped.
    pub fn open(client: AxClient, node: NodeId, path: &Path) -> Result<Self, ActorError> {
        let (outbox, damage) = Outbox::open(path)?;
        for d in &damage {
            tracing::warn!(offset = d.offset, reason = %d.reason, path = %path.display(), "outbox damage skipped");
        }
        Ok(Self {
            client,
            node,
            outbox,
            queued: Vec::new(),
            commit_due: false,
            reporting: HashSet::new(),
            reports: Arc::new(Semaphore::new(REPORTS_IN_FLIGHT)),
            results: None,
        })
    }

    /// Reports `outcome` on a task of its own, until done; then tells the actor.
    fn start_report(&mut self, outcome: Outcome, ctx: &Context<Self>) {
        if !self.reporting.insert(outcome.end.trace_id.clone()) {
            return;
        }
        let (client, reports, me) = (self.client.clone(), self.reports.clone(), ctx.address());
        let results = self
            .results
            .get_or_insert_with(|| Gathered::new(&client))
            .clone();
        tokio::spawn(async move {
            let Ok(_permit) = reports.acquire_owned().await else {
                return;
            };
            report_until_done(&client, &outcome, &results).await;
            me.do_send(Reported(outcome.end.trace_id));
        });
    }
}

impl Actor for Reporter {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let backlog = self.outbox.pending();
        if !backlog.is_empty() {
            tracing::info!(
                outcomes = backlog.len(),
                "reporting outcomes left in the outbox"
            );
        }
        for outcome in backlog {
            self.start_report(outcome, ctx);
        }
        tracing::info!(node = %self.node, "reporter started");
    }
}

crate::runtime::watchdog::answers_ping!(Reporter);

impl Supervised for Reporter {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        note_restart(ACTOR);
    }
}

/// Makes an outcome durable; answered once it is (it is reported from then on, whatever
/// happens to this process).
#[derive(Debug, Message)]
#[rtype(result = "Result<(), RecordError>")]
pub struct Record(pub Outcome);

impl Handler<Record> for Reporter {
    type Result = ResponseFuture<Result<(), RecordError>>;

    fn handle(&mut self, msg: Record, ctx: &mut Self::Context) -> Self::Result {
        let (done, durable) = oneshot::channel();
        self.queued.push((msg.0, done));
        if !std::mem::replace(&mut self.commit_due, true) {
            // Handled once the mailbox is empty: every outcome recorded meanwhile shares the
            // fsync.
            ctx.notify(Commit);
        }
        Box::pin(async move { durable.await.unwrap_or(Err(RecordError::Gone)) })
    }
}

/// Commits the queued outcomes with one fsync.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct Commit;

impl Handler<Commit> for Reporter {
    type Result = ();

    fn handle(&mut self, _: Commit, ctx: &mut Self::Context) {
        self.commit_due = false;
        let queued = std::mem::take(&mut self.queued);
        let outcomes: Vec<Outcome> = queued.iter().map(|(o, _)| o.clone()).collect();
        let stored = self.outbox.append(&outcomes).map_err(|e| e.to_string());
        self.count_unreported();
        for (outcome, done) in queued {
            if stored.is_ok() {
                self.start_report(outcome, ctx);
            }
            let answer = stored.clone().map_err(RecordError::Outbox);
            let _ = done.send(answer);
        }
    }
}

/// Whether an outcome for the attempt is stored (or being stored) and not yet reported.
#[derive(Debug, Message)]
#[rtype(result = "bool")]
pub struct HasPending(pub TraceId);

impl Handler<HasPending> for Reporter {
    type Result = bool;

    fn handle(&mut self, msg: HasPending, _: &mut Self::Context) -> bool {
        self.outbox.contains(&msg.0) || self.queued.iter().any(|(o, _)| o.end.trace_id == msg.0)
    }
}

/// An outcome was reported: marked done in the outbox.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct Reported(TraceId);

impl Handler<Reported> for Reporter {
    type Result = ();

    fn handle(&mut self, msg: Reported, _: &mut Self::Context) {
        self.reporting.remove(&msg.0);
        if let Err(e) = self.outbox.mark_done(&msg.0) {
            tracing::warn!(error = %e, "cannot mark outcome done; it will be reported again");
        }
        self.count_unreported();
    }
}

impl Reporter {
    /// The outbox's unreported outcomes, for `/metrics`.
    fn count_unreported(&self) {
        if let Some(metrics) = crate::metrics::recording() {
            metrics
                .outbox_unreported
                .set(i64::try_from(self.outbox.len()).unwrap_or(i64::MAX));
        }
    }
}

async fn report_until_done(client: &AxClient, outcome: &Outcome, results: &Gathered) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match report(client, outcome, Some(results)).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(trace = %outcome.end.trace_id, error = %e, retry_in = ?backoff, "result not reported yet");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}
