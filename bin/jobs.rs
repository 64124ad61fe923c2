//! `ax job ...`: apply, list, get, delete, pause, resume, trigger (run and init: `local`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use ax_bus::auth::service_user::ServicePermissions;
use ax_bus::client::provision::Layout;
use ax_bus::client::ClientError;
use ax_bus::ids::{JobName, Namespace, TriggerKey};
use ax_bus::messages::typed::{ControlRequest, Done};
use ax_bus::messages::{BackfillRequest, PlanStep, RerunRequest, TriggerRequest};
use ax_bus::spec::files::load_files;
use ax_bus::spec::yaml::LocatedJob;
use ax_bus::spec::{self, JobDocument};
use ax_bus::AxClient;

use crate::args::{BackfillArgs, RerunArgs};
use crate::table;

/// How long a command waits for a Scheduler's answer: the console's and the API's wait.
pub(crate) use ax_console::actions::CONTROL_TIMEOUT;

/// Sends a command's request and waits for its reply; a refusal is the error, its reasons one
/// a line (one reason is the error itself, on one line).
pub(crate) async fn send<C: ControlRequest>(
    client: &AxClient,
    request: &C,
    timeout: Duration,
) -> Result<C::Reply> {
    match client.send(request, timeout).await {
        Ok(reply) => Ok(reply),
        Err(ClientError::Refused(errors)) => Err(refusal(&errors, "refused by the scheduler")),
        Err(ClientError::Denied(why)) => Err(refusal(&[why], "refused by the scheduler")),
        Err(e) => Err(e.into()),
    }
}

/// The error of a refusal for `problems`, `why` beside it: one problem is the error itself, on
/// one line; several are printed one a line first, and the error counts them.
pub(crate) fn refusal(problems: &[impl std::fmt::Display], why: &str) -> anyhow::Error {
    match problems {
        [one] => anyhow!("{one} ({why})"),
        many => {
            for problem in many {
                eprintln!("{problem}");
            }
            anyhow!("{} problems ({why})", many.len())
        }
    }
}

/// [`load_files`]; a refusal names what is wrong, and nothing is applied.
pub(crate) fn load_or_report(paths: &[PathBuf]) -> Result<Vec<LocatedJob>> {
    load_files(paths).map_err(|errors| refusal(&errors, "nothing applied"))
}

/// Applies validated jobs (through the console's library call, the one the editor uses too)
/// and prints what changed.
pub(crate) async fn apply(client: &AxClient, jobs: Vec<LocatedJob>, json: bool) -> Result<()> {
    let applied = match ax_console::actions::apply(client, jobs).await {
        Ok(applied) => applied,
        Err(ax_console::problem::Problem::Refused(errors)) => {
            return Err(refusal(&errors, "nothing applied"))
        }
        Err(e) => bail!("{e}"),
    };
    for warning in &applied.warnings {
        eprintln!("warning: {warning}");
    }
    if applied.commands > 1 {
        eprintln!(
            "the set is larger than one NATS message: sent as {} commands, upstream jobs first",
            applied.commands
        );
    }
    if json {
        table::json(&applied.changes)?;
    } else {
        let rows: Vec<Vec<String>> = applied
            .changes
            .iter()
            .map(|c| vec![c.name.to_string(), format!("{:?}", c.change).to_lowercase()])
            .collect();
        table::print(&["JOB", "CHANGE"], &rows);
    }
    if let Some(problem) = &applied.unfinished {
        bail!(
            "the {} job(s) listed were applied and are kept; the rest were not: {problem}",
            applied.changes.len()
        );
    }
    Ok(())
}

pub(crate) async fn list(
    client: &AxClient,
    namespace: Option<&Namespace>,
    json: bool,
) -> Result<()> {
    let mut jobs = client.jobs().await?;
    if let Some(namespace) = namespace {
        jobs.retain(|j| j.spec.name.namespace() == namespace.as_str());
    }
    if json {
        let docs: Vec<serde_json::Value> = jobs.iter().map(ax_console::job_view::summary).collect();
        return table::json(&docs);
    }
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            vec![
                j.spec.name.to_string(),
                j.spec.cron.clone().unwrap_or_else(|| "-".into()),
                j.spec.timezone.clone(),
                j.spec.exec.name().to_string(),
                if j.paused { "yes" } else { "no" }.into(),
                table::time(ax_console::job_view::next_fire(&j.spec, j.paused)),
            ]
        })
        .collect();
    table::print(
        &["JOB", "CRON", "TIMEZONE", "EXEC", "PAUSED", "NEXT FIRE"],
        &rows,
    );
    Ok(())
}

