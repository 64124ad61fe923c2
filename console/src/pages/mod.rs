//! The console's pages: HTML rendered on the server from compile-time templates
//! (`templates/`, askama, every value escaped), with htmx for the parts that refresh or answer
//! an action in place. Each page reads through the same library calls as the CLI and the API;
//! each action goes through [`crate::actions`].
//!
//! - [`dashboard`]: the day at a glance, refreshing itself;
//! - [`jobs`]: the job list and a job's page, with its actions; [`editor`]: a job's YAML,
//!   checked as it is typed, applied;
//! - [`dag`]: a business date's chains as an SVG, each job coloured by its instance;
//! - [`datasets`]: the datasets the jobs write and read, each with its updates and lineage;
//! - [`dead_letters`]: what ax gave up on, inspected and replayed (in bulk too);
//! - [`fleet`]: workers, nodes and queues (paused and resumed here);
//! - [`instances`]: the instance list (filtered and paged on the server) and an instance's page,
//!   with its actions; [`instance_log`]: its attempts' logs, followed while they run.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;

use crate::access::Caller;
use crate::problem::Problem;
use crate::server::State;

/// The value of a page's `Result<T, Box<HttpResponse>>`, or a return of its error page from
/// the handler: what every page does when NATS or the registry cannot answer.
macro_rules! or_return {
    ($result:expr) => {
        match $result {
            Ok(value) => value,
            Err(response) => return *response,
        }
    };
}
pub(crate) use or_return;

pub(crate) mod dag;
pub(crate) mod dashboard;
pub(crate) mod datasets;
pub(crate) mod dead_letters;
pub(crate) mod editor;
pub(crate) mod fleet;
pub(crate) mod instance_log;
pub(crate) mod instances;
pub(crate) mod jobs;
pub(crate) mod login;
pub(crate) mod trail;

/// The pages' routes.
pub(crate) fn routes(config: &mut web::ServiceConfig) {
    dashboard::routes(config);
    dag::routes(config);
    datasets::routes(config);
    dead_letters::routes(config);
    fleet::routes(config);
    editor::routes(config);
    jobs::routes(config);
    instances::routes(config);
    instance_log::routes(config);
    login::routes(config);
    trail::routes(config);
}

/// What every page's frame shows: who is acting, the token its script sends back, where we are.
#[derive(Clone, Debug)]
pub(crate) struct Chrome {
    pub(crate) csrf: String,
    pub(crate) who: String,
    pub(crate) role: String,
    pub(crate) section: &'static str,
    /// Signed in with a token (auth on): the frame offers to sign out.
    pub(crate) signed_in: bool,
    /// May trigger, pause, cancel, re-run: the pages show those controls.
    pub(crate) can_operate: bool,
    /// May apply, delete, mark, pause queues, decide approvals.
    pub(crate) can_admin: bool,
}

impl Chrome {
    pub(crate) fn of(caller: &Caller, section: &'static str) -> Chrome {
        Chrome {
            csrf: caller.csrf.clone(),
            who: caller.principal.name.clone(),
            role: caller.principal.roles(),
            section,
            signed_in: caller.principal.verified,
            can_operate: caller.may(crate::access::Role::Operator),
            can_admin: caller.may(crate::access::Role::Admin),
        }
    }
}

/// The caller the access check put on the request.
pub(crate) fn caller(request: &HttpRequest) -> Caller {
    use actix_web::HttpMessage;
    request
        .extensions()
        .get::<Caller>()
        .cloned()
        .unwrap_or_else(|| Caller {
            principal: crate::access::Principal::unverified("anonymous"),
            csrf: String::new(),
            token: None,
            via: crate::access::Via::Console,
        })
}

/// A rendered template as an HTML answer with `status`.
pub(crate) fn html(status: StatusCode, template: &impl Template) -> HttpResponse {
    match template.render() {
        Ok(body) => HttpResponse::build(status)
            .content_type("text/html; charset=utf-8")
            .body(body),
        Err(e) => HttpResponse::InternalServerError()
            .content_type("text/plain; charset=utf-8")
            .body(format!("the page could not be rendered: {e}")),
    }
}

