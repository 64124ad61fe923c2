//! The job editor: YAML checked as it is typed by the spec's own parser and checks (each
//! problem at its line, as `ax job apply` reports a file's), then applied through the same
//! library call as the CLI's apply ([`crate::actions::apply`]). An existing job opens with its
//! secrets redacted, and a document still holding `***` is refused rather than applied.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use serde::Deserialize;

use ax_bus::auth::Role;
use ax_bus::ids::JobName;
use ax_bus::messages::commands::Command;
use ax_bus::spec::files::load_text;
use ax_bus::spec::yaml::LocatedError;
use ax_bus::spec::{self, JobDocument};

use crate::actions;
use crate::changes::{changes, Does};
use crate::pages::{self, Chrome};
use crate::problem::Problem;
use crate::server::State;

/// The name the editor's text goes by in its problems.
const SOURCE: &str = "editor";

/// What a new job starts from.
const TEMPLATE: &str = "version: v1
job:
  name: my_job
  cron: \"0 2 * * *\"          # 02:00 every day; 6 fields for seconds
  timezone: UTC
  exec:
    type: shell
    command: echo \"hello from {{instance_id}} for {{biz_date}}\"
  timeout: 600
  retry: { times: 2, interval: 30 }
";

pub(crate) fn routes(config: &mut web::ServiceConfig) {
    config
        .route("/jobs/new", web::get().to(new))
        .route("/jobs/{name}/edit", web::get().to(edit));
}

changes! {
    POST "/ui/jobs/validate" => validate, Does::Nothing(Role::Operator);
    POST "/ui/jobs/apply" => apply, Does::Command(Command::Apply);
}

#[derive(Template)]
#[template(path = "editor.html")]
struct EditorPage {
    chrome: Chrome,
    name: Option<String>,
    yaml: String,
}

async fn new(request: HttpRequest) -> HttpResponse {
    let page = EditorPage {
        chrome: Chrome::of(&pages::caller(&request), "jobs"),
        name: None,
        yaml: TEMPLATE.into(),
    };
    pages::html(StatusCode::OK, &page)
}

