//! Cluster: what a three-server NATS cluster carries against one server, and which server
//! saturates first.
//!
//! The same throughput run (no-op cron jobs all due at one second, one node running every
//! actor) goes first through the bench's own nats-server, then through three nats-servers
//! clustered on loopback, ax's streams and buckets at 3 replicas. For each: instances per
//! second, CPU per instance of ax and of each server (`/proc`), and what each stream stored
//! meanwhile with the server leading it. A stream's writes all go through its leader, which
//! sends them on to the two other servers and answers once one of them has them; so the
//! server that leads the most written streams does the most work, and is the one that
//! saturates first. The section names it, with the share of a core it was busy and the streams
//! it led. Before each cluster run the leaders of ax's written streams are spread as evenly
//! as their writes allow (`ax leaders --spread`), so that the runs compare
//! layouts rather than where JetStream happened to place them. A third run on the same servers keeps the instance records in three buckets, one
//! per server (see `ax_bus::client::instance_buckets`): the writes of the records, three of an
//! instance's seven, are then led by whichever servers lead those buckets instead of one. On a
//! machine with fewer cores than the three servers and ax need, they share the
//! cores and the cluster carries less than one server: the figures then say where the work
//! goes, not what a cluster of separate machines would carry.

use std::path::Path;
use std::time::Duration;

use ax_bus::client::local_server::{
    find_binary, free_port, on_free_ports, LocalServer, LocalServerError, ServerOptions,
};
use ax_bus::client::{AxClient, ConnectConfig};

use crate::throughput::{self, Run, StreamWrites};
use crate::{Figure, Result};

/// The servers of the cluster.
const SERVERS: usize = 3;

