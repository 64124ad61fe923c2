//! Running one child process in its own process group, with a timeout that kills the whole
//! group (grandchildren included) and bounded tails of stdout and stderr.
//!
//! A timeout first sends the group a signal that makes runtimes dump their stacks (SIGABRT by
//! default: Python's faulthandler answers it; SIGQUIT for a JVM), waits a grace period for the
//! dump to be written, then kills the group. The dump is in the stderr tail — the one clue to
//! where a hung task was stuck.
//!
//! `Child::kill` reaches only the direct child; a `sh -c` that started `sleep` in the background
//! would leave it running. Every child here leads a new process group and the group is killed
//! with `killpg` on timeout, and once more after a normal exit, so that nothing a task started
//! outlives its attempt. A worker that dies takes the group with it: every command runs under a
//! watcher tied to the worker by a pipe ([`super::lifeline`]), and its group is recorded in the
//! worker's data directory for the next start to kill should the watcher have died too
//! ([`super::leftovers`]).
//!
//! With a cgroup for the attempt ([`ProcessSpec::confine`], see [`super::cgroup`]) the command
//! runs in it from its first instruction, and every kill above is also a kill of the whole
//! cgroup: what left the process group (`setsid`, a daemon) is killed with the rest. Its end
//! then says what the attempt used and whether the OOM killer ended it.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use ax_bus::log::LogStream;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tokio::sync::Notify;

use ax_bus::spec::resources::Resources;

use super::cgroup::{Accounted, AttemptCgroup, Cgroups};
use super::leftovers::GroupRecord;
use super::lifeline::Lifeline;
use super::logs::LogSink;

/// Bytes kept from the end of each of stdout and stderr.
pub(crate) const TAIL_BYTES: usize = 8 * 1024;
/// How long pipes are drained after the process group is gone.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// What to run.
#[derive(Clone, Debug)]
pub(crate) struct ProcessSpec {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment variables (the worker's environment is inherited).
    pub env: Vec<(String, String)>,
    /// Working directory.
    pub workdir: Option<PathBuf>,
    /// Wall-clock limit.
    pub timeout: Duration,
    /// What happens at the limit before the group is killed.
    pub on_timeout: OnTimeout,
    /// Written to the process's stdin, which is then closed (no stdin when `None`).
    pub stdin: Option<Vec<u8>>,
    /// Bytes kept from the end of stdout ([`TAIL_BYTES`] for a task; more where stdout is a
    /// reply that must be read whole).
    pub stdout_limit: usize,
    /// Where the running group is recorded (see [`super::leftovers`]); not recorded when `None`.
    pub groups: Option<PathBuf>,
    /// Where everything read from stdout and stderr also goes, as it is read (the attempt's
    /// shipped log); nowhere when `None`.
    pub log: Option<Arc<LogSink>>,
    /// The cgroup it runs in; a process group only when `None`.
    pub confine: Option<Confine>,
}

/// An attempt's cgroup to be: where, named what, limited how.
#[derive(Clone, Debug)]
pub(crate) struct Confine {
    /// The worker's cgroups.
    pub cgroups: Arc<Cgroups>,
    /// The attempt's cgroup's name (its trace id).
    pub name: String,
    /// Its limits.
    pub resources: Resources,
}

/// The stack-dump step of a timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OnTimeout {
    /// Sent to the group first; `None` kills at once.
    pub dump_signal: Option<Signal>,
    /// How long the dump may take before the group is killed.
    pub grace: Duration,
}

impl Default for OnTimeout {
    fn default() -> Self {
        Self {
            dump_signal: Some(Signal::SIGABRT),
            grace: Duration::from_secs(5),
        }
    }
}

/// How the process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// It exited with this code.
    Code(i32),
    /// A signal it did not get from us killed it.
    Signal(i32),
    /// It ran past its timeout and its group was killed.
    TimedOut,
    /// It was stopped on request (its instance was cancelled) and its group was killed.
    Cancelled,
    /// It could not be started.
    SpawnFailed(String),
}

/// The end of a run.
#[derive(Clone, Debug)]
pub(crate) struct ProcessEnd {
    /// How it ended.
    pub exit: Exit,
    /// Last [`TAIL_BYTES`] of stdout.
    pub stdout_tail: String,
    /// Last [`TAIL_BYTES`] of stderr.
    pub stderr_tail: String,
    /// What its cgroup counted, when it had one.
    pub accounted: Option<Accounted>,
}

