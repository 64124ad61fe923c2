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

/// What became of one tick of a job.
pub(crate) struct Tick<'a> {
    pub(crate) job: &'a JobName,
    /// The tick's time.
    pub(crate) at: DateTime<Utc>,
    pub(crate) outcome: TickOutcome,
    /// The instance it made or found, if any.
    pub(crate) instance_id: Option<InstanceId>,
    /// Why, for a tick not fired.
    pub(crate) reason: String,
}

/// Records skipped ticks, acks awaited in windows of 256.
pub(crate) async fn record_skipped(
    client: &AxClient,
    node: &NodeId,
    job: &JobName,
    skipped: Vec<(DateTime<Utc>, String)>,
) -> Result<(), ActorError> {
    for chunk in skipped.chunks(256) {
        let mut acks = Vec::with_capacity(chunk.len());
        for (at, reason) in chunk {
            let tick = Tick {
                job,
                at: *at,
                outcome: TickOutcome::Skipped,
                instance_id: None,
                reason: reason.clone(),
            };
            let ack = publish(client, node, tick).await?;
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
    tick: Tick<'_>,
) -> Result<(), ActorError> {
    let job = tick.job;
    publish(client, node, tick)
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
    tick: Tick<'_>,
) -> Result<PublishAckFuture, ActorError> {
    let Tick {
        job,
        at: tick,
        outcome,
        instance_id,
        reason,
    } = tick;
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
