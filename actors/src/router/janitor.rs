//! The janitor: what becomes of the work of a worker that died.
//!
//! One Router holds the janitor lease. Every second it looks for workers whose heartbeat is
//! older than the TTL (10 s by default) and, for each:
//! - drains the worker's dispatch queues (its consumers are deleted; a temporary one reads
//!   what was sent to it and never finished): an attempt nobody started is re-dispatched
//!   elsewhere, under a reservation in its record that the dead worker's copy can never pass —
//!   each message is acknowledged only once its attempt is handed over, so a failure halfway
//!   loses nothing;
//! - takes back every attempt the worker started (its last heartbeat lists them, and the
//!   drained queue shows those started since): the claim is revoked (written revoked from the
//!   record for an attempt that had not renewed one) — should the worker come back, its next
//!   lease renewal fails and it stops the process — and the instance moves to a new attempt
//!   with tag `worker_lost` (three such losses and it fails);
//! - removes the worker from the registry.
//!
//! Detection takes the TTL plus at most a second, so attempts are handed over within 15 s of
//! the worker's last heartbeat with the default settings. A worker's registry entry outlives
//! any outage of the Routers (it is removed here, once its work is handed over), so a worker
//! that died while no Router ran is judged as soon as one runs again.
//!
//! Every second, too, the janitor finishes the re-dispatches that their Routers did not live
//! to finish ([`in_flight`]), and it runs the [`consistency`] sweep: an open instance whose
//! next step has no owner is alerted and resumed. And it removes the finished instance
//! records whose retention has passed ([`super::retention`]).

use std::time::Duration;

use async_nats::connection::State as ConnectionState;
use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use futures::StreamExt;

use ax_bus::codec;
use ax_bus::error::NatsError;
use ax_bus::ids::WorkerId;
use ax_bus::messages::{AlertKind, WorkItem, WorkerInfo};
use ax_bus::spec::Priority;

use super::{consistency, in_flight, Dispatcher, Forget, Silent};
use crate::jetstream::{consume, publish};
use crate::runtime::lease::Lease;
use crate::ActorError;

const LEASE: &str = "router-janitor";

/// Holds the janitor lease and sweeps for dead workers while it does.
pub(crate) async fn run(shared: Dispatcher) -> Result<(), ActorError> {
    let lease = Lease::acquire(&shared.client, LEASE, &shared.node).await?;
    // Boxed: side by side in this future, the loops' states overflowed an arbiter
    // thread's stack in a debug build.
    tokio::select! {
        lost = lease.keep() => Err(lost),
        ended = Box::pin(consistency::watch(shared.clone())) => ended,
        ended = Box::pin(super::backlog::watch(shared.clone())) => ended,
        ended = Box::pin(super::retention::sweep(shared.clone())) => ended,
        ended = Box::pin(sweep(shared)) => ended,
    }
}

async fn sweep(shared: Dispatcher) -> Result<(), ActorError> {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    // Silence heard before this janitor held the lease, or while its connection was down, is
    // not evidence: judging it would declare every worker dead after a NATS outage.
    let mut deaf = true;
    loop {
        every.tick().await;
        let connected = shared.client.nats.connection_state() == ConnectionState::Connected;
        if !connected {
            deaf = true;
            continue;
        }
        let grace = std::mem::take(&mut deaf);
        let silent = shared.router.send(Silent { grace }).await?;
        for (id, info) in silent {
            handle_dead(&shared, &id, &info).await?;
            shared.router.send(Forget(id.clone())).await?;
            if let Err(e) = shared.client.workers.delete(&id).await {
                tracing::warn!(worker = %id, error = %e, "dead worker not removed from the registry");
            }
        }
        in_flight::sweep(&shared).await?;
    }
}

async fn handle_dead(
    shared: &Dispatcher,
    worker: &WorkerId,
    info: &WorkerInfo,
) -> Result<(), ActorError> {
    publish::alert(
        &shared.client,
        &shared.node,
        AlertKind::Worker,
        format!(
            "worker {worker} has sent no heartbeat for {:?}; handing over its attempts",
            shared.config.policy.worker_ttl()
        ),
        None,
    )
    .await;
    for priority in Priority::ALL {
        drain(shared, worker, priority).await?;
    }
    for attempt in &info.attempts {
        let (instance, trace) = (&attempt.instance_id, &attempt.trace_id);
        crate::outcome::lost(&shared.client, &shared.node, instance, trace, worker).await?;
    }
    Ok(())
}

