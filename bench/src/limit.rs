//! The limit: raw JetStream with the same client ax uses — publish with acks awaited in windows
//! of 1024, and pull-consume with acks — in messages per second. Every other figure is read
//! against these. Beside them, for comparison only, the same messages published as one of ax's
//! bursts (a fast-ingest batch): what answering every 512 messages instead of each is worth.

use std::time::Instant;

use crate::Result;
use async_nats::jetstream::{self, consumer::pull, stream};
use futures::StreamExt;

use ax_actors::jetstream::burst::{self, Item};

use crate::cpu::Snapshot;
use crate::Figure;

const WINDOW: usize = 1024;
const PAYLOAD: usize = 256;

/// Messages published and consumed.
fn count(quick: bool) -> usize {
    if quick {
        20_000
    } else {
        200_000
    }
}

/// The raw rates, and what the publishes cost in CPU.
pub(crate) struct Rates {
    pub(crate) publish: f64,
    pub(crate) consume: f64,
    /// CPU per windowed publish, in µs: the publishing client's (this process) and the
    /// server's.
    pub(crate) publish_cpu: (f64, f64),
}

/// Publishes then consumes `count` messages, nats-server `server` measured for CPU.
pub(crate) async fn rates(
    nats: &async_nats::Client,
    quick: bool,
    server: Option<u32>,
) -> Result<Rates> {
    let js = jetstream::new(nats.clone());
    let _ = js.delete_stream("BENCH_RAW").await;
    let stream = js
        .create_stream(stream::Config {
            name: "BENCH_RAW".parse()?,
            subjects: vec!["bench.raw".into()],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await?;
    let n = count(quick);
    let payload = bytes::Bytes::from(vec![7u8; PAYLOAD]);
    let cpu_before = Snapshot::take(server.as_slice())?;
    let started = Instant::now();
    let mut acks = Vec::with_capacity(WINDOW);
    for _ in 0..n {
        acks.push(js.publish("bench.raw", payload.clone()).await?);
        if acks.len() == WINDOW {
            for ack in acks.drain(..) {
                ack.await?;
            }
        }
    }
    for ack in acks.drain(..) {
        ack.await?;
    }
    let publish = n as f64 / started.elapsed().as_secs_f64();
    let publish_cpu = Snapshot::take(server.as_slice())?.per(&cpu_before, n);
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("bench".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    let started = Instant::now();
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(512)
        .messages()
        .await?;
    let mut seen = 0;
    while seen < n {
        let Some(message) = messages.next().await else {
            break;
        };
        message?.ack().await?;
        seen += 1;
    }
    let consume = seen as f64 / started.elapsed().as_secs_f64();
    js.delete_stream("BENCH_RAW").await?;
    Ok(Rates {
        publish,
        consume,
        publish_cpu,
    })
}

pub(crate) async fn measure(
    nats: &async_nats::Client,
    quick: bool,
    server: Option<u32>,
) -> Result<(Vec<Figure>, Rates)> {
    let rates = rates(nats, quick, server).await?;
    let Rates {
        publish,
        consume,
        publish_cpu: (client, broker),
    } = rates;
    let n = count(quick);
    let figures = vec![
        Figure {
            section: "limit",
            name: "publish, acks in windows of 1024".into(),
            value: publish,
            unit: "msg/s",
            note: format!("{n} messages of {PAYLOAD} B, file storage"),
        },
        Figure {
            section: "limit",
            name: "pull consume + ack".into(),
            value: consume,
            unit: "msg/s",
            note: format!("{n} messages, batches of 512"),
        },
        Figure {
            section: "limit",
            name: "CPU per raw publish".into(),
            value: client + broker,
            unit: "µs",
            note: format!(
                "client {client:.1} µs + nats-server {broker:.1} µs, acks in windows of 1024"
            ),
        },
    ];
    Ok((figures, rates))
}

/// Publishes as many messages as the windowed publish, as one burst of ax's (each with its
/// message id, as ax's are); the rate, from the first publish to the last answer.
pub(crate) async fn batched(url: &str, quick: bool) -> Result<Figure> {
    let client = crate::client_for(url, "rawbatch").await?;
    let _ = client.js.delete_stream("BENCH_RAW_BATCH").await;
    client
        .js
        .create_stream(stream::Config {
            name: "BENCH_RAW_BATCH".parse()?,
            subjects: vec!["bench.batch".into()],
            storage: stream::StorageType::File,
            allow_batch_publish: true,
            ..Default::default()
        })
        .await?;
    let n = count(quick);
    // MessagePack of 253 small numbers: 256 bytes, as the windowed publish's payload.
    let payload = vec![7u8; PAYLOAD - 3];
    let items = (0..n)
        .map(|i| Item::new("bench.batch".into(), &format!("raw-{i}"), &payload))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let started = Instant::now();
    for stored in burst::publish(&client, items) {
        stored.await?;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    client.js.delete_stream("BENCH_RAW_BATCH").await?;
    Ok(Figure {
        section: "limit",
        name: "publish in one fast-ingest batch".into(),
        value: rate,
        unit: "msg/s",
        note: format!(
            "{n} messages of {PAYLOAD} B with message ids, as ax's bursts; for comparison, not a ratio's base"
        ),
    })
}
