//! Orphans: instances whose creator died after writing the record and before handing the
//! attempt on. The dying creator is played by the test: it writes the record of one of the
//! job's coming cron ticks, as a Scheduler would, and hands nothing on.
//!
//! - With the first attempt's own trace id (what any Scheduler of this version writes), the
//!   node's Scheduler, losing the create-if-absent race at the tick, holds the same attempt and
//!   hands it on at once: it runs at its time, once, and no alert is needed.
//! - With a different trace id (a creator that wrote another attempt, e.g. an older version),
//!   it is adopted after the grace period, runs once, and an `orphan` alert names it.
//! - Left by a lone Scheduler that restarts and skips the missed ticks by its misfire policy:
//!   the tick with a record is handed on, not skipped.
//! - Left by a real Scheduler killed (a failpoint) while it held a fire taken ahead of its
//!   instant: the next Scheduler hands it on and it runs once; fires taken ahead start at their
//!   instants, never before.

use crate::support;

use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use futures::StreamExt;

use ax_actors::NewInstance;
use ax_bus::ids::{InstanceId, TraceId};
use ax_bus::instance::Trigger;
use ax_bus::messages::Alert;
use ax_bus::messages::{JobRecord, TickOutcome};
use ax_bus::{codec, AxClient, State};
use support::*;

