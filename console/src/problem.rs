//! What goes wrong with a request, as a kind: the API answers each with its status and a JSON
//! `{error}`, the pages with the same reason beside the control. The text always names the
//! field (or the thing) and the reason.

use actix_web::http::StatusCode;

/// Why a request was not answered, or an action not carried out.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Problem {
    /// A value of the request is malformed; the text names the field.
    #[error("{0}")]
    Malformed(String),
    /// What it names does not exist; the text names the field.
    #[error("{0}")]
    NotFound(String),
    /// The Scheduler refused it (wrong state, bad value); its reasons, one per line.
    #[error("{}", .0.join("; "))]
    Refused(Vec<String>),
    /// The Scheduler refused it for who asked (a role too low, a revoked token).
    #[error("{0}")]
    Denied(String),
    /// NATS or the Scheduler did not answer.
    #[error("{0}")]
    Unavailable(String),
}

pub(crate) fn unavailable(e: impl std::fmt::Display) -> Problem {
    Problem::Unavailable(e.to_string())
}

impl Problem {
    /// The HTTP status of this kind: 400, 404, 409, 403 or 503.
    pub fn status(&self) -> StatusCode {
        match self {
            Problem::Malformed(_) => StatusCode::BAD_REQUEST,
            Problem::NotFound(_) => StatusCode::NOT_FOUND,
            Problem::Refused(_) => StatusCode::CONFLICT,
            Problem::Denied(_) => StatusCode::FORBIDDEN,
            Problem::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}
