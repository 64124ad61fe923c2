//! # Reporter
//! Owns the worker's durable outbox. Reads the outcomes its WorkerSupervisor records; writes
//! `ax.result.<job>` (one message per finished attempt), the instance's final state and its
//! `ax.event.<job>.<state>`.
//!
//! An outcome is fsync'd to the outbox before the dispatch that caused it is acknowledged
//! (outcomes arriving together share one fsync), then reported: the instance record moves with a
//! compare-and-swap (a stale attempt is refused and its result dropped, a repeat changes
//! nothing), the result is published with the trace id as message id (JetStream drops a repeat),
//! and only then is the outcome marked done. Until then it is retried with backoff — through a
//! NATS outage and across restarts of the worker, since the outbox is replayed on start.

pub mod outbox;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};

use ax_bus::ids::{NodeId, TraceId};
use ax_bus::AxClient;

use crate::node::supervision::{note_restart, spawn_pump};
use crate::outcome::{report, Outcome};
use crate::ActorError;
use outbox::Outbox;

/// The actor's name in counters, logs and `ax nodes`.
pub const ACTOR: &str = "reporter";
const REPORTS_IN_FLIGHT: usize = 32;
const COMMIT_BATCH: usize = 256;

type Commit = (Outcome, oneshot::Sender<Result<(), String>>);
type Shared<T> = Arc<tokio::sync::Mutex<T>>;

/// How the WorkerSupervisor hands outcomes to its Reporter.
#[derive(Clone)]
pub struct ReporterHandle {
    commits: mpsc::UnboundedSender<Commit>,
    outbox: Arc<Mutex<Outbox>>,
}

impl ReporterHandle {
    /// Makes `outcome` durable; it is reported from then on, whatever happens to this process.
    pub async fn record(&self, outcome: Outcome) -> Result<(), String> {
        let (done, durable) = oneshot::channel();
        self.commits
            .send((outcome, done))
            .map_err(|_| "the reporter is gone".to_string())?;
        durable
            .await
            .map_err(|_| "the reporter stopped before the outcome was stored".to_string())?
    }

    /// Whether an outcome for `trace_id` is stored and not yet reported.
    pub fn has_pending(&self, trace_id: &TraceId) -> bool {
        self.outbox
            .lock()
            .map(|o| o.contains(trace_id))
            .unwrap_or(false)
    }
}

/// The Reporter actor.
pub struct Reporter {
    client: AxClient,
    node: NodeId,
    outbox: Arc<Mutex<Outbox>>,
    commits: Shared<mpsc::UnboundedReceiver<Commit>>,
    reports_tx: mpsc::UnboundedSender<Outcome>,
    reports: Shared<mpsc::UnboundedReceiver<Outcome>>,
}

impl Reporter {
    /// Opens the outbox at `path` (reporting damage as alerts) and returns the actor and the
    /// handle its worker uses.
    pub fn open(
        client: AxClient,
        node: NodeId,
        path: &Path,
    ) -> Result<(Self, ReporterHandle), ActorError> {
        let (outbox, damage) = Outbox::open(path)?;
        for d in &damage {
            tracing::warn!(offset = d.offset, reason = %d.reason, path = %path.display(), "outbox damage skipped");
        }
        let outbox = Arc::new(Mutex::new(outbox));
        let (commits_tx, commits) = mpsc::unbounded_channel();
        let (reports_tx, reports) = mpsc::unbounded_channel();
        let handle = ReporterHandle {
            commits: commits_tx,
            outbox: outbox.clone(),
        };
        Ok((
            Self {
                client,
                node,
                outbox,
                commits: Arc::new(tokio::sync::Mutex::new(commits)),
                reports_tx,
                reports: Arc::new(tokio::sync::Mutex::new(reports)),
            },
            handle,
        ))
    }
}

impl Actor for Reporter {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        spawn_pump(
            ACTOR,
            "commit",
            ctx,
            commit(
                self.outbox.clone(),
                self.commits.clone(),
                self.reports_tx.clone(),
            ),
        );
        spawn_pump(
            ACTOR,
            "report",
            ctx,
            report_all(
                self.client.clone(),
                self.outbox.clone(),
                self.reports.clone(),
            ),
        );
        tracing::info!(node = %self.node, "reporter started");
    }
}

crate::answers_ping!(Reporter);

impl Supervised for Reporter {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        note_restart(ACTOR);
    }
}

/// Group commit: everything queued is appended with one fsync, then acknowledged and reported.
async fn commit(
    outbox: Arc<Mutex<Outbox>>,
    commits: Shared<mpsc::UnboundedReceiver<Commit>>,
    reports: mpsc::UnboundedSender<Outcome>,
) -> Result<(), ActorError> {
    let mut commits = commits.lock().await;
    let mut batch = Vec::with_capacity(COMMIT_BATCH);
    loop {
        if commits.recv_many(&mut batch, COMMIT_BATCH).await == 0 {
            return Ok(());
        }
        let outcomes: Vec<Outcome> = batch.iter().map(|(o, _)| o.clone()).collect();
        let outbox = outbox.clone();
        let stored = tokio::task::spawn_blocking(move || {
            outbox
                .lock()
                .map_err(|_| "outbox lock poisoned".to_string())?
                .append(&outcomes)
                .map_err(|e| e.to_string())
        })
        .await
        .unwrap_or_else(|e| Err(format!("outbox writer failed: {e}")));
        for (outcome, done) in batch.drain(..) {
            if stored.is_ok() {
                let _ = reports.send(outcome);
            }
            let _ = done.send(stored.clone());
        }
    }
}

/// Reports what the outbox holds, then every new outcome, until the channel closes.
async fn report_all(
    client: AxClient,
    outbox: Arc<Mutex<Outbox>>,
    reports: Shared<mpsc::UnboundedReceiver<Outcome>>,
) -> Result<(), ActorError> {
    let backlog = outbox.lock().map(|o| o.pending()).unwrap_or_default();
    if !backlog.is_empty() {
        tracing::info!(
            outcomes = backlog.len(),
            "reporting outcomes left in the outbox"
        );
    }
    let mut reports = reports.lock().await;
    let incoming = futures::stream::poll_fn(move |cx| reports.poll_recv(cx));
    futures::stream::iter(backlog)
        .chain(incoming)
        .for_each_concurrent(REPORTS_IN_FLIGHT, |outcome| {
            let client = client.clone();
            let outbox = outbox.clone();
            async move {
                report_until_done(&client, &outcome).await;
                if let Ok(mut outbox) = outbox.lock() {
                    if let Err(e) = outbox.mark_done(&outcome.end.trace_id) {
                        tracing::warn!(error = %e, "cannot mark outcome done; it will be reported again");
                    }
                }
            }
        })
        .await;
    Ok(())
}

async fn report_until_done(client: &AxClient, outcome: &Outcome) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match report(client, outcome).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(trace = %outcome.end.trace_id, error = %e, retry_in = ?backoff, "result not reported yet");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}
