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
use chrono::{DateTime, Utc};
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};

use ax_bus::client::Updated;
use ax_bus::instance::{State, Tag, TransitionRefused};
use ax_bus::messages::ResultMessage;
use ax_bus::spec::JobSpec;
use ax_bus::AxClient;

use crate::jetstream::publish;
use crate::node::supervision::{note_restart, spawn_pump};
use crate::ActorError;
use outbox::{Outbox, Outcome};

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
    pub fn has_pending(&self, trace_id: &str) -> bool {
        self.outbox
            .lock()
            .map(|o| o.contains(trace_id))
            .unwrap_or(false)
    }
}

/// The Reporter actor.
pub struct Reporter {
    client: AxClient,
    node: String,
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
        node: String,
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

/// When the next attempt is due after the `attempt`-th attempt of a run (1-based), whose trace
/// id is `trace`, failed at `finished` — if one is left: `interval * 2^(attempt-1)` seconds
/// later, at most `max_interval`, less the jitter share drawn from `trace` (the same every time
/// the outcome is reported again).
pub fn retry_time(
    spec: &JobSpec,
    attempt: u32,
    trace: &str,
    finished: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let retry = spec.retry.as_ref()?;
    if attempt > retry.times {
        return None;
    }
    let factor = 1u64 << attempt.saturating_sub(1).min(20);
    let seconds = retry
        .interval
        .saturating_mul(factor)
        .min(retry.max_interval.unwrap_or(u64::MAX))
        .min(i64::MAX as u64 / 1_000_000);
    let taken_off = retry.jitter.clamp(0.0, 1.0) * share_of(trace);
    let millis = (seconds as f64 * 1000.0 * (1.0 - taken_off)).round() as i64;
    Some(finished + chrono::Duration::milliseconds(millis))
}

/// A number in [0, 1) drawn from `text` (FNV-1a), the same on every node.
fn share_of(text: &str) -> f64 {
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash >> 11) as f64 / (1u64 << 53) as f64
}

async fn report_until_done(client: &AxClient, outcome: &Outcome) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match report_once(client, outcome).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(trace = %outcome.end.trace_id, error = %e, retry_in = ?backoff, "result not reported yet");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Reports one outcome. Ok also when there is nothing left to do (stale or unknown attempt).
pub async fn report_once(client: &AxClient, outcome: &Outcome) -> Result<(), ActorError> {
    let (work, end) = (&outcome.work, &outcome.end);
    let retry_at = if end.success {
        None
    } else {
        let attempt_of_run = work.attempt.saturating_sub(work.run_start) + 1;
        retry_time(&work.spec, attempt_of_run, &end.trace_id, end.finished_at)
    };
    let state = match client
        .update_instance_from(&work.instance_id, outcome.written.clone(), |r| {
            r.ended(end, retry_at)
        })
        .await?
    {
        Updated::Written(record, _) => {
            publish::event(client, &record).await;
            record.state
        }
        Updated::Refused(TransitionRefused::AlreadyEnded(state)) => state,
        Updated::Refused(refused) => {
            tracing::warn!(trace = %end.trace_id, instance = %work.instance_id, %refused, "result of a superseded attempt dropped");
            return Ok(());
        }
        Updated::Missing => {
            tracing::warn!(instance = %work.instance_id, "result for an unknown instance dropped");
            return Ok(());
        }
    };
    let next_attempt_at = if state == State::WaitingRetry {
        retry_at
    } else {
        None
    };
    let result = ResultMessage::new(work, end, state, next_attempt_at);
    publish::to_stream_acked(
        client,
        client.subjects().result(work.job()),
        &format!("result:{}", end.trace_id),
        &result,
    )
    .await?;
    if end.tag == Tag::Timeout {
        publish::instance_alert(
            client,
            &end.worker,
            "timeout",
            format!(
                "attempt {} of instance {} timed out: {}",
                work.attempt, work.instance_id, end.message
            ),
            work,
        )
        .await;
    }
    if state == State::Failed {
        publish::instance_alert(
            client,
            &end.worker,
            "failure",
            format!(
                "instance {} failed for good after attempt {}: {}: {}",
                work.instance_id,
                work.attempt,
                end.tag.as_str(),
                end.message
            ),
            work,
        )
        .await;
        if work.shard.is_none() {
            // (A failed shard fails its parent, which becomes the dead letter.)
            publish::failed_for_good(client, &end.worker, work, end.tag, &end.message).await?;
        }
    }
    if state == State::WaitingRetry {
        // The Schedulers hear only of the attempts they must retry.
        publish::to_stream_acked(
            client,
            client.subjects().retry(work.job()),
            &format!("retry:{}", end.trace_id),
            &result,
        )
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(retry: serde_json::Value) -> JobSpec {
        serde_json::from_value(serde_json::json!({
            "name": "r",
            "exec": {"type": "noop"},
            "retry": retry,
        }))
        .expect("a valid spec")
    }

    fn waits(spec: &JobSpec, trace: &str) -> Vec<Option<i64>> {
        let t0 = ax_bus::time::now();
        (1..=4)
            .map(|attempt| {
                retry_time(spec, attempt, trace, t0).map(|t| (t - t0).num_milliseconds())
            })
            .collect()
    }

    #[test]
    fn waits_double_from_the_interval_and_stop_after_the_last_retry() {
        let spec = spec(serde_json::json!({"times": 3, "interval": 30}));
        assert_eq!(
            waits(&spec, "abc"),
            [Some(30_000), Some(60_000), Some(120_000), None]
        );
    }

    #[test]
    fn max_interval_caps_the_doubling() {
        let spec = spec(serde_json::json!({"times": 4, "interval": 30, "max_interval": 90}));
        assert_eq!(
            waits(&spec, "abc"),
            [Some(30_000), Some(60_000), Some(90_000), Some(90_000)]
        );
    }

    #[test]
    fn jitter_shortens_each_wait_by_a_share_fixed_by_the_trace() {
        let spec = spec(serde_json::json!({"times": 1, "interval": 100, "jitter": 0.5}));
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..200 {
            let trace = ax_bus::ids::new_trace_id();
            let wait = waits(&spec, &trace)[0].expect("one retry");
            assert!((50_000..=100_000).contains(&wait), "{wait} ms for {i}");
            assert_eq!(
                waits(&spec, &trace)[0],
                Some(wait),
                "the same trace, the same wait"
            );
            seen.insert(wait / 5_000);
        }
        assert!(seen.len() >= 8, "waits spread over the range: {seen:?}");
    }
}
