//! Routing: what the Router's choice costs, with 50 simulated workers.
//!
//! - **the decision**: the Router's pick (`ax_actors::bench::routing_picks`) (filter by tags and executor, lowest score, re-rank the
//!   chosen worker) over fleets of 50, 500 and 5,000 workers in ten tag classes, in nanoseconds
//!   per pick. A scan would grow a hundredfold from 50 to 5,000; a pick from ordered sets grows
//!   with log n.
//! - **dispatch throughput**: the same N ready attempts go from the ready queue to worker dispatch
//!   subjects twice: once through the real Router actor choosing among 50 simulated workers
//!   (heartbeats written by the bench, tags in five classes, half the jobs tagged; the bench
//!   acknowledges each dispatch to the Router as a worker does), once through a forwarder doing
//!   the same consume, decode, publish and settle (one batch settling while the next is sent)
//!   with a fixed round-robin choice and no acknowledgement tracking. Each rate runs from the
//!   first dispatch seen on the wire to the last, so start-up is not counted.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{bail, Result};
use ax_bus::ids::{DispatchId, NodeId, TraceId, WorkerId};
use futures::{FutureExt, StreamExt};

use ax_actors::bench::{routing_picks, simulated_worker};
use ax_actors::jetstream::consume::{self, ConsumerSpec};
use ax_actors::jetstream::publish;
use ax_actors::RouterConfig;
use ax_actors::SystemClock;
use ax_actors::WorkerConfig;
use ax_actors::{parse_roles, Node, NodeConfig};
use ax_bus::messages::{DispatchAck, QueueState, WorkItem};
use ax_bus::msg_id;
use ax_bus::spec::{JobSpec, Priority};
use ax_bus::{codec, AxClient};

use crate::{client_for, noop_job, Figure};

/// Simulated workers in the throughput measurement.
const WORKERS: usize = 50;
/// Tag classes among them.
const CLASSES: usize = 5;
/// Publish acks awaited per window.
const WINDOW: usize = 1024;
/// Batch pulled by the forwarder (the Router's own).
const BATCH: usize = 256;
/// Rounds of each dispatch measurement.
const ROUNDS: usize = 3;

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

pub(crate) async fn measure(url: &str, quick: bool) -> Result<Vec<Figure>> {
    let mut figures = decision_cost(quick)?;
    let n = if quick { 1_000 } else { 50_000 };
    // Alternating rounds, medians kept: one round on a loaded 2-core machine is noisy (a quick
    // run's one round only shows that it runs).
    let rounds = if quick { 1 } else { ROUNDS };
    let (mut forwarded, mut routed) = (Vec::new(), Vec::new());
    let mut spread = String::new();
    for round in 0..rounds {
        forwarded.push(forwarded_rate(url, &format!("fw{round}"), n).await?);
        let (rate, seen) = routed_rate(url, &format!("rt{round}"), n).await?;
        routed.push(rate);
        spread = seen;
    }
    let (forwarded, routed) = (median(&mut forwarded), median(&mut routed));
    figures.push(Figure {
        section: "routing",
        name: "dispatch without routing".into(),
        value: forwarded,
        unit: "disp/s",
        note: format!("{n} ready attempts, round-robin over {WORKERS} workers; median of {rounds}"),
    });
    figures.push(Figure {
        section: "routing",
        name: format!("dispatch with routing, {WORKERS} workers"),
        value: routed,
        unit: "disp/s",
        note: format!(
            "{:.0}% of dispatch without routing (target 85%); median of {rounds}; {spread}",
            100.0 * routed / forwarded
        ),
    });
    Ok(figures)
}

