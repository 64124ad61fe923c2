//! A long history stored: ten million finished instance records (a month of a deployment that
//! runs a third of a million instances a day), written in bulk, then what they cost — the
//! store per record, the console's start (its index loaded) and the memory it took, the first
//! pages after it, a Scheduler's ready time, one job's instance list (`ax instance list --job`).
//!
//! The records belong to 1,000 jobs and ended over the last 30 days (the default retention), so
//! the console's 7-day index window takes about a quarter of them, of which it holds the last
//! ended up to its count (`[console] index_rows`). The console runs in the
//! bench's own process: its memory is the growth of this process's resident set while the
//! index loads.

use std::time::{Duration, Instant};

use chrono::TimeDelta;

use ax_actors::jetstream::publish::AckWindow;
use ax_bus::client::deps::{encode_entry, entry_key};
use ax_bus::instance::Trigger;
use ax_bus::{AxClient, InstanceRecord, JobSpec, State, Tag};

use crate::memory::resident_bytes;
use crate::{bail, client_for, noop_job, put, start_node, store_jobs, Figure, Result};

/// Records stored (with `--quick`, a fiftieth).
const RECORDS: usize = 10_000_000;
/// Jobs they belong to.
const JOBS: usize = 1_000;
/// Upstreams of each downstream job ([`downstreams`]).
const UPSTREAMS: usize = 10;
/// Over how long they ended.
const SPREAD: TimeDelta = TimeDelta::days(30);

