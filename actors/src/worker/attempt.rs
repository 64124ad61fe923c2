//! One dispatch, from its delivery to its outcome: acknowledge, start (the record's `executing`
//! write, the attempt's one fence), run (renewing the claim — written by the first renewal — and
//! keeping the dispatch alive), record the outcome. Runs on a task of its own, not
//! tied to the actor's context — a restart of the actor must not cut a running process off from
//! its outcome — and tells the actor what runs ([`Running`], [`Ended`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use async_nats::jetstream::{self};
use tokio::sync::Notify;

use ax_bus::client::Updated;
use ax_bus::ids::DispatchId;
use ax_bus::instance::{AttemptEnd, DispatchNote, Tag, TransitionRefused};
use ax_bus::messages::{AlertKind, DispatchAck, StoredRecord, WorkItem};
use ax_bus::AxClient;

use super::acks::Acks;
use super::contact::Contact;
use super::executor::values::Values;
use super::executor::{AttemptContext, ExecResult, Registry};
use super::logs;
use super::registered::Registered;
use super::slots::Slots;
use super::{Ended, IsRunning, Running, WorkerConfig, WorkerSupervisor, CLAIM_LEASE};
use crate::jetstream::{consume, publish};
use crate::outcome::{report, Outcome};
use crate::reporter::{HasPending, Record, Reporter};
use crate::runtime::clock_guard::ClockGuard;

/// What every attempt of this worker needs; cheap to clone.
#[derive(Clone, Debug)]
pub(super) struct Attempts {
    pub(super) client: AxClient,
    pub(super) config: WorkerConfig,
    pub(super) reporter: Addr<Reporter>,
    pub(super) worker: Addr<WorkerSupervisor>,
    pub(super) slots: Arc<Slots>,
    pub(super) clock: Option<ClockGuard>,
    pub(super) executors: Registry,
    pub(super) contact: Contact,
    pub(super) registered: Registered,
    pub(super) acks: Acks,
    pub(super) confinement: Arc<crate::worker::cgroup::Confinement>,
}

/// Why a dispatch is not run, and what becomes of its message.
enum Skip {
    /// Done with it: acknowledged.
    Done,
    /// Tried again later: redelivered with backoff.
    Later,
    /// Another delivery of it runs here: left alone.
    Running,
}

impl Attempts {
    /// The attempt `message` carries, or `None` when it cannot be read (then it went to the
    /// dead letters with an alert).
    pub(super) async fn decoded(&self, message: &jetstream::Message) -> Option<WorkItem> {
        consume::decode_or_dead_letter::<WorkItem>(
            &self.client,
            &self.config.id,
            AlertKind::Dispatch,
            message,
        )
        .await
    }

    /// Runs the attempt `work` of `message` to its end.
    pub(super) async fn run(
        &self,
        message: jetstream::Message,
        mut work: WorkItem,
        scratch: &Path,
    ) {
        // Only for the first write; the outbox keeps the work item without it.
        let stored = work.stored.take();
        self.wait_for_contact(&work, &message).await;
        let started = match self.start(&work, stored, &message).await {
            Ok(started) => started,
            Err(skip) => return settle(&message, skip).await,
        };
        let (dispatch, written) = started;
        let stop = Arc::new(Notify::new());
        self.worker.do_send(Running {
            trace: work.trace_id.clone(),
            instance: work.instance_id.clone(),
            dispatch: dispatch.clone(),
            lease: work.spec.lease,
            stop: stop.clone(),
        });
        // One start per attempt: its `executing` record's, which the running event, the
        // OpenLineage START and the final record all name.
        let started_at = written.record.started_at.unwrap_or_else(ax_bus::time::now);
        let watched = self
            .execute_watched(&work, &message, &dispatch, scratch, &stop, started_at)
            .await;
        self.worker.do_send(Ended {
            trace: work.trace_id.clone(),
            end: watched.as_ref().ok().cloned(),
        });
        match watched {
            // The attempt was taken away (this worker was declared dead): its outcome is moot.
            Err(Interrupted::Revoked) => {}
            // This worker stopped it, cut off: lost, as the janitor would have it.
            Err(Interrupted::Fenced) => self.lost_after_fence(&work).await,
            Ok(end) => {
                let outcome = Outcome {
                    work,
                    end,
                    written: Some(written),
                };
                self.record(outcome).await;
            }
        }
        consume::ack(&message).await;
    }

