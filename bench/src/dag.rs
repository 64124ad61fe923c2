//! DAG: the DagCoordinator on the three 10,000-job graphs of the DAG issue — a chain, a 1→10k
//! fan-out, and a layered random graph with about 50,000 edges — for one business date, with a
//! no-op executor.
//!
//! Two figures per graph:
//! - **decisions**: the coordinator's own logic (`DagState`, through `ax_actors::bench::dag_decisions`) resolving the whole graph in
//!   process, every instance succeeding at once: its overhead beyond execution, without I/O;
//! - **in the loop**: the real coordinator actor on NATS, with the benchmark standing in for
//!   router, worker and executor (each released attempt is answered at once with a success
//!   result): everything the coordinator costs, JetStream round trips included.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::{bail, Result};
use actix::{Arbiter, Supervisor};
use ax_bus::ids::NodeId;
use chrono::NaiveDate;
use futures::StreamExt;
use rand::{seq::IndexedRandom, SeedableRng};

use ax_actors::bench::{dag_decisions, success};
use ax_actors::jetstream::consume::{self, ConsumerSpec};
use ax_actors::jetstream::publish;
use ax_actors::DagCoordinator;
use ax_bus::client::provision::Layout;
use ax_bus::instance::Trigger;
use ax_bus::messages::WorkItem;
use ax_bus::msg_id;
use ax_bus::spec::JobSpec;
use ax_bus::time::start_of_day;
use ax_bus::{codec, AxClient, InstanceRecord, Subjects};

use crate::Figure;

const SEED: u64 = 42;
const DATE: &str = "2026-01-01";

struct Graph {
    name: &'static str,
    specs: Vec<JobSpec>,
    edges: usize,
}

fn job(name: String, deps: &[String]) -> JobSpec {
    let value = serde_json::json!({
        "name": name,
        "exec": {"type": "shell", "command": "true"},
        "deps": deps.iter().map(|d| serde_json::json!({"name": d})).collect::<Vec<_>>(),
    });
    serde_json::from_value(value).expect("a valid generated job")
}

fn chain(n: usize) -> Graph {
    let specs = (0..n)
        .map(|i| {
            let deps: Vec<String> = if i == 0 {
                vec![]
            } else {
                vec![format!("c{}", i - 1)]
            };
            job(format!("c{i}"), &deps)
        })
        .collect();
    Graph {
        name: "chain",
        specs,
        edges: n - 1,
    }
}

fn fan_out(n: usize) -> Graph {
    let mut specs = vec![job("root".into(), &[])];
    specs.extend((0..n).map(|i| job(format!("f{i}"), &["root".to_string()])));
    Graph {
        name: "fan-out 1→n",
        specs,
        edges: n,
    }
}

fn layered(layers: usize, width: usize, parents: usize) -> Graph {
    let mut rng = rand::rngs::StdRng::seed_from_u64(SEED);
    let mut specs = Vec::new();
    let mut edges = 0;
    for layer in 0..layers {
        for i in 0..width {
            let deps: Vec<String> = if layer == 0 {
                vec![]
            } else {
                let previous: Vec<usize> = (0..width).collect();
                previous
                    .choose_multiple(&mut rng, parents)
                    .map(|p| format!("l{}-{p}", layer - 1))
                    .collect()
            };
            edges += deps.len();
            specs.push(job(format!("l{layer}-{i}"), &deps));
        }
    }
    Graph {
        name: "layered random",
        specs,
        edges,
    }
}

/// The three graphs, of `jobs` jobs each (a multiple of 100).
fn graphs(jobs: usize) -> Vec<Graph> {
    vec![chain(jobs), fan_out(jobs), layered(jobs / 100, 100, 5)]
}

fn date() -> NaiveDate {
    NaiveDate::parse_from_str(DATE, "%Y-%m-%d").expect("a valid date")
}

fn first_attempt(spec: &JobSpec) -> (InstanceRecord, WorkItem) {
    let expected = start_of_day(chrono_tz::UTC, date());
    let record = InstanceRecord::first(
        spec,
        expected,
        DATE.into(),
        Default::default(),
        Trigger::Manual,
        ax_bus::time::now(),
    );
    let work = WorkItem::for_attempt(&record, spec.clone());
    (record, work)
}

/// Resolves the graph with the real coordinator on NATS; the benchmark answers every release
/// with a success at once. Returns the wall time and the number of instances released.
async fn in_the_loop(
    nats: &async_nats::Client,
    graph: &Graph,
    prefix: &str,
) -> Result<(Duration, usize)> {
    let client =
        AxClient::provisioned(nats.clone(), Layout::new(Subjects::new(prefix), Some(1))).await?;
    crate::store_jobs(&client, &graph.specs).await?;
    let ready_spec = ConsumerSpec {
        ack_wait: Duration::from_secs(60),
        max_ack_pending: 4096,
        ..ConsumerSpec::new(
            client.layout.flow_stream(),
            "bench-ready",
            client.subjects().ready_all(),
        )
    };
    let mut ready = consume::messages(&client, &ready_spec, 512)
        .await?
        .ready_chunks(512);
    let arbiter = Arbiter::new();
    let coordinator_client = client.clone();
    let node: NodeId = "bench".parse()?;
    // Held while it runs: actix restarts an actor only while an address of it lives, and one
    // whose lead failed holds none of its own.
    let _actor = Supervisor::start_in_arbiter(&arbiter.handle(), move |_| {
        DagCoordinator::new(coordinator_client, node.clone())
    });
    let started = Instant::now();
    for spec in graph.specs.iter().filter(|s| s.deps.is_empty()) {
        let (record, work) = first_attempt(spec);
        client.create_instance(&record).await?;
        publish::to_stream_acked(
            &client,
            client.subjects().created(&spec.name),
            &msg_id::created(&work.trace_id),
            &work,
        )
        .await?;
    }
    let total = graph.specs.len();
    let mut released = HashSet::new();
    let deadline = started + Duration::from_secs(600);
    while released.len() < total {
        let batch = tokio::time::timeout_at(deadline.into(), ready.next()).await;
        let Ok(Some(batch)) = batch else {
            bail!(
                "{}: {} of {total} released before the deadline",
                graph.name,
                released.len()
            );
        };
        let mut pending = Vec::with_capacity(batch.len());
        for message in batch {
            let message = message?;
            let work: WorkItem = codec::decode(&message.payload)?;
            let ack = publish::to_stream(
                &client,
                client.subjects().result(work.job()),
                &msg_id::result(&work.trace_id),
                &success(&work),
            )
            .await?;
            released.insert(work.instance_id);
            pending.push((message, ack));
        }
        for (message, ack) in pending {
            ack.await?;
            message.ack().await?;
        }
    }
    let elapsed = started.elapsed();
    arbiter.stop();
    let _ = arbiter.join();
    Ok((elapsed, released.len()))
}

