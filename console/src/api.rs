//! The JSON API under `/api/v1/`: what the CLI reads, over HTTP, from the same library calls
//! (`ax status --json`, `ax instance get --json`, `ax instance history --json`). Errors are a
//! JSON `{error}` naming the field and the reason: 400 for a malformed value, 404 for what does
//! not exist, 503 when NATS does not answer.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};

use ax_bus::ids::InstanceId;

use crate::server::{error_body, State};

/// The API's routes (each behind the server's access check, like every route).
pub(crate) fn routes(config: &mut web::ServiceConfig) {
    config
        .route("/api/v1/status", web::get().to(status))
        .route("/api/v1/instances/{id}", web::get().to(instance))
        .route("/api/v1/instances/{id}/history", web::get().to(history));
}

/// Why a request was not answered: a JSON `{error}` with its status.
#[derive(Debug, thiserror::Error)]
enum ApiError {
    /// A value of the request is malformed (400); the reason names the field.
    #[error("{0}")]
    Malformed(String),
    /// What the request names does not exist (404); the reason names the field.
    #[error("{0}")]
    NotFound(String),
    /// NATS did not answer, or this node has no connection (503).
    #[error("{0}")]
    Unavailable(String),
}

impl actix_web::ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Malformed(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn error_response(&self) -> HttpResponse {
        HttpResponse::build(self.status_code()).json(error_body(&self.to_string()))
    }
}

/// The node's connection.
fn client(state: &State) -> Result<&ax_bus::AxClient, ApiError> {
    state
        .client
        .as_ref()
        .ok_or_else(|| ApiError::Unavailable("this node has no NATS connection".into()))
}

/// The instance id of the path.
fn instance_id(text: &str) -> Result<InstanceId, ApiError> {
    text.parse::<InstanceId>()
        .map_err(|e| ApiError::Malformed(format!("id: {e}")))
}

fn unavailable(e: impl std::fmt::Display) -> ApiError {
    ApiError::Unavailable(e.to_string())
}

fn no_instance(id: &InstanceId) -> ApiError {
    ApiError::NotFound(format!("id: no instance `{id}`"))
}

/// `GET /api/v1/instances/{id}`: the record (what `ax instance get --json` prints).
async fn instance(
    state: web::Data<State>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (client, id) = (client(&state)?, instance_id(&path)?);
    match client.instance(&id).await.map_err(unavailable)? {
        Some((record, _)) => Ok(HttpResponse::Ok().json(record)),
        None => Err(no_instance(&id)),
    }
}

/// `GET /api/v1/instances/{id}/history`: every step of every attempt (what `ax instance
/// history --json` prints).
async fn history(
    state: web::Data<State>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (client, id) = (client(&state)?, instance_id(&path)?);
    match client.instance_history(&id).await.map_err(unavailable)? {
        Some(history) => Ok(HttpResponse::Ok().json(history)),
        None => Err(no_instance(&id)),
    }
}

/// The query of `/api/v1/status`.
#[derive(Debug, serde::Deserialize)]
struct StatusQuery {
    /// `YYYY-MM-DD`; the latest day summarized when absent.
    date: Option<String>,
}

/// `GET /api/v1/status[?date=YYYY-MM-DD]`: the health summary (what `ax status --json` prints).
async fn status(
    state: web::Data<State>,
    query: web::Query<StatusQuery>,
) -> Result<HttpResponse, ApiError> {
    let client = client(&state)?;
    if let Some(date) = &query.date {
        if ax_bus::time::parse_biz_date(date).is_none() {
            return Err(ApiError::Malformed(format!(
                "date: `{date}` is not a date (YYYY-MM-DD)"
            )));
        }
    }
    let status = client
        .status(query.date.as_deref())
        .await
        .map_err(unavailable)?;
    Ok(HttpResponse::Ok().json(status))
}
