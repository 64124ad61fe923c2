//! Scale: Schedulers that share the cron jobs. With 1, 2 and 4 Scheduler processes on one NATS
//! (in turn, on one registry, each set stopped gracefully before the next starts):
//!
//! - JetStream messages per fire in steady state (every message the server routes, seen by a
//!   monitor subscribed to `>`, over the fires made meanwhile): it must not grow with the number
//!   of Schedulers, since each fire is made by its partition's owner alone;
//! - fires per second at saturation: a burst of jobs all due at one second, from the first of
//!   their records written to the last (a cron fire's record is written up to 250 ms before its
//!   instant, so the instant itself is no start);
//! - the resident memory of each Scheduler process with many idle jobs registered besides (a
//!   million in the full run): with four, each holds about a quarter;
//! - with four running, the time from a SIGKILL of the owner of a job firing every second to
//!   that job firing again (the member key's expiry, a round, loading the partitions' jobs).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;

use ax_bus::messages::{TickOutcome, TickRecord};
use ax_bus::partition;
use ax_bus::InstanceRecord;
use ax_bus::{codec, AxClient};

use crate::process::NodeProcess;
use crate::{bail, client_for, fire_soon, noop_job, store_jobs, Figure, Result};

const PREFIX: &str = "scale";
/// Where the idle Scheduler runs.
const PREFIX_EMPTY: &str = "scale0";

/// When the first and the last of some records were seen.
type Span = (Instant, Instant);

/// What the monitor counts.
#[derive(Default)]
struct Seen {
    messages: u64,
    /// Fires (ticks recorded `fired` or `caught_up`).
    fires: u64,
    deduplicated: u64,
    /// Fires of jobs whose names start with `burst.0`: how many, when the first and the last
    /// were seen.
    burst: (String, u64, Option<Span>),
    /// The node that last fired the job `watched.0`, and when.
    watched: (String, Option<(String, Instant)>),
}

/// Counts every message the server routes, the fires among them (the instance records'
/// creations: a tick fired on time has no tick record) and the de-duplicated tick records.
fn monitor(mut all: async_nats::Subscriber) -> Arc<Mutex<Seen>> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let counted = seen.clone();
    let ticks = format!("{PREFIX}.internal.tick.");
    let records = format!("$KV.{PREFIX}_instances.");
    tokio::spawn(async move {
        while let Some(message) = all.next().await {
            let Ok(mut seen) = counted.lock() else {
                return;
            };
            seen.messages += 1;
            let subject = message.subject.as_str();
            if subject.starts_with(&ticks) {
                let deduplicated = codec::decode::<TickRecord>(&message.payload)
                    .is_ok_and(|t| t.outcome == TickOutcome::Deduplicated);
                seen.deduplicated += u64::from(deduplicated);
                continue;
            }
            let creation = message.headers.as_ref().is_some_and(|h| {
                h.get(async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE)
                    .is_some_and(|v| v.as_str() == "0")
            });
            if !subject.starts_with(&records) || !creation {
                continue;
            }
            let Ok(record) = codec::decode::<InstanceRecord>(&message.payload) else {
                continue;
            };
            seen.fires += 1;
            if record.job.as_str().starts_with(seen.burst.0.as_str()) {
                let now = Instant::now();
                seen.burst.1 += 1;
                seen.burst.2 = Some(seen.burst.2.map_or((now, now), |(first, _)| (first, now)));
            }
            if record.job.as_str() == seen.watched.0 {
                let node = record.created_by.map(|n| n.to_string()).unwrap_or_default();
                seen.watched.1 = Some((node, Instant::now()));
            }
        }
    });
    seen
}

fn snapshot(seen: &Mutex<Seen>) -> (u64, u64, u64) {
    seen.lock()
        .map(|s| (s.messages, s.fires, s.deduplicated))
        .unwrap_or_default()
}

