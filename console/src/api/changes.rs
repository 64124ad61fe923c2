//! What the API changes — each through [`crate::actions`], the path the console's buttons take
//! too, and each carried out and audited by a Scheduler as the CLI's commands are.

use std::collections::BTreeMap;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use ax_bus::ids::TriggerKey;
use ax_bus::messages::commands::Command;
use ax_bus::messages::typed::Said;
use ax_bus::messages::{
    BackfillRequest, InstanceRequest, MarkRequest, RerunRequest, TriggerRequest,
};
use ax_bus::State as InstanceState;

use crate::actions::{self, InstanceAction, JobAction};
use crate::api::client;
use crate::api::reads::{instance_id, job_name};
use crate::changes::{changes, Does};
use crate::problem::Problem;
use crate::server::State;

changes! {
    POST "/api/v1/jobs" => apply, Does::Command(Command::Apply);
    POST "/api/v1/jobs/{name}/trigger" => trigger, Does::Command(Command::Trigger);
    POST "/api/v1/jobs/{name}/pause" => pause, Does::Command(Command::Pause);
    POST "/api/v1/jobs/{name}/resume" => resume, Does::Command(Command::Resume);
    DELETE "/api/v1/jobs/{name}" => delete, Does::Command(Command::Delete);
    POST "/api/v1/instances/{id}/cancel" => cancel, Does::Command(Command::Cancel);
    POST "/api/v1/instances/{id}/kill" => kill, Does::Command(Command::Kill);
    POST "/api/v1/instances/{id}/mark" => mark, Does::Command(Command::Mark);
    POST "/api/v1/rerun" => rerun, Does::Command(Command::Rerun);
    POST "/api/v1/backfill" => backfill, Does::Command(Command::Backfill);
    POST "/api/v1/dead-letters/{id}/replay" => replay, Does::Command(Command::Replay);
    POST "/api/v1/queues/{priority}/pause" => pause_queue, Does::Command(Command::Queue);
    POST "/api/v1/queues/{priority}/resume" => resume_queue, Does::Command(Command::Queue);
}

/// A JSON body, or the default when the body is empty; a malformed one names where and why.
fn body<T: DeserializeOwned + Default>(bytes: &[u8]) -> Result<T, Problem> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    required(bytes)
}

/// A required JSON body: an object, as the API document says of every body. (serde would
/// also read a struct from an array of its fields in order, so `[]` would pass as `{}`.)
fn required<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Problem> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| Problem::Malformed(format!("body: {e}")))?;
    let kind = match &value {
        serde_json::Value::Object(_) => {
            return serde_json::from_value(value)
                .map_err(|e| Problem::Malformed(format!("body: {e}")))
        }
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Null => "null",
    };
    Err(Problem::Malformed(format!(
        "body: a JSON object is expected, not {kind}"
    )))
}

/// Who the API says acts, in the records and the audit: the caller's one name (the audit
/// records the door beside it).
fn requested_by(request: &HttpRequest) -> String {
    crate::pages::caller(request).principal.name
}

/// The answer to a carried-out command, whichever it was.
fn answered(reply: impl Said) -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({
        "instance_id": reply.instance(),
        "message": reply.message(),
        "plan": reply.plan(),
    }))
}

/// The body of a trigger: everything of `ax job trigger` but the job, which is in the path.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
struct TriggerBody {
    biz_date: Option<String>,
    params: BTreeMap<String, serde_json::Value>,
    key: Option<TriggerKey>,
    /// An RFC 3339 instant.
    at: Option<String>,
    /// A delay (`90s`, `15m`, `2h`, `1d`).
    #[serde(rename = "in")]
    delay: Option<String>,
}

/// `POST /api/v1/jobs/{name}/trigger`: creates an instance (or names the one a repeated key
/// made).
async fn trigger(
    state: web::Data<State>,
    name: web::Path<String>,
    bytes: web::Bytes,
) -> Result<HttpResponse, Problem> {
    let name = job_name(&name)?;
    let body: TriggerBody = body(&bytes)?;
    let request = TriggerRequest {
        name,
        biz_date: body.biz_date,
        params: body.params,
        key: body.key,
        at: body.at,
        delay: body.delay,
    };
    Ok(answered(actions::trigger(client(&state)?, &request).await?))
}

async fn job_action(state: &State, name: &str, action: JobAction) -> Result<HttpResponse, Problem> {
    let name = job_name(name)?;
    Ok(answered(actions::job(client(state)?, action, &name).await?))
}

/// `POST /api/v1/jobs/{name}/pause`.
async fn pause(state: web::Data<State>, name: web::Path<String>) -> Result<HttpResponse, Problem> {
    job_action(&state, &name, JobAction::Pause).await
}

/// `POST /api/v1/jobs/{name}/resume`.
async fn resume(state: web::Data<State>, name: web::Path<String>) -> Result<HttpResponse, Problem> {
    job_action(&state, &name, JobAction::Resume).await
}

/// `DELETE /api/v1/jobs/{name}`.
async fn delete(state: web::Data<State>, name: web::Path<String>) -> Result<HttpResponse, Problem> {
    job_action(&state, &name, JobAction::Delete).await
}

/// The body of a cancel or a kill.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReasonBody {
    #[serde(default)]
    reason: Option<String>,
}

