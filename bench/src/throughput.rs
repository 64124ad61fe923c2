//! Throughput: no-op instances end to end — fired by cron, routed, dispatched, run by the
//! in-process no-op executor, reported, final state recorded — in instances per second, with
//! the ratio to the raw JetStream limit and the messages ax sent and received per instance.
//!
//! N no-op jobs all fire at the same second; the clock runs from that second to the last
//! success result. One node runs every actor, on a connection of its own whose message counts
//! are read before and after. Beside the rate, the CPU per instance of this process (the node
//! runs in it) and of nats-server, from the jobs loaded to the last result, against one raw
//! publish's.

use std::time::Duration;

use ax_bus::AxClient;

use crate::cpu::Snapshot;
use crate::Result;

use crate::{
    client_for, fire_soon, messages_so_far, noop_jobs_watched, start_node, successes, Figure,
};

/// `server` is the nats-server's pid, `raw_cpu` the CPU of one raw publish (µs, client and
/// server) measured in the limit section.
pub(crate) async fn measure(
    url: &str,
    quick: bool,
    raw: f64,
    server: Option<u32>,
    raw_cpu: f64,
) -> Result<Vec<Figure>> {
    let n = if quick { 1_000 } else { 20_000 };
    let first = run(url, "tp", n, quick, server).await?;
    // What the metrics cost the hot path: the same run without recording them, then (in a
    // full run) both once more, alternating, so that neither side gets the warmer machine.
    let mut on = vec![first.rate];
    let mut off = Vec::new();
    let pairs = if quick { 1 } else { 2 };
    for pair in 0..pairs {
        ax_actors::metrics::set_recording(false);
        let without = run(url, &format!("tpoff{pair}"), n, quick, server).await;
        ax_actors::metrics::set_recording(true);
        off.push(without?.rate);
        if pair + 1 < pairs {
            on.push(
                run(url, &format!("tpon{pair}"), n, quick, server)
                    .await?
                    .rate,
            );
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (with, without) = (mean(&on), mean(&off));
    let Run {
        rate,
        seconds,
        sent,
        received,
        cpu: (ax, nats),
        ..
    } = first;
    Ok(vec![
        Figure {
            section: "throughput",
            name: "no-op instances end to end".into(),
            value: rate,
            unit: "inst/s",
            note: format!(
                "{n} fired at one second, all final in {seconds:.2} s; {:.1}% of the raw limit (target 8%)",
                100.0 * rate / raw
            ),
        },
        Figure {
            section: "throughput",
            name: "CPU per instance".into(),
            value: ax + nats,
            unit: "µs",
            note: format!(
                "ax {ax:.0} µs + nats-server {nats:.0} µs, from the fire to the last result; {:.0}× a raw publish ({raw_cpu:.1} µs)",
                (ax + nats) / raw_cpu.max(0.001)
            ),
        },
        Figure {
            section: "throughput",
            name: "cost of metrics".into(),
            // Negative when the runs with metrics happened to be faster (noise).
            value: 100.0 * (without - with) / without,
            unit: "%",
            note: format!(
                "{with:.0} inst/s recording them, {without:.0} without (means of {} and {} runs)",
                on.len(),
                off.len()
            ),
        },
        Figure {
            section: "throughput",
            name: "messages per instance".into(),
            value: (sent + received) as f64 / n as f64,
            unit: "msg",
            note: format!(
                "{:.1} sent + {:.1} received (publishes, KV operations, acks, events)",
                sent as f64 / n as f64,
                received as f64 / n as f64
            ),
        },
    ])
}

/// One run's figures.
pub(crate) struct Run {
    pub(crate) rate: f64,
    pub(crate) seconds: f64,
    sent: u64,
    received: u64,
    /// CPU per instance in µs: ax's (this process, the node in it) and the nats-servers'.
    pub(crate) cpu: (f64, f64),
    /// CPU per instance in µs of each nats-server.
    pub(crate) cpu_servers: Vec<f64>,
    /// What each of ax's streams stored meanwhile.
    pub(crate) writes: Vec<StreamWrites>,
}

/// The messages one stream stored during a run, and its leader after it.
pub(crate) struct StreamWrites {
    pub(crate) stream: String,
    pub(crate) writes: u64,
    /// The server leading it (a cluster's), by name.
    pub(crate) leader: Option<String>,
}

/// N no-op jobs under `prefix` fired at one second, run to their results; nats-server `server`
/// measured for CPU.
async fn run(url: &str, prefix: &str, n: usize, quick: bool, server: Option<u32>) -> Result<Run> {
    let client = client_for(url, prefix).await?;
    run_on(&client, n, quick, server.as_slice()).await
}

/// N no-op jobs fired at one second through `client`, run to their results; nats-servers
/// `servers` measured for CPU.
pub(crate) async fn run_on(
    client: &AxClient,
    n: usize,
    quick: bool,
    servers: &[u32],
) -> Result<Run> {
    let scratch = tempfile::tempdir()?;
    let (fire_at, cron) = fire_soon(if quick { 4 } else { 8 })?;
    let mut results = noop_jobs_watched(client, "tp", n, &cron).await?;
    let (sent_before, received_before) = messages_so_far(client);
    let node = start_node(client, "all", 512, scratch.path()).await?;
    // The jobs are loaded and due in a few seconds: from here on, the CPU is the fires'.
    let stored_before = stored(client).await?;
    let cpu_before = Snapshot::take(servers)?;
    let last = successes("throughput", &mut results, n, Duration::from_secs(300)).await?;
    let cpu_after = Snapshot::take(servers)?;
    let stored_after = stored(client).await?;
    let (sent, received) = messages_so_far(client);
    node.stop();
    let seconds = (last - fire_at).num_milliseconds().max(1) as f64 / 1000.0;
    let writes = stored_after
        .into_iter()
        .map(|(stream, (last, leader))| {
            let before = stored_before.get(&stream).map_or(0, |(b, _)| *b);
            StreamWrites {
                stream,
                writes: last.saturating_sub(before),
                leader,
            }
        })
        .collect();
    Ok(Run {
        rate: n as f64 / seconds,
        seconds,
        sent: sent - sent_before,
        received: received - received_before,
        cpu: cpu_after.per(&cpu_before, n),
        cpu_servers: cpu_after.per_server(&cpu_before, n),
        writes,
    })
}

/// Each of `client`'s streams: its last sequence (every message it stored so far) and leader.
async fn stored(
    client: &AxClient,
) -> Result<std::collections::BTreeMap<String, (u64, Option<String>)>> {
    let mut all = std::collections::BTreeMap::new();
    let buckets = client
        .layout
        .instance_bucket_streams(client.instances.count());
    for name in client.layout.stream_names().into_iter().chain(buckets) {
        let Ok(mut stream) = client.js.get_stream(&name).await else {
            continue;
        };
        let info = stream.info().await?;
        let leader = info.cluster.as_ref().and_then(|c| c.leader.clone());
        all.insert(name, (info.state.last_sequence, leader));
    }
    Ok(all)
}
