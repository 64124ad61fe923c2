//! Reading, republishing and removing dead letters (`ax dlq list`; a replay is carried out by
//! a Scheduler, see `ax.control.replay`); what a dead letter is
//! and the headers it carries are in [`crate::dead_letter`].

use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{DeleteMessageErrorKind, LastRawMessageErrorKind};
use async_nats::jetstream::ErrorCode;
use futures::{StreamExt, TryStreamExt};

use async_nats::jetstream::message::PublishMessage;

use crate::client::{AxClient, ClientError};
use crate::dead_letter::{self, DeadLetter};
use crate::error::{BoxError, During, NatsError};
use crate::msg_id;

/// Dead letters fetched at once when listing.
const FETCH_AHEAD: usize = 64;

impl AxClient {
    /// Every dead letter kept, oldest first.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>, ClientError> {
        let stream_name = self.layout.dead_stream();
        let err = |what: &str, e: BoxError| {
            ClientError::from(NatsError::new(format!("{what} {stream_name}"), e))
        };
        let mut stream = self
            .js
            .get_stream(&stream_name)
            .await
            .map_err(|e| err("open", e.into()))?;
        let state = stream
            .info()
            .await
            .map_err(|e| err("read", e.into()))?
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
                            Err(e) => Err(BoxError::from(e)),
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
        let err = |e: BoxError| {
            ClientError::from(NatsError::new(
                format!("read dead letter {id} of {stream_name}"),
                e,
            ))
        };
        let stream = self
            .js
            .get_stream(&stream_name)
            .await
            .map_err(|e| err(e.into()))?;
        match stream.get_raw_message(id).await {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(err(e.into())),
        }
    }

    /// Removes a dead letter (once it was replayed); false when it was gone already.
    pub async fn remove_dead_letter(&self, id: u64) -> Result<bool, ClientError> {
        let stream_name = self.layout.dead_stream();
        let err = |e: BoxError| {
            ClientError::from(NatsError::new(
                format!("remove dead letter {id} of {stream_name}"),
                e,
            ))
        };
        let stream = self
            .js
            .get_stream(&stream_name)
            .await
            .map_err(|e| err(e.into()))?;
        match stream.delete_message(id).await {
            Ok(deleted) => Ok(deleted),
            Err(e)
                if matches!(e.kind(), DeleteMessageErrorKind::JetStream(ref js)
                    if js.error_code() == ErrorCode::NO_MESSAGE_FOUND) =>
            {
                Ok(false)
            }
            Err(e) => Err(err(e.into())),
        }
    }
}

impl AxClient {
    /// Puts dead letter `id` (`stored`) back on `subject` as it came, its original headers
    /// without those ax added; de-duplicated by the letter, so a replay repeated after a lost
    /// answer publishes it once.
    pub async fn republish_dead_letter(
        &self,
        id: u64,
        subject: &str,
        stored: &StreamMessage,
    ) -> Result<(), ClientError> {
        let publish = PublishMessage::build()
            .headers(dead_letter::original_headers(&stored.headers))
            .message_id(msg_id::replay(&self.layout.dead_stream(), id))
            .payload(stored.payload.clone());
        self.js
            .send_publish(subject.to_string(), publish)
            .await
            .during(|| format!("publish on {subject}"))?
            .await
            .during(|| format!("publish on {subject}"))?;
        Ok(())
    }
}