/// The command of `spec`, in a process group of its own, dying with the worker (with the
/// returned lifeline).
fn command(
    spec: &ProcessSpec,
    cgroup: Option<&AttemptCgroup>,
) -> std::io::Result<(Command, Lifeline)> {
    let mut command = Command::new(&spec.program);
    command
        .args(&spec.args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = &spec.workdir {
        command.current_dir(dir);
    }
    let fds = cgroup.map(AttemptCgroup::fds).unwrap_or_default();
    let lifeline = Lifeline::arm(command.as_std_mut(), spec.groups.as_deref(), fds)?;
    Ok((command, lifeline))
}

/// Runs `spec` to its end, its timeout, or until `cancel` is notified (at a timeout or a
/// cancel: the dump signal, its grace, then SIGKILL to the whole group).
pub(crate) async fn run(spec: &ProcessSpec, cancel: Option<&Notify>) -> ProcessEnd {
    let cgroup = match &spec.confine {
        Some(confine) => match confine.cgroups.attempt(&confine.name, &confine.resources) {
            Ok(cgroup) => Some(Arc::new(cgroup)),
            Err(e) => return not_started(format!("cannot make the attempt's cgroup: {e}")),
        },
        None => None,
    };
    let (mut child, lifeline) = match command(spec, cgroup.as_deref())
        .and_then(|(mut command, lifeline)| command.spawn().map(|child| (child, lifeline)))
    {
        Ok(started) => started,
        Err(e) => {
            // A command that never ran may have left its watcher's record of the group.
            if let Some(dir) = &spec.groups {
                super::leftovers::clear_ended(dir);
            }
            return not_started(format!("cannot start {}: {e}", spec.program.display()));
        }
    };
    let leader = child.id().map(|pid| Pid::from_raw(pid as i32));
    let record = match (leader, &spec.groups) {
        (Some(leader), Some(dir)) => GroupRecord::write(dir, leader)
            .inspect_err(|e| tracing::warn!(group = %leader, error = %e, "process group not recorded; only its watcher will kill it should the worker die"))
            .ok(),
        _ => None,
    };
    let group = GroupKiller {
        group: leader,
        cgroup: cgroup.clone(),
        _record: record,
        _lifeline: lifeline,
    };
    if let (Some(input), Some(mut pipe)) = (spec.stdin.clone(), child.stdin.take()) {
        // A process that does not read its stdin must not block the run: written aside, and
        // a broken pipe is its own business.
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = pipe.write_all(&input).await;
        });
    }
    let to_log = |stream| spec.log.clone().map(|sink| (sink, stream));
    let stdout = tokio::spawn(read_tail(
        child.stdout.take(),
        spec.stdout_limit,
        to_log(LogStream::Stdout),
    ));
    let stderr = tokio::spawn(read_tail(
        child.stderr.take(),
        TAIL_BYTES,
        to_log(LogStream::Stderr),
    ));
    let cancelled = async {
        match cancel {
            Some(notify) => notify.notified().await,
            None => std::future::pending().await,
        }
    };
    let exit = tokio::select! {
        waited = tokio::time::timeout(spec.timeout, child.wait()) => match waited {
            Ok(Ok(status)) => exit_of(status),
            Ok(Err(e)) => Exit::SpawnFailed(format!("cannot wait for the process: {e}")),
            Err(_) => {
                dump_and_wait(spec, &group, &mut child).await;
                Exit::TimedOut
            }
        },
        // Stopped from outside (a kill, a superseding fire): the same dump and grace as a
        // timeout, so a stuck process leaves its stack behind.
        _ = cancelled => {
            dump_and_wait(spec, &group, &mut child).await;
            Exit::Cancelled
        }
    };
    // Whatever the ending, nothing of the group may survive the attempt.
    drop(group);
    // Reaped whatever it was doing: the group is killed.
    let _ = child.wait().await;
    let drain = |task: tokio::task::JoinHandle<String>| async move {
        tokio::time::timeout(DRAIN_TIMEOUT, task)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default()
    };
    ProcessEnd {
        exit,
        stdout_tail: drain(stdout).await,
        stderr_tail: drain(stderr).await,
        // Read once everything in it is gone; dropped after, it is removed.
        accounted: cgroup.map(|cgroup| cgroup.accounted()),
    }
}