/// The `i`-th record: job `i % JOBS`, ended a little earlier the larger `i` is.
fn record(
    template: &InstanceRecord,
    i: usize,
    of: usize,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<InstanceRecord> {
    let mut record = template.clone();
    let job = format!("st{:04}", i % JOBS);
    record.instance_id = format!("{job}.{i:020}").parse()?;
    record.job = job.parse()?;
    let ago = SPREAD.num_seconds() * i as i64 / of as i64;
    let finished = now - TimeDelta::seconds(ago);
    record.expected_time = finished - TimeDelta::seconds(1);
    record.started_at = Some(finished - TimeDelta::milliseconds(500));
    record.finished_at = Some(finished);
    record.state = State::Success;
    record.tag = Tag::Completed;
    record.message = "completed".into();
    Ok(record)
}

/// Jobs with no instance of their own that depend on a tenth of the others (each on
/// [`UPSTREAMS`] of them): the DagCoordinator follows those upstreams' days.
fn downstreams() -> Result<Vec<ax_bus::spec::JobSpec>> {
    (0..JOBS / 10 / UPSTREAMS)
        .map(|k| {
            let deps: Vec<serde_json::Value> = (0..UPSTREAMS)
                .map(|u| serde_json::json!({"name": format!("st{:04}", k * UPSTREAMS + u)}))
                .collect();
            Ok(serde_json::from_value(serde_json::json!({
                "name": format!("sd{k:02}"),
                "deps": deps,
                "exec": {"type": "noop"},
            }))?)
        })
        .collect()
}

/// The deps bucket's entries of the records, as the DagCoordinator writes them for each
/// instance that ends (its job's business date being the day it ended).
struct Deps {
    bucket: String,
    acks: AckWindow,
}

impl Deps {
    async fn push(&mut self, client: &ax_bus::AxClient, record: &InstanceRecord) -> Result<()> {
        let date = record
            .finished_at
            .unwrap_or(record.expected_time)
            .date_naive();
        let key = entry_key(&record.job, date, &record.instance_id);
        let value = encode_entry(record.attempt, record.state)?;
        self.acks
            .push(client.kv_put_pipelined(&self.bucket, &key, value).await?)
            .await?;
        Ok(())
    }
}

pub(crate) async fn measure(url: &str, quick: bool) -> Result<Vec<Figure>> {
    let records = if quick { RECORDS / 50 } else { RECORDS };
    let client = client_for(url, "st").await?;
    let specs: Vec<_> = (0..JOBS)
        .map(|i| noop_job(&format!("st{i:04}"), "0 0 3 1 1 *"))
        .collect();
    store_jobs(&client, &specs).await?;
    store_jobs(&client, &downstreams()?).await?;
    let mut figures = vec![store_records(&client, &specs, records).await?];
    figures.extend(console_figures(&client, records).await?);

    // A Scheduler started with them stored, a DagCoordinator, then one job's list.
    let scratch = tempfile::tempdir()?;
    let started = Instant::now();
    let node = start_node(&client, "scheduler", 1, scratch.path()).await?;
    let ready = started.elapsed();
    node.stop();
    figures.push(Figure {
        section: "stored",
        name: format!("Scheduler ready, {records} stored"),
        value: ready.as_secs_f64() * 1000.0,
        unit: "ms",
        note: format!("{JOBS} jobs registered (target ≤ 5 s)"),
    });
    let before = resident_bytes();
    let started = Instant::now();
    let (node, days) = crate::start_dag(&client, scratch.path()).await?;
    let ready = started.elapsed();
    let grown = resident_bytes().saturating_sub(before);
    node.stop();
    figures.push(Figure {
        section: "stored",
        name: format!("DagCoordinator leading, {records} stored"),
        value: ready.as_secs_f64() * 1000.0,
        unit: "ms",
        note: format!(
            "its view rebuilt from the deps bucket ({records} entries, one per record): the days \
             of the {} jobs in a DAG (a tenth of the work, read by their subjects), {days} \
             (job, date) days held, {:.0} MB grown (target ≤ 5 s)",
            JOBS / 10 + JOBS / 10 / UPSTREAMS,
            grown as f64 / 1e6
        ),
    });
    let job = "st0500".parse()?;
    let started = Instant::now();
    let listed = client.instances(Some(&job)).await?.len();
    figures.push(Figure {
        section: "stored",
        name: format!("one job's instances listed, {records} stored"),
        value: started.elapsed().as_secs_f64() * 1000.0,
        unit: "ms",
        note: format!(
            "{listed} records of st0500, read by their subjects (`ax instance list --job`)"
        ),
    });
    Ok(figures)
}

/// `records` finished records of `specs`' jobs written in bulk, with their deps entries: what
/// each costs the store.
async fn store_records(client: &AxClient, specs: &[JobSpec], records: usize) -> Result<Figure> {
    let now = ax_bus::time::now();
    let template = InstanceRecord::first(
        &specs[0],
        now,
        "2026-01-01".into(),
        Default::default(),
        Trigger::Cron,
        now,
    );
    let bucket = client.layout.instances_bucket();
    let started = Instant::now();
    let mut acks = AckWindow::new(1024);
    let mut deps = Deps {
        bucket: client.layout.deps_bucket(),
        acks: AckWindow::new(1024),
    };
    for i in 0..records {
        let record = record(&template, i, records, now)?;
        put(&mut acks, client, &bucket, &record.instance_id, &record).await?;
        deps.push(client, &record).await?;
        if (i + 1) % 1_000_000 == 0 {
            eprintln!(
                "  stored: {} records, {:.0} s",
                i + 1,
                started.elapsed().as_secs_f64()
            );
        }
    }
    acks.flush().await?;
    deps.acks.flush().await?;
    let wrote = started.elapsed();
    let mut stream = client.js.get_stream(format!("KV_{bucket}")).await?;
    let bytes = stream.info().await?.state.bytes;
    Ok(Figure {
        section: "stored",
        name: format!("store per record, {records} stored"),
        value: bytes as f64 / records as f64,
        unit: "B",
        note: format!(
            "one revision each (written in bulk: {:.0} records/s); {:.1} GB in all",
            records as f64 / wrote.as_secs_f64(),
            bytes as f64 / 1e9
        ),
    })
}

/// The console over them: its index loaded, the memory it took, its first pages.
async fn console_figures(client: &AxClient, records: usize) -> Result<Vec<Figure>> {
    let before = resident_bytes();
    let started = Instant::now();
    let (server, base, first) = crate::console::serving(client, Duration::from_secs(1800)).await?;
    let http = reqwest::Client::new();
    let loaded = started.elapsed();
    let grown = resident_bytes().saturating_sub(before);
    let mut first_pages = Vec::new();
    for path in ["/instances", "/", "/instances?job=st0500"] {
        let started = Instant::now();
        let response = http.get(format!("{base}{path}")).send().await?;
        if !response.status().is_success() {
            bail!("stored: {path} answered {}", response.status());
        }
        response.bytes().await?;
        first_pages.push(format!(
            "{path} {:.0} ms",
            started.elapsed().as_secs_f64() * 1000.0
        ));
    }
    server.stop().await;
    let mut figures = vec![Figure {
        section: "stored",
        name: format!("console ready, {records} stored"),
        value: loaded.as_secs_f64(),
        unit: "s",
        note: format!(
            "its index loaded (of the records that ended in the last 7 days, the last {} \
             ended); a first list page {:.0} ms after its start, while it loaded; once loaded {} \
             (target: first page ≤ 100 ms)",
            ax_console::index::DEFAULT_ROWS,
            first.as_secs_f64() * 1000.0,
            first_pages.join(", ")
        ),
    }];
    figures.push(Figure {
        section: "stored",
        name: format!("console memory, {records} stored"),
        value: grown as f64 / 1e6,
        unit: "MB",
        note: "this process's resident set grown while the index loaded (target ≤ 300 MB)".into(),
    });
    Ok(figures)
}