/// The fragment an action answers with: what happened, or why nothing did.
#[derive(Template)]
#[template(path = "outcome.html")]
pub(crate) struct Outcome {
    pub(crate) ok: bool,
    pub(crate) text: String,
    pub(crate) instance: Option<String>,
}

impl Outcome {
    pub(crate) fn done(text: impl Into<String>, instance: Option<String>) -> Outcome {
        Outcome {
            ok: true,
            text: text.into(),
            instance,
        }
    }

    pub(crate) fn failed(text: impl Into<String>) -> Outcome {
        Outcome {
            ok: false,
            text: text.into(),
            instance: None,
        }
    }
}

/// What became of one of several things acted on at once.
pub(crate) struct Done {
    pub(crate) ok: bool,
    pub(crate) text: String,
}

/// The fragment of an action on several things: one line each.
#[derive(Template)]
#[template(path = "results.html")]
pub(crate) struct Results {
    pub(crate) results: Vec<Done>,
}

/// The values of a repeated form field (`id=1&id=2`), which a map-shaped form extractor would
/// fold into one.
pub(crate) fn repeated(body: &[u8], field: &str) -> Vec<String> {
    let prefix = format!("{field}=");
    String::from_utf8_lossy(body)
        .split('&')
        .filter_map(|pair| pair.strip_prefix(prefix.as_str()))
        .map(percent_decoded)
        .collect()
}

