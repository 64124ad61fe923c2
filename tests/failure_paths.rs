//! Failure paths of the skeleton: a worker killed mid-attempt, NATS restarted under load, a
//! dispatch delivered twice, failed attempts retried with backoff, a Scheduler restarted.

use crate::support;

use std::time::Duration;

use ax_bus::messages::WorkItem;
use ax_bus::{State, Tag};
use support::*;

fn lines_with(path: &std::path::Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

/// One trace, one execution: a worker killed while its command runs (here: restarted at once,
/// before the janitor could notice) finds its own claim on the attempt when it comes back; the
/// attempt may have had its effect, so it is lost (tag `worker_lost`) and the instance runs a
/// new attempt under a new trace id — never the same trace twice. A business claim is per
/// attempt: the dead attempt's stays taken, the new attempt claims afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_command_loses_the_attempt_and_a_new_trace_runs() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _control = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let mut worker = AxProcess::node(&nats, "w1", "worker", &[]);
    let ledger = nats.path("jobs").join("ledger");
    apply_job(
        &nats,
        "slow",
        &format!(
            "version: v1\njob:\n  name: slow\n  exec:\n    type: shell\n    command: 'echo start $AX_TRACE_ID >> {l}; sleep 2; echo end $AX_TRACE_ID >> {l}'\n",
            l = ledger.display()
        ),
    )
    .await;
    let id = trigger(&nats, &["slow"]);
    let first = wait_for(Duration::from_secs(15), "the attempt to start", || async {
        let text = std::fs::read_to_string(&ledger).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("start "))
            .map(|t| t.parse::<ax_bus::ids::TraceId>().expect("a trace id"))
    })
    .await;
    // Business code of the first attempt took its claim before the kill.
    assert!(client.claim(&first, "billing").await.unwrap());
    worker.kill9();
    let _worker_again = AxProcess::node(&nats, "w1", "worker", &[]);
    let record = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(record.state, State::Success, "{}", record.message);
    assert_eq!(record.attempt, 2, "a new attempt after the lost one");
    assert_ne!(record.trace_id, first, "under a new trace id");
    assert_eq!(record.worker_losses, 1);
    let text = std::fs::read_to_string(&ledger).unwrap();
    let started: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("start "))
        .collect();
    assert_eq!(
        started,
        [first.as_str(), record.trace_id.as_str()],
        "{text}"
    );
    assert_eq!(
        lines_with(&ledger, "end"),
        1,
        "the killed run did not go on"
    );
    // The lost attempt's result says so; the new attempt's claim is its own.
    let lost = wait_for(
        Duration::from_secs(10),
        "the lost attempt's result",
        || async {
            results_of(&client, "slow")
                .await
                .into_iter()
                .find(|r| r.trace_id == first)
        },
    )
    .await;
    assert_eq!(lost.tag, ax_bus::Tag::WorkerLost);
    assert!(!client.claim(&first, "billing").await.unwrap());
    assert!(client.claim(&record.trace_id, "billing").await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_restart_loses_no_fire_and_no_result() {
    let mut nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(
        &nats,
        "beat",
        "version: v1\njob:\n  name: beat\n  cron: \"* * * * * *\"\n  exec:\n    type: shell\n    command: 'sleep 0.5'\n",
    )
    .await;
    wait_for(
        Duration::from_secs(20),
        "beats before the outage",
        || async {
            let n = instances(&client, "beat")
                .await
                .iter()
                .filter(|r| r.state == State::Success)
                .count();
            (n >= 2).then_some(())
        },
    )
    .await;
    let before_outage = ax_bus::time::now();
    nats.outage(Duration::from_secs(3)).await;
    let client = nats.client().await;
    let after_outage = ax_bus::time::now();
    wait_for_logged(
        Duration::from_secs(40),
        "beats after the outage",
        &[&node],
        || async {
            let done = instances(&client, "beat")
                .await
                .into_iter()
                .filter(|r| r.state == State::Success && r.expected_time > after_outage)
                .count();
            (done >= 3).then_some(())
        },
    )
    .await;
    // Every second from the first beat on has exactly one instance, the outage included, and
    // each one that was due before the restart ended.
    let records = instances(&client, "beat").await;
    for pair in records.windows(2) {
        assert_eq!(
            pair[1].expected_time - pair[0].expected_time,
            chrono::Duration::seconds(1),
            "gap around {}\n{}",
            pair[0].instance_id,
            node.log_text()
        );
    }
    wait_for_logged(
        Duration::from_secs(30),
        "every beat of the outage to finish",
        &[&node],
        || async {
            let records = instances(&client, "beat").await;
            records
                .iter()
                .filter(|r| r.expected_time <= after_outage && r.expected_time >= before_outage)
                .all(|r| r.state == State::Success)
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_delivered_twice_runs_once() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let ledger = nats.path("jobs").join("ledger");
    apply_job(
        &nats,
        "once",
        &format!(
            "version: v1\njob:\n  name: once\n  exec:\n    type: shell\n    command: 'echo ran >> {}'\n",
            ledger.display()
        ),
    )
    .await;
    let id = trigger(&nats, &["once"]);
    let record = final_record(&client, &id, Duration::from_secs(15)).await;
    let (job, _) = client.job(&support::job("once")).await.unwrap().unwrap();
    let work = WorkItem {
        instance_id: record.instance_id.clone(),
        trace_id: record.trace_id.clone(),
        attempt: record.attempt,
        run_start: record.run_start,
        biz_date: record.biz_date.clone(),
        expected_time: record.expected_time,
        params: record.params.clone(),
        spec: job.spec.into(),
        worker: Some(support::node("n1")),
        gate: None,
        dispatch: record
            .dispatch
            .as_ref()
            .and_then(|note| note.dispatch.clone()),
        router: Some(support::node("n1")),
        shard: None,
        pin: record.pin.clone(),
        stored: None,
        passed_over: Vec::new(),
        trigger: Some(record.trigger),
        due_at: record.due_at,
        tell_end: false,
    };
    // The same dispatch again, under a new message id so JetStream does not drop it.
    client
        .js
        .send_publish(
            "ax.internal.dispatch.n1.normal",
            async_nats::jetstream::message::PublishMessage::build()
                .headers(ax_bus::codec::msgpack_headers())
                .message_id("a-second-delivery")
                .payload(ax_bus::codec::encode(&work).unwrap()),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    wait_for(
        Duration::from_secs(10),
        "the duplicate to be consumed",
        || async {
            let mut stream = client.js.get_stream("AX_DISPATCH").await.unwrap();
            (stream.info().await.unwrap().state.messages == 0).then_some(())
        },
    )
    .await;
    assert_eq!(lines_with(&ledger, "ran"), 1, "the attempt ran twice");
    let after = client.instance(&support::id(&id)).await.unwrap().unwrap().0;
    assert_eq!(after, record, "the record changed");
}

/// One fence: a second dispatch of an attempt running on one worker — another dispatch id, to
/// the other worker — is refused by the record (started already), and the attempt runs and
/// ends once, on the first; a copy refused for a forged definition does not end it either.
/// Shorter than a lease renewal, it leaves no claim behind: its start was its only fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_dispatch_of_a_running_attempt_elsewhere_is_refused() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let n1 = AxProcess::node(&nats, "n1", "all", &[]);
    let w2 = AxProcess::node(&nats, "w2", "worker", &[]);
    let ledger = nats.path("jobs").join("ledger");
    apply_job(
        &nats,
        "twice",
        &format!(
            "version: v1\njob:\n  name: twice\n  exec:\n    type: shell\n    command: 'echo ran $AX_WORKER >> {}; sleep 4'\n",
            ledger.display()
        ),
    )
    .await;
    let id = trigger(&nats, &["twice"]);
    let record = executing(&client, &id, Duration::from_secs(20)).await;
    let runner = record.worker.clone().expect("a worker");
    let (other, other_log) = if runner.as_str() == "n1" {
        ("w2", &w2)
    } else {
        ("n1", &n1)
    };
    let (job, _) = client.job(&support::job("twice")).await.unwrap().unwrap();
    let send_copy = |spec: ax_bus::JobSpec| {
        let mut work = WorkItem::for_attempt(&record, spec);
        work.dispatch = Some(ax_bus::ids::DispatchId::random());
        work.worker = Some(support::node(other));
        let client = client.clone();
        async move {
            let subject = client
                .subjects()
                .dispatch(other, ax_bus::spec::Priority::Normal);
            let payload = ax_bus::codec::encode(&work).unwrap();
            client
                .js
                .publish(subject, payload)
                .await
                .unwrap()
                .await
                .unwrap();
        }
    };
    let refused_in_log = |what: &'static str| {
        let log = other_log;
        move || async move { log.log_text().contains(what).then_some(()) }
    };
    send_copy(job.spec.clone()).await;
    wait_for(
        Duration::from_secs(20),
        "the second dispatch to be refused",
        refused_in_log("not ours to run (started by another dispatch)"),
    )
    .await;
    // A third copy, its definition forged: refused before it starts, and its refusal cannot
    // end the attempt that runs elsewhere.
    let mut forged = job.spec.clone();
    forged.exec = ax_bus::spec::ExecSpec::shell("echo forged");
    send_copy(forged).await;
    wait_for(
        Duration::from_secs(20),
        "the forged dispatch's refusal dropped",
        refused_in_log("result of a superseded attempt dropped"),
    )
    .await;
    let done = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(done.state, State::Success, "{}", done.message);
    assert_eq!(done.worker.as_ref(), Some(&runner));
    assert_eq!((done.attempt, &done.trace_id), (1, &record.trace_id));
    let ran = std::fs::read_to_string(&ledger).unwrap();
    assert_eq!(
        ran.lines().collect::<Vec<_>>(),
        [format!("ran {runner}")],
        "{ran}"
    );
    assert!(
        client.claim_of(&record.trace_id).await.unwrap().is_none(),
        "an attempt shorter than a renewal writes no claim"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_consumer_left_by_a_dead_janitor_does_not_block_the_worker() {
    // A janitor killed while draining a worker it judged dead leaves its consumer on the
    // worker's queue; a work-queue stream allows one consumer per subject, so the worker, back
    // by then, could never open its queue and its dispatches waited for ever.
    let nats = TestNats::start();
    let client = nats.client().await;
    set_up(&nats.url()).await;
    let stream = client.js.get_stream("AX_DISPATCH").await.unwrap();
    stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("janitor-n1-normal".into()),
            filter_subject: "ax.internal.dispatch.n1.normal".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(
        &nats,
        "after_drain",
        "version: v1\njob:\n  name: after_drain\n  exec:\n    type: shell\n    command: 'true'\n",
    )
    .await;
    let id = trigger(&nats, &["after_drain"]);
    let record = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(
        record.state,
        State::Success,
        "{record:?}\n{}",
        node.log_text()
    );
    assert!(
        stream.consumer_info("janitor-n1-normal").await.is_err(),
        "the drain consumer is still there"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_are_retried_with_doubling_backoff() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let ledger = nats.path("jobs").join("ledger");
    apply_job(
        &nats,
        "flaky",
        &format!(
            "version: v1\njob:\n  name: flaky\n  exec:\n    type: shell\n    command: 'echo \"$AX_ATTEMPT $(date +%s.%N)\" >> {}; [ \"$AX_ATTEMPT\" -ge 3 ]'\n  retry: {{ times: 3, interval: 1 }}\n",
            ledger.display()
        ),
    )
    .await;
    let id = trigger(&nats, &["flaky"]);
    let record = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(
        (record.state, record.attempt),
        (State::Success, 3),
        "{}",
        record.message
    );
    let starts: Vec<f64> = std::fs::read_to_string(&ledger)
        .unwrap()
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    assert_eq!(starts.len(), 3);
    // interval 1 s, doubled: the second attempt >= 1 s after the first, the third >= 2 s later.
    assert!(starts[1] - starts[0] >= 1.0, "{starts:?}");
    assert!(starts[2] - starts[1] >= 2.0, "{starts:?}");
    assert!(starts[2] - starts[1] < 6.0, "{starts:?}");

    apply_job(
        &nats,
        "hopeless",
        "version: v1\njob:\n  name: hopeless\n  exec:\n    type: shell\n    command: 'exit 3'\n  retry: { times: 1, interval: 1 }\n",
    )
    .await;
    let id = trigger(&nats, &["hopeless"]);
    let record = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(
        (record.state, record.tag, record.attempt),
        (State::Failed, Tag::ExitCode, 2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_scheduler_reloads_the_registry_and_fires_again() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let mut scheduler = AxProcess::node(&nats, "s1", "scheduler", &[]);
    let _rest = AxProcess::node(&nats, "w", "dag,router,worker", &[]);
    apply_job(
        &nats,
        "tick",
        "version: v1\njob:\n  name: tick\n  cron: \"* * * * * *\"\n  exec:\n    type: shell\n    command: 'true'\n",
    )
    .await;
    wait_for(Duration::from_secs(20), "ticks", || async {
        (instances(&client, "tick").await.len() >= 2).then_some(())
    })
    .await;
    scheduler.kill9();
    let _scheduler = AxProcess::node(&nats, "s1", "scheduler", &[]);
    let restarted = ax_bus::time::now();
    wait_for(
        Duration::from_secs(20),
        "ticks after the restart",
        || async {
            let later = instances(&client, "tick")
                .await
                .into_iter()
                .filter(|r| r.expected_time > restarted && r.state == State::Success)
                .count();
            (later >= 2).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_retry_survives_its_scheduler_and_runs_on_another_worker() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let mut scheduler = AxProcess::node(&nats, "s1", "scheduler", &[]);
    let _core = AxProcess::node(&nats, "core", "dag,router", &[]);
    let mut first_worker = AxProcess::node(&nats, "w1", "worker", &[]);
    apply_job(
        &nats,
        "second_time",
        "version: v1\njob:\n  name: second_time\n  exec:\n    type: shell\n    command: '[ \"$AX_ATTEMPT\" -ge 2 ]'\n  retry: { times: 1, interval: 4 }\n",
    )
    .await;
    let id = trigger(&nats, &["second_time"]);
    let waiting = wait_for(Duration::from_secs(20), "waiting_retry", || async {
        let record = client.instance(&support::id(&id)).await.unwrap()?.0;
        (record.state == State::WaitingRetry).then_some(record)
    })
    .await;
    assert_eq!(waiting.worker.as_deref(), Some("w1"));
    let due = waiting.next_attempt_at.expect("a next attempt time");
    scheduler.kill9();
    first_worker.kill9();
    let _other_scheduler = AxProcess::node(&nats, "s2", "scheduler", &[]);
    let _other_worker = AxProcess::node(&nats, "w2", "worker", &[]);
    let record = final_record(&client, &id, Duration::from_secs(40)).await;
    assert_eq!(
        (record.state, record.attempt),
        (State::Success, 2),
        "{}",
        record.message
    );
    assert_eq!(record.worker.as_deref(), Some("w2"));
    let started = record.started_at.expect("started");
    assert!(started >= due, "ran at {started}, due {due}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_longer_than_the_ack_wait_is_never_redelivered() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let config = "[worker]\ndispatch_ack_wait = 1.5\n";
    let _node = AxProcess::configured(&nats, "w1", "all", config);
    let ledger = nats.path("jobs").join("ledger");
    apply_job(
        &nats,
        "long",
        &format!(
            "version: v1\njob:\n  name: long\n  exec:\n    type: shell\n    command: 'echo start >> {}; sleep 7'\n",
            ledger.display()
        ),
    )
    .await;
    let id = trigger(&nats, &["long"]);
    let record = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(
        (record.state, record.attempt),
        (State::Success, 1),
        "{}",
        record.message
    );
    assert_eq!(lines_with(&ledger, "start"), 1);
    // Nearly five ack waits went by; the in-progress acks kept the one delivery alive.
    delivered_once(&client, "worker-w1-normal").await;
}

/// Asserts that the dispatch consumer `name` delivered one message, never again.
async fn delivered_once(client: &ax_bus::AxClient, name: &str) {
    let mut consumer: async_nats::jetstream::consumer::PullConsumer = client
        .js
        .get_stream("AX_DISPATCH")
        .await
        .unwrap()
        .get_consumer(name)
        .await
        .unwrap();
    let info = consumer.info().await.unwrap();
    assert_eq!(
        (info.delivered.consumer_sequence, info.num_redelivered),
        (1, 0),
        "{info:?}"
    );
}

/// A dispatch that waits for a slot — here a normal one behind a 4 s high-priority attempt on a
/// one-slot worker (each priority's queue delivers up to its own limit) — is kept in progress
/// while it waits, so two ack waits go by without JetStream delivering it again.
/// (Under the Routers' 5 s `ack_timeout`: a longer wait has the Router dispatch it anew.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_waiting_for_a_slot_longer_than_the_ack_wait_is_never_redelivered() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let config = "[worker]\nslots = 1\ndispatch_ack_wait = 1.5\n";
    let _node = AxProcess::configured(&nats, "w1", "all", config);
    apply_job(
        &nats,
        "held",
        &[
            shell_job("hold", "  priority: high\n", "sleep 4"),
            shell_job("queued", "", "true"),
        ]
        .join("---\n"),
    )
    .await;
    let hold = trigger(&nats, &["hold"]);
    wait_for(
        Duration::from_secs(30),
        "the long attempt to start",
        || async {
            let record = client.instance(&support::id(&hold)).await.ok()??.0;
            record.started_at.map(|_| ())
        },
    )
    .await;
    let queued = trigger(&nats, &["queued"]);
    let record = final_record(&client, &queued, Duration::from_secs(60)).await;
    assert_eq!((record.state, record.attempt), (State::Success, 1));
    let held = final_record(&client, &hold, Duration::from_secs(30)).await;
    assert!(
        record.started_at >= held.finished_at,
        "the queued attempt did not wait for the slot"
    );
    delivered_once(&client, "worker-w1-normal").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_of_tasks_that_end_during_a_60_s_nats_outage_arrive_exactly_once() {
    let mut nats = TestNats::start();
    let client = nats.client().await;
    let control = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let worker = AxProcess::node(&nats, "w1", "worker", &[]);
    let ledger = nats.path("jobs").join("ledger");
    apply_job(
        &nats,
        "during",
        &format!(
            "version: v1\njob:\n  name: during\n  exec:\n    type: shell\n    command: 'echo start >> {l}; sleep 4; echo end >> {l}'\n",
            l = ledger.display()
        ),
    )
    .await;
    let ids: Vec<String> = (0..4).map(|_| trigger(&nats, &["during"])).collect();
    wait_for(
        Duration::from_secs(20),
        "the four attempts to start",
        || async { (lines_with(&ledger, "start") == 4).then_some(()) },
    )
    .await;
    nats.server.stop();
    // The tasks end while NATS is away: their outcomes wait in the worker's outbox.
    wait_for(
        Duration::from_secs(20),
        "the four attempts to end",
        || async { (lines_with(&ledger, "end") == 4).then_some(()) },
    )
    .await;
    std::thread::sleep(Duration::from_secs(60));
    nats.server
        .restart()
        .expect("nats-server restarts on its store");
    let client_again = nats.client().await;
    for id in &ids {
        let record = wait_for_logged(
            Duration::from_secs(60),
            "the outcome reported after the outage",
            &[&worker, &control],
            || async {
                client_again
                    .instance(&support::id(id))
                    .await
                    .ok()
                    .flatten()
                    .map(|(r, _)| r)
                    .filter(|r| r.state.is_final())
            },
        )
        .await;
        assert_eq!(
            (record.state, record.attempt),
            (State::Success, 1),
            "{}",
            record.message
        );
    }
    // A minute without NATS ended actors' pumps, and their restarts show in the node's heartbeat.
    let status = wait_for_logged(
        Duration::from_secs(20),
        "core's heartbeat counting restarts",
        &[&control],
        || async {
            let output = ax(&nats.url(), &["nodes", "--json"]);
            let nodes: Vec<ax_bus::messages::NodeStatus> =
                serde_json::from_str(&stdout(&output)).ok()?;
            let core = nodes.into_iter().find(|n| n.node == "core")?;
            let restarts: u64 = core.actors.values().map(|h| h.restarts).sum();
            (restarts > 0).then_some(core)
        },
    )
    .await;
    assert_eq!(status.roles, ["scheduler", "dag", "router"]);
    let actors: Vec<&str> = status.actors.keys().map(String::as_str).collect();
    assert_eq!(actors, ["dag", "router", "scheduler"]);
    assert!(status
        .actors
        .values()
        .all(|h| h.panics == 0 && h.stalls == 0));
    assert_eq!(status.pid, control.pid().as_raw() as u32);
    // Nothing ran twice, and each attempt has exactly one result (published after its final
    // record: the Reporter's retries after the outage may still be on their way).
    assert_eq!(lines_with(&ledger, "start"), 4);
    let results = wait_for(Duration::from_secs(30), "the four results", || async {
        let mut stream = client_again.js.get_stream("AX_RESULTS").await.ok()?;
        let stored = stream.info().await.ok()?.state.messages;
        (stored >= 4).then_some(stored)
    })
    .await;
    assert_eq!(results, 4);
    drop(client);
}
