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

impl FeedItem {
    /// The item a bucket's stream message is: its key is its subject past `prefix`
    /// (`$KV.<bucket>.`); a delete or purge marker is [`FeedItem::Deleted`].
    pub fn of_message(prefix: &str, message: jetstream::Message) -> Self {
        let key = message
            .subject
            .strip_prefix(prefix)
            .unwrap_or(message.subject.as_str())
            .to_string();
        let deleted = message
            .headers
            .as_ref()
            .and_then(|h| h.get("KV-Operation"))
            .is_some_and(|v| matches!(v.as_str(), "DEL" | "PURGE"));
        if deleted {
            return FeedItem::Deleted { key };
        }
        let (revision, at) = message
            .info()
            .map(|i| (i.stream_sequence, crate::time::from_server(i.published)))
            .unwrap_or_else(|_| (0, crate::time::now()));
        let message = message.message;
        FeedItem::Put {
            key,
            value: message.payload,
            revision,
            at,
            headers: message.headers,
        }
    }
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
    /// The connection, the filters to read on with and whether the consumer delivers headers
    /// only, to make it again.
    client: async_nats::Client,
    filters: Filters,
    headers_only: bool,
    /// Whether the consumer delivers the last value per key; such a one is replaced by one
    /// reading on from the last message delivered once the caller reads past the snapshot.
    last_per_key: bool,
    /// After a failed swap, when to try again (meanwhile the feed reads on its consumer).
    swap_again_at: Option<std::time::Instant>,
    /// The stream's last sequence when the feed opened, and the last one delivered.
    last_at_open: u64,
    last_delivered: u64,
}