/// Writes the record of `job`'s instance at `tick` with `trace`, handing nothing on.
async fn orphan(
    client: &AxClient,
    job: &JobRecord,
    tick: DateTime<Utc>,
    trace: Option<TraceId>,
) -> (InstanceId, TraceId) {
    let mut instance = NewInstance::new(
        &job.spec,
        tick,
        tick.format("%Y-%m-%d").to_string(),
        job.spec.params.clone(),
        Trigger::Cron,
        ax_bus::time::now(),
    );
    if let Some(trace) = trace {
        instance.record.trace_id = trace;
    }
    let id = instance.record.instance_id.clone();
    client
        .instances
        .store_of(&id)
        .create(&id, codec::encode(&instance.record).unwrap())
        .await
        .unwrap();
    (id, instance.record.trace_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_whose_creator_died_before_the_hand_off_run_once() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let mut alerts = client.nats.subscribe("ax.alert.orphan").await.unwrap();
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let ledger = nats.path("files").join("ledger");
    apply_job(
        &nats,
        "every10",
        &format!(
            "version: v1\njob:\n  name: every10\n  cron: '*/10 * * * * *'\n  exec: {{ type: shell, command: 'echo $AX_INSTANCE_ID $AX_TRACE_ID >> {}' }}\n",
            ledger.display()
        ),
    )
    .await;
    let (job, _) = client.job(&support::job("every10")).await.unwrap().unwrap();
    // Ticks far enough ahead for the records to be written before they come.
    let now = ax_bus::time::now();
    let same_tick = now.duration_trunc(TimeDelta::seconds(10)).unwrap() + TimeDelta::seconds(20);
    let other_tick = same_tick + TimeDelta::seconds(10);
    let (same_id, same_trace) = orphan(&client, &job, same_tick, None).await;
    assert_eq!(same_trace, TraceId::first_of(&same_id));
    let (other_id, other_trace) = orphan(&client, &job, other_tick, Some(TraceId::random())).await;

    // The same first attempt: handed on by the Scheduler at its tick, well within the grace.
    let same = final_record(&client, &same_id, Duration::from_secs(60)).await;
    assert_eq!(
        (same.state, same.trace_id.as_str()),
        (State::Success, same_trace.as_str()),
        "{}",
        same.message
    );
    let started = same.started_at.unwrap();
    assert!(
        started < same_tick + TimeDelta::seconds(10),
        "started at {started}"
    );

    // Another attempt: adopted once the grace period is over, with an alert.
    let alert = tokio::time::timeout(Duration::from_secs(60), alerts.next())
        .await
        .expect("an orphan alert within the grace period after the tick")
        .unwrap();
    let alert: Alert = codec::decode(&alert.payload).unwrap();
    assert_eq!(
        alert.instance.as_deref(),
        Some(other_id.as_str()),
        "{alert:?}"
    );
    assert!(alert.message.contains("adopted by n1"), "{}", alert.message);
    let other = final_record(&client, &other_id, Duration::from_secs(30)).await;
    assert_eq!(
        (other.state, other.trace_id.as_str()),
        (State::Success, other_trace.as_str()),
        "{}",
        other.message
    );

    let lines = std::fs::read_to_string(&ledger).unwrap();
    for (id, trace) in [(&same_id, &same_trace), (&other_id, &other_trace)] {
        assert_eq!(
            lines
                .lines()
                .filter(|l| l.starts_with(id.as_str()))
                .collect::<Vec<_>>(),
            vec![format!("{id} {trace}")]
        );
    }
    // Ordinary ticks raise no alert.
    wait_for(
        Duration::from_secs(30),
        "a later tick to succeed",
        || async {
            instances(&client, "every10")
                .await
                .into_iter()
                .find(|r| r.expected_time > other_tick && r.state == State::Success)
        },
    )
    .await;
    assert!(
        tokio::time::timeout(Duration::from_secs(1), alerts.next())
            .await
            .is_err(),
        "a second orphan alert"
    );
}

/// The case no other Scheduler covers: the only one dies between writing a record and handing
/// it on (and recording its tick), and the job's misfire policy is `skip`. On restart, the
/// ticks it missed are skipped — but the one with a record is handed on and runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_schedulers_orphan_runs_after_its_restart_despite_misfire_skip() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let ledger = nats.path("files").join("ledger");
    let mut node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(
        &nats,
        "lonely",
        &format!(
            "version: v1\njob:\n  name: lonely\n  cron: '*/2 * * * * *'\n  misfire: skip\n  exec: {{ type: shell, command: 'echo $AX_INSTANCE_ID >> {}' }}\n",
            ledger.display()
        ),
    )
    .await;
    wait_for(Duration::from_secs(30), "a first tick to run", || async {
        instances(&client, "lonely")
            .await
            .into_iter()
            .find(|r| r.state == State::Success)
    })
    .await;
    node.kill9();
    // The record its next tick would have had, written as the dying Scheduler would have.
    let (job, _) = client.job(&support::job("lonely")).await.unwrap().unwrap();
    // Later than any fire the killed Scheduler may have taken ahead of its instant.
    let now = ax_bus::time::now() + TimeDelta::milliseconds(500);
    let orphan_tick = now.duration_trunc(TimeDelta::seconds(2)).unwrap() + TimeDelta::seconds(2);
    let (orphan_id, orphan_trace) = orphan(&client, &job, orphan_tick, None).await;
    // Two more ticks go by with no Scheduler at all.
    let skipped_tick = orphan_tick + TimeDelta::seconds(2);
    while ax_bus::time::now() < skipped_tick + TimeDelta::milliseconds(500) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let restarted = ax_bus::time::now();
    let _node = AxProcess::node(&nats, "n1", "all", &[]);

    let record = final_record(&client, &orphan_id, Duration::from_secs(60)).await;
    assert_eq!(
        (record.state, record.trace_id.as_str()),
        (State::Success, orphan_trace.as_str()),
        "{}",
        record.message
    );
    assert!(record.started_at.unwrap() >= restarted);
    // The tick after it was skipped by the policy: no instance, a `skipped` record.
    let skipped_id = InstanceId::for_fire(&support::job("lonely"), skipped_tick);
    let history = wait_for(
        Duration::from_secs(30),
        "the skipped tick's record",
        || async {
            let ticks = client.ticks(&support::job("lonely"), 100).await.ok()?;
            ticks
                .iter()
                .any(|t| t.tick == skipped_tick && t.outcome == TickOutcome::Skipped)
                .then_some(ticks)
        },
    )
    .await;
    assert!(client.instance(&skipped_id).await.unwrap().is_none());
    assert!(
        !history
            .iter()
            .any(|t| t.tick == orphan_tick && t.outcome == TickOutcome::Skipped),
        "{history:?}"
    );
    // Once, and later ticks go on as usual.
    wait_for(
        Duration::from_secs(30),
        "a tick after the restart",
        || async {
            instances(&client, "lonely")
                .await
                .into_iter()
                .find(|r| r.expected_time > restarted && r.state == State::Success)
        },
    )
    .await;
    let lines = std::fs::read_to_string(&ledger).unwrap();
    assert_eq!(lines.lines().filter(|l| orphan_id == *l).count(), 1);
}

