//! `ax bench`: speed, measured against raw JetStream in the same run on the same machine.
//!
//! It starts its own nats-server (the pinned one, file storage, default sync settings) in a
//! temporary directory and runs each section against it; every figure is printed with the raw
//! limit beside it. Sections: `memory` (pending timers), `limit` (raw JetStream), `wire` (every message of an instance, by kind), `throughput`
//! (no-op instances end to end), `triggers` (keyed triggers from a service end to end, pending
//! delayed instances), `routing` (the Router's decision and its cost to dispatch),
//! `concurrency` (high work beside a CPU-bound low flood, fixed slots against the adaptive
//! budget), `cgroups` (what an attempt's cgroup costs), `lateness` (fires against their expected time), `dag` (the DagCoordinator on 10,000-job
//! graphs), `recovery` (a restarted Scheduler), `scale` (Schedulers sharing the jobs),
//! `cluster` (one nats-server against three at replicas 3, and which saturates first),
//! `console` (page renders with 100,000 instances stored), `history` (the store per finished
//! instance); `stored` (ten million finished records: the store, the console's start
//! and memory, a Scheduler's ready time, one job's list) runs only when named in `--only`.
//! `--quick` runs every section at small sizes, in under three minutes in a
//! debug build: it shows that each works (the test suite runs it); its figures are not the
//! ones to compare.

mod cgroups;
mod cluster;
mod concurrency;
mod console;
mod cpu;
mod dag;
mod history;
mod lateness;
mod limit;
mod memory;
mod process;
mod recovery;
mod routing;
mod scale;
mod stored;
mod throughput;
mod triggers;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use ax_actors::jetstream::publish::AckWindow;
use ax_actors::{parse_roles, Node, NodeConfig, SystemClock, WorkerConfig};
use ax_bus::client::local_server::{find_binary, LocalServer, ServerOptions};
use ax_bus::client::{AxClient, ConnectConfig};
use ax_bus::codec;
use ax_bus::messages::commands::Command;
use ax_bus::messages::{JobRecord, TriggerRequest};
use ax_bus::spec::JobSpec;

/// Why a benchmark could not run: the error it met, with its source.
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;
/// A benchmark's outcome.
pub type Result<T> = std::result::Result<T, BenchError>;

/// Returns early with an error made of the formatted text.
#[macro_export]
macro_rules! bail {
    ($($reason:tt)*) => {
        return Err(format!($($reason)*).into())
    };
}

/// One line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    /// Section (`limit`, `dag`).
    pub section: &'static str,
    /// What was measured.
    pub name: String,
    /// The value.
    pub value: f64,
    /// Its unit.
    pub unit: &'static str,
    /// Detail (sizes, ratios).
    pub note: String,
}

/// The whole report.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Cores and CPU model.
    pub machine: String,
    /// `nats-server --version`.
    pub nats_server: String,
    /// When it ran (RFC 3339).
    pub date: String,
    /// Whether with `--quick` sizes.
    pub quick: bool,
    /// Every figure, in the order measured.
    pub figures: Vec<Figure>,
}

/// The sections, in the order they run.
const SECTIONS: [&str; 15] = [
    "memory",
    "wire",
    "throughput",
    "triggers",
    "routing",
    "concurrency",
    "cgroups",
    "lateness",
    "dag",
    "recovery",
    "scale",
    "cluster",
    "console",
    "history",
    "stored",
];

/// The sections that run only when named in `--only` (they take long).
const NAMED_ONLY: [&str; 1] = ["stored"];

