//! The partition profile of the chaos suite: real network partitions in network namespaces
//! (see `support/netns.rs`). A 3-node NATS cluster, two core nodes and three workers, each
//! process in a namespace of its own; a per-second job, a DAG pair every 3 s and a long job (12
//! s of work, ticking in the ledger every 0.2 s) every 20 s; then, one after the other, each
//! healed before the next:
//!
//! 1. a NATS node cut off from the other two while every client still reaches it;
//! 2. the worker running a long attempt cut off from everything mid-task: it must stop its
//!    command itself (self-fencing) before another attempt of the instance can start;
//! 3. a core node cut off from everything.
//!
//! After the last heal, every expected fire must have exactly one instance and every instance
//! must end; the ledger must show no attempt started twice, none on two workers, and no two
//! attempts of one instance running at the same time (by the wall-clock spans of their ledger
//! lines); every success must have its run and its result, and no node a panic or a stall.
//! `AX_PARTITION_SEED` picks which NATS node, worker and core node (printed).

use crate::support;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use chrono::TimeDelta;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use ax_bus::client::ConnectConfig;
use ax_bus::{AxClient, State, Tag};
use support::netns::Net;
use support::verdict::{ledger_job, Owed, Verdict};
use support::*;

const SERVERS: [&str; 3] = ["s0", "s1", "s2"];
const CORES: [&str; 2] = ["c1", "c2"];
const WORKERS: [&str; 3] = ["w1", "w2", "w3"];
const CLIENT_PORT: u16 = 4222;
const CLUSTER_PORT: u16 = 6222;

/// A nats-server in its namespace, killed on drop.
struct NsServer {
    child: Child,
}