/// A Scheduler takes a cron fire ahead of its instant: it writes the record, then holds the
/// hand-off until the instant. Killed while holding one (a failpoint: SIGKILL), it leaves a
/// record nobody hands on; the next Scheduler resumes from the tick settled before it, finds
/// the record holding the same first attempt and hands it on: it runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_killed_holding_a_fire_taken_ahead_leaves_it_to_the_next() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let doomed = AxProcess::node_with_env(
        &nats.url(),
        &nats,
        "core-1",
        "scheduler,dag,router",
        &[],
        &[("AX_FAILPOINT", "creator.held")],
    );
    let _worker = AxProcess::node(&nats, "w1", "worker", &[]);
    apply_job(
        &nats,
        "held",
        "version: v1\njob:\n  name: held\n  cron: '* * * * * *'\n  exec: { type: noop }\n",
    )
    .await;
    doomed.died_at("creator.held").await;
    let core_1 = ax_bus::ids::NodeId::parse("core-1").unwrap();
    let held: Vec<_> = instances(&client, "held")
        .await
        .into_iter()
        .filter(|r| r.created_by.as_ref() == Some(&core_1))
        .collect();
    // The fire it held was written before its instant (a tick it caught up on while it
    // loaded, if any, was written after its own).
    let taken: Vec<_> = held.iter().filter(|r| r.trigger == Trigger::Cron).collect();
    assert!(
        !taken.is_empty(),
        "no fire written by the killed Scheduler: {held:?}"
    );
    for record in taken {
        assert!(record.created_at < record.expected_time, "{record:?}");
    }

    let core = AxProcess::node(&nats, "core-2", "scheduler,dag,router", &[]);
    for record in &held {
        let done = wait_for_logged(
            Duration::from_secs(90),
            "the held instance to succeed",
            &[&core],
            || async {
                let done = client.instance(&record.instance_id).await.ok()??.0;
                (done.state == State::Success).then_some(done)
            },
        )
        .await;
        assert_eq!(
            (done.attempt, done.trace_id.as_str()),
            (1, record.trace_id.as_str()),
            "{done:?}"
        );
        let results: Vec<_> = results_of(&client, "held")
            .await
            .into_iter()
            .filter(|r| r.instance_id == record.instance_id)
            .collect();
        assert_eq!(results.len(), 1, "{results:?}");
    }
    // The next Scheduler's own fires: taken ahead, started at their instants and not before
    // (the first ones may be ticks it caught up on while it loaded, written after them).
    let core_2 = ax_bus::ids::NodeId::parse("core-2").unwrap();
    let later = wait_for(
        Duration::from_secs(30),
        "a fire the next Scheduler took ahead",
        || async {
            let done: Vec<_> = instances(&client, "held")
                .await
                .into_iter()
                .filter(|r| r.created_by.as_ref() == Some(&core_2) && r.state == State::Success)
                .collect();
            let ahead = done
                .iter()
                .any(|r| r.trigger == Trigger::Cron && r.created_at < r.expected_time);
            ahead.then_some(done)
        },
    )
    .await;
    for record in &later {
        let started = record.started_at.unwrap();
        assert!(started >= record.expected_time, "{record:?}");
    }
}
