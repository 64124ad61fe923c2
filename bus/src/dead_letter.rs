//! Dead letters: a message ax cannot process is never dropped. It is kept in `<AX>_DEAD` on
//! `ax.internal.dead.<kind>` exactly as it came (payload and headers), with why it died added
//! as headers, so that an operator can read it, fix what produced it, and submit it again
//! (`ax dlq list`, `ax dlq replay`).
//!
//! Three kinds:
//! - [`UNDECODABLE`]: a message that does not decode; it would fail the same way on every
//!   redelivery, so it is moved aside at once;
//! - [`EXHAUSTED`]: an instance that ended `failed` for good (retries exhausted, dependencies
//!   timed out, shards failed); the payload is its last work item (job spec, params, attempt);
//! - [`MAX_DELIVERIES`]: a message JetStream delivered as often as its consumer allows without
//!   an acknowledgement (found through the server's max-deliveries advisory).

use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::message::StreamMessage;
use async_nats::HeaderMap;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The kind of dead letter for a message that does not decode.
pub const UNDECODABLE: &str = "undecodable";
/// The kind of dead letter for an instance that ended `failed` for good.
pub const EXHAUSTED: &str = "exhausted";
/// The kind of dead letter for a message delivered too often without an acknowledgement.
pub const MAX_DELIVERIES: &str = "max_deliveries";

/// Header: why the message died.
pub const REASON: &str = "Ax-Dead-Reason";
/// Header: the subject it was published on.
pub const SUBJECT: &str = "Ax-Dead-Subject";
/// Header: the node that gave up on it.
pub const NODE: &str = "Ax-Dead-Node";
/// Header: when (RFC 3339).
pub const AT: &str = "Ax-Dead-At";
/// Header: the instance it belongs to, when it belongs to one.
pub const INSTANCE: &str = "Ax-Dead-Instance";
/// Header: the attempt (trace id) it belongs to, when it belongs to one.
pub const TRACE: &str = "Ax-Dead-Trace";
/// Header: the job it belongs to, when it belongs to one.
pub const JOB: &str = "Ax-Dead-Job";

/// Every header ax adds to a dead letter (removed again when one is replayed as it was).
pub const ALL_HEADERS: [&str; 7] = [REASON, SUBJECT, NODE, AT, INSTANCE, TRACE, JOB];

/// A dead letter as `ax dlq list` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Its id: the sequence in the dead-letter stream.
    pub id: u64,
    /// `undecodable`, `exhausted` or `max_deliveries`.
    pub kind: String,
    /// When it was stored as a dead letter.
    #[serde(default, with = "crate::time::wire_opt")]
    pub at: Option<DateTime<Utc>>,
    /// Why it died.
    pub reason: String,
    /// The subject it was published on.
    pub subject: String,
    /// The node that gave up on it.
    pub node: String,
    /// The instance, when it belongs to one.
    pub instance: Option<String>,
    /// The attempt, when it belongs to one.
    pub trace: Option<String>,
    /// The job, when it belongs to one.
    pub job: Option<String>,
    /// Size of the kept payload.
    pub payload_bytes: usize,
}

impl DeadLetter {
    /// Reads a message of the dead-letter stream; `kind` is the last token of its subject.
    pub fn from_stored(message: &StreamMessage) -> Self {
        let header = |name: &str| header_text(&message.headers, name);
        Self {
            id: message.sequence,
            kind: message
                .subject
                .rsplit('.')
                .next()
                .unwrap_or_default()
                .to_string(),
            at: header(AT).and_then(|t| DateTime::parse_from_rfc3339(&t).ok().map(|t| t.to_utc())),
            reason: header(REASON).unwrap_or_default(),
            subject: header(SUBJECT).unwrap_or_default(),
            node: header(NODE).unwrap_or_default(),
            instance: header(INSTANCE),
            trace: header(TRACE),
            job: header(JOB),
            payload_bytes: message.payload.len(),
        }
    }
}

/// A header's value as text, when present.
pub fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get(name).map(|v| v.as_str().to_string())
}

/// The original headers of a dead letter, without those ax added.
pub fn original_headers(headers: &HeaderMap) -> HeaderMap {
    let mut original = HeaderMap::new();
    for (name, values) in headers.iter() {
        let name = name.to_string();
        if ALL_HEADERS.contains(&name.as_str()) || name == NATS_MESSAGE_ID.to_string() {
            continue;
        }
        for value in values {
            original.append(name.as_str(), value.as_str());
        }
    }
    original
}
