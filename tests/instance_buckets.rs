//! The instance records in several buckets: a deployment whose first node sets three keeps
//! each job's records in the bucket its name hashes to, and reads, lists and follows them as
//! one; a deployment with records moves into three buckets and back with `ax instance buckets
//! --set` (refused while a node runs; killed before it stored the new count, it leaves the old
//! layout whole and finishes when run again), every record and its history readable after,
//! and new instances run and land where they belong.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;

use ax_bus::client::instance_buckets::index_of;
use ax_bus::{AxClient, State};
use support::*;

/// Jobs whose names hash to each of three buckets: `gamma` 0, `delta` and `flaky` 1, `alpha`
/// and `later` 2.
const JOBS: [&str; 3] = ["alpha", "gamma", "delta"];

fn noop(name: &str) -> String {
    format!("version: v1\njob:\n  name: {name}\n  exec: {{ type: noop }}\n")
}

/// A job that fails once and succeeds on its retry: a record of several revisions.
fn flaky(dir: &std::path::Path) -> String {
    let mark = dir.join("flaky-ran");
    shell_job(
        "flaky",
        "  retry: { times: 1, interval: 1 }\n",
        &format!(
            "if [ -e {m} ]; then exit 0; fi; touch {m}; exit 1",
            m = mark.display()
        ),
    )
}

/// The keys each instance bucket holds, by bucket.
async fn keys_by_bucket(client: &AxClient) -> BTreeMap<String, Vec<String>> {
    let mut all = BTreeMap::new();
    for bucket in client.instances.buckets() {
        let keys = ax_bus::client::kv_view::KvFeed::open(&client.js, bucket, ">")
            .await
            .expect("a feed")
            .snapshot()
            .await
            .expect("its keys");
        all.insert(
            bucket.to_string(),
            keys.into_iter().map(|(k, ..)| k).collect(),
        );
    }
    all
}

/// Each record is in the bucket its job hashes to among `count`.
fn assert_placed(keys: &BTreeMap<String, Vec<String>>, count: u16) {
    assert_eq!(keys.len(), usize::from(count), "{keys:?}");
    for (i, (bucket, held)) in keys.iter().enumerate() {
        let expected = if i == 0 {
            "ax_instances".to_string()
        } else {
            format!("ax_instances_{i}")
        };
        // BTreeMap order: ax_instances, ax_instances_1, ax_instances_2.
        assert_eq!(bucket, &expected);
        for key in held {
            assert_eq!(usize::from(index_of(key, count)), i, "{key} is in {bucket}");
        }
    }
}