/// `ax namespace list`: each namespace that holds jobs, with how many.
pub(crate) async fn namespaces(client: &AxClient, json: bool) -> Result<()> {
    let settings = client.namespace_settings().await?;
    let mut counts: std::collections::BTreeMap<String, usize> = settings
        .keys()
        .map(|namespace| (namespace.to_string(), 0))
        .collect();
    for job in client.jobs().await? {
        *counts
            .entry(job.spec.name.namespace().to_string())
            .or_default() += 1;
    }
    let of = |namespace: &str| {
        settings
            .iter()
            .find(|(n, _)| n.as_str() == namespace)
            .map(|(_, s)| s.clone())
            .unwrap_or_default()
    };
    if json {
        let docs: Vec<serde_json::Value> = counts
            .iter()
            .map(|(namespace, jobs)| {
                let settings = of(namespace);
                serde_json::json!({
                    "namespace": namespace,
                    "jobs": jobs,
                    "weight": settings.weight,
                    "max_jobs": settings.max_jobs,
                    "max_running": settings.max_running,
                    "max_waiting": settings.max_waiting,
                })
            })
            .collect();
        return table::json(&docs);
    }
    let rows: Vec<Vec<String>> = counts
        .into_iter()
        .map(|(namespace, jobs)| {
            let settings = of(&namespace);
            let most = |n: Option<u32>| n.map_or("-".to_string(), |n| n.to_string());
            vec![
                namespace,
                jobs.to_string(),
                settings.weight.to_string(),
                most(settings.max_jobs),
                most(settings.max_running),
                most(settings.max_waiting),
            ]
        })
        .collect();
    table::print(
        &[
            "NAMESPACE",
            "JOBS",
            "WEIGHT",
            "MAX JOBS",
            "MAX RUNNING",
            "MAX WAITING",
        ],
        &rows,
    );
    Ok(())
}

/// `ax namespace create|delete`: stores or removes a namespace's settings.
pub(crate) async fn set_namespace(
    client: &AxClient,
    namespace: &Namespace,
    settings: Option<ax_bus::messages::NamespaceSettings>,
    json: bool,
) -> Result<()> {
    let request = ax_bus::messages::NamespaceRequest {
        namespace: namespace.clone(),
        settings,
    };
    let reply = send(client, &request, CONTROL_TIMEOUT).await?;
    if json {
        return table::json(
            &serde_json::json!({ "namespace": namespace, "message": reply.message }),
        );
    }
    println!("{}", reply.message);
    Ok(())
}

/// `ax namespace user`: the server config's entry for the namespace's business services.
pub(crate) fn namespace_user(
    layout: &Layout,
    namespace: &Namespace,
    user: Option<String>,
    password: Option<String>,
) {
    let permissions = ServicePermissions::of(layout, namespace);
    let user = user.unwrap_or_else(|| namespace.to_string());
    let password = password.unwrap_or_else(|| {
        format!(
            "${}_NATS_PASSWORD",
            namespace.to_uppercase().replace('-', "_")
        )
    });
    print!("{}", permissions.user_block(&user, &password));
    println!(
        "    # its connections take the inbox prefix {}",
        ServicePermissions::inbox_prefix_of(namespace)
    );
}

pub(crate) async fn get(client: &AxClient, name: &JobName, json: bool) -> Result<()> {
    let (record, _) = client
        .job(name)
        .await?
        .ok_or_else(|| anyhow!("no job named `{name}`"))?;
    // Shown with its secrets redacted: what `get` prints ends up in terminals, tickets, chats.
    let doc = JobDocument {
        version: spec::VERSION.into(),
        job: spec::redact::spec(&record.spec),
    };
    if json {
        return table::json(&doc);
    }
    if record.paused {
        println!("# paused");
    }
    print!(
        "{}",
        serde_saphyr::to_string(&doc).context("cannot print the job as YAML")?
    );
    Ok(())
}

