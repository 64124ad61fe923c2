//! Walls between jobs on a worker, with real nodes on this kind of machine (root, cgroups): a
//! job over its `resources.memory` ends `oom_killed` while its worker and the next job carry on;
//! a daemon a job started outside its process group dies at a kill, a timeout and its worker's
//! death; work asking for more memory than any worker offers waits, saying why, and runs once a
//! larger worker joins, through a NATS restart and a worker's, and a broadcast runs only where
//! its request can ever fit; a worker's default limits hold; a worker without cgroups says so.

use crate::support;

use std::time::Duration;

use ax_bus::{State, Tag};
use support::*;

/// Why instance `id` waits for a worker, once its record says it does (`no_worker`).
async fn waiting_reason(client: &ax_bus::AxClient, id: &str) -> String {
    let id: ax_bus::ids::InstanceId = id.parse().expect("an instance id");
    wait_for(Duration::from_secs(30), "the reason it waits", || async {
        client
            .instance(&id)
            .await
            .ok()
            .flatten()
            .map(|(r, _)| r)
            .filter(|r| r.tag == Tag::NoWorker)
    })
    .await
    .message
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_over_its_memory_limit_ends_oom_killed_and_its_worker_goes_on() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    let hog = "python3 -c \"x = bytearray(256 * 1024 * 1024); print(len(x))\"";
    apply_job(
        &nats,
        "walls",
        &[
            shell_job(
                "hog",
                "  resources: { memory: 64Mi }\n  retry: { times: 1, interval: 1 }\n",
                hog,
            ),
            shell_job("next", "", "echo fine"),
        ]
        .join("---\n"),
    )
    .await;
    let id = trigger(&nats, &["hog"]);
    let record = final_record(&client, &id, Duration::from_secs(60)).await;
    assert_eq!((record.state, record.tag), (State::Failed, Tag::OomKilled));
    assert_eq!(record.attempt, 2, "the retry policy applies: {record:?}");
    assert!(
        record
            .message
            .starts_with("killed by the OOM killer: over its memory limit of 64Mi (peak "),
        "{}",
        record.message
    );
    let peak = record
        .usage
        .and_then(|u| u.peak_memory_bytes)
        .expect("the peak, from its cgroup");
    assert!(peak > 32 << 20 && peak <= 64 << 20, "peak {peak}");
    // Both attempts' results say it, the first with its retry ahead.
    let results = wait_for(Duration::from_secs(30), "both results", || async {
        let results = results_of(&client, "hog").await;
        (results.len() == 2).then_some(results)
    })
    .await;
    assert!(
        results
            .iter()
            .all(|r| r.tag == Tag::OomKilled && r.usage.is_some()),
        "{results:?}"
    );
    assert_eq!(results[0].state, State::WaitingRetry);
    // The worker and its node are up, and run the next job, counting what it used.
    assert!(alive(node.pid().as_raw()), "the node died with its job");
    let next = final_record(&client, &trigger(&nats, &["next"]), Duration::from_secs(30)).await;
    assert_eq!(next.state, State::Success, "{next:?}");
    assert!(next.usage.is_some_and(|u| u.cpu_ms.is_some()), "{next:?}");
    // `ax instance get` shows it, each attempt with its own.
    let shown = stdout(&ax(&nats.url(), &["instance", "get", &id]));
    assert!(shown.contains("peak memory"), "{shown}");
    assert_eq!(
        shown.matches("oom_killed").count(),
        3,
        "the tag, then each attempt's line: {shown}"
    );
}

/// A shell command that starts a daemon in a session of its own (its pid written to
/// `pid_file`), then sleeps.
fn daemonizing(pid_file: &std::path::Path) -> String {
    format!(
        "setsid sh -c \"echo \\$\\$ > {}; exec sleep 600\" </dev/null >/dev/null 2>&1 & sleep 600",
        pid_file.display()
    )
}

