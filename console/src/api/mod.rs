//! The JSON API under `/api/v1/`: everything the pages show and do, over HTTP, from the same
//! library calls as the CLI ([`crate::actions`] for what changes). It is described by the
//! OpenAPI document at `/api/v1/openapi.json`.
//!
//! Errors are a JSON `{error}` naming the field and the reason: 400 for a malformed value or
//! body, 404 for what does not exist, 409 for what the Scheduler refused (an action in the
//! wrong state), 413 for a body over the limit, 503 when NATS does not answer.
//!
//! - [`reads`]: the summary, jobs, instances (paged from the index), an instance's history;
//! - [`changes`]: triggers, job and instance actions, re-runs and backfills;
//! - [`openapi`]: the document.

use actix_web::error::JsonPayloadError;
use actix_web::{web, HttpResponse};

use crate::problem::Problem;
use crate::server::{error_body, State};

mod changes;

pub(crate) use changes::CHANGES;
mod openapi;
mod reads;

/// The API's routes (each behind the server's access check, like every route).
pub(crate) fn routes(config: &mut web::ServiceConfig) {
    reads::routes(config);
    config.route("/api/v1/openapi.json", web::get().to(openapi::document));
}

impl actix_web::ResponseError for Problem {
    fn status_code(&self) -> actix_web::http::StatusCode {
        self.status()
    }

    fn error_response(&self) -> HttpResponse {
        HttpResponse::build(self.status()).json(error_body(&self.to_string()))
    }
}

/// JSON bodies: the limit, and a malformed body answered with the reason serde gives (which
/// names the field, the line and the column).
pub(crate) fn json_config() -> web::JsonConfig {
    web::JsonConfig::default()
        .limit(crate::server::BODY_LIMIT)
        .error_handler(|error, _| {
            let (status, reason) = match &error {
                JsonPayloadError::OverflowKnownLength { length, limit } => (
                    actix_web::http::StatusCode::PAYLOAD_TOO_LARGE,
                    format!("body: {length} bytes, more than the limit of {limit}"),
                ),
                JsonPayloadError::Overflow { limit } => (
                    actix_web::http::StatusCode::PAYLOAD_TOO_LARGE,
                    format!("body: more than the limit of {limit} bytes"),
                ),
                JsonPayloadError::ContentType => (
                    actix_web::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "body: send it as application/json".to_string(),
                ),
                JsonPayloadError::Deserialize(e) => (
                    actix_web::http::StatusCode::BAD_REQUEST,
                    format!("body: {e}"),
                ),
                other => (
                    actix_web::http::StatusCode::BAD_REQUEST,
                    format!("body: {other}"),
                ),
            };
            let response = HttpResponse::build(status).json(error_body(&reason));
            actix_web::error::InternalError::from_response(error, response).into()
        })
}

/// Queries: a malformed one answered with the reason serde gives (which names the field).
pub(crate) fn query_config() -> web::QueryConfig {
    web::QueryConfig::default().error_handler(|error, _| {
        let response = HttpResponse::BadRequest().json(error_body(&format!("query: {error}")));
        actix_web::error::InternalError::from_response(error, response).into()
    })
}

/// The node's connection.
pub(crate) fn client(state: &State) -> Result<&ax_bus::AxClient, Problem> {
    state
        .client
        .as_ref()
        .ok_or_else(|| Problem::Unavailable("this node has no NATS connection".into()))
}
