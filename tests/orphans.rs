//! Orphans: an instance whose creator died after writing its record and before handing it on
//! is adopted by a Scheduler that found it already created, once the grace period is over —
//! it runs exactly once, and an `orphan` alert says so.
//!
//! The dying creator is played by the test: it writes the record of the job's next cron tick
//! (as a Scheduler would, with its own trace id) and hands nothing on. When the tick comes,
//! the node's Scheduler loses the create-if-absent race to that record.

mod support;

use std::time::Duration;

use chrono::{DurationRound, TimeDelta};
use futures::StreamExt;

use ax_actors::creator::NewInstance;
use ax_bus::instance::Trigger;
use ax_bus::messages::Alert;
use ax_bus::{codec, State};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_whose_creator_died_before_the_hand_off_is_adopted_once() {
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
    let (job, _) = client.job("every10").await.unwrap().unwrap();
    // The tick after next, so that the record is surely written before it comes.
    let now = ax_bus::time::now();
    let tick = now.duration_trunc(TimeDelta::seconds(10)).unwrap() + TimeDelta::seconds(20);
    let orphan = NewInstance::new(
        &job.spec,
        tick,
        tick.format("%Y-%m-%d").to_string(),
        job.spec.params.clone(),
        Trigger::Cron,
        now,
    );
    let id = orphan.record.instance_id.clone();
    let trace = orphan.record.trace_id.clone();
    client
        .instances
        .create(&id, codec::encode(&orphan.record).unwrap())
        .await
        .unwrap();

    let alert = tokio::time::timeout(Duration::from_secs(60), alerts.next())
        .await
        .expect("an orphan alert within the grace period after the tick")
        .unwrap();
    let alert: Alert = codec::decode(&alert.payload).unwrap();
    assert_eq!(alert.instance.as_deref(), Some(id.as_str()), "{alert:?}");
    assert!(alert.message.contains("adopted by n1"), "{}", alert.message);

    let record = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(record.state, State::Success, "{}", record.message);
    // The attempt that ran is the one the dead creator wrote, and it ran once.
    assert_eq!(record.trace_id, trace);
    let lines = std::fs::read_to_string(&ledger).unwrap();
    assert_eq!(
        lines
            .lines()
            .filter(|l| l.starts_with(&id))
            .collect::<Vec<_>>(),
        vec![format!("{id} {trace}")]
    );
    // Ordinary ticks raise no alert: the next one that ran did so on its own.
    wait_for(
        Duration::from_secs(30),
        "a later tick to succeed",
        || async {
            instances(&client, "every10")
                .await
                .into_iter()
                .find(|r| r.expected_time > tick && r.state == State::Success)
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
