//! Errors of NATS and JetStream operations, kept with their source (in the manner of
//! async-nats's `Error<Kind>`): what was attempted, and the client's own error, which callers
//! can inspect ([`NatsError::server_code`], [`NatsError::source_ref`]) instead of parsing text.

use std::error::Error as StdError;

use async_nats::jetstream::ErrorCode;

/// Any error, boxed with what it came from.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// A NATS or JetStream operation that failed: what was attempted, and why. A refusal for want
/// of storage says so in plain words (the client's own text repeats "insufficient resources"
/// without the cause or the way out).
#[derive(Debug, thiserror::Error)]
pub struct NatsError {
    /// What was attempted (`publish ax.result.hello`, `read instance <id>`, ...).
    pub operation: String,
    /// The client library's error.
    #[source]
    pub source: BoxError,
}

impl std::fmt::Display for NatsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.server_code() {
            Some(code) if self.storage_full() => write!(
                f,
                "{}: refused, JetStream's storage is full (NATS error {}): nothing was stored; free space on the NATS servers or raise their max_file_store, then try again",
                self.operation, code.0
            ),
            _ => write!(f, "{}: {}", self.operation, self.source),
        }
    }
}

impl NatsError {
    /// Whether the server refused for want of storage: "insufficient resources" (10023, a
    /// store at its limit) or "insufficient storage resources" (10047).
    pub fn storage_full(&self) -> bool {
        matches!(
            self.server_code(),
            Some(ErrorCode::INSUFFICIENT_RESOURCES | ErrorCode::STORAGE_RESOURCES_EXCEEDED)
        )
    }

    /// `operation` failed with `source`.
    pub fn new(operation: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self {
            operation: operation.into(),
            source: source.into(),
        }
    }

    /// The JetStream error code the server answered with, when it answered with one (anywhere
    /// in the chain of sources).
    pub fn server_code(&self) -> Option<ErrorCode> {
        let mut next: Option<&(dyn StdError + 'static)> = Some(self.source.as_ref());
        while let Some(error) = next {
            if let Some(code) = jetstream_code(error) {
                return Some(code);
            }
            next = error.source();
        }
        None
    }

    /// The source as a concrete error type, when it is one.
    pub fn source_ref<E: StdError + 'static>(&self) -> Option<&E> {
        self.source.downcast_ref::<E>()
    }
}

/// The server's JetStream error code in `error` itself: a JetStream error, or one that
/// async-nats carries in its kind rather than as a source.
fn jetstream_code(error: &(dyn StdError + 'static)) -> Option<ErrorCode> {
    use async_nats::jetstream::context::{
        CreateStreamError, CreateStreamErrorKind, GetStreamError, GetStreamErrorKind,
    };
    use async_nats::jetstream::stream::{ConsumerError, ConsumerErrorKind};
    if let Some(js) = error.downcast_ref::<async_nats::jetstream::Error>() {
        return Some(js.error_code());
    }
    if let Some(GetStreamErrorKind::JetStream(js)) =
        error.downcast_ref::<GetStreamError>().map(|e| e.kind())
    {
        return Some(js.error_code());
    }
    if let Some(CreateStreamErrorKind::JetStream(js)) =
        error.downcast_ref::<CreateStreamError>().map(|e| e.kind())
    {
        return Some(js.error_code());
    }
    if let Some(ConsumerErrorKind::JetStream(js)) =
        error.downcast_ref::<ConsumerError>().map(|e| e.kind())
    {
        return Some(js.error_code());
    }
    None
}

/// Names the operation of a failed NATS call: `result.during(|| format!("publish {subject}"))`
/// (the name is built only when the call failed).
pub trait During<T> {
    /// Turns the error into a [`NatsError`] naming `operation`.
    fn during<S: Into<String>>(self, operation: impl FnOnce() -> S) -> Result<T, NatsError>;
}

impl<T, E: Into<BoxError>> During<T> for Result<T, E> {
    fn during<S: Into<String>>(self, operation: impl FnOnce() -> S) -> Result<T, NatsError> {
        self.map_err(|e| NatsError::new(operation(), e))
    }
}

/// A plain reason as an error source (for failures that are not a library's error).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Reason(pub String);
