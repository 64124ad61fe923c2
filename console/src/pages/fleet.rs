//! The fleet: workers (slots, running attempts, routing score, tags, executors, heartbeat),
//! nodes (roles, and what befell their actors: restarts, panics, stalls) and the queues
//! (pending, paused, and the buttons that pause and resume them).

use std::str::FromStr;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;

use ax_bus::messages::commands::Command;
use ax_bus::messages::typed::Done;
use ax_bus::messages::QueueRequest;
use ax_bus::room::Isolation;
use ax_bus::spec::Priority;

use crate::actions;
use crate::changes::{changes, Does};
use crate::pages::{self, Chrome};
use crate::problem::Problem;
use crate::server::State;

pub(crate) fn routes(config: &mut web::ServiceConfig) {
    config
        .route("/workers", web::get().to(workers))
        .route("/nodes", web::get().to(nodes))
        .route("/queues", web::get().to(queues));
}

changes! {
    POST "/ui/queues/{priority}/{action:pause}" => queue, Does::Command(Command::Queue);
    POST "/ui/queues/{priority}/{action:resume}" => queue, Does::Command(Command::Queue);
}

struct WorkerRow {
    id: String,
    host: String,
    running: u32,
    slots: u32,
    cores: u32,
    avg_ms: String,
    score: String,
    tags: String,
    executors: String,
    /// How it keeps its attempts apart (`cgroups: memory, cpu, pids`), with the worker's
    /// own words in the cell's title.
    walls: String,
    walls_said: String,
    room: String,
    heartbeat: String,
    alive: bool,
    attempts: Vec<String>,
}

#[derive(Template)]
#[template(path = "workers.html")]
struct WorkersPage {
    chrome: Chrome,
    workers: Vec<WorkerRow>,
    /// How the scores and liveness are judged: the Routers' policy, in words.
    policy: String,
}

fn unavailable(request: &HttpRequest, e: impl std::fmt::Display) -> HttpResponse {
    pages::error_page(request, StatusCode::SERVICE_UNAVAILABLE, e.to_string())
}

async fn workers(state: web::Data<State>, request: HttpRequest) -> HttpResponse {
    let client = pages::or_return!(pages::client(&state, &request));
    let mut workers = match client.workers().await {
        Ok(workers) => workers,
        Err(e) => return unavailable(&request, e),
    };
    // Scores and liveness as the Routers judge them: their configured weights and TTL.
    let policy = match client.routing_policy().await {
        Ok(policy) => policy,
        Err(e) => return unavailable(&request, e),
    };
    workers.sort_by(|a, b| a.0.id.cmp(&b.0.id));
    let now = chrono::Utc::now();
    let rows = workers
        .into_iter()
        .map(|(info, at)| {
            let age = (now - at).num_milliseconds() as f64 / 1000.0;
            let alive = policy.alive((now - at).to_std().unwrap_or_default());
            WorkerRow {
                id: info.id.to_string(),
                host: info.host.clone(),
                running: info.running,
                slots: info.slots,
                cores: info.cores,
                avg_ms: format!("{:.0}", info.avg_duration_ms),
                score: format!("{:.3}", policy.score(&info, 0)),
                tags: info.tags.join(", "),
                executors: info.executors.join(", "),
                walls: info
                    .isolation
                    .as_ref()
                    .map_or_else(|| "-".into(), Isolation::walls),
                walls_said: info
                    .isolation
                    .as_ref()
                    .map_or_else(String::new, |i| i.said.clone()),
                room: info
                    .isolation
                    .as_ref()
                    .map_or_else(|| "-".into(), Isolation::room),
                heartbeat: if alive {
                    format!("{age:.1} s ago")
                } else {
                    format!("dead ({age:.0} s)")
                },
                alive,
                attempts: info
                    .attempts
                    .iter()
                    .map(|a| a.instance_id.to_string())
                    .collect(),
            }
        })
        .collect();
    let page = WorkersPage {
        chrome: Chrome::of(&pages::caller(&request), "workers"),
        workers: rows,
        policy: format!(
            "score = running per core × {} + average seconds × {}; dead after {:.0} s without a heartbeat",
            policy.weights.running,
            policy.weights.duration,
            policy.worker_ttl().as_secs_f64()
        ),
    };
    pages::html(StatusCode::OK, &page)
}

