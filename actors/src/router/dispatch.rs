//! Sending attempts to workers: the I/O half of the Router. A [`Dispatcher`] holds no state of
//! its own — the fleet and the unacknowledged dispatches belong to the [`Router`] actor — and
//! asks the actor (by message) whenever a choice depends on them: which worker, whether a
//! pinned worker is alive, what to track.

use std::time::Duration;

use actix::Addr;

use ax_bus::client::in_flight::InFlight;
use ax_bus::client::Updated;
use ax_bus::error::During;
use ax_bus::ids::{DispatchId, NodeId, WorkerId};
use ax_bus::messages::{ResultMessage, StoredRecord, WorkItem};
use ax_bus::{msg_id, AxClient, State, Tag};

use super::acks::Pending;
use super::{Choose, Request, Router, RouterConfig, Target, Track};
use crate::jetstream::publish;
use crate::test_hooks::failpoint;
use crate::ActorError;

/// How soon an unacknowledged dispatch whose handling failed is looked at again.
pub(super) const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// What the Router's pumps and tasks use to dispatch; cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Dispatcher {
    pub(super) client: AxClient,
    pub(super) node: NodeId,
    pub(super) config: RouterConfig,
    pub(super) router: Addr<Router>,
}

impl Dispatcher {
    /// Where `work` goes now, as the Router's fleet sees it (one hand-off asks for a batch).
    pub(super) async fn target(&self, work: &WorkItem, excluded: Vec<WorkerId>) -> Target {
        let choice = Choose {
            works: vec![Request::of(work)],
            excluded,
        };
        match self.router.send(choice).await {
            Ok(mut targets) => targets.pop().unwrap_or(Target::NoWorker),
            Err(_) => Target::NoWorker,
        }
    }

    /// Tracks `pending` until its acknowledgement or its deadline, `after` from now.
    pub(super) fn track(&self, pending: Vec<Pending>, after: Duration) {
        self.router.do_send(Track { pending, after });
    }

    /// Publishes `work` to `worker`; an attempt without a dispatch id gets a fresh one (a
    /// re-dispatched attempt keeps the one it was reserved for). The ack is the caller's to
    /// await.
    pub(super) async fn send(
        &self,
        mut work: WorkItem,
        worker: &WorkerId,
    ) -> Result<(WorkItem, async_nats::jetstream::context::PublishAckFuture), ActorError> {
        let dispatch = work.dispatch.get_or_insert_with(DispatchId::random).clone();
        work.worker = Some(worker.clone());
        work.router = Some(self.node.clone());
        let ack = publish::to_stream(
            &self.client,
            self.client.subjects().dispatch(worker, work.spec.priority),
            &msg_id::dispatch(&work.trace_id, &dispatch),
            &work,
        )
        .await?;
        Ok((work, ack))
    }

    /// Dispatches `work` at once (a shard), or puts it back on the ready queue when nobody can
    /// take it now.
    pub(super) async fn dispatch_now(&self, work: WorkItem) -> Result<(), ActorError> {
        match self.target(&work, Vec::new()).await {
            Target::Worker(worker) => {
                let (work, ack) = self.send(work, &worker).await?;
                ack.await.during(|| "dispatch")?;
                self.track(
                    vec![Pending::new(work, worker, Vec::new())],
                    self.config.ack_timeout,
                );
                Ok(())
            }
            Target::NoWorker | Target::NoRoom(_) => {
                publish::to_stream_acked(
                    &self.client,
                    self.client.subjects().ready_for(&work),
                    &msg_id::ready(&work.trace_id),
                    &work,
                )
                .await
            }
            Target::PinnedGone(worker) => self.fail_pinned(&work, &worker).await,
        }
    }

    /// Fails an attempt pinned to a worker that is gone (one run of a broadcast).
    pub(super) async fn fail_pinned(
        &self,
        work: &WorkItem,
        worker: &WorkerId,
    ) -> Result<(), ActorError> {
        let message = format!("its worker {worker} is gone");
        self.fail(work, Tag::WorkerLost, &message).await
    }

    /// Fails an attempt that names an executor no worker can ever offer (not a built-in, not
    /// a plugin's name: `../../bin/sh`), rather than waiting for a worker for ever. Only a
    /// message written past the Schedulers' checks names one.
    pub(super) async fn fail_unknown_executor(&self, work: &WorkItem) -> Result<(), ActorError> {
        let message = format!(
            "no worker can offer executor `{}`: an executor is one of {} or a plugin's name \
             ([a-z][a-z0-9_-]*)",
            work.spec.exec.name().escape_debug(),
            ax_bus::spec::builtin_names()
        );
        self.fail(work, Tag::ExecutorError, &message).await
    }

    /// Ends `work`'s attempt `failed` with `tag` before any worker took it, and says so.
    async fn fail(&self, work: &WorkItem, tag: Tag, message: &str) -> Result<(), ActorError> {
        let updated = self
            .client
            .update_instance(&work.instance_id, |r| {
                r.ended_early(&work.trace_id, State::Failed, tag, message)
            })
            .await?;
        if let Updated::Written(record, _) = updated {
            publish::to_stream_acked(
                &self.client,
                self.client.subjects().result(&record.job),
                &msg_id::result(&record.trace_id),
                &ResultMessage::from_record(&record),
            )
            .await?;
            publish::event(&self.client, &record).await;
        }
        Ok(())
    }

