//! Fire lateness: from an instance's expected time to its hand-off published by the Scheduler
//! (the message the Router consumes), measured by a subscriber on the same machine. Four cases:
//! 10,000 and 100,000 jobs due at the same instant, a steady 1,000 fires per second at each
//! whole second, and 1,000 one-offs per second spread over the second (delayed triggers, each
//! due at its own millisecond). Only Schedulers run, so nothing else competes. A quick run
//! (the test suite's, a debug build on a busy machine) has 1,000 jobs due at one instant and
//! 200 firing every second, for 2 s.

use std::time::Duration;

use crate::{bail, Result};
use futures::StreamExt;

use ax_bus::codec;
use ax_bus::messages::WorkItem;

use crate::{
    client_for, commands_done, cron_at, keyed_trigger, manual_job, noop_job, percentiles,
    send_triggers, start_node, store_jobs, Figure,
};

/// Runs a Scheduler over `specs` and collects the lateness (ms) of `expected` hand-offs. With
/// `due`, the instant they are all due: the Scheduler must hold them a second before it (it
/// fires a job past its instant never), or the measure is refused at once.
async fn lateness(
    url: &str,
    prefix: &str,
    specs: Vec<ax_bus::JobSpec>,
    expected: usize,
    due: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<Vec<f64>> {
    let client = client_for(url, prefix).await?;
    store_jobs(&client, &specs).await?;
    let mut ready = client.nats.subscribe(client.subjects().ready_all()).await?;
    let scratch = tempfile::tempdir()?;
    let node = start_node(&client, "scheduler", 1, scratch.path()).await?;
    if let Some(due) = due {
        if ax_bus::time::now() + chrono::Duration::seconds(1) > due {
            node.stop();
            bail!(
                "lateness: the Scheduler held the {} jobs only after {due}, when they were due: \
                 a machine this busy needs a longer lead",
                specs.len()
            );
        }
    }
    let late = collect(&mut ready, expected).await;
    node.stop();
    late
}

/// The lateness (ms) of the next `expected` hand-offs on `ready`.
async fn collect(ready: &mut async_nats::Subscriber, expected: usize) -> Result<Vec<f64>> {
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
    Ok(late)
}

/// One-offs spread over `seconds` seconds, 1,000 a second, each due at its own millisecond:
/// sent as keyed delayed triggers on the control subject, all of them carried out before the
/// first is due `lead` seconds on (or the measure is refused), then their hand-offs timed.
async fn spread(url: &str, seconds: i64, lead: i64) -> Result<Vec<f64>> {
    let n = 1000 * seconds;
    let client = client_for(url, "lsp").await?;
    store_jobs(&client, &[manual_job("sp")]).await?;
    // A job nothing in the dependency graph concerns: its triggers go straight to the Router.
    let mut ready = client.nats.subscribe(client.subjects().ready_all()).await?;
    let scratch = tempfile::tempdir()?;
    let node = start_node(&client, "scheduler", 1, scratch.path()).await?;
    let first = ahead(lead + seconds)?;
    let triggers = (0..n)
        .map(|i| {
            keyed_trigger(
                "sp",
                &format!("s{i}"),
                Some(first + chrono::Duration::milliseconds(i)),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    send_triggers(&client, triggers.into_iter()).await?;
    // The schedules fire a second before their due time: every trigger must be in by then.
    let margin = first - ax_bus::time::now() - chrono::Duration::milliseconds(1500);
    let Ok(margin) = margin.to_std() else {
        bail!("lateness: sending {n} delayed triggers took past their due time");
    };
    commands_done(&client, margin).await?;
    let late = collect(&mut ready, n as usize).await;
    node.stop();
    late
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
    let bursts: &[usize] = if quick { &[1_000] } else { &[10_000, 100_000] };
    for (i, n) in bursts.iter().copied().enumerate() {
        // A quick run is a debug build on a busy machine: its jobs may take longer to load.
        let at = ahead(if n > 10_000 {
            20
        } else if quick {
            15
        } else {
            5
        })?;
        let cron = cron_at(at);
        let specs = (0..n).map(|j| noop_job(&format!("b{j}"), &cron)).collect();
        let late = lateness(url, &format!("lb{i}"), specs, n, Some(at)).await?;
        let what = if n == 10_000 {
            "the max is the time to publish them all (target 250 ms)"
        } else {
            "the max is the time to publish them all"
        };
        figures.push(figure(format!("{n} fires due at one instant"), late, what));
    }
    let (seconds, jobs) = if quick { (2, 200) } else { (10, 1_000) };
    let specs = (0..jobs)
        .map(|j| noop_job(&format!("s{j}"), "* * * * * *"))
        .collect();
    let late = lateness(url, "ls", specs, jobs * seconds, None).await?;
    figures.push(figure(
        format!("steady {jobs} fires per second"),
        late,
        &format!("{seconds} s of {jobs} jobs firing every second (target p99 20 ms at 1,000)"),
    ));
    // A quick run is a debug build's smoke test on a busy machine: more time to take them in.
    let lead = if quick { 15 } else { 4 };
    let late = spread(url, seconds as i64, lead).await?;
    figures.push(figure(
        "steady 1,000 one-offs per second, spread".into(),
        late,
        &format!("{seconds} s of delayed triggers, one due every millisecond"),
    ));
    Ok(figures)
}
