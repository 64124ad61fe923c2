//! Bursts: the publishes a hot path makes together (a batch's hand-offs), sent to their one
//! stream as a JetStream fast-ingest batch (ADR-50; nats-server 2.14+, a stream with
//! `allow_batched`).
//!
//! Why: a plain publish costs the server a store and an answer, and the client an answer to
//! read. In a fast batch the server answers the first message (with the flow it allows), then
//! every `flow` messages, and the last one: a burst of n costs n + n/flow + 2 messages instead of
//! 2n, and the stores stay in order. What the batch cannot confirm — the server ends a batch
//! on a gap or an error, forgets it when it restarts, an answer is lost — is published again
//! one by one and in order, as a plain publish would have been: a stream message carries its
//! message id, so the stream keeps one copy whatever was stored the first time, and a put
//! written again leaves the same value. A burst of one is a plain publish.
//!
//! A burst pays a round trip at its start (the first answer must come before the rest is sent)
//! and one at its end (the commit's answer confirms the last messages), and the server gives
//! only the first batch open on a stream the flow asked for: a second one open at the same time
//! starts at an answer every message and doubles from there (1, 2, 4 … 128, nats-server 2.15.1).
//! So bursts suit a publisher with one batch open at a time — the Scheduler's creator, the
//! DagCoordinator's deps entries. The Router's dispatches stay plain publishes: its batches of
//! 256 overlap while they settle, and there the ramp cost more than the answers saved (the
//! routed rate fell by a fifth to a third in `ax bench --only routing`, 2026-12-04).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use async_nats::jetstream::message::PublishMessage;
use async_nats::{HeaderMap, Subscriber};
use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};

use ax_bus::codec;
use ax_bus::error::{During, NatsError, Reason};
use ax_bus::AxClient;

use super::publish::{due, AckDue};

/// The flow asked for: the server answers at most every this many messages.
const FLOW: u16 = 512;
/// Answers outstanding before the publisher waits (ADR-50: two keeps the server busy while
/// the client waits for the first).
const OUTSTANDING: u64 = 2;
/// How long an answer of the server may take before the batch is given up (and what it did not
/// confirm published one by one).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
const MSG_ID: &str = "Nats-Msg-Id";
/// Plain publishes whose acks are awaited together.
const WINDOW: usize = 1024;

/// One message of a burst: a stream message de-duplicated by its message id, or a key-value
/// put.
#[derive(Debug)]
pub struct Item {
    subject: String,
    headers: HeaderMap,
    payload: Bytes,
}

impl Item {
    /// `value` in MessagePack, to publish on `subject` under `msg_id`.
    pub fn new<T: serde::Serialize>(
        subject: String,
        msg_id: &str,
        value: &T,
    ) -> Result<Self, codec::CodecError> {
        let mut headers = codec::msgpack_headers();
        headers.insert(MSG_ID, msg_id);
        Ok(Self {
            subject,
            headers,
            payload: codec::encode(value)?,
        })
    }

    /// A put of `value` under `key` in `bucket`. It needs no message id: published again, it
    /// leaves the same value (a burst publishes again in the order it was given).
    pub fn kv_put(bucket: &str, key: &str, value: Bytes) -> Self {
        Self {
            subject: format!("$KV.{bucket}.{key}"),
            headers: HeaderMap::new(),
            payload: value,
        }
    }
}

/// Whether one message of a burst is stored.
#[derive(Debug)]
pub struct Stored(oneshot::Receiver<Result<(), NatsError>>);

impl Future for Stored {
    type Output = Result<(), NatsError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|answer| {
            answer.unwrap_or_else(|_| {
                Err(NatsError::new(
                    "publish a burst",
                    Reason("the publishing task ended".into()),
                ))
            })
        })
    }
}

/// Publishes `items` — all to subjects of one stream — in the background, as one batch when
/// there are several; one [`Stored`] for each, in order.
pub fn publish(client: &AxClient, items: Vec<Item>) -> Vec<Stored> {
    if items.is_empty() {
        return Vec::new();
    }
    let burst = Open::new(client);
    items.into_iter().map(|item| burst.push(item)).collect()
}

/// A burst whose items are given as they come (a creator hands an instance on as soon as its
/// record is stored); it is sent as they come and ends when this is dropped.
#[derive(Debug)]
pub struct Open(mpsc::UnboundedSender<(Item, Answer)>);

