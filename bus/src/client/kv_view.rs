//! Reading a bucket (or a stream) as "current values, then every change": how actors rebuild
//! their views (job registry, worker registry, DAG state, last ticks) after a start or restart,
//! and how the CLI lists keys and histories.
//!
//! async-nats's own watch does not say when the initial values are all delivered if the bucket
//! is empty; [`KvFeed`] does, with an explicit [`FeedItem::Current`] marker.

use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use bytes::Bytes;
use futures::StreamExt;

/// One item of a feed.
#[derive(Debug)]
pub enum FeedItem {
    /// A key's value was put.
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Bytes,
        /// Its revision (stream sequence).
        revision: u64,
        /// When the server stored it.
        at: chrono::DateTime<chrono::Utc>,
        /// The headers it was written with.
        headers: Option<async_nats::HeaderMap>,
    },
    /// A key was deleted or purged.
    Deleted {
        /// The key.
        key: String,
    },
    /// Every value that existed when the feed started has been delivered.
    Current,
}

/// A feed over a bucket's keys matching a pattern.
pub struct KvFeed {
    bucket: String,
    /// The stream and the consumer's name, to delete the consumer once a snapshot is read
    /// (an ordered consumer would otherwise linger on the server for 30 s).
    source: jetstream::stream::Stream,
    consumer_name: String,
    messages: consumer::push::Ordered,
    prefix: String,
    phase: Phase,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The initial values are still arriving.
    Snapshot,
    /// The snapshot is complete but the marker is not yet delivered.
    MarkerDue,
    /// Following changes.
    Live,
}

/// A feed could not be opened or broke.
#[derive(Debug, thiserror::Error)]
#[error("reading {bucket}: {source}")]
pub struct FeedError {
    /// The bucket or stream.
    pub bucket: String,
    /// Why.
    #[source]
    pub source: crate::error::BoxError,
}

/// Whether the server says messages wait for the consumer `name` of `source` (false when it
/// cannot tell: the consumer was made again under another name, or the server does not answer).
async fn server_has_pending(source: jetstream::stream::Stream, name: &str) -> bool {
    match source.consumer_info(name).await {
        Ok(info) => info.num_pending > 0,
        Err(_) => false,
    }
}

/// When the snapshot phase sees nothing for this long and the server has nothing pending for
/// it, the rest was removed meanwhile (expired or purged before delivery): the snapshot is
/// complete.
const SNAPSHOT_IDLE: Duration = Duration::from_secs(2);

