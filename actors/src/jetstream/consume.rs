//! Durable pull consumers, the way every actor reads its work: explicit acks (cumulative ones
//! for a leader reading in order, see `Cumulative`), batches pulled ahead, and a source message
//! acknowledged only once what it caused is stored.
//!
//! Redelivery is bounded only where many deliveries mean something is wrong: a dispatch or a
//! control command delivered [`POISON_DELIVERIES`] times without being settled is a poison
//! message, and JetStream stops delivering it; the dead-letter keeper then moves it to the
//! dead letters (see `dead_letters`). Consumers whose redeliveries are deliberate waits (the
//! Router's "no worker yet", the Scheduler's retry timers) redeliver without limit. A message
//! that does not decode is moved aside by its handler at once.

use std::time::Duration;

use async_nats::jetstream::{
    self,
    consumer::{pull, AckPolicy, DeliverPolicy},
    context::{ConsumerInfoError, ConsumerInfoErrorKind, PublishAckFuture},
    AckKind,
};
use serde::de::DeserializeOwned;

use ax_bus::error::NatsError;
use ax_bus::ids::NodeId;
use ax_bus::messages::AlertKind;
use ax_bus::{codec, dead_letter, AxClient};

use crate::ActorError;

use crate::jetstream::publish;
use crate::runtime::progress::{self, Progressed, Source};

/// How soon a message whose hand-off failed is delivered again.
const REDELIVER_AFTER: Duration = Duration::from_millis(500);

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
    /// Deliveries after which JetStream gives up on a message (-1: never).
    pub max_deliver: i64,
    /// Acknowledged cumulatively (see [`Cumulative`]) rather than message by message.
    pub cumulative: Option<Cumulative>,
}

/// A consumer whose reader handles its messages strictly in delivery order and never asks
/// for one again (no nak), and of which one reader runs at a time (a leader): one
/// acknowledgement of the last message of a batch settles the whole batch (`AckPolicy::All`)
/// instead of one per message.
///
/// A cumulative ack settles everything below it, including messages delivered to an earlier
/// reader that may never finish them (a leader stalled past its lease, then killed). So each
/// term of leadership reads through a consumer of its own, `<family>-<term>`: opening it finds
/// the family's earlier consumers (and `<family>` itself, the explicit-ack consumer of earlier
/// versions), starts after the lowest of their ack floors — what they had in hand unsettled
/// comes again — and removes them, so an earlier reader's late acks settle nothing here and
/// its next pull fails. Every reader of ax handles a redelivery idempotently.
#[derive(Clone, Copy, Debug)]
pub struct Cumulative {
    /// The consumers' common name.
    pub family: &'static str,
}

impl Cumulative {
    /// The durable name for leadership term `term`.
    pub fn durable(self, term: u64) -> String {
        format!("{}-{term}", self.family)
    }

    /// Whether `name` is one of the family's consumers (of any term, or the explicit one).
    pub fn includes(self, name: &str) -> bool {
        name == self.family
            || name
                .strip_prefix(self.family)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|term| term.parse::<u64>().is_ok())
    }
}

impl ConsumerSpec {
    /// A consumer `durable` of `stream` filtered on `filter`, with the defaults: 30 s ack wait,
    /// 1024 messages unacked at most, redelivered without limit.
    pub fn new(stream: String, durable: impl Into<String>, filter: String) -> Self {
        Self {
            stream,
            durable: durable.into(),
            filter,
            ack_wait: Duration::from_secs(30),
            max_ack_pending: 1024,
            max_deliver: -1,
            cumulative: None,
        }
    }
}

impl ConsumerSpec {
    /// The consumer as a pump's source, for the watchdog to ask whether it has messages
    /// pending.
    pub fn source(&self) -> Source {
        Source {
            stream: self.stream.clone(),
            durable: self.durable.clone(),
        }
    }
}

/// Deliveries that make a dispatch or a control command a poison message.
pub const POISON_DELIVERIES: i64 = 10;

/// How long to wait before a message whose handling failed for a passing reason is delivered
/// again: 1 s after the first delivery, doubling up to a minute, so that the
/// [`POISON_DELIVERIES`] of a bounded consumer span minutes of trouble, not seconds.
pub fn backoff(message: &jetstream::Message) -> Duration {
    let delivered = message.info().map(|i| i.delivered).unwrap_or(1).max(1);
    let doublings = u32::try_from(delivered - 1).unwrap_or(u32::MAX).min(6);
    Duration::from_secs(1 << doublings).min(Duration::from_secs(60))
}