/// Takes everything out of the worker's queue for `priority`, handing each dispatch over
/// before its message is acknowledged: a failure halfway leaves the rest in the queue (the
/// janitor's consumer is removed, so the next sweep reads them at once) and loses nothing.
async fn drain(
    shared: &Dispatcher,
    worker: &WorkerId,
    priority: Priority,
) -> Result<(), ActorError> {
    let client = &shared.client;
    let failed = |what: &str, e: ax_bus::error::BoxError| {
        ActorError::from(NatsError::new(format!("{what} of {worker}"), e))
    };
    let stream = client
        .js
        .get_stream(client.layout.dispatch_stream())
        .await
        .map_err(|e| failed("open the dispatch stream", e.into()))?;
    let durable = client.layout.worker_consumer(worker, priority);
    // The dead worker's own consumer may be gone already (it never started one, or a janitor
    // before this one deleted it): nothing to do then.
    if let Err(e) = stream.delete_consumer(&durable).await {
        tracing::debug!(consumer = %durable, error = %e, "worker consumer not deleted");
    }
    let janitor = client.layout.drain_consumer(worker, priority);
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(janitor.clone()),
            filter_subject: client.subjects().dispatch(worker, priority),
            ack_policy: AckPolicy::Explicit,
            deliver_policy: DeliverPolicy::All,
            ack_wait: DRAIN_ACK_WAIT,
            // Left behind when the janitor dies mid-drain, it would keep the worker, back by
            // then, from opening its queue: the server removes it once idle that long.
            inactive_threshold: DRAIN_IDLE,
            ..Default::default()
        })
        .await
        .map_err(|e| failed("read the queue", e.into()))?;
    let drained = drain_into(shared, &consumer, worker).await;
    // Drained, or stopped by a failure: either way a fresh consumer next time (whatever is
    // left stays in the work-queue stream until a consumer acknowledges it).
    if let Err(e) = stream.delete_consumer(&janitor).await {
        tracing::debug!(consumer = %janitor, error = %e, "janitor consumer not deleted");
    }
    drained
}

/// How long a drain consumer nobody reads lives on.
const DRAIN_IDLE: Duration = Duration::from_secs(30);

/// How long a drained dispatch may be in hand before the server offers it again: only
/// matters when the janitor's consumer could not be removed after a failure.
const DRAIN_ACK_WAIT: Duration = Duration::from_secs(10);

async fn drain_into(
    shared: &Dispatcher,
    consumer: &async_nats::jetstream::consumer::Consumer<pull::Config>,
    worker: &WorkerId,
) -> Result<(), ActorError> {
    let failed = |e: ax_bus::error::BoxError| {
        ActorError::from(NatsError::new(format!("read the queue of {worker}"), e))
    };
    loop {
        let mut batch = consumer
            .fetch()
            .max_messages(256)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .map_err(|e| failed(e.into()))?;
        let mut got = 0;
        while let Some(message) = batch.next().await {
            let message = message.map_err(failed)?;
            got += 1;
            match codec::decode::<WorkItem>(&message.payload) {
                Ok(work) => lost_dispatch(shared, work, worker).await?,
                Err(e) => tracing::warn!(error = %e, "undecodable dispatch dropped while draining"),
            }
            consume::ack(&message).await;
        }
        if got == 0 {
            return Ok(());
        }
    }
}

/// A dispatch the dead worker received or not, judged by its record: lost if the dead worker
/// started it ([`crate::outcome::lost`] revokes its claim, written or not), left alone if
/// another worker started it, if it moved on, or if it is reserved for a later dispatch (whose
/// re-dispatch is in flight and owned by the sweep), re-dispatched otherwise.
async fn lost_dispatch(
    shared: &Dispatcher,
    work: WorkItem,
    dead: &WorkerId,
) -> Result<(), ActorError> {
    let (client, trace) = (&shared.client, &work.trace_id);
    let Some((record, _)) = client.instance(&work.instance_id).await? else {
        return Ok(());
    };
    if let Some(worker) = record.started_by(trace) {
        if worker != dead {
            return Ok(());
        }
        return crate::outcome::lost(client, &shared.node, &work.instance_id, trace, dead).await;
    }
    let reserved_elsewhere = record
        .reserved
        .as_ref()
        .is_some_and(|r| r.trace_id == *trace && work.dispatch.as_ref() != Some(&r.dispatch));
    if !record.awaits_start(trace) || reserved_elsewhere {
        return Ok(());
    }
    shared.redispatch(work, vec![dead.clone()]).await
}
