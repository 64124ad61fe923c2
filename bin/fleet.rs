//! `ax nodes`, `ax worker list`, `ax executors` and `ax queue pause|resume|list`.

use anyhow::{anyhow, Result};

use ax_bus::messages::{QueueRequest, WorkerInfo};
use ax_bus::room::Isolation;
use ax_bus::spec::Priority;
use ax_bus::AxClient;

use crate::jobs::CONTROL_TIMEOUT;
use crate::table;

/// Every node that has written a heartbeat within the bucket's lifetime: its roles, its
/// Scheduler's share of the cron jobs (partitions and jobs; the partitions themselves in JSON)
/// and what befell its actors (summed in the table, per actor in JSON and in the ACTORS column).
pub(crate) async fn nodes(client: &AxClient, json: bool) -> Result<()> {
    let now = ax_bus::time::now();
    let mut nodes = client.nodes().await?;
    nodes.sort_by(|a, b| a.node.cmp(&b.node));
    if json {
        return table::json(&nodes);
    }
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|node| {
            let troubled = node.troubles();
            let age = (now - node.seen_at).num_milliseconds() as f64 / 1000.0;
            vec![
                node.node.to_string(),
                node.host.clone(),
                node.pid.to_string(),
                node.roles.join(","),
                node.started_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                format!("{age:.1}s ago"),
                match &node.scheduler {
                    Some(share) => {
                        format!("{} partitions, {} jobs", share.partitions.len(), share.jobs)
                    }
                    None => "-".to_string(),
                },
                node.machine
                    .map_or_else(|| "-".to_string(), |m| m.to_string()),
                if troubled.is_empty() {
                    "ok".to_string()
                } else {
                    troubled.join("; ")
                },
            ]
        })
        .collect();
    table::print(
        &[
            "NODE",
            "HOST",
            "PID",
            "ROLES",
            "STARTED",
            "HEARTBEAT",
            "FIRES",
            "MACHINE",
            "ACTORS",
        ],
        &rows,
    );
    Ok(())
}

/// How a worker's slots are decided: `fixed`, or its adaptive budget's bounds, last reason and
/// the pressure it read (`1-8 load_high 1.62/core 3.1 GiB free`).
fn budget(info: &WorkerInfo) -> String {
    match &info.budget {
        None => "fixed".to_string(),
        Some(b) => format!(
            "{}-{} {} {:.2}/core {:.1} GiB free",
            b.min,
            b.max,
            b.reason.as_str(),
            b.load_per_core,
            b.memory_available_bytes as f64 / f64::from(1u32 << 30),
        ),
    }
}

/// Every worker with its score and liveness as the Routers judge them (their configured
/// weights and TTL, read from a Router's node heartbeat).
pub(crate) async fn workers(client: &AxClient, json: bool) -> Result<()> {
    let policy = client.routing_policy().await?;
    let now = ax_bus::time::now();
    let mut rows = Vec::new();
    let mut docs = Vec::new();
    let mut workers = client.workers().await?;
    workers.sort_by(|a, b| a.0.id.cmp(&b.0.id));
    for (info, at) in workers {
        let age = (now - at).num_milliseconds() as f64 / 1000.0;
        let alive = policy.alive((now - at).to_std().unwrap_or_default());
        let score = policy.score(&info, 0);
        rows.push(vec![
            info.id.to_string(),
            info.host.clone(),
            format!("{}/{}", info.running, info.slots),
            budget(&info),
            info.cores.to_string(),
            format!("{:.0}", info.avg_duration_ms),
            format!("{score:.3}"),
            if info.tags.is_empty() {
                "-".into()
            } else {
                info.tags.join(",")
            },
            info.executors.join(","),
            info.isolation
                .as_ref()
                .map_or_else(|| "-".into(), Isolation::walls),
            info.isolation
                .as_ref()
                .map_or_else(|| "-".into(), Isolation::room),
            if alive {
                format!("{age:.1}s ago")
            } else {
                format!("dead ({age:.0}s)")
            },
        ]);
        docs.push(serde_json::json!({
            "worker": info,
            "score": score,
            "alive": alive,
            "heartbeat_at": at,
        }));
    }
    if json {
        return table::json(&docs);
    }
    table::print(
        &[
            "WORKER",
            "HOST",
            "RUNNING",
            "BUDGET",
            "CORES",
            "AVG MS",
            "SCORE",
            "TAGS",
            "EXECUTORS",
            "WALLS",
            "ROOM",
            "HEARTBEAT",
        ],
        &rows,
    );
    Ok(())
}

