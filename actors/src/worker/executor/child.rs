//! What the process-based executors (`shell`, `python`, plugins) share: the attempt's
//! process spec (environment, working directory, timeout with its stack-dump step), the
//! mapping of how the process ended to a result, and the structured output a process writes to
//! the file named by `AX_OUTPUT_FILE`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;

use ax_bus::instance::Tag;
use ax_bus::spec::{DumpSignal, OnTimeoutSpec};

use super::{AttemptContext, ExecResult};
use ax_bus::spec::resources::Memory;

use crate::worker::cgroup::Confinement;
use crate::worker::process::{self, Confine, Exit, OnTimeout, ProcessEnd, ProcessSpec, TAIL_BYTES};

/// Largest output file read (bigger ones are refused, not truncated into invalid JSON).
const MAX_OUTPUT_BYTES: u64 = 1024 * 1024;

/// A process to run for an attempt.
pub(crate) struct Child {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its stdin.
    pub stdin: Option<Vec<u8>>,
    /// Bytes of stdout kept.
    pub stdout_limit: usize,
}

impl Child {
    /// `program` with `args`, no stdin, the usual stdout tail.
    pub(crate) fn new(program: impl Into<PathBuf>, args: Vec<String>) -> Self {
        Self {
            program: program.into(),
            args,
            stdin: None,
            stdout_limit: TAIL_BYTES,
        }
    }

    /// Runs it for the attempt: its environment, `exec.workdir`, the job's timeout and
    /// `on_timeout`. The result's output is what the process wrote to `AX_OUTPUT_FILE`;
    /// the [`ProcessEnd`] is returned too, for executors that read stdout.
    pub(crate) async fn run(self, ctx: &AttemptContext<'_>) -> (ExecResult, ProcessEnd) {
        let work = ctx.work;
        let confine = match confine(ctx) {
            Ok(confine) => confine,
            Err(refused) => {
                let ran = ProcessEnd {
                    exit: Exit::SpawnFailed(refused.clone()),
                    stdout_tail: String::new(),
                    stderr_tail: String::new(),
                    accounted: None,
                };
                return (ExecResult::failed(Tag::Rejected, refused), ran);
            }
        };
        let output_file = ctx.scratch.join(format!("{}.output.json", work.trace_id));
        let timeout = Duration::from_secs(work.spec.timeout_secs());
        let spec = ProcessSpec {
            program: self.program,
            args: self.args,
            env: ctx.values.env(work, ctx.worker, &output_file),
            workdir: work.spec.exec.workdir().map(PathBuf::from),
            timeout,
            on_timeout: on_timeout(&work.spec.on_timeout),
            stdin: self.stdin,
            stdout_limit: self.stdout_limit,
            groups: Some(crate::worker::leftovers::dir(ctx.scratch)),
            log: ctx.log.cloned(),
            confine,
        };
        let ran = process::run(&spec, Some(ctx.cancel)).await;
        let mut result = result_of(&ran, timeout, &work.spec.on_timeout);
        match read_output(&output_file) {
            Ok(Some(output)) => result.output = output,
            Ok(None) => {}
            Err(reason) => result.message = format!("{}; output ignored: {reason}", result.message),
        }
        let _ = std::fs::remove_file(&output_file);
        (result, ran)
    }
}

/// The cgroup the attempt runs in, if the worker makes them; why it cannot run, when it asks
/// for limits this worker cannot enforce (never run unlimited).
fn confine(ctx: &AttemptContext<'_>) -> Result<Option<Confine>, String> {
    let resources = ctx.work.spec.resources;
    match ctx.confinement {
        Some(Confinement::Cgroups(cgroups)) => match cgroups.refusal(&resources) {
            Some(why) => Err(why),
            None => Ok(Some(Confine {
                cgroups: cgroups.clone(),
                name: ctx.work.trace_id.to_string(),
                resources: cgroups.limits_for(&resources),
            })),
        },
        Some(Confinement::ProcessGroups { why }) if !resources.is_empty() => Err(format!(
            "this worker cannot enforce `resources`: process groups only ({why})"
        )),
        None if !resources.is_empty() => {
            Err("`resources` are enforced by a worker of a cluster, not in a local run".into())
        }
        _ => Ok(None),
    }
}

