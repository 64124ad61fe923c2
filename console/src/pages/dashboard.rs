//! The dashboard: the article's five figures of a day (instances, failures, average trigger
//! latency, longest execution, the five jobs failing most), what needs a look (failed, stuck
//! and long-running instances, each a link), the backlog of each queue, the live workers and
//! the last hour's alerts. The body refreshes itself every five seconds.
//!
//! Two counting rules, each with its own label on the page (docs/console.md, "Figures"). The
//! instances of a business date are counted from the instance index, each once in its
//! current state (a re-run counts once), as `ax instance list --biz-date` lists them: the
//! instances and failed cards, the state table, the failing jobs and the lists. What ended
//! on a date — each ending of an instance by its end time, a re-run's again — and the day's
//! trigger latency and longest run come from the day's summary the DagCoordinator keeps
//! ([`ax_bus::figures`]), as `ax status` and `/metrics` give them. Nothing scans the records.

use std::collections::BTreeSet;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;

use ax_bus::client::status::{QueueDepth, Status};

use crate::attention::Attention;
use crate::index::{Counts, Filter};
use crate::pages::{self, Chrome};
use crate::server::State;

pub(crate) fn routes(config: &mut web::ServiceConfig) {
    config
        .route("/", web::get().to(page))
        .route("/ui/dashboard", web::get().to(body));
}

pub(crate) struct Longest {
    pub(crate) instance_id: String,
    pub(crate) job: String,
    pub(crate) duration: String,
    pub(crate) attempt: Option<u32>,
}

#[derive(Template)]
#[template(path = "dashboard_body.html")]
pub(crate) struct Body {
    /// The date asked for (empty: the latest), which the refresh asks for again.
    requested: String,
    /// The namespace asked for (empty: every one), which the refresh asks for again.
    namespace: String,
    /// The namespaces shown, where not every one (asked for, or all a caller of single
    /// namespaces holds a role in): the figures of every namespace are left out then.
    namespaces: Option<String>,
    date: String,
    timezone: String,
    read_at: String,
    counts: Counts,
    /// Instances of the date that failed (their current state).
    failed: u64,
    /// What the summary says ended on the date (`ax status`): ended, of which failed.
    ended: u64,
    ended_failed: u64,
    latency: String,
    longest: Option<Longest>,
    attention: Attention,
    queues: Vec<QueueDepth>,
    workers_live: usize,
    alerts: Vec<(String, u64)>,
    nodes: String,
}

impl Body {
    /// A duration as the pages write it.
    fn human(&self, duration: &chrono::Duration) -> String {
        pages::duration(duration.num_milliseconds())
    }
}

#[derive(Template)]
#[template(path = "dashboard.html")]
struct Page {
    chrome: Chrome,
    body: Body,
    /// The namespaces to switch to: those holding jobs, of those the caller sees.
    namespaces: Vec<String>,
}

/// The date a dashboard shows: the one asked for, whether or not it has a summary (a day
/// nothing ended on shows zeros, never another day's figures); else the latest summarized;
/// else today.
fn shown_date(requested: &str, summarized: &str, today: &str) -> String {
    [requested, summarized, today]
        .into_iter()
        .find(|d| !d.is_empty())
        .unwrap_or_default()
        .to_string()
}

/// The body of the day's summary, `today` when none exists yet, of the instances of
/// `namespaces` only where given (the figures of every namespace are then left out).
fn body_of(
    status: Status,
    state: &State,
    query: &DateQuery,
    namespaces: Option<BTreeSet<String>>,
) -> Body {
    let requested = query.date.trim();
    let today = chrono::Utc::now().date_naive().to_string();
    let day = status.day.unwrap_or_default();
    let date = shown_date(requested, &day.date, &today);
    let now = chrono::Utc::now();
    let (counts, attention) = match &state.index {
        Some(index) => (
            index.counts(&Filter {
                biz_date: Some(date.clone()),
                namespaces: namespaces.clone(),
                ..Filter::default()
            }),
            index.attention(&date, now, namespaces.as_ref()),
        ),
        None => (Counts::default(), Attention::default()),
    };
    let queues = match &namespaces {
        None => status.queues,
        Some(kept) => status
            .queues
            .into_iter()
            .filter(|q| kept.contains(q.namespace()))
            .collect(),
    };
    let of_state = |wanted: ax_bus::State| {
        counts
            .by_state
            .iter()
            .find(|(s, _)| *s == wanted)
            .map_or(0, |(_, n)| *n)
    };
    let failed = of_state(ax_bus::State::Failed);
    let latency = day.average_latency_text().unwrap_or_else(|| "–".into());
    Body {
        requested: requested.to_string(),
        namespace: query.namespace.trim().to_string(),
        namespaces: namespaces.map(|n| n.into_iter().collect::<Vec<_>>().join(", ")),
        timezone: if day.timezone.is_empty() {
            "UTC".into()
        } else {
            day.timezone.clone()
        },
        date,
        read_at: chrono::Utc::now().format("%H:%M:%S UTC").to_string(),
        counts,
        failed,
        ended: day.finished,
        ended_failed: day.failed,
        latency,
        longest: day.longest.map(|l| Longest {
            instance_id: l.instance_id.to_string(),
            job: l.job.to_string(),
            duration: pages::duration(l.duration_ms),
            attempt: l.attempt,
        }),
        attention,
        queues,
        workers_live: status.workers_live,
        alerts: status.alerts_last_hour.into_iter().collect(),
        nodes: status.nodes.join(", "),
    }
}

