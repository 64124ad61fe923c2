//! Who sets up JetStream, and what waits for it: a node creates ax's streams and buckets,
//! waiting with backoff for NATS and for JetStream rather than exiting; a command only reads
//! them, says plainly when they are missing and never creates or changes one — so commands
//! running while a node starts cannot make it fail.

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ax_bus::client::local_server::{find_binary, LocalServer, ServerOptions};
use futures::StreamExt;
use support::*;

/// The stream names on the server at `url`, read with a bare NATS client (an `AxClient` would
/// set them up).
async fn stream_names(url: &str) -> Vec<String> {
    let nats = async_nats::connect(url).await.expect("connect");
    let js = async_nats::jetstream::new(nats);
    let mut names = js.stream_names();
    let mut out = Vec::new();
    while let Some(name) = names.next().await {
        out.push(name.expect("a stream name"));
    }
    out
}

/// Whether `ax nodes --json` against `url` lists `node`.
fn lists_node(url: &str, node: &str) -> bool {
    let out = ax(url, &["nodes", "--json"]);
    serde_json::from_slice::<Vec<ax_bus::messages::NodeStatus>>(&out.stdout)
        .is_ok_and(|nodes| nodes.iter().any(|n| n.node.as_str() == node))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_before_any_node_says_so_and_creates_nothing() {
    let nats = TestNats::start();
    let url = nats.url();
    for args in [&["nodes"][..], &["job", "list"], &["worker", "list"]] {
        let out = ax(&url, args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = stderr(&out);
        assert!(
            err.contains("does not exist") && err.contains("no ax node has run"),
            "{args:?}: {err}"
        );
    }
    assert!(stream_names(&url).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_while_commands_run_comes_up() {
    let nats = TestNats::start();
    let url = nats.url();
    // Commands in a loop from before the node starts until it is up: each one fails (nothing
    // set up yet) or reads; none may get in the node's way.
    let stop = Arc::new(AtomicBool::new(false));
    let commands = {
        let (url, stop) = (url.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut runs = 0;
            while !stop.load(Ordering::Relaxed) {
                let _ = ax(&url, &["nodes"]);
                runs += 1;
            }
            runs
        })
    };
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    wait_for_logged(
        Duration::from_secs(60),
        "the node's heartbeat",
        &[&node],
        || async { lists_node(&url, "n1").then_some(()) },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let runs = commands.join().expect("the command loop");
    assert!(runs >= 2, "only {runs} commands ran");
    assert!(support::alive(node.pid().as_raw()), "{}", node.log_text());
    let log = node.log_text();
    assert!(!log.contains("cannot set up"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_before_its_nats_waits_for_it_and_comes_up() {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let url = format!("nats://127.0.0.1:{port}");
    let node_dir = dir.path().join("n1");
    std::fs::create_dir_all(&node_dir).expect("node dir");
    let node = AxProcess::spawn(
        Some(&url),
        &[
            "node",
            "--roles",
            "all",
            "--id",
            "n1",
            "--data-dir",
            node_dir.join("data").to_str().expect("utf-8 path"),
        ],
        &node_dir,
        &node_dir.join("node.log"),
    );
    wait_for_logged(
        Duration::from_secs(30),
        "the node to say it waits for NATS",
        &[&node],
        || async { node.log_text().contains("waiting for NATS").then_some(()) },
    )
    .await;
    assert!(support::alive(node.pid().as_raw()));
    let _server = LocalServer::start(ServerOptions {
        binary: find_binary().expect("nats-server"),
        port: Some(port),
        store_dir: dir.path().join("store"),
        log_file: None,
        extra_args: Vec::new(),
    })
    .expect("nats-server starts");
    wait_for_logged(
        Duration::from_secs(60),
        "the node's heartbeat once NATS is up",
        &[&node],
        || async { lists_node(&url, "n1").then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_streams_and_buckets_a_node_creates_are_the_ones_the_guarantees_list() {
    let nats = TestNats::start();
    // Provisioning as a node does it.
    let _client = nats.client().await;
    let created: std::collections::BTreeSet<String> = stream_names(&nats.url())
        .await
        .into_iter()
        .map(|name| match name.strip_prefix("KV_") {
            Some(bucket) => bucket.to_string(),
            None => name,
        })
        .collect();
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/guarantees.md"),
    )
    .expect("docs/guarantees.md");
    // The paragraph that lists them: from "Streams `AX_CONTROL`" to its end.
    let start = doc
        .find("Streams `AX_CONTROL`")
        .expect("the list of streams");
    let paragraph = &doc[start..];
    let paragraph = &paragraph[..paragraph.find("\n\n").unwrap_or(paragraph.len())];
    let listed: std::collections::BTreeSet<String> = paragraph
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|name| name.starts_with("AX_") || name.starts_with("ax_"))
        .map(str::to_string)
        .collect();
    assert_eq!(
        listed, created,
        "docs/guarantees.md lists other streams and buckets"
    );
}

/// `[retention]` sets how long the streams keep what they keep for a while; a node without it
/// keeps what the streams have; a result older than its retention is gone; a malformed value
/// stops the node, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_settings_set_the_streams_ages_and_a_node_without_them_keeps_them() {
    let nats = TestNats::start();
    let config = "[retention]\nresults = \"3s\"\naudit = \"30d\"\nsummaries = \"400d\"\n";
    let _set = AxProcess::configured(&nats, "set", "all", config);
    let client = nats.client().await;
    let age = |name: &'static str| {
        let client = client.clone();
        async move {
            let mut stream = client.js.get_stream(name).await.ok()?;
            let config = &stream.info().await.ok()?.config;
            Some((config.max_age, config.duplicate_window))
        }
    };
    let want = (Duration::from_secs(3), Duration::from_secs(3));
    let days = |n: u64| Duration::from_secs(n * 24 * 3600);
    // The test's own client set the streams up too, with what they had: wait for the node's
    // settings to be in every one of them.
    wait_for(Duration::from_secs(30), "the node's retention", || async {
        (age("AX_RESULTS").await? == want
            && age("AX_AUDIT").await?.0 == days(30)
            && age("KV_ax_summary").await?.0 == days(400))
        .then_some(())
    })
    .await;
    // Unset: the default.
    assert_eq!(age("AX_LOGS").await.map(|a| a.0), Some(days(7)));

    // Another node without the setting sets the streams up too, and changes none of it.
    let other = AxProcess::node(&nats, "other", "worker", &[]);
    wait_for(
        Duration::from_secs(30),
        "the other node's heartbeat",
        || {
            let client = client.clone();
            async move {
                let nodes = client.nodes().await.ok()?;
                nodes
                    .iter()
                    .any(|n| n.node.as_str() == "other")
                    .then_some(())
            }
        },
    )
    .await;
    assert_eq!(age("AX_RESULTS").await, Some(want), "{}", other.log_text());

    // A result lives its three seconds, then the stream lets it go.
    apply_job(
        &nats,
        "brief",
        "version: v1\njob:\n  name: brief\n  exec: { type: noop }\n",
    )
    .await;
    let id = trigger(&nats, &["brief"]);
    final_record(&client, &id, Duration::from_secs(30)).await;
    let kept = || {
        let client = client.clone();
        async move {
            let mut stream = client.js.get_stream("AX_RESULTS").await.ok()?;
            Some(stream.info().await.ok()?.state.messages)
        }
    };
    wait_for(Duration::from_secs(30), "the result stored", || async {
        (kept().await? > 0).then_some(())
    })
    .await;
    wait_for(
        Duration::from_secs(30),
        "the result gone after 3 s",
        || async { (kept().await? == 0).then_some(()) },
    )
    .await;

    // A value that is no duration stops the node, naming the field.
    let mut bad = AxProcess::configured(&nats, "bad", "worker", "[retention]\nlogs = \"soon\"\n");
    let status = wait_for(Duration::from_secs(30), "the node to stop", || {
        let status = bad.child.try_wait().ok().flatten();
        async move { status }
    })
    .await;
    assert!(!status.success());
    assert!(
        bad.log_text().contains("[retention] logs = \"soon\": "),
        "{}",
        bad.log_text()
    );
}

/// A local nats-server (`ax up`'s, a test's) started on a port another nats-server took first
/// fails, saying the port is taken: it never passes the other one off as itself (a command
/// would then talk to a server that ends with someone else's test or deployment).
#[test]
fn a_local_server_on_a_port_another_server_holds_fails_instead_of_taking_it_for_its_own() {
    let first = TestNats::start();
    let dir = tempfile::tempdir().unwrap();
    // Plain, and with a config file of its own (which names the server).
    let config = dir.path().join("other.conf");
    std::fs::write(&config, "server_name: other\n").unwrap();
    let configured = vec!["-c".to_string(), config.display().to_string()];
    for (i, extra_args) in [Vec::new(), configured].into_iter().enumerate() {
        let second = LocalServer::start(ServerOptions {
            binary: find_binary().expect("nats-server"),
            port: Some(first.server.port),
            store_dir: dir.path().join(format!("store{i}")),
            log_file: None,
            extra_args,
        });
        let error = second.expect_err("a second server on a taken port");
        assert!(error.port_taken(), "{error}");
    }
}
