//! What the console and the API change, each as one call shared by both: the same control
//! commands the CLI sends (a trigger, a re-run, a kill is one path whatever the entry point),
//! carried out and audited by the Scheduler that takes them.
//!
//! Each action first checks that what it names exists, so that an unknown job or instance is a
//! 404 naming it, not a refusal to decode; what the Scheduler refuses (an action in the wrong
//! state, a bad date) comes back with its reasons as a conflict.

use std::time::Duration;

use ax_bus::client::ClientError;
use ax_bus::ids::{InstanceId, JobName};
use ax_bus::messages::typed::{
    Approvals, Cancel, ControlRequest, Delete, Done, Kill, Pause, Planned, Resume, Triggered,
};
use ax_bus::messages::{
    ApplyRequest, ApprovalRequest, BackfillRequest, InstanceRequest, JobChange, JobNameRequest,
    MarkRequest, QueueRequest, ReplayRequest, RerunRequest, TriggerRequest,
};
use ax_bus::spec::{self, yaml::LocatedJob};
use ax_bus::AxClient;

use crate::problem::{unavailable, Problem};

/// How long a command waits for a Scheduler's answer, here and in the CLI. A running Scheduler
/// answers in milliseconds; this is how long a command sent while the nodes start (or a
/// Scheduler fails over) waits for one, which a loaded machine's start can take well past
/// 10 s. Past it the command stays queued and runs when a Scheduler starts; the answer says so.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a planned command (re-run, backfill) may take on the Scheduler's side.
const PLANNED_TIMEOUT: Duration = Duration::from_secs(120);

/// Who the commands of the request being served are sent for: the caller's token and door,
/// set by the server around each request ([`as_caller`]) so that every action carries them
/// without each handler passing them on. Outside a request (the CLI calls these actions with
/// its own client) the client's own token is used.
#[derive(Clone, Debug)]
pub struct Acting {
    /// The caller's token.
    pub token: Option<ax_bus::auth::token::Token>,
    /// The door.
    pub via: ax_bus::auth::Via,
    /// The caller's name, as the access check found it.
    pub name: String,
}

tokio::task_local! {
    static ACTING: Acting;
}

/// Runs `work` (a request's handling) with its commands sent for `acting`.
pub async fn as_caller<F: std::future::Future>(acting: Acting, work: F) -> F::Output {
    ACTING.scope(acting, work).await
}

/// `client` sending for the caller of the request being served, if there is one.
fn for_caller(client: &AxClient) -> AxClient {
    ACTING
        .try_with(|acting| {
            client
                .clone()
                .acting_as(acting.token.clone(), acting.via)
                .claiming(&acting.name)
        })
        .unwrap_or_else(|_| client.clone())
}

/// Sends a command's request for the caller and waits for its reply; the Scheduler's refusal
/// is a conflict with its reasons, a denial a 403, no answer (NATS away, no Scheduler) a 503.
async fn send<C: ControlRequest>(
    client: &AxClient,
    request: &C,
    timeout: Duration,
) -> Result<C::Reply, Problem> {
    match for_caller(client).send(request, timeout).await {
        Ok(reply) => Ok(reply),
        Err(ClientError::Refused(errors)) => Err(Problem::Refused(errors)),
        Err(ClientError::Denied(why)) => Err(Problem::Denied(why)),
        Err(e) => Err(unavailable(e)),
    }
}

/// Fails with a 404 naming the job when there is none by that name.
pub async fn known_job(client: &AxClient, name: &JobName) -> Result<(), Problem> {
    if client.job_exists(name).await.map_err(unavailable)? {
        Ok(())
    } else {
        Err(Problem::NotFound(format!("name: no job `{name}`")))
    }
}

/// Fails with a 404 naming the instance when there is none by that id.
pub async fn known_instance(client: &AxClient, id: &InstanceId) -> Result<(), Problem> {
    match client.instance(id).await.map_err(unavailable)? {
        Some(_) => Ok(()),
        None => Err(Problem::NotFound(format!(
            "instance: {}",
            ax_bus::client::retention::missing(id)
        ))),
    }
}

/// Triggers a job: now, at an instant or after a delay, with parameters, a business date and
/// a key, as `ax job trigger`.
pub async fn trigger(client: &AxClient, request: &TriggerRequest) -> Result<Triggered, Problem> {
    known_job(client, &request.name).await?;
    send(client, request, CONTROL_TIMEOUT).await
}

/// What can be done to a job by its name alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobAction {
    /// Stop firing it.
    Pause,
    /// Fire it again.
    Resume,
    /// Remove it.
    Delete,
}

