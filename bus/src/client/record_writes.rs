//! How instance records are written: every write names the record's state in a header
//! ([`STATE_HEADER`]) beside its compare-and-swap.
//!
//! Why: the janitor's consistency sweep follows every write of the instances bucket to know
//! which records are still open, and most of them close within a second. Reading the state from
//! a header, it follows the bucket with headers only (about 100 bytes a write instead of the
//! whole record, 700 bytes for a no-op instance) and reads a record only once it has stayed
//! open and unchanged long enough to be looked at. A write without the header (an earlier
//! version's, a foreign writer's) is taken as open: it costs that read, never a missed record.

use async_nats::jetstream::context::{PublishAckFuture, PublishError, PublishErrorKind};
use async_nats::jetstream::kv::Operation;
use async_nats::jetstream::message::PublishMessage;
use async_nats::HeaderMap;

use crate::client::{AxClient, ClientError};
use crate::codec::{self, CodecError};
use crate::error::{During, NatsError, Reason};
use crate::ids::{InstanceId, TraceId};
use crate::instance::{InstanceRecord, State};

/// The header of an instance record's write that names its state (`running`, `success`, …).
pub const STATE_HEADER: &str = "Ax-State";

/// The message that writes `record` if the key's last revision is `expected` (0: the key has
/// no value). A record that folds its earlier revisions ([`crate::history::prepare_write`])
/// replaces them: the server removes them as it stores it (a rollup of the key's subject).
fn record_message(record: &InstanceRecord, expected: u64) -> Result<PublishMessage, CodecError> {
    let message = PublishMessage::build()
        .expected_last_subject_sequence(expected)
        .header(STATE_HEADER, record.state.as_str());
    let message = if record.folded.is_some() {
        message.header("Nats-Rollup", "sub")
    } else {
        message
    };
    Ok(message.payload(codec::encode(record)?))
}

/// The state a write's headers name, if they name one.
pub fn state_of(headers: Option<&HeaderMap>) -> Option<State> {
    headers?.get(STATE_HEADER)?.as_str().parse().ok()
}

/// Whether a write was refused because the key's last revision was not the one expected. The
/// server answers 10071 or, in some cases since 2.12, 10164 (the same refusal without the
/// sequence in its text), which async-nats does not classify.
pub fn wrong_last_sequence(error: &PublishError) -> bool {
    error.kind() == PublishErrorKind::WrongLastSequence
        || std::error::Error::source(error)
            .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>())
            .is_some_and(|e| {
                e.error_code()
                    == async_nats::jetstream::ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT
            })
}

/// How a create-if-absent ended.
#[derive(Debug)]
pub(crate) enum Created {
    /// This record is stored.
    Written,
    /// The key holds a record, of this attempt (its earlier write, whose ack was lost) or
    /// another: the stored record's trace id.
    Exists(TraceId),
}

impl AxClient {
    /// Publishes `record` under `id` if that key's last revision is `expected`, without
    /// waiting: the returned future is the server's answer (for writers that pipeline). A
    /// final record is noted for its retention first (see [`crate::client::retention`]).
    pub async fn publish_record(
        &self,
        id: &InstanceId,
        record: &InstanceRecord,
        expected: u64,
    ) -> Result<PublishAckFuture, ClientError> {
        if record.state.is_final() {
            self.note_final(id, record).await?;
        }
        let subject = self.instances.subject_of(id);
        Ok(self
            .js
            .send_publish(subject, record_message(record, expected)?)
            .await
            .during(|| format!("write instance {id}"))?)
    }

    /// Writes `record` under `id` if that key's last revision is `expected`: its new revision,
    /// or `None` when the key moved on.
    pub(crate) async fn write_record(
        &self,
        id: &InstanceId,
        record: &InstanceRecord,
        expected: u64,
    ) -> Result<Option<u64>, ClientError> {
        match self.publish_record(id, record, expected).await?.await {
            Ok(ack) => Ok(Some(ack.sequence)),
            Err(e) if wrong_last_sequence(&e) => Ok(None),
            Err(e) => Err(NatsError::new(format!("write instance {id}"), e).into()),
        }
    }

    /// Writes `record` if its key has no value (never written, deleted or purged); else the
    /// trace id of the record the key holds (read once).
    pub(crate) async fn create_record(
        &self,
        record: &InstanceRecord,
    ) -> Result<Created, ClientError> {
        let id = &record.instance_id;
        for _ in 0..2 {
            if self.write_record(id, record, 0).await?.is_some() {
                return Ok(Created::Written);
            }
            let last = self
                .instances
                .entry(id)
                .await
                .during(|| format!("read instance {id}"))?;
            match last {
                Some(entry) if entry.operation == Operation::Put => {
                    let stored: InstanceRecord = codec::decode(&entry.value)?;
                    return Ok(Created::Exists(stored.trace_id));
                }
                // Deleted or purged: written over the marker, unless someone else was first.
                Some(entry)
                    if self
                        .write_record(id, record, entry.revision)
                        .await?
                        .is_some() =>
                {
                    return Ok(Created::Written);
                }
                // Someone else was first, or gone between the two (the bucket's limits): again.
                _ => {}
            }
        }
        Err(NatsError::new(
            format!("create instance {id}"),
            Reason("its key kept changing".into()),
        )
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_is_read_back_from_the_headers_and_anything_else_is_unknown() {
        let mut headers = HeaderMap::new();
        headers.insert(STATE_HEADER, "success");
        assert_eq!(state_of(Some(&headers)), Some(State::Success));
        headers.insert(STATE_HEADER, "waiting_retry");
        assert_eq!(state_of(Some(&headers)), Some(State::WaitingRetry));
        headers.insert(STATE_HEADER, "done");
        assert_eq!(state_of(Some(&headers)), None);
        assert_eq!(state_of(Some(&HeaderMap::new())), None);
        assert_eq!(state_of(None), None);
    }
}