impl std::fmt::Debug for KvFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvFeed")
            .field("bucket", &self.bucket)
            .field("consumer", &self.consumer_name)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl KvFeed {
    /// Opens a feed over keys of `bucket` matching `pattern` (`>` for all).
    pub async fn open(
        js: &jetstream::Context,
        bucket: &str,
        pattern: &str,
    ) -> Result<Self, FeedError> {
        Self::open_bucket(js, bucket, pattern, false).await
    }

    /// [`KvFeed::open`] delivering the headers of each write without its value (every
    /// [`FeedItem::Put`] has an empty value): for followers that need to know only that a key
    /// changed, and what its writer said of it in a header.
    pub async fn open_headers_only(
        js: &jetstream::Context,
        bucket: &str,
        pattern: &str,
    ) -> Result<Self, FeedError> {
        Self::open_bucket(js, bucket, pattern, true).await
    }

    /// [`KvFeed::open`] over the keys that match any of `patterns` (at least one).
    pub async fn open_any(
        js: &jetstream::Context,
        bucket: &str,
        patterns: &[String],
    ) -> Result<Self, FeedError> {
        let (stream, prefix) = (format!("KV_{bucket}"), format!("$KV.{bucket}."));
        let last = consumer::DeliverPolicy::LastPerSubject;
        Self::open_with(js, &stream, &prefix, patterns, last, false).await
    }

    async fn open_bucket(
        js: &jetstream::Context,
        bucket: &str,
        pattern: &str,
        headers_only: bool,
    ) -> Result<Self, FeedError> {
        let (stream, prefix) = (format!("KV_{bucket}"), format!("$KV.{bucket}."));
        let last = consumer::DeliverPolicy::LastPerSubject;
        let patterns = [pattern.to_string()];
        Self::open_with(js, &stream, &prefix, &patterns, last, headers_only).await
    }

    /// Opens a feed over the messages of `stream` whose subjects are `prefix` + `pattern`; keys
    /// are what follows `prefix`. With `LastPerSubject` it reads like a bucket; with `All` it
    /// gives every message kept (a history).
    pub async fn open_stream(
        js: &jetstream::Context,
        stream: &str,
        prefix: &str,
        pattern: &str,
        deliver_policy: consumer::DeliverPolicy,
    ) -> Result<Self, FeedError> {
        let patterns = [pattern.to_string()];
        Self::open_with(js, stream, prefix, &patterns, deliver_policy, false).await
    }

    async fn open_with(
        js: &jetstream::Context,
        stream: &str,
        prefix: &str,
        patterns: &[String],
        deliver_policy: consumer::DeliverPolicy,
        headers_only: bool,
    ) -> Result<Self, FeedError> {
        let err = |source: crate::error::BoxError| FeedError {
            bucket: stream.to_string(),
            source,
        };
        let source = js.get_stream(stream).await.map_err(|e| err(e.into()))?;
        let mut filters: Vec<String> = patterns.iter().map(|p| format!("{prefix}{p}")).collect();
        let (filter_subject, filter_subjects) = match filters.len() {
            1 => (filters.remove(0), Vec::new()),
            _ => (String::new(), filters),
        };
        let consumer = source
            .create_consumer(consumer::push::OrderedConfig {
                deliver_subject: js.client().new_inbox(),
                filter_subject,
                filter_subjects,
                deliver_policy,
                replay_policy: consumer::ReplayPolicy::Instant,
                headers_only,
                ..Default::default()
            })
            .await
            .map_err(|e| err(e.into()))?;
        let phase = if consumer.cached_info().num_pending == 0 {
            Phase::MarkerDue
        } else {
            Phase::Snapshot
        };
        let consumer_name = consumer.cached_info().name.clone();
        let messages = consumer.messages().await.map_err(|e| err(e.into()))?;
        Ok(Self {
            bucket: stream.to_string(),
            source,
            consumer_name,
            messages,
            prefix: prefix.to_string(),
            phase,
        })
    }

    /// Every message kept (not only the last per key), in order, until the snapshot is complete.
    pub async fn history(mut self) -> Result<Vec<(String, Bytes)>, FeedError> {
        let mut values = Vec::new();
        while let Some(item) = self.next().await {
            match item? {
                FeedItem::Put { key, value, .. } => values.push((key, value)),
                FeedItem::Deleted { .. } => {}
                FeedItem::Current => break,
            }
        }
        self.close().await;
        Ok(values)
    }

    /// Deletes the server-side consumer (best effort).
    async fn close(self) {
        let _ = self.source.delete_consumer(&self.consumer_name).await;
    }

    /// The feed as a stream (for consumers that wrap streams, like the actors' pumps).
    pub fn into_stream(
        self,
    ) -> std::pin::Pin<Box<dyn futures::Stream<Item = Result<FeedItem, FeedError>> + Send>> {
        Box::pin(futures::stream::unfold(self, |mut feed| async move {
            feed.next().await.map(|item| (item, feed))
        }))
    }

    /// The next item; `None` when the feed ended (the connection closed for good).
    pub async fn next(&mut self) -> Option<Result<FeedItem, FeedError>> {
        if self.phase == Phase::MarkerDue {
            self.phase = Phase::Live;
            return Some(Ok(FeedItem::Current));
        }
        let message = if self.phase == Phase::Snapshot {
            loop {
                match tokio::time::timeout(SNAPSHOT_IDLE, self.messages.next()).await {
                    Ok(message) => break message,
                    // Idle is not the end while the server still has messages for this
                    // consumer (a leader change or a loaded server pauses delivery): ended
                    // there, the snapshot would leave values out and hand them on as changes.
                    Err(_)
                        if server_has_pending(self.source.clone(), &self.consumer_name).await =>
                    {
                        continue
                    }
                    Err(_) => {
                        self.phase = Phase::Live;
                        return Some(Ok(FeedItem::Current));
                    }
                }
            }
        } else {
            self.messages.next().await
        }?;
        let message = match message {
            Ok(message) => message,
            Err(e) => {
                return Some(Err(FeedError {
                    bucket: self.bucket.clone(),
                    source: e.into(),
                }))
            }
        };
        if self.phase == Phase::Snapshot && message.info().map(|i| i.pending == 0).unwrap_or(true) {
            self.phase = Phase::MarkerDue;
        }
        let key = message
            .subject
            .strip_prefix(self.prefix.as_str())
            .unwrap_or(message.subject.as_str())
            .to_string();
        let deleted = message
            .headers
            .as_ref()
            .and_then(|h| h.get("KV-Operation"))
            .is_some_and(|v| matches!(v.as_str(), "DEL" | "PURGE"));
        if deleted {
            return Some(Ok(FeedItem::Deleted { key }));
        }
        let (revision, at) = message
            .info()
            .map(|i| (i.stream_sequence, crate::time::from_server(i.published)))
            .unwrap_or_else(|_| (0, crate::time::now()));
        let message = message.message;
        Some(Ok(FeedItem::Put {
            key,
            value: message.payload,
            revision,
            at,
            headers: message.headers,
        }))
    }

    /// Collects the current values (the snapshot) and closes the feed.
    pub async fn snapshot(self) -> Result<Vec<(String, Bytes, u64)>, FeedError> {
        Ok(self
            .snapshot_timed()
            .await?
            .into_iter()
            .map(|(k, v, r, _)| (k, v, r))
            .collect())
    }

    /// [`KvFeed::snapshot`], with when each value was stored.
    pub async fn snapshot_timed(
        mut self,
    ) -> Result<Vec<(String, Bytes, u64, chrono::DateTime<chrono::Utc>)>, FeedError> {
        let mut values = std::collections::BTreeMap::new();
        while let Some(item) = self.next().await {
            match item? {
                FeedItem::Put {
                    key,
                    value,
                    revision,
                    at,
                    ..
                } => {
                    values.insert(key, (value, revision, at));
                }
                FeedItem::Deleted { key } => {
                    values.remove(&key);
                }
                FeedItem::Current => break,
            }
        }
        self.close().await;
        Ok(values
            .into_iter()
            .map(|(k, (v, r, at))| (k, v, r, at))
            .collect())
    }
}