/// Pauses, resumes or deletes a job, as `ax job pause|resume|delete`.
pub async fn job(client: &AxClient, action: JobAction, name: &JobName) -> Result<Done, Problem> {
    known_job(client, name).await?;
    let request = JobNameRequest { name: name.clone() };
    match action {
        JobAction::Pause => send(client, &Pause(request), CONTROL_TIMEOUT).await,
        JobAction::Resume => send(client, &Resume(request), CONTROL_TIMEOUT).await,
        JobAction::Delete => send(client, &Delete(request), CONTROL_TIMEOUT).await,
    }
}

/// What can be done to one instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceAction {
    /// Stop it before or between attempts (a running attempt is killed).
    Cancel,
    /// Kill its running attempt.
    Kill,
}

/// Cancels or kills an instance, as `ax instance cancel|kill`.
pub async fn instance(
    client: &AxClient,
    action: InstanceAction,
    request: &InstanceRequest,
) -> Result<Done, Problem> {
    known_instance(client, &request.instance).await?;
    let request = request.clone();
    match action {
        InstanceAction::Cancel => send(client, &Cancel(request), CONTROL_TIMEOUT).await,
        InstanceAction::Kill => send(client, &Kill(request), CONTROL_TIMEOUT).await,
    }
}

/// Gives an operator's verdict on an instance, as `ax instance mark`.
pub async fn mark(client: &AxClient, request: &MarkRequest) -> Result<Done, Problem> {
    known_instance(client, &request.instance).await?;
    send(client, request, CONTROL_TIMEOUT).await
}

/// Plans (dry run) or runs a re-run, as `ax rerun`; the reply carries the plan.
pub async fn rerun(client: &AxClient, request: &RerunRequest) -> Result<Planned, Problem> {
    if let Some(id) = &request.instance {
        known_instance(client, id).await?;
    }
    if let Some(root) = &request.root {
        known_job(client, root).await?;
    }
    if request.instance.is_none() && request.biz_date.is_none() {
        return Err(Problem::Malformed(
            "instance: name an instance, or a biz_date (with a root job)".into(),
        ));
    }
    send(client, request, PLANNED_TIMEOUT).await
}

/// Creates the instances of a range of business dates, as `ax backfill`.
pub async fn backfill(client: &AxClient, request: &BackfillRequest) -> Result<Planned, Problem> {
    known_job(client, &request.job).await?;
    send(client, request, PLANNED_TIMEOUT).await
}

/// What an apply changed, and what deserves a look though it was applied.
#[derive(Clone, Debug)]
pub struct Applied {
    /// Each job and what became of it.
    pub changes: Vec<JobChange>,
    /// Each `file:line: field: reason` worth a warning (a one-off in the past, an executor no
    /// live worker offers).
    pub warnings: Vec<String>,
    /// How many commands carried them (a set larger than one message is split).
    pub commands: usize,
    /// Why the jobs after those in `changes` were not applied, when a command after the first
    /// failed: what the earlier ones applied stays.
    pub unfinished: Option<Problem>,
}

/// A set's jobs in commands that each fit in `limit` bytes, upstream jobs first: each command
/// names only jobs already registered or applied by an earlier one. A job too large alone is
/// an error naming it.
fn split_for(jobs: Vec<LocatedJob>, limit: usize) -> Result<Vec<Vec<LocatedJob>>, Problem> {
    // Upstream first (Kahn's order; the graph was checked for cycles).
    let names: std::collections::BTreeSet<JobName> =
        jobs.iter().map(|j| j.doc.job.name.clone()).collect();
    let mut pending: Vec<LocatedJob> = jobs;
    let mut ordered = Vec::with_capacity(pending.len());
    let mut placed = std::collections::BTreeSet::new();
    while !pending.is_empty() {
        let (ready, rest): (Vec<LocatedJob>, Vec<LocatedJob>) =
            pending.into_iter().partition(|job| {
                job.doc
                    .job
                    .deps
                    .iter()
                    .all(|d| !names.contains(&d.name) || placed.contains(&d.name))
            });
        if ready.is_empty() {
            // Not reached after the graph check; kept whole rather than dropped.
            ordered.extend(rest);
            break;
        }
        placed.extend(ready.iter().map(|j| j.doc.job.name.clone()));
        ordered.extend(ready);
        pending = rest;
    }
    let mut batches: Vec<Vec<LocatedJob>> = Vec::new();
    let mut size = 0;
    for job in ordered {
        let own = ax_bus::codec::encode(&job.doc)
            .map_err(|e| Problem::Malformed(format!("jobs: {e}")))?
            .len()
            + 16;
        if own > limit {
            return Err(Problem::Malformed(format!(
                "{}: job {} alone is {own} bytes, more than the NATS server's max_payload allows \
                 for a command ({limit} bytes); nothing applied",
                job.file, job.doc.job.name
            )));
        }
        match batches.last_mut() {
            Some(batch) if size + own <= limit => batch.push(job),
            _ => {
                batches.push(vec![job]);
                size = 0;
            }
        }
        size += own;
    }
    Ok(batches)
}

