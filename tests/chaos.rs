//! The chaos suite: a 3-node NATS cluster on loopback, two core nodes (Scheduler,
//! DagCoordinator, Router) and three workers as `ax node` processes, a steady load of cron and
//! DAG jobs, and random `kill -9` + restart of core nodes and workers and stop + restart of one
//! NATS node at a time. The jobs' own commands write a ledger; at the end it is checked
//! against the instance records and the results stream:
//!
//! - every expected fire produced exactly one instance (none lost; ids make a second one
//!   impossible, and the ledger shows no second run of one attempt);
//! - every instance reached a final state;
//! - no attempt (trace id) started twice — on two workers, or on one worker killed and
//!   restarted in between: an attempt whose command may have run is lost with its worker and
//!   its instance gets a new attempt under a new trace id, worker kills or not;
//! - no two attempts of one instance ran at the same time (the wall-clock spans of their
//!   ledger lines, see `support/ledger.rs`, written mostly by a grandchild of the worker's
//!   command process, which must die with a killed worker);
//! - every result is recorded once, and every success has its result.
//!
//! `AX_CHAOS_MINUTES` sets the length of the chaos (1.5 by default: the short profile);
//! `AX_CHAOS_SEED` replays a run's sequence of kills (its seed is printed); `AX_CHAOS_KEEP=1`
//! keeps the cluster's and the nodes' logs. The short profile runs with every `cargo test`;
//! `cargo nextest run -E 'test(/^chaos::/)' --no-capture` shows its story.

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::TimeDelta;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use support::verdict::{ledger_job, Owed, Verdict};
use support::*;

const CORES: [&str; 2] = ["core-1", "core-2"];
const WORKERS: [&str; 3] = ["w1", "w2", "w3"];

/// The ax processes, restartable under their names (same data dir, same worker id).
struct Fleet {
    url: String,
    root: std::path::PathBuf,
    running: BTreeMap<&'static str, AxProcess>,
}

impl Fleet {
    fn start(&mut self, name: &'static str) {
        let roles = if CORES.contains(&name) {
            "scheduler,dag,router"
        } else {
            "worker"
        };
        let dir = self.root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join(format!(
            "node-{}.log",
            ax_bus::time::now().timestamp_millis()
        ));
        let data = dir.join("data");
        let process = AxProcess::spawn(
            Some(&self.url),
            &[
                "node",
                "--roles",
                roles,
                "--id",
                name,
                "--replicas",
                "3",
                "--slots",
                "4",
                "--data-dir",
                data.to_str().unwrap(),
            ],
            &dir,
            &log,
        );
        self.running.insert(name, process);
    }

    /// `kill -9` of `name`, and its start again after `pause`.
    async fn bounce(&mut self, name: &'static str, pause: Duration) {
        println!("chaos: {} kill -9 {name}", ax_bus::time::now());
        if let Some(mut process) = self.running.remove(name) {
            process.kill9();
        }
        tokio::time::sleep(pause).await;
        self.start(name);
        println!("chaos: {} {name} started again", ax_bus::time::now());
    }
}

