//! The instance list — filters (job, state, tag, business date, due window) and pages walked
//! on the server from the index, never everything loaded — and an instance's page: its record
//! read from the bucket, its history, its output and logs, and its actions (cancel, kill,
//! mark, re-run with the plan shown before anything runs).

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use serde::{Deserialize, Serialize};

use ax_bus::ids::{InstanceId, JobName};
use ax_bus::messages::commands::Command;
use ax_bus::messages::typed::Done as Carried;
use ax_bus::messages::{InstanceRequest, MarkRequest, PlanStep, RerunRequest};
use ax_bus::State as InstanceState;

use crate::actions::{self, InstanceAction};
use crate::changes::{changes, Does};
use crate::index::Filter;
use crate::pages::instance_log::{self, LogView};
use crate::pages::{self, Chrome, Done, Results};
use crate::problem::Problem;
use crate::server::State;

/// Rows per page of the list.
pub(crate) const PER_PAGE: usize = 50;

pub(crate) fn routes(config: &mut web::ServiceConfig) {
    config
        .route("/instances", web::get().to(list))
        .route("/instances/{id}", web::get().to(page))
        .route("/rerun", web::get().to(rerun_page));
}

changes! {
    // Re-runs (planned dry or carried out) and cancellations, each checked again as a command.
    POST "/ui/instances/bulk" => bulk, Does::Command(Command::Rerun);
    POST "/ui/instances/{id}/mark" => mark, Does::Command(Command::Mark);
    POST "/ui/instances/{id}/{action:cancel}" => act, Does::Command(Command::Cancel);
    POST "/ui/instances/{id}/{action:kill}" => act, Does::Command(Command::Kill);
    POST "/ui/rerun/plan" => plan, Does::Command(Command::Rerun);
    POST "/ui/rerun/run" => run, Does::Command(Command::Rerun);
    POST "/ui/backfill" => backfill, Does::Command(Command::Backfill);
}

/// The list's query, as the filter form sends it (empty = any).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default)]
pub(crate) struct ListQuery {
    pub(crate) job: String,
    pub(crate) state: String,
    pub(crate) tag: String,
    pub(crate) biz_date: String,
    pub(crate) from: String,
    pub(crate) to: String,
    /// Jobs left out, by name, separated by commas or spaces.
    pub(crate) hide: String,
    /// Only this namespace's jobs (empty: every namespace).
    pub(crate) namespace: String,
    /// 0-based.
    pub(crate) page: usize,
    /// Rows per page (the API's; pages show [`PER_PAGE`]).
    #[serde(skip_serializing)]
    pub(crate) per_page: Option<usize>,
}

fn instant(field: &str, text: &str) -> Result<Option<chrono::DateTime<chrono::Utc>>, Problem> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| Some(t.with_timezone(&chrono::Utc)))
        .map_err(|e| {
            Problem::Malformed(format!(
                "{field}: `{text}` is not an RFC 3339 instant ({e})"
            ))
        })
}

