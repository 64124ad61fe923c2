//! The HTTP server of a node: `/metrics` for Prometheus, every request through
//! [`crate::access::check`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use actix_web::body::{BoxBody, EitherBody};
use actix_web::dev::{ServerHandle, ServiceRequest, ServiceResponse};
use actix_web::middleware::{from_fn, Next};
use actix_web::{web, App, HttpResponse, HttpServer};

use ax_bus::AxClient;

use crate::access;

/// How long reading the queues' depths may take before a scrape goes on without them.
const DEPTHS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The address could not be bound (taken, not ours, not an address).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A running server: where it listens, and how to stop it.
#[derive(Debug)]
pub struct Running {
    /// The address it listens on (the port chosen when 0 was asked for).
    pub addr: SocketAddr,
    handle: ServerHandle,
}

impl Running {
    /// Stops accepting and ends the server.
    pub async fn stop(&self) {
        self.handle.stop(true).await;
    }
}

/// What the handlers share.
#[derive(Clone, Debug)]
pub(crate) struct State {
    /// Where queue depths and the summary are read (a node's connection).
    pub(crate) client: Option<AxClient>,
    /// The node's data directory, whose size `/metrics` reports.
    data_dir: Option<PathBuf>,
}

/// Starts the server on `listen` (`HOST:PORT`; port 0 picks a free one) on the current actix
/// system. `client` lets `/metrics` read the queues' depths from JetStream and serves
/// `/api/v1/status`; `data_dir` is the node's, whose size `/metrics` reports.
pub fn start(
    listen: &str,
    client: Option<AxClient>,
    data_dir: Option<PathBuf>,
) -> Result<Running, ServerError> {
    let state = web::Data::new(State { client, data_dir });
    let bind_error = |source| ServerError::Bind {
        addr: listen.to_string(),
        source,
    };
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .app_data(web::PayloadConfig::new(64 * 1024))
            .wrap(from_fn(checked))
            .route("/metrics", web::get().to(metrics))
            .configure(crate::api::routes)
    })
    .workers(1)
    .disable_signals()
    .bind(listen)
    .map_err(bind_error)?;
    let addr = server
        .addrs()
        .first()
        .copied()
        .ok_or_else(|| bind_error(std::io::Error::other("no address bound")))?;
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!(error = %e, "the HTTP server stopped");
        }
    });
    tracing::info!(%addr, "serving HTTP (/metrics)");
    Ok(Running { addr, handle })
}

/// The access check, around every route.
async fn checked(
    request: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<EitherBody<BoxBody>>, actix_web::Error> {
    match access::check(request.method().as_str(), request.path()) {
        Ok(_) => Ok(next.call(request).await?.map_into_left_body()),
        Err(denied) => {
            let response = HttpResponse::Forbidden().json(error_body(&denied.to_string()));
            Ok(request.into_response(response).map_into_right_body())
        }
    }
}

pub(crate) fn error_body(reason: &str) -> std::collections::BTreeMap<&'static str, String> {
    std::collections::BTreeMap::from([("error", reason.to_string())])
}

/// `GET /metrics`: this process's metrics, with the queues' depths read just now.
async fn metrics(state: web::Data<State>) -> HttpResponse {
    let metrics = ax_actors::metrics::metrics();
    if let Some(client) = &state.client {
        // Read now; when JetStream does not answer in time, the last depths read stand.
        let read = tokio::time::timeout(DEPTHS_TIMEOUT, client.queue_depths()).await;
        if let Ok(Ok(depths)) = read {
            metrics.set_queue_depths(&depths);
        }
    }
    if let Some(dir) = state.data_dir.clone() {
        let size = web::block(move || size_of(&dir)).await.unwrap_or(0);
        metrics
            .data_dir_bytes
            .set(i64::try_from(size).unwrap_or(i64::MAX));
    }
    match metrics.encode() {
        Ok(text) => HttpResponse::Ok()
            .content_type(ax_actors::metrics::CONTENT_TYPE)
            .body(text),
        Err(e) => HttpResponse::InternalServerError().body(format!("metrics not encoded: {e}")),
    }
}

/// The bytes of the files under `dir` (what cannot be read counts nothing).
fn size_of(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => size_of(&entry.path()),
            Ok(_) => entry.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .sum()
}
