//! Concurrency: a CPU-bound low-priority flood with a high-priority trickle, on one worker with
//! today's fixed slots (twice the cores, one kept for high work), then with the adaptive
//! budget (`[worker.adaptive]` with its default thresholds, up to twice the cores, starting
//! there): from 2 with one slot kept for high work, and from 1 with none kept.
//!
//! Every attempt is the same CPU-bound shell loop (about 0.8 s of one core when alone; a fifth
//! of that with `--quick`). The low flood is triggered at once; a high job every 1.5 s (0.3 s)
//! from then on.
//! For each setting: the high jobs' start delay (from the trigger to the start) and run time,
//! the low flood's makespan and the budget the worker's heartbeats showed. A fixed count above
//! the cores makes every attempt, the high ones among them, share the cores; the adaptive
//! budget brings the attempts down to about one per core.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

use ax_actors::{Adaptive, WorkerConfig};
use ax_bus::messages::{Reserved, ResultMessage, TriggerRequest};
use ax_bus::spec::JobSpec;
use ax_bus::{codec, AxClient, State};

use crate::{bail, client_for, percentiles, send_triggers, start_node_with, store_jobs};
use crate::{Figure, Result};

/// The size of a run.
#[derive(Clone, Copy)]
struct Shape {
    lows: usize,
    highs: usize,
    /// Rounds of the shell loop each attempt runs (300,000: about 0.8 s of one 2026 server
    /// core; measured alone in each run).
    rounds: u32,
    /// Time between two high triggers.
    every: Duration,
}

impl Shape {
    /// The CPU-bound attempt.
    fn command(&self) -> String {
        format!("i=0; while [ $i -lt {} ]; do i=$((i+1)); done", self.rounds)
    }
}

/// One setting's outcome.
struct Run {
    high_delay_ms: Vec<f64>,
    high_run_ms: Vec<f64>,
    low_makespan_s: f64,
    mean_budget: f64,
}

pub(crate) async fn measure(url: &str, quick: bool) -> Result<Vec<Figure>> {
    let cores = u32::try_from(
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
    )?;
    // Quick: a fifth of the work, for the smoke test, not for figures.
    let shape = if quick {
        Shape {
            lows: 4 * cores as usize,
            highs: 3,
            rounds: 60_000,
            every: Duration::from_millis(300),
        }
    } else {
        Shape {
            lows: 16 * cores as usize,
            highs: 10,
            rounds: 300_000,
            every: Duration::from_millis(1500),
        }
    };
    let Shape { lows, highs, .. } = shape;
    let slots = 2 * cores;
    let reserved = Reserved { high: 1, normal: 0 };
    let alone_ms = alone_ms(&shape)?;
    // A budget's minimum must leave low work a slot beside the one kept for high work.
    let (kept, none_kept) = (Adaptive::new(2, slots), Adaptive::new(1, slots));
    let settings = [
        (format!("fixed {slots}, 1 for high"), None, reserved),
        (
            format!("adaptive 2..{slots}, 1 for high"),
            Some(kept),
            reserved,
        ),
        (
            format!("adaptive 1..{slots}, none kept"),
            Some(none_kept),
            Reserved::default(),
        ),
    ];
    let mut figures = Vec::new();
    for (i, (name, adaptive, reserved)) in settings.into_iter().enumerate() {
        let prefix = format!("cc{i}");
        let mut run = run(url, &prefix, shape, slots, adaptive, reserved).await?;
        let (delay_p50, _, delay_max) = percentiles(&mut run.high_delay_ms);
        let (run_p50, _, run_max) = percentiles(&mut run.high_run_ms);
        let figure = |what: &str, value, unit, note| Figure {
            section: "concurrency",
            name: format!("{what}, {name}"),
            value,
            unit,
            note,
        };
        let every = shape.every.as_secs_f64();
        figures.extend([
            figure(
                "high start delay",
                delay_p50,
                "ms",
                format!(
                    "p50; max {delay_max:.0} ms; {highs} high jobs every {every:.1} s beside \
                     {lows} low ones, all CPU-bound, {cores} cores"
                ),
            ),
            figure(
                "high run time",
                run_p50,
                "ms",
                format!("p50; max {run_max:.0} ms; the same loop alone: {alone_ms:.0} ms"),
            ),
            figure(
                "low flood makespan",
                run.low_makespan_s,
                "s",
                format!(
                    "{lows} low jobs, from their trigger to the last end ({:.1} s if every core \
                     ran them and the high ones without a pause); the budget averaged {:.1} \
                     slots",
                    (lows + highs) as f64 * alone_ms / 1000.0 / f64::from(cores),
                    run.mean_budget
                ),
            ),
        ]);
    }
    Ok(figures)
}