/// The end of a process that never started, for `why`.
fn not_started(why: String) -> ProcessEnd {
    ProcessEnd {
        exit: Exit::SpawnFailed(why),
        stdout_tail: String::new(),
        stderr_tail: String::new(),
        accounted: None,
    }
}

fn exit_of(status: std::process::ExitStatus) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => Exit::Code(code),
        (None, Some(signal)) => Exit::Signal(signal),
        (None, None) => Exit::Code(-1),
    }
}

/// At a timeout: asks for a stack dump, and gives the whole group (not only the direct child:
/// `sh -c` may die first while its python still writes) the grace period to write it and exit.
async fn dump_and_wait(spec: &ProcessSpec, group: &GroupKiller, child: &mut tokio::process::Child) {
    let (Some(signal), Some(pid)) = (spec.on_timeout.dump_signal, group.group) else {
        return;
    };
    if killpg(pid, signal).is_err() {
        return;
    }
    let group_gone = async {
        // The direct child first, then until no process of the group is left.
        let _ = child.wait().await;
        while killpg(pid, None).is_ok() {
            tokio::time::sleep(GROUP_POLL).await;
        }
    };
    // A group that outlives the grace is killed by the caller.
    let _ = tokio::time::timeout(spec.on_timeout.grace, group_gone).await;
}

/// How often the grace period checks whether the group is gone.
const GROUP_POLL: Duration = Duration::from_millis(20);

/// Kills the process group, and the attempt's cgroup with whatever left the group, when
/// dropped: at the end of a run, and also when the run is cancelled (its future dropped because
/// the worker shuts down); then clears its record and lets go of its lifeline.
struct GroupKiller {
    group: Option<Pid>,
    cgroup: Option<Arc<AttemptCgroup>>,
    _record: Option<GroupRecord>,
    _lifeline: Lifeline,
}

impl Drop for GroupKiller {
    fn drop(&mut self) {
        if let Some(group) = self.group {
            let _ = killpg(group, Signal::SIGKILL);
        }
        if let Some(cgroup) = &self.cgroup {
            cgroup.kill();
        }
    }
}

