//! Hostile input: what an attacker or a careless user sends is refused where it arrives, with
//! the place and the reason, and never crashes, wedges, escalates or destroys (the spec bounds
//! are in `bad_input.rs`, the executors' file and network rules in `executors.rs`).

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use ax_bus::messages::commands::Command;
use ax_bus::messages::{Alert, ControlReply, JobNameRequest, TriggerRequest, REPLY_TO_HEADER};
use ax_bus::{codec, codec::JSON};
use futures::StreamExt;
use support::*;

const JOB: &str = "version: v1\njob:\n  name: target\n  exec: { type: noop }\n";

/// Publishes a JSON trigger of `target` whose answer is asked for on `reply_to`.
async fn trigger_replying_to(client: &ax_bus::AxClient, reply_to: &str) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(codec::CONTENT_TYPE, JSON);
    headers.insert(REPLY_TO_HEADER, reply_to);
    client
        .js
        .publish_with_headers(
            "ax.control.trigger",
            headers,
            br#"{"name": "target"}"#.to_vec().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_go_only_to_inboxes() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "scheduler", &[]);
    apply_job(&nats, "target", JOB).await;
    let (before, revision) = client.job(&job("target")).await.unwrap().unwrap();
    let mut alerts = client.nats.subscribe("ax.alert.control").await.unwrap();
    let mut elsewhere = client.nats.subscribe("billing.>").await.unwrap();

    for steered in [
        "$KV.ax_jobs.target",
        "$KV.ax_jobs.x",
        "billing.charge",
        "ax.internal.dispatch.w1",
        "_INBOX.>",
    ] {
        trigger_replying_to(&client, steered).await;
        let message = tokio::time::timeout(Duration::from_secs(10), alerts.next())
            .await
            .unwrap_or_else(|_| panic!("no alert for Ax-Reply-To {steered}\n{}", node.log_text()))
            .unwrap();
        let alert: Alert = codec::decode(&message.payload).unwrap();
        assert!(
            alert.message.contains("Ax-Reply-To") && alert.message.contains(steered),
            "{steered}: {}",
            alert.message
        );
    }
    // Nothing was written where the answers were steered, and nothing was carried out.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), elsewhere.next())
            .await
            .is_err(),
        "an answer reached billing.>"
    );
    let (after, now) = client.job(&job("target")).await.unwrap().unwrap();
    assert_eq!((after, now), (before, revision));
    assert_eq!(client.jobs().await.unwrap().len(), 1);
    assert!(client.instances(None).await.unwrap().is_empty());

    // An inbox gets its answer, and the command is carried out.
    let inbox = client.nats.new_inbox();
    let mut answers = client.nats.subscribe(inbox.clone()).await.unwrap();
    trigger_replying_to(&client, &inbox).await;
    let answer = tokio::time::timeout(Duration::from_secs(10), answers.next())
        .await
        .expect("an answer in the inbox")
        .unwrap();
    let reply: ControlReply =
        codec::decode_by_header(answer.headers.as_ref(), &answer.payload).unwrap();
    assert!(reply.ok, "{:?}", reply.errors);
    assert_eq!(client.instances(None).await.unwrap().len(), 1);
    assert!(!node.log_text().contains("panicked"), "{}", node.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_too_big_to_hand_on_is_refused_and_later_commands_go_on() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "scheduler", &[]);
    apply_job(&nats, "target", JOB).await;

    let big = TriggerRequest {
        name: job("target"),
        biz_date: None,
        params: BTreeMap::from([("blob".to_string(), serde_json::json!("x".repeat(700_000)))]),
        key: None,
        at: None,
        delay: None,
    };
    let reply = client
        .send_raw(Command::Trigger, &big, Duration::from_secs(10))
        .await
        .expect("an answer");
    assert!(!reply.ok);
    assert!(
        reply
            .errors
            .iter()
            .any(|e| e.starts_with("params:") && e.contains("65536")),
        "{:?}",
        reply.errors
    );
    assert!(client.instances(None).await.unwrap().is_empty());

    // The commands behind it are answered at once.
    let pause = JobNameRequest {
        name: job("target"),
    };
    let reply = client
        .send_raw(Command::Pause, &pause, Duration::from_secs(10))
        .await
        .expect("the pause is answered");
    assert!(reply.ok, "{:?}", reply.errors);
    for date in ["2026-2-3", "+2026-02-03", "2026-02-30"] {
        let dated = TriggerRequest {
            name: job("target"),
            biz_date: Some(date.to_string()),
            params: BTreeMap::new(),
            key: None,
            at: None,
            delay: None,
        };
        let reply = client
            .send_raw(Command::Trigger, &dated, Duration::from_secs(10))
            .await
            .expect("an answer");
        assert!(
            !reply.ok && reply.errors.iter().any(|e| e.contains("YYYY-MM-DD")),
            "{date}: {:?}",
            reply.errors
        );
    }
    assert!(!node.log_text().contains("panicked"), "{}", node.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_entries_written_past_the_checks_are_never_run() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let mut alerts = client.nats.subscribe("ax.alert.registry").await.unwrap();
    let marker = nats.path("rogue").join("ran");
    // What a stolen credential with write access to the bucket could put there: a job that
    // breaks the bounds (the Reporter's old crash loop), and bytes that are no job at all.
    let rogue: ax_bus::spec::JobDocument = serde_json::from_value(serde_json::json!({
        "version": "v1",
        "job": {
            "name": "rogue",
            "cron": "* * * * * *",
            "exec": {"type": "shell", "command": format!("touch {}", marker.display())},
            "retry": {"times": 3, "interval": 1_000_000_000_000_000_000u64}
        }
    }))
    .unwrap();
    let record = ax_bus::messages::JobRecord {
        spec: rogue.job,
        paused: false,
        updated_at: ax_bus::time::now(),
        defined_at: None,
    };
    client
        .jobs
        .put("rogue", codec::encode(&record).unwrap())
        .await
        .unwrap();
    client
        .jobs
        .put("junk", b"garbage".to_vec().into())
        .await
        .unwrap();
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(
        &nats,
        "honest",
        "version: v1\njob:\n  name: honest\n  cron: \"* * * * * *\"\n  exec: { type: noop }\n",
    )
    .await;

    let mut told = std::collections::BTreeSet::new();
    while told.len() < 2 {
        let message = tokio::time::timeout(Duration::from_secs(20), alerts.next())
            .await
            .unwrap_or_else(|_| panic!("registry alerts: {told:?}\n{}", node.log_text()))
            .unwrap();
        let alert: Alert = codec::decode(&message.payload).unwrap();
        for key in ["rogue", "junk"] {
            if alert.message.contains(&format!("`{key}` ignored")) {
                told.insert(key);
            }
        }
        if alert.message.contains("rogue") {
            assert!(
                alert.message.contains("job.retry.interval"),
                "{}",
                alert.message
            );
        }
    }
    // The honest every-second job fires; the rogue one, on the same cron, never does.
    wait_for(Duration::from_secs(30), "three fires of honest", || async {
        let fired = client.instances(Some(&job("honest"))).await.ok()?;
        (fired.len() >= 3).then_some(())
    })
    .await;
    assert!(client
        .instances(Some(&job("rogue")))
        .await
        .unwrap()
        .is_empty());
    assert!(!marker.exists());

    // Listing goes on past them, a trigger refuses to run one, and both can be deleted.
    let listed = ax(&nats.url(), &["job", "list"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let refused = client
        .send_raw(
            Command::Trigger,
            &TriggerRequest {
                name: job("rogue"),
                biz_date: None,
                params: BTreeMap::new(),
                key: None,
                at: None,
                delay: None,
            },
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert!(
        !refused.ok && refused.errors.iter().any(|e| e.contains("not a valid job")),
        "{:?}",
        refused.errors
    );
    for key in ["rogue", "junk"] {
        let deleted = ax(&nats.url(), &["job", "delete", key]);
        assert!(deleted.status.success(), "{key}: {}", stderr(&deleted));
    }
    assert!(!node.log_text().contains("panicked"), "{}", node.log_text());
}

const HELD: &str = "version: v1
job:
  name: held
  deps: [ { name: never, biz_date: current } ]
  exec: { type: shell, command: 'true' }
---
version: v1
job:
  name: never
  exec: { type: noop }
";

/// A new instance of `held`, once it waits for its dependency: nothing legitimate dispatches it.
async fn waiting_held(
    nats: &TestNats,
    client: &ax_bus::AxClient,
) -> (ax_bus::ids::InstanceId, ax_bus::InstanceRecord) {
    let id = trigger(nats, &["held"]);
    let instance = ax_bus::ids::InstanceId::parse(&id).unwrap();
    let record = wait_for(Duration::from_secs(30), "held to wait", || async {
        client
            .instance(&instance)
            .await
            .ok()
            .flatten()
            .map(|(r, _)| r)
            .filter(|r| r.tag == ax_bus::Tag::WaitingDeps)
    })
    .await;
    (instance, record)
}

/// Publishes a dispatch of `record`'s attempt carrying `spec` straight into worker n1's queue,
/// as a stolen Router credential could; returns the instance once it is no longer running.
async fn dispatch_to_n1(
    client: &ax_bus::AxClient,
    node: &AxProcess,
    record: &ax_bus::InstanceRecord,
    spec: ax_bus::JobSpec,
) -> ax_bus::InstanceRecord {
    let mut work = ax_bus::messages::WorkItem::for_attempt(record, spec);
    work.dispatch = Some(ax_bus::ids::DispatchId::random());
    work.worker = Some(ax_bus::ids::WorkerId::parse("n1").unwrap());
    client
        .js
        .publish(
            client
                .subjects()
                .dispatch("n1", ax_bus::spec::Priority::Normal),
            codec::encode(&work).unwrap(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let instance = &record.instance_id;
    wait_for_logged(
        Duration::from_secs(30),
        "the dispatched attempt to end",
        &[node],
        || async {
            client
                .instance(instance)
                .await
                .ok()
                .flatten()
                .map(|(r, _)| r)
                .filter(|r| r.state != ax_bus::State::Running)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_whose_definition_the_registry_does_not_hold_is_refused_not_run() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(&nats, "held", HELD).await;
    let mut alerts = client.nats.subscribe("ax.alert.dispatch").await.unwrap();
    // A real instance, waiting for its dependency: nothing legitimate dispatches it yet.
    let (instance, record) = waiting_held(&nats, &client).await;
    // What a stolen Router credential could send: the job's name, a command of its own and a
    // retry rule, straight into the worker's queue.
    let marker = nats.path("forged").join("ran");
    let (registered, _) = client.job(&job("held")).await.unwrap().unwrap();
    let mut forged = registered.spec.clone();
    forged.exec = serde_json::from_value(serde_json::json!(
        {"type": "shell", "command": format!("touch {}", marker.display())}
    ))
    .unwrap();
    forged.retry = serde_json::from_value(serde_json::json!({"times": 3, "interval": 1})).unwrap();
    let ended = dispatch_to_n1(&client, &node, &record, forged).await;
    assert_eq!(
        (ended.state, ended.tag),
        (ax_bus::State::Failed, ax_bus::Tag::Unregistered),
        "{ended:?}"
    );
    let message = tokio::time::timeout(Duration::from_secs(10), alerts.next())
        .await
        .expect("an alert about the dispatch")
        .unwrap();
    let alert: Alert = codec::decode(&message.payload).unwrap();
    assert!(
        alert.message.contains("none the job registry holds") && alert.message.contains("held"),
        "{}",
        alert.message
    );
    assert!(!marker.exists(), "the forged command ran");
    // Not retried by the forged rule: it stays failed.
    let (after, _) = client.instance(&instance).await.unwrap().unwrap();
    assert_eq!(
        (after.state, after.attempt),
        (ax_bus::State::Failed, record.attempt)
    );
    assert!(!node.log_text().contains("panicked"), "{}", node.log_text());
}

/// A ready attempt naming an executor that no worker can ever offer (a path, as a stolen
/// credential could write past the Schedulers' checks) ends `failed` at once, saying why,
/// instead of waiting for a worker for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_attempt_naming_a_path_as_its_executor_fails_at_once() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(&nats, "held", HELD).await;
    let (instance, record) = waiting_held(&nats, &client).await;
    let (registered, _) = client.job(&job("held")).await.unwrap().unwrap();
    let mut forged = registered.spec.clone();
    // Past the spec's rules a path is still a plugin's name to the wire: the Router fails it.
    forged.exec = ax_bus::spec::ExecSpec::Plugin(ax_bus::spec::PluginExec {
        name: "../../bin/sh".into(),
        with: None,
        workdir: None,
        env: Default::default(),
    });
    let work = ax_bus::messages::WorkItem::for_attempt(&record, forged);
    client
        .js
        .publish(
            client.subjects().ready(ax_bus::spec::Priority::Normal),
            codec::encode(&work).unwrap(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let ended = final_record(&client, instance.as_str(), Duration::from_secs(30)).await;
    assert_eq!(
        (ended.state, ended.tag),
        (ax_bus::State::Failed, ax_bus::Tag::ExecutorError),
        "{ended:?}"
    );
    assert!(
        ended
            .message
            .contains("no worker can offer executor `../../bin/sh`"),
        "{}",
        ended.message
    );
}

/// A worker remembers the definitions it found in the registry until their jobs change: a job
/// it has just run, once deleted, is not vouched for by that memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_job_is_forgotten_by_the_workers_that_ran_it() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(&nats, "held", HELD).await;
    let gone = "version: v1\njob:\n  name: gone\n  cron: '* * * * * *'\n  exec: { type: shell, command: 'true' }\n";
    apply_job(&nats, "gone", gone).await;
    // It runs again and again on n1, whose memory vouches for its definition.
    wait_for(Duration::from_secs(30), "gone to run twice", || async {
        let records = instances(&client, "gone").await;
        let done = records
            .iter()
            .filter(|r| r.state == ax_bus::State::Success)
            .count();
        (done >= 2).then_some(())
    })
    .await;
    let (registered, _) = client.job(&job("gone")).await.unwrap().unwrap();
    let deleted = ax(&nats.url(), &["job", "delete", "gone"]);
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    // Longer than a definition is vouched for without the registry watch: only a memory that
    // missed the deletion would still vouch for it now.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Its definition, as it was, in a dispatch of a waiting instance.
    let (_, record) = waiting_held(&nats, &client).await;
    let ended = dispatch_to_n1(&client, &node, &record, registered.spec).await;
    assert_eq!(
        (ended.state, ended.tag),
        (ax_bus::State::Failed, ax_bus::Tag::Unregistered),
        "{ended:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_created_before_an_edit_runs_as_it_was_defined() {
    let nats = TestNats::start();
    let client = nats.client().await;
    // No worker yet: the attempt waits with the first definition while the job is edited.
    let core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let out = nats.path("out");
    let version = |v: u32| {
        format!(
            "version: v1\njob:\n  name: edited\n  exec: {{ type: shell, command: 'echo {v} >> {}/ran' }}\n",
            out.display()
        )
    };
    apply_job(&nats, "edited", &version(1)).await;
    let id = trigger(&nats, &["edited"]);
    for v in 2..=4 {
        apply_job(&nats, "edited", &version(v)).await;
    }
    let _worker = AxProcess::node(&nats, "w1", "worker", &[]);
    let record = final_record(&client, &id, Duration::from_secs(60)).await;
    assert_eq!(
        record.state,
        ax_bus::State::Success,
        "{record:?}\n{}",
        core.log_text()
    );
    assert_eq!(
        std::fs::read_to_string(out.join("ran")).unwrap().trim(),
        "1",
        "the attempt ran as defined when it was created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fire_too_big_for_the_server_is_set_aside_and_the_rest_goes_on() {
    let mut nats = TestNats::start_with_config(Some("max_payload: 1048576\n"), None);
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    // Params of 60 KB, carried three times by a hand-off (the definition, the attempt and
    // its record): it fits the default 1 MiB, not the 128 KiB set below.
    let big = |name: &str, cron: &str| {
        format!(
            "version: v1\njob:\n  name: {name}\n{cron}  params: {{ blob: {} }}\n  exec: {{ type: noop }}\n",
            "x".repeat(60_000)
        )
    };
    apply_job(&nats, "big", &big("big", "  cron: '* * * * * *'\n")).await;
    apply_job(
        &nats,
        "small",
        "version: v1\njob:\n  name: small\n  cron: '* * * * * *'\n  exec: { type: noop }\n",
    )
    .await;
    wait_for_logged(Duration::from_secs(30), "big to run", &[&node], || async {
        let runs = client.instances(Some(&job("big"))).await.ok()?;
        runs.iter()
            .any(|r| r.state == ax_bus::State::Success)
            .then_some(())
    })
    .await;

    // The server's limit is lowered under the running cluster: every fire of `big` now fails
    // to be handed on, for good.
    std::fs::write(
        nats.dir.path().join("nats-server.conf"),
        "max_payload: 131072\n",
    )
    .unwrap();
    nats.server.restart().unwrap();
    let restarted = ax_bus::time::now();
    let set_aside = wait_for_logged(
        Duration::from_secs(60),
        "a fire of big to be set aside",
        &[&node],
        || async {
            let runs = client.instances(Some(&job("big"))).await.ok()?;
            runs.into_iter()
                .find(|r| r.state == ax_bus::State::Failed && r.tag == ax_bus::Tag::Rejected)
        },
    )
    .await;
    assert!(
        set_aside.message.contains("set aside") && set_aside.message.contains("max payload"),
        "{}",
        set_aside.message
    );
    // Nothing waits behind it: the small job keeps firing and finishing.
    wait_for_logged(
        Duration::from_secs(30),
        "small to go on",
        &[&node],
        || async {
            let runs = client.instances(Some(&job("small"))).await.ok()?;
            let after = runs
                .iter()
                .filter(|r| r.state == ax_bus::State::Success && r.expected_time > restarted)
                .count();
            (after >= 3).then_some(())
        },
    )
    .await;
    // And what would be too big is refused when asked for, naming the limit.
    let trigger = ax(&nats.url(), &["job", "trigger", "big"]);
    assert!(!trigger.status.success());
    assert!(
        stderr(&trigger).contains("max_payload of 131072"),
        "{}",
        stderr(&trigger)
    );
    let file = nats.path("specs").join("bigger.yaml");
    std::fs::write(&file, big("bigger", "")).unwrap();
    let applied = ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()]);
    assert!(!applied.status.success());
    assert!(
        stderr(&applied).contains("max_payload"),
        "{}",
        stderr(&applied)
    );
    assert!(!node.log_text().contains("panicked"), "{}", node.log_text());
}
