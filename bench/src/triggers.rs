//! Triggers from business services, on the control subject:
//!
//! - keyed no-op triggers sent by a client, pipelined, run end to end — from the first publish
//!   to the last success result — in instances per second, beside the raw JetStream limit and
//!   the cron path's figure (section `throughput`);
//! - pending delayed instances (due in a day), accepted by a Scheduler process of its own: what
//!   they cost its memory, and how long a new Scheduler process takes to answer commands after
//!   a kill -9 with them pending. The wait lives in JetStream (a message schedule each), so
//!   neither should grow with their number.

use std::time::{Duration, Instant};

use crate::process::NodeProcess;
use crate::{bail, Result};

use ax_bus::client::ClientError;
use ax_bus::messages::TriggerRequest;
use ax_bus::AxClient;

use crate::{
    client_for, commands_done, keyed_trigger, manual_job, messages_so_far, send_triggers,
    start_node, store_jobs, successes, Figure,
};

pub(crate) async fn measure(url: &str, quick: bool, raw: f64) -> Result<Vec<Figure>> {
    let mut figures = keyed(url, quick, raw).await?;
    figures.extend(pending(url, quick).await?);
    Ok(figures)
}

async fn keyed(url: &str, quick: bool, raw: f64) -> Result<Vec<Figure>> {
    let n = if quick { 1_000 } else { 20_000 };
    let client = client_for(url, "kt").await?;
    // The business service's own connection.
    let service = client_for(url, "kt").await?;
    store_jobs(&client, &[manual_job("kt")]).await?;
    let scratch = tempfile::tempdir()?;
    let node = start_node(&client, "all", 512, scratch.path()).await?;
    let mut results = client
        .nats
        .subscribe(client.subjects().result_all())
        .await?;
    let (sent_before, received_before) = messages_so_far(&client);
    let triggers = (0..n)
        .map(|i| keyed_trigger("kt", &format!("order-{i}"), None))
        .collect::<Result<Vec<_>>>()?;
    let started = Instant::now();
    send_triggers(&service, triggers.into_iter()).await?;
    successes("triggers", &mut results, n, Duration::from_secs(300)).await?;
    let seconds = started.elapsed().as_secs_f64();
    let (sent, received) = messages_so_far(&client);
    let (sent, received) = (sent - sent_before, received - received_before);
    node.stop();
    let rate = n as f64 / seconds;
    Ok(vec![
        Figure {
            section: "triggers",
            name: "keyed triggers end to end".into(),
            value: rate,
            unit: "inst/s",
            note: format!(
                "{n} keyed no-op triggers sent pipelined on the control subject, all final in \
                 {seconds:.2} s; {:.1}% of the raw limit",
                100.0 * rate / raw
            ),
        },
        Figure {
            section: "triggers",
            name: "messages per keyed instance".into(),
            value: (sent + received) as f64 / n as f64,
            unit: "msg",
            note: format!(
                "the nodes' side: {:.1} sent + {:.1} received (the service's publishes apart)",
                sent as f64 / n as f64,
                received as f64 / n as f64
            ),
        },
    ])
}

async fn pending(url: &str, quick: bool) -> Result<Vec<Figure>> {
    let n: usize = if quick { 5_000 } else { 1_000_000 };
    let client = client_for(url, "pd").await?;
    store_jobs(&client, &[manual_job("pd")]).await?;
    let scratch = tempfile::tempdir()?;
    let scheduler = NodeProcess::start(url, "pd", "pd-scheduler", "scheduler", scratch.path())?;
    answers(&client, &scheduler).await?;
    let before = scheduler.resident_bytes()?;
    let due = ax_bus::time::now() + chrono::Duration::days(1);
    for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
        let triggers = chunk
            .iter()
            .map(|i| keyed_trigger("pd", &format!("p{i}"), Some(due)))
            .collect::<Result<Vec<_>>>()?;
        send_triggers(&client, triggers.into_iter()).await?;
        // The control stream holds a day of commands at most; keep it short.
        commands_done(&client, Duration::from_secs(600)).await?;
    }
    let after = scheduler.resident_bytes()?;
    drop(scheduler);
    let restarted = Instant::now();
    let scheduler = NodeProcess::start(url, "pd", "pd-scheduler", "scheduler", scratch.path())?;
    answers(&client, &scheduler).await?;
    let ready = restarted.elapsed();
    let idle = scheduler.resident_bytes()?;
    // What they cost a Scheduler that holds them pending: a fresh process's memory beside the
    // first one's before any was sent (the growth while accepting them is working memory).
    let per_instance = idle.saturating_sub(before) as f64 / n as f64;
    Ok(vec![
        Figure {
            section: "triggers",
            name: "memory per pending delayed instance".into(),
            value: per_instance,
            unit: "B",
            note: format!(
                "{n} delayed triggers due in a day: a Scheduler process's RSS {} MiB before \
                 them, {} MiB once restarted with them pending ({} MiB while accepting them)",
                before >> 20,
                idle >> 20,
                after >> 20
            ),
        },
        Figure {
            section: "triggers",
            name: "Scheduler ready with them pending".into(),
            value: ready.as_secs_f64() * 1000.0,
            unit: "ms",
            note: format!(
                "kill -9, then a new Scheduler process answering commands, {n} delayed \
                 instances pending"
            ),
        },
    ])
}

/// Waits until `scheduler` answers a command (a trigger of a job that does not exist).
async fn answers(client: &AxClient, scheduler: &NodeProcess) -> Result<()> {
    let probe = TriggerRequest {
        name: "no-such-job".parse()?,
        biz_date: None,
        params: Default::default(),
        key: None,
        at: None,
        delay: None,
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        // Any answer, a refusal too, says the Scheduler is there.
        match client.send(&probe, Duration::from_millis(500)).await {
            Ok(_)
            | Err(ClientError::Refused(_) | ClientError::Denied(_) | ClientError::Malformed(_)) => {
                return Ok(())
            }
            Err(_) => {}
        }
        if Instant::now() > deadline {
            bail!(
                "triggers: the Scheduler process (pid {}) did not answer in 120 s",
                scheduler.pid()
            );
        }
    }
}