/// One row per (live worker, executor), from the workers' heartbeats.
pub(crate) async fn executors(client: &AxClient, json: bool) -> Result<()> {
    let now = ax_bus::time::now();
    let policy = client.routing_policy().await?;
    let mut workers = client.workers().await?;
    workers.retain(|(_, at)| policy.alive((now - *at).to_std().unwrap_or_default()));
    workers.sort_by(|a, b| a.0.id.cmp(&b.0.id));
    let mut rows = Vec::new();
    let mut docs = Vec::new();
    for (info, _) in &workers {
        for executor in &info.described {
            rows.push(vec![
                executor.name.clone(),
                executor.kind.clone(),
                executor.version.clone(),
                info.id.to_string(),
                executor.description.clone(),
            ]);
        }
        docs.push(serde_json::json!({
            "worker": info.id,
            "executors": info.described,
        }));
    }
    if json {
        return table::json(&docs);
    }
    rows.sort();
    table::print(
        &["EXECUTOR", "KIND", "VERSION", "WORKER", "DESCRIPTION"],
        &rows,
    );
    Ok(())
}

fn priority(text: &str) -> Result<Priority> {
    text.parse().map_err(|e: String| anyhow!(e))
}

/// `ax status`: the health summary.
/// `ax status`; with `-n`, its queues and failing jobs are the namespace's (what ended, the
/// latency and the longest run are counted for every namespace: the day's summary is one).
pub(crate) async fn status(
    client: &AxClient,
    date: Option<&str>,
    namespace: Option<&ax_bus::ids::Namespace>,
    json: bool,
) -> Result<()> {
    if let Some(date) = date {
        if ax_bus::time::parse_biz_date(date).is_none() {
            return Err(anyhow!("--date: `{date}` is not a date (YYYY-MM-DD)"));
        }
    }
    let mut status = client.status(date).await?;
    if let Some(namespace) = namespace {
        status
            .queues
            .retain(|q| q.namespace() == namespace.as_str());
        if let Some(day) = status.day.as_mut() {
            day.failures_by_job.retain(|job, _| {
                ax_bus::ids::JobName::parse(job).is_ok_and(|j| j.namespace() == namespace.as_str())
            });
        }
    }
    if json {
        return table::json(&status);
    }
    if let Some(namespace) = namespace {
        println!(
            "namespace         {namespace} (its queues and failing jobs; what ended, the latency \
             and the longest run are of every namespace)"
        );
    }
    match &status.day {
        Some(day) => {
            println!("day               {} ({})", day.date, day.timezone);
            println!(
                "ended on the day  {}: {} succeeded, {} failed, {} cancelled (each ending; a re-run that ends counts again)",
                day.finished, day.succeeded, day.failed, day.cancelled
            );
            println!(
                "trigger latency   {}",
                day.average_latency_text().map_or("-".into(), |text| format!(
                    "{text} on average (first attempts, from when each became due; backfills left out)"
                ))
            );
            println!(
                "longest run       {}",
                day.longest.as_ref().map_or("-".into(), |l| format!(
                    "{}, {}{} ({})",
                    ax_bus::time::human_ms(l.duration_ms),
                    l.instance_id,
                    l.attempt
                        .map(|n| format!(" attempt {n}"))
                        .unwrap_or_default(),
                    l.job
                ))
            );
            let top: Vec<String> = day
                .top_failing(5)
                .into_iter()
                .map(|(job, n)| format!("{job} ({n})"))
                .collect();
            println!(
                "top failing jobs  {} (failed endings)",
                if top.is_empty() {
                    "-".into()
                } else {
                    top.join(", ")
                }
            );
        }
        None => println!("day               no instance has ended yet"),
    }
    let queues: Vec<String> = status
        .queues
        .iter()
        .map(|q| {
            format!(
                "{} {} waiting, {} in flight",
                q.queue, q.pending, q.ack_pending
            )
        })
        .collect();
    println!("queues            {}", queues.join("; "));
    println!("live workers      {}", status.workers_live);
    println!("nodes             {}", status.nodes.join(", "));
    let alerts: Vec<String> = status
        .alerts_last_hour
        .iter()
        .map(|(kind, n)| format!("{kind} {n}"))
        .collect();
    println!(
        "alerts (1 h)      {}",
        if alerts.is_empty() {
            "none".into()
        } else {
            alerts.join(", ")
        }
    );
    Ok(())
}