/// Opens (creating or updating) the consumer and returns its message stream.
pub async fn messages(
    client: &AxClient,
    spec: &ConsumerSpec,
    batch: usize,
) -> Result<pull::Stream, ActorError> {
    let err = |what: &str, e: ax_bus::error::BoxError| {
        ActorError::from(NatsError::new(format!("{what} {}", spec.durable), e))
    };
    let stream = client
        .js
        .get_stream(&spec.stream)
        .await
        .map_err(|e| err("open stream for", e.into()))?;
    let (deliver_policy, earlier) = match spec.cumulative {
        Some(cumulative) => start_of(&stream, &spec.durable, cumulative).await?,
        None => (DeliverPolicy::All, Vec::new()),
    };
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(spec.durable.clone()),
            filter_subject: spec.filter.clone(),
            ack_policy: match spec.cumulative {
                Some(_) => AckPolicy::All,
                None => AckPolicy::Explicit,
            },
            deliver_policy,
            ack_wait: spec.ack_wait,
            max_deliver: spec.max_deliver,
            max_ack_pending: spec.max_ack_pending,
            ..Default::default()
        })
        .await
        .map_err(|e| err("create consumer", e.into()))?;
    for earlier in earlier {
        match stream.delete_consumer(&earlier).await {
            Ok(_) => {
                tracing::info!(consumer = %earlier, by = %spec.durable, "earlier consumer removed")
            }
            Err(e) => {
                tracing::warn!(consumer = %earlier, error = %e, "earlier consumer not removed")
            }
        }
    }
    consumer
        .stream()
        .max_messages_per_batch(batch)
        .heartbeat(Duration::from_secs(5))
        .expires(Duration::from_secs(30))
        .messages()
        .await
        .map_err(|e| err("pull from", e.into()))
}

/// Where a cumulative consumer starts, and the family's earlier consumers (to remove once it
/// is made): as it was created, if it exists (an existing consumer's start cannot change);
/// else after the lowest ack floor of the earlier consumers; else at the start.
async fn start_of(
    stream: &jetstream::stream::Stream,
    durable: &str,
    cumulative: Cumulative,
) -> Result<(DeliverPolicy, Vec<String>), ActorError> {
    let earlier = earlier_terms(stream, durable, cumulative).await?;
    match stream.consumer_info(durable).await {
        Ok(info) => return Ok((info.config.deliver_policy, earlier)),
        Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => {}
        Err(e) => return Err(info_failed(durable, e)),
    }
    let mut floor: Option<u64> = None;
    for name in &earlier {
        match stream.consumer_info(name).await {
            Ok(info) => {
                let settled = info.ack_floor.stream_sequence;
                floor = Some(floor.map_or(settled, |f| f.min(settled)));
            }
            // Removed meanwhile by another reader taking the lead: nothing of it to go by.
            Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => {}
            Err(e) => return Err(info_failed(name, e)),
        }
    }
    let policy = match floor {
        Some(settled) => DeliverPolicy::ByStartSequence {
            start_sequence: settled + 1,
        },
        None => DeliverPolicy::All,
    };
    Ok((policy, earlier))
}

/// The family's consumers other than `durable`.
async fn earlier_terms(
    stream: &jetstream::stream::Stream,
    durable: &str,
    cumulative: Cumulative,
) -> Result<Vec<String>, ActorError> {
    use futures::TryStreamExt;
    let names: Vec<String> = stream
        .consumer_names()
        .try_collect()
        .await
        .map_err(|e| ActorError::from(NatsError::new("list consumers", Box::new(e))))?;
    Ok(names
        .into_iter()
        .filter(|name| name != durable && cumulative.includes(name))
        .collect())
}

fn info_failed(durable: &str, e: ConsumerInfoError) -> ActorError {
    ActorError::from(NatsError::new(
        format!("read consumer {durable}"),
        Box::new(e),
    ))
}

/// [`messages`], reporting its progress to the watchdog as `actor`'s pump `pump` (the
/// watchdog judges a pump by what it does with the messages it reads).
pub async fn watched(
    actor: &'static str,
    pump: &str,
    client: &AxClient,
    spec: &ConsumerSpec,
    batch: usize,
) -> Result<Progressed<pull::Stream>, ActorError> {
    let handle = progress::register(actor, pump, Some(spec.source()));
    Ok(Progressed::new(
        messages(client, spec, batch).await?,
        handle,
    ))
}

/// The messages `consumer` has for its reader now, at most `most`, without waiting for more.
pub async fn fetch_now(
    consumer: &jetstream::consumer::PullConsumer,
    most: usize,
) -> Result<Vec<jetstream::Message>, ax_bus::error::BoxError> {
    let mut batch = consumer.fetch().max_messages(most).messages().await?;
    let mut messages = Vec::with_capacity(most);
    while let Some(message) = futures::StreamExt::next(&mut batch).await {
        messages.push(message?);
    }
    Ok(messages)
}

/// Acknowledges a delivered message. A failed ack is logged and nothing more: the message is
/// delivered again after its ack wait, and every consumer handles a redelivery idempotently
/// (message ids, compare-and-swap, create-if-absent).
pub async fn ack(message: &jetstream::Message) {
    if let Err(e) = message.ack().await {
        tracing::debug!(subject = %message.subject, error = %e, "ack not sent; the message comes again");
    }
}