type Answer = oneshot::Sender<Result<(), NatsError>>;

impl Open {
    /// A burst on `client`, published by a task of its own.
    pub fn new(client: &AxClient) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let client = client.clone();
        tokio::spawn(async move {
            let mut burst = Burst {
                incoming: rx,
                items: Vec::new(),
                answers: Vec::new(),
            };
            burst.receive().await;
            let from = if burst.receive().await {
                burst.batch(&client).await
            } else {
                0
            };
            burst.one_by_one(&client, from).await;
        });
        Self(tx)
    }

    /// Adds `item` to the burst.
    pub fn push(&self, item: Item) -> Stored {
        let (tx, rx) = oneshot::channel();
        // A burst whose task is gone drops the answer: the item is reported not stored.
        let _ = self.0.send((item, tx));
        Stored(rx)
    }
}

/// A burst in progress: its items so far, the answers not yet given, and what is still to come.
struct Burst {
    incoming: mpsc::UnboundedReceiver<(Item, Answer)>,
    items: Vec<Item>,
    answers: Vec<Option<Answer>>,
}

/// What the server says on a batch's inbox.
#[derive(Debug, PartialEq)]
enum Said {
    /// Every message up to batch sequence `seq` is stored; answers come every `flow` messages.
    Flow { seq: u64, flow: u64 },
    /// The batch ended: messages up to batch sequence `count` are accounted for.
    Ended { count: u64 },
    /// The batch is unknown or refused (not enabled on the stream, forgotten): nothing more of
    /// it is stored.
    Refused,
    /// A gap or a message's error: the batch ends, its final answer follows.
    Ending,
}

#[derive(Deserialize)]
struct Wire {
    #[serde(rename = "type")]
    kind: Option<String>,
    seq: Option<u64>,
    msgs: Option<u64>,
    count: Option<u64>,
    error: Option<serde_json::Value>,
}

impl Said {
    fn parse(payload: &[u8]) -> Option<Self> {
        let wire: Wire = serde_json::from_slice(payload).ok()?;
        Some(match wire.kind.as_deref() {
            Some("ack") => Said::Flow {
                seq: wire.seq?,
                flow: wire.msgs?.max(1),
            },
            Some(_) => Said::Ending,
            None if wire.error.is_some() => Said::Refused,
            None => Said::Ended {
                count: wire.count.unwrap_or(0),
            },
        })
    }
}

impl Burst {
    /// Takes the next item into the burst; false once none will come (and at every call
    /// after: a closed channel answers at once).
    async fn receive(&mut self) -> bool {
        let Some((item, answer)) = self.incoming.recv().await else {
            return false;
        };
        self.items.push(item);
        self.answers.push(Some(answer));
        true
    }

    fn confirm(&mut self, through: usize) {
        for answer in self.answers.iter_mut().take(through) {
            if let Some(answer) = answer.take() {
                let _ = answer.send(Ok(()));
            }
        }
    }

    /// Sends the items, those to come included, as one fast batch; returns how many of the
    /// first are stored (the rest are for [`Burst::one_by_one`]).
    async fn batch(&mut self, client: &AxClient) -> usize {
        let inbox = client.nats.new_inbox();
        // The server reads the batch from `<prefix>.<id>.<flow>.<gap>.<seq>.<op>.$FI`.
        if inbox.split('.').count() != 2 {
            return 0;
        }
        let Ok(mut answers) = client.nats.subscribe(format!("{inbox}.>")).await else {
            return 0;
        };
        let mut stored = 0u64;
        let mut flow = 1u64;
        let mut started = false;
        let mut seq = 0u64;
        loop {
            seq += 1;
            let index = (seq - 1) as usize;
            // An item goes out once it is known whether another follows: the last one commits.
            let last = index + 1 == self.items.len() && !self.receive().await;
            let op = match seq {
                1 => 0,
                _ if last => 2,
                _ => 1,
            };
            let item = &self.items[index];
            let sent = client
                .nats
                .publish_with_reply_and_headers(
                    item.subject.clone(),
                    format!("{inbox}.{FLOW}.fail.{seq}.{op}.$FI"),
                    item.headers.clone(),
                    item.payload.clone(),
                )
                .await;
            if sent.is_err() {
                return stored as usize;
            }
            // The first answer says whether the stream takes batches, and at what flow; after
            // it, at most OUTSTANDING answers may be owed, and those already here are read.
            loop {
                let wait = !started || stored + flow * OUTSTANDING <= seq;
                match next_answer(&mut answers, wait).await {
                    None if !wait => break,
                    None | Some(Said::Refused) => return stored as usize,
                    Some(Said::Flow {
                        seq: through,
                        flow: f,
                    }) => {
                        started = true;
                        stored = stored.max(through);
                        flow = f;
                        self.confirm(stored as usize);
                    }
                    Some(Said::Ended { count }) => {
                        self.confirm(count as usize);
                        return count as usize;
                    }
                    Some(Said::Ending) => return self.ended(&mut answers, stored).await,
                }
            }
            if last {
                return self.ended(&mut answers, stored).await;
            }
        }
    }

