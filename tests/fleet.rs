//! The worker fleet with several real worker processes: tags, spreading the load, ACK before
//! execute, a worker killed mid-attempt, priorities with reserved slots, pausing a queue.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use ax_bus::history::StepKind;
use ax_bus::{AxClient, State, Tag};
use support::*;

/// Runs per worker among the successful instances of `job`.
async fn runs_per_worker(client: &AxClient, job: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for record in instances(client, job).await {
        if record.state == State::Success {
            *counts
                .entry(record.worker.map(|w| w.to_string()).unwrap_or_default())
                .or_default() += 1;
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_are_respected_and_a_job_nobody_can_run_waits() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let _a = AxProcess::node(&nats, "wa", "worker", &["--tags", "alpha"]);
    let _b = AxProcess::node(&nats, "wb", "worker", &["--tags", "beta,extra"]);
    apply_job(
        &nats,
        "tagged",
        &[
            shell_job("on_alpha", "  tags: [alpha]\n", "true"),
            shell_job("on_beta", "  tags: [beta, extra]\n", "true"),
            shell_job("on_gamma", "  tags: [gamma]\n", "true"),
        ]
        .join("---\n"),
    )
    .await;
    for name in ["on_alpha", "on_beta"] {
        let out = ax(
            &nats.url(),
            &[
                "backfill",
                name,
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-10",
                "--parallel",
                "10",
            ],
        );
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let gamma = trigger(&nats, &["on_gamma"]);
    for (name, worker) in [("on_alpha", "wa"), ("on_beta", "wb")] {
        let counts = wait_for(
            Duration::from_secs(30),
            &format!("{name} to run"),
            || async {
                let counts = runs_per_worker(&client, name).await;
                (counts.values().sum::<usize>() == 10).then_some(counts)
            },
        )
        .await;
        assert_eq!(
            counts.keys().collect::<Vec<_>>(),
            [worker],
            "{name} ran on {counts:?}"
        );
    }
    let waiting = wait_for(
        Duration::from_secs(10),
        "on_gamma to be tagged no_worker",
        || async {
            client
                .instance(&support::id(&gamma))
                .await
                .unwrap()
                .map(|(r, _)| r)
                .filter(|r| r.tag == Tag::NoWorker)
        },
    )
    .await;
    assert_eq!(waiting.state, State::Running);

    // ax worker list shows both, alive, with a score.
    let out = ax(&nats.url(), &["worker", "list", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["worker"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["wa", "wb"]);
    assert!(list
        .as_array()
        .unwrap()
        .iter()
        .all(|w| w["alive"] == true && w["score"].is_number()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_list_scores_with_the_routers_configured_weights() {
    let nats = TestNats::start();
    let client = nats.client().await;
    // The Router weighs load alone and waits 30 s for a heartbeat.
    let config = "[router]\nweight_running = 1.0\nweight_duration = 0.0\nworker_ttl = 30\n";
    let _core = AxProcess::configured(&nats, "core", "scheduler,dag,router", config);
    let _worker = AxProcess::node(&nats, "w1", "worker", &[]);
    apply_job(&nats, "nap", &shell_job("nap", "", "sleep 0.3")).await;
    let id = trigger(&nats, &["nap"]);
    assert_eq!(
        final_record(&client, &id, Duration::from_secs(30))
            .await
            .state,
        State::Success
    );
    // Once the worker reports an average duration, a default policy would score it above 0.
    let doc = wait_for(
        Duration::from_secs(20),
        "a worker with a duration",
        || async {
            let out = ax(&nats.url(), &["worker", "list", "--json"]);
            let list: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            let worker = list.as_array()?.first()?.clone();
            (worker["worker"]["avg_duration_ms"].as_f64()? > 0.0
                && worker["worker"]["running"].as_u64()? == 0)
                .then_some(worker)
        },
    )
    .await;
    assert_eq!(doc["score"].as_f64(), Some(0.0), "{doc}");
    assert_eq!(doc["alive"], true);
    let policy = client.routing_policy().await.unwrap();
    assert_eq!(policy.weights.running, 1.0);
    assert_eq!(policy.weights.duration, 0.0);
    assert_eq!(policy.worker_ttl(), Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_spreads_over_equal_workers() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let _workers: Vec<_> = ["w1", "w2", "w3"]
        .iter()
        .map(|id| AxProcess::node(&nats, id, "worker", &["--slots", "4"]))
        .collect();
    wait_for(Duration::from_secs(15), "three live workers", || async {
        (client.workers().await.unwrap().len() == 3).then_some(())
    })
    .await;
    apply_job(&nats, "short", &shell_job("short", "", "sleep 0.05")).await;
    let out = ax(
        &nats.url(),
        &[
            "backfill",
            "short",
            "--from",
            "2026-01-01",
            "--to",
            "2026-10-27",
            "--parallel",
            "300",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let counts = wait_for(Duration::from_secs(90), "300 short tasks", || async {
        let counts = runs_per_worker(&client, "short").await;
        (counts.values().sum::<usize>() == 300).then_some(counts)
    })
    .await;
    assert_eq!(counts.len(), 3, "{counts:?}");
    assert!(
        counts.values().all(|n| *n <= 150),
        "one worker took more than half: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_dispatch_goes_elsewhere_and_never_runs() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let dir = nats.path("slow");
    let slow = AxProcess::spawn_with_env(
        Some(&nats.url()),
        &[
            "node",
            "--roles",
            "worker",
            "--id",
            "slow",
            "--data-dir",
            dir.join("data").to_str().unwrap(),
        ],
        &dir,
        &dir.join("node.log"),
        &[("AX_TEST_STALL_SECS", "8")],
    );
    wait_for(Duration::from_secs(15), "the slow worker", || async {
        (client.workers().await.unwrap().len() == 1).then_some(())
    })
    .await;
    let ledger = nats.path("jobs").join("ledger");
    apply_job(
        &nats,
        "once",
        &shell_job(
            "once",
            "",
            &format!("echo $AX_WORKER >> {}", ledger.display()),
        ),
    )
    .await;
    let id = trigger(&nats, &["once"]);
    // The only worker received it and sits on it; a second one arrives.
    let _fast = AxProcess::node(&nats, "fast", "worker", &[]);
    let record = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(
        (record.state, record.worker.as_deref()),
        (State::Success, Some("fast"))
    );
    wait_for(
        Duration::from_secs(20),
        "the slow worker to give up its dispatch",
        || async { slow.log_text().contains("not ours to run").then_some(()) },
    )
    .await;
    assert_eq!(lines_of(&ledger), ["fast"], "the first dispatch ran");
    // The history tells the re-dispatch: one attempt, dispatched to the fast worker after the
    // slow one was passed over.
    let history = client
        .instance_history(&support::id(&id))
        .await
        .unwrap()
        .expect("a history");
    let dispatched: Vec<&ax_bus::history::Step> = history
        .steps
        .iter()
        .filter(|s| s.step == StepKind::Dispatched)
        .collect();
    assert_eq!(dispatched.len(), 1, "{history:#?}");
    assert_eq!(dispatched[0].worker.as_deref(), Some("fast"));
    assert_eq!(dispatched[0].node.as_deref(), Some("core"));
    assert!(
        dispatched[0]
            .detail
            .ends_with("re-dispatched, passed over slow"),
        "{history:#?}"
    );
}

/// A core node armed to kill itself at `failpoint`, a worker that sits on its first dispatch
/// past the acknowledgement deadline, and a second worker (killed at once when
/// `kill_target`, while the Router still counts it alive): the core node re-dispatches the
/// attempt to the second worker and dies at the failpoint. Returns the test's NATS, a client,
/// the instance, the ledger, and the processes.
async fn router_dies_re_dispatching(
    failpoint: &str,
    kill_target: bool,
) -> (
    TestNats,
    AxClient,
    String,
    std::path::PathBuf,
    Vec<AxProcess>,
) {
    let nats = TestNats::start();
    let client = nats.client().await;
    let dir = nats.path("core-1");
    let core = AxProcess::spawn_with_env(
        Some(&nats.url()),
        &[
            "node",
            "--roles",
            "scheduler,dag,router",
            "--id",
            "core-1",
            "--data-dir",
            dir.join("data").to_str().unwrap(),
        ],
        &dir,
        &dir.join("node.log"),
        &[("AX_FAILPOINT", failpoint)],
    );
    let dir = nats.path("slow");
    let slow = AxProcess::spawn_with_env(
        Some(&nats.url()),
        &[
            "node",
            "--roles",
            "worker",
            "--id",
            "slow",
            "--data-dir",
            dir.join("data").to_str().unwrap(),
        ],
        &dir,
        &dir.join("node.log"),
        &[("AX_TEST_STALL_SECS", "8")],
    );
    wait_for(Duration::from_secs(15), "the slow worker", || async {
        (client.workers().await.unwrap().len() == 1).then_some(())
    })
    .await;
    let ledger = nats.path("jobs").join("ledger");
    apply_job(
        &nats,
        "once",
        &shell_job(
            "once",
            "",
            &format!("echo $AX_WORKER $AX_TRACE_ID >> {}", ledger.display()),
        ),
    )
    .await;
    let id = trigger(&nats, &["once"]);
    let mut fast = AxProcess::node(&nats, "fast", "worker", &[]);
    if kill_target {
        wait_for(Duration::from_secs(15), "the second worker", || async {
            (client.workers().await.unwrap().len() == 2).then_some(())
        })
        .await;
        fast.kill9();
    }
    core.died_at(failpoint).await;
    (nats, client, id, ledger, vec![core, slow, fast])
}

/// The instance ran once, on one trace, and the sweep said it found it stranded when it was.
async fn ran_once_after_all(
    client: &AxClient,
    id: &str,
    ledger: &std::path::Path,
    processes: &[&AxProcess],
) {
    let record = wait_for_logged(
        Duration::from_secs(90),
        "the instance to succeed",
        processes,
        || async {
            let record = client.instance(&support::id(id)).await.ok()??.0;
            (record.state == State::Success).then_some(record)
        },
    )
    .await;
    assert_eq!(record.attempt, 1, "{record:?}");
    let lines = lines_of(ledger);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].ends_with(record.trace_id.as_str()), "{lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_killed_after_reserving_a_re_dispatch_leaves_nothing_stranded() {
    // Killed with the attempt reserved for a dispatch it never sent: the first dispatch can
    // no longer run, and only the in-flight entry knows the attempt is in the air.
    let (nats, client, id, ledger, processes) =
        router_dies_re_dispatching("redispatch.reserved", false).await;
    let core = AxProcess::node(&nats, "core-2", "scheduler,dag,router", &[]);
    let mut all: Vec<&AxProcess> = processes.iter().collect();
    all.push(&core);
    ran_once_after_all(&client, &id, &ledger, &all).await;
    let stranded = alerts_of(&client, "stranded").await;
    assert_eq!(stranded.len(), 1, "{stranded:?}");
    assert_eq!(stranded[0].node.as_str(), "core-2");
    assert!(processes[1].log_text().contains("not ours to run"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_killed_after_re_dispatching_to_a_restarting_worker_leaves_nothing_stranded() {
    // Killed after sending the re-dispatch to a worker that is restarting meanwhile.
    let (nats, client, id, ledger, processes) =
        router_dies_re_dispatching("redispatch.sent", true).await;
    let core = AxProcess::node(&nats, "core-2", "scheduler,dag,router", &[]);
    let fast = AxProcess::node(&nats, "fast", "worker", &[]);
    let mut all: Vec<&AxProcess> = processes.iter().collect();
    all.extend([&core, &fast]);
    ran_once_after_all(&client, &id, &ledger, &all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_attempt_leads_to_exactly_one_success() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let mut doomed = AxProcess::node(&nats, "doomed", "worker", &[]);
    let ledger = nats.path("jobs").join("ledger");
    apply_job(
        &nats,
        "long",
        &shell_job(
            "long",
            "",
            &format!("sleep 3; echo $AX_WORKER >> {}", ledger.display()),
        ),
    )
    .await;
    let id = trigger(&nats, &["long"]);
    executing(&client, &id, Duration::from_secs(15)).await;
    let _survivor = AxProcess::node(&nats, "survivor", "worker", &[]);
    doomed.kill9();
    let record = final_record(&client, &id, Duration::from_secs(40)).await;
    assert_eq!(record.state, State::Success, "{}", record.message);
    assert_eq!(record.worker.as_deref(), Some("survivor"));
    assert_eq!(record.attempt, 2);
    assert_eq!(record.worker_losses, 1);
    assert_eq!(lines_of(&ledger), ["survivor"]);
    // The history shows both attempts, both workers, and who found the first one lost.
    let history = client
        .instance_history(&support::id(&id))
        .await
        .unwrap()
        .expect("a history");
    // A trigger that beats the doomed worker's first heartbeat to the Router waits as NoWorker
    // first (seen on a loaded CI box); that wait is not what this test is about.
    let steps: Vec<(u32, StepKind, Option<&str>)> = history
        .steps
        .iter()
        .filter(|s| s.step != StepKind::NoWorker)
        .map(|s| (s.attempt, s.step, s.worker.as_deref()))
        .collect();
    use StepKind::*;
    assert_eq!(
        steps,
        [
            (1, Created, None),
            (1, Dispatched, Some("doomed")),
            (1, Claimed, Some("doomed")),
            (1, Started, Some("doomed")),
            (2, Lost, Some("doomed")),
            (2, Dispatched, Some("survivor")),
            (2, Claimed, Some("survivor")),
            (2, Started, Some("survivor")),
            (2, Ended, Some("survivor")),
            (2, Reported, Some("survivor")),
        ],
        "{history:#?}"
    );
    // Found by kind: a NoWorker step left out above may stand before it.
    let lost = history
        .steps
        .iter()
        .find(|s| s.step == Lost)
        .expect("a lost step");
    assert_eq!(lost.node.as_deref(), Some("core"), "the janitor's node");
    assert_ne!(lost.trace_id, history.steps[0].trace_id, "a new trace");
    assert!(history.steps[0].detail.starts_with("manual by core"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_priority_work_runs_while_the_low_queue_is_saturated() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let config = "[worker]\nslots = 2\nreserved = { high = 1 }\n";
    let _worker = AxProcess::configured(&nats, "w", "worker", config);
    apply_job(
        &nats,
        "prio",
        &[
            shell_job("bulk", "  priority: low\n", "sleep 4"),
            shell_job("urgent", "  priority: high\n", "true"),
        ]
        .join("---\n"),
    )
    .await;
    let out = ax(
        &nats.url(),
        &[
            "backfill",
            "bulk",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-04",
            "--parallel",
            "4",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for(Duration::from_secs(15), "a low attempt to run", || async {
        instances(&client, "bulk")
            .await
            .iter()
            .any(|r| r.tag == Tag::Executing)
            .then_some(())
    })
    .await;
    let urgent = trigger(&nats, &["urgent"]);
    let record = final_record(&client, &urgent, Duration::from_secs(10)).await;
    assert_eq!(record.state, State::Success);
    let bulk = instances(&client, "bulk").await;
    let done = bulk.iter().filter(|r| r.state == State::Success).count();
    let running = bulk.iter().filter(|r| r.tag == Tag::Executing).count();
    assert_eq!(done, 0, "the high job waited for low work");
    assert_eq!(running, 1, "low work took more than its share of slots");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_loses_nothing() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(
        &nats,
        "later",
        &shell_job("later", "  priority: low\n", "true"),
    )
    .await;
    let out = ax(&nats.url(), &["queue", "pause", "low"]);
    assert!(
        out.status.success() && stdout(&out).contains("queue low paused"),
        "{}",
        stderr(&out)
    );
    let ids: Vec<String> = (0..3).map(|_| trigger(&nats, &["later"])).collect();
    // Give the Router every chance to (wrongly) dispatch them.
    wait_for(
        Duration::from_secs(10),
        "the three to be created",
        || async { (instances(&client, "later").await.len() == 3).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(instances(&client, "later")
        .await
        .iter()
        .all(|r| r.state == State::Running && r.tag == Tag::Queued));
    let out = ax(&nats.url(), &["queue", "list", "--json"]);
    assert!(
        stdout(&out).contains("\"paused\": true"),
        "{}",
        stdout(&out)
    );
    assert!(ax(&nats.url(), &["queue", "resume", "low"])
        .status
        .success());
    for id in ids {
        assert_eq!(
            final_record(&client, &id, Duration::from_secs(15))
                .await
                .state,
            State::Success
        );
    }
    let out = ax(&nats.url(), &["queue", "pause", "urgent"]);
    assert!(
        stderr(&out).contains("unknown priority `urgent`"),
        "{}",
        stderr(&out)
    );
}

/// Backlog control: one worker with one slot for low work, 300 low triggers at once — more
/// than 100 waiting per worker for half a minute, whatever the machine's pace — raise `ax.alert.backlog` and pause the low queue (audited,
/// shown by `ax queue list`); a high job still runs meanwhile; once the backlog is below half
/// the limit the control resumes the queue, and every low instance runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlogged_low_queue_is_paused_and_resumed_while_high_work_runs() {
    let nats = TestNats::start();
    let client = nats.client().await;
    // A factor of 20: 100 low triggers are a backlog for one worker long enough to be seen (it
    // runs about 7 a second alone), and draining below 10 takes a loaded machine a minute or
    // two, not five.
    let config = "[backlog]\nfactor = 20\nfor = 2\nauto_pause_low = true\nresume_after = 2\n";
    let _core = AxProcess::configured(&nats, "core", "scheduler,dag,router", config);
    let worker_config = "[worker]\nslots = 2\nreserved = { high = 1 }\n";
    let _worker = AxProcess::configured(&nats, "w", "worker", worker_config);
    apply_job(
        &nats,
        "prio",
        &[
            shell_job("bulk", "  priority: low\n", "sleep 0.1"),
            shell_job("urgent", "  priority: high\n", "true"),
        ]
        .join("---\n"),
    )
    .await;
    for i in 0..100 {
        let request = ax_bus::messages::TriggerRequest {
            name: "bulk".parse().unwrap(),
            biz_date: None,
            params: Default::default(),
            key: Some(format!("b{i}").parse().unwrap()),
            at: None,
            delay: None,
        };
        client
            .js
            .publish_with_headers(
                "ax.control.trigger",
                ax_bus::codec::msgpack_headers(),
                ax_bus::codec::encode(&request).unwrap(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let paused = |by: &'static str| {
        let client = client.clone();
        async move {
            client
                .queue_states()
                .await
                .unwrap()
                .into_iter()
                .any(|(p, s)| p == ax_bus::spec::Priority::Low && s.paused && s.by == by)
        }
    };
    wait_for(
        Duration::from_secs(60),
        "the low queue to be paused",
        || async { paused("backlog control").await.then_some(()) },
    )
    .await;
    let alerts = alerts_of(&client, "backlog").await;
    assert!(!alerts.is_empty());
    assert!(
        alerts[0].message.starts_with("low work waiting:"),
        "{alerts:?}"
    );
    let out = ax(&nats.url(), &["queue", "list"]);
    assert!(stdout(&out).contains("backlog control"), "{}", stdout(&out));
    // High work runs while low is paused.
    let urgent = trigger(&nats, &["urgent"]);
    let record = final_record(&client, &urgent, Duration::from_secs(20)).await;
    assert_eq!(record.state, State::Success);
    // Drained below half the limit: resumed by the control, recorded on the audit.
    wait_for(
        Duration::from_secs(150),
        "the low queue to be resumed",
        || async { (!paused("backlog control").await).then_some(()) },
    )
    .await;
    let audit = client.js.get_stream("AX_AUDIT").await.unwrap();
    let last = audit
        .get_last_raw_message_by_subject("ax.audit.queue")
        .await
        .unwrap();
    let record: serde_json::Value = ax_bus::codec::decode(&last.payload).unwrap();
    assert_eq!(
        (
            record["action"].as_str(),
            record["actor"].as_str(),
            record["request"]["paused"].as_bool(),
            record["via"].as_str()
        ),
        (
            Some("queue"),
            Some("backlog control"),
            Some(false),
            Some("system")
        )
    );
    wait_for(
        Duration::from_secs(150),
        "every low instance to run",
        || async {
            let done = instances(&client, "bulk")
                .await
                .iter()
                .filter(|r| r.state == State::Success)
                .count();
            (done == 100).then_some(())
        },
    )
    .await;
}
