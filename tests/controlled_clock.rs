//! Misfire and overlap policies with a clock the test sets: the actors run in this process on a
//! [`ManualClock`], so "five minutes without a Scheduler" takes no time and every tick is exact.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ax_actors::ManualClock;
use ax_actors::WorkerConfig;
use ax_actors::{parse_roles, Node, NodeConfig};
use ax_bus::instance::Trigger;
use ax_bus::messages::{JobRecord, TickOutcome};
use ax_bus::spec::JobDocument;
use ax_bus::{AxClient, State, Tag};
use chrono::{DateTime, Utc};
use support::*;

fn at(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .with_timezone(&Utc)
}

/// Starts the actors of `roles` on `clock` and waits until the Scheduler has loaded `jobs` jobs
/// (so that none is planned from a later clock than the test means).
async fn start(
    client: &AxClient,
    roles: &str,
    clock: &ManualClock,
    dir: &std::path::Path,
    jobs: usize,
) -> Node {
    let (loaded_tx, mut loaded) = tokio::sync::watch::channel(None);
    let node = Node::start(
        client.clone(),
        NodeConfig {
            worker: WorkerConfig {
                slots: 1,
                ..WorkerConfig::new(support::node("clocked"), dir.to_path_buf())
            },
            scheduler_loaded: Some(loaded_tx),
            max_clock_skew: None,
            ..NodeConfig::new(
                support::node("clocked"),
                parse_roles(roles).unwrap(),
                dir.to_path_buf(),
            )
        },
        Arc::new(clock.clone()),
    )
    .unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        loaded.wait_for(|n| *n == Some(jobs)),
    )
    .await
    .expect("the Scheduler loads the registry")
    .expect("the Scheduler is running");
    node
}

/// Writes jobs straight into the registry (their validation is not what these tests are about),
/// as defined at the start of the tests' day (the Schedulers' clock).
async fn store(client: &AxClient, yaml: &str) -> usize {
    let docs: Vec<JobDocument> = serde_saphyr::from_multiple(yaml).unwrap();
    for doc in &docs {
        let record = JobRecord {
            spec: doc.job.clone(),
            paused: false,
            updated_at: at("2026-01-01T00:00:00Z"),
            defined_at: None,
        };
        client
            .jobs
            .put(&doc.job.name, ax_bus::codec::encode(&record).unwrap())
            .await
            .unwrap();
    }
    docs.len()
}

/// job → tick time → outcomes recorded for it.
async fn ticks_of(client: &AxClient, job: &str) -> BTreeMap<String, Vec<TickOutcome>> {
    let mut out: BTreeMap<String, Vec<TickOutcome>> = BTreeMap::new();
    for record in client.ticks(&support::job(job), 1000).await.unwrap() {
        out.entry(record.tick.format("%H:%M").to_string())
            .or_default()
            .push(record.outcome);
    }
    out
}

fn minutely(name: &str, extra: &str) -> String {
    format!("version: v1\njob:\n  name: {name}\n  cron: '0 * * * * *'\n{extra}  exec: {{ type: shell, command: 'true' }}\n")
}

#[actix::test]
async fn missed_minutes_follow_each_misfire_policy() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let clock = ManualClock::new(at("2026-01-01T00:00:30Z"));
    let jobs = store(
        &client,
        &[
            minutely("all", "  misfire: fire_all\n  catchup_window: 600\n"),
            minutely("once", "  misfire: fire_once\n"),
            minutely("none", "  misfire: skip\n"),
        ]
        .join("---\n"),
    )
    .await;
    let first = start(&client, "scheduler", &clock, &nats.path("a"), jobs).await;
    clock.set(at("2026-01-01T00:01:00.200Z"));
    for job in ["all", "once", "none"] {
        wait_for(
            Duration::from_secs(10),
            &format!("{job} at 00:01"),
            || async {
                ticks_of(&client, job)
                    .await
                    .contains_key("00:01")
                    .then_some(())
            },
        )
        .await;
    }
    // A graceful stop: the partitions are handed over, saying the tick they were fired
    // through; so long after, that says nothing of the ticks since — the misfire policy decides.
    first.hand_over().await;
    first.stop();

    // Four and a half minutes pass with no Scheduler: 00:02 to 00:05 are missed.
    clock.set(at("2026-01-01T00:05:30Z"));
    let _second = start(&client, "scheduler", &clock, &nats.path("b"), jobs).await;
    let expect = |job: &'static str, outcomes: [TickOutcome; 4]| {
        let client = client.clone();
        async move {
            let ticks = ticks_of(&client, job).await;
            let got: Vec<TickOutcome> = ["00:02", "00:03", "00:04", "00:05"]
                .iter()
                .filter_map(|m| ticks.get(*m).and_then(|o| o.first().copied()))
                .collect();
            (got == outcomes).then_some(())
        }
    };
    use TickOutcome::{CaughtUp, Skipped};
    wait_for(Duration::from_secs(10), "fire_all to catch up four", || {
        expect("all", [CaughtUp; 4])
    })
    .await;
    wait_for(
        Duration::from_secs(10),
        "fire_once to catch up the last",
        || expect("once", [Skipped, Skipped, Skipped, CaughtUp]),
    )
    .await;
    wait_for(Duration::from_secs(10), "skip to skip all", || {
        expect("none", [Skipped; 4])
    })
    .await;
    let caught: Vec<_> = instances(&client, "all")
        .await
        .into_iter()
        .filter(|r| r.trigger == Trigger::CatchUp)
        .map(|r| r.expected_time.format("%H:%M").to_string())
        .collect();
    assert_eq!(caught, ["00:02", "00:03", "00:04", "00:05"]);
    assert_eq!(instances(&client, "none").await.len(), 1);

    // And time goes on as usual.
    clock.set(at("2026-01-01T00:06:00.200Z"));
    wait_for(Duration::from_secs(10), "the 00:06 fire", || async {
        let ticks = ticks_of(&client, "none").await;
        (ticks.get("00:06") == Some(&vec![TickOutcome::Fired])).then_some(())
    })
    .await;
}