    /// Waits for the batch's final answer; what it accounts for is stored.
    async fn ended(&mut self, answers: &mut Subscriber, mut stored: u64) -> usize {
        loop {
            match next_answer(answers, true).await {
                Some(Said::Flow { seq, .. }) => {
                    stored = stored.max(seq);
                    self.confirm(stored as usize);
                }
                Some(Said::Ended { count }) => {
                    let count = count.max(stored) as usize;
                    self.confirm(count);
                    return count;
                }
                Some(Said::Ending) => {}
                Some(Said::Refused) | None => return stored as usize,
            }
        }
    }

    /// Publishes the items from `from` on, and those still to come, one by one; acks awaited
    /// in windows.
    async fn one_by_one(&mut self, client: &AxClient, from: usize) {
        let mut next = from;
        let mut acks = Vec::new();
        loop {
            while next < self.items.len() {
                let (item, answer) = (&self.items[next], self.answers[next].take());
                next += 1;
                let Some(answer) = answer else {
                    continue;
                };
                let subject = item.subject.clone();
                let publish = PublishMessage::build()
                    .headers(item.headers.clone())
                    .payload(item.payload.clone());
                match client.js.send_publish(subject.clone(), publish).await {
                    Ok(ack) => acks.push((subject, due(ack), answer)),
                    Err(e) => {
                        let _ = answer.send(Err(NatsError::new(format!("publish {subject}"), e)));
                    }
                }
                if acks.len() >= WINDOW {
                    settle(&mut acks).await;
                }
            }
            if !self.receive().await {
                break;
            }
        }
        settle(&mut acks).await;
    }
}

/// Answers the plain publishes in `acks` as their acks come.
async fn settle(acks: &mut Vec<(String, AckDue, Answer)>) {
    for (subject, ack, answer) in acks.drain(..) {
        let _ = answer.send(ack.await.map(drop).during(|| format!("publish {subject}")));
    }
}

/// The next answer on the batch's inbox: waits for one when `wait` (or the publisher must not go
/// on), else only takes one already there. `None`: none came in time, or the inbox closed.
async fn next_answer(answers: &mut Subscriber, wait: bool) -> Option<Said> {
    loop {
        let message = if wait {
            tokio::time::timeout(ANSWER_TIMEOUT, answers.next())
                .await
                .ok()??
        } else {
            answers.next().now_or_never()??
        };
        if let Some(answer) = Said::parse(&message.payload) {
            return Some(answer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Said;

    #[test]
    fn the_servers_answers_as_nats_server_2_15_writes_them() {
        assert_eq!(
            Said::parse(br#"{"type":"ack","seq":0,"msgs":100}"#),
            Some(Said::Flow { seq: 0, flow: 100 })
        );
        assert_eq!(
            Said::parse(br#"{"stream":"S","seq":2,"batch":"b1","count":3}"#),
            Some(Said::Ended { count: 3 })
        );
        assert_eq!(
            Said::parse(
                br#"{"error":{"code":400,"err_code":10208,"description":"batch publish ID unknown"},"stream":"S","seq":0}"#
            ),
            Some(Said::Refused)
        );
        assert_eq!(
            Said::parse(
                br#"{"type":"err","seq":4,"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 1"}}"#
            ),
            Some(Said::Ending)
        );
        assert_eq!(
            Said::parse(br#"{"type":"gap","last_seq":4,"seq":5}"#),
            Some(Said::Ending)
        );
        // A flow of zero would stall the publisher: it counts as one.
        assert_eq!(
            Said::parse(br#"{"type":"ack","seq":7,"msgs":0}"#),
            Some(Said::Flow { seq: 7, flow: 1 })
        );
        assert_eq!(Said::parse(b"not json"), None);
    }
}
