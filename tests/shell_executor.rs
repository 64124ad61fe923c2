//! The shell executor through the whole system: a timeout kills the process tree, a param full
//! of shell metacharacters stays a literal string, a failing command ends `failed`.

use crate::support;

use std::time::Duration;

use ax_bus::{State, Tag};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_kills_the_process_tree_and_fails_the_instance() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let dir = nats.path("jobs");
    let pid_file = dir.join("grandchild.pid");
    let job = format!(
        "version: v1
job:
  name: stuck
  exec:
    type: shell
    command: 'sh -c \"sleep 300 & echo \\$! > {}; wait\"; echo never'
  timeout: 1
",
        pid_file.display()
    );
    let file = job_file(&dir, "stuck.yaml", &job);
    assert!(
        ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()])
            .status
            .success()
    );
    let out = ax(&nats.url(), &["job", "trigger", "stuck"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).split_whitespace().next().unwrap().to_string();
    let record = wait_for(
        Duration::from_secs(20),
        "the stuck instance to end",
        || async {
            client
                .instance(&support::id(&id))
                .await
                .unwrap()
                .map(|(r, _)| r)
                .filter(|r| r.state.is_final())
        },
    )
    .await;
    assert_eq!(
        (record.state, record.tag),
        (State::Failed, Tag::Timeout),
        "{}",
        record.message
    );
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_for(
        Duration::from_secs(5),
        "the grandchild sleep to be gone",
        || async { (!alive(pid)).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_keeps_the_stack_dump_of_a_hung_python() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let dir = nats.path("jobs");
    let script = dir.join("hung.py");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        &script,
        "import time\n\ndef stuck_in_here():\n    time.sleep(600)\n\nstuck_in_here()\n",
    )
    .unwrap();
    let job = format!(
        "version: v1
job:
  name: hung
  exec:
    type: shell
    command: python3 -X faulthandler {}
  timeout: 2
",
        script.display()
    );
    let file = job_file(&dir, "hung.yaml", &job);
    assert!(
        ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()])
            .status
            .success()
    );
    let out = ax(&nats.url(), &["job", "trigger", "hung"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).split_whitespace().next().unwrap().to_string();
    let record = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(
        (record.state, record.tag),
        (State::Failed, Tag::Timeout),
        "{}",
        record.message
    );
    assert!(record.message.contains("SIGABRT"), "{}", record.message);
    assert!(
        record.stderr_tail.contains("Fatal Python error: Aborted")
            && record.stderr_tail.contains("stuck_in_here"),
        "no stack dump in: {}",
        record.stderr_tail
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn params_with_shell_metacharacters_stay_literal() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let dir = nats.path("jobs");
    let marker = dir.join("pwned");
    let file = job_file(
        &dir,
        "echo.yaml",
        "version: v1
job:
  name: echo
  exec:
    type: shell
    command: 'printf \"[%s]\" {{params.x}} \"{{params.x}}\" \"$AX_PARAM_x\"'
  params: { x: harmless }
",
    );
    assert!(
        ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()])
            .status
            .success()
    );
    for evil in [
        format!("$(touch {})", marker.display()),
        format!("; touch {} ; echo pwned", marker.display()),
        format!("`touch {}` && touch {}", marker.display(), marker.display()),
        "' \" \\ $HOME *".to_string(),
    ] {
        let param = format!("x={evil}");
        let id = trigger(&nats, &["echo", "--param", &param]);
        let record = final_record(&client, &id, Duration::from_secs(15)).await;
        assert_eq!(record.state, State::Success, "{}", record.stderr_tail);
        assert_eq!(record.stdout_tail, format!("[{evil}][{evil}][{evil}]"));
        assert!(!marker.exists(), "`{evil}` was executed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_command_ends_failed_with_its_exit_code() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let dir = nats.path("jobs");
    let file = job_file(
        &dir,
        "fail.yaml",
        "version: v1\njob:\n  name: fail\n  exec:\n    type: shell\n    command: 'echo boom >&2; exit 7'\n",
    );
    assert!(
        ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()])
            .status
            .success()
    );
    let id = trigger(&nats, &["fail"]);
    let record = final_record(&client, &id, Duration::from_secs(15)).await;
    assert_eq!(
        (record.state, record.tag, record.exit_code),
        (State::Failed, Tag::ExitCode, Some(7))
    );
    assert_eq!(record.stderr_tail, "boom\n");
}