#[actix::test]
async fn a_job_its_scheduler_never_fired_catches_up_from_its_definition() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let clock = ManualClock::new(at("2026-01-01T00:00:30Z"));
    // Defined at 00:00; its Scheduler stops before its first fire, leaving no tick recorded
    // (as an owner killed before its first tick would).
    let jobs = store(
        &client,
        &minutely(
            "fresh",
            "  misfire: fire_all
  catchup_window: 600
",
        ),
    )
    .await;
    let first = start(&client, "scheduler", &clock, &nats.path("a"), jobs).await;
    first.stop();
    assert!(ticks_of(&client, "fresh").await.is_empty());

    // Taken again three and a half minutes later: 00:01 to 00:03 were missed.
    clock.set(at("2026-01-01T00:03:30Z"));
    let _second = start(&client, "scheduler", &clock, &nats.path("b"), jobs).await;
    wait_for(
        Duration::from_secs(10),
        "00:01 to 00:03 caught up",
        || async {
            let ticks = ticks_of(&client, "fresh").await;
            let caught: Vec<&str> = ["00:01", "00:02", "00:03"]
                .into_iter()
                .filter(|m| {
                    ticks
                        .get(*m)
                        .is_some_and(|o| o.contains(&TickOutcome::CaughtUp))
                })
                .collect();
            (caught.len() == 3).then_some(())
        },
    )
    .await;
    assert_eq!(instances(&client, "fresh").await.len(), 3);
}

#[actix::test]
async fn a_fire_over_a_running_instance_follows_the_overlap_policy() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let clock = ManualClock::new(at("2026-01-01T00:00:30Z"));
    // No worker: every instance stays running, so each fire meets the previous one.
    let jobs = store(
        &client,
        &[
            minutely("allow", ""),
            minutely("skipper", "  overlap: skip\n"),
            minutely("queued", "  overlap: queue\n"),
            minutely("latest", "  overlap: cancel_previous\n"),
        ]
        .join("---\n"),
    )
    .await;
    let _node = start(&client, "scheduler,dag", &clock, &nats.path("a"), jobs).await;
    for minute in ["00:01", "00:02", "00:03"] {
        clock.set(at(&format!("2026-01-01T{minute}:00.200Z")));
        for job in ["allow", "skipper", "queued", "latest"] {
            wait_for(
                Duration::from_secs(10),
                &format!("{job} at {minute}"),
                || async {
                    ticks_of(&client, job)
                        .await
                        .contains_key(minute)
                        .then_some(())
                },
            )
            .await;
        }
    }
    let states = |job: &'static str| {
        let client = client.clone();
        async move {
            instances(&client, job)
                .await
                .into_iter()
                .map(|r| (r.expected_time.format("%H:%M").to_string(), r.state, r.tag))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(states("allow").await.len(), 3);
    assert_eq!(states("skipper").await.len(), 1);
    let skipped = ticks_of(&client, "skipper").await;
    assert_eq!(skipped["00:02"], [TickOutcome::Skipped]);
    assert_eq!(skipped["00:03"], [TickOutcome::Skipped]);
    // Queued: the later two wait behind the first.
    let queued = wait_for(Duration::from_secs(10), "queued ones to wait", || async {
        let all = states("queued").await;
        all[1..]
            .iter()
            .all(|(_, _, tag)| *tag == Tag::WaitingDeps)
            .then_some(all)
    })
    .await;
    assert_eq!(queued.len(), 3);
    // cancel_previous: only the newest is still running.
    let latest = states("latest").await;
    assert_eq!(
        latest,
        [
            ("00:01".into(), State::Cancelled, Tag::Superseded),
            ("00:02".into(), State::Cancelled, Tag::Superseded),
            ("00:03".into(), State::Running, Tag::Queued),
        ]
    );
}
