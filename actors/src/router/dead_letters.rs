//! The dead-letter keeper: turns the server's max-deliveries advisories into dead letters.
//!
//! NATS has no dead-letter queue. When a consumer with a delivery limit gives up on a message,
//! the server publishes `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<consumer>` and
//! leaves the message where it was. `<AX>_ADVISORIES` captures those advisories (a plain core
//! message is lost if nobody listens at that moment); the keeper, run by every Router on one
//! shared durable consumer, copies each message with its headers to `<AX>_DEAD` with the reason,
//! then deletes it from its stream. A dispatch that died this way ends its attempt `failed` with
//! tag `dead_letter`, so the instance takes its retry (or fails for good) instead of waiting
//! forever for a delivery that will not come.

use async_nats::jetstream::stream::LastRawMessageErrorKind;
use futures::StreamExt;
use serde::Deserialize;

use ax_bus::error::During;
use ax_bus::error::NatsError;
use ax_bus::ids::NodeId;
use ax_bus::instance::{AttemptEnd, Tag};
use ax_bus::messages::{AlertKind, WorkItem};
use ax_bus::msg_id;
use ax_bus::{codec, dead_letter, AxClient};

use crate::jetstream::consume::{self, ConsumerSpec};
use crate::jetstream::publish;
use crate::outcome::report;
use crate::outcome::Outcome;
use crate::ActorError;

/// The part of a max-deliveries advisory the keeper needs.
#[derive(Debug, Deserialize)]
struct MaxDeliveries {
    stream: String,
    consumer: String,
    stream_seq: u64,
    deliveries: u64,
}

/// Keeps dead letters until the consumer ends.
pub(crate) async fn keep(client: AxClient, node: NodeId) -> Result<(), ActorError> {
    let spec = ConsumerSpec {
        max_ack_pending: 16,
        ..ConsumerSpec::new(
            client.layout.advisories_stream(),
            "dead-letter-keeper",
            String::new(),
        )
    };
    let mut messages =
        consume::watched(crate::router::ACTOR, "dead_letters", &client, &spec, 16).await?;
    while let Some(message) = messages.next().await {
        let message = message.during(|| "advisory consumer")?;
        match serde_json::from_slice::<MaxDeliveries>(&message.payload) {
            Ok(advisory) => match bury(&client, &node, &advisory).await {
                Ok(()) => {
                    consume::ack(&message).await;
                }
                Err(e) => {
                    tracing::warn!(stream = %advisory.stream, seq = advisory.stream_seq, error = %e, "dead letter not kept yet; trying again");
                    consume::nak(&message, consume::backoff(&message)).await;
                }
            },
            Err(e) => {
                // Not an advisory ax can read: kept as it is rather than dropped.
                let reason = format!("unreadable max-deliveries advisory: {e}");
                if publish::dead_letter(&client, &node, dead_letter::UNDECODABLE, &reason, &message)
                    .await
                    .is_ok()
                {
                    consume::term(&message).await;
                }
            }
        }
    }
    Ok(())
}

/// Moves the message an advisory names to the dead letters.
async fn bury(
    client: &AxClient,
    node: &NodeId,
    advisory: &MaxDeliveries,
) -> Result<(), ActorError> {
    let nats = |what: &str, e: ax_bus::error::BoxError| {
        ActorError::from(NatsError::new(
            format!("{what} {} seq {}", advisory.stream, advisory.stream_seq),
            e,
        ))
    };
    let stream = client
        .js
        .get_stream(&advisory.stream)
        .await
        .map_err(|e| nats("open", e.into()))?;
    let original = match stream.get_raw_message(advisory.stream_seq).await {
        Ok(message) => message,
        // Settled or removed meanwhile (a late ack, or a keeper that died after the copy).
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(()),
        Err(e) => return Err(nats("read", e.into())),
    };
    let reason = format!(
        "delivered {} times to consumer {} without being settled",
        advisory.deliveries, advisory.consumer
    );
    let mut headers = original.headers.clone();
    publish::mark_dead(&mut headers, &reason, original.subject.as_str(), node);
    let work = if advisory.stream == client.layout.dispatch_stream() {
        codec::decode::<WorkItem>(&original.payload).ok()
    } else {
        None
    };
    if let Some(work) = &work {
        publish::mark_owner(&mut headers, work);
    }
    publish::store_dead(
        client,
        dead_letter::MAX_DELIVERIES,
        &msg_id::dead(&format!("{}:{}", advisory.stream, advisory.stream_seq)),
        headers,
        original.payload.clone(),
    )
    .await?;
    if let Some(work) = work {
        end_attempt(client, node, work, &reason).await?;
    }
    match stream.delete_message(advisory.stream_seq).await {
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(stream = %advisory.stream, seq = advisory.stream_seq, error = %e, "dead message kept in its stream too")
        }
    }
    publish::alert(
        client,
        node,
        AlertKind::DeadLetter,
        format!(
            "message {} of {} moved to the dead letters: {reason}",
            advisory.stream_seq, advisory.stream
        ),
        Some(original.subject.to_string()),
    )
    .await;
    Ok(())
}

/// Ends the attempt of a dead dispatch `failed` (tag `dead_letter`); the instance's retry policy
/// decides what follows. A stale attempt is left alone by the record's fencing.
async fn end_attempt(
    client: &AxClient,
    node: &NodeId,
    work: WorkItem,
    reason: &str,
) -> Result<(), ActorError> {
    let now = ax_bus::time::now();
    let end = AttemptEnd {
        message: format!("dispatch {reason}; moved to the dead letters"),
        ..AttemptEnd::new(
            work.trace_id.clone(),
            node.clone(),
            false,
            Tag::DeadLetter,
            now,
        )
    };
    report(
        client,
        &Outcome {
            work,
            end,
            written: None,
        },
        None,
    )
    .await
}