/// The coordinator's intake: `n` results of distinct instances published at once (acks in
/// windows), from the first publish until its results consumer has acknowledged them all.
/// Every instance's result passes the coordinator (it keeps the instances per business date),
/// so this is the ceiling of the whole system's instances per second while one coordinator
/// leads.
async fn intake(nats: &async_nats::Client, n: usize, prefix: &str) -> Result<Duration> {
    let client =
        AxClient::provisioned(nats.clone(), Layout::new(Subjects::new(prefix), Some(1))).await?;
    let upstream: JobSpec = serde_json::from_value(serde_json::json!({
        "name": "solo", "exec": {"type": "noop"},
    }))?;
    let downstream: JobSpec = serde_json::from_value(serde_json::json!({
        "name": "after", "exec": {"type": "noop"}, "deps": [{"name": "solo"}],
    }))?;
    crate::store_jobs(&client, &[upstream.clone(), downstream]).await?;
    let arbiter = Arbiter::new();
    let coordinator_client = client.clone();
    let node: NodeId = "bench".parse()?;
    // Held while it runs: actix restarts an actor only while an address of it lives, and one
    // whose lead failed holds none of its own.
    let _actor = Supervisor::start_in_arbiter(&arbiter.handle(), move |_| {
        DagCoordinator::new(coordinator_client, node.clone())
    });
    let stream = client.js.get_stream(client.layout.results_stream()).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let consumer = loop {
        if let Some(name) = results_consumer(&stream).await {
            break name;
        }
        if Instant::now() > deadline {
            bail!("dag intake: the coordinator did not start consuming results in 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (_, work) = first_attempt(&upstream);
    let started = Instant::now();
    let mut acks = ax_actors::jetstream::publish::AckWindow::new(1024);
    for i in 0..n {
        let mut result = success(&work);
        result.instance_id = format!("solo.{i}").parse()?;
        result.trace_id = ax_bus::ids::TraceId::random();
        acks.push(
            publish::to_stream(
                &client,
                client.subjects().result(&result.job),
                &msg_id::result(&result.trace_id),
                &result,
            )
            .await?,
        )
        .await?;
    }
    acks.flush().await?;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let info = stream.consumer_info(&consumer).await?;
        if info.num_pending == 0
            && info.num_ack_pending == 0
            && info.ack_floor.stream_sequence >= n as u64
        {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "dag intake: {} results still pending after 300 s",
                info.num_pending + info.num_ack_pending as u64
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed();
    arbiter.stop();
    let _ = arbiter.join();
    Ok(elapsed)
}

pub(crate) async fn measure(nats: &async_nats::Client, quick: bool) -> Result<Vec<Figure>> {
    let mut figures = Vec::new();
    let n = if quick { 1_000 } else { 50_000 };
    let took = intake(nats, n, "benchin").await?;
    figures.push(Figure {
        section: "dag",
        name: "coordinator intake".into(),
        value: n as f64 / took.as_secs_f64(),
        unit: "results/s",
        note: format!(
            "{n} results published at once, all acknowledged by the coordinator in {} ms: \
             the ceiling of instances per second while one coordinator leads",
            took.as_millis()
        ),
    });
    for (i, graph) in graphs(if quick { 300 } else { 10_000 })
        .into_iter()
        .enumerate()
    {
        let size = format!("{} jobs, {} edges", graph.specs.len(), graph.edges);
        let (time, released) = dag_decisions(&graph.specs, date());
        if released != graph.specs.len() {
            bail!(
                "{}: only {released} of {} released",
                graph.name,
                graph.specs.len()
            );
        }
        figures.push(Figure {
            section: "dag",
            name: format!("{}: decisions", graph.name),
            value: time.as_secs_f64() * 1000.0,
            unit: "ms",
            note: size.clone(),
        });
        let (time, _) = in_the_loop(nats, &graph, &format!("bench{i}")).await?;
        figures.push(Figure {
            section: "dag",
            name: format!("{}: in the loop", graph.name),
            value: time.as_secs_f64() * 1000.0,
            unit: "ms",
            note: format!(
                "{size}, {:.3} ms per job",
                time.as_secs_f64() * 1000.0 / graph.specs.len() as f64
            ),
        });
    }
    Ok(figures)
}

/// The name of the coordinator's consumer of results, once it has one.
async fn results_consumer(stream: &async_nats::jetstream::stream::Stream) -> Option<String> {
    use futures::TryStreamExt;
    let names: Vec<String> = stream.consumer_names().try_collect().await.ok()?;
    names
        .into_iter()
        .find(|name| ax_actors::bench::DAG_RESULTS.includes(name))
}
