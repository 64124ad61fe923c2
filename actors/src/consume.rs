//! Durable pull consumers, the way every actor reads its work: explicit acks, unlimited
//! redelivery (a message is never dropped for having been tried often; poison messages are
//! terminated explicitly by their handler), batches pulled ahead.

use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};

use ax_bus::AxClient;

use crate::ActorError;

/// A durable consumer to open.
#[derive(Clone, Debug)]
pub struct ConsumerSpec {
    /// The stream.
    pub stream: String,
    /// Durable name (shared by every copy of an actor, so each message goes to one copy).
    pub durable: String,
    /// Filter subject.
    pub filter: String,
    /// How long a delivered message may stay unacked before redelivery.
    pub ack_wait: Duration,
    /// Most messages delivered and unacked at once.
    pub max_ack_pending: i64,
}

/// Opens (creating or updating) the consumer and returns its message stream.
pub async fn messages(
    client: &AxClient,
    spec: &ConsumerSpec,
    batch: usize,
) -> Result<pull::Stream, ActorError> {
    let err = |what: &str, e: String| ActorError::Nats(format!("{what} {}: {e}", spec.durable));
    let stream = client
        .js
        .get_stream(&spec.stream)
        .await
        .map_err(|e| err("open stream for", e.to_string()))?;
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(spec.durable.clone()),
            filter_subject: spec.filter.clone(),
            ack_policy: AckPolicy::Explicit,
            deliver_policy: DeliverPolicy::All,
            ack_wait: spec.ack_wait,
            max_deliver: -1,
            max_ack_pending: spec.max_ack_pending,
            ..Default::default()
        })
        .await
        .map_err(|e| err("create consumer", e.to_string()))?;
    consumer
        .stream()
        .max_messages_per_batch(batch)
        .heartbeat(Duration::from_secs(5))
        .expires(Duration::from_secs(30))
        .messages()
        .await
        .map_err(|e| err("pull from", e.to_string()))
}
