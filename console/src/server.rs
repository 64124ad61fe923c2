//! The HTTP server of a node: `/metrics` for Prometheus, every request through
//! [`crate::access::check`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use actix_web::body::{BoxBody, EitherBody};
use actix_web::dev::{ServerHandle, ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::{from_fn, Next};
use actix_web::{web, App, HttpMessage, HttpResponse, HttpServer};

use ax_bus::AxClient;

use crate::access::{self, Via};
use crate::csrf;
use crate::index::InstanceIndex;

/// The largest request body taken (a job spec is at most 256 KiB; 413 beyond this).
pub(crate) const BODY_LIMIT: usize = 512 * 1024;
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

/// What a node serves.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The node's connection: `/metrics` reads the queues' depths through it, and the console
    /// and its API everything they show and do.
    pub client: Option<AxClient>,
    /// The node's data directory, whose size `/metrics` reports.
    pub data_dir: Option<PathBuf>,
    /// Whether to serve the console and its JSON API (role `admin`) beside `/metrics`.
    pub console: bool,
    /// Whether every route but the login needs a valid token (`[auth] enabled`).
    pub auth: bool,
    /// The node serving, named in the audit records of the requests it refuses.
    pub node: Option<ax_bus::ids::NodeId>,
    /// DNS names it answers for besides `localhost` and IP addresses (`[metrics] hosts`).
    pub hosts: Vec<String>,
    /// How long after their end the console's index holds finished instances
    /// (`[console] index_window`; `None`: [`crate::index::DEFAULT_WINDOW`]).
    pub index_window: Option<std::time::Duration>,
    /// How many finished instances the console's index holds at most (`[console]
    /// index_rows`; `None`: [`crate::index::DEFAULT_ROWS`]).
    pub index_rows: Option<usize>,
}

/// What the handlers share.
#[derive(Clone, Debug)]
pub(crate) struct State {
    /// Where queue depths and the summary are read (a node's connection).
    pub(crate) client: Option<AxClient>,
    /// The node's data directory, whose size `/metrics` reports.
    data_dir: Option<PathBuf>,
    /// The index of instances the lists page through (console nodes only).
    pub(crate) index: Option<InstanceIndex>,
    /// Who may ask what: the access check's view of identities and logins.
    pub(crate) gate: access::Gate,
}