/// Nanoseconds per pick for fleets of several sizes.
fn decision_cost(quick: bool) -> Result<Vec<Figure>> {
    let picks = if quick { 20_000 } else { 1_000_000 };
    let classes = 10;
    let mut figures = Vec::new();
    let mut first = None;
    for size in [50, 500, 5_000] {
        let (took, found) = routing_picks(size, classes, picks);
        let ns = took.as_nanos() as f64 / picks as f64;
        if found == 0 {
            bail!("routing: no pick found a worker");
        }
        let base = *first.get_or_insert(ns);
        figures.push(Figure {
            section: "routing",
            name: format!("decision, {size} workers"),
            value: ns,
            unit: "ns/pick",
            note: format!(
                "{picks} picks, {classes} tag classes, half with a tag; {:.2}x the 50-worker cost",
                ns / base
            ),
        });
    }
    Ok(figures)
}

/// `n` ready attempts of one no-op job, some tagged.
async fn publish_ready(client: &AxClient, n: usize) -> Result<()> {
    let plain = noop_job("routed", "0 0 1 1 *");
    let mut acks = Vec::with_capacity(WINDOW);
    for i in 0..n {
        let mut spec: JobSpec = plain.clone();
        if i % 2 == 1 {
            spec.tags = vec![format!("class{}", i % CLASSES)];
        }
        let work = WorkItem::first(
            format!("routed.{i}").parse()?,
            TraceId::random(),
            "2026-01-01",
            spec,
        );
        acks.push(
            publish::to_stream(
                client,
                client.subjects().ready(Priority::Normal),
                &msg_id::ready(&work.trace_id),
                &work,
            )
            .await?,
        );
        if acks.len() == WINDOW {
            for ack in acks.drain(..) {
                ack.await?;
            }
        }
    }
    for ack in acks {
        ack.await?;
    }
    Ok(())
}

/// Counts dispatches on the wire until `n`; returns the rate from the first to the last and
/// how many each worker got.
/// With `acknowledge`, each dispatch is acknowledged to its Router as a worker would once it
/// claimed it (the Router then stops tracking it, as in production; unacknowledged, every
/// dispatch would stay tracked until its deadline).
async fn count_dispatches(
    mut wire: async_nats::Subscriber,
    n: usize,
    acknowledge: Option<&AxClient>,
) -> Result<(f64, HashMap<String, usize>)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    let mut per_worker: HashMap<String, usize> = HashMap::new();
    let mut first = None;
    let mut seen = 0;
    while seen < n {
        let Ok(Some(message)) = tokio::time::timeout_at(deadline, wire.next()).await else {
            bail!("routing: {seen} of {n} dispatches before the deadline");
        };
        first.get_or_insert_with(Instant::now);
        let worker = message.subject.split('.').nth(3).unwrap_or("").to_string();
        if let Some(client) = acknowledge {
            let worker: WorkerId = worker.parse()?;
            let work: WorkItem = codec::decode(&message.payload)?;
            if let (Some(router), Some(dispatch)) = (&work.router, work.dispatch) {
                let ack = DispatchAck {
                    trace_id: work.trace_id,
                    dispatch,
                    worker: worker.clone(),
                };
                client
                    .nats
                    .publish(client.subjects().ack(router), codec::encode(&ack)?)
                    .await?;
            }
        }
        *per_worker.entry(worker).or_default() += 1;
        seen += 1;
    }
    let elapsed = first.map_or(0.0, |f| f.elapsed().as_secs_f64()).max(1e-3);
    Ok(((n - 1) as f64 / elapsed, per_worker))
}

