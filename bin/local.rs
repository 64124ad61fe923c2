//! `ax job run` (one attempt here, without a cluster) and `ax job init` (a commented spec to
//! start from): the developer's side of a job, before it is applied.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

use ax_actors::{run_locally, LocalRun, LocalRunEnd};
use ax_bus::ids::JobName;
use ax_bus::spec::files::load_files;
use ax_bus::spec::{Builtin, PluginExec};

use crate::args::RunArgs;
use crate::{jobs, node_config, table, up};

/// Runs one job of a file here and prints how it ended; `Ok(false)` when it failed.
pub(crate) async fn run(args: RunArgs, json: bool) -> Result<bool> {
    let mut jobs = load_files(std::slice::from_ref(&args.file)).map_err(|errors| {
        for error in &errors {
            eprintln!("{error}");
        }
        anyhow!("{} problem(s) in {}", errors.len(), args.file.display())
    })?;
    let names: Vec<String> = jobs.iter().map(|j| j.doc.job.name.to_string()).collect();
    let at = match &args.job {
        Some(name) => jobs
            .iter()
            .position(|j| j.doc.job.name == *name)
            .ok_or_else(|| {
                anyhow!(
                    "--job {name}: {} has no such job (it holds {})",
                    args.file.display(),
                    names.join(", ")
                )
            })?,
        None if jobs.len() == 1 => 0,
        None => bail!(
            "{} holds {} jobs ({}): pick one with --job",
            args.file.display(),
            jobs.len(),
            names.join(", ")
        ),
    };
    let spec = jobs.swap_remove(at).doc.job;
    let biz_date = match args.biz_date {
        Some(date) => ax_bus::time::parse_biz_date(&date)
            .map(|d| d.format("%Y-%m-%d").to_string())
            .ok_or_else(|| anyhow!("--biz-date `{date}`: expected YYYY-MM-DD"))?,
        // The file was checked: its zone parses.
        None => ax_bus::time::biz_date_in(
            spec.timezone.parse().unwrap_or(chrono_tz::UTC),
            ax_bus::time::now(),
        ),
    };
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create {}", args.data_dir.display()))?;
    let mut executors = up::local_executors(&args.data_dir.canonicalize()?, args.plugin_dir);
    if let Some(path) = &args.config {
        let file = node_config::read(path)?;
        executors.databases.extend(file.databases);
        executors.plugin_dir = file.worker.plugin_dir.or(executors.plugin_dir);
        executors.python = file.worker.python.unwrap_or(executors.python);
    }
    let scratch = tempfile::tempdir().context("cannot make a scratch directory")?;
    let end = run_locally(
        LocalRun {
            spec,
            biz_date,
            params: jobs::parse_params(&args.params)?,
            upstream: parse_deps(&args.deps)?,
            executors,
        },
        scratch.path(),
    )
    .await?;
    let success = end.result.success;
    show(&end, json)?;
    Ok(success)
}

/// `job.field=value` pairs; a value is JSON when it reads as JSON, text otherwise.
fn parse_deps(deps: &[String]) -> Result<BTreeMap<(JobName, String), serde_json::Value>> {
    deps.iter()
        .map(|dep| {
            let bad = || anyhow!("--dep `{dep}`: expected JOB.FIELD=VALUE");
            let (key, value) = dep.split_once('=').ok_or_else(bad)?;
            // A field holds no `.`; a job's name may (`payments.settle`).
            let (job, field) = key.rsplit_once('.').ok_or_else(bad)?;
            let job: JobName = job.parse().map_err(|e| anyhow!("--dep `{dep}`: {e}"))?;
            let value = serde_json::from_str(value)
                .unwrap_or_else(|_| serde_json::Value::String(value.to_string()));
            Ok(((job, field.to_string()), value))
        })
        .collect()
}

