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

impl DeadLetter {
    /// What became of its instance since it was given up on, `now` being its record as it is
    /// (`None`: not read, or gone): a letter whose instance succeeded since (an operator's
    /// mark, a re-run) or runs again is no open problem any more.
    pub fn standing(&self, now: Option<&crate::InstanceRecord>) -> Standing {
        let Some(instance) = &self.instance else {
            return Standing::Open;
        };
        let Some(record) = now.filter(|r| r.instance_id.as_str() == instance) else {
            return Standing::Open;
        };
        let newer = self
            .trace
            .as_deref()
            .is_some_and(|t| t != record.trace_id.as_str());
        match record.state {
            crate::State::Success => Standing::Resolved(format!(
                "resolved: {} {} (attempt {})",
                record.state, record.tag, record.attempt
            )),
            _ if newer && !record.state.is_final() => Standing::Resolved(format!(
                "running again: attempt {} ({} {})",
                record.attempt, record.state, record.tag
            )),
            _ => Standing::Open,
        }
    }
}

/// Whether a dead letter still stands for a problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Nothing has happened to it since (or it belongs to no instance).
    Open,
    /// Its instance was resolved since: how.
    Resolved(String),
}

impl std::fmt::Display for Standing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Standing::Open => f.write_str("open"),
            Standing::Resolved(how) => f.write_str(how),
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

#[cfg(test)]
mod standing_tests {
    use super::*;
    use crate::instance::tests::{record, tr};

    #[test]
    fn a_letter_whose_instance_succeeded_or_runs_again_is_resolved() {
        let failed = {
            let mut r = record();
            r.state = crate::State::Failed;
            r.tag = crate::Tag::ExitCode;
            r
        };
        let letter = DeadLetter {
            id: 7,
            kind: EXHAUSTED.into(),
            at: None,
            reason: "exit code 3".into(),
            subject: "ax.internal.dead.exhausted".into(),
            node: "n1".into(),
            instance: Some(failed.instance_id.to_string()),
            trace: Some(failed.trace_id.to_string()),
            job: Some("j".into()),
            payload_bytes: 1,
        };
        assert_eq!(letter.standing(Some(&failed)), Standing::Open);
        assert_eq!(letter.standing(None), Standing::Open);
        let marked = failed.marked(crate::State::Success, "by hand").unwrap();
        assert_eq!(
            letter.standing(Some(&marked)).to_string(),
            "resolved: success marked (attempt 1)"
        );
        let again = failed.rerun(&tr(2)).unwrap();
        assert_eq!(
            letter.standing(Some(&again)).to_string(),
            "running again: attempt 2 (running queued)"
        );
        let failed_again = {
            let mut r = again.clone();
            r.state = crate::State::Failed;
            r
        };
        assert_eq!(letter.standing(Some(&failed_again)), Standing::Open);
        let other = DeadLetter {
            instance: None,
            ..letter
        };
        assert_eq!(other.standing(Some(&marked)), Standing::Open);
    }
}