/// The pid of the daemon a job started, once written; it left the attempt's process group.
async fn daemon(pid_file: &std::path::Path) -> i32 {
    let escaped: i32 = wait_for(Duration::from_secs(30), "the daemon's pid", || async {
        std::fs::read_to_string(pid_file)
            .ok()
            .and_then(|text| text.trim().parse().ok())
    })
    .await;
    assert!(alive(escaped));
    let group = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(escaped))).unwrap();
    assert_eq!(group.as_raw(), escaped, "setsid made it a group of its own");
    escaped
}

/// Waits (10 s at most) for process `pid`, `what`, to be gone.
async fn dies(pid: i32, what: &str) {
    wait_for(
        Duration::from_secs(10),
        &format!("{what} to die"),
        || async { (!alive(pid)).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_left_a_jobs_process_group_dies_at_a_kill_and_at_a_timeout() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let dir = nats.path("daemons");
    let (killed, timed_out) = (dir.join("killed.pid"), dir.join("timed-out.pid"));
    apply_job(
        &nats,
        "daemons",
        &[
            shell_job("killed", "  timeout: 900\n", &daemonizing(&killed)),
            shell_job(
                "timed_out",
                "  timeout: 2\n  on_timeout: { signal: none }\n",
                &daemonizing(&timed_out),
            ),
        ]
        .join("---\n"),
    )
    .await;
    let id = trigger(&nats, &["killed"]);
    let escaped = daemon(&killed).await;
    let out = ax(&nats.url(), &["instance", "kill", &id, "--reason", "test"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let record = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(record.tag, Tag::Killed, "{record:?}");
    dies(escaped, "the killed job's daemon").await;
    let id = trigger(&nats, &["timed_out"]);
    let escaped = daemon(&timed_out).await;
    let record = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(record.tag, Tag::Timeout, "{record:?}");
    dies(escaped, "the timed-out job's daemon").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_left_a_jobs_process_group_dies_when_its_worker_is_killed() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let mut worker = AxProcess::node(&nats, "w1", "worker", &[]);
    let pid_file = nats.path("daemon").join("escaped.pid");
    apply_job(
        &nats,
        "daemon",
        &shell_job("daemonizes", "  timeout: 900\n", &daemonizing(&pid_file)),
    )
    .await;
    let id = trigger(&nats, &["daemonizes"]);
    let escaped = daemon(&pid_file).await;
    worker.kill9();
    dies(escaped, "the daemon of a killed worker").await;
    // A worker back on the same data directory loses the attempt and runs it again.
    let _back = AxProcess::node(&nats, "w1", "worker", &[]);
    wait_for(Duration::from_secs(60), "a new attempt", || async {
        client
            .instance(&id.parse().unwrap())
            .await
            .ok()
            .flatten()
            .filter(|(r, _)| r.attempt >= 2 && r.tag == Tag::Executing)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_asking_for_more_memory_than_any_worker_offers_waits_for_a_larger_worker() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let _small = AxProcess::configured(&nats, "small", "worker", "[worker]\nmemory = \"1Gi\"\n");
    wait_for(Duration::from_secs(30), "the small worker", || async {
        worker_listed(&nats, "small").filter(|w| w["isolation"]["memory_bytes"] == 1u64 << 30)
    })
    .await;
    let ledger = nats.path("jobs").join("ledger");
    apply_job(
        &nats,
        "big",
        &[
            shell_job("big", "  resources: { memory: 2Gi }\n", "echo big"),
            shell_job(
                "small_enough",
                "  resources: { memory: 512Mi }\n",
                "echo small",
            ),
            shell_job(
                "everywhere",
                "  broadcast: true\n  resources: { memory: 2Gi }\n",
                &format!("echo $AX_WORKER >> {}", ledger.display()),
            ),
        ]
        .join("---\n"),
    )
    .await;
    let big = trigger(&nats, &["big"]);
    // What fits runs meanwhile.
    let small = final_record(
        &client,
        &trigger(&nats, &["small_enough"]),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        (small.state, small.worker.map(|w| w.to_string())),
        (State::Success, Some("small".into()))
    );
    assert_eq!(
        waiting_reason(&client, &big).await,
        "no worker with 2Gi memory free; largest 1Gi"
    );
    // A broadcast asking for 2Gi waits too, saying why: it runs once on each worker that can
    // ever hold it, and the small one never can (its run would wait there for ever).
    let broadcast = trigger(&nats, &["everywhere"]);
    assert_eq!(
        waiting_reason(&client, &broadcast).await,
        "no worker with 2Gi memory free; largest 1Gi"
    );
    let _large = AxProcess::configured(&nats, "large", "worker", "[worker]\nmemory = \"4Gi\"\n");
    let ran = final_record(&client, &big, Duration::from_secs(60)).await;
    assert_eq!(
        (ran.state, ran.worker.map(|w| w.to_string())),
        (State::Success, Some("large".into()))
    );
    let shown = worker_listed(&nats, "large").expect("the large worker listed");
    assert_eq!(shown["isolation"]["cgroups"], true, "{shown}");
    let table = stdout(&ax(&nats.url(), &["worker", "list"]));
    assert!(table.contains("cgroups: memory"), "{table}");
    assert!(table.contains("of 4Gi"), "{table}");
    // Each node's heartbeat says its machine: memory, and the disk of its data directory.
    let nodes: serde_json::Value =
        serde_json::from_slice(&ax(&nats.url(), &["nodes", "--json"]).stdout).unwrap();
    let machines: Vec<&serde_json::Value> = nodes
        .as_array()
        .unwrap()
        .iter()
        .map(|n| &n["machine"])
        .collect();
    assert_eq!(machines.len(), 3, "{nodes}");
    for machine in machines {
        let number = |field: &str| machine[field].as_u64().unwrap_or(0);
        assert!(
            number("memory_total_bytes") >= number("memory_available_bytes")
                && number("memory_available_bytes") > 0
                && number("disk_total_bytes") >= number("disk_free_bytes")
                && number("disk_free_bytes") > 0,
            "{machine}"
        );
    }
    let table = stdout(&ax(&nats.url(), &["nodes"]));
    assert!(
        table.contains("MACHINE") && table.contains(", disk "),
        "{table}"
    );

    // Once the large worker joined, the broadcast ran there, and only there.
    let parent = final_record(&client, &broadcast, Duration::from_secs(60)).await;
    assert_eq!(parent.state, State::Success, "{}", parent.message);
    assert_eq!(lines_of(&ledger), ["large"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_default_limit_holds_a_job_that_sets_none() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::configured(
        &nats,
        "n1",
        "all",
        "[worker]\nlimits = { memory = \"64Mi\" }\n",
    );
    let hog = "python3 -c \"x = bytearray(256 * 1024 * 1024); print(len(x))\"";
    apply_job(&nats, "unlimited", &shell_job("unlimited", "", hog)).await;
    let record = final_record(
        &client,
        &trigger(&nats, &["unlimited"]),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!((record.state, record.tag), (State::Failed, Tag::OomKilled));
    assert!(
        record.message.contains("memory limit of 64Mi"),
        "{}",
        record.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_cannot_make_cgroups_says_so_and_work_with_limits_waits() {
    let nats = TestNats::start();
    let client = nats.client().await;
    // A cgroup directory nobody can make cgroups in: the worker falls back to process groups.
    let _node = AxProcess::configured(
        &nats,
        "n1",
        "all",
        "[worker]\ncgroups = \"/proc/ax-no-cgroups-here\"\n",
    );
    let shown = wait_for(
        Duration::from_secs(30),
        "the worker's heartbeat",
        || async { worker_listed(&nats, "n1") },
    )
    .await;
    assert_eq!(shown["isolation"]["cgroups"], false, "{shown}");
    let said = shown["isolation"]["said"].as_str().unwrap_or_default();
    assert!(
        said.starts_with("process groups only, no resource limits: ")
            && said.contains("/proc/ax-no-cgroups-here"),
        "{said}"
    );
    let table = stdout(&ax(&nats.url(), &["worker", "list"]));
    assert!(table.contains("process groups only"), "{table}");
    apply_job(
        &nats,
        "fallback",
        &[
            shell_job("plain", "", "echo plain"),
            shell_job("limited", "  resources: { memory: 64Mi }\n", "echo limited"),
        ]
        .join("---\n"),
    )
    .await;
    let plain = final_record(
        &client,
        &trigger(&nats, &["plain"]),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(plain.state, State::Success);
    assert!(plain.usage.is_none(), "nothing counts it: {plain:?}");
    let limited = trigger(&nats, &["limited"]);
    assert_eq!(
        waiting_reason(&client, &limited).await,
        "no live worker of its tags and executor can limit its memory (cgroups)"
    );
}

/// Work waiting for room keeps waiting through a NATS restart and runs once when the room is
/// freed; a worker killed while it held room comes back with all of it (nothing it held
/// before is counted again), and what waited runs there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_waiting_for_room_survives_a_nats_restart_and_a_restarted_worker_has_its_room() {
    let mut nats = TestNats::start();
    let client = nats.client().await;
    let _core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let small_config = "[worker]\nmemory = \"1Gi\"\n";
    let mut small = AxProcess::configured(&nats, "small", "worker", small_config);
    wait_for(Duration::from_secs(30), "the small worker", || async {
        worker_listed(&nats, "small").filter(|w| w["isolation"]["memory_bytes"] == 1u64 << 30)
    })
    .await;
    let release = nats.path("jobs").join("release");
    let hold = format!("while [ ! -f {} ]; do sleep 0.1; done", release.display());
    apply_job(
        &nats,
        "hold",
        &[
            shell_job("hold", "  resources: { memory: 768Mi }\n", &hold),
            shell_job("next", "  resources: { memory: 512Mi }\n", "echo next"),
        ]
        .join("---\n"),
    )
    .await;

    // The holder takes 768Mi of the 1Gi; the next waits, saying so, through a NATS restart.
    let holder = trigger(&nats, &["hold"]);
    executing(&client, &holder, Duration::from_secs(30)).await;
    let next = trigger(&nats, &["next"]);
    let waiting = "no worker with 512Mi memory free; largest 256Mi";
    assert_eq!(waiting_reason(&client, &next).await, waiting);
    nats.server.restart().expect("nats-server restarts");
    let client = nats.client().await;
    assert_eq!(waiting_reason(&client, &next).await, waiting);
    std::fs::write(&release, "go").unwrap();
    let (held, ran) = (
        final_record(&client, &holder, Duration::from_secs(60)).await,
        final_record(&client, &next, Duration::from_secs(60)).await,
    );
    assert_eq!((held.state, ran.state), (State::Success, State::Success));
    assert_eq!(ran.attempt, 1, "{ran:?}");

    // The worker dies holding 768Mi; restarted, it offers the whole 1Gi again.
    std::fs::remove_file(&release).unwrap();
    let holder = trigger(&nats, &["hold"]);
    executing(&client, &holder, Duration::from_secs(30)).await;
    let next = trigger(&nats, &["next"]);
    assert_eq!(waiting_reason(&client, &next).await, waiting);
    small.kill9();
    let _small = AxProcess::configured(&nats, "small", "worker", small_config);
    std::fs::write(&release, "go").unwrap();
    let ran = final_record(&client, &next, Duration::from_secs(90)).await;
    assert_eq!(
        (ran.state, ran.worker.map(|w| w.to_string())),
        (State::Success, Some("small".into()))
    );
    let held = final_record(&client, &holder, Duration::from_secs(90)).await;
    assert!(held.state.is_final(), "{held:?}");
    let shown = wait_for(Duration::from_secs(30), "the room given back", || async {
        worker_listed(&nats, "small").filter(|w| w["isolation"]["requested"]["memory_bytes"] == 0)
    })
    .await;
    assert_eq!(shown["isolation"]["memory_bytes"], 1u64 << 30, "{shown}");
}
