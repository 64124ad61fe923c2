//! Reading attempt logs (see [`crate::log`]): as stored now, or followed as they are shipped.

use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use futures::{Stream, StreamExt};

use crate::client::kv_view::{FeedItem, KvFeed};
use crate::client::{AxClient, ClientError};
use crate::codec;
use crate::error::{NatsError, Reason};
use crate::ids::InstanceId;
use crate::log::{AttemptLog, LogChunk};

/// How long reading a stored log may take.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// An item of a followed log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogItem {
    /// A chunk (possibly one already delivered: see [`AttemptLog::add`]), with its sequence in
    /// the stream (to follow on from it later: [`AxClient::follow_log_after`]).
    Chunk(LogChunk, u64),
    /// Every chunk stored when the follow started has been delivered.
    Current,
}

impl AxClient {
    /// Attempt `attempt` of instance `id`'s log as stored now (empty if the attempt wrote
    /// nothing, has not started, or its log is past the retention).
    pub async fn attempt_log(
        &self,
        id: &InstanceId,
        attempt: u32,
    ) -> Result<AttemptLog, ClientError> {
        Ok(self.attempt_log_after(id, attempt, 0).await?.0)
    }

    /// The chunks of attempt `attempt` of instance `id`'s log stored after stream sequence
    /// `after` (0: all), and the stream sequence of the last one (`after` if none).
    pub async fn attempt_log_after(
        &self,
        id: &InstanceId,
        attempt: u32,
        after: u64,
    ) -> Result<(AttemptLog, u64), ClientError> {
        let read = async {
            let mut log = AttemptLog::default();
            let mut last = after;
            let mut feed = Box::pin(self.follow_log_after(id, attempt, after).await?);
            while let Some(item) = feed.next().await {
                match item? {
                    LogItem::Chunk(chunk, sequence) => {
                        last = last.max(sequence);
                        log.add(chunk);
                    }
                    LogItem::Current => break,
                }
            }
            Ok::<_, ClientError>((log, last))
        };
        tokio::time::timeout(READ_TIMEOUT, read)
            .await
            .map_err(|_| {
                let what = format!("read the log of {id} attempt {attempt}");
                NatsError::new(what, Reason(format!("no end within {READ_TIMEOUT:?}")))
            })?
    }

    /// Follows attempt `attempt` of instance `id`'s log: the chunks stored, [`LogItem::Current`],
    /// then each chunk as it is shipped (the stream does not end by itself: stop at the chunk
    /// with an end, or when the attempt is over).
    pub async fn follow_log(
        &self,
        id: &InstanceId,
        attempt: u32,
    ) -> Result<impl Stream<Item = Result<LogItem, ClientError>> + Send + 'static, ClientError>
    {
        self.follow_log_after(id, attempt, 0).await
    }

    /// [`AxClient::follow_log`] from the chunks stored after stream sequence `after` (0: all).
    pub async fn follow_log_after(
        &self,
        id: &InstanceId,
        attempt: u32,
        after: u64,
    ) -> Result<impl Stream<Item = Result<LogItem, ClientError>> + Send + 'static, ClientError>
    {
        let subject = self.subjects().log(id.as_str(), attempt);
        let deliver = match after {
            0 => DeliverPolicy::All,
            after => DeliverPolicy::ByStartSequence {
                start_sequence: after + 1,
            },
        };
        let feed = KvFeed::open_stream(&self.js, &self.layout.logs_stream(), "", &subject, deliver)
            .await?;
        Ok(feed.into_stream().filter_map(|item| {
            futures::future::ready(match item {
                Ok(FeedItem::Put {
                    value, revision, ..
                }) => Some(
                    codec::decode::<LogChunk>(&value)
                        .map(|chunk| LogItem::Chunk(chunk, revision))
                        .map_err(ClientError::from),
                ),
                Ok(FeedItem::Current) => Some(Ok(LogItem::Current)),
                Ok(FeedItem::Deleted { .. }) => None,
                Err(e) => Some(Err(ClientError::from(e))),
            })
        }))
    }
}
