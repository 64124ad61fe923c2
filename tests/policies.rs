//! Misfire and overlap policies, and the tick history that records what became of every tick.

use crate::support;

use std::time::Duration;

use ax_bus::instance::Trigger;
use ax_bus::messages::TickOutcome;
use ax_bus::{AxClient, InstanceRecord, State, Tag};
use support::*;

fn every_second(name: &str, extra: &str, command: &str) -> String {
    format!(
        "version: v1\njob:\n  name: {name}\n  cron: '* * * * * *'\n{extra}  exec: {{ type: shell, command: '{command}' }}\n"
    )
}

async fn ticks(client: &AxClient, job: &str) -> Vec<ax_bus::messages::TickRecord> {
    client
        .ticks(&support::job(job), 1000)
        .await
        .expect("read ticks")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missed_ticks_follow_each_misfire_policy() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _core = AxProcess::node(&nats, "core", "dag,router,worker", &["--slots", "8"]);
    let mut scheduler = AxProcess::node(&nats, "s1", "scheduler", &[]);
    let jobs = [
        every_second("all", "  misfire: fire_all\n  catchup_window: 60\n", "true"),
        every_second("once", "  misfire: fire_once\n", "true"),
        every_second("none", "  misfire: skip\n", "true"),
    ]
    .join("---\n");
    apply_job(&nats, "misfire", &jobs).await;
    for job in ["all", "once", "none"] {
        wait_for(
            Duration::from_secs(20),
            &format!("{job} to tick"),
            || async { (ticks(&client, job).await.len() >= 2).then_some(()) },
        )
        .await;
    }
    scheduler.kill9();
    // The ticks the outage misses are the ones after the last tick recorded before it: a tick
    // that passed between a job's definition and the Scheduler taking its partition is caught up
    // too, and is not this test's business.
    let mut recorded_before = std::collections::HashMap::new();
    for job in ["all", "once", "none"] {
        let last = ticks(&client, job).await.iter().map(|t| t.tick).max();
        recorded_before.insert(job, last.expect("ticks before the outage"));
    }
    // The outage: for these three seconds no Scheduler runs.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let _scheduler = AxProcess::node(&nats, "s1", "scheduler", &[]);

    let missed = |job: &'static str| {
        let client = client.clone();
        let after = recorded_before[job];
        async move {
            let records = ticks(&client, job).await;
            let missed: Vec<_> = records
                .into_iter()
                .filter(|t| t.tick > after)
                .filter(|t| t.outcome == TickOutcome::CaughtUp || t.reason.starts_with("missed"))
                .collect();
            (missed.len() >= 2).then_some(missed)
        }
    };
    // fire_all: every missed tick runs, recorded as caught up, with no gap in the instances.
    // The catch-up goes on while it is read: the ticks and the instances are compared once
    // both have come to the same count (each tick is recorded as its instance is created).
    let (all, records) = wait_for(Duration::from_secs(20), "all to catch up", || async {
        let all = missed("all").await?;
        let records = instances(&client, "all").await;
        let caught = records
            .iter()
            .filter(|r| r.trigger == Trigger::CatchUp && r.expected_time > recorded_before["all"])
            .count();
        (caught == all.len()).then_some((all, records))
    })
    .await;
    assert!(
        all.iter().all(|t| t.outcome == TickOutcome::CaughtUp),
        "{all:?}"
    );
    for pair in records.windows(2) {
        assert_eq!(
            pair[1].expected_time - pair[0].expected_time,
            chrono::Duration::seconds(1)
        );
    }
    // fire_once: the latest missed tick runs, the others are skipped.
    let once = wait_for(Duration::from_secs(20), "once to catch up", || {
        missed("once")
    })
    .await;
    let caught_up: Vec<_> = once
        .iter()
        .filter(|t| t.outcome == TickOutcome::CaughtUp)
        .collect();
    assert_eq!(caught_up.len(), 1, "{once:?}");
    assert!(once
        .iter()
        .all(|t| t.outcome == TickOutcome::CaughtUp || t.tick < caught_up[0].tick));
    assert!(once.iter().any(|t| t.reason.contains("fire_once")));
    // skip: nothing runs, every missed tick is recorded as skipped.
    let none = wait_for(Duration::from_secs(20), "none to record", || missed("none")).await;
    assert!(none
        .iter()
        .all(|t| t.outcome == TickOutcome::Skipped && t.reason.contains("skip")));
    assert!(instances(&client, "none")
        .await
        .iter()
        .all(|r| r.trigger == Trigger::Cron));

    // The CLI shows the history.
    let out = ax(&nats.url(), &["job", "history", "once", "--json"]);
    let history: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let outcomes: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["outcome"].as_str().unwrap())
        .collect();
    assert!(
        outcomes.contains(&"fired")
            && outcomes.contains(&"caught_up")
            && outcomes.contains(&"skipped")
    );
}

