//! What the API reads: the summary (`ax status --json`), jobs (`ax job list|get --json`), a
//! job's ticks (`ax job history --json`), instances — filtered and paged on the server from
//! the console's index — and an instance's record and history (`ax instance get|history
//! --json`).

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use ax_bus::ids::{InstanceId, JobName};
use ax_bus::spec::{self, JobDocument};

use crate::api::client;
use crate::index::Filter;
use crate::job_view::next_fire;
use crate::pages::instances::ListQuery;
use crate::pages::jobs::JobFilter;
use crate::problem::{unavailable, Problem};
use crate::server::State;

/// The most rows a page of the instance list may ask for.
const MAX_PER_PAGE: usize = 500;
/// The most ticks one request may ask for.
const MAX_TICKS: usize = 1_000;

pub(super) fn routes(config: &mut web::ServiceConfig) {
    config
        .route("/api/v1/status", web::get().to(status))
        .route("/api/v1/jobs", web::get().to(jobs))
        .route("/api/v1/jobs/{name}", web::get().to(job))
        .route("/api/v1/jobs/{name}/ticks", web::get().to(ticks))
        .route("/api/v1/instances", web::get().to(instances))
        .route("/api/v1/instances/{id}", web::get().to(instance))
        .route("/api/v1/instances/{id}/history", web::get().to(history))
        .route("/api/v1/dead-letters", web::get().to(dead_letters))
        .route("/api/v1/workers", web::get().to(workers))
        .route("/api/v1/nodes", web::get().to(nodes))
        .route("/api/v1/queues", web::get().to(queues));
}

pub(super) fn instance_id(text: &str) -> Result<InstanceId, Problem> {
    text.parse::<InstanceId>()
        .map_err(|e| Problem::Malformed(format!("id: {e}")))
}

pub(super) fn job_name(text: &str) -> Result<JobName, Problem> {
    text.parse::<JobName>()
        .map_err(|e| Problem::Malformed(format!("name: {e}")))
}

fn no_instance(id: &InstanceId) -> Problem {
    Problem::NotFound(format!("id: {}", ax_bus::client::retention::missing(id)))
}

/// The query of `/api/v1/status`.
#[derive(Debug, Deserialize)]
struct StatusQuery {
    /// `YYYY-MM-DD`; the latest day summarized when absent or empty.
    date: Option<String>,
}

/// `GET /api/v1/status[?date=YYYY-MM-DD]`: the health summary.
async fn status(
    state: web::Data<State>,
    query: web::Query<StatusQuery>,
) -> Result<HttpResponse, Problem> {
    let client = client(&state)?;
    let date = query.date.as_deref().filter(|d| !d.is_empty());
    if let Some(date) = date {
        if ax_bus::time::parse_biz_date(date).is_none() {
            return Err(Problem::Malformed(format!(
                "date: `{date}` is not a date (YYYY-MM-DD)"
            )));
        }
    }
    let status = client.status(date).await.map_err(unavailable)?;
    Ok(HttpResponse::Ok().json(status))
}

/// `GET /api/v1/jobs[?q=&executor=&tag=&paused=yes|no]`: the jobs the filters admit.
async fn jobs(
    state: web::Data<State>,
    request: HttpRequest,
    filter: web::Query<JobFilter>,
) -> Result<HttpResponse, Problem> {
    if !matches!(filter.paused.as_str(), "" | "yes" | "no") {
        return Err(Problem::Malformed(format!(
            "paused: `{}` is neither yes nor no",
            filter.paused
        )));
    }
    let jobs = client(&state)?.jobs().await.map_err(unavailable)?;
    let seen = crate::scoped::seen(&crate::pages::caller(&request).principal);
    let docs: Vec<serde_json::Value> = jobs
        .iter()
        .filter(|j| filter.admits(j))
        .filter(|j| {
            seen.as_ref()
                .is_none_or(|kept| kept.contains(j.spec.name.namespace()))
        })
        .map(crate::job_view::summary)
        .collect();
    Ok(HttpResponse::Ok().json(docs))
}

/// `GET /api/v1/jobs/{name}`: the job's document (secrets redacted), whether it is paused and
/// its next fire.
async fn job(state: web::Data<State>, name: web::Path<String>) -> Result<HttpResponse, Problem> {
    let name = job_name(&name)?;
    let Some((record, _)) = client(&state)?.job(&name).await.map_err(unavailable)? else {
        return Err(Problem::NotFound(format!("name: no job `{name}`")));
    };
    let doc = JobDocument {
        version: spec::VERSION.into(),
        job: spec::redact::spec(&record.spec),
    };
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "name": name,
        "paused": record.paused,
        "updated_at": record.updated_at,
        "next_fire": next_fire(&record.spec, record.paused),
        "document": doc,
    })))
}