struct NodeRow {
    node: String,
    host: String,
    pid: u32,
    roles: String,
    version: String,
    started: String,
    heartbeat: String,
    /// Its machine's CPU, memory and data directory's disk (`cpu 23%, memory 61% of 23.4Gi,
    /// disk 45% of 98.3Gi`), and whether that disk is nearly full (over 90 %).
    machine: String,
    disk_nearly_full: bool,
    troubles: Vec<String>,
}

#[derive(Template)]
#[template(path = "nodes.html")]
struct NodesPage {
    chrome: Chrome,
    nodes: Vec<NodeRow>,
}

async fn nodes(state: web::Data<State>, request: HttpRequest) -> HttpResponse {
    let client = pages::or_return!(pages::client(&state, &request));
    let mut nodes = match client.nodes().await {
        Ok(nodes) => nodes,
        Err(e) => return unavailable(&request, e),
    };
    nodes.sort_by(|a, b| a.node.cmp(&b.node));
    let now = chrono::Utc::now();
    let rows = nodes
        .into_iter()
        .map(|n| NodeRow {
            node: n.node.to_string(),
            host: n.host.clone(),
            pid: n.pid,
            roles: n.roles.join(", "),
            version: n.version.clone(),
            started: pages::time(Some(n.started_at)),
            heartbeat: format!(
                "{:.1} s ago",
                (now - n.seen_at).num_milliseconds() as f64 / 1000.0
            ),
            machine: n.machine.map_or_else(|| "–".into(), |m| m.to_string()),
            disk_nearly_full: n.machine.is_some_and(|m| m.disk_used() > 0.9),
            troubles: n.troubles(),
        })
        .collect();
    let page = NodesPage {
        chrome: Chrome::of(&pages::caller(&request), "nodes"),
        nodes: rows,
    };
    pages::html(StatusCode::OK, &page)
}

struct QueueRow {
    name: String,
    /// The priority whose queue it is (the delayed queue has none and no button).
    priority: Option<String>,
    pending: u64,
    ack_pending: u64,
    paused: bool,
    by: String,
}

#[derive(Template)]
#[template(path = "queues.html")]
struct QueuesPage {
    chrome: Chrome,
    queues: Vec<QueueRow>,
}

async fn queues(state: web::Data<State>, request: HttpRequest) -> HttpResponse {
    let client = pages::or_return!(pages::client(&state, &request));
    let (depths, states) = match tokio::try_join!(client.queue_depths(), client.queue_states()) {
        Ok(read) => read,
        Err(e) => return unavailable(&request, e),
    };
    let rows = depths
        .into_iter()
        .map(|d| {
            let priority = d
                .queue
                .strip_prefix("ready_")
                .and_then(|p| Priority::from_str(p).ok());
            let queue_state = priority.and_then(|p| states.iter().find(|(q, _)| *q == p));
            QueueRow {
                priority: priority.map(|p| p.as_str().to_string()),
                pending: d.pending,
                ack_pending: d.ack_pending,
                paused: queue_state.is_some_and(|(_, s)| s.paused),
                by: match queue_state {
                    Some((_, s)) if s.paused && s.by.is_empty() => "operator".into(),
                    Some((_, s)) if s.paused => s.by.clone(),
                    _ => "–".into(),
                },
                name: d.queue,
            }
        })
        .collect();
    let page = QueuesPage {
        chrome: Chrome::of(&pages::caller(&request), "queues"),
        queues: rows,
    };
    pages::html(StatusCode::OK, &page)
}

async fn queue(state: web::Data<State>, path: web::Path<(String, String)>) -> HttpResponse {
    pages::replied(queued(&state, &path.0, &path.1).await)
}

async fn queued(state: &State, priority: &str, action: &str) -> Result<Done, Problem> {
    let paused = match action {
        "pause" => true,
        "resume" => false,
        other => {
            return Err(Problem::NotFound(format!(
                "action: no queue action `{other}` (pause, resume)"
            )))
        }
    };
    let priority = Priority::from_str(priority).map_err(|_| {
        Problem::Malformed(format!(
            "priority: `{priority}` is no priority (high, normal, low)"
        ))
    })?;
    actions::queue(
        crate::api::client(state)?,
        &QueueRequest { priority, paused },
    )
    .await
}