/// Whether any two executions of `records` overlapped in time.
fn overlapping(records: &[InstanceRecord]) -> bool {
    let mut runs: Vec<_> = records
        .iter()
        .filter_map(|r| Some((r.started_at?, r.finished_at?)))
        .collect();
    runs.sort();
    runs.windows(2).any(|w| w[1].0 < w[0].1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fire_while_the_previous_instance_runs_follows_the_overlap_policy() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &["--slots", "16"]);
    let jobs = [
        every_second("allow", "", "sleep 2.5"),
        every_second("skipper", "  overlap: skip\n", "sleep 2.5"),
        every_second("queued", "  overlap: queue\n", "sleep 1.5"),
        every_second("latest", "  overlap: cancel_previous\n", "sleep 2.5"),
    ]
    .join("---\n");
    apply_job(&nats, "overlap", &jobs).await;
    wait_for(
        Duration::from_secs(30),
        "3 finished queued instances",
        || async {
            let done = instances(&client, "queued")
                .await
                .iter()
                .filter(|r| r.state == State::Success)
                .count();
            (done >= 3).then_some(())
        },
    )
    .await;
    for job in ["allow", "skipper", "queued", "latest"] {
        assert!(ax(&nats.url(), &["job", "pause", job]).status.success());
    }

    let allow = instances(&client, "allow").await;
    assert!(overlapping(&allow), "allow should let runs overlap");

    let skipper = instances(&client, "skipper").await;
    assert!(!overlapping(&skipper), "skip let runs overlap");
    let skipped = ticks(&client, "skipper").await;
    assert!(skipped
        .iter()
        .any(|t| t.outcome == TickOutcome::Skipped && t.reason.contains("overlap skip")));

    let queued: Vec<InstanceRecord> = instances(&client, "queued")
        .await
        .into_iter()
        .filter(|r| r.state == State::Success)
        .collect();
    assert!(!overlapping(&queued), "queue let runs overlap");
    assert!(ticks(&client, "queued")
        .await
        .iter()
        .all(|t| t.outcome != TickOutcome::Skipped || t.reason == "paused"));

    let latest = instances(&client, "latest").await;
    // Only `allow` fires are written ahead of their instants: the other policies judge the
    // previous instance as it is at the instant, and create after it.
    assert!(
        allow.iter().any(|r| r.created_at < r.expected_time),
        "{allow:#?}"
    );
    let others = [&skipper, &latest].into_iter().flatten();
    for record in others.chain(&queued) {
        assert!(record.created_at >= record.expected_time, "{record:#?}");
    }
    let superseded = latest.iter().filter(|r| r.tag == Tag::Superseded).count();
    assert!(superseded >= 2, "{latest:#?}");
    assert!(latest
        .iter()
        .filter(|r| r.tag == Tag::Superseded)
        .all(|r| r.state == State::Cancelled && r.message.starts_with("superseded by latest.")));
}