pub(crate) async fn command<C: ControlRequest<Reply = Done>>(
    client: &AxClient,
    request: C,
    name: &JobName,
    json: bool,
) -> Result<()> {
    let reply = send(client, &request, CONTROL_TIMEOUT).await?;
    if json {
        return table::json(&serde_json::json!({ "job": name, "message": reply.message }));
    }
    println!("{}", reply.message);
    Ok(())
}

/// When a trigger runs: now, at an instant (`--at`) or after a delay (`--in`), as given.
pub(crate) struct When {
    pub(crate) at: Option<String>,
    pub(crate) delay: Option<String>,
}

/// `--param KEY=VALUE` pairs (values are text, as a shell passes them).
pub(crate) fn parse_params(params: &[String]) -> Result<BTreeMap<String, serde_json::Value>> {
    params
        .iter()
        .map(|param| {
            let (key, value) = param
                .split_once('=')
                .ok_or_else(|| anyhow!("--param `{param}`: expected KEY=VALUE"))?;
            Ok((
                key.to_string(),
                serde_json::Value::String(value.to_string()),
            ))
        })
        .collect()
}

pub(crate) async fn trigger(
    client: &AxClient,
    name: &JobName,
    biz_date: Option<String>,
    key: Option<&TriggerKey>,
    when: When,
    params: &[String],
    json: bool,
) -> Result<()> {
    let parsed = parse_params(params)?;
    let request = TriggerRequest {
        name: name.clone(),
        biz_date,
        params: parsed,
        key: key.cloned(),
        at: when.at,
        delay: when.delay,
    };
    let reply = send(client, &request, CONTROL_TIMEOUT).await?;
    let id = reply.instance_id.to_string();
    if json {
        return table::json(&serde_json::json!({ "instance_id": id, "message": reply.message }));
    }
    println!("{id} ({})", reply.message);
    Ok(())
}

pub(crate) async fn history(
    client: &AxClient,
    name: &JobName,
    limit: usize,
    json: bool,
) -> Result<()> {
    if client.job(name).await?.is_none() && client.ticks(name, 1).await?.is_empty() {
        bail!("no job named `{name}` and no recorded tick for it");
    }
    let ticks = client.ticks(name, limit).await?;
    if json {
        return table::json(&ticks);
    }
    let rows: Vec<Vec<String>> = ticks
        .iter()
        .map(|t| {
            vec![
                ax_bus::time::rfc3339(t.tick),
                t.outcome.as_str().to_string(),
                t.instance_id
                    .as_ref()
                    .map_or_else(|| "-".into(), |id| id.to_string()),
                t.node.to_string(),
                table::short(&t.reason, 60),
            ]
        })
        .collect();
    table::print(&["TICK", "OUTCOME", "INSTANCE", "NODE", "REASON"], &rows);
    Ok(())
}

/// `user@host` of whoever runs the command, for the audit record: the same for every command
/// of one user on one machine (`USER`, else `LOGNAME`, else the name of the process's user id).
pub(crate) fn requested_by() -> String {
    let user = ["USER", "LOGNAME"]
        .iter()
        .filter_map(|name| std::env::var(name).ok())
        .find(|name| !name.trim().is_empty())
        .or_else(|| {
            let uid = nix::unistd::getuid();
            nix::unistd::User::from_uid(uid)
                .ok()
                .flatten()
                .map(|user| user.name)
                .or_else(|| Some(format!("uid{uid}")))
        })
        .unwrap_or_default();
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{user}@{host}")
}

/// How long a planned command may take on the Scheduler's side.
pub(crate) const PLANNED_TIMEOUT: Duration = Duration::from_secs(120);

/// What became of a planned re-run, as the line under its plan says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Planned {
    /// Only planned (`--dry-run`): nothing changed.
    DryRun,
    /// Carried out: the instances marked `run` started again.
    Done,
    /// Waiting for a second person's approval: nothing started yet.
    Pending,
}