/// The query of `/api/v1/jobs/{name}/ticks`.
#[derive(Debug, Deserialize)]
struct TicksQuery {
    /// The most ticks, newest first (50 when absent).
    limit: Option<usize>,
}

/// `GET /api/v1/jobs/{name}/ticks[?limit=N]`: the job's tick ledger, newest first.
async fn ticks(
    state: web::Data<State>,
    name: web::Path<String>,
    query: web::Query<TicksQuery>,
) -> Result<HttpResponse, Problem> {
    let name = job_name(&name)?;
    let limit = query.limit.unwrap_or(50);
    if limit == 0 || limit > MAX_TICKS {
        return Err(Problem::Malformed(format!(
            "limit: {limit} is not within 1..={MAX_TICKS}"
        )));
    }
    let client = client(&state)?;
    let ticks = client.ticks(&name, limit).await.map_err(unavailable)?;
    if ticks.is_empty() && !client.job_exists(&name).await.map_err(unavailable)? {
        return Err(Problem::NotFound(format!(
            "name: no job `{name}` and no recorded tick for it"
        )));
    }
    Ok(HttpResponse::Ok().json(ticks))
}

/// `GET /api/v1/instances[?job=&state=&tag=&biz_date=&from=&to=&page=&per_page=]`: one page
/// of the instances the filters admit, newest due first, and whether more follow.
async fn instances(
    state: web::Data<State>,
    request: HttpRequest,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, Problem> {
    let filter = query.filter()?;
    let seen = crate::scoped::seen(&crate::pages::caller(&request).principal);
    let filter = Filter {
        namespaces: crate::scoped::kept(filter.namespaces, seen),
        ..filter
    };
    let per_page = query.per_page.unwrap_or(crate::pages::instances::PER_PAGE);
    if per_page == 0 || per_page > MAX_PER_PAGE {
        return Err(Problem::Malformed(format!(
            "per_page: {per_page} is not within 1..={MAX_PER_PAGE}"
        )));
    }
    let index = state
        .index
        .as_ref()
        .ok_or_else(|| Problem::Unavailable("this node keeps no instance index".into()))?;
    let page = index.page(&filter, query.page, per_page);
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "page": query.page,
        "per_page": per_page,
        "more": page.more,
        "complete": index.is_current(),
        "instances": page.rows,
    })))
}

/// `GET /api/v1/instances/{id}`: the record.
async fn instance(
    state: web::Data<State>,
    path: web::Path<String>,
) -> Result<HttpResponse, Problem> {
    let (client, id) = (client(&state)?, instance_id(&path)?);
    match client.instance(&id).await.map_err(unavailable)? {
        Some((record, _)) => Ok(HttpResponse::Ok().json(record)),
        None => Err(no_instance(&id)),
    }
}

/// `GET /api/v1/instances/{id}/history`: every step of every attempt.
async fn history(
    state: web::Data<State>,
    path: web::Path<String>,
) -> Result<HttpResponse, Problem> {
    let (client, id) = (client(&state)?, instance_id(&path)?);
    match client.instance_history(&id).await.map_err(unavailable)? {
        Some(history) => Ok(HttpResponse::Ok().json(history)),
        None => Err(no_instance(&id)),
    }
}

/// `GET /api/v1/dead-letters`: every dead letter (what `ax dlq list --json` prints).
async fn dead_letters(state: web::Data<State>) -> Result<HttpResponse, Problem> {
    let letters = client(&state)?.dead_letters().await.map_err(unavailable)?;
    Ok(HttpResponse::Ok().json(letters))
}

/// `GET /api/v1/workers`: every worker's last heartbeat and when it was written.
async fn workers(state: web::Data<State>) -> Result<HttpResponse, Problem> {
    let workers = client(&state)?.workers().await.map_err(unavailable)?;
    let docs: Vec<serde_json::Value> = workers
        .into_iter()
        .map(|(info, at)| serde_json::json!({ "worker": info, "heartbeat_at": at }))
        .collect();
    Ok(HttpResponse::Ok().json(docs))
}

/// `GET /api/v1/nodes`: every node's last heartbeat (what `ax nodes --json` prints).
async fn nodes(state: web::Data<State>) -> Result<HttpResponse, Problem> {
    let nodes = client(&state)?.nodes().await.map_err(unavailable)?;
    Ok(HttpResponse::Ok().json(nodes))
}

/// `GET /api/v1/queues`: each queue's depth, and whether each priority is paused.
async fn queues(state: web::Data<State>) -> Result<HttpResponse, Problem> {
    let client = client(&state)?;
    let (depths, states) =
        tokio::try_join!(client.queue_depths(), client.queue_states()).map_err(unavailable)?;
    let paused: Vec<serde_json::Value> = states
        .iter()
        .map(|(p, s)| serde_json::json!({ "priority": p.as_str(), "paused": s.paused, "by": s.by }))
        .collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({ "depths": depths, "states": paused })))
}
