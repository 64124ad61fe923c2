//! ax on a 3-node NATS cluster with every stream and bucket at 3 replicas: losing one NATS
//! node does not stop scheduling — a per-second cron job keeps firing, no second is lost
//! (fires during the fail-over are created late, not dropped) and none runs twice; nor does
//! losing two of them, the quorum, for a minute. Leaders crowded on one server are spread by
//! `ax leaders --spread`.

use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use ax_bus::State;
use chrono::{DurationRound, TimeDelta};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_nats_node_does_not_stop_scheduling() {
    let mut cluster = TestCluster::start();
    let client = cluster.client().await;
    let mut names = client.js.stream_names();
    let mut streams = Vec::new();
    while let Some(name) = futures::StreamExt::next(&mut names).await {
        streams.push(name.unwrap());
    }
    for name in &streams {
        let stream = client.js.get_stream(name).await.unwrap();
        let info = stream.cached_info();
        assert_eq!(info.config.num_replicas, 3, "{name}: {:?}", info.cluster);
    }
    assert!(streams.len() >= 10, "{streams:?}");
    let url = cluster.url();
    let node_dir = cluster.dir.path().join("n1");
    std::fs::create_dir_all(&node_dir).unwrap();
    let node = AxProcess::spawn(
        Some(&url),
        &[
            "node",
            "--roles",
            "all",
            "--id",
            "n1",
            "--replicas",
            "3",
            "--data-dir",
            node_dir.join("data").to_str().unwrap(),
        ],
        &node_dir,
        &node_dir.join("node.log"),
    );
    let ledger = node_dir.join("ledger");
    let job = node_dir.join("tick.yaml");
    std::fs::write(
        &job,
        format!(
            "version: v1\njob:\n  name: tick\n  cron: '* * * * * *'\n  exec: {{ type: shell, command: 'echo $AX_INSTANCE_ID >> {}' }}\n",
            ledger.display()
        ),
    )
    .unwrap();
    let applied = ax(&url, &["job", "apply", "-f", job.to_str().unwrap()]);
    assert!(applied.status.success(), "{}", stderr(&applied));

    let succeeded = |after| succeeded_since(&client, "tick", after);
    let first = ax_bus::time::now();
    wait_for(Duration::from_secs(30), "the job to run", || {
        succeeded(first)
    })
    .await;

    cluster.wait_replicated(&client).await;
    let killed_at = ax_bus::time::now();
    cluster.servers[0].stop();
    let checked_until =
        killed_at.duration_trunc(TimeDelta::seconds(1)).unwrap() + TimeDelta::seconds(15);
    wait_for_logged(
        Duration::from_secs(90),
        "fires after the loss of a NATS node to run",
        &[&node],
        || succeeded(checked_until),
    )
    .await;

    let records = instances(&client, "tick").await;
    let seconds: BTreeSet<_> = records.iter().map(|r| r.expected_time).collect();
    let start = records.iter().map(|r| r.expected_time).min().unwrap();
    let mut second = start;
    while second <= checked_until {
        assert!(seconds.contains(&second), "no instance for {second}");
        second += TimeDelta::seconds(1);
    }
    let lines = std::fs::read_to_string(&ledger).unwrap();
    let mut seen = BTreeSet::new();
    for line in lines.lines() {
        assert!(seen.insert(line.to_string()), "{line} ran twice");
    }
}

