//! Executors: what turns a dispatched attempt into work — a process, an HTTP call, a SQL
//! statement — and the work's end into an [`ExecResult`].
//!
//! Every executor implements [`Executor`]: `init` once with the worker's [`ExecutorsConfig`],
//! `describe` for the worker's heartbeat (so `ax executors` can list it and the Router sends
//! an instance only to workers offering its type), then per attempt `prepare` (checks that
//! need the worker: a database configured, a virtualenv made) and `run`. Built in: `shell`,
//! `python`, `http`, `sql` and `noop`; plugins are executables in the worker's plugin
//! directory speaking a JSON protocol (see [`plugin`]).
//!
//! An executor never panics the worker and never loses an attempt: whatever goes wrong —
//! missing settings, a crashing plugin, a hanging endpoint — ends the attempt `failed` with a
//! tag and a message that says why, and the worker goes on.

pub(crate) mod child;
pub(crate) mod http;
pub(crate) mod noop;
pub(crate) mod plugin;
pub(crate) mod python;
pub(crate) mod shell;
pub(crate) mod sql;
pub(crate) mod values;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::Notify;

use ax_bus::ids::WorkerId;
use ax_bus::instance::Tag;
use ax_bus::messages::{ExecutorInfo, WorkItem};
use ax_bus::spec::Builtin;

use values::Values;

/// The version every built-in executor reports.
pub(crate) const BUILTIN_VERSION: &str = env!("CARGO_PKG_VERSION");

/// What executors need from the worker's config.
#[derive(Clone, Debug, Default)]
pub struct ExecutorsConfig {
    /// Databases the `sql` executor may use, by the name jobs give (`exec.database`). The
    /// connection strings stay here: never in a spec, a result or a log.
    pub databases: BTreeMap<String, String>,
    /// Where plugin executables are found at start.
    pub plugin_dir: Option<PathBuf>,
    /// The Python interpreter outside a virtualenv.
    pub python: String,
}

/// Everything an executor sees of one attempt.
#[derive(Debug)]
pub struct AttemptContext<'a> {
    /// The attempt.
    pub work: &'a WorkItem,
    /// This worker's id.
    pub worker: &'a WorkerId,
    /// A directory for the attempt's scratch files.
    pub scratch: &'a Path,
    /// Notified when the attempt must stop (its instance was cancelled or its claim lost).
    pub cancel: &'a Notify,
    /// The values of the placeholders (including upstream outputs).
    pub values: &'a Values,
    /// The cluster, for work reported later (an http `202`); none in a local run.
    pub cluster: Option<&'a ax_bus::AxClient>,
    /// Where a process's output is shipped while it runs; none in a local run.
    pub log: Option<&'a std::sync::Arc<crate::worker::logs::LogSink>>,
    /// How the worker keeps its attempts apart; process groups only when `None` (a local run).
    pub confinement: Option<&'a crate::worker::cgroup::Confinement>,
}

/// How an attempt's work ended.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecResult {
    /// Whether it succeeded.
    pub success: bool,
    /// Why it ended so (`completed`, `exit_code`, `rejected`, `timeout`, ...).
    pub tag: Tag,
    /// A line for people.
    pub message: String,
    /// Structured output, published with the result and readable downstream.
    pub output: serde_json::Value,
    /// A process's exit code.
    pub exit_code: Option<i32>,
    /// The end of stdout (or of a response body).
    pub stdout_tail: String,
    /// The end of stderr.
    pub stderr_tail: String,
    /// What its processes used, counted in its cgroup.
    pub usage: Option<ax_bus::Usage>,
}

impl ExecResult {
    /// A success.
    pub fn completed(message: impl Into<String>, output: serde_json::Value) -> Self {
        Self {
            success: true,
            tag: Tag::Completed,
            message: message.into(),
            output,
            exit_code: None,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            usage: None,
        }
    }

    /// A failure with `tag`.
    pub fn failed(tag: Tag, message: impl Into<String>) -> Self {
        Self {
            success: false,
            tag,
            message: message.into(),
            output: serde_json::Value::Null,
            exit_code: None,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            usage: None,
        }
    }
}

/// Why an executor could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("executor `{executor}`: {reason}")]
pub struct ExecutorError {
    /// The executor.
    pub executor: String,
    /// Why.
    pub reason: String,
}

