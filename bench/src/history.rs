//! History: what a finished instance costs the store, and that under a retention the store
//! stops growing while work goes on (seconds standing for days).
//!
//! - Per instance: no-op cron jobs fire at one second on a node of the bench's own; once every
//!   result is in and the instances bucket has stopped changing, the bytes of the instances
//!   bucket (every revision of each record: its history), of the expiry index and of the
//!   results and ticks, each divided by the number of instances.
//! - Under a retention: a node whose records are kept 3 s runs no-op jobs firing every second;
//!   the instances bucket's bytes are read every 10 s from 15 s on, once the first removal
//!   markers have expired (they live as long as the records, at least 10 s). Flat means the growth between
//!   the first and the last reading is a small part of one reading.

use std::time::Duration;

use ax_bus::client::ConnectConfig;
use ax_bus::AxClient;

use crate::{
    client_for, fire_soon, noop_job, noop_jobs_watched, start_node, store_jobs, successes, Figure,
    Result,
};

/// Bytes and messages of stream `name`.
async fn stream_size(client: &AxClient, name: &str) -> Result<(u64, u64)> {
    let mut stream = client.js.get_stream(name).await?;
    let state = stream.info().await?.state.clone();
    Ok((state.bytes, state.messages))
}

/// With `--quick`, the store per instance only: the run under a retention needs half a minute
/// for its markers to come and go.
pub(crate) async fn measure(url: &str, quick: bool) -> Result<Vec<Figure>> {
    let mut figures = per_instance(url, quick).await?;
    if !quick {
        figures.extend(under_retention(url).await?);
    }
    Ok(figures)
}

async fn per_instance(url: &str, quick: bool) -> Result<Vec<Figure>> {
    let n = if quick { 200 } else { 5_000 };
    let client = client_for(url, "hs").await?;
    let scratch = tempfile::tempdir()?;
    let (_, cron) = fire_soon(if quick { 4 } else { 6 })?;
    let mut results = noop_jobs_watched(&client, "hs", n, &cron).await?;
    let node = start_node(&client, "all", 512, scratch.path()).await?;
    successes("history", &mut results, n, Duration::from_secs(300)).await?;
    let records = format!("KV_{}", client.layout.instances_bucket());
    // The last write of a record (reported) may follow its result: wait until none comes.
    let mut last = stream_size(&client, &records).await?;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = stream_size(&client, &records).await?;
        if now == last {
            break;
        }
        last = now;
    }
    node.stop();
    let (record_bytes, revisions) = last;
    let per = |bytes: u64| bytes as f64 / n as f64;
    let (expiry, _) = stream_size(&client, &client.layout.expiry_stream()).await?;
    let (results_bytes, _) = stream_size(&client, &client.layout.results_stream()).await?;
    let (ticks, _) = stream_size(&client, &client.layout.ticks_stream()).await?;
    let total = record_bytes + expiry + results_bytes + ticks;
    let figure = |name: &str, value: f64, note: String| Figure {
        section: "history",
        name: name.to_string(),
        value,
        unit: "B",
        note,
    };
    Ok(vec![
        figure(
            "store per finished no-op instance: record and history",
            per(record_bytes),
            format!(
                "{n} instances, {:.1} revisions each; target ≤ 1,000 B",
                revisions as f64 / n as f64
            ),
        ),
        figure(
            "store per finished no-op instance: expiry note",
            per(expiry),
            "AX_EXPIRY, until the record is removed".into(),
        ),
        figure(
            "store per finished no-op instance: result and tick",
            per(results_bytes + ticks),
            "AX_RESULTS (kept 7 days) and AX_TICKS (the last 1,000 per job)".into(),
        ),
        figure(
            "store per finished no-op instance: all",
            per(total),
            "what a day of N instances costs the store, per instance kept".into(),
        ),
    ])
}

async fn under_retention(url: &str) -> Result<Vec<Figure>> {
    let (jobs, readings) = (50, 4);
    let mut config = ConnectConfig::new(url, "ax-bench-hr");
    config.prefix = "hr".into();
    config.retention.instances = Some(Duration::from_secs(3));
    let client = AxClient::connect_node(&config).await?;
    let scratch = tempfile::tempdir()?;
    let specs: Vec<_> = (0..jobs)
        .map(|i| noop_job(&format!("hr{i}"), "* * * * * *"))
        .collect();
    store_jobs(&client, &specs).await?;
    let node = start_node(&client, "all", 512, scratch.path()).await?;
    let records = format!("KV_{}", client.layout.instances_bucket());
    // The first records go after 3 s, their markers 10 s later: the size settles then.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let mut sizes = Vec::new();
    for reading in 0..readings {
        if reading > 0 {
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        sizes.push(stream_size(&client, &records).await?);
    }
    let instances = client.instances(None).await?.len();
    node.stop();
    let (first, last) = (sizes[0], sizes[sizes.len() - 1]);
    let seconds = 10 * (readings - 1);
    let growth = last.0 as f64 - first.0 as f64;
    Ok(vec![
        Figure {
            section: "history",
            name: "instances bucket under a 3 s retention".into(),
            value: last.0 as f64,
            unit: "B",
            note: format!(
                "{jobs} instances/s; {} messages, {instances} records at the end",
                last.1
            ),
        },
        Figure {
            section: "history",
            name: format!("its growth over {seconds} s more of work"),
            value: growth,
            unit: "B",
            note: format!(
                "{:+.1}% of the first reading ({} B); without a retention every one of the {} \
                 instances of those seconds would stay",
                100.0 * growth / first.0.max(1) as f64,
                first.0,
                jobs * seconds
            ),
        },
    ])
}