/// `ax node --roles all --id <name> --replicas 3` against `url`, its files in the cluster's dir.
fn node_on(cluster: &TestCluster, url: &str, name: &str) -> AxProcess {
    let dir = cluster.dir.path().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    AxProcess::spawn(
        Some(url),
        &[
            "node",
            "--roles",
            "all",
            "--id",
            name,
            "--replicas",
            "3",
            "--data-dir",
            dir.join("data").to_str().unwrap(),
        ],
        &dir,
        &dir.join("node.log"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_started_while_nats_nodes_are_down_wait_and_come_up() {
    let mut cluster = TestCluster::start();
    // The cluster is formed (it answers JetStream requests) before its nodes go.
    let first = cluster.servers[0].url.clone();
    wait_for(
        Duration::from_secs(60),
        "the cluster's JetStream",
        || async {
            let nats = async_nats::connect(first.as_str()).await.ok()?;
            async_nats::jetstream::new(nats)
                .query_account()
                .await
                .ok()
                .map(|_| ())
        },
    )
    .await;
    // Two of three down: JetStream has no quorum and answers nothing. The node waits, saying
    // so, and does not exit.
    cluster.servers[1].stop();
    cluster.servers[2].stop();
    let n1 = node_on(&cluster, &first, "n1");
    wait_for_logged(
        Duration::from_secs(60),
        "the node to say it waits for JetStream",
        &[&n1],
        || async {
            n1.log_text()
                .contains("waiting for JetStream")
                .then_some(())
        },
    )
    .await;
    assert!(alive(n1.pid().as_raw()), "{}", n1.log_text());

    // One back: quorum with a node down. The first node comes up, and a second node started
    // now comes up too.
    cluster.servers[1].restart().unwrap();
    let two = format!("{first},{}", cluster.servers[1].url);
    let n2 = node_on(&cluster, &two, "n2");
    // Read as a command does (it never sets anything up): what is there, the nodes made.
    let config = ax_bus::client::ConnectConfig::new(two.clone(), "reader");
    let client = wait_for_logged(
        Duration::from_secs(90),
        "both nodes' heartbeats with one NATS node down",
        &[&n1, &n2],
        || async {
            let client = ax_bus::AxClient::connect(&config).await.ok()?;
            let nodes = client.nodes().await.ok()?;
            let up = |name: &str| nodes.iter().any(|n| n.node.as_str() == name);
            (up("n1") && up("n2")).then_some(client)
        },
    )
    .await;
    let stream = client
        .js
        .get_stream(client.layout.control_stream())
        .await
        .unwrap();
    assert_eq!(stream.cached_info().config.num_replicas, 3);
    cluster.servers[2].restart().unwrap();
    assert!(alive(n1.pid().as_raw()) && alive(n2.pid().as_raw()));
}

/// Two of three NATS nodes down for a minute: JetStream has no quorum and answers nothing. The
/// node waits without exiting, and once the quorum is back the fires due meanwhile are made by
/// their misfire policy — every one for `fire_all`, run once: nothing lost, nothing twice; the
/// latest for the default `fire_once`, the others recorded as skipped: none missing silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minute_without_quorum_loses_nothing_and_runs_nothing_twice() {
    let mut cluster = TestCluster::start();
    let client = cluster.client().await;
    let url = cluster.url();
    let node = node_on(&cluster, &url, "n1");
    let ledger = cluster.dir.path().join("ledger");
    let job = cluster.dir.path().join("tick.yaml");
    std::fs::write(
        &job,
        format!(
            "version: v1\njob:\n  name: tick\n  cron: '* * * * * *'\n  misfire: fire_all\n  exec: {{ type: shell, command: 'echo $AX_INSTANCE_ID >> {l}' }}\n---\nversion: v1\njob:\n  name: once\n  cron: '* * * * * *'\n  exec: {{ type: shell, command: 'echo $AX_INSTANCE_ID >> {l}' }}\n",
            l = ledger.display()
        ),
    )
    .unwrap();
    let applied = ax(&url, &["job", "apply", "-f", job.to_str().unwrap()]);
    assert!(applied.status.success(), "{}", stderr(&applied));
    let succeeded = |after| succeeded_since(&client, "tick", after);
    let first = ax_bus::time::now();
    wait_for(Duration::from_secs(60), "the job to run", || {
        succeeded(first)
    })
    .await;
    cluster.wait_replicated(&client).await;

    let lost_at = ax_bus::time::now();
    cluster.servers[1].stop();
    cluster.servers[2].stop();
    std::thread::sleep(Duration::from_secs(60));
    assert!(alive(node.pid().as_raw()), "{}", node.log_text());
    cluster.servers[1].restart().unwrap();
    cluster.servers[2].restart().unwrap();
    let back_at = ax_bus::time::now();
    println!("quorum lost at {lost_at}, back at {back_at}");
    let checked_until =
        back_at.duration_trunc(TimeDelta::seconds(1)).unwrap() + TimeDelta::seconds(10);
    wait_for_logged(
        Duration::from_secs(120),
        "fires after the quorum came back to run",
        &[&node],
        || succeeded(checked_until),
    )
    .await;
    // Every second, those without quorum included, has its instance, each run to its end once.
    let records = instances(&client, "tick").await;
    let seconds: BTreeSet<_> = records.iter().map(|r| r.expected_time).collect();
    let start = records.iter().map(|r| r.expected_time).min().unwrap();
    let mut second = start;
    while second <= checked_until {
        assert!(seconds.contains(&second), "no instance for {second}");
        second += TimeDelta::seconds(1);
    }
    let finals = wait_for_logged(
        Duration::from_secs(120),
        "every instance to end",
        &[&node],
        || async {
            let records = client.instances(Some(&support::job("tick"))).await.ok()?;
            records
                .iter()
                .filter(|r| r.expected_time <= checked_until)
                .all(|r| r.state.is_final())
                .then_some(records)
        },
    )
    .await;
    let failed: Vec<_> = finals
        .iter()
        .filter(|r| r.expected_time <= checked_until && r.state != State::Success)
        .map(|r| (r.instance_id.to_string(), r.message.clone()))
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    // The default policy: each second an instance or a tick recorded skipped, many skipped.
    // (Tick records are stored behind the fires: looked at until every second has one, or the
    // deadline names the first that has none.)
    let missing = |made: &BTreeSet<_>, skipped: &BTreeSet<_>| {
        let mut second = made.iter().min().copied()?;
        while second <= checked_until {
            if !made.contains(&second) && !skipped.contains(&second) {
                return Some(second);
            }
            second += TimeDelta::seconds(1);
        }
        None
    };
    let read = || async {
        let made: BTreeSet<_> = instances(&client, "once")
            .await
            .iter()
            .map(|r| r.expected_time)
            .collect();
        let skipped: BTreeSet<_> = client
            .ticks(&support::job("once"), 10_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|t| t.outcome == ax_bus::messages::TickOutcome::Skipped)
            .map(|t| t.tick)
            .collect();
        (made, skipped)
    };
    let complete = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let (made, skipped) = read().await;
            if !made.is_empty() && missing(&made, &skipped).is_none() {
                return skipped;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    let skipped = match complete {
        Ok(skipped) => skipped,
        Err(_) => {
            let (made, skipped) = read().await;
            panic!(
                "{:?} neither fired nor recorded skipped\n{}",
                missing(&made, &skipped),
                node.log_text()
            );
        }
    };
    println!(
        "fire_once: {} seconds skipped while there was no quorum",
        skipped.len()
    );
    assert!(skipped.len() >= 30, "{} skipped", skipped.len());
    let lines = std::fs::read_to_string(&ledger).unwrap();
    let mut seen = BTreeSet::new();
    for line in lines.lines() {
        assert!(seen.insert(line.to_string()), "{line} ran twice");
    }
    assert!(alive(node.pid().as_raw()), "{}", node.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaders_crowded_on_one_server_are_spread_by_ax_leaders() {
    use ax_bus::client::leaders;
    let cluster = TestCluster::start();
    let mut config = ax_bus::client::ConnectConfig::new(cluster.url(), "ax-test");
    config.replicas = Some(3);
    config.instance_buckets = Some(3);
    let client = wait_for(
        Duration::from_secs(60),
        "the cluster's JetStream",
        || async { ax_bus::AxClient::connect_node(&config).await.ok() },
    )
    .await;
    let streams = leaders::written_streams(&client).await.unwrap();
    assert_eq!(
        streams.len(),
        8,
        "three instance buckets and five streams: {streams:?}"
    );
    for led in &streams {
        leaders::lead(&client, &led.stream, "s0").await.unwrap();
    }
    let crowded = leaders::load(&leaders::written_streams(&client).await.unwrap());
    assert!((crowded["s0"] - 7.1).abs() < 1e-9, "{crowded:?}");

    let out = ax(&cluster.url(), &["leaders", "--spread"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let spread = leaders::load(&leaders::written_streams(&client).await.unwrap());
    let most = spread.values().copied().fold(0.0, f64::max);
    assert!(
        most <= 3.0 + 1e-9,
        "seven writes over three leaders: {spread:?}"
    );
    assert!(
        stdout(&out).contains("the most writes an instance one server leads: 3.0"),
        "{}",
        stdout(&out)
    );

    // Spread already: nothing moves.
    let again = ax(&cluster.url(), &["leaders", "--spread"]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        stderr(&again).contains("nothing moved"),
        "{}",
        stderr(&again)
    );
}
