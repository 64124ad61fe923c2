//! Where a control command's answer may go.
//!
//! JetStream takes the NATS reply subject of a published command for its own ack, so a command
//! names its answer's subject in the `Ax-Reply-To` header. The Scheduler publishes that answer
//! with its own rights, which reach the job registry, the work streams and every worker's
//! dispatch subject: taken as written, the header would let anyone allowed to send a command
//! write anywhere the Scheduler may (`Ax-Reply-To: $KV.ax_jobs.x` overwrote a job). Answers
//! therefore go only into the inbox namespace, `_INBOX.`, where NATS clients make their reply
//! subjects (`new_inbox()` in every client library) and where nothing of ax lives; anything
//! else is refused before the command is carried out.

/// The namespace answers may go to.
pub const INBOX_PREFIX: &str = "_INBOX.";
/// The longest `Ax-Reply-To` taken (a client's inbox is about 50 bytes).
pub const MAX_REPLY_TO_BYTES: usize = 256;

/// Why an `Ax-Reply-To` value is not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyToError {
    /// Outside the inbox namespace.
    #[error(
        "Ax-Reply-To `{0}` is not an inbox: answers go only to subjects under `_INBOX.` (what \
         a NATS client's new_inbox() makes)"
    )]
    NotAnInbox(String),
    /// Not a subject one can publish on.
    #[error(
        "Ax-Reply-To `{0}` is not a subject to publish on (an empty token, a wildcard or a space)"
    )]
    NotASubject(String),
    /// Longer than [`MAX_REPLY_TO_BYTES`].
    #[error("Ax-Reply-To is {0} bytes long (at most {MAX_REPLY_TO_BYTES})")]
    TooLong(usize),
}

/// `value` when it names an inbox subject an answer may be published on.
pub fn reply_subject(value: &str) -> Result<&str, ReplyToError> {
    if value.len() > MAX_REPLY_TO_BYTES {
        return Err(ReplyToError::TooLong(value.len()));
    }
    let literal = value
        .split('.')
        .all(|token| !token.is_empty() && token != "*" && token != ">")
        && !value.chars().any(|c| c.is_whitespace() || c.is_control());
    if !literal {
        return Err(ReplyToError::NotASubject(value.to_string()));
    }
    if !value.starts_with(INBOX_PREFIX) {
        return Err(ReplyToError::NotAnInbox(value.to_string()));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inboxes_are_taken() {
        for inbox in ["_INBOX.abc", "_INBOX.Vx2k9.17", "_INBOX.a.b.c"] {
            assert_eq!(reply_subject(inbox), Ok(inbox));
        }
    }

    #[test]
    fn everything_outside_the_inbox_namespace_is_refused() {
        for subject in [
            "$KV.ax_jobs.x",
            "$JS.API.STREAM.DELETE.AX_FLOW",
            "ax.internal.dispatch.w1",
            "ax.result.job",
            "other-service.requests",
            "_INBOX",
            "_inbox.abc",
            "x._INBOX.abc",
        ] {
            assert!(
                matches!(reply_subject(subject), Err(ReplyToError::NotAnInbox(_))),
                "{subject}"
            );
        }
    }

    #[test]
    fn wildcards_spaces_empty_tokens_and_long_values_are_refused() {
        for subject in [
            "_INBOX.*",
            "_INBOX.>",
            "_INBOX..a",
            "_INBOX.a b",
            "_INBOX.",
            "",
            "_INBOX.a\n",
        ] {
            assert!(
                matches!(reply_subject(subject), Err(ReplyToError::NotASubject(_))),
                "{subject:?}"
            );
        }
        let long = format!("_INBOX.{}", "a".repeat(300));
        assert_eq!(reply_subject(&long), Err(ReplyToError::TooLong(long.len())));
    }
}