/// Runs the sections named in `only` (every one when empty) against a nats-server of its own.
pub async fn run(quick: bool, only: &[String]) -> Result<Report> {
    for name in only {
        if !SECTIONS.contains(&name.as_str()) {
            bail!("--only: unknown section `{name}` ({})", SECTIONS.join(", "));
        }
    }
    let wanted = |name: &str| {
        if only.is_empty() {
            !NAMED_ONLY.contains(&name)
        } else {
            only.iter().any(|o| o == name)
        }
    };
    // Each section says when it starts, so a slow one is seen as it runs.
    let started = std::time::Instant::now();
    let say = |what: &str| eprintln!("[{:>4} s] {what}", started.elapsed().as_secs());
    let dir = tempfile::tempdir()?;
    let (server, version) = start_server(dir.path())?;
    let nats = async_nats::ConnectOptions::new()
        .name("ax-bench")
        .connection_timeout(Duration::from_secs(5))
        .connect(&server.url)
        .await?;
    let mut figures = Vec::new();
    // Memory first, while the heap holds nothing freed that the wheel could reuse unseen.
    if wanted("memory") {
        say("memory: pending timers…");
        figures.extend(memory::measure());
    }
    say("limit: raw JetStream…");
    let (limit, rates) = limit::measure(&nats, quick, server.pid()).await?;
    let raw = rates.publish.min(rates.consume);
    figures.extend(limit);
    figures.push(limit::batched(&server.url, quick).await?);
    if wanted("wire") {
        say("wire: every message of an instance, by kind…");
        figures.extend(wire::measure(&server.url, quick).await?);
    }
    if wanted("throughput") {
        say("throughput: no-op instances end to end…");
        let raw_cpu = rates.publish_cpu.0 + rates.publish_cpu.1;
        figures.extend(throughput::measure(&server.url, quick, raw, server.pid(), raw_cpu).await?);
    }
    if wanted("triggers") {
        say("triggers: keyed triggers end to end, pending delayed instances…");
        figures.extend(triggers::measure(&server.url, quick, raw).await?);
    }
    if wanted("routing") {
        say("routing: decision cost and dispatch with 50 simulated workers…");
        figures.extend(routing::measure(&server.url, quick).await?);
    }
    if wanted("concurrency") {
        say("concurrency: a CPU-bound low flood and a high trickle, fixed slots and adaptive…");
        figures.extend(concurrency::measure(&server.url, quick).await?);
    }
    if wanted("cgroups") {
        say("cgroups: what an attempt's cgroup costs…");
        figures.extend(cgroups::measure(quick).await);
    }
    if wanted("lateness") {
        say("lateness: simultaneous and steady fires…");
        figures.extend(lateness::measure(&server.url, quick).await?);
    }
    if wanted("dag") {
        say("dag: 10,000-job graphs (300 with --quick)…");
        figures.extend(dag::measure(&nats, quick).await?);
    }
    if wanted("recovery") {
        say("recovery: a restarted Scheduler…");
        figures.extend(recovery::measure(&server.url, quick).await?);
    }
    if wanted("scale") {
        say("scale: 1, 2 and 4 Schedulers sharing the jobs…");
        figures.extend(scale::measure(&server.url, quick).await?);
    }
    if wanted("cluster") {
        say("cluster: one nats-server against three at replicas 3…");
        figures.extend(cluster::measure(&server.url, server.pid(), quick).await?);
    }
    if wanted("console") {
        say("console: page renders with 1,000 jobs and 100,000 instances…");
        figures.extend(console::measure(&server.url, quick).await?);
    }
    if wanted("history") {
        say("history: store per finished instance, the store under a retention…");
        figures.extend(history::measure(&server.url, quick).await?);
    }
    if wanted("stored") {
        say("stored: 10 million finished records (200,000 with --quick), what they cost…");
        figures.extend(stored::measure(&server.url, quick).await?);
    }
    Ok(Report {
        machine: machine(),
        nats_server: version,
        date: ax_bus::time::rfc3339(ax_bus::time::now()),
        quick,
        figures,
    })
}

/// The bench's own nats-server (the pinned binary, storing under `dir`), and its version.
fn start_server(dir: &std::path::Path) -> Result<(LocalServer, String)> {
    let binary = find_binary()?;
    let version = std::process::Command::new(&binary)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let server = LocalServer::start(ServerOptions {
        binary,
        port: None,
        store_dir: dir.join("store"),
        log_file: None,
        extra_args: Vec::new(),
    })?;
    Ok((server, version))
}