impl NsServer {
    fn start(net: &Net, name: &str, index: usize, dir: &Path) -> Self {
        let routes = SERVERS
            .iter()
            .map(|s| format!("nats://{}:{CLUSTER_PORT}", net.member(s).ip))
            .collect::<Vec<_>>()
            .join(",");
        let store = dir.join(name);
        std::fs::create_dir_all(&store).unwrap();
        let binary = ax_bus::client::local_server::find_binary().expect("nats-server");
        let mut command = net.command(name, binary.to_str().unwrap());
        command
            .args([
                "-a",
                "0.0.0.0",
                "-p",
                &CLIENT_PORT.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&store)
            .arg("-l")
            .arg(store.join("nats-server.log"))
            .args([
                "-n",
                &format!("s{index}"),
                "--cluster_name",
                "ax-partitions",
            ])
            .args(["--cluster", &format!("nats://0.0.0.0:{CLUSTER_PORT}")])
            .args(["--routes", &routes])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("nats-server in its namespace");
        let ip = net.member(name).ip;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let mut err = String::new();
                if let Some(mut pipe) = child.stderr.take() {
                    let _ = pipe.read_to_string(&mut err);
                }
                panic!("nats-server {name} exited with {status}: {err}");
            }
            let addr = std::net::SocketAddr::from((ip, CLIENT_PORT));
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Self { child };
            }
            assert!(Instant::now() < deadline, "nats-server {name} not up");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for NsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An ax node in its namespace.
fn node(net: &Net, url: &str, name: &str, root: &Path) -> AxProcess {
    let roles = if CORES.contains(&name) {
        "scheduler,dag,router"
    } else {
        "worker"
    };
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("data");
    AxProcess::spawn_command(
        net.command(name, ax_binary()),
        Some(url),
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
        &dir.join("node.log"),
        &[],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_lose_nothing_and_never_run_one_instance_twice_at_once() {
    let seed: u64 = std::env::var("AX_PARTITION_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("partitions: seed {seed} (AX_PARTITION_SEED={seed} replays the choices)");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let root: PathBuf = dir.path().to_path_buf();
    let mut net = Net::create();
    for name in SERVERS.iter().chain(CORES.iter()).chain(WORKERS.iter()) {
        net.add(name);
    }
    let _servers: Vec<NsServer> = SERVERS
        .iter()
        .enumerate()
        .map(|(i, name)| NsServer::start(&net, name, i, &root))
        .collect();
    let url = SERVERS
        .iter()
        .map(|s| format!("nats://{}:{CLIENT_PORT}", net.member(s).ip))
        .collect::<Vec<_>>()
        .join(",");
    let mut config = ConnectConfig::new(&url, "ax-test");
    config.replicas = Some(3);
    let client = wait_for(Duration::from_secs(60), "the cluster", || async {
        AxClient::connect_node(&config).await.ok()
    })
    .await;
    let mut nodes: BTreeMap<&str, AxProcess> = BTreeMap::new();
    for name in CORES.iter().chain(WORKERS.iter()) {
        nodes.insert(name, node(&net, &url, name, &root));
    }
    let ledger_file = root.join("ledger");
    let jobs_file = root.join("jobs.yaml");
    std::fs::write(
        &jobs_file,
        [
            ledger_job("tick", "* * * * * *", "", &ledger_file, 1, 30),
            ledger_job("dag_up", "*/3 * * * * *", "", &ledger_file, 1, 30),
            ledger_job(
                "dag_down",
                "*/3 * * * * *",
                "  deps: [ { name: dag_up, biz_date: current } ]\n",
                &ledger_file,
                1,
                30,
            ),
            ledger_job("long", "*/20 * * * * *", "", &ledger_file, 60, 30),
        ]
        .join("---\n"),
    )
    .unwrap();
    scheduler_running(&url).await;
    let applied = ax(&url, &["job", "apply", "-f", jobs_file.to_str().unwrap()]);
    assert!(applied.status.success(), "{}", stderr(&applied));
    let applied_at = ax_bus::time::now();
    let everyone: Vec<&AxProcess> = nodes.values().collect();
    wait_for_logged(
        Duration::from_secs(60),
        "the jobs to run",
        &everyone,
        || async {
            let done = client
                .instances(Some(&job("tick")))
                .await
                .unwrap_or_default();
            done.iter().any(|r| r.state == State::Success).then_some(())
        },
    )
    .await;

    // 1. A NATS node cut off from its peers; every client still reaches it.
    let lonely = SERVERS[rng.random_range(0..SERVERS.len())];
    println!(
        "partitions: {} NATS node {lonely} cut off from its peers",
        ax_bus::time::now()
    );
    for other in SERVERS.iter().filter(|s| **s != lonely) {
        net.separate(lonely, other);
    }
    tokio::time::sleep(Duration::from_secs(20)).await;
    for other in SERVERS.iter().filter(|s| **s != lonely) {
        net.join(lonely, other);
    }
    println!("partitions: {} healed", ax_bus::time::now());
    tokio::time::sleep(Duration::from_secs(10)).await;

    // 2. The worker of a running long attempt cut off from everything mid-task.
    let (victim, attempt) = wait_for_logged(
        Duration::from_secs(90),
        "a long attempt running",
        &everyone,
        || async {
            let running = client
                .instances(Some(&job("long")))
                .await
                .unwrap_or_default();
            running
                .into_iter()
                // Just started: it has 8 s of work left or more, more than the fence takes
                // (5 s). A window of 4 s: on a loaded machine one listing can take seconds.
                .filter(|r| {
                    r.tag == Tag::Executing
                        && r.started_at
                            .is_some_and(|at| ax_bus::time::now() - at < TimeDelta::seconds(4))
                })
                .find_map(|r| {
                    let worker = r.worker.clone()?;
                    let name = WORKERS.iter().find(|w| **w == worker.as_str())?;
                    Some((*name, r.instance_id))
                })
        },
    )
    .await;
    println!(
        "partitions: {} worker {victim} cut off while it runs {attempt}",
        ax_bus::time::now()
    );
    net.cut(victim);
    tokio::time::sleep(Duration::from_secs(25)).await;
    net.heal(victim);
    println!("partitions: {} healed", ax_bus::time::now());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let fenced = nodes[victim].log_text();
    assert!(
        fenced.contains("self-fencing"),
        "{victim} did not fence: {fenced}"
    );

    // 3. A core node cut off from everything.
    let core = CORES[rng.random_range(0..CORES.len())];
    println!(
        "partitions: {} core node {core} cut off",
        ax_bus::time::now()
    );
    net.cut(core);
    tokio::time::sleep(Duration::from_secs(20)).await;
    net.heal(core);
    let healed_at = ax_bus::time::now();
    println!("partitions: {healed_at} healed");

    // Settle, then check.
    let owed = Owed::new(
        applied_at + TimeDelta::seconds(2),
        healed_at - TimeDelta::seconds(1),
        &[("tick", 1), ("dag_up", 3), ("dag_down", 3), ("long", 20)],
    );
    let settled = owed.settle(&client, Duration::from_secs(180)).await;
    let verdict = Verdict::judge(&client, &owed, &settled, &ledger_file).await;
    verdict.print("partitions");
    if verdict.failing() {
        for process in nodes.values() {
            println!(
                "---- {} ----\n{}",
                process.log.display(),
                process.log_text()
            );
        }
    }
    verdict.assert_clean();
    drop(nodes);
}
