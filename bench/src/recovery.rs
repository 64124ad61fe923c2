//! Recovery: how long a Scheduler that starts (or restarts) takes to be ready — job registry
//! loaded, every next fire in its wheel — with many jobs and instance records in JetStream.
//! Instance records are not read at start (the Scheduler needs only the registry and the last
//! tick of each job), so their number should not matter; the figure shows it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{bail, Result};
use actix::{Arbiter, Supervisor};
use ax_bus::ids::NodeId;

use ax_actors::jetstream::publish::AckWindow;
use ax_actors::NewInstance;
use ax_actors::Partitions;
use ax_actors::Scheduler;
use ax_actors::SystemClock;
use ax_bus::instance::Trigger;

use crate::{client_for, noop_job, put, store_jobs, Figure};

pub(crate) async fn measure(url: &str, quick: bool) -> Result<Vec<Figure>> {
    let (jobs, records) = if quick {
        (2_000, 20_000)
    } else {
        (100_000, 1_000_000)
    };
    let client = client_for(url, "rc").await?;
    let specs: Vec<_> = (0..jobs)
        .map(|i| noop_job(&format!("r{i}"), "0 0 3 * * *"))
        .collect();
    store_jobs(&client, &specs).await?;
    let template = NewInstance::new(
        &specs[0],
        ax_bus::time::now(),
        "2026-01-01".into(),
        Default::default(),
        Trigger::Cron,
        ax_bus::time::now(),
    );
    let mut acks = AckWindow::new(1024);
    for i in 0..records {
        let mut record = template.record.clone();
        record.instance_id = format!("r{}.{:020}", i % jobs, i).parse()?;
        record.job = format!("r{}", i % jobs).parse()?;
        let bucket = client.layout.instances_bucket();
        put(&mut acks, &client, &bucket, &record.instance_id, &record).await?;
    }
    acks.flush().await?;
    let (loaded_tx, mut loaded) = tokio::sync::watch::channel(None);
    let arbiter = Arbiter::new();
    let scheduler_client = client.clone();
    let bench_node: NodeId = "bench".parse()?;
    let started = Instant::now();
    let (partitions, keeper) = Partitions::new(
        client.clone(),
        bench_node.clone(),
        ax_bus::partition::DEFAULT_COUNT,
        None,
    );
    arbiter.spawn(keeper);
    // Held while it runs: actix restarts an actor only while an address of it lives, and one
    // whose lead failed holds none of its own.
    let _actor = Supervisor::start_in_arbiter(&arbiter.handle(), move |_| {
        Scheduler::new(
            scheduler_client,
            Arc::new(SystemClock),
            bench_node.clone(),
            partitions,
        )
        .reporting_load(loaded_tx)
    });
    let ready =
        tokio::time::timeout(Duration::from_secs(300), loaded.wait_for(|l| l.is_some())).await;
    let elapsed = started.elapsed();
    arbiter.stop();
    let _ = arbiter.join();
    match ready {
        Ok(Ok(count)) if *count == Some(jobs) => {}
        _ => bail!("recovery: the Scheduler did not load {jobs} jobs"),
    }
    Ok(vec![Figure {
        section: "recovery",
        name: "Scheduler ready after a restart".into(),
        value: elapsed.as_secs_f64() * 1000.0,
        unit: "ms",
        note: format!("{jobs} jobs, {records} instance records"),
    }])
}