    /// Holds the dispatch while this worker's heartbeat has not been stored for longer than the
    /// attempt's fence (JetStream refusing writes, its storage full, or out of reach): started
    /// now, the attempt would be fenced at once — its command run, then stopped and declared
    /// lost, again and again — and the Routers may count this worker dead meanwhile. It starts
    /// once a heartbeat is stored; the dispatch is kept in progress until then.
    async fn wait_for_contact(&self, work: &WorkItem, message: &jetstream::Message) {
        let fence_after = work.spec.fence_after();
        if !self.contact.lost(fence_after) {
            return;
        }
        tracing::warn!(trace = %work.trace_id, silent_for = ?self.contact.silent_for(), "no heartbeat stored lately: the attempt waits for one before it starts");
        let mut check = tokio::time::interval(CONTACT_CHECK);
        let mut progress = tokio::time::interval(self.config.dispatch_ack_wait / 3);
        loop {
            tokio::select! {
                _ = check.tick() => if !self.contact.lost(fence_after) {
                    return;
                },
                _ = progress.tick() => consume::in_progress(message).await,
            }
        }
    }

    /// Acknowledges the dispatch to its Router and starts the attempt: its record marked
    /// `executing`, which only one dispatch of an attempt passes; the dispatch and the record
    /// written.
    async fn start(
        &self,
        work: &WorkItem,
        stored: Option<StoredRecord>,
        message: &jetstream::Message,
    ) -> Result<(DispatchId, StoredRecord), Skip> {
        let trace = &work.trace_id;
        if self
            .reporter
            .send(HasPending(trace.clone()))
            .await
            .unwrap_or(false)
        {
            return Err(Skip::Done);
        }
        if self
            .worker
            .send(IsRunning(trace.clone()))
            .await
            .unwrap_or(false)
        {
            // A redelivery while the attempt runs here; the running one acknowledges it.
            return Err(Skip::Running);
        }
        if let Some(stall) = crate::test_hooks::dispatch_stall() {
            tokio::time::sleep(stall).await;
        }
        let Some(dispatch) = work.dispatch.clone() else {
            tracing::warn!(%trace, "a dispatch without a dispatch id is not ours to run; skipped");
            return Err(Skip::Done);
        };
        self.acknowledge(work, &dispatch);
        let note = dispatch_note(work, message, &dispatch);
        if let Some(clock) = self.clock.as_ref().filter(|c| c.skewed()) {
            self.refuse_for_clock(work.clone(), clock).await;
            return Err(Skip::Done);
        }
        match self.registered.check(&self.client, &work.spec).await {
            Ok(true) => {}
            Ok(false) => {
                self.refuse_unregistered(work.clone()).await;
                return Err(Skip::Done);
            }
            Err(e) => {
                tracing::warn!(%trace, error = %e, "the dispatch's definition could not be checked against the registry; again later");
                return Err(Skip::Later);
            }
        }
        let written = self.mark_executing(work, stored, &note).await?;
        Ok((dispatch, written))
    }

    /// An attempt found started already (its record `executing`) when this worker did not
    /// run it: if this worker started it — a previous process of it, then killed — its command
    /// may have run, so the attempt is lost and the instance moves to a new attempt under a new
    /// trace id (one trace, one execution). Started by another dispatch elsewhere, it is not
    /// this dispatch's to run. Either way this dispatch is done.
    async fn lost_if_started(&self, work: &WorkItem) -> Skip {
        let (trace, me) = (&work.trace_id, &self.config.id);
        let record = match self.client.instance(&work.instance_id).await {
            Ok(Some((record, _))) => record,
            Ok(None) => return Skip::Done,
            Err(e) => {
                tracing::warn!(%trace, error = %e, "cannot tell who started the attempt; redelivering");
                return Skip::Later;
            }
        };
        if record.started_by(trace) != Some(me) {
            tracing::info!(%trace, worker = ?record.worker, "attempt not ours to run (started by another dispatch); skipped");
            return Skip::Done;
        }
        tracing::warn!(%trace, instance = %work.instance_id, "a previous process of this worker started this attempt: lost, not run again under its trace");
        match crate::outcome::lost(&self.client, me, &work.instance_id, trace, me).await {
            Ok(()) => Skip::Done,
            Err(e) => {
                tracing::warn!(%trace, error = %e, "lost attempt not handed over yet; redelivering");
                Skip::Later
            }
        }
    }

