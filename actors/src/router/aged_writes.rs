//! The instance records' writes, read only once they are old: what the consistency sweep
//! follows instead of every write as it is made.
//!
//! Why: the sweep judges a record only after it stayed unchanged for a while, so it has no use
//! for a write until then — and by then most are gone. A finished no-op instance's final write
//! rolls up the two before it (see [`ax_bus::client::history`]), so a reader that comes by
//! late finds one message of the three; one that followed every write as it was made (each
//! record write's headers, delivered at once) took three deliveries an instance, the largest
//! cost of the sweep and a seventh of an instance's messages.
//!
//! Each bucket is read by an ephemeral pull consumer (no acknowledgements, headers only) from
//! the position the sweep's snapshot ended at; [`AgedWrites::older_than`] fetches the writes
//! stored before a cut-off, in order, and holds the few it fetched past it for the next call.
//! A consumer the server lost (a restart, an inactivity timeout) is made again from the
//! message after the last one read.

use std::collections::VecDeque;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, Consumer, DeliverPolicy};
use async_nats::jetstream::{self, stream::Stream};
use ax_bus::client::kv_view::FeedItem;
use ax_bus::error::NatsError;
use chrono::{DateTime, Utc};

use crate::jetstream::consume;
use crate::ActorError;

/// Writes fetched at once.
const FETCH: usize = 512;
/// How long the server keeps a consumer nobody fetches from (the sweep fetches every few
/// seconds).
const INACTIVE: Duration = Duration::from_secs(60);

/// One bucket's reader.
struct Reader {
    stream: Stream,
    prefix: String,
    consumer: Consumer<pull::Config>,
    /// The sequence of the next message to read.
    next: u64,
    /// Fetched, not yet old enough, in order.
    held: VecDeque<(DateTime<Utc>, FeedItem)>,
}

/// Readers of the instance buckets' writes, each from its own position.
pub(super) struct AgedWrites {
    readers: Vec<Reader>,
}

impl AgedWrites {
    /// Readers of `buckets`, each from the stream sequence given with it.
    pub(super) async fn open(
        js: &jetstream::Context,
        buckets: Vec<(String, u64)>,
    ) -> Result<Self, ActorError> {
        let mut readers = Vec::with_capacity(buckets.len());
        for (bucket, next) in buckets {
            let stream = js
                .get_stream(format!("KV_{bucket}"))
                .await
                .map_err(|e| failed("open the instances stream", e.into()))?;
            let consumer = consumer_from(&stream, next).await?;
            readers.push(Reader {
                stream,
                prefix: format!("$KV.{bucket}."),
                consumer,
                next,
                held: VecDeque::new(),
            });
        }
        Ok(Self { readers })
    }

    /// Every write stored before `cutoff` not read yet, bucket by bucket, each bucket's in
    /// order.
    pub(super) async fn older_than(
        &mut self,
        cutoff: DateTime<Utc>,
    ) -> Result<Vec<FeedItem>, ActorError> {
        let mut items = Vec::new();
        for reader in &mut self.readers {
            reader.older_than(cutoff, &mut items).await?;
        }
        Ok(items)
    }
}

impl Reader {
    async fn older_than(
        &mut self,
        cutoff: DateTime<Utc>,
        items: &mut Vec<FeedItem>,
    ) -> Result<(), ActorError> {
        loop {
            while self.held.front().is_some_and(|(at, _)| *at < cutoff) {
                if let Some((_, item)) = self.held.pop_front() {
                    items.push(item);
                }
            }
            if !self.held.is_empty() || !self.fetch().await? {
                return Ok(());
            }
        }
    }

    /// Fetches what is there now; false when nothing was.
    async fn fetch(&mut self) -> Result<bool, ActorError> {
        let batch = match self.fetch_batch().await {
            Ok(batch) => batch,
            Err(e) => {
                tracing::debug!(error = %e, "consistency: the writes' reader is made again");
                self.consumer = consumer_from(&self.stream, self.next).await?;
                self.fetch_batch().await?
            }
        };
        let fetched = !batch.is_empty();
        for message in batch {
            let Ok(info) = message.info() else {
                continue;
            };
            if info.stream_sequence < self.next {
                continue;
            }
            self.next = info.stream_sequence + 1;
            let at = ax_bus::time::from_server(info.published);
            self.held
                .push_back((at, FeedItem::of_message(&self.prefix, message)));
        }
        Ok(fetched)
    }