/// A form value decoded (`+` is a space, `%XX` a byte); a malformed escape is kept as it is.
/// Percent-encodes everything but unreserved characters (a value in a query string).
pub(crate) fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn percent_decoded(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() && value.is_char_boundary(i + 3) => {
                match u8::from_str_radix(&value[i + 1..i + 3], 16) {
                    Ok(byte) => {
                        out.push(byte);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            byte => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The fragment of a refused request (the access check's answer to htmx).
pub(crate) fn refusal(reason: &str) -> String {
    Outcome::failed(reason)
        .render()
        .unwrap_or_else(|_| "refused".into())
}

/// An action's failure as the fragment shown beside its control, with the status the API
/// gives for it.
pub(crate) fn action_failed(error: &Problem) -> HttpResponse {
    html(error.status(), &Outcome::failed(error.to_string()))
}

/// The fragment answering a control command: what the Scheduler said (with a link to the
/// instance it names), or why nothing was done.
pub(crate) fn replied(result: Result<impl ax_bus::messages::typed::Said, Problem>) -> HttpResponse {
    match result {
        Ok(reply) => html(
            StatusCode::OK,
            &Outcome::done(
                reply.message().to_string(),
                reply.instance().map(|i| i.to_string()),
            ),
        ),
        Err(e) => action_failed(&e),
    }
}

/// A whole page saying why there is nothing to show.
#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    chrome: Chrome,
    status: u16,
    reason: String,
}

pub(crate) fn error_page(
    request: &HttpRequest,
    status: StatusCode,
    reason: String,
) -> HttpResponse {
    let page = ErrorPage {
        chrome: Chrome::of(&caller(request), ""),
        status: status.as_u16(),
        reason,
    };
    html(status, &page)
}

/// Any other path: a JSON 404 under `/api/`, a page elsewhere.
pub(crate) async fn not_found(request: HttpRequest) -> HttpResponse {
    let reason = format!("{} {}: no such page", request.method(), request.path());
    if request.path().starts_with("/api/") {
        HttpResponse::NotFound().json(crate::server::error_body(&reason))
    } else {
        error_page(&request, StatusCode::NOT_FOUND, reason)
    }
}

/// The node's connection, or the page that says there is none.
pub(crate) fn client<'a>(
    state: &'a State,
    request: &HttpRequest,
) -> Result<&'a ax_bus::AxClient, Box<HttpResponse>> {
    state.client.as_ref().ok_or_else(|| {
        Box::new(error_page(
            request,
            StatusCode::SERVICE_UNAVAILABLE,
            "this node has no NATS connection".into(),
        ))
    })
}

/// Every job of the registry, for a page that lists or draws them (an error page when NATS
/// cannot be asked).
pub(crate) async fn registry_jobs(
    state: &State,
    request: &HttpRequest,
) -> Result<Vec<ax_bus::messages::JobRecord>, Box<HttpResponse>> {
    client(state, request)?.jobs().await.map_err(|e| {
        Box::new(error_page(
            request,
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the jobs could not be read: {e}"),
        ))
    })
}

/// Forms: the body limit, and a malformed form answered beside its control.
pub(crate) fn form_config() -> web::FormConfig {
    web::FormConfig::default()
        .limit(256 * 1024)
        .error_handler(|error, _| {
            let response = html(
                StatusCode::BAD_REQUEST,
                &Outcome::failed(format!("the form is malformed: {error}")),
            );
            actix_web::error::InternalError::from_response(error, response).into()
        })
}

/// A duration in milliseconds as people read it.
pub(crate) fn duration(ms: i64) -> String {
    ax_bus::time::human_ms(ms)
}

/// An instant in a job's time zone, with UTC beside it for a hover (`<time title=…>`).
pub(crate) struct Zoned {
    /// In the job's zone, naming it (`2026-12-05 08:00:00 Asia/Shanghai`), or `–`.
    pub(crate) local: String,
    /// In UTC, as [`time`] writes it.
    pub(crate) utc: String,
}

/// `at` in time zone `zone` (UTC when it is not a zone), and in UTC.
pub(crate) fn zoned(at: Option<chrono::DateTime<chrono::Utc>>, zone: &str) -> Zoned {
    let tz: chrono_tz::Tz = zone.parse().unwrap_or(chrono_tz::UTC);
    Zoned {
        local: at.map_or_else(
            || "–".into(),
            |t| {
                format!(
                    "{} {}",
                    t.with_timezone(&tz).format("%Y-%m-%d %H:%M:%S"),
                    tz.name()
                )
            },
        ),
        utc: time(at),
    }
}

/// An instant as the pages show it (UTC, to the second, saying so), or `–`.
pub(crate) fn time(at: Option<chrono::DateTime<chrono::Utc>>) -> String {
    at.map_or_else(
        || "–".into(),
        |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_say_their_zone() {
        let at = chrono::DateTime::parse_from_rfc3339("2026-12-04T23:20:36.500Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        assert_eq!(time(Some(at)), "2026-12-04 23:20:36 UTC");
        assert_eq!(time(None), "–");
        // A job's next fire in its own zone, UTC for the hover; a name that is no zone is UTC.
        let shanghai = zoned(Some(at), "Asia/Shanghai");
        assert_eq!(
            (shanghai.local.as_str(), shanghai.utc.as_str()),
            (
                "2026-12-05 07:20:36 Asia/Shanghai",
                "2026-12-04 23:20:36 UTC"
            )
        );
        assert_eq!(
            zoned(Some(at), "Mars/Base").local,
            "2026-12-04 23:20:36 UTC"
        );
        assert_eq!(zoned(None, "UTC").local, "–");
    }

    #[test]
    fn repeated_fields_are_all_read_and_decoded() {
        let body = b"id=a.k.x%3Ay&action=cancel&id=b.20261201T000000000Z&id=c+d&id=bad%zz";
        assert_eq!(
            repeated(body, "id"),
            ["a.k.x:y", "b.20261201T000000000Z", "c d", "bad%zz"]
        );
        assert_eq!(repeated(body, "action"), ["cancel"]);
        assert_eq!(duration(1_500), "1.5 s");
        assert_eq!(duration(3_725_000), "1h 02m");
    }
}