/// The node-log lines that mention `needle` (for a failure's story).
fn print_log_lines(root: &std::path::Path, needle: &str) {
    let mut logs: Vec<std::path::PathBuf> = Vec::new();
    for node in CORES.iter().chain(WORKERS.iter()) {
        if let Ok(entries) = std::fs::read_dir(root.join(node)) {
            logs.extend(entries.filter_map(Result::ok).map(|e| e.path()));
        }
    }
    logs.sort();
    for log in logs
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
    {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains(needle)) {
            println!("  {}: {line}", log.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_or_run_twice_under_random_kills() {
    let minutes: f64 = std::env::var("AX_CHAOS_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(1.5);
    let seed: u64 = std::env::var("AX_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("chaos: seed {seed}, {minutes} minutes (AX_CHAOS_SEED={seed} replays the kills)");
    let mut rng = StdRng::seed_from_u64(seed);

    let mut cluster = TestCluster::start();
    let client = cluster.client().await;
    let root = cluster.dir.path().join("ax");
    let mut fleet = Fleet {
        url: cluster.url(),
        root: root.clone(),
        running: BTreeMap::new(),
    };
    for name in CORES.iter().chain(WORKERS.iter()) {
        fleet.start(name);
    }
    let ledger_file = root.join("ledger");
    let jobs = root.join("jobs.yaml");
    std::fs::write(
        &jobs,
        [
            ledger_job("tick", "* * * * * *", "", &ledger_file, 1, 20),
            ledger_job("dag_up", "*/3 * * * * *", "", &ledger_file, 1, 20),
            ledger_job(
                "dag_down",
                "*/3 * * * * *",
                "  deps: [ { name: dag_up, biz_date: current } ]\n",
                &ledger_file,
                1,
                20,
            ),
            // Four seconds of ticks from a grandchild: worker kills land mid-command.
            ledger_job("long", "*/10 * * * * *", "", &ledger_file, 20, 30),
        ]
        .join("---\n"),
    )
    .unwrap();
    // The fleet up first (on a loaded machine a three-server cluster and five nodes take a
    // while): an apply nobody answers within its 10 s would fail the test before the chaos.
    wait_for(Duration::from_secs(120), "every node's heartbeat", || {
        let client = client.clone();
        async move {
            let nodes = client.nodes().await.ok()?;
            (nodes.len() >= CORES.len() + WORKERS.len()).then_some(())
        }
    })
    .await;
    let applied = ax(&fleet.url, &["job", "apply", "-f", jobs.to_str().unwrap()]);
    assert!(applied.status.success(), "{}", stderr(&applied));
    let applied_at = ax_bus::time::now();

    // The chaos.
    let (mut scheduler_kills, mut worker_kills, mut nats_stops) = (0, 0, 0);
    let deadline = Instant::now() + Duration::from_secs_f64(minutes * 60.0);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(rng.random_range(3000..8000))).await;
        let pause = Duration::from_millis(rng.random_range(1000..5000));
        match rng.random_range(0..3) {
            0 => {
                fleet
                    .bounce(CORES[rng.random_range(0..CORES.len())], pause)
                    .await;
                scheduler_kills += 1;
            }
            1 => {
                fleet
                    .bounce(WORKERS[rng.random_range(0..WORKERS.len())], pause)
                    .await;
                worker_kills += 1;
            }
            _ => {
                let index = rng.random_range(0..cluster.servers.len());
                println!("chaos: {} stop NATS node s{index}", ax_bus::time::now());
                cluster.servers[index].stop();
                nats_stops += 1;
                tokio::time::sleep(pause * 2).await;
                cluster.servers[index]
                    .restart()
                    .expect("the NATS node restarts on its store");
                println!(
                    "chaos: {} NATS node s{index} started again",
                    ax_bus::time::now()
                );
            }
        }
    }
    let chaos_ended = ax_bus::time::now();
    println!(
        "chaos: over; {scheduler_kills} core kills, {worker_kills} worker kills, {nats_stops} NATS stops"
    );

    // Every fire up to the end of the chaos must end.
    let owed = Owed::new(
        applied_at + TimeDelta::seconds(2),
        chaos_ended - TimeDelta::seconds(1),
        &[("tick", 1), ("dag_up", 3), ("dag_down", 3), ("long", 10)],
    );
    let settled = owed.settle(&client, Duration::from_secs(180)).await;
    let verdict = Verdict::judge(&client, &owed, &settled, &ledger_file).await;
    verdict.print("chaos");
    let all = match &settled {
        Ok(all) | Err(all) => all,
    };
    for record in owed.open(all) {
        println!("chaos: unfinished {record:?}");
        print_log_lines(&root, &record.instance_id);
        print_log_lines(&root, &record.trace_id);
    }
    if !verdict.lost.is_empty() {
        // What each Scheduler recorded around the lost fires.
        for name in owed.due.keys() {
            let ticks = client
                .ticks(&support::job(name), 1000)
                .await
                .unwrap_or_default();
            for t in ticks.iter().filter(|t| {
                verdict
                    .lost
                    .iter()
                    .any(|l| l.starts_with(&format!("{name}@")) && l.ends_with(&t.tick.to_string()))
            }) {
                println!("chaos: tick record {t:?}");
            }
        }
    }
    if verdict.failing() || std::env::var_os("AX_CHAOS_KEEP").is_some() {
        println!("chaos: keeping {}", cluster.dir.path().display());
        let _ = cluster.dir.keep();
    }
    verdict.assert_clean();
    assert_eq!(
        verdict.heartbeats,
        CORES.len() + WORKERS.len(),
        "a node is missing its heartbeat"
    );
    drop(fleet);
}
