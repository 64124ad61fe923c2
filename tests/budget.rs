//! A worker's slots as a budget, with real worker processes: a freed slot goes to the high work
//! waiting (one release at most, with no slot reserved), and `[worker.adaptive]` grows the
//! budget while work waits on an idle machine and shrinks it when memory runs low — what it
//! decided and why in `ax worker list` and the metrics.

use crate::support;

use std::time::Duration;

use ax_bus::{AxClient, State};
use support::*;

/// When each successful instance of `job` started.
async fn starts(client: &AxClient, job: &str) -> Vec<chrono::DateTime<chrono::Utc>> {
    instances(client, job)
        .await
        .into_iter()
        .filter(|r| r.state == State::Success)
        .filter_map(|r| r.started_at)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_work_takes_the_next_release_ahead_of_a_low_flood() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    // One slot, none reserved: only the hand-over order keeps high work ahead.
    let _worker = AxProcess::node(&nats, "w1", "worker", &["--slots", "1"]);
    apply_job(
        &nats,
        "flood",
        &[
            shell_job("flood_low", "  priority: low\n", "sleep 3"),
            shell_job("urgent", "  priority: high\n", "true"),
        ]
        .join("---\n"),
    )
    .await;
    for _ in 0..3 {
        trigger(&nats, &["flood_low"]);
    }
    // The first low attempt runs; the worker holds the next one for the slot.
    wait_for(
        Duration::from_secs(30),
        "the first low attempt to start",
        || async {
            instances(&client, "flood_low")
                .await
                .iter()
                .any(|r| r.started_at.is_some())
                .then_some(())
        },
    )
    .await;
    trigger(&nats, &["urgent"]);
    let high = wait_for(Duration::from_secs(60), "the high job to run", || async {
        instances(&client, "urgent")
            .await
            .into_iter()
            .find(|r| r.state == State::Success)
    })
    .await;
    let (created, started) = (high.created_at, high.started_at.expect("started"));
    let lows = wait_for(Duration::from_secs(60), "the low flood to run", || async {
        let starts = starts(&client, "flood_low").await;
        (starts.len() == 3).then_some(starts)
    })
    .await;
    // The low attempt running when the high work came ended 3 s after it started: the high
    // work was held for the slot by then, and the release went to it, not to the low work
    // queued before it.
    let overtaken: Vec<_> = lows
        .iter()
        .filter(|low| created < **low && **low < started)
        .collect();
    assert!(
        overtaken.is_empty(),
        "low attempts started while the high one waited: {overtaken:?} (high created {created}, started {started})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adaptive_budget_grows_for_waiting_work_and_shrinks_when_memory_runs_low() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let port = free_port();
    // The load thresholds are out of reach, so a loaded test machine does not decide for it.
    let roomy = AxProcess::configured(
        &nats,
        "roomy",
        "worker",
        &format!(
            "[worker]\nslots = 1\n[worker.adaptive]\nmin = 1\nmax = 4\nload_low = 999\nload_high = 1000\nevery = 0.5\nmemory_min_mib = 0\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"
        ),
    );
    apply_job(&nats, "slow", &shell_job("slow", "", "sleep 4")).await;
    for _ in 0..8 {
        trigger(&nats, &["slow"]);
    }
    let grown = wait_for(
        Duration::from_secs(60),
        "the budget to grow to 4 with 4 attempts running",
        || async { worker_listed(&nats, "roomy").filter(|w| w["slots"] == 4 && w["running"] == 4) },
    )
    .await;
    assert_eq!(grown["budget"]["min"], 1);
    assert_eq!(grown["budget"]["max"], 4);
    assert!(grown["budget"]["memory_available_bytes"].as_u64() > Some(0));
    let metrics = wait_for(Duration::from_secs(10), "the metrics", || async {
        let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.contains("ax_worker_slots 4").then_some(text)
    })
    .await;
    assert!(
        metrics.contains("ax_worker_budget_changes_total{reason=\"room\"} 3"),
        "three steps up, each counted: {}",
        metrics
            .lines()
            .filter(|l| l.contains("worker_"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(metrics.contains("ax_worker_load_per_core"));
    // The table says how the budget stands.
    let table = stdout(&ax(&nats.url(), &["worker", "list"]));
    assert!(table.contains("BUDGET"), "{table}");
    assert!(table.contains("1-4 "), "{table}");
    drop(roomy);

    // A worker that never has the memory it asks for shrinks to its minimum, and says why;
    // what it takes still runs.
    let _tight = AxProcess::configured(
        &nats,
        "tight",
        "worker",
        "[worker]\nslots = 3\n[worker.adaptive]\nmin = 1\nmax = 3\nevery = 0.5\nmemory_min_mib = 1073741824\n",
    );
    let shrunk = wait_for(
        Duration::from_secs(30),
        "the budget to shrink for memory",
        || async {
            worker_listed(&nats, "tight")
                .filter(|w| w["slots"] == 1 && w["budget"]["reason"] == "memory_low")
        },
    )
    .await;
    assert_eq!(shrunk["budget"]["max"], 3);
    wait_for(
        Duration::from_secs(90),
        "every slow instance to run",
        || async { (starts(&client, "slow").await.len() == 8).then_some(()) },
    )
    .await;
}

#[test]
fn a_budget_that_leaves_low_work_no_slot_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("node.toml");
    for (text, says) in [
        (
            "[worker.adaptive]\nmin = 2\nmax = 8\n[worker]\nreserved = { high = 2 }\n",
            "leaves no slot of 2 (the budget's minimum)",
        ),
        (
            "[worker.adaptive]\nmin = 4\nmax = 2\n",
            "[worker.adaptive] min = 4, max = 2",
        ),
        (
            "[worker.adaptive]\nload_low = 2\nload_high = 1\n",
            "need 0 < load_low < load_high",
        ),
        (
            "[worker.adaptive]\nevery = 0.1\n",
            "[worker.adaptive] every = 0.1",
        ),
        (
            "[worker.adaptive]\nmaximum = 3\n",
            "unknown field `maximum`",
        ),
    ] {
        std::fs::write(&config, text).expect("write config");
        let out = std::process::Command::new(ax_binary())
            .args(["node", "--nats", "nats://127.0.0.1:1", "--roles", "worker"])
            .args(["--id", "w", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--config")
            .arg(&config)
            .output()
            .expect("run ax node");
        assert!(!out.status.success(), "{text} was accepted");
        let err = stderr(&out);
        assert!(err.contains(says), "{text}: {err}");
    }
}