/// Applies validated jobs (from files or an editor), as `ax job apply`: checked against the
/// registry first (unknown dependencies, cycles), each problem placed at its line; nothing is
/// applied when there is one, nor when the jobs together exceed the server's `max_payload`.
pub async fn apply(client: &AxClient, jobs: Vec<LocatedJob>) -> Result<Applied, Problem> {
    let redacted: Vec<String> = jobs
        .iter()
        .filter_map(|job| {
            spec::redact::redacted_field(&job.doc.job).map(|field| {
                job.locate(spec::SpecError {
                    field,
                    reason: "holds a redacted secret (***), not the secret: type it again, or \
                             take it from the worker's environment (exec.header_env)"
                        .into(),
                })
                .to_string()
            })
        })
        .collect();
    if !redacted.is_empty() {
        return Err(Problem::Refused(redacted));
    }
    let registered: Vec<spec::JobSpec> = client
        .jobs()
        .await
        .map_err(unavailable)?
        .into_iter()
        .map(|r| r.spec)
        .collect();
    let applied: Vec<&spec::JobSpec> = jobs.iter().map(|j| &j.doc.job).collect();
    let errors: Vec<String> = spec::graph::validate_graph(&applied, &registered)
        .into_iter()
        .filter_map(|(name, e)| {
            jobs.iter()
                .find(|j| j.doc.job.name == name)
                .map(|j| j.locate(e).to_string())
        })
        .collect();
    if !errors.is_empty() {
        return Err(Problem::Refused(errors));
    }
    let mut warnings: Vec<String> = jobs
        .iter()
        .flat_map(|job| {
            spec::warnings(&job.doc)
                .into_iter()
                .map(|w| job.locate(w).to_string())
        })
        .collect();
    warnings.extend(unoffered_executors(client, &jobs).await);
    // A command is one message: a set larger than the server takes goes in several, each all
    // or nothing, upstream jobs first (room kept for the headers).
    let limit = client
        .nats
        .server_info()
        .max_payload
        .saturating_sub(COMMAND_HEADROOM);
    let batches = split_for(jobs, limit)?;
    let commands = batches.len();
    let mut changes = Vec::new();
    for (number, batch) in batches.into_iter().enumerate() {
        let request = ApplyRequest {
            jobs: batch.into_iter().map(|j| j.doc).collect(),
            yaml: None,
        };
        match send(client, &request, CONTROL_TIMEOUT).await {
            Ok(reply) => changes.extend(reply.changes),
            Err(problem) if number == 0 => return Err(problem),
            Err(problem) => {
                return Ok(Applied {
                    changes,
                    warnings,
                    commands,
                    unfinished: Some(problem),
                })
            }
        }
    }
    Ok(Applied {
        changes,
        warnings,
        commands,
        unfinished: None,
    })
}