/// Asks for a message again after `delay`. A failed request is logged and nothing more: the
/// message comes again after its ack wait anyway.
pub async fn nak(message: &jetstream::Message, delay: Duration) {
    if let Err(e) = message.ack_with(AckKind::Nak(Some(delay))).await {
        tracing::debug!(subject = %message.subject, error = %e, "nak not sent; the message comes after its ack wait");
    }
}

/// Stops the redelivery of a message set aside (kept as a dead letter). A failed request is
/// logged and nothing more: the message comes again, and its dead letter is stored once (its
/// message id is the source's sequence).
pub async fn term(message: &jetstream::Message) {
    if let Err(e) = message.ack_with(AckKind::Term).await {
        tracing::debug!(subject = %message.subject, error = %e, "term not sent; the message comes again");
    }
}

/// Tells JetStream a message is still being worked on. A failed one is logged and nothing
/// more: the next one goes out a third of the ack wait later.
pub async fn in_progress(message: &jetstream::Message) {
    if let Err(e) = message.ack_with(AckKind::Progress).await {
        tracing::debug!(subject = %message.subject, error = %e, "progress not sent");
    }
}

/// Decodes a message's payload. One that does not decode would fail the same way on every
/// redelivery: it is kept as a dead letter with the reason, reported on `ax.alert.<kind>`, and
/// terminated; `None` is returned. If the dead letter cannot be stored, the message is
/// redelivered later instead: it is never lost.
pub async fn decode_or_dead_letter<T: DeserializeOwned>(
    client: &AxClient,
    node: &NodeId,
    kind: AlertKind,
    message: &jetstream::Message,
) -> Option<T> {
    match codec::decode(&message.payload) {
        Ok(value) => Some(value),
        Err(e) => {
            undecodable(client, node, kind, message, e.to_string()).await;
            None
        }
    }
}

/// Moves `message`, which cannot be read for `reason`, to the dead letters with an alert of
/// `kind` (and ends its deliveries); kept for a later delivery if the dead letter cannot be
/// stored.
pub async fn undecodable(
    client: &AxClient,
    node: &NodeId,
    kind: AlertKind,
    message: &jetstream::Message,
    reason: String,
) {
    match publish::dead_letter(client, node, dead_letter::UNDECODABLE, &reason, message).await {
        Ok(()) => {
            publish::alert(
                client,
                node,
                kind,
                format!("undecodable message moved to the dead letters: {reason}"),
                Some(message.subject.to_string()),
            )
            .await;
            term(message).await;
        }
        Err(store) => {
            tracing::warn!(subject = %message.subject, error = %store, "undecodable message kept for later: dead letter not stored");
            nak(message, REDELIVER_AFTER).await;
        }
    }
}

/// Settles batches of hand-offs one behind the caller: a batch's acks are awaited (and its
/// source messages acknowledged) in a task of its own while the caller goes on with the next
/// batch; one batch settles at a time. The task is not tied to an actor, so a restart does not
/// cut a settling batch off from its acks.
#[derive(Debug, Default)]
pub struct SettleBehind(Option<tokio::task::JoinHandle<()>>);

impl SettleBehind {
    /// Waits for the previous batch to settle, then starts settling `pending`; `then` gets the
    /// items handed off.
    pub async fn settle<T: Send + 'static>(
        &mut self,
        pending: Vec<(jetstream::Message, PublishAckFuture, T)>,
        then: impl FnOnce(Vec<T>) + Send + 'static,
    ) {
        if let Some(previous) = self.0.take() {
            let _ = previous.await;
        }
        self.0 = Some(tokio::spawn(async move { then(settle(pending).await) }));
    }
}

/// Settles a batch of hand-offs: each source message whose onward publish JetStream stored is
/// acknowledged, the others are redelivered shortly. Returns the items handed off.
pub async fn settle<T>(pending: Vec<(jetstream::Message, PublishAckFuture, T)>) -> Vec<T> {
    let mut handed_off = Vec::with_capacity(pending.len());
    // Every ack's deadline runs from now, not from when the loop reaches it.
    let pending: Vec<_> = pending
        .into_iter()
        .map(|(message, ack, item)| (message, publish::due(ack), item))
        .collect();
    for (message, stored, item) in pending {
        match stored.await {
            Ok(_) => {
                ack(&message).await;
                handed_off.push(item);
            }
            Err(e) => {
                tracing::warn!(subject = %message.subject, error = %e, "hand-off not stored; redelivering");
                nak(&message, REDELIVER_AFTER).await;
            }
        }
    }
    handed_off
}

#[cfg(test)]
mod tests {
    use super::Cumulative;

    #[test]
    fn a_family_is_its_explicit_consumer_and_its_numbered_terms_only() {
        let results = Cumulative {
            family: "dag-results",
        };
        assert_eq!(results.durable(42), "dag-results-42");
        assert!(results.includes("dag-results"));
        assert!(results.includes("dag-results-42"));
        // Another reader's consumer whose name merely starts alike is left alone.
        assert!(!results.includes("dag-results-audit"));
        assert!(!results.includes("dag-results-"));
        assert!(!results.includes("dag-results42"));
        assert!(!results.includes("my-dag-results-1"));
    }
}