    /// The record as this worker wrote it, `executing`.
    async fn mark_executing(
        &self,
        work: &WorkItem,
        stored: Option<StoredRecord>,
        note: &DispatchNote,
    ) -> Result<StoredRecord, Skip> {
        let (trace, me) = (&work.trace_id, &self.config.id);
        let now = ax_bus::time::now();
        // The fence is the revision the write swaps from, whichever it is read at.
        match self
            .client
            .update_instance_at(&work.instance_id, stored, |r, revision| {
                let fenced = DispatchNote {
                    fence: revision,
                    ..note.clone()
                };
                let mut started = r.started(trace, me, now, &fenced)?;
                started.due_at = work.due_at;
                Ok(started)
            })
            .await
        {
            Ok(Updated::Written(record, revision)) => {
                started_metrics(&record, note);
                publish::event(&self.client, &record).await;
                Ok(StoredRecord { record, revision })
            }
            Ok(Updated::Refused(TransitionRefused::AlreadyStarted)) => {
                Err(self.lost_if_started(work).await)
            }
            Ok(Updated::Refused(refused)) => {
                tracing::info!(%trace, %refused, "attempt not ours to run; skipped");
                Err(Skip::Done)
            }
            Ok(Updated::Missing) => {
                tracing::warn!(instance = %work.instance_id, "dispatch for an unknown instance; skipped");
                Err(Skip::Done)
            }
            Err(e) => {
                tracing::warn!(%trace, error = %e, "cannot mark executing; redelivering");
                Err(Skip::Later)
            }
        }
    }

    /// Runs the attempt, keeping the dispatch alive with progress acks and renewing the claim
    /// (the first renewal writes it); a renewal that finds the claim revoked stops the process
    /// at once.
    async fn execute_watched(
        &self,
        work: &WorkItem,
        message: &jetstream::Message,
        dispatch: &DispatchId,
        scratch: &Path,
        stop: &Notify,
        started_at: chrono::DateTime<chrono::Utc>,
    ) -> Result<AttemptEnd, Interrupted> {
        let (trace, me) = (&work.trace_id, &self.config.id);
        let execution = execute(self, work, scratch, stop, started_at);
        tokio::pin!(execution);
        let mut progress = tokio::time::interval(self.config.dispatch_ack_wait / 3);
        progress.tick().await;
        let mut renewal = tokio::time::interval(CLAIM_LEASE / 3);
        renewal.tick().await;
        let mut fence = tokio::time::interval(FENCE_CHECK);
        let fence_after = work.spec.fence_after();
        // The claim's revision, once the first renewal wrote it.
        let mut revision = None;
        // A renewal in flight, so that a slow one never holds up the fence.
        let mut renewing: Option<Renewal> = None;
        let mut interrupted = None;
        loop {
            tokio::select! {
                end = &mut execution => return match interrupted {
                    Some(why) => Err(why),
                    None => Ok(end),
                },
                _ = progress.tick() => {
                    consume::in_progress(message).await;
                }
                _ = renewal.tick(), if interrupted.is_none() && renewing.is_none() => {
                    let (client, trace, dispatch, me) =
                        (self.client.clone(), trace.clone(), dispatch.clone(), me.clone());
                    renewing = Some(Box::pin(async move {
                        client.renew_claim(&trace, revision, &dispatch, &me, CLAIM_LEASE).await
                    }));
                }
                renewed = async { renewing.as_mut().expect("guarded").await }, if renewing.is_some() => {
                    renewing = None;
                    match renewed {
                        Ok(Some(next)) => revision = Some(next),
                        Ok(None) if interrupted.is_none() => {
                            tracing::warn!(%trace, "claim revoked: stopping the attempt");
                            interrupted = Some(Interrupted::Revoked);
                            stop.notify_one();
                        }
                        Ok(None) => {}
                        Err(e) => tracing::warn!(%trace, error = %e, "lease not renewed; trying again"),
                    }
                }
                _ = fence.tick(), if interrupted.is_none() && self.contact.lost(fence_after) => {
                    tracing::error!(%trace, silent_for = ?self.contact.silent_for(), "no heartbeat stored for longer than {fence_after:?}, 5 s short of the attempt's lease: stopping it before the Routers hand it to another worker (self-fencing)");
                    interrupted = Some(Interrupted::Fenced);
                    stop.notify_one();
                }
            }
        }
    }