/// `ax instance buckets --json`: each bucket's name and keys.
fn buckets_cli(nats: &TestNats) -> Vec<(String, u64)> {
    let out = ax(&nats.url(), &["instance", "buckets", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout(&out)).expect("json");
    rows.iter()
        .map(|r| {
            (
                r["bucket"].as_str().unwrap_or_default().to_string(),
                r["keys"].as_u64().unwrap_or_default(),
            )
        })
        .collect()
}

/// `ax instance buckets --set 3` once it copied the records, held before it stores the count
/// (tried again while it is refused: the node's heartbeat is still recent).
async fn move_under_way(nats: &TestNats) -> AxProcess {
    let dir = nats.path("move-cli");
    let mut tries = 0;
    wait_for(Duration::from_secs(60), "a move under way", || {
        tries += 1;
        let moving = AxProcess::spawn_with_env(
            Some(&nats.url()),
            &["instance", "buckets", "--set", "3"],
            &dir,
            &dir.join(format!("move-{tries}.log")),
            &[("AX_TEST_REBUCKET_PAUSE_SECS", "120")],
        );
        async move {
            let mut moving = moving;
            let copied_or_refused = async {
                loop {
                    if moving.log_text().contains("revisions moved so far") {
                        return true;
                    }
                    if moving.child.try_wait().ok().flatten().is_some() {
                        return false;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            };
            let copied = tokio::time::timeout(Duration::from_secs(30), copied_or_refused)
                .await
                .unwrap_or(false);
            copied.then_some(moving)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_node_s_three_buckets_hold_each_job_s_records_read_as_one() {
    let nats = TestNats::start();
    let mut node = AxProcess::node(&nats, "n1", "all", &["--instance-buckets", "3"]);
    for job in JOBS {
        apply_job(&nats, job, &noop(job)).await;
    }
    let client = nats.client().await;
    assert_eq!(client.instances.count(), 3);
    let mut ids = Vec::new();
    for job in JOBS {
        for _ in 0..2 {
            let id = trigger(&nats, &[job]);
            final_record(&client, &id, Duration::from_secs(30)).await;
            ids.push(id);
        }
    }
    let keys = keys_by_bucket(&client).await;
    assert_placed(&keys, 3);
    assert!(keys.values().all(|k| k.len() == 2), "two a job: {keys:?}");

    // Read as one: the list, one job's list, a history, the CLI's view of the buckets.
    let listed = client.instances(None).await.unwrap();
    assert_eq!(listed.len(), 6);
    assert!(listed.iter().all(|r| r.state == State::Success));
    assert_eq!(
        client.instances(Some(&job("delta"))).await.unwrap().len(),
        2
    );
    let out = ax(&nats.url(), &["instance", "list", "--ids"]);
    assert_eq!(stdout(&out).lines().count(), 6, "{}", stdout(&out));
    let history = client.instance_history(&id(&ids[0])).await.unwrap();
    assert!(history.is_some_and(|h| !h.steps.is_empty()));
    assert_eq!(
        buckets_cli(&nats),
        [
            ("ax_instances".to_string(), 2),
            ("ax_instances_1".to_string(), 2),
            ("ax_instances_2".to_string(), 2)
        ]
    );

    // A node that asks for another count later gets the deployment's, and says so.
    node.terminate(Duration::from_secs(20));
    let node = AxProcess::node(&nats, "n2", "all", &["--instance-buckets", "1"]);
    let later = trigger(&nats, &["alpha"]);
    final_record(&client, &later, Duration::from_secs(30)).await;
    assert!(node
        .log_text()
        .contains("instance records are in 3 buckets: [node] instance_buckets = 1 is ignored"));
    assert_placed(&keys_by_bucket(&client).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_with_records_moves_into_three_buckets_and_back() {
    let nats = TestNats::start();
    let mut node = AxProcess::node(&nats, "n1", "all", &[]);
    for job in JOBS.iter().chain(&["later"]) {
        apply_job(&nats, job, &noop(job)).await;
    }
    apply_job(&nats, "flaky", &flaky(&nats.path("flaky"))).await;
    let client = nats.client().await;
    assert_eq!(client.instances.count(), 1);
    let mut ended = Vec::new();
    for job in JOBS.iter().chain(&["flaky"]) {
        let id = trigger(&nats, &[job]);
        final_record(&client, &id, Duration::from_secs(60)).await;
        ended.push(id);
    }
    // One still open: due in an hour.
    let waiting = trigger(&nats, &["later", "--in", "1h"]);
    let before: BTreeMap<String, _> = client
        .instances(None)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.instance_id.to_string(), r))
        .collect();
    assert_eq!(before.len(), 5);
    let steps = |h: ax_bus::history::History| -> Vec<String> {
        h.steps.iter().map(|s| format!("{:?}", s.step)).collect()
    };
    let flaky_steps = steps(
        client
            .instance_history(&id(&ended[3]))
            .await
            .unwrap()
            .expect("a history"),
    );
    assert!(flaky_steps.len() > 4, "{flaky_steps:?}");

    // A count out of range is refused, naming the flag.
    let out = ax(&nats.url(), &["instance", "buckets", "--set", "0"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--set 0: must be from 1 to 64"),
        "{}",
        stderr(&out)
    );

    // Refused while the node runs, naming it; nothing moved.
    let out = ax(&nats.url(), &["instance", "buckets", "--set", "3"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("node n1 wrote its heartbeat"),
        "{}",
        stderr(&out)
    );
    assert_eq!(nats.client().await.instances.count(), 1);

    node.terminate(Duration::from_secs(20));
    let revisions = client
        .instances
        .history(&id(&ended[3]))
        .await
        .unwrap()
        .count()
        .await;

    // A move killed once it copied the records, before it stored the new count: the old
    // layout is whole (the copies in the new buckets are not read).
    let mut cut = move_under_way(&nats).await;
    cut.kill9();
    let client = nats.client().await;
    assert_eq!(client.instances.count(), 1);
    assert_eq!(client.instances(None).await.unwrap().len(), before.len());
    assert!(client.js.get_stream("KV_ax_instances_1").await.is_ok());

    // Run again, it finishes: no record twice, no revision twice.
    let out = ax(&nats.url(), &["instance", "buckets", "--set", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("1 → 3 buckets"), "{}", stderr(&out));
    let client = nats.client().await;
    assert_eq!(
        client
            .instances
            .history(&id(&ended[3]))
            .await
            .unwrap()
            .count()
            .await,
        revisions
    );
    assert_eq!(client.instances.count(), 3);
    assert_placed(&keys_by_bucket(&client).await, 3);
    for (key, record) in &before {
        let (moved, _) = client.instance(&id(key)).await.unwrap().expect(key);
        assert_eq!(&moved, record, "{key} moved whole");
    }
    let moved_steps = steps(
        client
            .instance_history(&id(&ended[3]))
            .await
            .unwrap()
            .expect("a history"),
    );
    assert_eq!(
        moved_steps, flaky_steps,
        "the history moved with the record"
    );

    // Again: nothing left to move.
    let out = ax(&nats.url(), &["instance", "buckets", "--set", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("3 → 3 buckets: 0 revisions moved"),
        "{}",
        stderr(&out)
    );

    // The nodes start on the new layout: new instances land where they belong and the open
    // one is still there to fire.
    let node = AxProcess::node(&nats, "n2", "all", &[]);
    let new = trigger(&nats, &["gamma"]);
    final_record(&client, &new, Duration::from_secs(30)).await;
    let (open, _) = client.instance(&id(&waiting)).await.unwrap().expect("open");
    assert!(!open.state.is_final());
    assert_placed(&keys_by_bucket(&client).await, 3);
    let mut node = node;
    node.terminate(Duration::from_secs(20));

    // And back into one: the buckets past it are gone.
    wait_for(Duration::from_secs(60), "the move back", || {
        let out = ax(&nats.url(), &["instance", "buckets", "--set", "1"]);
        async move { out.status.success().then_some(()) }
    })
    .await;
    let client = nats.client().await;
    assert_eq!(client.instances.count(), 1);
    assert_eq!(client.instances(None).await.unwrap().len(), 6);
    assert_eq!(buckets_cli(&nats), [("ax_instances".to_string(), 6)]);
    assert!(client.js.get_stream("KV_ax_instances_1").await.is_err());
}
