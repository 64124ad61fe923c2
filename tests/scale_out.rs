//! Partitioned Schedulers (scale-out): three Schedulers and 300 jobs firing every second. In
//! steady state each fire is created once, by the owner of its job's partition (the tick ledger
//! shows no `deduplicated`). A Scheduler killed with SIGKILL has its partitions taken within about
//! three seconds — every tick it missed fired, even under the default `fire_once` — and,
//! restarted, takes its share back; a fourth
//! joining while those are still loading takes its share once they are loaded, and a graceful
//! stop hands it over at once. Through all of it, with
//! `misfire: fire_all`, no second of any job is lost and none is fired twice, and after the
//! restart no move makes a duplicate. A Scheduler whose clock is off hands its partitions to
//! one whose clock is good, and takes its share back once its clock is. Owners written into the
//! partitions bucket by something else (garbage, a Scheduler that never lived) are taken back.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::DeliverPolicy;
use ax_bus::client::kv_view::KvFeed;
use ax_bus::messages::{TickOutcome, TickRecord};
use ax_bus::partition::{self, PartitionId};
use ax_bus::{codec, AxClient, InstanceRecord, State};
use chrono::{DateTime, Utc};
use support::*;

const JOBS: usize = 300;
const PARTITIONS: u16 = partition::DEFAULT_COUNT;
/// How long freshly started Schedulers may take to share the partitions: a set-up step, not
/// what a test measures (two node processes starting on a loaded 2-core machine took over 30 s
/// once).
const STARTED: Duration = Duration::from_secs(90);

/// How many partitions each Scheduler owns (`None`: handed over, not taken yet).
async fn shares(client: &AxClient) -> BTreeMap<Option<String>, usize> {
    let mut shares = BTreeMap::new();
    let owners = client.partition_owners().await.unwrap_or_default();
    for p in 0..PARTITIONS {
        let owner = owners
            .get(&PartitionId(p))
            .and_then(|o| o.node.as_ref())
            .map(|n| n.to_string());
        *shares.entry(owner).or_default() += 1;
    }
    shares
}

/// Waits until `nodes` own every partition in fair shares; returns how long that took.
async fn wait_balanced(client: &AxClient, nodes: &[&str], within: Duration) -> Duration {
    let started = Instant::now();
    let n = nodes.len();
    let fair =
        |i: usize| usize::from(PARTITIONS) / n + usize::from(i < usize::from(PARTITIONS) % n);
    let mut expected: BTreeMap<Option<String>, usize> = BTreeMap::new();
    let mut sorted = nodes.to_vec();
    sorted.sort();
    for (i, node) in sorted.iter().enumerate() {
        expected.insert(Some(node.to_string()), fair(i));
    }
    wait_for(
        within,
        &format!("partitions balanced over {nodes:?}"),
        || {
            let (client, expected) = (client.clone(), expected.clone());
            async move { (shares(&client).await == expected).then_some(()) }
        },
    )
    .await;
    started.elapsed()
}

/// Every tick so far: the fired ones from the instance records, the others from the ledger.
async fn ticks(client: &AxClient) -> Vec<TickRecord> {
    let mut ticks = ledger(client).await;
    let records = client.instances(None).await.unwrap();
    ticks.extend(records.iter().filter_map(TickRecord::fired));
    ticks
}

/// Every record of the tick ledger so far.
async fn ledger(client: &AxClient) -> Vec<TickRecord> {
    let prefix = format!("{}.", client.subjects().tick_all().trim_end_matches(".>"));
    let feed = KvFeed::open_stream(
        &client.js,
        &client.layout.ticks_stream(),
        &prefix,
        ">",
        DeliverPolicy::All,
    )
    .await
    .unwrap();
    feed.history()
        .await
        .unwrap()
        .into_iter()
        .map(|(_, value)| codec::decode(&value).unwrap())
        .collect()
}

/// Waits until every one of `JOBS` jobs has a tick recorded at or after `at`.
async fn wait_fired_through(client: &AxClient, at: DateTime<Utc>) {
    wait_jobs_fired_through(client, JOBS, at).await
}

