//! The job list (search and filters on the server) and a job's page: its definition (secrets
//! redacted, as `ax job get` prints it), next fire, recent instances and ticks, and its actions
//! — trigger now / at / in with parameters, pause, resume, delete.

use std::collections::BTreeMap;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use serde::Deserialize;

use ax_bus::ids::{JobName, TriggerKey};
use ax_bus::messages::commands::Command;
use ax_bus::messages::typed::{Done, Triggered};
use ax_bus::messages::{JobRecord, TriggerRequest};
use ax_bus::spec::{self, JobDocument, JobSpec};

use crate::actions::{self, JobAction};
use crate::changes::{changes, Does};
use crate::job_view::next_fire;
use crate::pages::{self, Chrome};
use crate::problem::Problem;
use crate::server::State;

/// How many ticks and recent instances a job's page shows.
const SHOWN: usize = 20;

pub(crate) fn routes(config: &mut web::ServiceConfig) {
    config
        .route("/jobs", web::get().to(list))
        .route("/jobs/{name}", web::get().to(page));
}

changes! {
    POST "/ui/jobs/{name}/trigger" => trigger, Does::Command(Command::Trigger);
    POST "/ui/jobs/{name}/{action:pause}" => act, Does::Command(Command::Pause);
    POST "/ui/jobs/{name}/{action:resume}" => act, Does::Command(Command::Resume);
    POST "/ui/jobs/{name}/{action:delete}" => act, Does::Command(Command::Delete);
}

/// The list's filters, as the form sends them (empty = any).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct JobFilter {
    pub(crate) q: String,
    pub(crate) executor: String,
    pub(crate) tag: String,
    pub(crate) paused: String,
    /// The namespace whose jobs are listed (empty: every namespace).
    pub(crate) namespace: String,
}

impl JobFilter {
    pub(crate) fn admits(&self, job: &JobRecord) -> bool {
        (self.q.is_empty() || job.spec.name.as_str().contains(self.q.trim()))
            && (self.namespace.is_empty() || job.spec.name.namespace() == self.namespace)
            && (self.executor.is_empty() || job.spec.exec.name() == self.executor)
            && (self.tag.is_empty() || job.spec.tags.contains(&self.tag))
            && match self.paused.as_str() {
                "yes" => job.paused,
                "no" => !job.paused,
                _ => true,
            }
    }
}

struct JobRow {
    name: String,
    schedule: String,
    timezone: String,
    executor: String,
    tags: String,
    paused: bool,
    next_fire: pages::Zoned,
    /// Its last runs, oldest first (left to right), each a coloured cell.
    runs: Vec<RunCell>,
}

/// One run in a job's row of last runs.
pub(crate) struct RunCell {
    pub(crate) instance_id: String,
    pub(crate) state: String,
    /// What hovering it says: id, state, tag and how long it ran.
    pub(crate) title: String,
}

/// How many last runs a job's row shows.
const LAST_RUNS: usize = 10;

/// The last `n` runs of `job` in the index, oldest first.
pub(crate) fn last_runs(state: &State, job: &ax_bus::ids::JobName, n: usize) -> Vec<RunCell> {
    let Some(index) = &state.index else {
        return Vec::new();
    };
    let filter = crate::index::Filter {
        job: Some(job.clone()),
        ..crate::index::Filter::default()
    };
    let mut runs: Vec<RunCell> = index
        .page(&filter, 0, n)
        .rows
        .into_iter()
        .map(|row| {
            let ran = match (row.started_at, row.finished_at) {
                (Some(start), Some(end)) => {
                    format!(
                        ", ran {}",
                        pages::duration((end - start).num_milliseconds())
                    )
                }
                _ => String::new(),
            };
            RunCell {
                title: format!("{} · {} ({}){ran}", row.instance_id, row.state, row.tag),
                instance_id: row.instance_id.to_string(),
                state: row.state.to_string(),
            }
        })
        .collect();
    runs.reverse();
    runs
}

