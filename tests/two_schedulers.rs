//! Two Schedulers on one NATS: both hold the same wheel and race for every tick; each instance is
//! created once and runs once, each tick is recorded `fired` by one Scheduler only, and when one
//! Scheduler is killed the other keeps firing with no gap.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use ax_bus::messages::{ResultMessage, TickOutcome};
use ax_bus::{codec, State};
use futures::StreamExt;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tick_is_created_and_run_once_and_a_killed_scheduler_leaves_no_gap() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let mut scheduler_a = AxProcess::node(&nats, "sa", "scheduler", &[]);
    let _scheduler_b = AxProcess::node(&nats, "sb", "scheduler", &[]);
    let _rest = AxProcess::node(&nats, "w", "dag,router,worker", &["--slots", "8"]);
    let dir = nats.path("jobs");
    let ledger = dir.join("ledger");
    let file = job_file(
        &dir,
        "tick.yaml",
        &format!(
            "version: v1\njob:\n  name: tick\n  cron: \"* * * * * *\"\n  exec:\n    type: shell\n    command: 'echo \"$AX_INSTANCE_ID\" >> {}'\n",
            ledger.display()
        ),
    );
    let out = ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));

    let count_success = |n: usize| {
        let client = client.clone();
        async move {
            let ok = instances(&client, "tick")
                .await
                .into_iter()
                .filter(|r| r.state == State::Success)
                .count();
            (ok >= n).then_some(())
        }
    };
    wait_for(Duration::from_secs(20), "4 ticks", || count_success(4)).await;
    scheduler_a.kill9();
    let after_kill = instances(&client, "tick").await.len();
    wait_for(
        Duration::from_secs(20),
        "4 more ticks after the kill",
        || count_success(after_kill + 4),
    )
    .await;

    // Every expected second between the first and the last instance exists: no gap.
    let records = instances(&client, "tick").await;
    let times: Vec<_> = records.iter().map(|r| r.expected_time).collect();
    for pair in times.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            chrono::Duration::seconds(1),
            "gap or duplicate between {} and {}",
            pair[0],
            pair[1]
        );
    }

    // Each finished instance ran exactly once (the ledger is written by the job itself) …
    let finished: Vec<_> = records
        .iter()
        .filter(|r| r.state == State::Success)
        .collect();
    let ledger_text = std::fs::read_to_string(&ledger).unwrap();
    let mut runs: BTreeMap<&str, usize> = BTreeMap::new();
    for line in ledger_text.lines() {
        *runs.entry(line).or_default() += 1;
    }
    for record in &finished {
        assert_eq!(
            runs.get(record.instance_id.as_str()),
            Some(&1),
            "{} ran {:?} times",
            record.instance_id,
            runs.get(record.instance_id.as_str())
        );
    }
    assert!(
        runs.values().all(|n| *n == 1),
        "an instance ran twice: {runs:?}"
    );

    // … and produced exactly one result message.
    let stream = client.js.get_stream("AX_RESULTS").await.unwrap();
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            filter_subject: "ax.result.tick".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut batch = consumer
        .fetch()
        .max_messages(1000)
        .expires(Duration::from_secs(1))
        .messages()
        .await
        .unwrap();
    let mut results: BTreeMap<String, usize> = BTreeMap::new();
    while let Some(Ok(message)) = batch.next().await {
        let result: ResultMessage = codec::decode(&message.payload).unwrap();
        *results.entry(result.instance_id.to_string()).or_default() += 1;
    }
    for record in &finished {
        assert_eq!(
            results.get(record.instance_id.as_str()),
            Some(&1),
            "results of {}",
            record.instance_id
        );
    }

    // The tick records say the same: the winner of each tick recorded it `fired`, the other
    // Scheduler (while it lived) `deduplicated` — never both `fired`. Only the tick the kill
    // interrupted may lack its `fired` record (the winner died before writing it).
    let ticks = client.ticks(&support::job("tick"), 1000).await.unwrap();
    let mut unfired = Vec::new();
    for record in &finished {
        let of_tick = |outcome: TickOutcome| {
            ticks
                .iter()
                .filter(|t| t.tick == record.expected_time && t.outcome == outcome)
                .map(|t| t.node.to_string())
                .collect::<Vec<_>>()
        };
        let fired = of_tick(TickOutcome::Fired);
        assert!(
            fired.len() <= 1,
            "{} fired by {fired:?}",
            record.expected_time
        );
        if fired.is_empty() {
            unfired.push(record.expected_time);
        }
    }
    assert!(
        unfired.len() <= 1,
        "ticks without a fired record: {unfired:?}"
    );
    assert!(
        ticks.iter().any(|t| t.outcome == TickOutcome::Deduplicated),
        "no Scheduler recorded a lost race: {ticks:?}"
    );
}