pub(crate) fn print_plan(plan: &[PlanStep], json: bool, planned: Planned) -> Result<()> {
    if json {
        return table::json(&plan);
    }
    let rows: Vec<Vec<String>> = plan
        .iter()
        .map(|s| {
            vec![
                s.instance_id.to_string(),
                s.biz_date.clone(),
                s.state.to_string(),
                if s.will_run { "run" } else { "stays" }.to_string(),
                s.why.clone(),
                if s.will_run && !s.rewrites.is_empty() {
                    s.rewrites
                        .iter()
                        .map(|d| d.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                } else {
                    "-".to_string()
                },
            ]
        })
        .collect();
    table::print(
        &["INSTANCE", "BIZ DATE", "STATE", "ACTION", "WHY", "REWRITES"],
        &rows,
    );
    let runs = plan.iter().filter(|s| s.will_run).count();
    match planned {
        Planned::DryRun => println!("dry run: {runs} would run, nothing changed"),
        Planned::Done => println!("{runs} instance(s) started again"),
        Planned::Pending => println!("{runs} would run once approved; nothing started yet"),
    }
    Ok(())
}

pub(crate) async fn rerun(client: &AxClient, args: RerunArgs, json: bool) -> Result<()> {
    let request = RerunRequest {
        instance: args.instance,
        biz_date: args.biz_date,
        root: args.root,
        failed_only: args.failed_only,
        force_downstream: args.force_downstream,
        dry_run: args.dry_run,
        requested_by: requested_by(),
    };
    let date_wide = request.biz_date.is_some() && request.root.is_none();
    if date_wide && !request.dry_run && !args.yes {
        confirmed(client, &request).await?;
    }
    let reply = send(client, &request, PLANNED_TIMEOUT).await?;
    if !reply.message.is_empty() {
        // Waiting for a second person, or self-approved: said on stderr, the plan on stdout.
        eprintln!("{}", reply.message);
    }
    let planned = if args.dry_run {
        Planned::DryRun
    } else if reply.approval.is_some() {
        Planned::Pending
    } else {
        Planned::Done
    };
    print_plan(&reply.plan, json, planned)
}

/// A re-run of every root job of a date, agreed to: its plan printed, then a `y` typed on a
/// terminal; anywhere else it is refused until `--yes` says so.
async fn confirmed(client: &AxClient, request: &RerunRequest) -> Result<()> {
    use std::io::{BufRead, IsTerminal, Write};
    let date = request.biz_date.as_deref().unwrap_or_default();
    let plan = RerunRequest {
        dry_run: true,
        ..request.clone()
    };
    let reply = send(client, &plan, PLANNED_TIMEOUT).await?;
    let runs = reply.plan.iter().filter(|s| s.will_run).count();
    if !std::io::stdin().is_terminal() {
        bail!(
            "a re-run of every root job of {date} ({runs} to run) needs --yes; `--dry-run` shows \
             its plan, `--root JOB` re-runs one chain"
        );
    }
    print_plan(&reply.plan, false, Planned::DryRun)?;
    eprint!("re-run these {runs} instance(s) of {date}? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    if !matches!(answer.trim(), "y" | "Y" | "yes") {
        bail!("nothing re-run");
    }
    Ok(())
}

pub(crate) async fn backfill(client: &AxClient, args: BackfillArgs, json: bool) -> Result<()> {
    let request = BackfillRequest {
        job: args.job,
        from: args.from,
        to: args.to,
        with_downstream: args.with_downstream,
        parallel: Some(args.parallel),
        requested_by: requested_by(),
    };
    let reply = send(client, &request, PLANNED_TIMEOUT).await?;
    if json {
        return table::json(&reply.plan);
    }
    let rows: Vec<Vec<String>> = reply
        .plan
        .iter()
        .map(|s| vec![s.instance_id.to_string(), s.biz_date.clone(), s.why.clone()])
        .collect();
    table::print(&["INSTANCE", "BIZ DATE", "WHAT"], &rows);
    Ok(())
}