#[derive(Template)]
#[template(path = "jobs.html")]
struct ListPage {
    chrome: Chrome,
    filter: JobFilter,
    /// The namespaces that hold jobs, for the namespace filter.
    namespaces: Vec<String>,
    executors: Vec<String>,
    rows: Vec<JobRow>,
    total: usize,
}

fn schedule(spec: &JobSpec) -> String {
    match (&spec.cron, &spec.at, spec.deps.is_empty()) {
        (Some(cron), _, _) => cron.clone(),
        (None, Some(at), _) => format!("at {at}"),
        (None, None, false) => "after its dependencies".into(),
        (None, None, true) => "on trigger".into(),
    }
}

async fn list(
    state: web::Data<State>,
    request: HttpRequest,
    filter: web::Query<JobFilter>,
) -> HttpResponse {
    let mut jobs = pages::or_return!(pages::registry_jobs(&state, &request).await);
    if let Some(kept) = crate::scoped::seen(&pages::caller(&request).principal) {
        jobs.retain(|j| kept.contains(j.spec.name.namespace()));
    }
    let mut executors: Vec<String> = jobs
        .iter()
        .map(|j| j.spec.exec.name().to_string())
        .collect();
    executors.sort();
    executors.dedup();
    let namespaces: std::collections::BTreeSet<String> = jobs
        .iter()
        .map(|j| j.spec.name.namespace().to_string())
        .collect();
    let rows = jobs
        .iter()
        .filter(|j| filter.admits(j))
        .map(|j| JobRow {
            name: j.spec.name.to_string(),
            schedule: schedule(&j.spec),
            timezone: j.spec.timezone.clone(),
            executor: j.spec.exec.name().to_string(),
            tags: j.spec.tags.join(", "),
            paused: j.paused,
            next_fire: pages::zoned(next_fire(&j.spec, j.paused), &j.spec.timezone),
            runs: last_runs(&state, &j.spec.name, LAST_RUNS),
        })
        .collect();
    let page = ListPage {
        chrome: Chrome::of(&pages::caller(&request), "jobs"),
        filter: filter.into_inner(),
        namespaces: namespaces.into_iter().collect(),
        executors,
        rows,
        total: jobs.len(),
    };
    pages::html(StatusCode::OK, &page)
}

struct RecentRow {
    instance_id: String,
    biz_date: String,
    state: String,
    attempt: u32,
    finished: String,
    /// How long its current attempt ran (`–` until it ended).
    ran: String,
    /// What it used (`cpu 1.234 s, peak memory 63.9Mi`; `–` where not counted).
    used: String,
}

/// What a job's recent attempts used: the usual (the median) and the largest of each figure.
#[derive(Debug, PartialEq)]
struct UsageSpread {
    /// How many of the recent attempts were counted.
    counted: usize,
    usual: ax_bus::Usage,
    largest: ax_bus::Usage,
}

impl UsageSpread {
    /// The spread of `used`, the recent attempts' usage (none counted: `None`).
    fn of(used: &[ax_bus::Usage]) -> Option<Self> {
        if used.is_empty() {
            return None;
        }
        let spread = |figure: fn(&ax_bus::Usage) -> Option<u64>| {
            let mut values: Vec<u64> = used.iter().filter_map(figure).collect();
            values.sort_unstable();
            (
                values.get(values.len() / 2).copied(),
                values.last().copied(),
            )
        };
        let (cpu_usual, cpu_largest) = spread(|u| u.cpu_ms);
        let (memory_usual, memory_largest) = spread(|u| u.peak_memory_bytes);
        Some(Self {
            counted: used.len(),
            usual: ax_bus::Usage {
                cpu_ms: cpu_usual,
                peak_memory_bytes: memory_usual,
            },
            largest: ax_bus::Usage {
                cpu_ms: cpu_largest,
                peak_memory_bytes: memory_largest,
            },
        })
    }
}

struct TickRow {
    tick: String,
    outcome: String,
    instance: Option<String>,
    node: String,
    reason: String,
}