    async fn fetch_batch(&self) -> Result<Vec<jetstream::Message>, ActorError> {
        consume::fetch_now(&self.consumer, FETCH)
            .await
            .map_err(|e| failed("fetch the instances' writes", e))
    }
}

/// An ephemeral reader of `stream` from sequence `next`: headers only, nothing to acknowledge.
async fn consumer_from(stream: &Stream, next: u64) -> Result<Consumer<pull::Config>, ActorError> {
    stream
        .create_consumer(pull::Config {
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: next,
            },
            ack_policy: AckPolicy::None,
            headers_only: true,
            inactive_threshold: INACTIVE,
            memory_storage: true,
            ..Default::default()
        })
        .await
        .map_err(|e| failed("open a reader of the instances' writes", e.into()))
}

fn failed(what: &str, e: ax_bus::error::BoxError) -> ActorError {
    ActorError::from(NatsError::new(what, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ax_bus::client::local_server::{find_binary, LocalServer, ServerOptions};

    fn key_of(item: &FeedItem) -> String {
        match item {
            FeedItem::Put { key, .. } | FeedItem::Deleted { key } => key.clone(),
            FeedItem::Current => String::new(),
        }
    }

    /// Writes come by in order once older than the cut-off, each once — a write replaced by a
    /// rollup before it was read never comes by, and a reader the server lost is made again
    /// from the write after the last one read.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_come_by_once_when_old_and_a_lost_reader_goes_on_where_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let server = LocalServer::start(ServerOptions {
            binary: find_binary().unwrap(),
            port: None,
            store_dir: dir.path().join("store"),
            log_file: None,
            extra_args: Vec::new(),
        })
        .unwrap();
        let nats = async_nats::connect(&server.url).await.unwrap();
        let js = jetstream::new(nats);
        let bucket = js
            .create_key_value(jetstream::kv::Config {
                bucket: "records".into(),
                history: 5,
                ..Default::default()
            })
            .await
            .unwrap();
        bucket.put("a", "1".into()).await.unwrap();
        let mut writes = AgedWrites::open(&js, vec![("records".into(), 1)])
            .await
            .unwrap();
        bucket.put("b", "1".into()).await.unwrap();
        bucket.put("b", "2".into()).await.unwrap();
        let keys = |items: Vec<FeedItem>| {
            // Headers only: no write's value is delivered.
            assert!(items
                .iter()
                .all(|i| !matches!(i, FeedItem::Put { value, .. } if !value.is_empty())));
            items.iter().map(key_of).collect::<Vec<_>>()
        };
        let before = ax_bus::time::now() - chrono::Duration::hours(1);
        assert!(writes.older_than(before).await.unwrap().is_empty());
        let now = || ax_bus::time::now() + chrono::Duration::seconds(1);
        assert_eq!(
            keys(writes.older_than(now()).await.unwrap()),
            ["a", "b", "b"]
        );
        assert!(writes.older_than(now()).await.unwrap().is_empty());

        // `c` twice, the second a rollup: only it is left to come by.
        bucket.put("c", "1".into()).await.unwrap();
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Rollup", "sub");
        js.publish_with_headers("$KV.records.c", headers, "2".into())
            .await
            .unwrap()
            .await
            .unwrap();
        // The server loses the reader (a restart, its inactivity timeout).
        let stream = js.get_stream("KV_records").await.unwrap();
        let name = writes.readers[0].consumer.cached_info().name.clone();
        stream.delete_consumer(&name).await.unwrap();
        let items = writes.older_than(now()).await.unwrap();
        assert_eq!(keys(items), ["c"]);
        drop(server);
    }
}