async fn instance_action(
    state: &State,
    request: &HttpRequest,
    id: &str,
    bytes: &[u8],
    action: InstanceAction,
) -> Result<HttpResponse, Problem> {
    let body: ReasonBody = body(bytes)?;
    let request = InstanceRequest {
        instance: instance_id(id)?,
        reason: body.reason,
        requested_by: requested_by(request),
    };
    Ok(answered(
        actions::instance(client(state)?, action, &request).await?,
    ))
}

/// `POST /api/v1/instances/{id}/cancel`.
async fn cancel(
    state: web::Data<State>,
    request: HttpRequest,
    id: web::Path<String>,
    bytes: web::Bytes,
) -> Result<HttpResponse, Problem> {
    instance_action(&state, &request, &id, &bytes, InstanceAction::Cancel).await
}

/// `POST /api/v1/instances/{id}/kill`.
async fn kill(
    state: web::Data<State>,
    request: HttpRequest,
    id: web::Path<String>,
    bytes: web::Bytes,
) -> Result<HttpResponse, Problem> {
    instance_action(&state, &request, &id, &bytes, InstanceAction::Kill).await
}

/// The body of a mark.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MarkBody {
    /// `success` or `failed`.
    state: InstanceState,
    /// Why (goes to the audit).
    reason: String,
}

/// `POST /api/v1/instances/{id}/mark`.
async fn mark(
    state: web::Data<State>,
    request: HttpRequest,
    id: web::Path<String>,
    bytes: web::Bytes,
) -> Result<HttpResponse, Problem> {
    let body: MarkBody = required(&bytes)?;
    if !matches!(body.state, InstanceState::Success | InstanceState::Failed) {
        return Err(Problem::Malformed(format!(
            "state: `{}` is no verdict (success or failed)",
            body.state
        )));
    }
    let mark = MarkRequest {
        instance: instance_id(&id)?,
        state: body.state,
        reason: body.reason,
        requested_by: requested_by(&request),
    };
    Ok(answered(actions::mark(client(&state)?, &mark).await?))
}

/// `POST /api/v1/rerun`: the plan (with `dry_run`) or the re-run, as `ax rerun`.
async fn rerun(
    state: web::Data<State>,
    request: HttpRequest,
    bytes: web::Bytes,
) -> Result<HttpResponse, Problem> {
    let mut rerun: RerunRequest = required(&bytes)?;
    rerun.requested_by = requested_by(&request);
    Ok(answered(actions::rerun(client(&state)?, &rerun).await?))
}

/// `POST /api/v1/backfill`: the instances of a range of business dates, as `ax backfill`.
async fn backfill(
    state: web::Data<State>,
    request: HttpRequest,
    bytes: web::Bytes,
) -> Result<HttpResponse, Problem> {
    let mut backfill: BackfillRequest = required(&bytes)?;
    backfill.requested_by = requested_by(&request);
    Ok(answered(
        actions::backfill(client(&state)?, &backfill).await?,
    ))
}

/// The body of an apply: job files' YAML (several documents apply together).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApplyBody {
    yaml: String,
    /// Only check it (the editor's check as you type).
    #[serde(default)]
    dry_run: bool,
}

/// `POST /api/v1/jobs`: applies jobs, as `ax job apply` (each problem `body:LINE: field:
/// reason`; nothing applied when there is one).
async fn apply(state: web::Data<State>, bytes: web::Bytes) -> Result<HttpResponse, Problem> {
    let body: ApplyBody = required(&bytes)?;
    let jobs = ax_bus::spec::files::load_text("yaml", &body.yaml).map_err(|errors| {
        Problem::Malformed(
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        )
    })?;
    if body.dry_run {
        let names: Vec<String> = jobs.iter().map(|j| j.doc.job.name.to_string()).collect();
        return Ok(HttpResponse::Ok().json(serde_json::json!({ "valid": names })));
    }
    let applied = actions::apply(client(&state)?, jobs).await?.finished()?;
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "changes": applied.changes,
        "warnings": applied.warnings,
    })))
}

/// `POST /api/v1/dead-letters/{id}/replay`: replays the letter and removes it, as `ax dlq
/// replay`.
async fn replay(
    state: web::Data<State>,
    request: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, Problem> {
    let id: u64 = id
        .parse()
        .map_err(|_| Problem::Malformed(format!("id: `{id}` is not a dead letter's number")))?;
    let replayed = actions::replay(client(&state)?, id, &requested_by(&request)).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "message": replayed.message,
        "replay": replayed.detail,
        "plan": replayed.plan,
    })))
}

async fn queue_action(
    state: &State,
    priority: &str,
    paused: bool,
) -> Result<HttpResponse, Problem> {
    let priority = priority
        .parse()
        .map_err(|e: String| Problem::Malformed(format!("priority: {e}")))?;
    let request = ax_bus::messages::QueueRequest { priority, paused };
    Ok(answered(actions::queue(client(state)?, &request).await?))
}

/// `POST /api/v1/queues/{priority}/pause`.
async fn pause_queue(
    state: web::Data<State>,
    priority: web::Path<String>,
) -> Result<HttpResponse, Problem> {
    queue_action(&state, &priority, true).await
}

/// `POST /api/v1/queues/{priority}/resume`.
async fn resume_queue(
    state: web::Data<State>,
    priority: web::Path<String>,
) -> Result<HttpResponse, Problem> {
    queue_action(&state, &priority, false).await
}