#[derive(Template)]
#[template(path = "job.html")]
struct JobPage {
    chrome: Chrome,
    name: String,
    paused: bool,
    next_fire: pages::Zoned,
    updated_at: String,
    yaml: String,
    recent: Vec<RecentRow>,
    /// What the recent attempts used, usually and at most (`None`: none was counted).
    usage: Option<UsageSpread>,
    /// The last runs at a glance, oldest first.
    runs: Vec<RunCell>,
    ticks: Vec<TickRow>,
    /// The datasets it writes, each with its page.
    writes: Vec<(String, String)>,
    /// The datasets it reads, each with its page.
    reads: Vec<(String, String)>,
}

fn job_name(text: &str) -> Result<JobName, Problem> {
    text.parse::<JobName>()
        .map_err(|e| Problem::Malformed(format!("name: {e}")))
}

async fn page(
    state: web::Data<State>,
    request: HttpRequest,
    name: web::Path<String>,
) -> HttpResponse {
    let client = pages::or_return!(pages::client(&state, &request));
    let name = match job_name(&name) {
        Ok(name) => name,
        Err(e) => return pages::error_page(&request, StatusCode::BAD_REQUEST, e.to_string()),
    };
    let (record, ticks) = match tokio::try_join!(client.job(&name), client.ticks(&name, SHOWN)) {
        Ok((Some((record, _)), ticks)) => (record, ticks),
        Ok((None, _)) => {
            return pages::error_page(
                &request,
                StatusCode::NOT_FOUND,
                format!("name: no job `{name}`"),
            )
        }
        Err(e) => {
            return pages::error_page(
                &request,
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the job could not be read: {e}"),
            )
        }
    };
    // Shown with its secrets redacted, as `ax job get` prints it.
    let doc = JobDocument {
        version: spec::VERSION.into(),
        job: spec::redact::spec(&record.spec),
    };
    let yaml = serde_saphyr::to_string(&doc).unwrap_or_else(|e| format!("# not printable: {e}"));
    let rows = state
        .index
        .as_ref()
        .map(|index| index.recent(&name, SHOWN))
        .unwrap_or_default();
    let used: Vec<ax_bus::Usage> = rows.iter().filter_map(|r| r.usage).collect();
    let recent = rows
        .into_iter()
        .map(|r| RecentRow {
            instance_id: r.instance_id.to_string(),
            biz_date: r.biz_date,
            state: r.state.to_string(),
            attempt: r.attempt,
            finished: pages::time(r.finished_at),
            ran: match (r.started_at, r.finished_at) {
                (Some(start), Some(end)) => pages::duration((end - start).num_milliseconds()),
                _ => "–".into(),
            },
            used: r.usage.map_or_else(|| "–".into(), |u| u.to_string()),
        })
        .collect();
    let ticks = ticks
        .into_iter()
        .map(|t| TickRow {
            tick: pages::time(Some(t.tick)),
            outcome: t.outcome.as_str().to_string(),
            instance: t.instance_id.map(|i| i.to_string()),
            node: t.node.to_string(),
            reason: t.reason,
        })
        .collect();
    let page = JobPage {
        chrome: Chrome::of(&pages::caller(&request), "jobs"),
        name: name.to_string(),
        paused: record.paused,
        next_fire: pages::zoned(
            next_fire(&record.spec, record.paused),
            &record.spec.timezone,
        ),
        updated_at: pages::time(Some(record.updated_at)),
        yaml,
        recent,
        usage: UsageSpread::of(&used),
        runs: last_runs(&state, &name, 30),
        ticks,
        writes: record
            .spec
            .produces
            .iter()
            .map(|uri| (uri.to_string(), super::datasets::link_of(uri.as_str())))
            .collect(),
        reads: record
            .spec
            .consumes
            .iter()
            .map(|uri| (uri.to_string(), super::datasets::link_of(uri.as_str())))
            .collect(),
    };
    pages::html(StatusCode::OK, &page)
}

/// The trigger form.
#[derive(Debug, Deserialize)]
struct TriggerForm {
    #[serde(default)]
    at: String,
    #[serde(default, rename = "in")]
    delay: String,
    #[serde(default)]
    biz_date: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    params: String,
}

