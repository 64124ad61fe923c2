//! The walking skeleton end to end: a YAML job applied with the CLI fires every second, runs on a
//! worker, and its results reach the instance records, `ax.result.<job>` and the CLI.

use crate::support;

use std::time::Duration;

use ax_bus::messages::ResultMessage;
use ax_bus::{codec, State};
use futures::StreamExt;
use support::*;

const HELLO: &str = r#"version: v1
job:
  name: hello
  cron: "*/1 * * * * *"
  exec:
    type: shell
    command: 'echo "hi {{params.who}} {{biz_date}}"; printf "{\"n\": %s}" "$AX_ATTEMPT" > "$AX_OUTPUT_FILE"'
  params: { who: world }
  timeout: 10
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_applied_from_yaml_fires_runs_and_reports() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let mut results = client.nats.subscribe("ax.result.hello").await.unwrap();
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    let dir = nats.path("jobs");
    let file = job_file(&dir, "hello.yaml", HELLO);

    let applied = ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()]);
    assert!(
        applied.status.success(),
        "apply failed: {}\n{}",
        stderr(&applied),
        node.log_text()
    );
    assert!(stdout(&applied).contains("hello") && stdout(&applied).contains("created"));
    let again = ax(
        &nats.url(),
        &["job", "apply", "-f", file.to_str().unwrap(), "--json"],
    );
    assert!(
        stdout(&again).contains("\"unchanged\""),
        "{}",
        stdout(&again)
    );

    let mut tail = AxProcess::spawn(
        Some(&nats.url()),
        &["tail", "results", "--job", "hello"],
        &dir,
        &dir.join("tail.log"),
    );
    let tail_lines = tail.stdout_lines();

    let done = wait_for(
        Duration::from_secs(20),
        "3 successful hello instances",
        || async {
            let ok: Vec<_> = instances(&client, "hello")
                .await
                .into_iter()
                .filter(|r| r.state == State::Success)
                .collect();
            (ok.len() >= 3).then_some(ok)
        },
    )
    .await;

    // The record carries what DESIGN.md promises.
    let first = &done[0];
    assert_eq!(first.job, "hello");
    assert_eq!(first.attempt, 1);
    assert_eq!(first.worker.as_deref(), Some("n1"));
    assert_eq!(first.output["n"], 1);
    assert!(
        first.stdout_tail.starts_with("hi world "),
        "{:?}",
        first.stdout_tail
    );
    assert!(first.started_at.is_some() && first.finished_at.is_some());
    assert_eq!(
        first.expected_time.timestamp_subsec_millis(),
        0,
        "fires land on the second"
    );

    // ax.result.hello carries one message per attempt.
    let message = tokio::time::timeout(Duration::from_secs(10), results.next())
        .await
        .expect("a result")
        .expect("subscription open");
    let result: ResultMessage = codec::decode(&message.payload).unwrap();
    assert_eq!(result.state, State::Success);
    assert_eq!(result.job, "hello");
    assert!(
        result.stdout_tail.starts_with("hi world "),
        "{:?}",
        result.stdout_tail
    );

    // The CLI shows the same.
    let listed = ax(
        &nats.url(),
        &[
            "instance", "list", "--job", "hello", "--state", "success", "--json",
        ],
    );
    let json: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert!(json.as_array().unwrap().len() >= 3);
    let got = ax(
        &nats.url(),
        &["instance", "get", &first.instance_id, "--json"],
    );
    let one: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
    for field in [
        "instance_id",
        "trace_id",
        "job",
        "biz_date",
        "attempt",
        "state",
        "tag",
        "expected_time",
        "created_at",
        "started_at",
        "finished_at",
        "worker",
        "message",
        "output",
    ] {
        assert!(
            one.get(field).is_some(),
            "instance get lacks {field}: {one}"
        );
    }
    let logs = ax(&nats.url(), &["instance", "logs", &first.instance_id]);
    assert!(stdout(&logs).contains("hi world"), "{}", stdout(&logs));

    // `ax tail results` prints JSON lines as results arrive.
    let line = tail_lines
        .recv_timeout(Duration::from_secs(10))
        .expect("a line from ax tail results");
    let tailed: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(tailed["job"], "hello");
    drop(node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_get_pause_resume_trigger_and_delete() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let dir = nats.path("jobs");
    let yaml = HELLO.replace("*/1 * * * * *", "0 0 1 1 *");
    let file = job_file(&dir, "hello.yaml", &yaml);
    assert!(
        ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()])
            .status
            .success()
    );

    let listed = ax(&nats.url(), &["job", "list", "--json"]);
    let jobs: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(jobs[0]["name"], "hello");
    let got = ax(&nats.url(), &["job", "get", "hello"]);
    let back = stdout(&got);
    assert!(
        back.contains("name: hello") && back.contains("0 0 1 1 *"),
        "{back}"
    );

    let paused = ax(&nats.url(), &["job", "pause", "hello"]);
    assert!(paused.status.success() && stdout(&paused).contains("paused"));
    assert!(
        client
            .job(&support::job("hello"))
            .await
            .unwrap()
            .unwrap()
            .0
            .paused
    );
    assert!(ax(&nats.url(), &["job", "resume", "hello"])
        .status
        .success());

    // A manual trigger runs one instance now, with the given date and params.
    let id = trigger(
        &nats,
        &["hello", "--biz-date", "2024-01-01", "--param", "who=there"],
    );
    let record = final_record(&client, &id, Duration::from_secs(15)).await;
    assert_eq!(record.state, State::Success);
    assert_eq!(record.biz_date, "2024-01-01");
    assert!(
        record.stdout_tail.starts_with("hi there 2024-01-01"),
        "{}",
        record.stdout_tail
    );

    let missing = ax(&nats.url(), &["job", "trigger", "nope"]);
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("no job named `nope`"),
        "{}",
        stderr(&missing)
    );

    assert!(ax(&nats.url(), &["job", "delete", "hello"])
        .status
        .success());
    assert!(client.job(&support::job("hello")).await.unwrap().is_none());
    let gone = ax(&nats.url(), &["job", "get", "hello"]);
    assert!(!gone.status.success());
}