pub(crate) async fn queue(client: &AxClient, text: &str, paused: bool, json: bool) -> Result<()> {
    let request = QueueRequest {
        priority: priority(text)?,
        paused,
    };
    let reply = crate::jobs::send(client, &request, CONTROL_TIMEOUT).await?;
    if json {
        return table::json(&serde_json::json!({ "priority": text, "paused": paused }));
    }
    println!("{}", reply.message);
    Ok(())
}

pub(crate) async fn queues(client: &AxClient, json: bool) -> Result<()> {
    let states = client.queue_states().await?;
    if json {
        let docs: Vec<_> = states
            .iter()
            .map(|(p, s)| {
                serde_json::json!({ "priority": p.as_str(), "paused": s.paused, "by": s.by })
            })
            .collect();
        return table::json(&docs);
    }
    let rows: Vec<Vec<String>> = states
        .iter()
        .map(|(p, s)| {
            let by = match (s.paused, s.by.as_str()) {
                (false, _) => "-",
                (true, "") => "operator",
                (true, by) => by,
            };
            vec![
                p.as_str().to_string(),
                if s.paused { "paused" } else { "running" }.to_string(),
                by.to_string(),
            ]
        })
        .collect();
    table::print(&["QUEUE", "STATE", "PAUSED BY"], &rows);
    Ok(())
}

/// Which server leads each written stream; with `spread`, first moves leaders so that no
/// server leads more writes an instance than it must (see [`ax_bus::client::leaders`]).
pub(crate) async fn leaders(client: &AxClient, spread: bool, json: bool) -> Result<()> {
    use ax_bus::client::leaders;
    if spread {
        let moves = leaders::spread(client, |step| {
            eprintln!(
                "{}: {} → {}",
                step.stream,
                step.from.as_deref().unwrap_or("no leader"),
                step.to
            )
        })
        .await?;
        if moves.is_empty() {
            eprintln!("the leaders are spread as well as they can be: nothing moved");
        }
    }
    let streams = leaders::written_streams(client).await?;
    if json {
        return table::json(&streams);
    }
    let rows: Vec<Vec<String>> = streams
        .iter()
        .map(|led| {
            vec![
                led.stream.clone(),
                format!("{:.1}", led.writes),
                led.leader.clone().unwrap_or_else(|| "-".into()),
                led.peers.join(","),
            ]
        })
        .collect();
    table::print(&["STREAM", "WRITES/INSTANCE", "LEADER", "REPLICAS"], &rows);
    let load = leaders::load(&streams);
    let busiest = load.iter().max_by(|a, b| a.1.total_cmp(b.1));
    if let Some((server, writes)) = busiest.filter(|_| load.len() > 1) {
        println!("the most writes an instance one server leads: {writes:.1} ({server})");
    }
    Ok(())
}
