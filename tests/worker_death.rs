//! A worker's death ends everything its attempts started: the command's children and
//! grandchildren, however deaf to signals, are gone within a second of a SIGKILL of the worker
//! and before any other attempt of their instance starts — whether the worker comes back at once
//! (it declares the attempt lost and a new one runs) or never (the janitor moves the instance to
//! another worker). One instance never has two executions at once.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use ax_bus::State;
use support::*;

/// A command whose work runs in a grandchild that ignores SIGTERM, SIGINT and SIGHUP (the way
/// `sh -c` starting `python3` left it running): the grandchild writes its pid, then `start`,
/// and later `end`, each with the attempt's trace id — 30 s later on the first attempt, which
/// the tests' kills must end long before (a restarted worker in a debug build on a loaded
/// machine takes seconds), 1 s on the attempt that runs again.
fn grandchild_command(ledger: &Path, pids: &Path) -> String {
    format!(
        "sh -c \"trap \\\"\\\" TERM INT HUP; echo start $AX_TRACE_ID >> {l}; sleep $((AX_ATTEMPT == 1 ? 30 : 1)); echo end $AX_TRACE_ID >> {l}\" & echo $! >> {p}; wait",
        l = ledger.display(),
        p = pids.display()
    )
}

fn job_yaml(ledger: &Path, pids: &Path) -> String {
    format!(
        "version: v1\njob:\n  name: deep\n  exec:\n    type: shell\n    command: '{}'\n",
        grandchild_command(ledger, pids)
    )
}

/// The pid the first attempt's command wrote, once its grandchild started.
async fn first_grandchild(ledger: &Path, pids: &Path) -> (i32, String) {
    wait_for(
        Duration::from_secs(20),
        "the grandchild to start",
        || async {
            let pid = lines_of(pids).first()?.trim().parse::<i32>().ok()?;
            let trace = lines_of(ledger)
                .first()?
                .strip_prefix("start ")?
                .to_string();
            Some((pid, trace))
        },
    )
    .await
}

/// Polls until `pid` is gone; how long it took.
fn gone_within(pid: i32, limit: Duration) -> Duration {
    let since = Instant::now();
    while alive(pid) {
        assert!(
            since.elapsed() < limit,
            "the grandchild {pid} outlived its worker by {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    since.elapsed()
}

/// A core node and worker `w1` running the job's first attempt, its grandchild started.
struct Running {
    nats: TestNats,
    client: ax_bus::AxClient,
    _control: AxProcess,
    worker: AxProcess,
    ledger: std::path::PathBuf,
    id: String,
    grandchild: i32,
    first: String,
}

impl Running {
    async fn start() -> Self {
        let nats = TestNats::start();
        let client = nats.client().await;
        let control = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
        let worker = AxProcess::node(&nats, "w1", "worker", &[]);
        let files = nats.path("files");
        let (ledger, pids) = (files.join("ledger"), files.join("pids"));
        apply_job(&nats, "deep", &job_yaml(&ledger, &pids)).await;
        let id = trigger(&nats, &["deep"]);
        let (grandchild, first) = first_grandchild(&ledger, &pids).await;
        Self {
            nats,
            client,
            _control: control,
            worker,
            ledger,
            id,
            grandchild,
            first,
        }
    }

    /// The instance once final, having succeeded under a new trace.
    async fn succeeded_again(&self, within: Duration) -> ax_bus::InstanceRecord {
        let record = final_record(&self.client, &self.id, within).await;
        assert_eq!(record.state, State::Success, "{}", record.message);
        assert_ne!(record.trace_id.as_str(), self.first);
        record
    }

    /// The ledger: the first attempt's start, then the given attempt's start and end — never
    /// the first's end.
    fn assert_only_the_new_attempt_ended(&self, record: &ax_bus::InstanceRecord) {
        assert_eq!(
            lines_of(&self.ledger),
            [
                format!("start {}", self.first),
                format!("start {}", record.trace_id),
                format!("end {}", record.trace_id)
            ],
            "the first attempt's grandchild went on"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_grandchild_dies_with_it_before_the_attempt_is_run_again() {
    let mut run = Running::start().await;
    run.worker.kill9();
    gone_within(run.grandchild, Duration::from_secs(1));
    // Back at once: the attempt its previous process started is lost, a new one runs.
    let _again = AxProcess::node(&run.nats, "w1", "worker", &[]);
    let record = run.succeeded_again(Duration::from_secs(40)).await;
    assert_eq!(record.attempt, 2);
    run.assert_only_the_new_attempt_ended(&record);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_for_good_leaves_nothing_running() {
    let mut run = Running::start().await;
    // The second worker joins only now, so the first attempt ran on the doomed one.
    let _other = AxProcess::node(&run.nats, "w2", "worker", &[]);
    run.worker.kill9();
    gone_within(run.grandchild, Duration::from_secs(1));
    // The janitor declares w1 dead and the instance runs again on w2.
    let record = run.succeeded_again(Duration::from_secs(60)).await;
    assert_eq!(record.worker.as_ref().map(|w| w.as_str()), Some("w2"));
    run.assert_only_the_new_attempt_ended(&record);
}

/// The parent of process `pid`.
fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("a running process");
    let (_, rest) = stat.rsplit_once(") ").expect("a stat line");
    rest.split_whitespace()
        .nth(1)
        .and_then(|ppid| ppid.parse().ok())
        .expect("a parent pid")
}

/// Should the command's watcher die with the worker (both chosen by the OOM killer), the
/// group is recorded in the worker's data directory: the worker, back, kills it before it
/// declares the attempt lost and a new one runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_watcher_died_too_is_killed_when_the_worker_is_back() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let mut run = Running::start().await;
    // grandchild <- `sh -c` (the command) <- its watcher <- the worker.
    let watcher = Pid::from_raw(parent_of(parent_of(run.grandchild)));
    assert_eq!(parent_of(watcher.as_raw()), run.worker.pid().as_raw());
    // Stopped, the worker cannot see its watcher die; then both are killed. Nothing is left
    // that could end the grandchild.
    kill(run.worker.pid(), Signal::SIGSTOP).unwrap();
    kill(watcher, Signal::SIGKILL).unwrap();
    run.worker.kill9();
    assert!(
        alive(run.grandchild),
        "the grandchild should have outlived both"
    );
    let _again = AxProcess::node(&run.nats, "w1", "worker", &[]);
    gone_within(run.grandchild, Duration::from_secs(20));
    let record = run.succeeded_again(Duration::from_secs(40)).await;
    run.assert_only_the_new_attempt_ended(&record);
}
