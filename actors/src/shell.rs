//! The `shell` executor: `/bin/sh -c <command>` in its own process group.
//!
//! The command's placeholders become quoted references to `AX_*` variables (see
//! [`ax_bus::spec::template`]), and every value reaches the process only through its
//! environment: `AX_INSTANCE_ID`, `AX_TRACE_ID`, `AX_JOB`, `AX_BIZ_DATE`, `AX_ATTEMPT`,
//! `AX_EXPECTED_TIME`, `AX_PARAMS` (all params as JSON), `AX_PARAM_<name>` for each param,
//! `AX_WORKER` (the worker's id) and, for a shard, `AX_SHARD_INDEX` and `AX_SHARD_TOTAL`.
//! A command may write JSON to the file named by `AX_OUTPUT_FILE`; it becomes the attempt's
//! structured output.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ax_bus::instance::{AttemptEnd, Tag};
use ax_bus::messages::WorkItem;
use ax_bus::spec::template::{param_env_name, Template};
use ax_bus::spec::{DumpSignal, OnTimeoutSpec};

use nix::sys::signal::Signal;
use tokio::sync::Notify;

use crate::process::{self, Exit, OnTimeout, ProcessSpec};

/// Largest output file read (bigger ones are refused, not truncated into invalid JSON).
const MAX_OUTPUT_BYTES: u64 = 1024 * 1024;