fn filled(text: &str) -> Option<String> {
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

impl TriggerForm {
    /// The trigger the form asks for, or every problem of its fields at once (one per line):
    /// its own (a params line, the key) and those the Scheduler would refuse it for, checked
    /// by the same functions (the date, the params' names, `at` and `in`). The Scheduler still
    /// checks what depends on it (how far ahead it takes delays).
    fn request(&self, name: JobName) -> Result<TriggerRequest, Problem> {
        let mut errors = Vec::new();
        let mut params = BTreeMap::new();
        for (number, line) in self.params.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                errors.push(format!(
                    "params, line {}: expected KEY=VALUE, got `{line}`",
                    number + 1
                ));
                continue;
            };
            let key = key.trim();
            if !spec::is_valid_param_name(key) {
                errors.push(format!(
                    "params, line {}: `{key}` is not a param name ([A-Za-z_][A-Za-z0-9_]{{0,63}})",
                    number + 1
                ));
            }
            params.insert(
                key.to_string(),
                serde_json::Value::String(value.trim().to_string()),
            );
        }
        let key = match filled(&self.key).map(|k| k.parse::<TriggerKey>()) {
            Some(Err(e)) => {
                errors.push(format!("key: {e}"));
                None
            }
            Some(Ok(key)) => Some(key),
            None => None,
        };
        let (biz_date, at, delay) = (
            filled(&self.biz_date),
            filled(&self.at),
            filled(&self.delay),
        );
        if let Some(date) = biz_date.as_deref() {
            if ax_bus::time::parse_biz_date(date).is_none() {
                errors.push(format!("biz_date: `{date}` is not a date (YYYY-MM-DD)"));
            }
        }
        if let Some(Err(e)) = at.as_deref().map(ax_bus::time::parse_instant) {
            errors.push(format!("at: {e}"));
        }
        if let Some(Err(e)) = delay.as_deref().map(ax_bus::time::parse_delay) {
            errors.push(format!("in: {e}"));
        }
        if at.is_some() && delay.is_some() {
            errors.push("at and in: give one of them, not both".into());
        }
        if !errors.is_empty() {
            return Err(Problem::Malformed(errors.join("\n")));
        }
        Ok(TriggerRequest {
            name,
            biz_date,
            params,
            key,
            at,
            delay,
        })
    }
}

async fn trigger(
    state: web::Data<State>,
    name: web::Path<String>,
    form: web::Form<TriggerForm>,
) -> HttpResponse {
    pages::replied(triggered(&state, &name, &form).await)
}

async fn triggered(state: &State, name: &str, form: &TriggerForm) -> Result<Triggered, Problem> {
    let request = form.request(job_name(name)?)?;
    actions::trigger(crate::api::client(state)?, &request).await
}

async fn act(state: web::Data<State>, path: web::Path<(String, String)>) -> HttpResponse {
    pages::replied(acted(&state, &path.0, &path.1).await)
}

async fn acted(state: &State, name: &str, action: &str) -> Result<Done, Problem> {
    let action = match action {
        "pause" => JobAction::Pause,
        "resume" => JobAction::Resume,
        "delete" => JobAction::Delete,
        other => {
            return Err(Problem::NotFound(format!(
                "action: no job action `{other}` (pause, resume, delete)"
            )))
        }
    };
    actions::job(crate::api::client(state)?, action, &job_name(name)?).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn used(cpu_ms: Option<u64>, peak: Option<u64>) -> ax_bus::Usage {
        ax_bus::Usage {
            cpu_ms,
            peak_memory_bytes: peak,
        }
    }

    #[test]
    fn the_usual_is_the_median_and_the_largest_the_most_of_each_figure() {
        assert_eq!(UsageSpread::of(&[]), None);
        let spread = UsageSpread::of(&[
            used(Some(300), Some(10)),
            used(Some(100), Some(30)),
            used(Some(200), None),
        ])
        .unwrap();
        assert_eq!(spread.counted, 3);
        assert_eq!(spread.usual, used(Some(200), Some(30)));
        assert_eq!(spread.largest, used(Some(300), Some(30)));
    }
}
