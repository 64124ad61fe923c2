//! Tick records: what became of every cron tick (fired, caught up, skipped, de-duplicated), on
//! `ax.internal.tick.<job>`, read back by `ax job history` and by the misfire policy. Each
//! Scheduler records its own view of a tick, so with two Schedulers a tick reads "fired" by one
//! and "deduplicated" by the other.

use chrono::{DateTime, Utc};

use ax_bus::error::During;
use ax_bus::ids::{InstanceId, JobName, NodeId};
use ax_bus::messages::{TickOutcome, TickRecord};
use ax_bus::{msg_id, AxClient};

use async_nats::jetstream::context::PublishAckFuture;

use crate::ActorError;

/// Records skipped ticks, acks awaited in windows of 256.
pub(crate) async fn record_skipped(
    client: &AxClient,
    node: &NodeId,
    job: &JobName,
    skipped: Vec<(DateTime<Utc>, String)>,
) -> Result<(), ActorError> {
    for chunk in skipped.chunks(256) {
        let mut acks = Vec::with_capacity(chunk.len());
        for (tick, reason) in chunk {
            let skipped = TickOutcome::Skipped;
            let ack = publish(client, node, job, *tick, skipped, None, reason.clone()).await?;
            acks.push(crate::jetstream::publish::due(ack));
        }
        for ack in acks {
            ack.await.during(|| format!("record tick of {job}"))?;
        }
    }
    Ok(())
}

/// Records one tick (the publish is awaited).
pub(crate) async fn record(
    client: &AxClient,
    node: &NodeId,
    job: &JobName,
    tick: DateTime<Utc>,
    outcome: TickOutcome,
    instance_id: Option<InstanceId>,
    reason: String,
) -> Result<(), ActorError> {
    publish(client, node, job, tick, outcome, instance_id, reason)
        .await?
        .await
        .map(|_| ())
        .during(|| format!("record tick of {job}"))
        .map_err(ActorError::from)
}

/// Publishes one tick record; the returned future is the stream's ack.
pub(crate) async fn publish(
    client: &AxClient,
    node: &NodeId,
    job: &JobName,
    tick: DateTime<Utc>,
    outcome: TickOutcome,
    instance_id: Option<InstanceId>,
    reason: String,
) -> Result<PublishAckFuture, ActorError> {
    let record = TickRecord {
        job: job.clone(),
        tick,
        outcome,
        instance_id,
        reason,
        node: node.clone(),
        at: ax_bus::time::now(),
    };
    crate::jetstream::publish::to_stream(
        client,
        client.subjects().tick(job),
        &msg_id::tick(job, tick, node, outcome.as_str()),
        &record,
    )
    .await
}
