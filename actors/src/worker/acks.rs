//! The acknowledgements of dispatches to their Routers ("received, about to run"), sent
//! together: what gathers within [`LINGER`] of the first goes in one message per Router
//! ([`DispatchAcks`]). A burst of dispatches costs a few messages instead of one per attempt;
//! a lone acknowledgement is [`LINGER`] later, against a deadline of seconds. Best effort, as
//! each one was: a lost acknowledgement costs the Router a look at the record at the deadline.
//! The ends a Router asked to hear of ([`WorkItem::tell_end`](ax_bus::messages::WorkItem))
//! go the same way: a lost one costs it the freed slot until the next heartbeat.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::mpsc;

use ax_bus::ids::NodeId;
use ax_bus::messages::{DispatchAck, DispatchAcks};
use ax_bus::{codec, AxClient};

/// Most acknowledgements in one message.
const MOST: usize = 512;
/// How long the first acknowledgement waits for others to go with it.
const LINGER: Duration = Duration::from_millis(2);

/// What a worker tells a Router.
#[derive(Debug)]
enum Note {
    /// A dispatch was received.
    Ack(DispatchAck),
    /// An attempt of that Router's ended on this worker.
    Ended(DispatchAck),
}

/// Where attempts hand their acknowledgements; cheap to clone.
#[derive(Clone, Debug)]
pub(super) struct Acks {
    tx: mpsc::UnboundedSender<(NodeId, Note)>,
}

impl Acks {
    /// Starts the sender on the current runtime; it ends when every handle is dropped.
    pub(super) fn start(client: AxClient) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(send(client, rx));
        Self { tx }
    }

    /// Queues `ack` for `router`.
    pub(super) fn send(&self, router: &NodeId, ack: DispatchAck) {
        let _ = self.tx.send((router.clone(), Note::Ack(ack)));
    }

    /// Queues for `router` that the attempt of dispatch `end` ended.
    pub(super) fn ended(&self, router: &NodeId, end: DispatchAck) {
        let _ = self.tx.send((router.clone(), Note::Ended(end)));
    }
}

async fn send(client: AxClient, mut rx: mpsc::UnboundedReceiver<(NodeId, Note)>) {
    let mut gathered = Vec::with_capacity(MOST);
    while rx.recv_many(&mut gathered, MOST).await > 0 {
        if gathered.len() < MOST {
            tokio::time::sleep(LINGER).await;
            while gathered.len() < MOST {
                match rx.try_recv() {
                    Ok(ack) => gathered.push(ack),
                    Err(_) => break,
                }
            }
        }
        for (router, acks) in by_router(gathered.drain(..)) {
            let count = acks.acks.len() + acks.ended.len();
            let sent = match codec::encode(&acks) {
                Ok(payload) => client
                    .nats
                    .publish(client.subjects().ack(&router), payload)
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = sent {
                tracing::debug!(%router, count, error = %e, "acknowledgements not sent; the Router will read the records");
            }
        }
    }
}

/// The acknowledgements and ends grouped by Router, each group in the order made.
fn by_router(gathered: impl Iterator<Item = (NodeId, Note)>) -> BTreeMap<NodeId, DispatchAcks> {
    let mut groups: BTreeMap<NodeId, DispatchAcks> = BTreeMap::new();
    for (router, note) in gathered {
        let group = groups.entry(router).or_insert_with(|| DispatchAcks {
            acks: Vec::new(),
            ended: Vec::new(),
        });
        match note {
            Note::Ack(ack) => group.acks.push(ack),
            Note::Ended(end) => group.ended.push(end),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use ax_bus::ids::{DispatchId, TraceId, WorkerId};

    fn ack(trace: &str) -> DispatchAck {
        DispatchAck {
            trace_id: TraceId::parse(trace).unwrap(),
            dispatch: DispatchId::random(),
            worker: WorkerId::parse("w1").unwrap(),
        }
    }

    #[test]
    fn acknowledgements_go_one_message_per_router_in_the_order_made() {
        let (r1, r2) = (NodeId::parse("r1").unwrap(), NodeId::parse("r2").unwrap());
        let traces = ["a1", "b1", "a2", "a3"];
        let routers = [&r1, &r2, &r1, &r1];
        let gathered = traces
            .iter()
            .zip(routers)
            .map(|(t, r)| (r.clone(), Note::Ack(ack(&format!("{t:0>32}")))));
        let ended = (r2.clone(), Note::Ended(ack(&"e".repeat(32))));
        let groups = by_router(gathered.chain([ended]));
        let names = |router: &NodeId| -> Vec<String> {
            groups[router]
                .acks
                .iter()
                .map(|a| a.trace_id.to_string().trim_start_matches('0').to_string())
                .collect()
        };
        assert_eq!(groups.len(), 2);
        assert_eq!(names(&r1), ["a1", "a2", "a3"]);
        assert_eq!(names(&r2), ["b1"]);
        assert!(groups[&r1].ended.is_empty());
        let ended: Vec<String> = groups[&r2]
            .ended
            .iter()
            .map(|a| a.trace_id.to_string())
            .collect();
        assert_eq!(ended, ["e".repeat(32)]);
    }

    #[test]
    fn a_router_reads_a_batch_and_a_lone_acknowledgement_apart() {
        let lone = ack(&"c".repeat(32));
        let batch = DispatchAcks {
            acks: vec![lone.clone(), ack(&"d".repeat(32))],
            ended: vec![ack(&"e".repeat(32))],
        };
        let encoded = codec::encode(&batch).unwrap();
        assert_eq!(codec::decode::<DispatchAcks>(&encoded).unwrap(), batch);
        let encoded = codec::encode(&lone).unwrap();
        assert!(codec::decode::<DispatchAcks>(&encoded).is_err());
        assert_eq!(codec::decode::<DispatchAck>(&encoded).unwrap(), lone);
    }
}