fn show(end: &LocalRunEnd, json: bool) -> Result<()> {
    let result = &end.result;
    let state = if result.success { "success" } else { "failed" };
    if json {
        return table::json(&serde_json::json!({
            "job": end.work.job(),
            "instance_id": end.work.instance_id,
            "trace_id": end.work.trace_id,
            "biz_date": end.work.biz_date,
            "state": state,
            "tag": result.tag,
            "message": result.message,
            "output": result.output,
            "exit_code": result.exit_code,
            "duration_ms": end.duration_ms,
            "stdout_tail": result.stdout_tail,
            "stderr_tail": result.stderr_tail,
        }));
    }
    let mut rows: Vec<Vec<String>> = vec![
        vec!["job".into(), end.work.job().to_string()],
        vec![
            "instance".into(),
            format!("{} (local run)", end.work.instance_id),
        ],
        vec!["biz_date".into(), end.work.biz_date.clone()],
        vec!["state".into(), format!("{state} ({})", result.tag)],
        vec!["message".into(), result.message.clone()],
        vec!["duration".into(), format!("{} ms", end.duration_ms)],
    ];
    if let Some(code) = result.exit_code {
        rows.push(vec!["exit code".into(), code.to_string()]);
    }
    rows.push(vec!["output".into(), result.output.to_string()]);
    for row in &rows {
        println!("{:<10} {}", row[0], row[1]);
    }
    for (name, tail) in [
        ("stdout", &result.stdout_tail),
        ("stderr", &result.stderr_tail),
    ] {
        if !tail.is_empty() {
            println!("--- {name}\n{}", tail.trim_end());
        }
    }
    Ok(())
}

/// Writes the starting spec of job `name` of type `kind` to `out` (`NAME.yaml` by default;
/// `-` is stdout); never over an existing file.
pub(crate) fn init(name: &JobName, kind: &str, out: Option<PathBuf>) -> Result<()> {
    let text = starting_spec(name, kind);
    let path = out.unwrap_or_else(|| PathBuf::from(format!("{name}.yaml")));
    if path == Path::new("-") {
        print!("{text}");
        return Ok(());
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .with_context(|| {
            format!(
                "cannot create {} (an existing file is never overwritten)",
                path.display()
            )
        })?;
    std::io::Write::write_all(&mut file, text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!(
        "wrote {}: try it with `ax job run -f {}`, then `ax job apply -f {}`",
        path.display(),
        path.display(),
        path.display()
    );
    Ok(())
}

/// The commented spec: the fields most jobs set, the executor's settings, the rest mentioned.
fn starting_spec(name: &JobName, kind: &str) -> String {
    let exec = match Builtin::named(kind) {
        Some(builtin) => builtin.starting_spec().to_string(),
        None => PluginExec::starting_spec(kind),
    };
    format!(
        "# Job `{name}`: apply with `ax job apply -f FILE`, try here with `ax job run -f FILE`.
# Every field: docs/job-spec.md; executors: docs/executors.md.
version: v1
job:
  name: {name}
  # When it fires (seconds minutes hours day-of-month month day-of-week); none = on trigger.
  # cron: \"0 2 * * *\"
  # timezone: Asia/Shanghai            # cron and business dates in this zone (UTC by default)
  params: {{ customer: acme }}         # {{{{params.customer}}}}, overridable per trigger
  timeout: 60                          # seconds; then the process group is killed (tag timeout)
  retry: {{ times: 2, interval: 30 }}    # failed attempts run again, 30 s apart
  # deps: [ {{ name: upstream_job }} ]   # runs once upstream_job succeeded for the same biz date
  # overlap: skip                      # a fire while one runs: skip, queue, cancel_previous or allow
  # priority: normal                   # high, normal or low
{exec}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dep_output_names_its_job_whole_with_or_without_a_namespace() {
        let deps = parse_deps(&["up.rows=3".into(), "payments/settle.total=ok".into()]).unwrap();
        let keys: Vec<(&str, &str)> = deps
            .keys()
            .map(|(job, field)| (job.as_str(), field.as_str()))
            .collect();
        assert_eq!(keys, [("payments.settle", "total"), ("up", "rows")]);
        assert!(parse_deps(&["rows=3".into()]).is_err());
    }

    #[test]
    fn every_starting_spec_is_a_valid_job() {
        let name: JobName = "nightly_report".parse().unwrap();
        let builtins = Builtin::ALL.map(Builtin::name);
        for kind in builtins.into_iter().chain(["line-count"]) {
            let text = starting_spec(&name, kind);
            let jobs = ax_bus::spec::yaml::parse_str("init.yaml", &text)
                .unwrap_or_else(|e| panic!("{kind}: {e}\n{text}"));
            let docs: Vec<_> = jobs.iter().map(|j| &j.doc).collect();
            let problems = ax_bus::spec::check_documents(&docs, |i| format!("document {i}"));
            assert!(problems.is_empty(), "{kind}: {problems:?}\n{text}");
            assert_eq!(jobs[0].doc.job.exec.name(), kind);
        }
    }
}
