//! Namespaces: a job of a team's namespace is named after it in every subject, key and id; its
//! business services, connected as the NATS user `ax namespace user` prints, trigger and read
//! their namespace's work and nothing of another's, nor ax's own consumers; and a job of one
//! namespace waits for its upstream in another for the same business date.

use std::path::Path;
use std::time::Duration;

use ax_bus::messages::{ControlReply, TriggerRequest};
use ax_bus::State;
use futures::StreamExt;

use crate::nats_auth::{authorization, connect_as, refused, refused_subscription, CLUSTER_USERS};
use crate::support::ledger;
use crate::support::*;

const JOBS: &str = "version: v1
job:
  namespace: a
  name: hello
  exec: { type: shell, command: 'echo hello-a' }
---
version: v1
job:
  namespace: b
  name: secret
  exec: { type: shell, command: 'echo secret-b' }
---
version: v1
job:
  namespace: b
  name: after
  deps: [ { name: a/hello, biz_date: current } ]
  exec: { type: noop }
";

/// The entry `ax namespace user` prints for `namespace`, its password `<namespace>-secret` (as
/// `connect_as` signs in).
fn printed_user(namespace: &str) -> String {
    let password = format!("\"{namespace}-secret\"");
    // Written before the server runs: nothing is read from NATS.
    let out = ax(
        "nats://127.0.0.1:1",
        &["namespace", "user", namespace, "--password", &password],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

/// `jobs` triggered together as plain requests on `ax.request.trigger`; each one's instance.
async fn trigger_together<'a>(
    client: &ax_bus::AxClient,
    jobs: impl IntoIterator<Item = &'a str>,
) -> Vec<String> {
    let triggers = jobs.into_iter().map(|job| {
        let nats = client.nats.clone();
        async move { request_trigger(&nats, "ax.request.trigger", job).await }
    });
    futures::future::join_all(triggers)
        .await
        .into_iter()
        .map(|r| match &r.instance_id {
            Some(id) => id.to_string(),
            None => panic!("not triggered: {r:?}"),
        })
        .collect()
}

/// A trigger sent as a plain request on `subject` by `client`, and its answer.
async fn request_trigger(client: &async_nats::Client, subject: &str, job: &str) -> ControlReply {
    let request = TriggerRequest {
        name: job.parse().expect("a job name"),
        biz_date: None,
        params: Default::default(),
        key: None,
        at: None,
        delay: None,
    };
    let payload = ax_bus::codec::encode(&request).expect("encode");
    let answer = tokio::time::timeout(
        Duration::from_secs(40),
        client.request(subject.to_string(), payload),
    )
    .await
    .expect("answered in time")
    .expect("answered");
    ax_bus::codec::decode(&answer.payload).expect("a control reply")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaces_service_user_reaches_its_own_work_and_the_server_refuses_it_the_rest() {
    let users = format!("{}{}", printed_user("a"), printed_user("b"));
    let config = authorization(&CLUSTER_USERS, |user| format!("\"{user}-secret\"")).replacen(
        "\n  ]\n}\n",
        &format!("\n{users}  ]\n}}\n"),
        1,
    );
    let nats = TestNats::start_with_config(Some(&config), Some("operator:operator-secret"));
    let as_user = |user: &str| {
        nats.server
            .url
            .replacen("://", &format!("://{user}:{user}-secret@"), 1)
    };
    let client = nats.client().await;
    let nodes = [
        AxProcess::node_at(
            &as_user("core"),
            &nats,
            "core-1",
            "scheduler,dag,router",
            &[],
        ),
        AxProcess::node_at(&as_user("worker"), &nats, "worker-1", "worker", &[]),
    ];
    apply_job(&nats, "namespaces", JOBS).await;

    // The CLI places short names in `-n`'s namespace and lists one namespace.
    let listed = ax(&nats.url(), &["job", "list", "-n", "b", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("json");
    let names: Vec<&str> = listed
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|j| j["name"].as_str())
        .collect();
    assert_eq!(names, ["b.after", "b.secret"], "{listed}");
    let counts = ax(&nats.url(), &["namespace", "list", "--json"]);
    let counts: serde_json::Value = serde_json::from_slice(&counts.stdout).expect("json");
    assert_eq!(
        counts,
        serde_json::json!([
            {"namespace": "a", "jobs": 1, "weight": 1, "max_jobs": null, "max_running": null, "max_waiting": null},
            {"namespace": "b", "jobs": 2, "weight": 1, "max_jobs": null, "max_running": null, "max_waiting": null},
        ])
    );
    // `b.after` waits for `a.hello` of its business date.
    let after = trigger(&nats, &["-n", "b", "after"]);
    assert!(after.starts_with("b.after."), "{after}");
    wait_for(
        Duration::from_secs(30),
        "b.after to wait for a.hello",
        || async {
            let id = after.parse().expect("an instance id");
            let record = client.instance(&id).await.ok().flatten()?.0;
            (record.tag == ax_bus::Tag::WaitingDeps).then_some(())
        },
    )
    .await;

    let (service, mut errors) = connect_as(&nats, "a").await;
    let mut events = service.subscribe("ax.event.a.*.*").await.unwrap();
    // Its own job, by its short name on its own subject.
    let reply = request_trigger(&service, "ax.request.trigger.a", "hello").await;
    assert!(reply.ok, "{reply:?}");
    let hello = reply.instance_id.expect("an instance").to_string();
    assert!(hello.starts_with("a.hello."), "{hello}");
    // Another namespace's job through its own subject: refused by the Scheduler.
    let reply = request_trigger(&service, "ax.request.trigger.a", "b/secret").await;
    assert!(!reply.ok, "{reply:?}");
    assert!(
        reply
            .errors
            .iter()
            .any(|e| e.contains("not in namespace `a`")),
        "{reply:?}"
    );
    // Anything else: refused by the server.
    let trigger_b = br#"{"name": "secret"}"#.as_slice();
    for (subject, payload) in [
        ("ax.control.trigger.b", trigger_b),
        ("ax.request.trigger.b", trigger_b),
        ("ax.control.trigger", trigger_b),
        ("ax.request.trigger", trigger_b),
        ("ax.control.rerun.a", b"{}".as_slice()),
        ("ax.control.apply", b"{}".as_slice()),
        // Another namespace's results, or all of them, through a consumer of its own.
        (
            "$JS.API.CONSUMER.CREATE.AX_RESULTS.a-1.ax.result.b.>",
            br#"{"stream_name": "AX_RESULTS", "config": {"name": "a-1", "filter_subject": "ax.result.b.>", "ack_policy": "explicit"}}"#.as_slice(),
        ),
        (
            "$JS.API.CONSUMER.CREATE.AX_RESULTS.a-1.ax.result.>",
            br#"{"stream_name": "AX_RESULTS", "config": {"name": "a-1", "filter_subject": "ax.result.>", "ack_policy": "explicit"}}"#.as_slice(),
        ),
        (
            "$JS.API.CONSUMER.CREATE.AX_RESULTS.a-1",
            br#"{"stream_name": "AX_RESULTS", "config": {"name": "a-1", "ack_policy": "explicit"}}"#.as_slice(),
        ),
        // Results or logs by sequence, which reach every namespace.
        ("$JS.API.DIRECT.GET.AX_RESULTS", br#"{"seq": 1}"#.as_slice()),
        ("$JS.API.STREAM.MSG.GET.AX_LOGS", br#"{"seq": 1}"#.as_slice()),
        ("$JS.API.STREAM.INFO.AX_RESULTS", b"".as_slice()),
        // Instance records, whose reads name the key in their body.
        (
            "$JS.API.STREAM.MSG.GET.KV_ax_instances",
            br#"{"last_by_subj": "$KV.ax_instances.b.secret.x"}"#.as_slice(),
        ),
        // ax's own consumers.
        ("$JS.API.CONSUMER.NAMES.AX_RESULTS", b"{}".as_slice()),
        ("$JS.API.CONSUMER.DELETE.AX_RESULTS.dag-results-1", b"".as_slice()),
        ("$JS.API.CONSUMER.DELETE.AX_RESULTS.openlineage", b"".as_slice()),
        ("$JS.API.CONSUMER.MSG.NEXT.AX_RESULTS.dag-results-1", b"{}".as_slice()),
    ] {
        refused(&service, &mut errors, subject, payload).await;
    }
    for subject in [
        "ax.result.b.*",
        "ax.result.>",
        "ax.event.>",
        "ax.log.b.>",
        "_INBOX.b.>",
    ] {
        refused_subscription(&service, &mut errors, subject).await;
    }

    // Its own work runs, and so does the downstream of another namespace that waited for it.
    let upstream = final_record(&client, &hello, Duration::from_secs(60)).await;
    let downstream = final_record(&client, &after, Duration::from_secs(60)).await;
    assert_eq!(upstream.state, State::Success, "{upstream:?}");
    assert_eq!(downstream.state, State::Success, "{downstream:?}");
    assert!(
        downstream.started_at >= upstream.finished_at && downstream.biz_date == upstream.biz_date,
        "{downstream:?} did not wait for {upstream:?}"
    );
    // `-n` lists one namespace's instances.
    let listed = ax(&nats.url(), &["instance", "list", "-n", "a", "--ids"]);
    assert_eq!(stdout(&listed).trim(), hello, "{}", stderr(&listed));
    // Its events came on its own subjects.
    let event = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("an event of a.hello")
        .expect("the subscription");
    assert!(
        event.subject.starts_with("ax.event.a.hello."),
        "{}",
        event.subject
    );
    // Its result, through a consumer of its own filtered to its namespace.
    let js = async_nats::jetstream::new(service.clone());
    let consumer: async_nats::jetstream::consumer::PullConsumer = js
        .create_consumer_on_stream(
            async_nats::jetstream::consumer::pull::Config {
                durable_name: Some("a-1".into()),
                filter_subject: "ax.result.a.>".into(),
                ..Default::default()
            },
            "AX_RESULTS",
        )
        .await
        .expect("a consumer of its own");
    let mut results = consumer.messages().await.expect("read it");
    let result = tokio::time::timeout(Duration::from_secs(10), results.next())
        .await
        .expect("its result")
        .expect("a message")
        .expect("a result");
    assert_eq!(result.subject.as_str(), "ax.result.a.hello");
    // Its instance's record, read through the Schedulers on its subject; another namespace's
    // instance is unknown there.
    let read = |id: &str| {
        let request = ax_bus::messages::ReadRequest {
            instance: id.parse().expect("an instance id"),
        };
        let payload = ax_bus::codec::encode(&request).expect("encode");
        let service = service.clone();
        async move {
            let answer = service
                .request("ax.request.instance.a", payload)
                .await
                .expect("answered");
            ax_bus::codec::decode::<ControlReply>(&answer.payload).expect("a reply")
        }
    };
    let own = read(&hello).await;
    let record = own.record.expect("its record");
    assert_eq!(
        (record.instance_id.to_string(), record.state),
        (hello.clone(), State::Success)
    );
    let other = read(&after).await;
    assert!(!other.ok && other.record.is_none(), "{other:?}");
    assert_eq!(other.errors, [format!("unknown instance `{after}`")]);

    // Bad input on a namespace's subject, even from a user the server lets send it: a token
    // that is no namespace, and a command no namespace's service sends.
    let reply = request_trigger(&client.nats, "ax.request.trigger.NotOne", "hello").await;
    assert!(!reply.ok, "{reply:?}");
    assert!(
        reply
            .errors
            .iter()
            .any(|e| e.contains("names no namespace")),
        "{reply:?}"
    );
    let pause = ax_bus::codec::encode(&ax_bus::messages::JobNameRequest {
        name: "a.hello".parse().unwrap(),
    })
    .unwrap();
    let answer = client
        .nats
        .request("ax.request.pause.a", pause)
        .await
        .expect("answered");
    let reply: ControlReply = ax_bus::codec::decode(&answer.payload).expect("a reply");
    assert!(
        !reply.ok
            && reply
                .errors
                .iter()
                .any(|e| e.contains("carries only `trigger`, `report` and `instance`")),
        "{reply:?}"
    );

    // The other namespace's service cannot trigger the first's job either.
    let (other, mut errors) = connect_as(&nats, "b").await;
    let reply = request_trigger(&other, "ax.request.trigger.b", "a/hello").await;
    assert!(!reply.ok, "{reply:?}");
    refused(&other, &mut errors, "ax.control.trigger.a", trigger_b).await;
    assert_eq!(instances(&client, "b.secret").await.len(), 0);
    assert_eq!(instances(&client, "a.hello").await.len(), 1);

    for process in &nodes {
        let log = process.log_text();
        assert!(
            !log.to_lowercase().contains("permissions violation"),
            "{log}"
        );
    }
}

const FLOODS: &str = "version: v1
job:
  namespace: a
  name: flood
  exec: { type: shell, command: 'sleep 0.3' }
---
version: v1
job:
  namespace: b
  name: flood
  exec: { type: shell, command: 'sleep 0.3' }
";

/// Two namespaces flood one worker of 4 slots with 45 attempts each, `a` weighing 2 and `b`
/// 1, `a`'s flood first: `b`'s work starts without waiting for `a`'s flood (most of `a`'s
/// starts come after `b`'s first); while both have
/// work waiting, `a` gets twice `b`'s starts (within 10 %), and once `a`'s work is done `b`
/// gets every slot; nothing is lost or failed for waiting. A namespace's quota of running
/// attempts holds the rest as `queued`, with the reason, and releases them as attempts end;
/// its quota of jobs refuses the job past it, naming the namespace, and keeps what it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_namespaces_flooding_one_worker_share_its_slots_by_weight() {
    const EACH: usize = 45;
    let nats = TestNats::start();
    let client = nats.client().await;
    let _nodes = [
        AxProcess::node(&nats, "core-1", "scheduler,dag,router", &[]),
        AxProcess::node(&nats, "worker-1", "worker", &["--slots", "4"]),
    ];
    apply_job(&nats, "floods", FLOODS).await;
    let created = ax(&nats.url(), &["namespace", "create", "a", "--weight", "2"]);
    assert!(created.status.success(), "{}", stderr(&created));
    let said = stdout(&created);
    assert!(
        said.contains(
            "namespace a: weight 2, no quota of jobs, no quota of running attempts, no quota of \
             waiting instances"
        ),
        "{said}"
    );
    // It prints the namespace's NATS user, as `ax namespace user` does.
    assert!(said.contains("_INBOX.a"), "{said}");
    let refused = ax(&nats.url(), &["namespace", "create", "b", "--weight", "0"]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("weight 0 is out of range"),
        "{}",
        stderr(&refused)
    );
    wait_for(
        Duration::from_secs(30),
        "the worker's heartbeat",
        || async { worker_listed(&nats, "worker-1") },
    )
    .await;

    // `a`'s flood first, then `b`'s: `b`'s work must not wait behind all of `a`'s.
    for job in ["a/flood", "b/flood"] {
        trigger_together(&client, std::iter::repeat_n(job, EACH)).await;
    }
    let ended = wait_for(Duration::from_secs(120), "every attempt to end", || async {
        let mut all = Vec::new();
        for job in ["a.flood", "b.flood"] {
            all.extend(client.instances(Some(&job.parse().ok()?)).await.ok()?);
        }
        let done = all.len() == 2 * EACH && all.iter().all(|r| r.state.is_final());
        done.then_some(all)
    })
    .await;
    assert!(
        ended
            .iter()
            .all(|r| r.state == State::Success && r.attempt == 1),
        "{:?}",
        ended
            .iter()
            .map(|r| (&r.instance_id, r.state, r.attempt))
            .collect::<Vec<_>>()
    );

    // The starts in order, by namespace: from `b`'s first until `a` ran out, both waited.
    let mut starts: Vec<_> = ended
        .iter()
        .map(|r| {
            (
                r.started_at.expect("started"),
                r.job.namespace().to_string(),
            )
        })
        .collect();
    starts.sort();
    let first_b = starts.iter().position(|(_, n)| n == "b").expect("b ran");
    let last_a = starts.iter().rposition(|(_, n)| n == "a").expect("a ran");
    // `b` did not wait for `a`'s flood: most of `a`'s work started after `b`'s first.
    let a_after = starts[first_b..].iter().filter(|(_, n)| n == "a").count();
    assert!(
        a_after >= EACH / 2,
        "b's first start came {first_b}th, before {a_after} of a's"
    );
    let window = &starts[first_b..=last_a];
    let count = |ns: &str| window.iter().filter(|(_, n)| n == ns).count() as f64;
    let ratio = count("a") / count("b");
    eprintln!(
        "a:b = {}:{} while both waited, from b's first start, start {}",
        count("a"),
        count("b"),
        first_b + 1
    );
    assert!(
        (1.8..=2.2).contains(&ratio),
        "a:b = {}:{} while both waited (ratio {ratio:.2}, 2 ± 10 % wanted)",
        count("a"),
        count("b")
    );
    // Each namespace's ready queue is counted apart (`ax status`, the console, `/metrics`).
    let queues: Vec<String> = client
        .queue_depths()
        .await
        .expect("the queues' depths")
        .into_iter()
        .map(|q| q.queue)
        .collect();
    for queue in ["ready_normal", "ready_normal.a", "ready_normal.b"] {
        assert!(queues.iter().any(|q| q == queue), "{queues:?}");
    }
    // `ax status -n a`: its queues only.
    let status = ax(&nats.url(), &["status", "-n", "a", "--json"]);
    assert!(status.status.success(), "{}", stderr(&status));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).expect("json");
    let queues: Vec<&str> = status["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .filter_map(|q| q["queue"].as_str())
        .collect();
    assert!(
        !queues.is_empty() && queues.iter().all(|q| q.ends_with(".a")),
        "{queues:?}"
    );
    // Alone, `b` took every slot: what is left after `a`'s last start is all `b`'s.
    let alone = &starts[last_a + 1..];
    assert!(alone.iter().all(|(_, n)| n == "b"));
    assert!(alone.len() >= EACH / 3, "b alone started {}", alone.len());

    // A quota of running attempts: `a` may have 2 dispatched or running; the others wait,
    // tagged `queued` with the reason, and run as those end.
    let quota = ax(
        &nats.url(),
        &[
            "namespace",
            "set",
            "a",
            "--weight",
            "2",
            "--max-running",
            "2",
        ],
    );
    assert!(quota.status.success(), "{}", stderr(&quota));
    let held = trigger_together(&client, std::iter::repeat_n("a/flood", 6)).await;
    wait_for(
        Duration::from_secs(30),
        "an attempt held for the quota",
        || async {
            for id in &held {
                let record = client.instance(&id.parse().ok()?).await.ok().flatten()?.0;
                if record.tag == ax_bus::Tag::Queued && record.message.contains("--max-running") {
                    return Some(record);
                }
            }
            None
        },
    )
    .await;
    let mut runs = Vec::new();
    for id in &held {
        let record = final_record(&client, id, Duration::from_secs(60)).await;
        assert_eq!(record.state, State::Success, "{record:?}");
        runs.push((
            record.started_at.expect("started"),
            record.finished_at.expect("finished"),
        ));
    }
    let most_at_once = runs
        .iter()
        .map(|(start, _)| runs.iter().filter(|(s, f)| s <= start && start < f).count())
        .max();
    assert_eq!(most_at_once, Some(2), "{runs:?}");

    // A quota of jobs: `b` holds one, may hold one.
    let quota = ax(&nats.url(), &["namespace", "set", "b", "--max-jobs", "1"]);
    assert!(quota.status.success(), "{}", stderr(&quota));
    let second = "version: v1\njob:\n  namespace: b\n  name: second\n  exec: { type: noop }\n";
    let file = job_file(&nats.path("jobs"), "second.yaml", second);
    let out = ax(
        &nats.url(),
        &["job", "apply", "-f", file.to_str().expect("utf-8 path")],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("namespace b may hold at most 1 jobs"),
        "{}",
        stderr(&out)
    );
    let listed = ax(&nats.url(), &["namespace", "list", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("json");
    assert_eq!(
        listed,
        serde_json::json!([
            {"namespace": "a", "jobs": 1, "weight": 2, "max_jobs": null, "max_running": 2, "max_waiting": null},
            {"namespace": "b", "jobs": 1, "weight": 1, "max_jobs": 1, "max_running": null, "max_waiting": null},
        ])
    );
    // A quota of waiting instances: while `b`'s queue is paused its instances wait; the
    // trigger past the quota is refused with the reason, and those admitted run once resumed.
    let paused = ax(&nats.url(), &["queue", "pause", "normal"]);
    assert!(paused.status.success(), "{}", stderr(&paused));
    let quota = ax(
        &nats.url(),
        &["namespace", "set", "b", "--max-waiting", "2"],
    );
    assert!(quota.status.success(), "{}", stderr(&quota));
    let mut admitted = Vec::new();
    for _ in 0..2 {
        let reply = request_trigger(&client.nats, "ax.request.trigger", "b/flood").await;
        assert!(reply.ok, "{reply:?}");
        admitted.push(reply.instance_id.expect("an instance").to_string());
    }
    let refused = request_trigger(&client.nats, "ax.request.trigger", "b/flood").await;
    assert!(!refused.ok && refused.instance_id.is_none(), "{refused:?}");
    assert!(
        refused.errors[0].starts_with("namespace b has 2 instances waiting to run, its quota"),
        "{refused:?}"
    );
    let resumed = ax(&nats.url(), &["queue", "resume", "normal"]);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    for id in &admitted {
        let record = final_record(&client, id, Duration::from_secs(60)).await;
        assert_eq!(record.state, State::Success, "{record:?}");
    }

    // Removed, the quota no longer holds the apply back.
    let removed = ax(&nats.url(), &["namespace", "delete", "b"]);
    assert!(removed.status.success(), "{}", stderr(&removed));
    let out = ax(
        &nats.url(),
        &["job", "apply", "-f", file.to_str().expect("utf-8 path")],
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

/// Two namespaces' floods, 6 attempts each, on the node's worker `worker-1` of 2 slots, whose
/// commands write the jobs' own ledger: their instances, once two attempts run and the rest
/// are held back for slots.
async fn two_floods_held(nats: &TestNats, client: &ax_bus::AxClient, ledger: &Path) -> Vec<String> {
    let spec = |namespace: &str| {
        let head = format!("  namespace: {namespace}\n");
        crate::support::verdict::ledger_spec("slow", &head, ledger, 3, 60, "")
    };
    apply_job(nats, "slow", &format!("{}---\n{}", spec("a"), spec("b"))).await;
    wait_for(
        Duration::from_secs(30),
        "the worker's heartbeat",
        || async { worker_listed(nats, "worker-1") },
    )
    .await;
    let ids = trigger_together(client, (0..6).flat_map(|_| ["a/slow", "b/slow"])).await;
    wait_for(Duration::from_secs(30), "two attempts started", || async {
        let started = ledger::read(ledger)
            .iter()
            .filter(|l| l.kind == "start")
            .count();
        (started >= 2).then_some(())
    })
    .await;
    ids
}

/// Every instance of `ids` succeeded, and the ledger shows no attempt started twice and no two
/// attempts of an instance at once; the starts it shows.
async fn each_ran_once_at_a_time(
    client: &ax_bus::AxClient,
    ids: &[String],
    ledger: &Path,
) -> usize {
    for id in ids {
        let record = final_record(client, id, Duration::from_secs(120)).await;
        assert_eq!(record.state, State::Success, "{record:?}");
    }
    let findings = ledger::examine(&ledger::read(ledger));
    assert!(findings.started_twice.is_empty(), "{findings:?}");
    assert!(findings.overlapping.is_empty(), "{findings:?}");
    findings.starts
}

/// A Router killed while it holds two namespaces' work back for slots loses nothing and runs
/// nothing twice: what it had sent runs on; what it held comes back, unacknowledged, to the
/// next Router (after the ready consumers' ack wait) and runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_killed_while_it_holds_work_back_loses_nothing_and_runs_nothing_twice() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let ledger = nats.path("ledger").join("lines");
    let mut core = AxProcess::node(&nats, "core-1", "scheduler,dag,router", &[]);
    let _worker = AxProcess::node(&nats, "worker-1", "worker", &["--slots", "2"]);
    let ids = two_floods_held(&nats, &client, &ledger).await;
    core.kill9();
    let _next = AxProcess::node(&nats, "core-2", "scheduler,dag,router", &[]);
    let starts = each_ran_once_at_a_time(&client, &ids, &ledger).await;
    assert_eq!(starts, ids.len(), "an attempt ran again");
}

/// A worker killed while namespaces share it, and back at once: the attempts it ran are lost
/// and run again, its end words never come — the Router counts them ended when its heartbeats
/// no longer list them — and the work held back runs, nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_while_namespaces_share_it_holds_nothing_back_for_good() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let ledger = nats.path("ledger").join("lines");
    let _core = AxProcess::node(&nats, "core-1", "scheduler,dag,router", &[]);
    let mut worker = AxProcess::node(&nats, "worker-1", "worker", &["--slots", "2"]);
    let ids = two_floods_held(&nats, &client, &ledger).await;
    worker.kill9();
    let _again = AxProcess::node(&nats, "worker-1", "worker", &["--slots", "2"]);
    let starts = each_ran_once_at_a_time(&client, &ids, &ledger).await;
    // The two it ran when killed ran again, under new traces.
    assert!(starts >= ids.len() + 2, "{starts} starts");
}