/// One server (the bench's, `single` its pid, at `url`) against three, the same `n` instances
/// each.
pub(crate) async fn measure(url: &str, single: Option<u32>, quick: bool) -> Result<Vec<Figure>> {
    let n = if quick { 300 } else { 20_000 };
    let one = throughput::run_on(
        &crate::client_for(url, "clone").await?,
        n,
        quick,
        single.as_slice(),
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let servers = start_cluster(dir.path())?;
    let pids: Vec<u32> = servers.iter().filter_map(LocalServer::pid).collect();
    let client = cluster_client(&servers, "clthree", 1).await?;
    // Where JetStream placed the leaders is luck: the runs compare layouts, not luck.
    ax_bus::client::leaders::spread(&client, |_| {}).await?;
    let three = throughput::run_on(&client, n, quick, &pids).await?;
    drop(client);
    let client = cluster_client(&servers, "clspread", SERVERS as u16).await?;
    // Where JetStream placed the leaders is luck: the runs compare layouts, not luck.
    ax_bus::client::leaders::spread(&client, |_| {}).await?;
    let spread = throughput::run_on(&client, n, quick, &pids).await?;
    drop(client);
    drop(servers);
    let mut all = figures(n, &one, &three);
    all.extend(spread_figures(n, &three, &spread));
    Ok(all)
}

/// Three nats-servers `c0`… routed to each other on loopback, their stores under `dir`: on new
/// ports and in a new folder each time one of its ports was taken first ([`on_free_ports`]).
fn start_cluster(dir: &Path) -> Result<Vec<LocalServer>> {
    let mut tries = 0;
    Ok(on_free_ports(|| {
        tries += 1;
        start_cluster_in(&dir.join(format!("try{tries}")))
    })?)
}

fn start_cluster_in(dir: &Path) -> std::result::Result<Vec<LocalServer>, LocalServerError> {
    let binary = find_binary()?;
    let routes = (0..SERVERS)
        .map(|_| free_port())
        .collect::<std::io::Result<Vec<u16>>>()
        .map_err(|e| LocalServerError::Start(format!("no free port: {e}")))?;
    let all_routes = routes
        .iter()
        .map(|p| format!("nats://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut servers = Vec::with_capacity(SERVERS);
    for (i, route) in routes.iter().enumerate() {
        servers.push(LocalServer::start(ServerOptions {
            binary: binary.clone(),
            port: None,
            store_dir: dir.join(format!("c{i}")),
            log_file: None,
            extra_args: vec![
                "-n".into(),
                format!("c{i}"),
                "--cluster_name".into(),
                "ax-bench".into(),
                "--cluster".into(),
                format!("nats://127.0.0.1:{route}"),
                "--routes".into(),
                all_routes.clone(),
            ],
        })?);
    }
    Ok(servers)
}

/// A client of the cluster under `prefix`, its streams and buckets at 3 replicas, the
/// instance records in `buckets` buckets, once the cluster has elected its JetStream leader
/// (streams are refused until then).
async fn cluster_client(servers: &[LocalServer], prefix: &str, buckets: u16) -> Result<AxClient> {
    let urls = servers
        .iter()
        .map(|s| s.url.clone())
        .collect::<Vec<_>>()
        .join(",");
    let mut config = ConnectConfig::new(urls, format!("ax-bench-{prefix}"));
    config.prefix = prefix.to_string();
    config.replicas = Some(SERVERS);
    config.instance_buckets = Some(buckets);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match AxClient::connect_node(&config).await {
            Ok(client) => return Ok(client),
            Err(e) if tokio::time::Instant::now() > deadline => {
                return Err(format!("the cluster's JetStream was not ready in 60 s: {e}").into())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// The section's lines: both rates, the CPU, the busiest server and the most written streams.
fn figures(n: usize, one: &Run, three: &Run) -> Vec<Figure> {
    let (ax1, nats1) = one.cpu;
    let (ax3, nats3) = three.cpu;
    let per_server = three
        .cpu_servers
        .iter()
        .enumerate()
        .map(|(i, cpu)| format!("c{i} {cpu:.0}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut figures = vec![
        Figure {
            section: "cluster",
            name: "one server: no-op instances end to end".into(),
            value: one.rate,
            unit: "inst/s",
            note: format!(
                "{n} due at one second, all final in {:.2} s; CPU per instance ax {ax1:.0} + nats-server {nats1:.0} µs",
                one.seconds
            ),
        },
        Figure {
            section: "cluster",
            name: "three servers at replicas 3: no-op instances end to end".into(),
            value: three.rate,
            unit: "inst/s",
            note: format!(
                "{:.2}× one server's; all final in {:.2} s",
                three.rate / one.rate.max(f64::MIN_POSITIVE),
                three.seconds
            ),
        },
        Figure {
            section: "cluster",
            name: "three servers: CPU per instance".into(),
            value: ax3 + nats3,
            unit: "µs",
            note: format!(
                "ax {ax3:.0} + the servers {nats3:.0} µs ({per_server}); one server: {:.0} µs",
                ax1 + nats1
            ),
        },
    ];
    figures.extend(busiest(n, three, "three servers"));
    let mut streams: Vec<_> = three.writes.iter().filter(|w| w.writes > 0).collect();
    streams.sort_by_key(|w| std::cmp::Reverse(w.writes));
    for written in streams.iter().take(6) {
        figures.push(Figure {
            section: "cluster",
            name: format!("three servers: writes per instance to {}", written.stream),
            value: written.writes as f64 / n as f64,
            unit: "msg",
            note: format!(
                "{:.0} writes/s, led by {}",
                written.writes as f64 / three.seconds.max(0.001),
                written.leader.as_deref().unwrap_or("no leader")
            ),
        });
    }
    figures
}

/// The server that worked hardest in the cluster run, and the one leading the most writes
/// (the first to saturate is one of them: every server stores every write at 3 replicas, the
/// leader also orders them, answers them and sends them on).
fn busiest(n: usize, three: &Run, run: &str) -> Vec<Figure> {
    // Each server: its name, CPU per instance, writes per instance it led, those by stream.
    let servers: Vec<(String, f64, f64, String)> = three
        .cpu_servers
        .iter()
        .enumerate()
        .map(|(i, cpu)| {
            let name = format!("c{i}");
            let (writes, led) = leads(n, three, &name);
            (name, *cpu, writes, led)
        })
        .collect();
    let mut figures = Vec::new();
    if let Some((name, cpu, _, led)) = servers.iter().max_by(|a, b| a.1.total_cmp(&b.1)) {
        figures.push(Figure {
            section: "cluster",
            name: format!("{run}: the busiest, {name}"),
            value: cpu * n as f64 / 1e6 / three.seconds.max(0.001),
            unit: "cores",
            note: format!("{cpu:.0} µs per instance, from the fire to the last result; leads (writes per instance): {led}"),
        });
    }
    if let Some((name, _, writes, led)) = servers.iter().max_by(|a, b| a.2.total_cmp(&b.2)) {
        figures.push(Figure {
            section: "cluster",
            name: format!("{run}: the leader of the most writes, {name}"),
            value: *writes,
            unit: "msg",
            note: format!("writes per instance to the streams it leads: {led}"),
        });
    }
    figures
}

/// The same cluster with the instance records in three buckets (one per server), against
/// one bucket: the rate, and whether the most writes any leader orders went down.
fn spread_figures(n: usize, three: &Run, spread: &Run) -> Vec<Figure> {
    let (ax, nats) = spread.cpu;
    let run = "three servers, three instance buckets";
    let mut figures = vec![Figure {
        section: "cluster",
        name: format!("{run}: no-op instances end to end"),
        value: spread.rate,
        unit: "inst/s",
        note: format!(
            "{:.2}× the same servers with one bucket; all final in {:.2} s; CPU per instance ax {ax:.0} + the servers {nats:.0} µs",
            spread.rate / three.rate.max(f64::MIN_POSITIVE),
            spread.seconds
        ),
    }];
    figures.extend(busiest(n, spread, run));
    figures
}

/// The writes per instance to the streams server `name` led in `three`, and them by stream.
fn leads(n: usize, three: &Run, name: &str) -> (f64, String) {
    let mut led: Vec<_> = three
        .writes
        .iter()
        .filter(|w| w.writes > 0 && w.leader.as_deref() == Some(name))
        .collect();
    led.sort_by_key(|w| std::cmp::Reverse(w.writes));
    let per = |w: &StreamWrites| w.writes as f64 / n as f64;
    let total = led.iter().map(|w| per(w)).sum();
    let text = led
        .iter()
        .map(|w| format!("{} {:.1}", w.stream, per(w)))
        .collect::<Vec<_>>()
        .join(", ");
    (
        total,
        if text.is_empty() {
            "no written stream".into()
        } else {
            text
        },
    )
}