fn param_text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The environment of an attempt.
pub fn attempt_env(work: &WorkItem, worker: &str, output_file: &Path) -> Vec<(String, String)> {
    let mut env = vec![
        ("AX_WORKER".to_string(), worker.to_string()),
        ("AX_INSTANCE_ID".to_string(), work.instance_id.clone()),
        ("AX_TRACE_ID".to_string(), work.trace_id.clone()),
        ("AX_JOB".to_string(), work.job().to_string()),
        ("AX_BIZ_DATE".to_string(), work.biz_date.clone()),
        ("AX_ATTEMPT".to_string(), work.attempt.to_string()),
        (
            "AX_EXPECTED_TIME".to_string(),
            ax_bus::time::rfc3339(work.expected_time),
        ),
        (
            "AX_PARAMS".to_string(),
            serde_json::to_string(&work.params).unwrap_or_default(),
        ),
        (
            "AX_OUTPUT_FILE".to_string(),
            output_file.display().to_string(),
        ),
    ];
    if let Some(shard) = &work.shard {
        env.push(("AX_SHARD_INDEX".to_string(), shard.index.to_string()));
        env.push(("AX_SHARD_TOTAL".to_string(), shard.total.to_string()));
    }
    env.extend(
        work.params
            .iter()
            .map(|(name, value)| (param_env_name(name), param_text(value))),
    );
    env.extend(
        work.spec
            .exec
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    env
}

/// Runs the attempt; `scratch` is a directory for its output file; `cancel` stops it.
pub async fn run(
    work: &WorkItem,
    worker: &str,
    scratch: &Path,
    cancel: Option<&Notify>,
) -> AttemptEnd {
    let output_file = scratch.join(format!("{}.output.json", work.trace_id));
    let command = work.spec.exec.command.as_deref().unwrap_or_default();
    let timeout = Duration::from_secs(work.spec.timeout_secs());
    let mut end = AttemptEnd {
        trace_id: work.trace_id.clone(),
        success: false,
        tag: Tag::SpawnFailed,
        message: String::new(),
        output: serde_json::Value::Null,
        worker: worker.to_string(),
        started_at: Some(ax_bus::time::now()),
        finished_at: ax_bus::time::now(),
        exit_code: None,
        stdout_tail: String::new(),
        stderr_tail: String::new(),
    };
    let template = match Template::parse(command, &work.params) {
        Ok(template) => template,
        Err(reason) => {
            end.message = format!("exec.command: {reason}");
            return end;
        }
    };
    let spec = ProcessSpec {
        program: PathBuf::from("/bin/sh"),
        args: vec!["-c".to_string(), template.render_shell()],
        env: attempt_env(work, worker, &output_file),
        workdir: work.spec.exec.workdir.as_ref().map(PathBuf::from),
        timeout,
        on_timeout: on_timeout(&work.spec.on_timeout),
    };
    let ran = process::run(&spec, cancel).await;
    end.started_at = Some(ran.started_at);
    end.finished_at = ran.finished_at;
    end.stdout_tail = ran.stdout_tail;
    end.stderr_tail = ran.stderr_tail;
    if let Exit::Code(code) = ran.exit {
        end.exit_code = Some(code);
    }
    (end.success, end.tag, end.message) = match ran.exit {
        Exit::Code(0) => (true, Tag::Completed, "exit 0".to_string()),
        Exit::Code(code) => (false, Tag::ExitCode, format!("exit code {code}")),
        Exit::Signal(signal) => (false, Tag::Killed, format!("killed by signal {signal}")),
        Exit::TimedOut => (
            false,
            Tag::Timeout,
            timeout_message(timeout, &work.spec.on_timeout),
        ),
        Exit::SpawnFailed(reason) => (false, Tag::SpawnFailed, reason),
        Exit::Cancelled => (
            false,
            Tag::Killed,
            "stopped: the instance was cancelled; process group killed".to_string(),
        ),
    };
    match read_output(&output_file) {
        Ok(Some(output)) => end.output = output,
        Ok(None) => {}
        Err(reason) => end.message = format!("{}; output ignored: {reason}", end.message),
    }
    let _ = std::fs::remove_file(&output_file);
    end
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

#[cfg(test)]
mod tests {
    use super::*;

    fn work(command: &str, params: serde_json::Value, timeout: u64) -> WorkItem {
        let doc: ax_bus::spec::JobDocument = serde_json::from_value(serde_json::json!({
            "version": "v1",
            "job": {"name": "j", "exec": {"type": "shell", "command": command},
                    "params": params, "timeout": timeout}
        }))
        .unwrap();
        WorkItem {
            instance_id: "j.20260101T000000000Z".into(),
            trace_id: ax_bus::ids::new_trace_id(),
            attempt: 2,
            run_start: 1,
            biz_date: "2026-01-01".into(),
            expected_time: ax_bus::time::now(),
            params: doc.job.params.clone(),
            spec: doc.job,
            worker: None,
            gate: None,
            dispatch: None,
            router: None,
            shard: None,
            pin: None,
        }
    }

    #[tokio::test]
    async fn placeholders_and_env_reach_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let w = work(
            "echo {{biz_date}} {{attempt}} $AX_JOB $AX_PARAM_n \"{{params.n}}\"",
            serde_json::json!({"n": 7}),
            10,
        );
        let end = run(&w, "w1", dir.path(), None).await;
        assert!(end.success, "{end:?}");
        assert_eq!(end.stdout_tail, "2026-01-01 2 j 7 7\n");
    }

    #[tokio::test]
    async fn shell_metacharacters_in_params_stay_literal() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("pwned");
        let evil = format!(
            "$(touch {m}); touch {m}; `touch {m}` ' \" \\",
            m = marker.display()
        );
        let w = work(
            "printf '%s|' {{params.x}} \"{{params.x}}\" '{{params.x}}'",
            serde_json::json!({ "x": evil }),
            10,
        );
        let end = run(&w, "w1", dir.path(), None).await;
        assert!(end.success, "{end:?}");
        assert!(!marker.exists(), "a param value was executed");
        assert_eq!(end.stdout_tail, format!("{evil}|{evil}|{evil}|"));
    }

    #[tokio::test]
    async fn output_file_becomes_structured_output() {
        let dir = tempfile::tempdir().unwrap();
        let w = work(
            "echo '{\"rows\": 42}' > \"$AX_OUTPUT_FILE\"",
            serde_json::json!({}),
            10,
        );
        let end = run(&w, "w1", dir.path(), None).await;
        assert_eq!(end.output["rows"], 42);
        let w = work(
            "echo 'not json' > \"$AX_OUTPUT_FILE\"",
            serde_json::json!({}),
            10,
        );
        let end = run(&w, "w1", dir.path(), None).await;
        assert!(end.success && end.message.contains("not JSON"), "{end:?}");
    }

    #[tokio::test]
    async fn failures_are_tagged() {
        let dir = tempfile::tempdir().unwrap();
        let end = run(
            &work("exit 4", serde_json::json!({}), 10),
            "w1",
            dir.path(),
            None,
        )
        .await;
        assert_eq!(
            (end.success, end.tag, end.exit_code),
            (false, Tag::ExitCode, Some(4))
        );
        let end = run(
            &work("sleep 30", serde_json::json!({}), 1),
            "w1",
            dir.path(),
            None,
        )
        .await;
        assert_eq!(end.tag, Tag::Timeout);
    }
}