/// Waits until `nodes` own every partition, in fair shares, and their heartbeats say they hold
/// `jobs` jobs between them.
async fn settled(
    client: &AxClient,
    prefix: &str,
    nodes: &[String],
    jobs: usize,
    within: Duration,
) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let owners = client.partition_owners().await?;
        let mut shares: Vec<usize> = nodes
            .iter()
            .map(|n| {
                owners
                    .values()
                    .filter(|o| o.node.as_ref().map(|x| x.as_str()) == Some(n.as_str()))
                    .count()
            })
            .collect();
        shares.sort();
        let all_owned = shares.iter().sum::<usize>() == usize::from(partition::DEFAULT_COUNT);
        let fair = shares
            .last()
            .zip(shares.first())
            .is_some_and(|(max, min)| max - min <= 1);
        let held: usize = client
            .nodes()
            .await?
            .iter()
            .filter(|s| nodes.iter().any(|n| n == s.node.as_str()))
            .filter_map(|s| s.scheduler.as_ref())
            .map(|s| s.jobs)
            .sum();
        if all_owned && fair && held == jobs {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("scale: {nodes:?} did not settle on {prefix} in {within:?} (shares {shares:?}, {held} of {jobs} jobs held)");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(crate) async fn measure(url: &str, quick: bool) -> Result<Vec<Figure>> {
    let (steady, idle, burst, window) = if quick {
        (100, 1_000, 300, Duration::from_secs(1))
    } else {
        (1_000, 1_000_000, 10_000, Duration::from_secs(5))
    };
    // The Schedulers must hold a burst's jobs before their one second, or those never fire: a
    // quick run is a debug build on a busy machine (3 s lost a third of 500 there).
    let lead = if quick { 6 } else { 3 };
    let dir = tempfile::tempdir()?;
    // An idle Scheduler's memory (no job): what each process costs before its jobs.
    let idle_rss = idle_rss(url, dir.path()).await?;
    let client = client_for(url, PREFIX).await?;
    let every_second: Vec<_> = (0..steady)
        .map(|i| noop_job(&format!("st{i:05}"), "* * * * * *"))
        .collect();
    store_jobs(&client, &every_second).await?;
    let yearly: Vec<_> = (0..idle)
        .map(|i| noop_job(&format!("idle{i:07}"), "0 0 0 1 1 *"))
        .collect();
    for chunk in yearly.chunks(100_000) {
        store_jobs(&client, chunk).await?;
    }
    drop(yearly);
    let mut registered = steady + idle;
    let monitor_connection = async_nats::connect(url).await?;
    let seen = monitor(monitor_connection.subscribe(">").await?);
    let mut figures = Vec::new();
    let mut per_fire = Vec::new();
    let mut running: Vec<NodeProcess> = Vec::new();
    for n in [1, 2, 4] {
        for process in running.drain(..) {
            process.stop().await?;
        }
        let names: Vec<String> = (1..=n).map(|i| format!("s{i}")).collect();
        for name in &names {
            running.push(NodeProcess::start(
                url,
                PREFIX,
                name,
                "scheduler",
                dir.path(),
            )?);
        }
        let load = if quick { 60 } else { 600 };
        settled(
            &client,
            PREFIX,
            &names,
            registered,
            Duration::from_secs(load),
        )
        .await?;
        let loaded = registered;

        // Memory: each process's RSS beyond an idle Scheduler's, once its jobs are loaded.
        figures.push(jobs_memory(&running, n, loaded, idle_rss)?);

        // Steady state: every message over the fires.
        let (m0, f0, d0) = snapshot(&seen);
        tokio::time::sleep(window).await;
        let (m1, f1, d1) = snapshot(&seen);
        let fires = f1 - f0;
        if fires == 0 {
            bail!("scale: {n} Schedulers fired nothing in {window:?}");
        }
        let messages = (m1 - m0) as f64 / fires as f64;
        per_fire.push(messages);
        figures.push(Figure {
            section: "scale",
            name: format!("messages per fire, {n} Scheduler{}", if n > 1 { "s" } else { "" }),
            value: messages,
            unit: "msgs",
            note: format!(
                "{fires} fires of {steady} jobs firing every second in {window:?}, {} de-duplicated; \
                 every message the server routed (heartbeats and member keys included)",
                d1 - d0
            ),
        });

        // Saturation: a burst due at one second.
        figures.push(saturation(&client, &seen, n, burst, lead).await?);
        registered += burst;
    }
    if let (Some(first), Some(last)) = (per_fire.first(), per_fire.last()) {
        figures.push(Figure {
            section: "scale",
            name: "messages per fire, 4 Schedulers / 1".into(),
            value: last / first,
            unit: "ratio",
            note: "1.0 is the goal: a Scheduler added costs no message per fire".into(),
        });
    }

    // SIGKILL of the owner of a job firing every second, four running.
    figures.push(owner_killed(&client, &seen, running, registered).await?);
    Ok(figures)
}

/// An idle Scheduler's memory (no job): what each process costs before its jobs.
async fn idle_rss(url: &str, dir: &std::path::Path) -> Result<f64> {
    let empty = client_for(url, "scale0").await?;
    let alone = NodeProcess::start(url, "scale0", "s0", "scheduler", dir)?;
    let names = ["s0".to_string()];
    settled(&empty, PREFIX_EMPTY, &names, 0, Duration::from_secs(60)).await?;
    let rss = alone.resident_bytes()? as f64;
    alone.stop().await?;
    Ok(rss)
}

/// Fires per second at saturation with `n` Schedulers: `burst` jobs due at one second `lead`
/// seconds ahead, until the last is seen fired.
async fn saturation(
    client: &AxClient,
    seen: &Mutex<Seen>,
    n: usize,
    burst: usize,
    lead: i64,
) -> Result<Figure> {
    let name = format!("burst{n}-");
    if let Ok(mut seen) = seen.lock() {
        seen.burst = (name.clone(), 0, None);
    }
    let (_, cron) = fire_soon(lead)?;
    let jobs: Vec<_> = (0..burst)
        .map(|i| noop_job(&format!("{name}{i:05}"), &cron))
        .collect();
    store_jobs(client, &jobs).await?;
    let wait_until = Instant::now() + Duration::from_secs(60);
    let span = loop {
        let (fired, span) = seen
            .lock()
            .map(|s| (s.burst.1, s.burst.2))
            .unwrap_or_default();
        if fired >= burst as u64 {
            break span;
        }
        if Instant::now() > wait_until {
            bail!("scale: {fired} of {burst} burst fires with {n} Schedulers in 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // From the first record of the burst seen to the last.
    let took = span
        .map(|(first, last)| last - first)
        .unwrap_or_default()
        .max(Duration::from_millis(1));
    Ok(Figure {
        section: "scale",
        name: format!(
            "fires/s at saturation, {n} Scheduler{}",
            if n > 1 { "s" } else { "" }
        ),
        value: burst as f64 / took.as_secs_f64(),
        unit: "fires/s",
        note: format!(
            "{burst} jobs due at one second, their records written over {} ms",
            took.as_millis()
        ),
    })
}

/// SIGKILL of the Scheduler owning a job that fires every second (of the four `running`):
/// how long until another fires it.
async fn owner_killed(
    client: &AxClient,
    seen: &Mutex<Seen>,
    mut running: Vec<NodeProcess>,
    registered: usize,
) -> Result<Figure> {
    let job = "st00000";
    let owners = client.partition_owners().await?;
    let owner = owners
        .get(&partition::of(job, partition::DEFAULT_COUNT))
        .and_then(|o| o.node.clone());
    let Some(index) = owner.and_then(|o| o.as_str().strip_prefix('s')?.parse::<usize>().ok())
    else {
        bail!("scale: nobody owns {job}");
    };
    if let Ok(mut seen) = seen.lock() {
        seen.watched = (job.to_string(), None);
    }
    let killed = running.remove(index - 1);
    let killed_name = format!("s{index}");
    let started = Instant::now();
    drop(killed);
    let wait_until = started + Duration::from_secs(120);
    let again = loop {
        let fired_by = seen.lock().ok().and_then(|s| s.watched.1.clone());
        if let Some((node, at)) = fired_by {
            if node != killed_name && at > started {
                break at - started;
            }
        }
        if Instant::now() > wait_until {
            bail!("scale: {job} did not fire again within 120 s of its owner's SIGKILL");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    Ok(Figure {
        section: "scale",
        name: "SIGKILL of an owner to its jobs firing again".into(),
        value: again.as_secs_f64() * 1000.0,
        unit: "ms",
        note: format!(
            "4 Schedulers, {registered} jobs registered: the member key expires (6 s), a round \
             (1 s), the taker reads the registry for the partitions' jobs"
        ),
    })
}

/// The jobs' memory of each of `running` (`n` sharing `loaded` jobs): its RSS beyond an idle
/// Scheduler's, the mean and each.
fn jobs_memory(running: &[NodeProcess], n: usize, loaded: usize, idle_rss: f64) -> Result<Figure> {
    let mut resident = Vec::new();
    for process in running {
        resident.push(process.resident_bytes()? as f64);
    }
    let jobs_memory: Vec<f64> = resident
        .iter()
        .map(|r| (r - idle_rss).max(0.0) / (1 << 20) as f64)
        .collect();
    let mean = jobs_memory.iter().sum::<f64>() / jobs_memory.len() as f64;
    Ok(Figure {
        section: "scale",
        name: format!("jobs' memory per Scheduler, {n} sharing {loaded} jobs"),
        value: mean,
        unit: "MiB",
        note: format!(
            "RSS beyond an idle Scheduler's {:.0} MiB, of each: {}",
            idle_rss / (1 << 20) as f64,
            jobs_memory
                .iter()
                .map(|r| format!("{r:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}
