//! The janitor: what becomes of the work of a worker that died.
//!
//! One Router holds the janitor lease. Every second it looks for workers whose heartbeat is
//! older than the TTL (10 s by default) and, for each:
//! - drains the worker's dispatch queues (its consumers are deleted; a temporary one reads
//!   what was sent to it and never finished): an attempt nobody claimed is re-dispatched
//!   elsewhere, under a reservation the dead worker could never claim;
//! - takes back every attempt the worker claimed (its last heartbeat lists them, and the
//!   drained queue shows those claimed since): the claim is revoked — should the worker come
//!   back, its next lease renewal fails and it stops the process — and the instance moves to a
//!   new attempt with tag `worker_lost` (three such losses and it fails);
//! - removes the worker from the registry.
//!
//! Detection takes the TTL plus at most a second, so attempts are handed over within 15 s of
//! the worker's last heartbeat with the default settings.

use std::time::Duration;

use async_nats::connection::State as ConnectionState;
use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use futures::StreamExt;

use ax_bus::client::Updated;
use ax_bus::error::NatsError;
use ax_bus::ids::{InstanceId, TraceId, WorkerId};
use ax_bus::instance::Tag;
use ax_bus::messages::{AlertKind, ResultMessage, WorkItem, WorkerInfo};
use ax_bus::msg_id;
use ax_bus::spec::Priority;
use ax_bus::{codec, State};

use super::{Dispatcher, Forget, Silent};
use crate::jetstream::{consume, publish};
use crate::node::lease::Lease;
use crate::ActorError;

const LEASE: &str = "router-janitor";
/// Attempts an instance may lose with their worker before it fails.
pub(crate) const MAX_WORKER_LOSSES: u32 = 3;

/// Holds the janitor lease and sweeps for dead workers while it does.
pub(crate) async fn run(shared: Dispatcher) -> Result<(), ActorError> {
    let lease = Lease::acquire(&shared.client, LEASE, &shared.node).await?;
    tokio::select! {
        lost = lease.keep() => Err(lost),
        ended = sweep(shared) => ended,
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
            shared.config.worker_ttl
        ),
        None,
    )
    .await;
    for priority in Priority::ALL {
        for work in drain(shared, worker, priority).await? {
            lost_dispatch(shared, work, worker).await?;
        }
    }
    for attempt in &info.attempts {
        lost_running(shared, &attempt.instance_id, &attempt.trace_id, worker).await?;
    }
    Ok(())
}

/// Everything in the worker's queue for `priority`, taken out of it.
async fn drain(
    shared: &Dispatcher,
    worker: &WorkerId,
    priority: Priority,
) -> Result<Vec<WorkItem>, ActorError> {
    let client = &shared.client;
    let failed = |what: &str, e: ax_bus::error::BoxError| {
        ActorError::from(NatsError::new(format!("{what} of {worker}"), e))
    };
    let stream = client
        .js
        .get_stream(client.layout.dispatch_stream())
        .await
        .map_err(|e| failed("open the dispatch stream", e.into()))?;
    let durable = format!("worker-{worker}-{}", priority.as_str());
    // The dead worker's own consumer may be gone already (it never started one, or a janitor
    // before this one deleted it): nothing to do then.
    if let Err(e) = stream.delete_consumer(&durable).await {
        tracing::debug!(consumer = %durable, error = %e, "worker consumer not deleted");
    }
    let janitor = format!("janitor-{worker}-{}", priority.as_str());
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(janitor.clone()),
            filter_subject: client.subjects().dispatch(worker, priority),
            ack_policy: AckPolicy::Explicit,
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(|e| failed("read the queue", e.into()))?;
    let mut drained = Vec::new();
    loop {
        let mut batch = consumer
            .fetch()
            .max_messages(256)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .map_err(|e| failed("read the queue", e.into()))?;
        let mut got = 0;
        while let Some(message) = batch.next().await {
            let message = message.map_err(|e| failed("read the queue", e))?;
            got += 1;
            match codec::decode::<WorkItem>(&message.payload) {
                Ok(work) => drained.push(work),
                Err(e) => tracing::warn!(error = %e, "undecodable dispatch dropped while draining"),
            }
            consume::ack(&message).await;
        }
        if got == 0 {
            break;
        }
    }
    // A consumer left behind holds nothing: the queue is drained.
    if let Err(e) = stream.delete_consumer(&janitor).await {
        tracing::debug!(consumer = %janitor, error = %e, "drained consumer not deleted");
    }
    Ok(drained)
}

/// A dispatch the dead worker received or not: re-dispatched unless it was claimed.
async fn lost_dispatch(
    shared: &Dispatcher,
    work: WorkItem,
    dead: &WorkerId,
) -> Result<(), ActorError> {
    match shared.client.claim_of(&work.trace_id).await? {
        Some((claim, _)) if claim.revoked => Ok(()),
        Some((claim, _)) if claim.worker.as_ref() == Some(dead) => {
            lost_running(shared, &work.instance_id, &work.trace_id, dead).await
        }
        Some((claim, _)) if claim.worker.is_some() => Ok(()),
        _ => shared.redispatch(work, vec![dead.clone()]).await,
    }
}

/// An attempt the dead worker claimed: revoked, and the instance moves on.
async fn lost_running(
    shared: &Dispatcher,
    instance_id: &InstanceId,
    trace: &TraceId,
    dead: &WorkerId,
) -> Result<(), ActorError> {
    let client = &shared.client;
    if !client.revoke_claim(trace, dead).await? {
        return Ok(());
    }
    let new_trace = TraceId::random();
    let updated = client
        .update_instance(instance_id, |r| {
            r.worker_lost(trace, &new_trace, dead, MAX_WORKER_LOSSES)
        })
        .await?;
    let Updated::Written(record, _) = updated else {
        return Ok(());
    };
    tracing::warn!(instance = %instance_id, worker = %dead, state = %record.state, "attempt lost with its worker");
    // The lost attempt's result: its own trace and number, the instance's state after it.
    let mut lost = (*record).clone();
    lost.trace_id = trace.clone();
    if record.state == State::Running {
        lost.attempt -= 1;
    }
    lost.tag = Tag::WorkerLost;
    publish::to_stream_acked(
        client,
        client.subjects().result(&record.job),
        &msg_id::result(trace),
        &ResultMessage::from_record(&lost),
    )
    .await?;
    publish::event(client, &record).await;
    if record.state != State::Running && record.state != State::Failed {
        return Ok(());
    }
    let Some((job, _)) = client.job(&record.job).await? else {
        return Ok(());
    };
    let work = WorkItem::for_attempt(&record, job.spec);
    if record.state == State::Failed {
        if work.shard.is_none() {
            publish::failed_for_good(client, &shared.node, &work, record.tag, &record.message)
                .await?;
        }
        return Ok(());
    }
    publish::to_stream_acked(
        client,
        client.subjects().ready(work.spec.priority),
        &msg_id::ready(&work.trace_id),
        &work,
    )
    .await
}