/// A Scheduler killed says nothing more; the one that takes its partitions counts their missed
/// ticks from the instant the dead one last said its fires were settled (`fired.<node>` in the
/// partitions bucket), not from each job's definition: the tick ledger has no record of the
/// ticks fired on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missed_ticks_after_a_kill_are_counted_from_what_the_dead_scheduler_had_settled() {
    let nats = TestNats::start();
    let client = nats.client().await;
    set_up(&nats.url()).await;
    let _core = AxProcess::node(&nats, "core", "dag,router,worker", &["--slots", "8"]);
    let mut scheduler = AxProcess::node(&nats, "s1", "scheduler", &[]);
    // s1 says how far it has settled its partitions once they are loaded, that of the job too.
    let p = ax_bus::partition::of("old", ax_bus::partition::DEFAULT_COUNT);
    let settled = |after: chrono::DateTime<chrono::Utc>| {
        let client = client.clone();
        async move {
            let value = client
                .partitions
                .get(ax_bus::partition::fired_key(&support::node("s1")))
                .await
                .ok()??;
            let fired: ax_bus::partition::FiredThrough = ax_bus::codec::decode(&value).ok()?;
            (fired.partitions.contains(&p) && fired.through >= after).then_some(fired.through)
        }
    };
    let loaded = chrono::DateTime::<chrono::Utc>::MIN_UTC;
    wait_for(Duration::from_secs(20), "s1 to load", || settled(loaded)).await;
    // Then a job defined two hours ago is written straight into the registry: counted from
    // its definition, its missed ticks would be thousands, all skipped.
    let yaml = every_second("old", "  misfire: skip\n", "true");
    let doc: ax_bus::spec::JobDocument = serde_saphyr::from_str(&yaml).unwrap();
    let record = ax_bus::messages::JobRecord {
        spec: doc.job,
        paused: false,
        updated_at: chrono::Utc::now() - chrono::Duration::hours(2),
        defined_at: None,
    };
    client
        .jobs
        .put("old", ax_bus::codec::encode(&record).unwrap())
        .await
        .unwrap();
    let firing = wait_for(Duration::from_secs(20), "old to fire", || async {
        let records = instances(&client, "old").await;
        (records.len() >= 3).then(|| records[0].expected_time)
    })
    .await;
    let settled = wait_for(Duration::from_secs(10), "s1 to settle its fires", || {
        settled(firing)
    })
    .await;

    scheduler.kill9();
    let last_fired = instances(&client, "old")
        .await
        .iter()
        .map(|r| r.expected_time)
        .max()
        .unwrap();
    // What it settled holds no tick it did not fire: the next second's is past it (it may
    // have settled a few milliseconds past its last fire, with no tick in them).
    let next_tick = last_fired + chrono::Duration::seconds(1);
    assert!(
        settled < next_tick,
        "settled through {settled}, past {next_tick}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let restarted = AxProcess::node(&nats, "s1", "scheduler", &[]);
    let skipped = wait_for(
        Duration::from_secs(30),
        "the outage's ticks skipped",
        || {
            let client = client.clone();
            async move {
                let skipped: Vec<_> = ticks(&client, "old")
                    .await
                    .into_iter()
                    .filter(|t| t.outcome == TickOutcome::Skipped)
                    .collect();
                (skipped.len() >= 2).then_some(skipped)
            }
        },
    )
    .await;
    let early: Vec<_> = skipped
        .iter()
        .filter(|t| t.tick <= last_fired)
        .map(|t| t.tick)
        .collect();
    assert!(
        early.is_empty(),
        "{} ticks skipped that had fired or came before the job first fired ({:?}, ...); log: {}",
        early.len(),
        early.first(),
        restarted.log_text()
    );
    assert!(skipped.len() < 20, "{} ticks skipped", skipped.len());
    // Fired ticks are in the history once each, from their instance records.
    let history = ticks(&client, "old").await;
    let fired: Vec<_> = history
        .iter()
        .filter(|t| t.outcome == TickOutcome::Fired)
        .map(|t| t.tick)
        .collect();
    let unique: std::collections::BTreeSet<_> = fired.iter().collect();
    assert_eq!(unique.len(), fired.len(), "{fired:?}");
    assert!(fired.iter().all(|t| *t >= firing));
}