/// A consumer's subject filters: one, or several.
#[derive(Clone)]
struct Filters {
    one: String,
    several: Vec<String>,
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

/// How long a feed whose consumer could not be swapped (see `KvFeed::read_on`) reads on with
/// the one it has before it tries again.
const SWAP_AGAIN_AFTER: Duration = Duration::from_secs(5);

impl std::fmt::Debug for KvFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvFeed")
            .field("bucket", &self.bucket)
            .field("consumer", &self.consumer_name)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// A feed dropped before it was closed deletes its consumer on a task: a server keeps an
/// ordered consumer for 30 s after its reader went, and while it stays each purge of its
/// stream makes the server count its pending messages again (see `KvFeed::read_on`).
impl Drop for KvFeed {
    fn drop(&mut self) {
        let name = std::mem::take(&mut self.consumer_name);
        if name.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let source = self.source.clone();
            runtime.spawn(async move {
                let _ = source.delete_consumer(&name).await;
            });
        }
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
        let mut source = js.get_stream(stream).await.map_err(|e| err(e.into()))?;
        let last_at_open = source.cached_info().state.last_sequence;
        let all_of_stream = patterns == [">".to_string()]
            && source.cached_info().config.subjects == [format!("{prefix}>")];
        let mut several: Vec<String> = patterns.iter().map(|p| format!("{prefix}{p}")).collect();
        let filters = match several.len() {
            1 => Filters {
                one: several.remove(0),
                several: Vec::new(),
            },
            _ => Filters {
                one: String::new(),
                several,
            },
        };
        // Read on over the whole stream without a filter, for which the server counts a
        // consumer's pending messages by its blocks instead of by every subject it holds (see
        // `Self::read_on`); the last value per key needs one.
        let live_filters = if all_of_stream {
            Filters {
                one: String::new(),
                several: Vec::new(),
            }
        } else {
            filters.clone()
        };
        let client = js.client();
        let consumer = Self::consumer(&client, &mut source, &filters, deliver_policy, headers_only)
            .await
            .map_err(err)?;
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
            client,
            filters: live_filters,
            headers_only,
            last_per_key: deliver_policy == consumer::DeliverPolicy::LastPerSubject,
            swap_again_at: None,
            last_at_open,
            last_delivered: 0,
        })
    }

    async fn consumer(
        client: &async_nats::Client,
        source: &mut jetstream::stream::Stream,
        filters: &Filters,
        deliver_policy: consumer::DeliverPolicy,
        headers_only: bool,
    ) -> Result<consumer::Consumer<consumer::push::OrderedConfig>, crate::error::BoxError> {
        let deliver_subject = client.new_inbox();
        Ok(source
            .create_consumer(consumer::push::OrderedConfig {
                deliver_subject,
                filter_subject: filters.one.clone(),
                filter_subjects: filters.several.clone(),
                deliver_policy,
                replay_policy: consumer::ReplayPolicy::Instant,
                headers_only,
                ..Default::default()
            })
            .await?)
    }

    /// Once past the snapshot, replaces a consumer that delivers the last value per key by one
    /// that reads on from the message after the last delivered (or after the stream's last
    /// when the feed opened: what lies between was replaced or removed before the snapshot).
    ///
    /// Why: the server counts the pending messages of every consumer of a stream again each
    /// time part of it is purged — a bucket's key rolled up (a record folding its revisions) or
    /// purged (a record past its retention) — and for one that delivers the last value per key
    /// it counts them subject by subject: a follower of the instances bucket made each such
    /// write cost the server a walk over every key it holds (a sixth of the throughput, with
    /// 20,000 keys). If the new consumer cannot be made, the feed keeps the one it has.
    async fn read_on(&mut self) {
        match self.consumer_reading_on().await {
            Ok((name, messages)) => {
                let old = std::mem::replace(&mut self.consumer_name, name);
                self.messages = messages;
                self.last_per_key = false;
                let _ = self.source.delete_consumer(&old).await;
            }
            Err(e) => {
                tracing::warn!(bucket = %self.bucket, error = %e, "feed: keeps its consumer");
                self.swap_again_at = Some(std::time::Instant::now() + SWAP_AGAIN_AFTER);
            }
        }
    }

    /// A consumer from the message after the last one delivered, its name and its messages.
    async fn consumer_reading_on(
        &mut self,
    ) -> Result<(String, consumer::push::Ordered), crate::error::BoxError> {
        let start_sequence = self.position();
        let policy = consumer::DeliverPolicy::ByStartSequence { start_sequence };
        let consumer = Self::consumer(
            &self.client,
            &mut self.source,
            &self.filters,
            policy,
            self.headers_only,
        )
        .await?;
        let name = consumer.cached_info().name.clone();
        Ok((name, consumer.messages().await?))
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

    /// The stream sequence to read on from: the one after the last message delivered, or
    /// after the stream's last when the feed opened (what lies between was replaced or removed
    /// before the snapshot was taken). Once the feed delivered [`FeedItem::Current`], a reader
    /// starting there misses no change after the snapshot.
    pub fn position(&self) -> u64 {
        self.last_delivered.max(self.last_at_open) + 1
    }

    /// Deletes the server-side consumer (best effort).
    async fn close(mut self) {
        let name = std::mem::take(&mut self.consumer_name);
        let _ = self.source.delete_consumer(&name).await;
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
        let swap_due = self
            .swap_again_at
            .is_none_or(|at| std::time::Instant::now() >= at);
        if self.phase == Phase::Live && self.last_per_key && swap_due {
            self.read_on().await;
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
        if let Ok(info) = message.info() {
            self.last_delivered = self.last_delivered.max(info.stream_sequence);
        }
        Some(Ok(FeedItem::of_message(&self.prefix, message)))
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

/// A feed's items as a boxed stream.
type ItemStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<FeedItem, FeedError>> + Send>>;

/// Feeds over several buckets read as one (the instance records' buckets, see
/// [`crate::client::instance_buckets`]): each one's snapshot, or each one's items as they come
/// with [`FeedItem::Current`] once, when every one has delivered its own. A key lives in one
/// bucket, so its items keep their order; a revision is its own bucket's.
#[derive(Debug)]
pub struct MergedFeed {
    feeds: Vec<KvFeed>,
}

impl MergedFeed {
    /// The feeds, read as one.
    pub fn new(feeds: Vec<KvFeed>) -> Self {
        Self { feeds }
    }

    /// The feeds as one stream (for consumers that wrap streams, like the actors' pumps);
    /// it ends when every feed ended (the connection closed for good).
    pub fn into_stream(self) -> ItemStream {
        let mut snapshots_due = self.feeds.len();
        let items = futures::stream::select_all(self.feeds.into_iter().map(KvFeed::into_stream));
        Box::pin(items.filter_map(move |item| {
            let item = match item {
                // One marker, once the last feed's snapshot is in.
                Ok(FeedItem::Current) => {
                    snapshots_due = snapshots_due.saturating_sub(1);
                    (snapshots_due == 0).then_some(Ok(FeedItem::Current))
                }
                other => Some(other),
            };
            std::future::ready(item)
        }))
    }

    /// Collects the current values of every feed (their snapshots) and closes them.
    pub async fn snapshot(self) -> Result<Vec<(String, Bytes, u64)>, FeedError> {
        let snapshots =
            futures::future::join_all(self.feeds.into_iter().map(KvFeed::snapshot)).await;
        let mut values = Vec::new();
        for snapshot in snapshots {
            values.extend(snapshot?);
        }
        Ok(values)
    }
}