/// Waits until every one of `jobs` jobs has a tick recorded at or after `at`.
async fn wait_jobs_fired_through(client: &AxClient, jobs: usize, at: DateTime<Utc>) {
    wait_for(
        Duration::from_secs(30),
        &format!("every job fired at {at}"),
        || {
            let client = client.clone();
            async move {
                let fired: BTreeSet<String> = ticks(&client)
                    .await
                    .into_iter()
                    .filter(|t| t.tick >= at)
                    .map(|t| t.job.to_string())
                    .collect();
                (fired.len() == jobs).then_some(())
            }
        },
    )
    .await;
}

/// Writes `n` jobs `<prefix>NNN` firing every second (`fire_all`, no-op) and applies them.
fn apply_every_second(nats: &TestNats, prefix: &str, n: usize) {
    apply_every_second_with(nats, prefix, n, "  misfire: fire_all\n")
}

/// [`apply_every_second`] with `extra` lines in each spec instead of the misfire policy.
fn apply_every_second_with(nats: &TestNats, prefix: &str, n: usize, extra: &str) {
    let dir = nats.path("jobs");
    for i in 0..n {
        job_file(
            &dir,
            &format!("{prefix}{i:03}.yaml"),
            &format!("version: v1\njob:\n  name: {prefix}{i:03}\n  cron: \"* * * * * *\"\n{extra}  exec: {{ type: noop }}\n"),
        );
    }
    let out = ax(&nats.url(), &["job", "apply", "-f", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// No second lost: each of `jobs` jobs has an instance every second from its first to its last.
async fn assert_every_second(client: &AxClient, jobs: usize) {
    let mut by_job: BTreeMap<String, Vec<DateTime<Utc>>> = BTreeMap::new();
    for record in client.instances(None).await.unwrap() {
        by_job
            .entry(record.job.to_string())
            .or_default()
            .push(record.expected_time);
    }
    assert_eq!(by_job.len(), jobs);
    for (job, times) in &mut by_job {
        times.sort();
        for pair in times.windows(2) {
            assert_eq!(
                pair[1] - pair[0],
                chrono::Duration::seconds(1),
                "{job}: gap between {} and {}",
                pair[0],
                pair[1]
            );
        }
    }
}

/// No tick recorded fired (or caught up) twice; the de-duplicated ticks, for the caller.
async fn assert_fired_once(client: &AxClient) -> Vec<TickRecord> {
    let mut fired: BTreeMap<(String, DateTime<Utc>), Vec<String>> = BTreeMap::new();
    let mut deduplicated = Vec::new();
    for t in ticks(client).await {
        match t.outcome {
            TickOutcome::Fired | TickOutcome::CaughtUp => fired
                .entry((t.job.to_string(), t.tick))
                .or_default()
                .push(t.node.to_string()),
            TickOutcome::Deduplicated => deduplicated.push(t),
            _ => {}
        }
    }
    for ((job, tick), by) in &fired {
        assert_eq!(by.len(), 1, "{job} at {tick} fired by {by:?}");
    }
    deduplicated
}

fn seconds_from_now(s: i64) -> DateTime<Utc> {
    Utc::now() + chrono::Duration::seconds(s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedulers_share_the_jobs_and_hand_them_over_without_loss_or_duplicate() {
    let nats = TestNats::start();
    let mut nodes: BTreeMap<&str, AxProcess> = ["s1", "s2", "s3"]
        .into_iter()
        .map(|name| (name, AxProcess::node(&nats, name, "scheduler", &[])))
        .collect();
    let client = nats.client().await;
    // The Schedulers run before the jobs are applied: on a loaded machine their start can take
    // longer than the CLI's 30 s wait for an answer.
    wait_balanced(&client, &["s1", "s2", "s3"], STARTED).await;
    apply_every_second(&nats, "j", JOBS);

    // `ax nodes` shows each Scheduler's share (from the heartbeats, written every 5 s).
    let url = nats.url();
    wait_for(
        Duration::from_secs(30),
        "ax nodes to show the shares",
        || {
            let url = url.clone();
            async move {
                let out = ax(&url, &["nodes", "--json"]);
                let nodes: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).ok()?;
                let (mut partitions, mut jobs) = (0, 0);
                for node in &nodes {
                    let share = node.get("scheduler")?;
                    partitions += share.get("partitions")?.as_array()?.len();
                    jobs += share.get("jobs")?.as_u64()?;
                }
                (nodes.len() == 3 && partitions == usize::from(PARTITIONS) && jobs == JOBS as u64)
                    .then_some(())
            }
        },
    )
    .await;
    let table = String::from_utf8_lossy(&ax(&url, &["nodes"]).stdout).to_string();
    assert!(
        table.contains("FIRES") && table.contains("partitions, "),
        "{table}"
    );

    // Steady state: every fire by its partition's owner, none de-duplicated.
    let owners_before = client.partition_owners().await.unwrap();
    let from = seconds_from_now(2);
    let to = from + chrono::Duration::seconds(3);
    wait_fired_through(&client, to).await;
    assert_eq!(client.partition_owners().await.unwrap(), owners_before);
    let steady: Vec<TickRecord> = ticks(&client)
        .await
        .into_iter()
        .filter(|t| t.tick >= from && t.tick <= to)
        .collect();
    assert!(steady.len() >= JOBS * 3, "{} tick records", steady.len());
    for t in &steady {
        assert_eq!(t.outcome, TickOutcome::Fired, "steady state: {t:?}");
        let owner = owners_before[&partition::of(t.job.as_str(), PARTITIONS)]
            .node
            .clone();
        assert_eq!(
            owner.as_ref(),
            Some(&t.node),
            "{} fired by a non-owner",
            t.job
        );
    }

    // SIGKILL: the others take s2's partitions once its member key expires.
    nodes.get_mut("s2").unwrap().kill9();
    let taken = wait_balanced(&client, &["s1", "s3"], Duration::from_secs(30)).await;
    println!("partitions of a killed Scheduler taken after {taken:?}");
    assert!(taken < Duration::from_secs(15), "taken after {taken:?}");

    // Restarted, it takes its share back — handed over, so without a duplicate from here on.
    // Its readings of the registry end late (the hooks), so that the fourth below joins while
    // the partitions it took are still loading, their jobs read so far already firing: such a
    // partition is handed on only once it is ready, so its mark says what was fired.
    let calm_from = Utc::now();
    let restarted = AxProcess::node_with_env(
        &nats.url(),
        &nats,
        "s2",
        "scheduler",
        &[],
        &[("AX_TEST_LOAD_DELAY_SECS", "6")],
    );
    nodes.insert("s2", restarted);
    wait_balanced(&client, &["s1", "s2", "s3"], STARTED).await;
    wait_fired_through(&client, seconds_from_now(2)).await;

    // A fourth joins and takes its share; stopped gracefully, it hands it over at once.
    nodes.insert("s4", AxProcess::node(&nats, "s4", "scheduler", &[]));
    wait_balanced(&client, &["s1", "s2", "s3", "s4"], STARTED).await;
    wait_fired_through(&client, seconds_from_now(2)).await;
    let stopping = Instant::now();
    assert!(nodes
        .get_mut("s4")
        .unwrap()
        .terminate(Duration::from_secs(20))
        .is_some());
    // Handed over before the process ended, not left to expire: nothing names it any more,
    // and its member key is gone (judged by the mechanism, not by a time a loaded machine
    // can stretch).
    let owners = client.partition_owners().await.unwrap();
    let kept: Vec<_> = owners
        .iter()
        .filter(|(_, o)| o.node.as_ref().is_some_and(|n| n.as_str() == "s4"))
        .map(|(p, _)| *p)
        .collect();
    assert!(
        kept.is_empty(),
        "still owned by the stopped Scheduler: {kept:?}"
    );
    let member = client
        .leases
        .get(ax_bus::partition::member_key(&support::node("s4")))
        .await
        .unwrap();
    assert!(
        member.is_none(),
        "the stopped Scheduler's member key is still there"
    );
    let handed = wait_balanced(&client, &["s1", "s2", "s3"], Duration::from_secs(30)).await
        + stopping.elapsed();
    println!("partitions of a stopped Scheduler taken after {handed:?}");
    wait_fired_through(&client, seconds_from_now(3)).await;

    // No second lost, none fired twice. After the restart not even a de-duplicated attempt.
    assert_every_second(&client, JOBS).await;
    let late: Vec<TickRecord> = assert_fired_once(&client)
        .await
        .into_iter()
        .filter(|t| t.tick >= calm_from)
        .collect();
    assert!(
        late.is_empty(),
        "de-duplicated attempts after the restart: {late:?}"
    );
}

/// A failover is not a misfire: with the default policy (`fire_once`), the jobs of a Scheduler
/// killed outright miss no second — its partitions are taken within about three seconds and
/// the taker fires every tick the dead one missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_schedulers_jobs_miss_no_second_with_the_default_misfire_policy() {
    const EVERY_SECOND: usize = 8;
    let nats = TestNats::start();
    let mut s1 = AxProcess::node(&nats, "s1", "scheduler", &[]);
    let _s2 = AxProcess::node(&nats, "s2", "scheduler", &[]);
    let client = nats.client().await;
    wait_balanced(&client, &["s1", "s2"], STARTED).await;
    apply_every_second_with(&nats, "d", EVERY_SECOND, "");
    wait_jobs_fired_through(&client, EVERY_SECOND, seconds_from_now(2)).await;
    let owners = client.partition_owners().await.unwrap();
    assert!(
        (0..EVERY_SECOND).any(|i| {
            let p = partition::of(&format!("d{i:03}"), PARTITIONS);
            owners[&p].node.as_ref().is_some_and(|n| n.as_str() == "s1")
        }),
        "none of the jobs is the killed Scheduler's"
    );
    let killed = Instant::now();
    s1.kill9();
    let taken = wait_balanced(&client, &["s2"], Duration::from_secs(30)).await;
    println!("partitions of a killed Scheduler taken after {taken:?}");
    assert!(taken < Duration::from_secs(6), "taken after {taken:?}");
    wait_jobs_fired_through(&client, EVERY_SECOND, seconds_from_now(3)).await;
    assert!(killed.elapsed() > Duration::from_secs(3));
    assert_every_second(&client, EVERY_SECOND).await;
    assert_fired_once(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_whose_clock_is_off_hands_its_partitions_to_one_whose_clock_is_good() {
    let nats = TestNats::start();
    let offset_file = nats.path("s1").join("clock-offset");
    std::fs::write(&offset_file, "0").unwrap();
    let _s1 = AxProcess::spawn_with_env(
        Some(&nats.url()),
        &[
            "node",
            "--roles",
            "scheduler",
            "--id",
            "s1",
            "--data-dir",
            nats.path("s1").join("data").to_str().unwrap(),
        ],
        &nats.path("s1"),
        &nats.path("s1").join("node.log"),
        &[("AX_TEST_CLOCK_OFFSET_FILE", offset_file.to_str().unwrap())],
    );
    let _s2 = AxProcess::node(&nats, "s2", "scheduler", &[]);
    let client = nats.client().await;
    wait_balanced(&client, &["s1", "s2"], STARTED).await;
    apply_every_second(&nats, "c", 20);

    // s1's clock goes 30 s ahead: it steps aside and s2 fires every job.
    std::fs::write(&offset_file, "30").unwrap();
    wait_balanced(&client, &["s2"], Duration::from_secs(30)).await;
    let aside = Utc::now();
    wait_for(Duration::from_secs(30), "s2 to fire every job", || {
        let client = client.clone();
        async move {
            let by_s2: BTreeSet<String> = ticks(&client)
                .await
                .into_iter()
                .filter(|t| t.tick > aside && t.node.as_str() == "s2")
                .map(|t| t.job.to_string())
                .collect();
            (by_s2.len() == 20).then_some(())
        }
    })
    .await;

    // Back: it takes its share again, and no second of any job was lost or fired twice.
    std::fs::write(&offset_file, "0").unwrap();
    wait_balanced(&client, &["s1", "s2"], Duration::from_secs(40)).await;
    let back = Utc::now();
    wait_for(Duration::from_secs(30), "s1 to fire again", || {
        let client = client.clone();
        async move {
            ticks(&client)
                .await
                .into_iter()
                .any(|t| t.tick > back && t.node.as_str() == "s1")
                .then_some(())
        }
    })
    .await;
    assert_every_second(&client, 20).await;
    assert_fired_once(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_or_foreign_owner_in_the_partitions_bucket_is_taken_back() {
    let nats = TestNats::start();
    let s1 = AxProcess::node(&nats, "s1", "scheduler", &[]);
    let client = nats.client().await;
    wait_balanced(&client, &["s1"], Duration::from_secs(30)).await;

    // Something else writes the bucket: garbage over one owner, a Scheduler that never lived
    // over another.
    client
        .partitions
        .put(partition::key(PartitionId(5)), "not an owner".into())
        .await
        .unwrap();
    let ghost = partition::PartitionOwner {
        covered_through: None,
        node: Some(support::node("ghost")),
        fired_through: None,
        since: Utc::now(),
    };
    client
        .partitions
        .put(
            partition::key(PartitionId(6)),
            codec::encode(&ghost).unwrap(),
        )
        .await
        .unwrap();

    // s1 counts both as lost, then takes them back (the ghost has no member key), and fires
    // a job of each as before.
    wait_balanced(&client, &["s1"], Duration::from_secs(30)).await;
    let name_in = |p: u16| {
        (0..)
            .map(|i| format!("in{i}"))
            .find(|n| partition::of(n, PARTITIONS) == PartitionId(p))
            .unwrap()
    };
    let (five, six) = (name_in(5), name_in(6));
    for job in [&five, &six] {
        apply_job(
            &nats,
            job,
            &format!("version: v1\njob:\n  name: {job}\n  cron: \"* * * * * *\"\n  exec: {{ type: noop }}\n"),
        )
        .await;
    }
    wait_for(Duration::from_secs(20), "both jobs to fire", || {
        let (client, five, six) = (client.clone(), five.clone(), six.clone());
        async move {
            let fired: BTreeSet<String> = ticks(&client)
                .await
                .into_iter()
                .filter(|t| t.outcome == TickOutcome::Fired)
                .map(|t| t.job.to_string())
                .collect();
            (fired.contains(&five) && fired.contains(&six)).then_some(())
        }
    })
    .await;
    let log = s1.log_text();
    assert!(log.contains("unreadable partition owner"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// A job created on its dependencies alone (no cron) whose upstream lives in another
/// Scheduler's partition: the upstream's owner does not hold the downstream job, yet it must
/// hand the upstream's fires to the DagCoordinator, which creates the downstream's instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependent_in_another_schedulers_partition_is_created_and_runs() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _schedulers: Vec<AxProcess> = ["s1", "s2"]
        .into_iter()
        .map(|name| AxProcess::node(&nats, name, "scheduler", &[]))
        .collect();
    let _core = AxProcess::node(&nats, "core", "dag,router,worker", &[]);
    wait_balanced(&client, &["s1", "s2"], STARTED).await;
    let owners = client.partition_owners().await.unwrap();
    let owner = |name: &str| {
        owners[&partition::of(name, PARTITIONS)]
            .node
            .as_ref()
            .map(|n| n.to_string())
    };
    let named = |prefix: &str, by: &str| {
        (0..1000)
            .map(|i| format!("{prefix}{i}"))
            .find(|name| owner(name).as_deref() == Some(by))
            .expect("a name in the partitions of each Scheduler")
    };
    let (up, down) = (named("up", "s1"), named("down", "s2"));
    apply_job(
        &nats,
        &up,
        &format!(
            "version: v1\njob:\n  name: {up}\n  cron: \"* * * * * *\"\n  exec: {{ type: shell, command: 'true' }}\n"
        ),
    )
    .await;
    apply_job(
        &nats,
        &down,
        &format!(
            "version: v1\njob:\n  name: {down}\n  deps: [ {{ name: {up} }} ]\n  exec: {{ type: shell, command: 'true' }}\n"
        ),
    )
    .await;
    let ran = wait_for(Duration::from_secs(30), "the dependent to run", || async {
        let done: Vec<InstanceRecord> = instances(&client, &down)
            .await
            .into_iter()
            .filter(|r| r.state == State::Success)
            .collect();
        (!done.is_empty()).then_some(done)
    })
    .await;
    assert_eq!(ran[0].trigger, ax_bus::instance::Trigger::Deps, "{ran:?}");
}