/// The forwarder: the Router's consume–publish–settle loop with a fixed choice, on an arbiter
/// of its own as the Router is (the placement alone changes the rate by a third).
async fn forwarded_rate(url: &str, prefix: &str, n: usize) -> Result<f64> {
    let client = client_for(url, prefix).await?;
    publish_ready(&client, n).await?;
    let wire = client
        .nats
        .subscribe(client.subjects().dispatch_all())
        .await?;
    let spec = ConsumerSpec {
        max_ack_pending: 4 * BATCH as i64,
        ..ConsumerSpec::new(
            client.layout.flow_stream(),
            "forwarder",
            client.subjects().ready(Priority::Normal),
        )
    };
    let arbiter = actix::Arbiter::new();
    let forwarder: NodeId = "forwarder".parse()?;
    let forwarding = {
        // A connection of its own, as a Router node has.
        let client = client_for(url, prefix).await?;
        arbiter.spawn(
            async move {
                let mut batches = consume::messages(&client, &spec, BATCH)
                    .await?
                    .ready_chunks(BATCH);
                let mut next = 0usize;
                // Settles one batch while the next is forwarded, as the Router does.
                let mut settling = consume::SettleBehind::default();
                while let Some(batch) = batches.next().await {
                    let mut pending = Vec::with_capacity(batch.len());
                    for message in batch {
                        let message = message?;
                        let mut work: WorkItem = codec::decode(&message.payload)?;
                        let worker: WorkerId = format!("sim{}", next % WORKERS).parse()?;
                        next += 1;
                        let dispatch = DispatchId::random();
                        work.dispatch = Some(dispatch.clone());
                        work.worker = Some(worker.clone());
                        work.router = Some(forwarder.clone());
                        let ack = publish::to_stream(
                            &client,
                            client.subjects().dispatch(&worker, work.spec.priority),
                            &msg_id::dispatch(&work.trace_id, &dispatch),
                            &work,
                        )
                        .await?;
                        pending.push((message, ack, ()));
                    }
                    settling.settle(pending, |_| ()).await;
                }
                Ok::<(), crate::BenchError>(())
            }
            .map(|_| ()),
        )
    };
    let (rate, _) = count_dispatches(wire, n, None).await?;
    let _ = forwarding;
    arbiter.stop();
    Ok(rate)
}

/// The real Router, among 50 simulated workers; the rate and how evenly the load spread.
async fn routed_rate(url: &str, prefix: &str, n: usize) -> Result<(f64, String)> {
    let client = client_for(url, prefix).await?;
    let pause = |paused: bool| {
        let client = client.clone();
        async move {
            client
                .queues
                .put(
                    Priority::Normal.as_str(),
                    codec::encode(&QueueState {
                        paused,
                        by: String::new(),
                    })?,
                )
                .await
                .map_err(|e| format!("pause the ready queue: {e}"))?;
            Ok::<(), crate::BenchError>(())
        }
    };
    // Held back until the Router knows its workers.
    pause(true).await?;
    publish_ready(&client, n).await?;
    let wire = client
        .nats
        .subscribe(client.subjects().dispatch_all())
        .await?;
    let scratch = tempfile::tempdir()?;
    let node = Node::start(
        client_for(url, prefix).await?,
        NodeConfig {
            worker: WorkerConfig {
                slots: 1,
                ..WorkerConfig::new("rt".parse()?, scratch.path().to_path_buf())
            },
            router: RouterConfig {
                // Acknowledgements come from the bench, perhaps late under load: the
                // measurement must not see re-dispatches.
                ack_timeout: Duration::from_secs(600),
                policy: ax_bus::routing::RoutingPolicy::new(
                    Default::default(),
                    Duration::from_secs(600),
                ),
                ..Default::default()
            },
            ..NodeConfig::new(
                "rt".parse()?,
                parse_roles("router")?,
                scratch.path().to_path_buf(),
            )
        },
        Arc::new(SystemClock),
    )?;
    let heartbeats = {
        let client = client.clone();
        tokio::spawn(async move {
            loop {
                for i in 0..WORKERS {
                    if let Some(Ok(payload)) =
                        simulated_worker(i, CLASSES).map(|w| codec::encode(&w))
                    {
                        let _ = client.workers.put(format!("sim{i}"), payload).await;
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    // Heartbeats replayed at start count as old; live ones arrive within a second.
    tokio::time::sleep(Duration::from_secs(3)).await;
    pause(false).await?;
    let counted = count_dispatches(wire, n, Some(&client)).await;
    heartbeats.abort();
    node.stop();
    let (rate, per_worker) = counted?;
    let busiest = per_worker.values().copied().max().unwrap_or(0);
    let spread = format!(
        "{} workers used, the busiest took {:.1}%",
        per_worker.len(),
        100.0 * busiest as f64 / n as f64
    );
    Ok((rate, spread))
}
