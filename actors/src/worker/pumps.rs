//! The worker's pumps: its dispatch queues (one consumer per priority, each waiting for a slot
//! its priority may use before it takes the next dispatch) and its cancellations.

use async_nats::jetstream::consumer::pull;
use async_nats::jetstream::ErrorCode;
use futures::StreamExt;

use ax_bus::error::{During, NatsError};
use ax_bus::ids::{TraceId, WorkerId};
use ax_bus::messages::DispatchAck;
use ax_bus::room::Requested;
use ax_bus::spec::Priority;
use ax_bus::AxClient;

use super::attempt::Attempts;
use super::slots::Permit;
use super::{Cancel, ACTOR};
use crate::jetstream::consume::{self, ConsumerSpec};
use crate::runtime::progress::{self, Progressed};
use crate::ActorError;

/// Stops attempts whose instance was cancelled (`ax.internal.cancel.<id>`, payload: trace id).
pub(super) async fn cancels(attempts: Attempts) -> Result<(), ActorError> {
    let client = &attempts.client;
    let subscription = client
        .nats
        .subscribe(client.subjects().cancel(&attempts.config.id))
        .await
        .during(|| "subscribe to cancels")?;
    let pump = progress::register(ACTOR, "cancel", None);
    let mut cancels = Progressed::new(subscription, pump);
    while let Some(message) = cancels.next().await {
        let text = String::from_utf8_lossy(&message.payload);
        match TraceId::parse(&text) {
            Ok(trace) => attempts.worker.send(Cancel(trace)).await?,
            Err(e) => tracing::warn!(error = %e, "a cancel that names no trace id ignored"),
        }
    }
    Ok(())
}

/// Takes the dispatches of one priority. With `reclaim` (the first start of this worker
/// process), the consumer is first deleted: dispatches a previous process of this worker
/// received and never finished are then delivered again at once instead of after their ack
/// wait. (One process per worker id.)
pub(super) async fn dispatches(
    attempts: Attempts,
    priority: Priority,
    reclaim: bool,
) -> Result<(), ActorError> {
    let client = &attempts.client;
    let id = &attempts.config.id;
    let spec = ConsumerSpec {
        ack_wait: attempts.config.dispatch_ack_wait,
        // Sized for the largest budget; what a smaller one cannot start yet waits in progress.
        max_ack_pending: i64::from(attempts.slots.most(priority)),
        max_deliver: consume::POISON_DELIVERIES,
        ..ConsumerSpec::new(
            client.layout.dispatch_stream(),
            client.layout.worker_consumer(id, priority),
            client.subjects().dispatch(id, priority),
        )
    };
    if reclaim {
        reclaim_dispatches(client, &spec).await?;
    }
    remove_drain_consumer(client, id, priority).await?;
    let scratch = attempts.config.scratch();
    std::fs::create_dir_all(&scratch)?;
    let batch = attempts.slots.limit(priority) as usize;
    let pump = progress::register(
        ACTOR,
        format!("dispatch-{}", priority.as_str()),
        Some(spec.source()),
    );
    let messages: pull::Stream = consume::messages(client, &spec, batch).await?;
    let mut messages = Progressed::new(messages, pump.clone());
    while let Some(message) = messages.next().await {
        let message = message.during(|| "dispatch consumer")?;
        let Some(work) = attempts.decoded(&message).await else {
            continue;
        };
        // Waiting for a slot is waiting on purpose, however long the attempts take.
        pump.held();
        let asked = Requested::of(&work.spec.resources);
        let permit = wait_for_slot(&attempts, priority, asked, &message).await;
        pump.working();
        let attempts = attempts.clone();
        let scratch = scratch.clone();
        let tell = work
            .router
            .clone()
            .filter(|_| work.tell_end)
            .zip(work.dispatch.clone().map(|dispatch| DispatchAck {
                trace_id: work.trace_id.clone(),
                dispatch,
                worker: attempts.config.id.clone(),
            }));
        // Attempts are not tied to the actor's context: a restart of the actor must not cut a
        // running process off from its outcome.
        tokio::spawn(async move {
            attempts.run(message, work, &scratch).await;
            drop(permit);
            if let Some((router, end)) = tell {
                attempts.acks.ended(&router, end);
            }
        });
    }
    Ok(())
}

/// Waits for a slot (and room for what it `asked`) for `message`'s attempt, keeping the dispatch in progress meanwhile so
/// that JetStream does not deliver it again while it waits (a budget that shrank, or high work
/// taking the slots, may hold it for longer than the ack wait).
async fn wait_for_slot(
    attempts: &Attempts,
    priority: Priority,
    asked: Requested,
    message: &async_nats::jetstream::Message,
) -> Permit {
    let acquire = attempts.slots.acquire(priority, asked);
    tokio::pin!(acquire);
    let every = attempts.config.dispatch_ack_wait / 3;
    let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        // The slot first: a free one is taken without arming the timer (the common case, on
        // every dispatch).
        tokio::select! {
            biased;
            permit = &mut acquire => return permit,
            _ = progress.tick() => consume::in_progress(message).await,
        }
    }
}

/// Removes the janitor's drain consumer of this queue, if one is left (see
/// [`ax_bus::client::provision::Layout::drain_consumer`]): it was made when this worker was
/// judged dead, and while it exists the worker cannot open its queue. Removing it under a
/// janitor still draining is safe: each dispatch it re-sent elsewhere is reserved for that
/// dispatch in its record, so this worker's start of the old copy is refused.
async fn remove_drain_consumer(
    client: &AxClient,
    id: &WorkerId,
    priority: Priority,
) -> Result<(), ActorError> {
    let stream = client
        .js
        .get_stream(client.layout.dispatch_stream())
        .await
        .during(|| "open the dispatch stream")?;
    let drain = client.layout.drain_consumer(id, priority);
    let Err(e) = stream.delete_consumer(&drain).await else {
        tracing::warn!(consumer = %drain, "removed a drain consumer the janitor left on this worker's queue");
        return Ok(());
    };
    let e = NatsError::new(format!("remove consumer {drain}"), e);
    match e.server_code() {
        Some(ErrorCode::CONSUMER_NOT_FOUND) => Ok(()),
        _ => Err(e.into()),
    }
}

async fn reclaim_dispatches(client: &AxClient, spec: &ConsumerSpec) -> Result<(), ActorError> {
    let stream = client
        .js
        .get_stream(&spec.stream)
        .await
        .during(|| format!("open stream {}", spec.stream))?;
    let pending = match stream.consumer_info(&spec.durable).await {
        Ok(info) => info.num_ack_pending,
        Err(_) => return Ok(()),
    };
    if pending > 0 {
        tracing::warn!(dispatches = pending, consumer = %spec.durable, "taking back dispatches a previous process of this worker left unfinished");
    }
    stream
        .delete_consumer(&spec.durable)
        .await
        .map(|_| ())
        .during(|| format!("reset consumer {}", spec.durable))
        .map_err(ActorError::from)
}