/// Reads a pipe to its end, keeping the last `limit` bytes, and handing each read to `log`.
async fn read_tail<R: AsyncRead + Unpin>(
    pipe: Option<R>,
    limit: usize,
    log: Option<(Arc<LogSink>, LogStream)>,
) -> String {
    let Some(mut pipe) = pipe else {
        return String::new();
    };
    let mut kept: Vec<u8> = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Some((sink, stream)) = &log {
                    sink.write(*stream, &buf[..n]);
                }
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > 2 * limit {
                    kept.drain(..kept.len() - limit);
                }
            }
        }
    }
    if kept.len() > limit {
        kept.drain(..kept.len() - limit);
    }
    String::from_utf8_lossy(&kept).into_owned()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    async fn run_plain(spec: &ProcessSpec) -> ProcessEnd {
        run(spec, None).await
    }

    pub(crate) fn sh(script: &str, timeout_ms: u64) -> ProcessSpec {
        ProcessSpec {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            env: vec![("GREETING".into(), "hi".into())],
            workdir: None,
            timeout: Duration::from_millis(timeout_ms),
            on_timeout: OnTimeout::default(),
            stdin: None,
            stdout_limit: TAIL_BYTES,
            groups: None,
            log: None,
            confine: None,
        }
    }

    #[tokio::test]
    async fn exit_codes_and_tails() {
        let end = run_plain(&sh("echo $GREETING; echo oops >&2; exit 3", 10_000)).await;
        assert_eq!(end.exit, Exit::Code(3));
        assert_eq!(end.stdout_tail, "hi\n");
        assert_eq!(end.stderr_tail, "oops\n");
    }

    #[tokio::test]
    async fn stdin_is_written_and_closed() {
        let mut spec = sh("cat; echo done", 10_000);
        spec.stdin = Some(b"{\"a\": 1}\n".to_vec());
        let end = run_plain(&spec).await;
        assert_eq!(end.stdout_tail, "{\"a\": 1}\ndone\n");
        // A process that ignores its stdin is not held up by it.
        let mut spec = sh("echo ignored", 10_000);
        spec.stdin = Some(vec![b'x'; 1 << 20]);
        assert_eq!(run_plain(&spec).await.exit, Exit::Code(0));
    }

    #[tokio::test]
    async fn tails_keep_the_end_of_long_output() {
        let end = run_plain(&sh("seq 1 100000", 10_000)).await;
        assert_eq!(end.exit, Exit::Code(0));
        assert!(end.stdout_tail.len() <= TAIL_BYTES);
        assert!(end.stdout_tail.ends_with("99999\n100000\n"));
    }

    #[tokio::test]
    async fn a_timeout_kills_the_whole_process_group() {
        let marker = tempfile::tempdir().unwrap();
        let pid_file = marker.path().join("grandchild.pid");
        let script = format!("sleep 300 & echo $! > {}; wait", pid_file.display());
        let end = run_plain(&sh(&script, 500)).await;
        assert_eq!(end.exit, Exit::TimedOut);
        gone(&pid_file).await;
    }

    #[tokio::test]
    async fn a_timeout_asks_for_a_stack_dump_before_the_kill() {
        let script = "trap 'echo dumping stacks >&2; exit 134' ABRT; while :; do sleep 0.05; done";
        let end = run_plain(&sh(script, 300)).await;
        assert_eq!(end.exit, Exit::TimedOut);
        // (The shell may also report its `sleep` child aborted by the same signal.)
        assert!(
            end.stderr_tail.contains("dumping stacks\n"),
            "{}",
            end.stderr_tail
        );
    }

    #[tokio::test]
    async fn a_process_deaf_to_the_dump_signal_is_killed_after_the_grace() {
        let mut spec = sh("trap '' ABRT; sleep 300", 300);
        spec.on_timeout.grace = Duration::from_millis(700);
        let started = std::time::Instant::now();
        let end = run_plain(&spec).await;
        let took = started.elapsed();
        assert_eq!(end.exit, Exit::TimedOut);
        assert!(
            took >= Duration::from_millis(1000),
            "killed before the grace: {took:?}"
        );
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    #[tokio::test]
    async fn without_a_dump_signal_the_timeout_kills_at_once() {
        let mut spec = sh("trap 'echo dumped >&2' ABRT; sleep 300", 300);
        spec.on_timeout.dump_signal = None;
        let end = run_plain(&spec).await;
        assert_eq!(end.exit, Exit::TimedOut);
        assert_eq!(end.stderr_tail, "");
    }

    /// Running or sleeping; a zombie waiting for init to reap it counts as dead.
    /// Waits (5 s at most) until the process whose pid `pid_file` holds is gone.
    async fn gone(pid_file: &std::path::Path) {
        let pid: i32 = std::fs::read_to_string(pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while alive(pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "grandchild {pid} survived"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub(crate) fn alive(pid: i32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next())
                .is_some_and(|state| state != 'Z' && state != 'X'),
            Err(_) => false,
        }
    }

    #[tokio::test]
    async fn a_cancelled_run_kills_its_process_group() {
        let marker = tempfile::tempdir().unwrap();
        let pid_file = marker.path().join("grandchild.pid");
        let script = format!("sleep 300 & echo $! > {}; wait", pid_file.display());
        let spec = sh(&script, 60_000);
        let run = tokio::spawn(async move { run(&spec, None).await });
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !pid_file.exists()
            || std::fs::read_to_string(&pid_file)
                .unwrap()
                .trim()
                .is_empty()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the script did not start"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        run.abort();
        gone(&pid_file).await;
    }

    #[tokio::test]
    async fn a_missing_program_is_a_spawn_failure() {
        let groups = tempfile::tempdir().unwrap();
        let mut spec = sh("true", 1000);
        spec.program = "/nonexistent/prog".into();
        spec.groups = Some(groups.path().to_path_buf());
        assert!(matches!(run(&spec, None).await.exit, Exit::SpawnFailed(_)));
        // Its watcher's record of the group is not left behind.
        assert_eq!(std::fs::read_dir(groups.path()).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn a_notified_cancel_stops_the_process() {
        let notify = std::sync::Arc::new(Notify::new());
        let spec = sh("sleep 30", 60_000);
        let waiter = notify.clone();
        let run = tokio::spawn(async move { run(&spec, Some(&waiter)).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        notify.notify_one();
        let end = tokio::time::timeout(Duration::from_secs(5), run)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(end.exit, Exit::Cancelled);
    }
}
