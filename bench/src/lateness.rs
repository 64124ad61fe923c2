//! Fire lateness: from an instance's expected time to its hand-off published by the Scheduler
//! (the message the Router consumes), measured by a subscriber on the same machine. Three cases:
//! 10,000 (and, in a full run, 100,000) jobs due at the same instant, and a steady 1,000 fires
//! per second. Only Schedulers run, so nothing else competes.

use std::sync::Arc;
use std::time::Duration;

use crate::{bail, Result};
use futures::StreamExt;

use ax_actors::SystemClock;
use ax_actors::WorkerConfig;
use ax_actors::{parse_roles, Node, NodeConfig};
use ax_bus::codec;
use ax_bus::messages::WorkItem;

use crate::{client_for, cron_at, noop_job, percentiles, store_jobs, Figure};

/// Runs a Scheduler over `specs` and collects the lateness (ms) of `expected` hand-offs.
async fn lateness(
    url: &str,
    prefix: &str,
    specs: Vec<ax_bus::JobSpec>,
    expected: usize,
) -> Result<Vec<f64>> {
    let client = client_for(url, prefix).await?;
    store_jobs(&client, &specs).await?;
    let mut ready = client.nats.subscribe(client.subjects().ready_all()).await?;
    let scratch = tempfile::tempdir()?;
    let node = Node::start(
        client.clone(),
        NodeConfig {
            worker: WorkerConfig {
                slots: 1,
                ..WorkerConfig::new("bench".parse()?, scratch.path().to_path_buf())
            },
            ..NodeConfig::new(
                "bench".parse()?,
                parse_roles("scheduler")?,
                scratch.path().to_path_buf(),
            )
        },
        Arc::new(SystemClock),
    )?;
    let mut late = Vec::with_capacity(expected);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    while late.len() < expected {
        let Ok(Some(message)) = tokio::time::timeout_at(deadline, ready.next()).await else {
            bail!(
                "lateness: {} of {expected} hand-offs before the deadline",
                late.len()
            );
        };
        let received = ax_bus::time::now();
        let work: WorkItem = codec::decode(&message.payload)?;
        late.push(
            (received - work.expected_time)
                .num_microseconds()
                .unwrap_or(0) as f64
                / 1000.0,
        );
    }
    node.stop();
    Ok(late)
}

fn figure(name: String, mut late: Vec<f64>, what: &str) -> Figure {
    let (p50, p99, max) = percentiles(&mut late);
    Figure {
        section: "lateness",
        name,
        value: p99,
        unit: "ms p99",
        note: format!("p50 {p50:.1} ms, max {max:.1} ms; {what}"),
    }
}

/// A whole second at least `lead` seconds ahead.
fn ahead(lead: i64) -> Result<chrono::DateTime<chrono::Utc>> {
    let at = ax_bus::time::now() + chrono::Duration::seconds(lead);
    Ok(chrono::DurationRound::duration_trunc(
        at,
        chrono::Duration::seconds(1),
    )?)
}

pub(crate) async fn measure(url: &str, quick: bool) -> Result<Vec<Figure>> {
    let mut figures = Vec::new();
    let bursts: &[usize] = if quick { &[10_000] } else { &[10_000, 100_000] };
    for (i, n) in bursts.iter().copied().enumerate() {
        let at = ahead(if n > 10_000 { 20 } else { 5 })?;
        let cron = cron_at(at);
        let specs = (0..n).map(|j| noop_job(&format!("b{j}"), &cron)).collect();
        let late = lateness(url, &format!("lb{i}"), specs, n).await?;
        figures.push(figure(
            format!("{n} fires due at one instant"),
            late,
            "the max is the time to publish them all",
        ));
    }
    let seconds = if quick { 5 } else { 10 };
    let specs = (0..1000)
        .map(|j| noop_job(&format!("s{j}"), "* * * * * *"))
        .collect();
    let late = lateness(url, "ls", specs, 1000 * seconds).await?;
    figures.push(figure(
        "steady 1,000 fires per second".into(),
        late,
        &format!("{seconds} s of 1,000 jobs firing every second"),
    ));
    Ok(figures)
}