    /// Sends an attempt elsewhere under a new dispatch, reserved for it in the attempt's record
    /// (so that no earlier dispatch can start it), unless a worker started it meanwhile.
    /// `excluded` workers are passed over (they did not acknowledge, or they died) unless no
    /// other can take it.
    ///
    /// The intent is recorded in flight before anything else (see
    /// [`ax_bus::client::in_flight`]): from then on, a Router killed at any point leaves an
    /// entry that the janitor's sweep finishes.
    pub(crate) async fn redispatch(
        &self,
        mut work: WorkItem,
        excluded: Vec<WorkerId>,
    ) -> Result<(), ActorError> {
        let target = self.target(&work, excluded.clone()).await;
        let to = match target {
            Target::Worker(worker) => Some(worker),
            Target::NoWorker | Target::NoRoom(_) => None,
            // A pinned attempt has nowhere else to go.
            Target::PinnedGone(pin) => return self.fail_pinned(&work, &pin).await,
        };
        let dispatch = DispatchId::random();
        work.dispatch = Some(dispatch.clone());
        work.passed_over = excluded.clone();
        let ack_by = ax_bus::time::now()
            + chrono::Duration::from_std(self.config.ack_timeout).unwrap_or_default();
        self.client
            .put_in_flight(&InFlight {
                work: work.clone(),
                to: to.clone(),
                ack_by,
                excluded: excluded.clone(),
                by: self.node.clone(),
            })
            .await?;
        failpoint::hit("redispatch.intent");
        match self
            .client
            .update_instance(&work.instance_id, |r| {
                r.reserved_for(&work.trace_id, &dispatch)
            })
            .await?
        {
            // The next worker starts from the reserved record, without a read.
            Updated::Written(record, revision) => {
                work.stored = Some(StoredRecord { record, revision })
            }
            Updated::Refused(refused) => {
                tracing::debug!(trace = %work.trace_id, %refused, "started or moved on meanwhile; not re-dispatched");
                self.settle_in_flight(&work).await;
                return Ok(());
            }
            Updated::Missing => {
                self.settle_in_flight(&work).await;
                return Ok(());
            }
        }
        failpoint::hit("redispatch.reserved");
        match to {
            Some(worker) => {
                tracing::info!(trace = %work.trace_id, to = %worker, passed_over = ?excluded, "re-dispatching");
                let (work, ack) = self.send(work, &worker).await?;
                ack.await.during(|| "re-dispatch")?;
                failpoint::hit("redispatch.sent");
                self.track(
                    vec![Pending::new(work, worker, excluded)],
                    self.config.ack_timeout,
                );
            }
            None => {
                // Nobody can take it now: back to the ready queue, with its reservation; the
                // queue holds it from there.
                publish::to_stream_acked(
                    &self.client,
                    self.client.subjects().ready_for(&work),
                    &msg_id::ready_again(&work.trace_id, &dispatch),
                    &work,
                )
                .await?;
                self.settle_in_flight(&work).await;
            }
        }
        Ok(())
    }

    /// Removes the in-flight entry of `work`'s re-dispatch. Best effort: an entry left behind
    /// is removed by the janitor's sweep, which finds the attempt started or moved on.
    async fn settle_in_flight(&self, work: &WorkItem) {
        if let Err(e) = self.client.settle_in_flight(&work.trace_id).await {
            tracing::debug!(trace = %work.trace_id, error = %e, "in-flight entry left for the sweep");
        }
    }

    /// Re-dispatches `pending` unless its record shows that a worker started it (only the
    /// acknowledgement was lost or late) or that the attempt is not current any more.
    pub(super) async fn recheck(&self, pending: Pending) -> Result<(), ActorError> {
        let trace = pending.work.trace_id.clone();
        let waits = self
            .client
            .instance(&pending.work.instance_id)
            .await?
            .is_some_and(|(record, _)| record.awaits_start(&trace));
        if !waits {
            return Ok(());
        }
        tracing::warn!(%trace, worker = %pending.worker, "dispatch not acknowledged in time");
        let mut excluded = pending.excluded;
        excluded.push(pending.worker);
        self.redispatch(pending.work, excluded).await
    }

    /// Handles a dispatch whose deadline passed; one whose handling fails (NATS away) is
    /// tracked again to be looked at a second later: the tracked dispatch is the only thing
    /// that knows the attempt is in the air, so it is never dropped.
    pub(super) fn recheck_in_background(&self, pending: Pending) {
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(e) = this.recheck(pending.clone()).await {
                tracing::warn!(trace = %pending.work.trace_id, error = %e, "unacknowledged dispatch not handled yet; trying again");
                this.track(vec![pending], RECHECK_AFTER);
            }
        });
    }

    /// Writes on the record why its attempt waits to be routed (`queued`, its namespace's
    /// quota), and says so in an event. Best effort, as the `no_worker` tag.
    pub(super) async fn note_held(&self, work: &WorkItem, why: &str) {
        self.note_wait(work, |r| r.held(&work.trace_id, why)).await
    }

    /// Tags the record `no_worker`, saying `why` where the fleet said more than that no worker
    /// offers its tags and executor, and says so in an event (a refusal means the attempt
    /// moved on).
    pub(super) async fn note_no_worker(&self, work: &WorkItem, why: Option<&str>) {
        self.note_wait(work, |r| r.no_worker(&work.trace_id, why))
            .await
    }

    /// Writes why `work`'s attempt waits (`wait`, refused once it moved on) and says so in an
    /// event; best effort: the attempt waits just the same unwritten.
    async fn note_wait<F>(&self, work: &WorkItem, wait: F)
    where
        F: Fn(
            &ax_bus::InstanceRecord,
        ) -> Result<ax_bus::InstanceRecord, ax_bus::instance::TransitionRefused>,
    {
        match self.client.update_instance(&work.instance_id, wait).await {
            Ok(Updated::Written(record, _)) => publish::event(&self.client, &record).await,
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(instance = %work.instance_id, error = %e, "the wait's reason not written")
            }
        }
    }
}
