//! Plugin executors: an executable in the worker's plugin directory becomes the executor
//! named by its own description, usable as `exec.type: <name>`, without touching ax.
//!
//! # Protocol (version 1)
//!
//! The worker runs the executable with one argument, the operation, in its own process group:
//!
//! - `describe` (when the worker starts, stdin empty, 5 s): prints one JSON object
//!   `{"name": "line-count", "version": "1.0.0", "description": "..."}`. The name matches
//!   `[a-z][a-z0-9_-]*` and is not a built-in's. A plugin that does not answer so is left out
//!   (with a warning); the worker starts without it.
//! - `prepare` (before each attempt, the job's timeout): reads the request (below) on stdin and
//!   prints `{"ok": true}` or `{"ok": false, "error": "why"}`. A refusal fails the attempt with
//!   tag `executor_error` and the plugin's reason.
//! - `run` (the job's timeout and `on_timeout`, the attempt's `AX_*` environment and
//!   `exec.workdir`): reads the request on stdin; may print progress; its **last line** of
//!   stdout is the reply `{"success": bool, "message": "...", "output": <any JSON>}`. A
//!   failure it reports ends the attempt `rejected`.
//!
//! The request is `{"protocol": 1, "instanceId", "traceId", "job", "bizDate", "params",
//! "attempt", "expectedTime", "worker", "with"}`, `with` being the spec's `exec.with`.
//!
//! A plugin that exits with a non-zero code, is killed, or prints no valid reply fails that
//! attempt only (tag `executor_error`, its stderr tail kept); the worker is not affected.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde::Deserialize;

use ax_bus::instance::Tag;
use ax_bus::messages::ExecutorInfo;
use ax_bus::spec::{is_plugin_name, ExecSpec};

use super::child::Child;
use super::{attempt_json, AttemptContext, ExecResult, Executor, ExecutorError};
use crate::worker::process::Exit;

/// How long `describe` may take.
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest reply read from a plugin's stdout.
const MAX_REPLY_BYTES: usize = 1024 * 1024;

/// A plugin found in the plugin directory.
pub(crate) struct Plugin {
    path: PathBuf,
    info: ExecutorInfo,
}

#[derive(Deserialize)]
struct Description {
    name: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    description: String,
}

#[derive(Deserialize)]
struct Prepared {
    ok: bool,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct Reply {
    success: bool,
    #[serde(default)]
    message: String,
    #[serde(default)]
    output: serde_json::Value,
}

/// Every executable file of `dir`, described (sorted by file name); an error for the
/// directory itself when it cannot be read (a worker configured with plugins it cannot find
/// must not start as if it had none).
pub(crate) fn discover(dir: &Path) -> Result<Vec<Result<Plugin, ExecutorError>>, ExecutorError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ExecutorError {
        executor: "plugins".into(),
        reason: format!("cannot read the plugin directory {}: {e}", dir.display()),
    })?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            std::fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
        .collect();
    paths.sort();
    Ok(paths.into_iter().map(|p| Plugin::load(&p)).collect())
}

impl Plugin {
    /// Asks the executable at `path` to describe itself.
    pub(crate) fn load(path: &Path) -> Result<Self, ExecutorError> {
        let refuse = |reason: String| ExecutorError {
            executor: path.display().to_string(),
            reason,
        };
        let text = describe_output(path).map_err(&refuse)?;
        let described: Description = serde_json::from_str(text.trim()).map_err(|e| {
            refuse(format!(
                "`describe` printed no valid description ({e}): {:?}",
                text.trim()
            ))
        })?;
        if !is_plugin_name(&described.name) {
            return Err(refuse(format!(
                "`describe` names it `{}`: a plugin's name matches [a-z][a-z0-9_-]* and is not a built-in's",
                described.name
            )));
        }
        Ok(Self {
            path: path.to_path_buf(),
            info: ExecutorInfo {
                name: described.name,
                kind: "plugin".into(),
                version: described.version,
                description: described.description,
            },
        })
    }

    fn request(&self, ctx: &AttemptContext<'_>) -> Vec<u8> {
        let work = ctx.work;
        let mut request = attempt_json(work);
        request.insert("protocol".into(), 1.into());
        request.insert("worker".into(), ctx.worker.as_str().into());
        request.insert(
            "with".into(),
            serde_json::Value::Object(match &work.spec.exec {
                ExecSpec::Plugin(plugin) => plugin.with.clone().unwrap_or_default(),
                _ => serde_json::Map::new(),
            }),
        );
        serde_json::to_vec(&request).unwrap_or_default()
    }

