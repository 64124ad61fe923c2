//! Reading and removing dead letters (`ax dlq list`, `ax dlq replay`); what a dead letter is
//! and the headers it carries are in [`crate::dead_letter`].

use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{DeleteMessageErrorKind, LastRawMessageErrorKind};
use async_nats::jetstream::ErrorCode;
use futures::{StreamExt, TryStreamExt};

use crate::client::{AxClient, ClientError};
use crate::dead_letter::DeadLetter;

/// Dead letters fetched at once when listing.
const FETCH_AHEAD: usize = 64;

impl AxClient {
    /// Every dead letter kept, oldest first.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>, ClientError> {
        let stream_name = self.layout.dead_stream();
        let err = |what: &str, e: String| ClientError::Nats {
            operation: format!("{what} {stream_name}"),
            reason: e,
        };
        let mut stream = self
            .js
            .get_stream(&stream_name)
            .await
            .map_err(|e| err("open", e.to_string()))?;
        let state = stream
            .info()
            .await
            .map_err(|e| err("read", e.to_string()))?
            .state
            .clone();
        if state.messages == 0 {
            return Ok(Vec::new());
        }
        let kept: Vec<Option<DeadLetter>> =
            futures::stream::iter(state.first_sequence..=state.last_sequence)
                .map(|seq| {
                    let stream = stream.clone();
                    async move {
                        match stream.get_raw_message(seq).await {
                            Ok(message) => Ok(Some(DeadLetter::from_stored(&message))),
                            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {
                                Ok(None)
                            }
                            Err(e) => Err(e.to_string()),
                        }
                    }
                })
                .buffered(FETCH_AHEAD)
                .try_collect()
                .await
                .map_err(|e| err("read", e))?;
        Ok(kept.into_iter().flatten().collect())
    }

    /// One dead letter with its payload and headers; `None` when there is no such id.
    pub async fn dead_letter(&self, id: u64) -> Result<Option<StreamMessage>, ClientError> {
        let stream_name = self.layout.dead_stream();
        let err = |e: String| ClientError::Nats {
            operation: format!("read dead letter {id} of {stream_name}"),
            reason: e,
        };
        let stream = self
            .js
            .get_stream(&stream_name)
            .await
            .map_err(|e| err(e.to_string()))?;
        match stream.get_raw_message(id).await {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(err(e.to_string())),
        }
    }

    /// Removes a dead letter (once it was replayed); false when it was gone already.
    pub async fn remove_dead_letter(&self, id: u64) -> Result<bool, ClientError> {
        let stream_name = self.layout.dead_stream();
        let err = |e: String| ClientError::Nats {
            operation: format!("remove dead letter {id} of {stream_name}"),
            reason: e,
        };
        let stream = self
            .js
            .get_stream(&stream_name)
            .await
            .map_err(|e| err(e.to_string()))?;
        match stream.delete_message(id).await {
            Ok(deleted) => Ok(deleted),
            Err(e)
                if matches!(e.kind(), DeleteMessageErrorKind::JetStream(ref js)
                    if js.error_code() == ErrorCode::NO_MESSAGE_FOUND) =>
            {
                Ok(false)
            }
            Err(e) => Err(err(e.to_string())),
        }
    }
}