async fn edit(
    state: web::Data<State>,
    request: HttpRequest,
    name: web::Path<String>,
) -> HttpResponse {
    let client = pages::or_return!(pages::client(&state, &request));
    let Ok(name) = name.parse::<JobName>() else {
        return pages::error_page(
            &request,
            StatusCode::BAD_REQUEST,
            format!("name: `{name}` is no job name"),
        );
    };
    let record = match client.job(&name).await {
        Ok(Some((record, _))) => record,
        Ok(None) => {
            return pages::error_page(
                &request,
                StatusCode::NOT_FOUND,
                format!("name: no job `{name}`"),
            )
        }
        Err(e) => {
            return pages::error_page(&request, StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
    };
    let doc = JobDocument {
        version: spec::VERSION.into(),
        job: spec::redact::spec(&record.spec),
    };
    let page = EditorPage {
        chrome: Chrome::of(&pages::caller(&request), "jobs"),
        name: Some(name.to_string()),
        yaml: serde_saphyr::to_string(&doc).unwrap_or_default(),
    };
    pages::html(StatusCode::OK, &page)
}

/// The editor's form.
#[derive(Debug, Deserialize)]
struct EditorForm {
    #[serde(default)]
    yaml: String,
}

/// One problem, at its line (0 when it has none).
pub(crate) struct Line {
    pub(crate) line: u64,
    pub(crate) text: String,
}

impl Line {
    fn of(error: &LocatedError) -> Line {
        let text = match &error.field {
            Some(field) => format!("{field}: {}", error.reason),
            None => error.reason.clone(),
        };
        Line {
            line: error.line.unwrap_or(0),
            text,
        }
    }
}

#[derive(Template)]
#[template(path = "problems.html")]
struct Problems {
    problems: Vec<Line>,
    summary: String,
    /// What would not stop an apply but is likely a mistake.
    warnings: Vec<String>,
}

impl Problems {
    /// The text's own problems, at their lines.
    fn of(errors: &[LocatedError]) -> Problems {
        Problems {
            problems: errors.iter().map(Line::of).collect(),
            summary: String::new(),
            warnings: Vec::new(),
        }
    }
}

/// `POST /ui/jobs/validate`: the text's problems at their lines, or that it is valid. With a
/// NATS connection, the text is also checked against the registry as an apply would
/// (dependencies on jobs that exist neither there nor in the text, cycles), and an executor
/// no live worker offers is pointed out, with the built-in one likely meant.
async fn validate(state: web::Data<State>, form: web::Form<EditorForm>) -> HttpResponse {
    let jobs = match load_text(SOURCE, &form.yaml) {
        Ok(jobs) => jobs,
        Err(errors) => {
            return pages::html(StatusCode::OK, &Problems::of(&errors));
        }
    };
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    if let Some(client) = &state.client {
        if let Ok(registered) = client.jobs().await {
            let registered: Vec<spec::JobSpec> = registered.into_iter().map(|r| r.spec).collect();
            let applied: Vec<&spec::JobSpec> = jobs.iter().map(|j| &j.doc.job).collect();
            for (job, e) in spec::graph::validate_graph(&applied, &registered) {
                problems.push(Line {
                    line: 0,
                    text: format!("{job}: {}: {}", e.field, e.reason),
                });
            }
        }
        if let Ok(workers) = client.workers().await {
            let offered: std::collections::BTreeSet<String> = workers
                .into_iter()
                .flat_map(|(worker, _)| worker.executors)
                .collect();
            for job in &jobs {
                let kind = job.doc.job.exec.name();
                if offered.is_empty() || offered.contains(kind) {
                    continue;
                }
                let meant = spec::meant_builtin(kind)
                    .map(|m| format!("; did you mean `type: {m}`?"))
                    .unwrap_or_default();
                warnings.push(format!(
                    "{}: job.exec.type: no worker offers `{kind}` (offered: {}){meant}",
                    job.doc.job.name,
                    offered.iter().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
        }
    }
    let summary = if problems.is_empty() {
        format!(
            "valid: {}",
            jobs.iter()
                .map(|j| j.doc.job.name.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        String::new()
    };
    pages::html(
        StatusCode::OK,
        &Problems {
            problems,
            summary,
            warnings,
        },
    )
}

#[derive(Template)]
#[template(path = "applied.html")]
struct AppliedFragment {
    changes: Vec<(String, String)>,
    warnings: Vec<String>,
}

/// `POST /ui/jobs/apply`: applies the text, or shows why nothing was.
async fn apply(
    state: web::Data<State>,
    request: HttpRequest,
    form: web::Form<EditorForm>,
) -> HttpResponse {
    let client = pages::or_return!(pages::client(&state, &request));
    let jobs = match load_text(SOURCE, &form.yaml) {
        Ok(jobs) => jobs,
        Err(errors) => {
            return pages::html(StatusCode::BAD_REQUEST, &Problems::of(&errors));
        }
    };
    match actions::apply(client, jobs)
        .await
        .and_then(actions::Applied::finished)
    {
        Ok(applied) => pages::html(
            StatusCode::OK,
            &AppliedFragment {
                changes: applied
                    .changes
                    .iter()
                    .map(|c| (c.name.to_string(), format!("{:?}", c.change).to_lowercase()))
                    .collect(),
                warnings: applied.warnings,
            },
        ),
        Err(e) => match e {
            Problem::Refused(lines) => pages::html(
                StatusCode::CONFLICT,
                &Problems {
                    problems: lines
                        .into_iter()
                        .map(|text| Line {
                            line: line_in(&text),
                            text,
                        })
                        .collect(),
                    summary: String::new(),
                    warnings: Vec::new(),
                },
            ),
            other => pages::action_failed(&other),
        },
    }
}

/// The line a located problem names (`editor:12: ...`), 0 when none.
fn line_in(text: &str) -> u64 {
    text.strip_prefix(SOURCE)
        .and_then(|rest| rest.strip_prefix(':'))
        .and_then(|rest| rest.split(':').next())
        .and_then(|line| line.parse().ok())
        .unwrap_or(0)
}
