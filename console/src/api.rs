//! The JSON API under `/api/v1/`: what the CLI reads, over HTTP, from the same library calls
//! (`ax status --json`, `ax instance get --json`, `ax instance history --json`). Errors are a
//! JSON `{error}` naming the field and the reason: 400 for a malformed value, 404 for what does
//! not exist, 503 when NATS does not answer.

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

/// The node's connection, or the answer saying it has none.
fn client(state: &State) -> Result<&ax_bus::AxClient, HttpResponse> {
    state.client.as_ref().ok_or_else(|| {
        HttpResponse::ServiceUnavailable().json(error_body("this node has no NATS connection"))
    })
}

/// The instance id of the path, or a 400 naming it.
fn instance_id(text: &str) -> Result<InstanceId, HttpResponse> {
    text.parse::<InstanceId>()
        .map_err(|e| HttpResponse::BadRequest().json(error_body(&format!("id: {e}"))))
}

fn unavailable(e: impl std::fmt::Display) -> HttpResponse {
    HttpResponse::ServiceUnavailable().json(error_body(&e.to_string()))
}

fn no_instance(id: &InstanceId) -> HttpResponse {
    HttpResponse::NotFound().json(error_body(&format!("id: no instance `{id}`")))
}

/// `GET /api/v1/instances/{id}`: the record (what `ax instance get --json` prints).
async fn instance(state: web::Data<State>, path: web::Path<String>) -> HttpResponse {
    let (client, id) = match (client(&state), instance_id(&path)) {
        (Ok(client), Ok(id)) => (client, id),
        (Err(answer), _) | (_, Err(answer)) => return answer,
    };
    match client.instance(&id).await {
        Ok(Some((record, _))) => HttpResponse::Ok().json(record),
        Ok(None) => no_instance(&id),
        Err(e) => unavailable(e),
    }
}

/// `GET /api/v1/instances/{id}/history`: every step of every attempt (what `ax instance
/// history --json` prints).
async fn history(state: web::Data<State>, path: web::Path<String>) -> HttpResponse {
    let (client, id) = match (client(&state), instance_id(&path)) {
        (Ok(client), Ok(id)) => (client, id),
        (Err(answer), _) | (_, Err(answer)) => return answer,
    };
    match client.instance_history(&id).await {
        Ok(Some(history)) => HttpResponse::Ok().json(history),
        Ok(None) => no_instance(&id),
        Err(e) => unavailable(e),
    }
}

/// The query of `/api/v1/status`.
#[derive(Debug, serde::Deserialize)]
struct StatusQuery {
    /// `YYYY-MM-DD`; the latest day summarized when absent.
    date: Option<String>,
}

/// `GET /api/v1/status[?date=YYYY-MM-DD]`: the health summary (what `ax status --json` prints).
async fn status(state: web::Data<State>, query: web::Query<StatusQuery>) -> HttpResponse {
    let client = match client(&state) {
        Ok(client) => client,
        Err(answer) => return answer,
    };
    if let Some(date) = &query.date {
        if ax_bus::time::parse_biz_date(date).is_none() {
            return HttpResponse::BadRequest().json(error_body(&format!(
                "date: `{date}` is not a date (YYYY-MM-DD)"
            )));
        }
    }
    match client.status(query.date.as_deref()).await {
        Ok(status) => HttpResponse::Ok().json(status),
        Err(e) => unavailable(e),
    }
}