/// The dashboard's query: the business date to show (the latest summarized when absent) and
/// the namespace (every one when absent).
#[derive(Debug, Default, serde::Deserialize)]
struct DateQuery {
    #[serde(default)]
    date: String,
    #[serde(default)]
    namespace: String,
}

async fn read(
    state: &State,
    request: &HttpRequest,
    query: &DateQuery,
) -> Result<Body, Box<HttpResponse>> {
    let client = pages::client(state, request)?;
    let asked = Some(query.namespace.trim()).filter(|n| !n.is_empty());
    if let Some(namespace) = asked {
        if let Err(e) = ax_bus::ids::Namespace::parse(namespace) {
            return Err(Box::new(pages::error_page(
                request,
                StatusCode::BAD_REQUEST,
                format!("namespace: {e}"),
            )));
        }
    }
    let seen = crate::scoped::seen(&pages::caller(request).principal);
    let namespaces = crate::scoped::kept(asked.map(|n| BTreeSet::from([n.to_string()])), seen);
    let date = Some(query.date.trim()).filter(|d| !d.is_empty());
    if let Some(date) = date {
        if ax_bus::time::parse_biz_date(date).is_none() {
            return Err(Box::new(pages::error_page(
                request,
                StatusCode::BAD_REQUEST,
                format!("date: `{date}` is not a date (YYYY-MM-DD)"),
            )));
        }
    }
    match client.status(date).await {
        Ok(status) => Ok(body_of(status, state, query, namespaces)),
        Err(e) => Err(Box::new(pages::error_page(
            request,
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the summary could not be read: {e}"),
        ))),
    }
}

async fn page(
    state: web::Data<State>,
    request: HttpRequest,
    query: web::Query<DateQuery>,
) -> HttpResponse {
    match read(&state, &request, &query).await {
        Ok(body) => {
            let seen = crate::scoped::seen(&pages::caller(&request).principal);
            let mut namespaces = BTreeSet::new();
            if let Some(client) = &state.client {
                for job in client.jobs().await.unwrap_or_default() {
                    namespaces.insert(job.spec.name.namespace().to_string());
                }
            }
            if let Some(seen) = seen {
                namespaces.retain(|n| seen.contains(n));
            }
            let page = Page {
                chrome: Chrome::of(&pages::caller(&request), "dashboard"),
                body,
                namespaces: namespaces.into_iter().collect(),
            };
            pages::html(StatusCode::OK, &page)
        }
        Err(response) => *response,
    }
}

async fn body(
    state: web::Data<State>,
    request: HttpRequest,
    query: web::Query<DateQuery>,
) -> HttpResponse {
    match read(&state, &request, &query).await {
        Ok(body) => pages::html(StatusCode::OK, &body),
        Err(response) => *response,
    }
}

#[cfg(test)]
mod tests {
    use super::shown_date;

    #[test]
    fn the_date_asked_for_is_the_date_shown_even_without_a_summary() {
        assert_eq!(shown_date("2026-10-01", "", "2026-12-04"), "2026-10-01");
        assert_eq!(
            shown_date("2026-10-01", "2026-12-03", "2026-12-04"),
            "2026-10-01"
        );
        assert_eq!(shown_date("", "2026-12-03", "2026-12-04"), "2026-12-03");
        assert_eq!(shown_date("", "", "2026-12-04"), "2026-12-04");
    }
}
