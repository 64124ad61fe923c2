//! One attempt of one job on this machine, without a cluster (`ax job run`): the executors a
//! worker loads, the attempt a manual trigger would make, and its placeholders filled the same
//! way — so what runs here is what a worker would run, templates, environment, timeout and
//! output file included.
//!
//! What needs a cluster is said instead of guessed: an upstream's output
//! (`{{deps.<job>.output.<field>}}`) is given with the run (`--dep job.field=value`), and an
//! http endpoint answering `202 Accepted` ends the attempt there (its report would come through
//! the cluster).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use tokio::sync::Notify;

use ax_bus::ids::{JobName, WorkerId};
use ax_bus::instance::{InstanceRecord, Tag, Trigger};
use ax_bus::messages::WorkItem;
use ax_bus::spec::template::Placeholder;
use ax_bus::spec::JobSpec;

use super::executor::values::{templates, Values};
use super::executor::{AttemptContext, ExecResult, ExecutorError, ExecutorsConfig, Registry};

/// What to run.
#[derive(Debug)]
pub struct LocalRun {
    /// The job.
    pub spec: JobSpec,
    /// Its business date (`YYYY-MM-DD`).
    pub biz_date: String,
    /// Params overriding the job's.
    pub params: BTreeMap<String, serde_json::Value>,
    /// Upstream output fields its templates read, by (job, field).
    pub upstream: BTreeMap<(JobName, String), serde_json::Value>,
    /// The executors' settings (databases, plugins, python).
    pub executors: ExecutorsConfig,
}

/// How it went.
#[derive(Debug)]
pub struct LocalRunEnd {
    /// The attempt as a worker would have got it.
    pub work: WorkItem,
    /// Its end.
    pub result: ExecResult,
    /// How long it ran, in milliseconds.
    pub duration_ms: u128,
}

/// The worker id a local run runs as.
const LOCAL: &str = "local";

/// Runs `run` to its end in `scratch` (its output file and scratch files live there).
pub async fn run_locally(run: LocalRun, scratch: &Path) -> Result<LocalRunEnd, ExecutorError> {
    let registry = Registry::load(&run.executors)?;
    let mut params = run.spec.params.clone();
    params.extend(run.params);
    let now = ax_bus::time::now();
    let record = InstanceRecord::first(&run.spec, now, run.biz_date, params, Trigger::Manual, now);
    let work = WorkItem::for_attempt(&record, run.spec);
    let worker = WorkerId::parse(LOCAL).map_err(|e| ExecutorError {
        executor: "local".into(),
        reason: e.to_string(),
    })?;
    let started = Instant::now();
    let result = match (
        registry.get(work.spec.exec.name()),
        missing_upstream(&work, &run.upstream),
    ) {
        (None, _) => ExecResult::failed(
            Tag::ExecutorError,
            format!(
                "no executor `{}` here (this machine offers: {}; a plugin needs --plugin-dir)",
                work.spec.exec.name(),
                registry.names().join(", ")
            ),
        ),
        (_, Some(missing)) => ExecResult::failed(Tag::ExecutorError, missing),
        (Some(executor), None) => {
            let (cancel, values) = (Notify::new(), Values::with_upstream(run.upstream));
            let ctx = AttemptContext {
                work: &work,
                worker: &worker,
                scratch,
                cancel: &cancel,
                values: &values,
                cluster: None,
                log: None,
                confinement: None,
            };
            match executor.prepare(&ctx).await {
                Err(reason) => ExecResult::failed(Tag::ExecutorError, reason),
                Ok(()) => executor.run(&ctx).await,
            }
        }
    };
    Ok(LocalRunEnd {
        work,
        result,
        duration_ms: started.elapsed().as_millis(),
    })
}

/// The first upstream field the job's templates read that the run was not given, as a message
/// naming the flag that gives it.
fn missing_upstream(
    work: &WorkItem,
    given: &BTreeMap<(JobName, String), serde_json::Value>,
) -> Option<String> {
    templates(&work.spec, &work.params)
        .iter()
        .flat_map(|template| template.placeholders())
        .find_map(|placeholder| match placeholder {
            Placeholder::DepOutput { job, field }
                if !given.contains_key(&(job.clone(), field.clone())) =>
            {
                Some(format!(
                    "deps.{job}.output.{field}: a local run has no upstream outputs; give it \
                     with --dep {job}.{field}=VALUE"
                ))
            }
            _ => None,
        })
}