/// How long the loop takes alone (before any node runs).
fn alone_ms(shape: &Shape) -> Result<f64> {
    let started = Instant::now();
    let status = std::process::Command::new("sh")
        .args(["-c", &shape.command()])
        .status()?;
    if !status.success() {
        bail!("concurrency: the loop alone failed: {status}");
    }
    Ok(started.elapsed().as_secs_f64() * 1000.0)
}

fn job(name: &str, priority: &str, shape: &Shape) -> Result<JobSpec> {
    Ok(serde_json::from_value(serde_json::json!({
        "name": name,
        "priority": priority,
        "exec": {"type": "shell", "command": shape.command()},
    }))?)
}

fn trigger(job: &str) -> Result<TriggerRequest> {
    Ok(TriggerRequest {
        name: job.parse()?,
        biz_date: None,
        params: Default::default(),
        key: None,
        at: None,
        delay: None,
    })
}

async fn run(
    url: &str,
    prefix: &str,
    shape: Shape,
    slots: u32,
    adaptive: Option<Adaptive>,
    reserved: Reserved,
) -> Result<Run> {
    let client = client_for(url, prefix).await?;
    let Shape { lows, highs, .. } = shape;
    store_jobs(
        &client,
        &[job("flood", "low", &shape)?, job("urgent", "high", &shape)?],
    )
    .await?;
    let scratch = tempfile::tempdir()?;
    let worker = WorkerConfig {
        slots,
        adaptive,
        reserved,
        ..WorkerConfig::new("bench".parse()?, scratch.path().to_path_buf())
    };
    let node = start_node_with(&client, "all", worker, scratch.path()).await?;
    let mut results = client
        .nats
        .subscribe(client.subjects().result_all())
        .await?;
    let budgets = Arc::new(std::sync::Mutex::new(Vec::new()));
    let watch = tokio::spawn(watch_budget(client.clone(), budgets.clone()));
    let started = Instant::now();
    send_triggers(
        &client,
        (0..lows)
            .map(|_| trigger("flood"))
            .collect::<Result<Vec<_>>>()?
            .into_iter(),
    )
    .await?;
    let trickle = {
        let client = client.clone();
        tokio::spawn(async move {
            for _ in 0..highs {
                tokio::time::sleep(shape.every).await;
                let request = trigger("urgent")?;
                send_triggers(&client, std::iter::once(request)).await?;
            }
            Ok::<(), crate::BenchError>(())
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    let (mut high, mut low_done, mut low_last) = (Vec::new(), 0, started);
    while high.len() < highs || low_done < lows {
        let Ok(Some(message)) = tokio::time::timeout_at(deadline, results.next()).await else {
            bail!(
                "concurrency: {} of {highs} high and {low_done} of {lows} low results before the deadline",
                high.len()
            );
        };
        let result: ResultMessage = codec::decode(&message.payload)?;
        if result.state != State::Success {
            bail!(
                "concurrency: {} ended {:?}: {}",
                result.job,
                result.state,
                result.message
            );
        }
        if result.job.as_str() == "urgent" {
            high.push(result);
        } else {
            low_done += 1;
            low_last = Instant::now();
        }
    }
    trickle.await??;
    watch.abort();
    node.stop();
    let ms = |d: chrono::Duration| d.num_microseconds().unwrap_or(0) as f64 / 1000.0;
    let budgets = budgets.lock().map(|b| b.clone()).unwrap_or_default();
    Ok(Run {
        high_delay_ms: high
            .iter()
            .filter_map(|r| r.started_at.map(|s| ms(s - r.expected_time)))
            .collect(),
        high_run_ms: high
            .iter()
            .filter_map(|r| r.started_at.map(|s| ms(r.finished_at - s)))
            .collect(),
        low_makespan_s: (low_last - started).as_secs_f64(),
        mean_budget: if budgets.is_empty() {
            0.0
        } else {
            budgets.iter().sum::<f64>() / budgets.len() as f64
        },
    })
}

/// Samples the worker's slots from its heartbeats.
async fn watch_budget(client: AxClient, budgets: Arc<std::sync::Mutex<Vec<f64>>>) {
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Ok(workers) = client.workers().await {
            if let Some((info, _)) = workers.first() {
                if let Ok(mut budgets) = budgets.lock() {
                    budgets.push(f64::from(info.slots));
                }
            }
        }
    }
}