impl ListQuery {
    /// The index filter this query asks for; a malformed field is named.
    pub(crate) fn filter(&self) -> Result<Filter, Problem> {
        let job = match self.job.trim() {
            "" => None,
            job => Some(
                job.parse::<JobName>()
                    .map_err(|e| Problem::Malformed(format!("job: {e}")))?,
            ),
        };
        let state = match self.state.trim() {
            "" => None,
            state => Some(
                state
                    .parse::<InstanceState>()
                    .map_err(|e| Problem::Malformed(format!("state: {e}")))?,
            ),
        };
        let biz_date = match self.biz_date.trim() {
            "" => None,
            date => {
                chrono::NaiveDate::parse_from_str(date, "%Y-%m-%d").map_err(|_| {
                    Problem::Malformed(format!("biz_date: `{date}` is not a YYYY-MM-DD date"))
                })?;
                Some(date.to_string())
            }
        };
        let hide = self
            .hide
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|name| !name.is_empty())
            .map(|name| {
                name.parse::<JobName>()
                    .map_err(|e| Problem::Malformed(format!("hide: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Filter {
            job,
            job_part: None,
            state,
            tag: Some(self.tag.trim().to_string()).filter(|t| !t.is_empty()),
            biz_date,
            from: instant("from", &self.from)?,
            to: instant("to", &self.to)?,
            hide,
            namespaces: match self.namespace.as_str() {
                "" => None,
                namespace => Some(
                    [ax_bus::ids::Namespace::parse(namespace)
                        .map_err(|e| Problem::Malformed(format!("namespace: {e}")))?
                        .to_string()]
                    .into(),
                ),
            },
        })
    }

    fn link(&self, page: usize) -> String {
        let query = ListQuery {
            page,
            ..self.clone()
        };
        let encoded = serde_urlencoded_pairs(&query);
        format!("/instances?{encoded}")
    }
}

/// The query as `a=b&c=d`, fields left empty left out.
fn serde_urlencoded_pairs(query: &ListQuery) -> String {
    let pairs = [
        ("job", query.job.as_str()),
        ("state", query.state.as_str()),
        ("tag", query.tag.as_str()),
        ("biz_date", query.biz_date.as_str()),
        ("from", query.from.as_str()),
        ("to", query.to.as_str()),
        ("hide", query.hide.as_str()),
    ];
    let mut parts: Vec<String> = pairs
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={}", pages::percent(v)))
        .collect();
    parts.push(format!("page={}", query.page));
    parts.join("&")
}

struct ListRow {
    instance_id: String,
    job: String,
    biz_date: String,
    state: String,
    tag: String,
    attempt: u32,
    due: String,
    finished: String,
    /// How long its current attempt ran (`–` until it ended).
    ran: String,
    worker: String,
    message: String,
}

#[derive(Template)]
#[template(path = "instances.html")]
struct ListPage {
    chrome: Chrome,
    query: ListQuery,
    states: Vec<String>,
    tags: Vec<String>,
    problem: Option<String>,
    index_current: bool,
    rows: Vec<ListRow>,
    page_number: usize,
    previous: Option<String>,
    next: Option<String>,
}

/// The page's filter: as the API's, except that a job that is not one of the index's names
/// the jobs whose names contain it (`order` finds `sync_order_daily` and `order_stat_daily`).
fn searched(
    query: &ListQuery,
    index: Option<&crate::index::InstanceIndex>,
) -> Result<Filter, Problem> {
    let exact = query
        .job
        .trim()
        .parse::<JobName>()
        .ok()
        .filter(|job| index.is_some_and(|index| index.has_job(job)));
    if exact.is_some() || query.job.trim().is_empty() {
        return query.filter();
    }
    let part = query.job.trim().to_string();
    let filter = ListQuery {
        job: String::new(),
        ..query.clone()
    }
    .filter()?;
    Ok(Filter {
        job_part: Some(part),
        ..filter
    })
}

async fn list(
    state: web::Data<State>,
    request: HttpRequest,
    query: web::Query<ListQuery>,
) -> HttpResponse {
    let query = query.into_inner();
    let (filter, problem) = match searched(&query, state.index.as_ref()) {
        Ok(filter) => (Some(filter), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let seen = crate::scoped::seen(&pages::caller(&request).principal);
    let filter = filter.map(|filter| Filter {
        namespaces: crate::scoped::kept(filter.namespaces, seen),
        ..filter
    });
    let (page, current) = match (&state.index, &filter) {
        (Some(index), Some(filter)) => (
            Some(index.page(filter, query.page, PER_PAGE)),
            index.is_current(),
        ),
        _ => (None, true),
    };
    let more = page.as_ref().is_some_and(|p| p.more);
    let rows = page
        .map(|p| p.rows)
        .unwrap_or_default()
        .into_iter()
        .map(|r| ListRow {
            instance_id: r.instance_id.to_string(),
            job: r.job.to_string(),
            biz_date: r.biz_date,
            state: r.state.to_string(),
            tag: r.tag.to_string(),
            attempt: r.attempt,
            due: pages::time(Some(r.expected_time)),
            finished: pages::time(r.finished_at),
            ran: match (r.started_at, r.finished_at) {
                (Some(start), Some(end)) => pages::duration((end - start).num_milliseconds()),
                _ => "–".into(),
            },
            worker: r.worker.unwrap_or_else(|| "–".into()),
            message: r.message,
        })
        .collect();
    let status = if problem.is_some() {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    let list = ListPage {
        chrome: Chrome::of(&pages::caller(&request), "instances"),
        states: InstanceState::ALL.iter().map(|s| s.to_string()).collect(),
        tags: ax_bus::Tag::ALL.iter().map(|t| t.to_string()).collect(),
        problem,
        index_current: current,
        rows,
        page_number: query.page + 1,
        previous: (query.page > 0).then(|| query.link(query.page - 1)),
        next: more.then(|| query.link(query.page + 1)),
        query,
    };
    pages::html(status, &list)
}

struct HistoryLine {
    at: String,
    text: String,
}

/// One attempt's steps, under a line that says how long it ran.
struct AttemptSteps {
    attempt: u32,
    /// `ran 3s on w1`, `running on w1 for 2m 10s`, `did not start`.
    summary: String,
    /// While it runs: how long so far, ticking on the page.
    running: Option<Running>,
    steps: Vec<HistoryLine>,
}

/// An attempt running: the words before its time (`running on w1 for`), when it started (RFC
/// 3339, from which the page makes the time tick) and how long it has run when the page was
/// made.
struct Running {
    words: String,
    since: String,
    elapsed: String,
}

/// The steps of an instance's history grouped by attempt (oldest first), each attempt with
/// how long it ran — from its start to its end, or to `now` while it runs — and how it ended,
/// as its own last revision says (`attempts`).
fn by_attempt(
    history: ax_bus::history::History,
    now: chrono::DateTime<chrono::Utc>,
) -> Vec<AttemptSteps> {
    let ax_bus::history::History {
        steps, attempts, ..
    } = history;
    use ax_bus::history::StepKind;
    let mut groups: Vec<(u32, Vec<ax_bus::history::Step>)> = Vec::new();
    for step in steps {
        match groups.last_mut() {
            Some((attempt, group)) if *attempt == step.attempt => group.push(step),
            _ => groups.push((step.attempt, vec![step])),
        }
    }
    groups
        .into_iter()
        .map(|(attempt, steps)| {
            let started = steps.iter().find(|s| s.step == StepKind::Started);
            let ended = steps
                .iter()
                .find(|s| matches!(s.step, StepKind::Ended | StepKind::Killed | StepKind::Lost));
            let worker = started
                .and_then(|s| s.worker.as_ref())
                .map(|w| format!(" on {w}"))
                .unwrap_or_default();
            let summary = match (started, ended) {
                (Some(start), Some(end)) => format!(
                    "ran {}{worker}",
                    pages::duration((end.at - start.at).num_milliseconds())
                ),
                (Some(start), None) => format!(
                    "running{worker} for {}",
                    pages::duration((now - start.at).num_milliseconds())
                ),
                (None, _) => "did not start".into(),
            };
            let outcome = attempts
                .iter()
                .find(|a| a.attempt == attempt && a.finished_at.is_some())
                .map(|a| {
                    let exit = a
                        .exit_code
                        .map(|c| format!(", exit code {c}"))
                        .unwrap_or_default();
                    let used = a.usage.map(|u| format!("; used {u}")).unwrap_or_default();
                    format!(": {} {}{exit}{used}", a.state, a.tag)
                })
                .unwrap_or_default();
            let summary = format!("{summary}{outcome}");
            let running = match (started, ended) {
                (Some(start), None) => Some(Running {
                    words: format!("running{worker} for"),
                    since: ax_bus::time::rfc3339(start.at),
                    elapsed: pages::duration((now - start.at).num_milliseconds()),
                }),
                _ => None,
            };
            let steps = steps.into_iter().map(history_line).collect();
            AttemptSteps {
                attempt,
                summary,
                running,
                steps,
            }
        })
        .collect()
}

/// One step as the page writes it.
fn history_line(step: ax_bus::history::Step) -> HistoryLine {
    HistoryLine {
        at: pages::time(Some(step.at)),
        text: format!(
            "{} ({}, {}){}{}",
            step.step.as_str(),
            step.state,
            step.tag,
            step.worker
                .map(|w| format!(", worker {w}"))
                .unwrap_or_default(),
            if step.detail.is_empty() {
                String::new()
            } else {
                format!(": {}", step.detail)
            }
        ),
    }
}

#[derive(Template)]
#[template(path = "instance.html")]
struct InstancePage {
    chrome: Chrome,
    id: String,
    job: String,
    biz_date: String,
    state: String,
    tag: String,
    /// Only the actions that apply to the state are offered.
    can_cancel: bool,
    can_kill: bool,
    attempt: u32,
    trace_id: String,
    expected_time: String,
    started_at: String,
    finished_at: String,
    worker: String,
    exit_code: String,
    /// What the ended attempt's processes used (`cpu 1.234 s, peak memory 63.9Mi`).
    usage: String,
    trigger: String,
    priority: String,
    next_attempt_at: String,
    message: String,
    history: Vec<AttemptSteps>,
    output: String,
    params: String,
    stdout: String,
    stderr: String,
    log: LogView,
}

/// A value's serde name (`manual`, `high`, ...).
fn word<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(text)) => text,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

fn instance_id(text: &str) -> Result<InstanceId, Problem> {
    text.parse::<InstanceId>()
        .map_err(|e| Problem::Malformed(format!("instance: {e}")))
}

/// Which attempt's log the instance page shows (the last by default).
#[derive(Deserialize)]
struct PageQuery {
    attempt: Option<u32>,
}

async fn page(
    state: web::Data<State>,
    request: HttpRequest,
    id: web::Path<String>,
    query: web::Query<PageQuery>,
) -> HttpResponse {
    let client = pages::or_return!(pages::client(&state, &request));
    let id = match instance_id(&id) {
        Ok(id) => id,
        Err(e) => return pages::error_page(&request, StatusCode::BAD_REQUEST, e.to_string()),
    };
    let read = tokio::try_join!(client.instance(&id), client.instance_history(&id));
    let (record, history) = match read {
        Ok((Some((record, _)), history)) => (record, history),
        Ok((None, _)) => {
            return pages::error_page(
                &request,
                StatusCode::NOT_FOUND,
                format!("instance: {}", ax_bus::client::retention::missing(id)),
            )
        }
        Err(e) => {
            return pages::error_page(
                &request,
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the instance could not be read: {e}"),
            )
        }
    };
    let log = match instance_log::view(client, &record, query.attempt).await {
        Ok(log) => log,
        Err(e) => {
            return pages::error_page(
                &request,
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the instance's log could not be read: {e}"),
            )
        }
    };
    let history = history
        .map(|h| by_attempt(h, chrono::Utc::now()))
        .unwrap_or_default();
    let pretty = |value: &serde_json::Value| {
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    };
    let page = InstancePage {
        chrome: Chrome::of(&pages::caller(&request), "instances"),
        id: id.to_string(),
        job: record.job.to_string(),
        biz_date: record.biz_date.clone(),
        state: record.state.to_string(),
        tag: record.tag.to_string(),
        can_cancel: record.cancellable(),
        can_kill: record.executing(),
        attempt: record.attempt,
        trace_id: record.trace_id.to_string(),
        expected_time: pages::time(Some(record.expected_time)),
        started_at: pages::time(record.started_at),
        finished_at: pages::time(record.finished_at),
        worker: record
            .worker
            .as_ref()
            .map_or_else(|| "–".into(), |w| w.to_string()),
        exit_code: record
            .exit_code
            .map_or_else(|| "–".into(), |c| c.to_string()),
        usage: record.usage.map_or_else(|| "–".into(), |u| u.to_string()),
        trigger: word(&record.trigger),
        priority: word(&record.priority),
        next_attempt_at: pages::time(record.next_attempt_at),
        message: record.message.clone(),
        history,
        output: pretty(&record.output),
        params: pretty(&serde_json::to_value(&record.params).unwrap_or_default()),
        stdout: record.stdout_tail.clone(),
        stderr: record.stderr_tail.clone(),
        log,
    };
    pages::html(StatusCode::OK, &page)
}

/// Who the console says acts, in the records and the audit.
fn requested_by(request: &HttpRequest) -> String {
    pages::caller(request).principal.name
}

/// A cancel's or a kill's form: why, for the record and the audit, as the CLI's `--reason`.
#[derive(Debug, Default, Deserialize)]
struct ReasonForm {
    #[serde(default)]
    reason: String,
}

async fn act(
    state: web::Data<State>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
    form: web::Form<ReasonForm>,
) -> HttpResponse {
    pages::replied(acted(&state, &request, &path.0, &path.1, &form.reason).await)
}

async fn acted(
    state: &State,
    request: &HttpRequest,
    id: &str,
    action: &str,
    reason: &str,
) -> Result<Carried, Problem> {
    let action = match action {
        "cancel" => InstanceAction::Cancel,
        "kill" => InstanceAction::Kill,
        other => {
            return Err(Problem::NotFound(format!(
                "action: no instance action `{other}` (cancel, kill, mark)"
            )))
        }
    };
    if reason.trim().is_empty() {
        return Err(Problem::Malformed(
            "reason: say why (it goes to the record and the audit)".into(),
        ));
    }
    let act = InstanceRequest {
        instance: instance_id(id)?,
        reason: Some(reason.trim().to_string()),
        requested_by: requested_by(request),
    };
    actions::instance(crate::api::client(state)?, action, &act).await
}

#[derive(Debug, Deserialize)]
struct MarkForm {
    state: String,
    #[serde(default)]
    reason: String,
}

async fn mark(
    state: web::Data<State>,
    request: HttpRequest,
    id: web::Path<String>,
    form: web::Form<MarkForm>,
) -> HttpResponse {
    pages::replied(marked(&state, &request, &id, &form).await)
}

async fn marked(
    state: &State,
    request: &HttpRequest,
    id: &str,
    form: &MarkForm,
) -> Result<Carried, Problem> {
    let verdict = match form.state.as_str() {
        "success" => InstanceState::Success,
        "failed" => InstanceState::Failed,
        other => {
            return Err(Problem::Malformed(format!(
                "state: `{other}` is no verdict (success or failed)"
            )))
        }
    };
    if form.reason.trim().is_empty() {
        return Err(Problem::Malformed(
            "reason: say why (it goes to the audit)".into(),
        ));
    }
    let mark = MarkRequest {
        instance: instance_id(id)?,
        state: verdict,
        reason: form.reason.trim().to_string(),
        requested_by: requested_by(request),
    };
    actions::mark(crate::api::client(state)?, &mark).await
}

/// The re-run form: one instance, or a business date's chain from a root.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RerunForm {
    instance: String,
    biz_date: String,
    root: String,
    failed_only: Option<String>,
    force_downstream: Option<String>,
    confirm_date: String,
}

impl RerunForm {
    fn request(&self, dry_run: bool, by: String) -> Result<RerunRequest, Problem> {
        let instance = match self.instance.trim() {
            "" => None,
            id => Some(instance_id(id)?),
        };
        let root = match self.root.trim() {
            "" => None,
            root => Some(
                root.parse::<JobName>()
                    .map_err(|e| Problem::Malformed(format!("root: {e}")))?,
            ),
        };
        Ok(RerunRequest {
            instance,
            biz_date: Some(self.biz_date.trim().to_string()).filter(|d| !d.is_empty()),
            root,
            failed_only: self.failed_only.is_some(),
            force_downstream: self.force_downstream.is_some(),
            dry_run,
            requested_by: by,
        })
    }
}

#[derive(Template)]
#[template(path = "plan.html")]
struct PlanFragment {
    dry_run: bool,
    steps: Vec<PlanStep>,
    runs: usize,
    instance: Option<String>,
    biz_date: Option<String>,
    root: Option<String>,
    failed_only: bool,
    force_downstream: bool,
    /// Why the plan was not run (shown beside its button).
    problem: Option<String>,
}

fn plan_fragment(rerun: &RerunRequest, steps: Vec<PlanStep>) -> PlanFragment {
    PlanFragment {
        problem: None,
        dry_run: rerun.dry_run,
        runs: steps.iter().filter(|s| s.will_run).count(),
        steps,
        instance: rerun.instance.as_ref().map(|i| i.to_string()),
        biz_date: rerun.biz_date.clone(),
        root: rerun.root.as_ref().map(|r| r.to_string()),
        failed_only: rerun.failed_only,
        force_downstream: rerun.force_downstream,
    }
}

/// `POST /ui/rerun/plan`: the dry run, with a button that runs exactly this request.
async fn plan(
    state: web::Data<State>,
    request: HttpRequest,
    form: web::Form<RerunForm>,
) -> HttpResponse {
    rerun(&state, &request, &form, true).await
}

/// `POST /ui/rerun/run`: the re-run itself (a forced one only with its date typed).
async fn run(
    state: web::Data<State>,
    request: HttpRequest,
    form: web::Form<RerunForm>,
) -> HttpResponse {
    rerun(&state, &request, &form, false).await
}

async fn rerun(
    state: &State,
    request: &HttpRequest,
    form: &RerunForm,
    dry_run: bool,
) -> HttpResponse {
    let client = pages::or_return!(pages::client(state, request));
    let rerun = match form.request(dry_run, requested_by(request)) {
        Ok(rerun) => rerun,
        Err(e) => return pages::action_failed(&e),
    };
    if !dry_run && rerun.force_downstream {
        if let Err(e) = confirmed(client, &rerun, form.confirm_date.trim()).await {
            // The plan again, with the reason beside its button: nothing ran.
            let dry = RerunRequest {
                dry_run: true,
                ..rerun
            };
            return match actions::rerun(client, &dry).await {
                Ok(reply) => {
                    let mut fragment = plan_fragment(&dry, reply.plan);
                    fragment.problem = Some(e.to_string());
                    pages::html(e.status(), &fragment)
                }
                Err(_) => pages::action_failed(&e),
            };
        }
    }
    match actions::rerun(client, &rerun).await {
        Ok(reply) => pages::html(StatusCode::OK, &plan_fragment(&rerun, reply.plan)),
        Err(e) => pages::action_failed(&e),
    }
}

/// A forced re-run runs only when the operator typed its business date.
async fn confirmed(
    client: &ax_bus::AxClient,
    rerun: &RerunRequest,
    typed: &str,
) -> Result<(), Problem> {
    let date = match (&rerun.biz_date, &rerun.instance) {
        (Some(date), _) => date.clone(),
        (None, Some(id)) => match client.instance(id).await {
            Ok(Some((record, _))) => record.biz_date,
            Ok(None) => {
                return Err(Problem::NotFound(format!(
                    "instance: {}",
                    ax_bus::client::retention::missing(id)
                )))
            }
            Err(e) => return Err(Problem::Unavailable(e.to_string())),
        },
        (None, None) => String::new(),
    };
    if typed == date {
        Ok(())
    } else {
        Err(Problem::Malformed(format!(
            "confirm_date: type the business date `{date}` to force its downstream"
        )))
    }
}

#[derive(Template)]
#[template(path = "rerun.html")]
struct RerunPage {
    chrome: Chrome,
    instance: String,
    jobs: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
struct RerunQuery {
    #[serde(default)]
    instance: String,
}

/// `GET /rerun[?instance=ID]`: the re-run dialog (plan first) and the backfill.
async fn rerun_page(
    state: web::Data<State>,
    request: HttpRequest,
    query: web::Query<RerunQuery>,
) -> HttpResponse {
    let jobs = pages::or_return!(pages::registry_jobs(&state, &request).await)
        .into_iter()
        .map(|j| j.spec.name.to_string())
        .collect();
    let page = RerunPage {
        chrome: Chrome::of(&pages::caller(&request), "rerun"),
        instance: query.instance.clone(),
        jobs,
    };
    pages::html(StatusCode::OK, &page)
}

#[derive(Debug, Deserialize)]
struct BackfillForm {
    job: String,
    from: String,
    to: String,
    #[serde(default)]
    parallel: String,
    #[serde(default)]
    with_downstream: Option<String>,
}

#[derive(Template)]
#[template(path = "backfilled.html")]
struct Backfilled {
    steps: Vec<PlanStep>,
}

/// `POST /ui/backfill`: the instances of a range of dates, as `ax backfill`.
async fn backfill(
    state: web::Data<State>,
    request: HttpRequest,
    form: web::Form<BackfillForm>,
) -> HttpResponse {
    let client = pages::or_return!(pages::client(&state, &request));
    // Every problem of the form at once, one per line.
    let mut errors = Vec::new();
    let parallel = match form.parallel.trim() {
        "" => None,
        text => match text.parse::<u32>().ok().filter(|p| *p > 0) {
            Some(p) => Some(p),
            None => {
                errors.push(format!("parallel: `{text}` is not a count above 0"));
                None
            }
        },
    };
    let job = form
        .job
        .trim()
        .parse::<JobName>()
        .map_err(|e| errors.push(format!("job: {e}")))
        .ok();
    for (field, text) in [("from", &form.from), ("to", &form.to)] {
        if ax_bus::time::parse_biz_date(text.trim()).is_none() {
            errors.push(format!(
                "{field}: `{}` is not a date (YYYY-MM-DD)",
                text.trim()
            ));
        }
    }
    let result = match job {
        Some(job) if errors.is_empty() => {
            let backfill = ax_bus::messages::BackfillRequest {
                job,
                from: form.from.trim().to_string(),
                to: form.to.trim().to_string(),
                with_downstream: form.with_downstream.is_some(),
                parallel,
                requested_by: requested_by(&request),
            };
            actions::backfill(client, &backfill).await
        }
        _ => Err(Problem::Malformed(errors.join("\n"))),
    };
    match result {
        Ok(reply) => pages::html(StatusCode::OK, &Backfilled { steps: reply.plan }),
        Err(e) => pages::action_failed(&e),
    }
}

/// The most instances one bulk action takes (two pages of the list).
const MAX_BULK: usize = 2 * PER_PAGE;

#[derive(Template)]
#[template(path = "bulk_plan.html")]
struct BulkPlan {
    dry_run: bool,
    steps: Vec<PlanStep>,
    problems: Vec<String>,
    runs: usize,
    ids: Vec<String>,
}

/// `POST /ui/instances/bulk` with `id`s and an `action`: `plan` (the re-run of each, dry),
/// `rerun` (the same, carried out) or `cancel`.
/// Adds a plan's steps to the bulk plan, each instance once: one listed already runs if either
/// plan runs it (the first reason is kept).
fn merge_plan(steps: &mut Vec<PlanStep>, plan: Vec<PlanStep>) {
    for step in plan {
        match steps.iter_mut().find(|s| s.instance_id == step.instance_id) {
            Some(listed) => listed.will_run |= step.will_run,
            None => steps.push(step),
        }
    }
}

async fn bulk(state: web::Data<State>, request: HttpRequest, body: web::Bytes) -> HttpResponse {
    let client = pages::or_return!(pages::client(&state, &request));
    let ids = pages::repeated(&body, "id");
    if ids.is_empty() || ids.len() > MAX_BULK {
        return pages::action_failed(&Problem::Malformed(format!(
            "id: select between 1 and {MAX_BULK} instances"
        )));
    }
    let action = pages::repeated(&body, "action").pop().unwrap_or_default();
    let by = requested_by(&request);
    match action.as_str() {
        "plan" | "rerun" => {
            let dry_run = action == "plan";
            let (mut steps, mut problems): (Vec<PlanStep>, Vec<String>) = (Vec::new(), Vec::new());
            for id in &ids {
                // Already in an earlier selection's plan (its downstream): re-run with it, not
                // twice.
                if steps
                    .iter()
                    .any(|s| s.will_run && s.instance_id.as_str() == id.as_str())
                {
                    continue;
                }
                let result = match instance_id(id) {
                    Ok(instance) => {
                        let rerun = RerunRequest {
                            instance: Some(instance),
                            biz_date: None,
                            root: None,
                            failed_only: false,
                            force_downstream: false,
                            dry_run,
                            requested_by: by.clone(),
                        };
                        actions::rerun(client, &rerun).await
                    }
                    Err(e) => Err(e),
                };
                match result {
                    Ok(reply) => merge_plan(&mut steps, reply.plan),
                    Err(e) => problems.push(format!("{id}: {e}")),
                }
            }
            let fragment = BulkPlan {
                dry_run,
                runs: steps.iter().filter(|s| s.will_run).count(),
                steps,
                problems,
                ids,
            };
            pages::html(StatusCode::OK, &fragment)
        }
        "cancel" => {
            let mut results = Vec::new();
            for id in &ids {
                let result = match instance_id(id) {
                    Ok(instance) => {
                        let cancel = InstanceRequest {
                            instance,
                            reason: Some("from the console (bulk)".into()),
                            requested_by: by.clone(),
                        };
                        actions::instance(client, InstanceAction::Cancel, &cancel).await
                    }
                    Err(e) => Err(e),
                };
                results.push(match result {
                    Ok(reply) => Done {
                        ok: true,
                        text: format!("{id}: {}", reply.message),
                    },
                    Err(e) => Done {
                        ok: false,
                        text: format!("{id}: {e}"),
                    },
                });
            }
            pages::html(StatusCode::OK, &Results { results })
        }
        other => pages::action_failed(&Problem::Malformed(format!(
            "action: `{other}` is no bulk action (plan, rerun, cancel)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(id: &str, will_run: bool) -> PlanStep {
        PlanStep {
            instance_id: id.parse().unwrap(),
            job: id.split('.').next().unwrap().parse().unwrap(),
            biz_date: "2026-12-01".into(),
            state: InstanceState::Failed,
            will_run,
            why: String::new(),
            rewrites: Vec::new(),
        }
    }

    #[test]
    fn a_bulk_plan_lists_each_instance_once() {
        let mut steps = Vec::new();
        merge_plan(
            &mut steps,
            vec![step("extract.1", true), step("load.1", true)],
        );
        merge_plan(
            &mut steps,
            vec![step("load.1", true), step("report.1", false)],
        );
        merge_plan(&mut steps, vec![step("report.1", true)]);
        let listed: Vec<(String, bool)> = steps
            .iter()
            .map(|s| (s.instance_id.to_string(), s.will_run))
            .collect();
        let want = [("extract.1", true), ("load.1", true), ("report.1", true)];
        assert_eq!(listed, want.map(|(id, run)| (id.to_string(), run)).to_vec());
    }
}