/// How a process's end reads as a result (output not yet read).
pub(crate) fn result_of(ran: &ProcessEnd, timeout: Duration, spec: &OnTimeoutSpec) -> ExecResult {
    let oom_killed = ran.accounted.is_some_and(|a| a.oom_killed);
    let (success, tag, message) = match &ran.exit {
        Exit::Code(code) if *code != 0 && oom_killed => (
            false,
            Tag::OomKilled,
            oom_message(ran, &format!("exit code {code}")),
        ),
        Exit::Signal(signal) if oom_killed => (
            false,
            Tag::OomKilled,
            oom_message(ran, &format!("signal {signal}")),
        ),
        Exit::Code(0) => (true, Tag::Completed, "exit 0".to_string()),
        Exit::Code(code) => (false, Tag::ExitCode, format!("exit code {code}")),
        Exit::Signal(signal) => (false, Tag::Killed, format!("killed by signal {signal}")),
        Exit::TimedOut => (false, Tag::Timeout, timeout_message(timeout, spec)),
        Exit::SpawnFailed(reason) => (false, Tag::SpawnFailed, reason.clone()),
        Exit::Cancelled => (
            false,
            Tag::Killed,
            "stopped: the instance was cancelled; process group killed".to_string(),
        ),
    };
    ExecResult {
        success,
        tag,
        message,
        output: serde_json::Value::Null,
        exit_code: match ran.exit {
            Exit::Code(code) => Some(code),
            _ => None,
        },
        stdout_tail: ran.stdout_tail.clone(),
        stderr_tail: ran.stderr_tail.clone(),
        usage: ran.accounted.map(|a| a.usage),
    }
}

/// What an OOM kill says: the limit and the peak, and how the command ended (`how`).
fn oom_message(ran: &ProcessEnd, how: &str) -> String {
    let bytes = |b: Option<u64>| b.map_or("?".to_string(), |b| Memory(b).to_string());
    let accounted = ran.accounted;
    format!(
        "killed by the OOM killer: over its memory limit of {} (peak {}); {how}",
        bytes(accounted.and_then(|a| a.memory_limit)),
        bytes(accounted.and_then(|a| a.usage.peak_memory_bytes)),
    )
}

/// The process-level form of the spec's `on_timeout`.
fn on_timeout(spec: &OnTimeoutSpec) -> OnTimeout {
    let dump_signal = match spec.signal {
        DumpSignal::Abrt => Some(Signal::SIGABRT),
        DumpSignal::Quit => Some(Signal::SIGQUIT),
        DumpSignal::Term => Some(Signal::SIGTERM),
        DumpSignal::Int => Some(Signal::SIGINT),
        DumpSignal::Usr1 => Some(Signal::SIGUSR1),
        DumpSignal::Usr2 => Some(Signal::SIGUSR2),
        DumpSignal::Hup => Some(Signal::SIGHUP),
        DumpSignal::None => None,
    };
    OnTimeout {
        dump_signal,
        grace: Duration::from_secs(spec.grace_secs()),
    }
}

fn timeout_message(timeout: Duration, spec: &OnTimeoutSpec) -> String {
    let limit = timeout.as_secs();
    match spec.signal {
        DumpSignal::None => format!("timed out after {limit}s; process group killed"),
        signal => format!(
            "timed out after {limit}s; {signal} sent for a stack dump (see the stderr tail), process group killed within a {}s grace",
            spec.grace_secs()
        ),
    }
}

fn read_output(path: &Path) -> Result<Option<serde_json::Value>, String> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(None);
    };
    if meta.len() == 0 {
        return Ok(None);
    }
    if meta.len() > MAX_OUTPUT_BYTES {
        return Err(format!(
            "AX_OUTPUT_FILE holds {} bytes (limit {MAX_OUTPUT_BYTES})",
            meta.len()
        ));
    }
    let text = std::fs::read(path).map_err(|e| e.to_string())?;
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|e| format!("AX_OUTPUT_FILE is not JSON: {e}"))
}