/// A client of its own (so its message counts are its own) under `prefix`.
async fn client_for(url: &str, prefix: &str) -> Result<AxClient> {
    let mut config = ConnectConfig::new(url, format!("ax-bench-{prefix}"));
    config.prefix = prefix.to_string();
    Ok(AxClient::connect_node(&config).await?)
}

/// Writes jobs into the registry, acks awaited in windows.
async fn store_jobs(client: &AxClient, specs: &[JobSpec]) -> Result<()> {
    let mut acks = AckWindow::new(1024);
    for spec in specs {
        let record = JobRecord {
            spec: spec.clone(),
            paused: false,
            updated_at: ax_bus::time::now(),
            defined_at: None,
        };
        put(
            &mut acks,
            client,
            &client.layout.jobs_bucket(),
            &spec.name,
            &record,
        )
        .await?;
    }
    acks.flush().await?;
    Ok(())
}

/// Puts `value` under `key` in `bucket`, its ack awaited in `acks`' window.
async fn put(
    acks: &mut AckWindow,
    client: &AxClient,
    bucket: &str,
    key: &str,
    value: &impl Serialize,
) -> Result<()> {
    let ack = client.kv_put_pipelined(bucket, key, codec::encode(value)?);
    acks.push(ack.await?).await?;
    Ok(())
}

/// A node named `bench` running `roles`, its worker (if any) with `slots` slots, its files in
/// `scratch`; when it runs a Scheduler, returned once that has loaded the registry.
async fn start_node(
    client: &AxClient,
    roles: &str,
    slots: u32,
    scratch: &std::path::Path,
) -> Result<Node> {
    let worker = WorkerConfig {
        slots,
        ..WorkerConfig::new("bench".parse()?, scratch.to_path_buf())
    };
    start_node_with(client, roles, worker, scratch).await
}

/// [`start_node`] with a worker of these settings.
async fn start_node_with(
    client: &AxClient,
    roles: &str,
    worker: WorkerConfig,
    scratch: &std::path::Path,
) -> Result<Node> {
    let (loaded_tx, mut loaded) = tokio::sync::watch::channel(None);
    let roles = parse_roles(roles)?;
    let scheduler = roles.contains(&ax_actors::Role::Scheduler);
    let node = Node::start(
        client.clone(),
        NodeConfig {
            worker,
            scheduler_loaded: Some(loaded_tx),
            ..NodeConfig::new("bench".parse()?, roles, scratch.to_path_buf())
        },
        Arc::new(SystemClock),
    )?;
    if scheduler {
        tokio::time::timeout(Duration::from_secs(60), loaded.wait_for(|l| l.is_some()))
            .await
            .map_err(|_| "the bench node's Scheduler did not load the registry in 60 s")??;
    }
    Ok(node)
}

/// A node named `bench` running a DagCoordinator alone, its files in `scratch`, returned once
/// the coordinator leads, with the number of (job, date) days its view holds.
async fn start_dag(client: &AxClient, scratch: &std::path::Path) -> Result<(Node, usize)> {
    let (leading_tx, mut leading) = tokio::sync::watch::channel(None);
    let node = Node::start(
        client.clone(),
        NodeConfig {
            dag_leading: Some(leading_tx),
            ..NodeConfig::new("bench".parse()?, parse_roles("dag")?, scratch.to_path_buf())
        },
        Arc::new(SystemClock),
    )?;
    let days = tokio::time::timeout(Duration::from_secs(600), leading.wait_for(|l| l.is_some()))
        .await
        .map_err(|_| "the bench node's DagCoordinator did not lead in 600 s")??
        .unwrap_or_default();
    Ok((node, days))
}

/// Messages sent and received on `client`'s connection so far.
fn messages_so_far(client: &AxClient) -> (u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    let stats = client.nats.statistics();
    (
        stats.out_messages.load(Relaxed),
        stats.in_messages.load(Relaxed),
    )
}

