//! Tick records: what became of every cron tick (fired, caught up, skipped, de-duplicated), on
//! `ax.internal.tick.<job>`, read back by `ax job history` and by the misfire policy. Each
//! Scheduler records its own view of a tick, so with two Schedulers a tick reads "fired" by one
//! and "deduplicated" by the other.

use chrono::{DateTime, Utc};

use ax_bus::messages::{TickOutcome, TickRecord};
use ax_bus::AxClient;

use async_nats::jetstream::context::PublishAckFuture;

use crate::ActorError;

/// Records skipped ticks, acks awaited in windows of 256.
pub async fn record_skipped(
    client: &AxClient,
    node: &str,
    job: &str,
    skipped: Vec<(DateTime<Utc>, String)>,
) -> Result<(), ActorError> {
    for chunk in skipped.chunks(256) {
        let mut acks = Vec::with_capacity(chunk.len());
        for (tick, reason) in chunk {
            let record = TickRecord {
                job: job.to_string(),
                tick: *tick,
                outcome: TickOutcome::Skipped,
                instance_id: None,
                reason: reason.clone(),
                node: node.to_string(),
                at: ax_bus::time::now(),
            };
            acks.push(
                crate::jetstream::publish::to_stream(
                    client,
                    client.subjects().tick(job),
                    &format!("tick:{job}:{}:{node}:skipped", tick.timestamp_millis()),
                    &record,
                )
                .await?,
            );
        }
        for ack in acks {
            ack.await
                .map_err(|e| ActorError::Nats(format!("record tick of {job}: {e}")))?;
        }
    }
    Ok(())
}

/// Records one tick (the publish is awaited).
pub async fn record(
    client: &AxClient,
    node: &str,
    job: &str,
    tick: DateTime<Utc>,
    outcome: TickOutcome,
    instance_id: Option<String>,
    reason: String,
) -> Result<(), ActorError> {
    publish(client, node, job, tick, outcome, instance_id, reason)
        .await?
        .await
        .map(|_| ())
        .map_err(|e| ActorError::Nats(format!("record tick of {job}: {e}")))
}

/// Publishes one tick record; the returned future is the stream's ack.
pub async fn publish(
    client: &AxClient,
    node: &str,
    job: &str,
    tick: DateTime<Utc>,
    outcome: TickOutcome,
    instance_id: Option<String>,
    reason: String,
) -> Result<PublishAckFuture, ActorError> {
    let record = TickRecord {
        job: job.to_string(),
        tick,
        outcome,
        instance_id,
        reason,
        node: node.to_string(),
        at: ax_bus::time::now(),
    };
    crate::jetstream::publish::to_stream(
        client,
        client.subjects().tick(job),
        &format!(
            "tick:{job}:{}:{node}:{}",
            tick.timestamp_millis(),
            outcome.as_str()
        ),
        &record,
    )
    .await
}
