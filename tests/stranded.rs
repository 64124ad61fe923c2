//! The consistency sweep: an open instance whose next step nobody owns — its message lost, its
//! worker forgotten, its retry message gone — is alerted (`stranded`) and resumed within 30 s
//! (45 s for a first attempt never handed on).
//! The strandings are made by hand (records written with nothing behind them), as a lost
//! message or a broken rule would leave them; the node runs a Router and a worker only, so
//! that no Scheduler's orphan watch gets there first.

use crate::support;

use std::time::Duration;

use ax_bus::ids::WorkerId;
use ax_bus::instance::Trigger;
use ax_bus::{InstanceRecord, State, Tag};
use support::*;

/// A record of job `name` (a shell `true`, applied through a Scheduler that is stopped
/// afterwards) as its first attempt would be, now.
async fn record_of(nats: &TestNats, client: &ax_bus::AxClient, name: &str) -> InstanceRecord {
    let mut scheduler = AxProcess::node(nats, "applier", "scheduler", &[]);
    apply_job(
        nats,
        name,
        &format!("version: v1\njob:\n  name: {name}\n  retry: {{ times: 2, interval: 1 }}\n  exec: {{ type: shell, command: 'true' }}\n"),
    )
    .await;
    scheduler.terminate(Duration::from_secs(10));
    let (job, _) = client.job(&support::job(name)).await.unwrap().unwrap();
    let now = ax_bus::time::now();
    InstanceRecord::first(
        &job.spec,
        now,
        now.format("%Y-%m-%d").to_string(),
        Default::default(),
        Trigger::Manual,
        now,
    )
}

/// Waits for the record to succeed and for a `stranded` alert about it; returns the record.
async fn resumed(
    client: &ax_bus::AxClient,
    record: &InstanceRecord,
    node: &AxProcess,
) -> InstanceRecord {
    let id = record.instance_id.clone();
    let done = wait_for_logged(
        Duration::from_secs(90),
        "the stranded instance to be resumed and succeed",
        &[node],
        || async {
            let (record, _) = client.instance(&id).await.ok()??;
            (record.state == State::Success).then_some(record)
        },
    )
    .await;
    let alerts = alerts_of(client, "stranded").await;
    let about: Vec<_> = alerts
        .iter()
        .filter(|a| a.instance.as_ref() == Some(&id))
        .collect();
    assert_eq!(about.len(), 1, "{alerts:?}");
    assert_eq!(about[0].node.as_str(), "n1");
    done
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_instance_whose_message_was_lost_is_resumed() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "router,worker", &[]);
    let record = record_of(&nats, &client, "lost-message").await;
    // The record, and no created, ready or dispatch message: as if the broker lost it.
    assert!(client.create_instance(&record).await.unwrap());
    let done = resumed(&client, &record, &node).await;
    assert_eq!((done.attempt, &done.trace_id), (1, &record.trace_id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_record_written_without_its_state_header_is_resumed() {
    // The sweep follows the headers of the record writes, which name the state; a write that
    // does not (an earlier version's, a foreign writer's) is read once it stayed unchanged.
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "router,worker", &[]);
    let record = record_of(&nats, &client, "no-header").await;
    let bucket = client.layout.instances_bucket();
    let value = ax_bus::codec::encode(&record).unwrap();
    let id = record.instance_id.as_str();
    let put = client.kv_put_pipelined(&bucket, id, value).await.unwrap();
    put.await.unwrap();
    let done = resumed(&client, &record, &node).await;
    assert_eq!((done.attempt, &done.trace_id), (1, &record.trace_id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_of_a_forgotten_worker_is_lost_and_run_again() {
    forgotten_worker_lost("forgotten-worker", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_of_a_forgotten_worker_that_never_renewed_its_claim_is_lost_and_run_again() {
    // Started, and the worker gone before its first renewal wrote a claim: the record alone
    // says who ran it.
    forgotten_worker_lost("never-renewed", false).await;
}

/// An attempt executing on a worker no Router has heard of — with a claim whose lease ran out
/// (`claimed`) or none — is lost and runs again as a new attempt.
async fn forgotten_worker_lost(name: &str, claimed: bool) {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "router,worker", &[]);
    let mut record = record_of(&nats, &client, name).await;
    let ghost: WorkerId = support::node("ghost");
    if claimed {
        let dispatch = ax_bus::ids::DispatchId::random();
        let renewed = client
            .renew_claim(
                &record.trace_id,
                None,
                &dispatch,
                &ghost,
                Duration::from_millis(1),
            )
            .await
            .unwrap();
        assert!(renewed.is_some());
    }
    record.tag = Tag::Executing;
    record.worker = Some(ghost);
    record.started_at = Some(ax_bus::time::now());
    assert!(client.create_instance(&record).await.unwrap());
    let done = resumed(&client, &record, &node).await;
    assert_eq!(done.attempt, 2);
    assert_eq!(done.worker_losses, 1);
    assert_ne!(done.trace_id, record.trace_id);
    assert_eq!(done.worker.as_deref(), Some("n1"));
    let (revoked, _) = client.claim_of(&record.trace_id).await.unwrap().unwrap();
    assert!(revoked.revoked, "{revoked:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_whose_message_was_lost_runs_once_due() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "router,worker", &[]);
    let mut record = record_of(&nats, &client, "lost-retry").await;
    record.state = State::WaitingRetry;
    record.tag = Tag::ExitCode;
    record.next_attempt_at = Some(ax_bus::time::now() - chrono::Duration::seconds(1));
    assert!(client.create_instance(&record).await.unwrap());
    let done = resumed(&client, &record, &node).await;
    assert_eq!(done.attempt, 2);
    assert_ne!(done.trace_id, record.trace_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_waiting_in_its_queue_is_not_stranded() {
    // Tagged no worker: nothing can run it, its ready message waits. Not stranded, however long.
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "scheduler,dag,router", &[]);
    apply_job(
        &nats,
        "nobody",
        "version: v1\njob:\n  name: nobody\n  tags: [gpu]\n  exec: { type: shell, command: 'true' }\n",
    )
    .await;
    let id = trigger(&nats, &["nobody"]);
    wait_for(Duration::from_secs(20), "the no_worker tag", || async {
        let (record, _) = client.instance(&support::id(&id)).await.ok()??;
        (record.tag == Tag::NoWorker).then_some(())
    })
    .await;
    // Past the sweep's detection bound, with a margin.
    let until = std::time::Instant::now() + Duration::from_secs(40);
    while std::time::Instant::now() < until {
        assert!(
            alerts_of(&client, "stranded").await.is_empty(),
            "{}",
            node.log_text()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (record, _) = client.instance(&support::id(&id)).await.unwrap().unwrap();
    assert_eq!((record.state, record.tag), (State::Running, Tag::NoWorker));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranded_instance_of_a_deleted_job_is_cancelled() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "router,worker", &[]);
    let record = record_of(&nats, &client, "deleted-job").await;
    assert!(client.create_instance(&record).await.unwrap());
    client.jobs.delete("deleted-job").await.unwrap();
    let id = record.instance_id.clone();
    let done = wait_for_logged(
        Duration::from_secs(90),
        "the stranded instance of a deleted job to be cancelled",
        &[&node],
        || async {
            let (record, _) = client.instance(&id).await.ok()??;
            record.state.is_final().then_some(record)
        },
    )
    .await;
    assert_eq!((done.state, done.tag), (State::Cancelled, Tag::JobDeleted));
    assert!(
        alerts_of(&client, "stranded").await.is_empty(),
        "nothing was resumed"
    );
}