/// Starts the server on `listen` (`HOST:PORT`; port 0 picks a free one) on the current actix
/// system, with what `options` asks for.
pub fn start(listen: &str, options: Options) -> Result<Running, ServerError> {
    let console = options.console;
    let index = match (&options.client, console) {
        (Some(client), true) => Some(InstanceIndex::follow(
            client.clone(),
            options.index_window.unwrap_or(crate::index::DEFAULT_WINDOW),
            options.index_rows.unwrap_or(crate::index::DEFAULT_ROWS),
        )),
        _ => None,
    };
    let gate = access::Gate {
        auth: options.auth,
        client: options.client.clone(),
        sessions: crate::session::Sessions::default(),
        node: options.node.clone(),
        hosts: options.hosts.clone(),
        throttle: crate::throttle::Throttle::default(),
    };
    let state = web::Data::new(State {
        client: options.client,
        data_dir: options.data_dir,
        index,
        gate,
    });
    let bind_error = |source| ServerError::Bind {
        addr: listen.to_string(),
        source,
    };
    let server = HttpServer::new(move || {
        let app = App::new()
            .app_data(state.clone())
            .app_data(web::PayloadConfig::new(BODY_LIMIT))
            .app_data(crate::api::json_config())
            .app_data(crate::api::query_config())
            .app_data(crate::pages::form_config())
            .wrap(from_fn(checked))
            .route("/metrics", web::get().to(metrics));
        if console {
            app.configure(crate::api::routes)
                .configure(crate::pages::routes)
                .configure(crate::changes::mount)
                .configure(crate::assets::routes)
                .default_service(web::to(crate::pages::not_found))
        } else {
            app
        }
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
    tracing::info!(%addr, console, "serving HTTP");
    Ok(Running { addr, handle })
}

/// The Content-Security-Policy of every answer: scripts, styles and images from this server
/// only, no inline script or style, no framing, forms only to this server.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'";

/// The access check, around every route; then the headers every answer carries.
async fn checked(
    request: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<EitherBody<BoxBody>>, actix_web::Error> {
    let host = target_host(&request);
    let gate = request
        .app_data::<web::Data<State>>()
        .map(|state| state.gate.clone())
        .unwrap_or_default();
    // The role is found from the path the router matches (percent-escapes decoded), never
    // the raw one: `/api/v1/%6Aobs` is routed to `/api/v1/jobs` and needs what it needs.
    let routed = request.match_info().as_str().to_string();
    let verdict = access::check(
        access::Request {
            method: request.method(),
            path: &routed,
            host: &host,
            headers: request.headers(),
            peer: request.peer_addr().map(|a| a.ip()),
        },
        &gate,
    )
    .await;
    let cached = routed.starts_with("/static/");
    let api = routed.starts_with("/api/") || routed == "/metrics";
    let mut response = match verdict {
        Ok((principal, token)) => {
            let existing = csrf::cookie_token(request.headers());
            let csrf_token = existing.clone().unwrap_or_else(csrf::new_token);
            let via = if api { Via::Api } else { Via::Console };
            let name = principal.name.clone();
            request.extensions_mut().insert(access::Caller {
                principal,
                csrf: csrf_token.clone(),
                token: token.clone(),
                via,
            });
            let acting = crate::actions::Acting { token, via, name };
            let mut response = crate::actions::as_caller(acting, next.call(request)).await?;
            let html = response
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/html"));
            if existing.is_none() && html {
                // Only pages embed the token, so only they give the cookie.
                response
                    .response_mut()
                    .add_cookie(&csrf::cookie(&csrf_token))?;
            }
            response.map_into_left_body()
        }
        Err(denied) => refused(request, &denied, &gate, api).map_into_right_body(),
    };
    secured(response.headers_mut(), cached);
    Ok(response)
}

/// The answer to a refused request: a page without a login goes to the login; a fragment
/// gets the refusal to show (and a redirect to the login); anything else the JSON error with
/// its status. Recorded on the audit trail when it says something.
fn refused(
    request: ServiceRequest,
    denied: &access::Denied,
    gate: &access::Gate,
    api: bool,
) -> ServiceResponse<BoxBody> {
    tracing::info!(reason = %denied, "request refused");
    access::audit_refusal(
        gate,
        &request,
        denied,
        if api { Via::Api } else { Via::Console },
    );
    let fragment = request.headers().contains_key("hx-request");
    let status = match denied {
        access::Denied::Unauthenticated(_) => actix_web::http::StatusCode::UNAUTHORIZED,
        access::Denied::Unavailable(_) => actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
        access::Denied::Throttled(_) => actix_web::http::StatusCode::TOO_MANY_REQUESTS,
        _ => actix_web::http::StatusCode::FORBIDDEN,
    };
    let login = matches!(denied, access::Denied::Unauthenticated(_));
    let mut response =
        if login && !api && !fragment && request.method() == actix_web::http::Method::GET {
            // A page without a login: to the login, then back.
            HttpResponse::SeeOther()
                .insert_header((header::LOCATION, "/login"))
                .finish()
        } else if fragment {
            let mut response = HttpResponse::build(status);
            if login {
                response.insert_header(("HX-Redirect", "/login"));
            }
            response
                .content_type("text/html; charset=utf-8")
                .body(crate::pages::refusal(&denied.to_string()))
        } else {
            let mut response = HttpResponse::build(status);
            if login {
                response.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
            }
            response.json(error_body(&denied.to_string()))
        };
    if let access::Denied::Throttled(wait) = denied {
        response.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(wait.as_secs().max(1)),
        );
    }
    request.into_response(response)
}

/// The authority the request was sent to, never a forwarding header a page could set itself:
/// the target's when it has one (absolute-form, or HTTP/2's `:authority`), which wins over
/// `Host` (RFC 9112 §3.2.2), else the `Host` the browser sent.
fn target_host(request: &ServiceRequest) -> String {
    request
        .uri()
        .authority()
        .map(|a| a.to_string())
        .or_else(|| {
            request
                .headers()
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        })
        .unwrap_or_default()
}

/// The headers every answer carries: the content security policy, no sniffing, no framing,
/// no referrer, and no caching but of the static files.
fn secured(headers: &mut actix_web::http::header::HeaderMap, cached: bool) {
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if !cached {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
}

pub(crate) fn error_body(reason: &str) -> std::collections::BTreeMap<&'static str, String> {
    std::collections::BTreeMap::from([("error", reason.to_string())])
}

/// `GET /metrics`: this process's metrics, with the queues' depths and the latest day's
/// figures (`ax status`'s) read just now.
async fn metrics(state: web::Data<State>) -> HttpResponse {
    let metrics = ax_actors::metrics::metrics();
    if let Some(client) = &state.client {
        // Read now; when JetStream does not answer in time, the last depths read stand.
        let read = tokio::time::timeout(DEPTHS_TIMEOUT, client.queue_depths()).await;
        if let Ok(Ok(depths)) = read {
            metrics.set_queue_depths(&depths);
        }
        let read = tokio::time::timeout(DEPTHS_TIMEOUT, client.day_summary(None)).await;
        if let Ok(Ok(Some(day))) = read {
            metrics.set_day(&day);
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
