//! Console: how fast the pages an operator opens most render with a large history — 1,000
//! jobs and 100,000 instances stored (10,000 with `--quick`) — served by the real console on
//! the real bus, read over HTTP one request at a time: the dashboard, the instance list
//! unfiltered and filtered (first and tenth page), and an instance's page. The figure is the
//! p99 of each, against the console issue's target of 100 ms.

use std::time::{Duration, Instant};

use chrono::TimeDelta;

use ax_actors::jetstream::publish::AckWindow;
use ax_bus::instance::Trigger;
use ax_bus::spec::JobSpec;
use ax_bus::{InstanceRecord, State, Tag};

use crate::{bail, put, Figure, Result};

/// Jobs stored.
const JOBS: usize = 1_000;
/// The page-render target of the console issue.
const TARGET_MS: f64 = 100.0;

fn job(i: usize) -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "name": format!("job{i:04}"),
        "cron": "0 2 * * *",
        "exec": {"type": "noop"},
        "tags": [if i.is_multiple_of(2) { "even" } else { "odd" }],
    }))
    .expect("a valid generated job")
}

/// The `n`-th instance: jobs in turn, ten business dates, about one in ten failed and one in
/// twenty still running.
fn instance(specs: &[JobSpec], n: usize) -> InstanceRecord {
    let spec = &specs[n % specs.len()];
    let day = (n / specs.len()) % 10;
    let expected = chrono::DateTime::parse_from_rfc3339("2026-11-01T02:00:00Z")
        .expect("a valid instant")
        .with_timezone(&chrono::Utc)
        + TimeDelta::days(day as i64)
        + TimeDelta::milliseconds((n / (specs.len() * 10)) as i64);
    let mut record = InstanceRecord::first(
        spec,
        expected,
        expected.date_naive().to_string(),
        Default::default(),
        Trigger::Cron,
        expected,
    );
    let (state, tag) = match n % 20 {
        0 => (State::Running, Tag::Executing),
        1 | 2 => (State::Failed, Tag::ExitCode),
        _ => (State::Success, Tag::Completed),
    };
    record.state = state;
    record.tag = tag;
    record.started_at = Some(expected + TimeDelta::milliseconds(5));
    if state != State::Running {
        record.finished_at = Some(expected + TimeDelta::milliseconds(900));
    }
    record.message = format!("{state} after a while");
    record.stdout_tail = "line of output\n".repeat(40);
    record
}

/// p50 and p99 of `samples`, in ms.
fn percentiles(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.99))
}

/// The real console (no auth) on `client`, on a free port, once its index holds every stored
/// record (within `within`); its base URL, and how long after its start a first list page
/// came back (from what the index held by then: lists answer while it loads).
pub(crate) async fn serving(
    client: &ax_bus::AxClient,
    within: Duration,
) -> Result<(ax_console::server::Running, String, Duration)> {
    let started = Instant::now();
    let server = ax_console::server::start(
        "127.0.0.1:0",
        ax_console::server::Options {
            client: Some(client.clone()),
            data_dir: None,
            console: true,
            auth: false,
            node: None,
            hosts: Vec::new(),
            index_window: None,
            index_rows: None,
        },
    )?;
    let base = format!("http://{}", server.addr);
    let http = reqwest::Client::new();
    let deadline = Instant::now() + within;
    let mut first = None;
    loop {
        let page: serde_json::Value = http
            .get(format!("{base}/api/v1/instances?per_page=1"))
            .send()
            .await?
            .json()
            .await?;
        let first = *first.get_or_insert_with(|| started.elapsed());
        if page["complete"] == true {
            return Ok((server, base, first));
        }
        if Instant::now() > deadline {
            bail!("the console's index did not load in {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn measure(url: &str, quick: bool) -> Result<Vec<Figure>> {
    let instances = if quick { 5_000 } else { 100_000 };
    let requests = if quick { 20 } else { 200 };
    let client = crate::client_for(url, "console").await?;
    let specs: Vec<JobSpec> = (0..JOBS).map(job).collect();
    crate::store_jobs(&client, &specs).await?;
    let bucket = client.layout.instances_bucket();
    let mut acks = AckWindow::new(1024);
    let mut sample_id = None;
    for n in 0..instances {
        let record = instance(&specs, n);
        if n == instances / 2 {
            sample_id = Some(record.instance_id.clone());
        }
        put(&mut acks, &client, &bucket, &record.instance_id, &record).await?;
    }
    acks.flush().await?;
    let Some(sample_id) = sample_id else {
        bail!("no instance stored");
    };
    let (server, base, _) = serving(&client, Duration::from_secs(300)).await?;
    let http = reqwest::Client::new();
    let pages = [
        ("dashboard", "/".to_string()),
        ("instances, first page", "/instances".to_string()),
        ("instances, tenth page", "/instances?page=9".to_string()),
        (
            "instances by job, first page",
            "/instances?job=job0500".to_string(),
        ),
        (
            "instances failed on a date, tenth page",
            "/instances?state=failed&biz_date=2026-11-05&page=9".to_string(),
        ),
        (
            "instances due in a window, tenth page",
            "/instances?from=2026-11-03T00:00:00Z&to=2026-11-04T00:00:00Z&tag=completed&page=9"
                .to_string(),
        ),
        ("instance page", format!("/instances/{sample_id}")),
    ];
    let mut figures = Vec::new();
    for (name, path) in pages {
        let mut samples = Vec::with_capacity(requests);
        for _ in 0..requests {
            let started = Instant::now();
            let response = http.get(format!("{base}{path}")).send().await?;
            let status = response.status();
            let body = response.bytes().await?;
            samples.push(started.elapsed().as_secs_f64() * 1000.0);
            if !status.is_success() || body.is_empty() {
                bail!("{path}: {status}");
            }
        }
        let (p50, p99) = percentiles(samples);
        figures.push(Figure {
            section: "console",
            name: format!("{name}: p99 render"),
            value: p99,
            unit: "ms",
            note: format!(
                "p50 {p50:.1} ms over {requests} requests; {JOBS} jobs, {instances} instances \
                 stored; target ≤ {TARGET_MS:.0} ms{}",
                if p99 <= TARGET_MS { "" } else { " — MISSED" }
            ),
        });
    }
    server.stop().await;
    Ok(figures)
}