    /// After a self-fenced stop: once NATS answers again, the attempt is recorded lost — its
    /// claim revoked, the instance moved to a new attempt — exactly as the janitor does for a
    /// dead worker (whichever comes first, the other finds it done).
    async fn lost_after_fence(&self, work: &WorkItem) {
        let me = &self.config.id;
        let (instance, trace) = (&work.instance_id, &work.trace_id);
        while let Err(e) = crate::outcome::lost(&self.client, me, instance, trace, me).await {
            tracing::warn!(%trace, error = %e, "fenced attempt not recorded lost yet; trying again");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Makes the outcome durable in the outbox; if the outbox cannot take it, reports it
    /// directly until NATS takes it (an alert says so).
    async fn record(&self, outcome: Outcome) {
        let end = &outcome.end;
        let ran = end
            .started_at
            .map(|started| (end.finished_at - started).num_milliseconds() as f64 / 1000.0);
        if let Some(metrics) = crate::metrics::recording() {
            let namespace = outcome.work.job().namespace();
            metrics.attempt_finished(namespace, (end.success, end.tag), ran);
            if let Some(usage) = end.usage {
                metrics.attempt_used(outcome.work.job().as_str(), usage);
            }
        }
        let durable = match self.reporter.send(Record(outcome.clone())).await {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        let trace = outcome.end.trace_id.clone();
        publish::alert(
            &self.client,
            &self.config.id,
            AlertKind::Outbox,
            format!("outcome of {trace} not durable ({durable}); reporting it directly"),
            None,
        )
        .await;
        while let Err(e) = report(&self.client, &outcome, None).await {
            tracing::warn!(%trace, error = %e, "direct report failed; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Ends an attempt not started `failed` with tag `clock_skew` without running it: times this
    /// node would write (start, end, lease expiries) cannot be trusted.
    async fn refuse_for_clock(&self, work: WorkItem, clock: &ClockGuard) {
        let message = format!(
            "refused by worker {}: its clock is {} ms off the NATS server's (limit {} s)",
            self.config.id,
            clock.offset_ms(),
            clock.limit().as_secs_f64()
        );
        let end = self.refusal(&work, Tag::ClockSkew, message);
        self.record(Outcome {
            work,
            end,
            written: None,
        })
        .await;
    }

    /// Ends an attempt not started `failed` with tag `unregistered` without running it: its
    /// definition is none the registry holds, so whoever sent it could have put anything in it.
    async fn refuse_unregistered(&self, work: WorkItem) {
        let message = format!(
            "refused by worker {}: the definition of job `{}` in this dispatch is none the job \
             registry holds (never applied, the job deleted, or edited too often since); not run",
            self.config.id,
            work.job()
        );
        tracing::warn!(trace = %work.trace_id, job = %work.job(), "{message}");
        publish::instance_alert(
            &self.client,
            &self.config.id,
            AlertKind::Dispatch,
            message.clone(),
            &work,
        )
        .await;
        let end = self.refusal(&work, Tag::Unregistered, message);
        self.record(Outcome {
            work,
            end,
            written: None,
        })
        .await;
    }

    /// The end of an attempt refused before it ran.
    fn refusal(&self, work: &WorkItem, tag: Tag, message: String) -> AttemptEnd {
        let (trace, me) = (work.trace_id.clone(), self.config.id.clone());
        AttemptEnd {
            message,
            ..AttemptEnd::new(trace, me, false, tag, ax_bus::time::now())
        }
    }

    /// Tells the dispatching Router the attempt was received and is about to run (best
    /// effort, sent together with the others of the moment: a lost acknowledgement costs a look
    /// at the record at the deadline).
    fn acknowledge(&self, work: &WorkItem, dispatch: &DispatchId) {
        let Some(router) = &work.router else {
            return;
        };
        let ack = DispatchAck {
            trace_id: work.trace_id.clone(),
            dispatch: dispatch.clone(),
            worker: self.config.id.clone(),
        };
        self.acks.send(router, ack);
    }
}

/// Counts an attempt that starts now: its trigger latency (a first attempt's, as the day's
/// summary counts it) and its dispatch's acknowledgement time.
fn started_metrics(record: &ax_bus::InstanceRecord, note: &DispatchNote) {
    let seconds = |d: chrono::TimeDelta| d.num_milliseconds().max(0) as f64 / 1000.0;
    let Some(metrics) = crate::metrics::recording() else {
        return;
    };
    if let Some(late) = record.trigger_latency() {
        metrics.trigger_latency.observe(seconds(late));
    }
    metrics
        .dispatch_to_ack
        .observe(seconds(note.acknowledged_at - note.at));
}

/// How `work` reached this worker, for the record's `executing` write (the instance history's
/// dispatch step): the dispatch message's server timestamp and delivery count, the dispatch,
/// the Router, the workers passed over before. Acknowledged just now. Its fence, the record
/// revision the write swaps from, is set as it is written.
fn dispatch_note(
    work: &WorkItem,
    message: &jetstream::Message,
    dispatch: &DispatchId,
) -> DispatchNote {
    let now = ax_bus::time::now();
    let (at, delivery) = match message.info() {
        Ok(info) => (
            ax_bus::time::from_server(info.published),
            u64::try_from(info.delivered).unwrap_or(1),
        ),
        Err(_) => (now, 1),
    };
    DispatchNote {
        router: work.router.clone(),
        at,
        delivery,
        dispatch: Some(dispatch.clone()),
        fence: 0,
        acknowledged_at: now,
        passed_over: work.passed_over.clone(),
    }
}

/// Why a running attempt was stopped before its end.
#[derive(Clone, Copy, Debug)]
enum Interrupted {
    /// Its claim was revoked (this worker was declared dead): the outcome is moot.
    Revoked,
    /// This worker lost contact with NATS and stopped it itself.
    Fenced,
}

/// How often a dispatch held for the worker's contact with NATS looks at it again.
const CONTACT_CHECK: Duration = Duration::from_millis(200);
/// How often a running attempt checks the worker's contact with NATS.
const FENCE_CHECK: Duration = Duration::from_millis(250);

/// A claim renewal in flight.
type Renewal = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<u64>, ax_bus::ClientError>> + Send>,
>;

async fn settle(message: &jetstream::Message, skip: Skip) {
    match skip {
        Skip::Done => {
            consume::ack(message).await;
        }
        Skip::Later => {
            consume::nak(message, consume::backoff(message)).await;
        }
        Skip::Running => {}
    }
}

/// Runs an attempt, started at `started_at`, with the executor of its type: reads the upstream
/// outputs its templates use, lets the executor prepare, then runs it. Whatever fails ends the
/// attempt with a reason.
async fn execute(
    attempts: &Attempts,
    work: &WorkItem,
    scratch: &Path,
    stop: &Notify,
    started_at: chrono::DateTime<chrono::Utc>,
) -> AttemptEnd {
    let worker = &attempts.config.id;
    let result = match attempts.executors.get(work.spec.exec.name()) {
        None => ExecResult::failed(
            Tag::ExecutorError,
            format!(
                "worker {worker} has no executor `{}` (it offers: {})",
                work.spec.exec.name(),
                attempts.executors.names().join(", ")
            ),
        ),
        Some(executor) => match Values::resolve(&attempts.client, work).await {
            Err(reason) => ExecResult::failed(Tag::ExecutorError, reason),
            Ok(values) => {
                let log = logs::start(
                    &attempts.client,
                    &work.instance_id,
                    work.attempt,
                    &work.trace_id,
                    attempts.config.log_max_bytes,
                );
                let ctx = AttemptContext {
                    work,
                    worker,
                    scratch,
                    cancel: stop,
                    values: &values,
                    cluster: Some(&attempts.client),
                    log: Some(&log),
                    confinement: Some(&attempts.confinement),
                };
                let result = match executor.prepare(&ctx).await {
                    Err(reason) => ExecResult::failed(Tag::ExecutorError, reason),
                    Ok(()) => executor.run(&ctx).await,
                };
                log.finish();
                result
            }
        },
    };
    AttemptEnd {
        trace_id: work.trace_id.clone(),
        success: result.success,
        tag: result.tag,
        message: result.message,
        output: result.output,
        worker: worker.clone(),
        started_at: Some(started_at),
        finished_at: ax_bus::time::now(),
        exit_code: result.exit_code,
        stdout_tail: result.stdout_tail,
        stderr_tail: result.stderr_tail,
        usage: result.usage,
    }
}