/// A way of running attempts.
pub trait Executor: Send + Sync {
    /// Takes the worker's config, once, before any attempt.
    fn init(&mut self, _config: &ExecutorsConfig) -> Result<(), ExecutorError> {
        Ok(())
    }

    /// What it is, for the heartbeat and `ax executors`.
    fn describe(&self) -> ExecutorInfo;

    /// Checks and preparations that need this worker; an error fails the attempt with tag
    /// `executor_error` and is the message.
    fn prepare<'a>(&'a self, _ctx: &'a AttemptContext<'a>) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }

    /// Runs the attempt to its end (or its timeout, or its cancellation).
    fn run<'a>(&'a self, ctx: &'a AttemptContext<'a>) -> BoxFuture<'a, ExecResult>;
}

/// The attempt as external code sees it (the http executor's body, the plugin request):
/// `instanceId`, `traceId`, `job`, `bizDate`, `params`, `attempt`, `expectedTime`.
pub(crate) fn attempt_json(work: &WorkItem) -> serde_json::Map<String, serde_json::Value> {
    let value = serde_json::json!({
        "instanceId": work.instance_id,
        "traceId": work.trace_id,
        "job": work.job(),
        "bizDate": work.biz_date,
        "params": work.params,
        "attempt": work.attempt,
        "expectedTime": ax_bus::time::rfc3339(work.expected_time),
    });
    match value {
        serde_json::Value::Object(map) => map,
        _ => serde_json::Map::new(),
    }
}

/// A built-in's self-description.
pub(crate) fn builtin(which: Builtin, description: &str) -> ExecutorInfo {
    ExecutorInfo {
        name: which.name().to_string(),
        kind: "builtin".to_string(),
        version: BUILTIN_VERSION.to_string(),
        description: description.to_string(),
    }
}

/// The end of an attempt handed to the built-in executor `expected` although its job names
/// another: workers pick the executor by the job's `type`, so only a bug gets here.
pub(crate) fn mismatched(work: &WorkItem, expected: Builtin) -> ExecResult {
    ExecResult::failed(
        Tag::ExecutorError,
        format!(
            "the {} executor was handed a `{}` job",
            expected.name(),
            work.spec.exec.name()
        ),
    )
}

/// The built-in executor of each type (a new built-in is added here, the compiler says).
fn builtin_executor(which: Builtin) -> Box<dyn Executor> {
    match which {
        Builtin::Http => Box::new(http::Http::default()),
        Builtin::Noop => Box::new(noop::Noop),
        Builtin::Python => Box::new(python::Python::default()),
        Builtin::Shell => Box::new(shell::Shell),
        Builtin::Sql => Box::new(sql::Sql::default()),
    }
}

/// The executors of a worker, by type.
#[derive(Clone)]
pub struct Registry {
    executors: BTreeMap<String, Arc<dyn Executor>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.executors.keys()).finish()
    }
}

impl Registry {
    /// The built-ins and the plugins found in `config.plugin_dir`, each initialised. A plugin
    /// that does not describe itself is left out with a warning; it does not stop the worker.
    /// A plugin directory that cannot be read, or a database URL of no known kind, does.
    pub fn load(config: &ExecutorsConfig) -> Result<Self, ExecutorError> {
        let mut all: Vec<Box<dyn Executor>> =
            Builtin::ALL.into_iter().map(builtin_executor).collect();
        if let Some(dir) = &config.plugin_dir {
            for found in plugin::discover(dir)? {
                match found {
                    Ok(plugin) => all.push(Box::new(plugin)),
                    Err(e) => tracing::warn!(error = %e, "plugin left out"),
                }
            }
        }
        let mut executors = BTreeMap::new();
        for mut executor in all {
            executor.init(config)?;
            let name = executor.describe().name;
            if executors.contains_key(&name) {
                tracing::warn!(executor = %name, "a plugin may not replace a built-in or another plugin; left out");
                continue;
            }
            executors.insert(name, Arc::from(executor));
        }
        Ok(Self { executors })
    }

    /// The executor for `kind`.
    pub fn get(&self, kind: &str) -> Option<Arc<dyn Executor>> {
        self.executors.get(kind).cloned()
    }

    /// The types offered, sorted.
    pub fn names(&self) -> Vec<String> {
        self.executors.keys().cloned().collect()
    }

    /// Every executor's self-description, sorted by name.
    pub fn describe_all(&self) -> Vec<ExecutorInfo> {
        self.executors.values().map(|e| e.describe()).collect()
    }
}