    fn child(&self, operation: &str, ctx: &AttemptContext<'_>) -> Child {
        let mut child = Child::new(&self.path, vec![operation.to_string()]);
        child.stdin = Some(self.request(ctx));
        child.stdout_limit = MAX_REPLY_BYTES;
        child
    }

    /// The failure of a plugin that did not end normally, or `None` when it exited 0.
    fn abnormal(&self, operation: &str, result: &ExecResult, exit: &Exit) -> Option<ExecResult> {
        let name = &self.info.name;
        let message = match exit {
            Exit::Code(0) => return None,
            Exit::TimedOut | Exit::Cancelled => return Some(result.clone()),
            Exit::Code(code) => format!("plugin `{name}` {operation}: exited with code {code}"),
            Exit::Signal(signal) => {
                format!("plugin `{name}` {operation}: killed by signal {signal}")
            }
            Exit::SpawnFailed(reason) => format!("plugin `{name}` {operation}: {reason}"),
        };
        let mut failed = result.clone();
        failed.success = false;
        failed.tag = Tag::ExecutorError;
        failed.message = message;
        Some(failed)
    }
}

/// The last non-empty line of `stdout`.
fn last_line(stdout: &str) -> &str {
    stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
}

/// Runs `<path> describe` with a deadline; its stdout.
fn describe_output(path: &Path) -> Result<String, String> {
    let mut child = Command::new(path)
        .arg("describe")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start it: {e}"))?;
    let deadline = Instant::now() + DESCRIBE_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) | Err(_) => {
                let group = nix::unistd::Pid::from_raw(child.id() as i32);
                let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
                let _ = child.wait();
                return Err(format!(
                    "`describe` did not answer within {}s",
                    DESCRIBE_TIMEOUT.as_secs()
                ));
            }
        }
    };
    let mut text = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout
            .by_ref()
            .take(MAX_REPLY_BYTES as u64)
            .read_to_string(&mut text);
    }
    if !status.success() {
        return Err(format!("`describe` failed ({status})"));
    }
    Ok(text)
}

impl Executor for Plugin {
    fn describe(&self) -> ExecutorInfo {
        self.info.clone()
    }

    fn prepare<'a>(&'a self, ctx: &'a AttemptContext<'a>) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let (result, ran) = self.child("prepare", ctx).run(ctx).await;
            if let Some(failed) = self.abnormal("prepare", &result, &ran.exit) {
                let stderr = ran.stderr_tail.trim();
                return Err(if stderr.is_empty() {
                    failed.message
                } else {
                    format!("{}: {stderr}", failed.message)
                });
            }
            let line = last_line(&ran.stdout_tail);
            match serde_json::from_str::<Prepared>(line) {
                Ok(Prepared { ok: true, .. }) => Ok(()),
                Ok(Prepared { ok: false, error }) => Err(format!(
                    "plugin `{}` refused: {}",
                    self.info.name,
                    error.unwrap_or_else(|| "no reason given".into())
                )),
                Err(e) => Err(format!(
                    "plugin `{}` prepare: no valid answer ({e}): {line:?}",
                    self.info.name
                )),
            }
        })
    }

    fn run<'a>(&'a self, ctx: &'a AttemptContext<'a>) -> BoxFuture<'a, ExecResult> {
        Box::pin(async move {
            let (result, ran) = self.child("run", ctx).run(ctx).await;
            if let Some(failed) = self.abnormal("run", &result, &ran.exit) {
                return failed;
            }
            let line = last_line(&ran.stdout_tail);
            let mut ended = match serde_json::from_str::<Reply>(line) {
                Ok(reply) if reply.success => ExecResult::completed(reply.message, reply.output),
                Ok(reply) => {
                    let mut failed = ExecResult::failed(Tag::Rejected, reply.message);
                    failed.output = reply.output;
                    failed
                }
                Err(e) => ExecResult::failed(
                    Tag::ExecutorError,
                    format!(
                        "plugin `{}` run: its last line is no valid reply ({e}): {:?}",
                        self.info.name,
                        line.chars().take(200).collect::<String>()
                    ),
                ),
            };
            if ended.output.is_null() {
                ended.output = result.output;
            }
            ended.exit_code = result.exit_code;
            ended.stdout_tail = tail(&ran.stdout_tail);
            ended.stderr_tail = ran.stderr_tail;
            ended
        })
    }
}

/// The last [`crate::worker::process::TAIL_BYTES`] of a plugin's stdout, for the record.
fn tail(stdout: &str) -> String {
    let limit = crate::worker::process::TAIL_BYTES;
    if stdout.len() <= limit {
        return stdout.to_string();
    }
    let mut start = stdout.len() - limit;
    while !stdout.is_char_boundary(start) {
        start += 1;
    }
    stdout[start..].to_string()
}