/// Sends `requests` on the control subject as a business service would (MessagePack, no
/// answer asked for), the publish acks awaited in windows.
async fn send_triggers(
    client: &AxClient,
    requests: impl Iterator<Item = TriggerRequest>,
) -> Result<()> {
    let subject = client.subjects().control(Command::Trigger.name());
    let mut acks = AckWindow::new(1024);
    for request in requests {
        acks.push(
            client
                .js
                .publish_with_headers(
                    subject.clone(),
                    codec::msgpack_headers(),
                    codec::encode(&request)?,
                )
                .await?,
        )
        .await?;
    }
    acks.flush().await?;
    Ok(())
}

/// A keyed trigger of `job`, run at `at` when given.
fn keyed_trigger(
    job: &str,
    key: &str,
    at: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<TriggerRequest> {
    Ok(TriggerRequest {
        name: job.parse()?,
        biz_date: None,
        params: Default::default(),
        key: Some(key.parse()?),
        at: at.map(ax_bus::time::rfc3339),
        delay: None,
    })
}

/// Waits until the Schedulers have carried out every control command sent so far.
async fn commands_done(client: &AxClient, within: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + within;
    let mut stream = client.js.get_stream(client.layout.control_stream()).await?;
    loop {
        if stream.info().await?.state.messages == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the Schedulers did not carry out the commands within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A no-op job named `name` that runs only when triggered.
fn manual_job(name: &str) -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "name": name,
        "exec": {"type": "noop"},
    }))
    .expect("a valid generated job")
}

/// Stores `n` no-op jobs `{name}0`… firing on `cron`; the subscription to their results
/// (made before any can fire).
async fn noop_jobs_watched(
    client: &AxClient,
    name: &str,
    n: usize,
    cron: &str,
) -> Result<async_nats::Subscriber> {
    let specs: Vec<_> = (0..n)
        .map(|i| noop_job(&format!("{name}{i}"), cron))
        .collect();
    store_jobs(client, &specs).await?;
    Ok(client
        .nats
        .subscribe(client.subjects().result_all())
        .await?)
}

/// A no-op job named `name` firing on `cron`.
fn noop_job(name: &str, cron: &str) -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "name": name,
        "cron": cron,
        "exec": {"type": "noop"},
    }))
    .expect("a valid generated job")
}

/// The whole second `lead_secs` from now and the cron expression firing once then.
fn fire_soon(lead_secs: i64) -> Result<(chrono::DateTime<chrono::Utc>, String)> {
    let at = ax_bus::time::now() + chrono::Duration::seconds(lead_secs);
    let at = chrono::DurationRound::duration_trunc(at, chrono::Duration::seconds(1))?;
    Ok((at, cron_at(at)))
}

/// Waits on `results` for `n` successes within `within`; the instant of the last one.
async fn successes(
    section: &str,
    results: &mut async_nats::Subscriber,
    n: usize,
    within: Duration,
) -> Result<chrono::DateTime<chrono::Utc>> {
    use futures::StreamExt;
    let deadline = tokio::time::Instant::now() + within;
    let (mut done, mut last) = (0, ax_bus::time::now());
    while done < n {
        let Ok(Some(message)) = tokio::time::timeout_at(deadline, results.next()).await else {
            bail!("{section}: {done} of {n} results before the deadline");
        };
        let result: ax_bus::messages::ResultMessage = codec::decode(&message.payload)?;
        if result.state == ax_bus::State::Success {
            done += 1;
            last = ax_bus::time::now();
        }
    }
    Ok(last)
}

/// A 6-field cron expression firing once, at `at` (UTC, whole second): how the bench, and the
/// tests of fires due together, make many jobs due at one instant.
pub fn cron_at(at: chrono::DateTime<chrono::Utc>) -> String {
    use chrono::{Datelike, Timelike};
    format!(
        "{} {} {} {} {} *",
        at.second(),
        at.minute(),
        at.hour(),
        at.day(),
        at.month()
    )
}

/// p50, p99 and max of `values` (sorted here).
fn percentiles(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| {
        values
            .get(((values.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    (at(0.5), at(0.99), values.last().copied().unwrap_or(0.0))
}

fn machine() -> String {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown cpu".into());
    format!("{cores} cores ({cpu})")
}