impl Applied {
    /// All of it as a result: a set stopped part way is the reason, naming what was applied
    /// and kept (for the API and the editor, which answer with one outcome).
    pub fn finished(self) -> Result<Self, Problem> {
        match &self.unfinished {
            None => Ok(self),
            Some(problem) => Err(Problem::Refused(vec![format!(
                "{} job(s) applied by the first commands and kept ({}); the rest were not \
                 applied: {problem}",
                self.changes.len(),
                self.changes
                    .iter()
                    .map(|c| c.name.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )])),
        }
    }
}

/// Bytes of a command's message kept for what is not the jobs (headers, the request's frame).
const COMMAND_HEADROOM: usize = 8 * 1024;

/// Jobs whose executor no live worker offers (a plugin not deployed yet): their instances will
/// wait with tag `no_worker` until a worker offering it starts.
async fn unoffered_executors(client: &AxClient, jobs: &[LocatedJob]) -> Vec<String> {
    let Ok(workers) = client.workers().await else {
        return Vec::new();
    };
    let now = ax_bus::time::now();
    let offered: std::collections::BTreeSet<&str> = workers
        .iter()
        .filter(|(_, at)| (now - *at).num_seconds() < 10)
        .flat_map(|(info, _)| info.executors.iter().map(String::as_str))
        .collect();
    if offered.is_empty() {
        // No worker has started yet (a fresh cluster): nothing to compare with.
        return Vec::new();
    }
    jobs.iter()
        .filter(|job| !offered.contains(job.doc.job.exec.name()))
        .map(|job| {
            format!(
                "job {}: no live worker offers executor `{}`; its instances wait (tag \
                 no_worker) until one does",
                job.doc.job.name,
                job.doc.job.exec.name()
            )
        })
        .collect()
}

/// Replays a dead letter and removes it, as `ax dlq replay` (one of an instance becomes a
/// re-run of it; any other is published again on its subject). The reply's `detail` says
/// which ([`ax_bus::messages::DlqReplay`]).
pub async fn replay(client: &AxClient, id: u64, requested_by: &str) -> Result<Planned, Problem> {
    // Stream sequences start at 1; the server refuses to look up 0.
    let missing = || {
        Problem::NotFound(format!(
            "id: dead letter {id}: no such dead letter (ax dlq list shows them)"
        ))
    };
    if id == 0 {
        return Err(missing());
    }
    if client.dead_letter(id).await.map_err(unavailable)?.is_none() {
        return Err(missing());
    }
    let request = ReplayRequest {
        id,
        requested_by: requested_by.to_string(),
    };
    send(client, &request, PLANNED_TIMEOUT).await
}

/// Lists, approves or rejects re-runs waiting for a second person, as `ax approvals`.
pub async fn approval(client: &AxClient, request: &ApprovalRequest) -> Result<Approvals, Problem> {
    send(client, request, PLANNED_TIMEOUT).await
}

/// Pauses or resumes a priority's queue, as `ax queue pause|resume`.
pub async fn queue(client: &AxClient, request: &QueueRequest) -> Result<Done, Problem> {
    send(client, request, CONTROL_TIMEOUT).await
}

/// What became of dead letter `letter`'s instance since (see
/// [`ax_bus::dead_letter::DeadLetter::standing`]); open when its record cannot be read.
pub async fn standing(
    client: &AxClient,
    letter: &ax_bus::dead_letter::DeadLetter,
) -> ax_bus::dead_letter::Standing {
    let record = match letter.instance.as_deref().map(str::parse::<InstanceId>) {
        Some(Ok(id)) => client.instance(&id).await.ok().flatten().map(|(r, _)| r),
        _ => None,
    };
    letter.standing(record.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain `j0 <- j1 <- ... <- j{n-1}` plus `n` lone jobs, given downstream first.
    fn jobs(n: usize) -> Vec<LocatedJob> {
        let mut text = String::new();
        for i in (0..n).rev() {
            text.push_str(&format!(
                "---\nversion: v1\njob:\n  name: j{i}\n  exec: {{ type: shell, command: 'echo {}' }}\n",
                "x".repeat(200)
            ));
            if i > 0 {
                text.push_str(&format!("  deps: [{{ name: j{} }}]\n", i - 1));
            }
            text.push_str(&format!(
                "---\nversion: v1\njob:\n  name: lone{i}\n  exec: {{ type: noop }}\n"
            ));
        }
        spec::files::load_text("set.yaml", &text).expect("valid jobs")
    }

    #[test]
    fn a_large_set_goes_in_commands_that_fit_upstream_first() {
        let set = jobs(40);
        let batches = split_for(set, 4096).unwrap();
        assert!(batches.len() > 1, "{}", batches.len());
        let mut seen = std::collections::BTreeSet::new();
        for batch in &batches {
            let request = ApplyRequest {
                jobs: batch.iter().map(|j| j.doc.clone()).collect(),
                yaml: None,
            };
            assert!(ax_bus::codec::encode(&request).unwrap().len() <= 4096);
            for job in batch {
                // Every dependency was applied before, by this command or an earlier one.
                for dep in &job.doc.job.deps {
                    assert!(
                        seen.contains(&dep.name),
                        "{} before {}",
                        job.doc.job.name,
                        dep.name
                    );
                }
                seen.insert(job.doc.job.name.clone());
            }
        }
        assert_eq!(seen.len(), 80);
        // One command when it fits.
        assert_eq!(split_for(jobs(3), 1 << 20).unwrap().len(), 1);
        // A job too large for any command is named; nothing is sent.
        let e = split_for(jobs(1), 64).unwrap_err().to_string();
        assert!(
            e.contains("job j0 alone is") || e.contains("job lone0 alone is"),
            "{e}"
        );
    }
}
