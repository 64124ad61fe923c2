//! Triggers from business services: idempotent submission by key, and delayed work (`--in`,
//! `--at`) kept by JetStream until it is due.

use crate::support;

use std::time::Duration;

use futures::StreamExt;
use support::*;

/// Publishes a JSON trigger command whose answer goes to `inbox`.
async fn publish_json(client: &ax_bus::AxClient, body: &str, inbox: &str) {
    publish_command(client, "trigger", body, inbox).await;
}

/// Publishes JSON control command `command` whose answer goes to `inbox`.
async fn publish_command(client: &ax_bus::AxClient, command: &str, body: &str, inbox: &str) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(ax_bus::codec::CONTENT_TYPE, ax_bus::codec::JSON);
    headers.insert(ax_bus::messages::REPLY_TO_HEADER, inbox);
    client
        .js
        .publish_with_headers(
            format!("ax.control.{command}"),
            headers,
            body.to_string().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
}

/// The next answer on `answers`.
async fn answer(
    answers: &mut async_nats::Subscriber,
    what: &str,
) -> ax_bus::messages::ControlReply {
    let message = tokio::time::timeout(Duration::from_secs(30), answers.next())
        .await
        .unwrap_or_else(|_| panic!("no answer to {what}"))
        .unwrap();
    // Asked in JSON, answered in JSON, and the answer says so.
    let content_type = message.headers.as_ref().and_then(|h| h.get("Content-Type"));
    assert_eq!(content_type.map(|v| v.as_str()), Some("application/json"));
    serde_json::from_slice(&message.payload).unwrap()
}

/// Sends a JSON trigger command and returns the Scheduler's answer.
async fn ask_json(client: &ax_bus::AxClient, body: &str) -> ax_bus::messages::ControlReply {
    let inbox = client.nats.new_inbox();
    let mut answers = client.nats.subscribe(inbox.clone()).await.unwrap();
    publish_json(client, body, &inbox).await;
    answer(&mut answers, body).await
}

const ONCE: &str = "version: v1
job:
  name: once
  exec: { type: shell, command: 'echo \"$AX_INSTANCE_ID\" >> \"$AX_PARAM_out\"' }
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_makes_one_instance_however_often_it_is_sent() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(&nats, "once", ONCE).await;
    let out = nats.path("out").join("ran");
    let param = format!("out={}", out.display());
    let first = ax(
        &nats.url(),
        &[
            "job", "trigger", "once", "--key", "order-42", "--param", &param,
        ],
    );
    assert!(first.status.success(), "{}", stderr(&first));
    let id = stdout(&first);
    assert!(id.starts_with("once.key-order-42 (triggered)"), "{id}");
    final_record(&client, "once.key-order-42", Duration::from_secs(30)).await;
    // Sent again (a retry after a lost reply), from the CLI and as JSON on the control
    // subject: the same instance, said to exist already, and nothing runs again.
    let again = ax(
        &nats.url(),
        &[
            "job", "trigger", "once", "--key", "order-42", "--param", &param,
        ],
    );
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        stdout(&again).starts_with("once.key-order-42 (already triggered)"),
        "{}",
        stdout(&again)
    );
    let reply = ask_json(&client, r#"{"name": "once", "key": "order-42"}"#).await;
    assert!(reply.ok, "{:?}", reply.errors);
    assert_eq!(
        reply.instance_id.as_deref(),
        Some("once.key-order-42"),
        "{reply:?}"
    );
    assert_eq!(reply.message, "already triggered");
    // Another key is another instance.
    let other = trigger(&nats, &["once", "--key", "order-43", "--param", &param]);
    assert_eq!(other, "once.key-order-43");
    final_record(&client, &other, Duration::from_secs(30)).await;
    let ran = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        ran.lines().collect::<Vec<_>>(),
        ["once.key-order-42", "once.key-order-43"],
        "{}",
        node.log_text()
    );
    assert_eq!(instances(&client, "once").await.len(), 2);

    // A key that breaks the rule is refused before anything is sent.
    let bad = ax(&nats.url(), &["job", "trigger", "once", "--key", "a..b"]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("not a valid trigger key"),
        "{}",
        stderr(&bad)
    );
}

const NOOP: &str = "version: v1
job:
  name: later
  exec: { type: noop }
";

/// The records of `job` that are out of `scheduled`, by instance id.
async fn released(client: &ax_bus::AxClient, job: &str) -> Vec<ax_bus::InstanceRecord> {
    instances(client, job)
        .await
        .into_iter()
        .filter(|r| r.tag != ax_bus::Tag::Scheduled)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_trigger_is_scheduled_at_once_and_released_at_its_time_not_before() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(&nats, "later", NOOP).await;
    let mut events = client.nats.subscribe("ax.event.later.>").await.unwrap();
    let out = ax(&nats.url(), &["job", "trigger", "later", "--in", "2s"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = stdout(&out);
    assert!(printed.contains("(scheduled for "), "{printed}");
    let id: ax_bus::ids::InstanceId = printed.split_whitespace().next().unwrap().parse().unwrap();
    // Created when accepted: running, tag scheduled, due in two seconds.
    let (record, _) = client.instance(&id).await.unwrap().unwrap();
    assert_eq!(
        (record.state, record.tag),
        (ax_bus::State::Running, ax_bus::Tag::Scheduled)
    );
    let due = record.expected_time;
    let lead = due - record.created_at;
    assert!(
        lead > chrono::Duration::milliseconds(1_500) && lead <= chrono::Duration::seconds(2),
        "due {lead:?} after its creation"
    );
    // Due later (one in an hour): no recent run — left out, with a note — listed by its tag
    // with its time.
    let far = trigger(&nats, &["later", "--in", "1h", "--key", "far"]);
    let (far_record, _) = client.instance(&support::id(&far)).await.unwrap().unwrap();
    let listed = ax(&nats.url(), &["instance", "list", "--job", "later"]);
    assert!(!stdout(&listed).contains(&far), "{}", stdout(&listed));
    assert!(
        stderr(&listed).contains("due later left out; --tag scheduled lists them"),
        "{}",
        stderr(&listed)
    );
    let scheduled = ax(&nats.url(), &["instance", "list", "--tag", "scheduled"]);
    let row = stdout(&scheduled);
    let when = far_record
        .expected_time
        .format("%m-%d %H:%M:%S")
        .to_string();
    assert!(
        row.contains(&far) && row.contains(&format!("scheduled for {when}")),
        "{row}"
    );
    // Released (queued, handed on) at its due time: not before, and within the budget.
    let queued_at = loop {
        let message = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .unwrap_or_else(|_| panic!("no release\n{}", node.log_text()))
            .unwrap();
        let event: ax_bus::InstanceRecord = ax_bus::codec::decode(&message.payload).unwrap();
        if event.instance_id == id && event.tag == ax_bus::Tag::Queued {
            break ax_bus::time::now();
        }
    };
    let late = (queued_at - due).num_milliseconds();
    println!("released {late} ms after its due time");
    assert!(late >= 0, "released {late} ms early");
    assert!(late <= 250, "released {late} ms late");
    let record = final_record(&client, id.as_str(), Duration::from_secs(30)).await;
    assert_eq!(record.state, ax_bus::State::Success);
    assert!(record.started_at.unwrap() >= due);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_instances_survive_a_kill_of_the_only_scheduler_and_run_once() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let mut core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let _worker = AxProcess::node(&nats, "w1", "worker", &[]);
    apply_job(&nats, "later", NOOP).await;
    // 200 delayed triggers, due from 10 s on (after the Scheduler's death: sending them and
    // reading their answers takes a few seconds on a loaded machine).
    let inbox = client.nats.new_inbox();
    let mut answers = client.nats.subscribe(inbox.clone()).await.unwrap();
    let sent = tokio::time::Instant::now();
    for i in 0..200 {
        let body = format!(
            r#"{{"name": "later", "key": "k{i}", "in": "{}ms"}}"#,
            10_000 + i * 10
        );
        publish_json(&client, &body, &inbox).await;
    }
    for _ in 0..200 {
        let reply = answer(&mut answers, "every trigger").await;
        assert!(reply.ok, "{:?}", reply.errors);
    }
    assert_eq!(instances(&client, "later").await.len(), 200);
    core.kill9();
    // Every Scheduler is down while they fall due.
    tokio::time::sleep_until(sent + Duration::from_secs(13)).await;
    assert!(
        released(&client, "later").await.is_empty(),
        "released with no Scheduler"
    );
    let core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    wait_for_logged(
        Duration::from_secs(60),
        "all 200 to run",
        &[&core],
        || async {
            let runs = instances(&client, "later").await;
            (runs.len() == 200 && runs.iter().all(|r| r.state == ax_bus::State::Success))
                .then_some(())
        },
    )
    .await;
    // Once each: one attempt, and one result per instance.
    for record in instances(&client, "later").await {
        assert_eq!(record.attempt, 1, "{record:?}");
        assert!(record.message.is_empty() || !record.message.contains("attempt 2"));
    }
    let results = client
        .js
        .get_stream("AX_RESULTS")
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .messages;
    assert_eq!(results, 200);
}

/// The only Scheduler is killed (a failpoint: SIGKILL) at `point` while releasing a delayed
/// instance; once another runs, the due attempt comes to it again after its ack wait and the
/// instance runs once, under its first attempt.
async fn a_scheduler_killed_releasing_leaves_the_instance_to_the_next(point: &str) {
    let nats = TestNats::start();
    let client = nats.client().await;
    let doomed = AxProcess::node_with_env(
        &nats.url(),
        &nats,
        "core-1",
        "scheduler,dag,router",
        &[],
        &[("AX_FAILPOINT", point)],
    );
    let _worker = AxProcess::node(&nats, "w1", "worker", &[]);
    apply_job(&nats, "later", NOOP).await;
    let reply = ask_json(
        &client,
        r#"{"name": "later", "key": "once", "in": "1500ms"}"#,
    )
    .await;
    assert!(reply.ok, "{:?}", reply.errors);
    doomed.died_at(point).await;
    let core = AxProcess::node(&nats, "core-2", "scheduler,dag,router", &[]);
    let record = wait_for_logged(
        Duration::from_secs(60),
        "the instance to succeed",
        &[&core],
        || async {
            let record = client.instance(&id("later.key-once")).await.ok()??.0;
            (record.state == ax_bus::State::Success).then_some(record)
        },
    )
    .await;
    assert_eq!(record.attempt, 1, "{record:?}");
    let results = results_of(&client, "later").await;
    assert_eq!(results.len(), 1, "{results:?}");
    // Released by the redelivery itself, not found stranded by the janitor's sweep.
    let stranded = alerts_of(&client, "stranded").await;
    assert!(stranded.is_empty(), "{stranded:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_killed_holding_a_due_attempt_leaves_it_to_the_next() {
    a_scheduler_killed_releasing_leaves_the_instance_to_the_next("delayed.due").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_killed_between_release_and_hand_off_leaves_it_to_the_next() {
    a_scheduler_killed_releasing_leaves_the_instance_to_the_next("delayed.released").await;
}

#[test]
fn bad_delays_are_refused_before_anything_is_sent() {
    let nowhere = "nats://127.0.0.1:1";
    for (args, reason) in [
        (vec!["--in", "-5s"], "is not a duration"),
        (vec!["--in", "213504d"], "longer than 36500d"),
        (vec!["--in", "5"], "is not a duration"),
        (vec!["--at", "tomorrow"], "is not an RFC 3339 instant"),
        (
            vec!["--at", "2026-12-01T14:03:05Z", "--in", "5s"],
            "cannot be used with",
        ),
        (vec!["--at", "2027-06-30T23:59:60Z"], "is a leap second"),
        (vec!["--bogus"], "unexpected argument '--bogus'"),
    ] {
        let mut full = vec!["job", "trigger", "later"];
        full.extend(args.iter().copied());
        let out = ax(nowhere, &full);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains(reason), "{args:?}: {}", stderr(&out));
        // One line, like every other error of the CLI: no "For more information" after it.
        assert_eq!(
            stderr(&out).trim_end().lines().count(),
            1,
            "{}",
            stderr(&out)
        );
        assert!(stderr(&out).starts_with("error: "), "{}", stderr(&out));
        let reached = ["NATS URL", "cannot reach", "cannot connect"];
        assert!(
            !reached.iter().any(|r| stderr(&out).contains(r)),
            "{args:?} reached for NATS: {}",
            stderr(&out)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_triggers_with_bad_times_are_refused_naming_the_field() {
    let nats = TestNats::start();
    let client = nats.client().await;
    // This cluster's Schedulers take delays of 30 days at most.
    let config = "[scheduler]\nmax_delay_days = 30\n";
    let _node = AxProcess::configured(&nats, "n1", "scheduler", config);
    apply_job(&nats, "later", NOOP).await;
    let far = ax_bus::time::rfc3339(ax_bus::time::now() + chrono::Duration::days(40));
    // A one-off job as far ahead is refused by the same limit, naming the field.
    let at_far =
        format!("version: v1\njob:\n  name: far_off\n  at: \"{far}\"\n  exec: {{ type: noop }}\n");
    let file = nats.path("jobs").join("far_off.yaml");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, at_far).unwrap();
    let out = ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("far_off: job.at:")
            && stderr(&out).contains("more than 30 days ahead"),
        "{}",
        stderr(&out)
    );
    assert!(!client
        .job_exists(&"far_off".parse().unwrap())
        .await
        .unwrap());
    for (body, reason) in [
        (
            r#"{"name": "later", "in": "-5s"}"#.to_string(),
            "in: `-5s` is not a duration",
        ),
        (
            r#"{"name": "later", "in": "5"}"#.to_string(),
            "in: `5` is not a duration",
        ),
        (
            r#"{"name": "later", "at": "soon"}"#.to_string(),
            "at: `soon` is not an RFC 3339",
        ),
        (
            r#"{"name": "later", "at": "2026-12-01T14:03:05Z", "in": "5s"}"#.to_string(),
            "at and in: give one of them, not both",
        ),
        (format!(r#"{{"name": "later", "at": "{far}"}}"#), "at: "),
        (
            format!(r#"{{"name": "later", "at": "{far}"}}"#),
            "more than 30 days ahead",
        ),
        (r#"{"name": "later", "in": "31d"}"#.to_string(), "in: "),
        (
            r#"{"name": "later", "in": "31d"}"#.to_string(),
            "more than 30 days ahead",
        ),
        (
            r#"{"name": "later", "key": "a..b"}"#.to_string(),
            "not a valid trigger key",
        ),
        // RFC 3339 allows a leap second; ax's records and the clients cannot hold one.
        (
            r#"{"name": "later", "at": "2027-06-30T23:59:60Z"}"#.to_string(),
            "at: `2027-06-30T23:59:60Z` is a leap second",
        ),
    ] {
        let reply = ask_json(&client, &body).await;
        assert!(!reply.ok, "{body}");
        assert!(
            reply.errors.iter().any(|e| e.contains(reason)),
            "{body}: {:?}",
            reply.errors
        );
    }
    assert!(instances(&client, "later").await.is_empty());
}

fn one_off(at: chrono::DateTime<chrono::Utc>) -> String {
    format!(
        "version: v1\njob:\n  name: oneoff\n  at: '{}'\n  exec: {{ type: noop }}\n",
        ax_bus::time::rfc3339(at)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_with_at_fires_once_then_and_stays_defined() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    let at = ax_bus::time::now() + chrono::Duration::seconds(3);
    apply_job(&nats, "oneoff", &one_off(at)).await;
    let id = ax_bus::ids::InstanceId::for_fire(&job("oneoff"), at);
    let (record, _) = client
        .instance(&id)
        .await
        .unwrap()
        .expect("created when applied");
    assert_eq!(record.tag, ax_bus::Tag::Scheduled);
    let done = final_record(&client, id.as_str(), Duration::from_secs(30)).await;
    assert_eq!(done.state, ax_bus::State::Success, "{}", node.log_text());
    assert!(done.started_at.unwrap() >= at);
    // Applied again: unchanged, and it does not fire again.
    apply_job(&nats, "oneoff", &one_off(at)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(instances(&client, "oneoff").await.len(), 1);

    // Moved before it fires: the old instant's instance is cancelled; deleted before the new
    // one is due: that one is cancelled at once.
    let second = ax_bus::time::now() + chrono::Duration::seconds(4);
    apply_job(&nats, "oneoff", &one_off(second)).await;
    let third = ax_bus::time::now() + chrono::Duration::seconds(5);
    apply_job(&nats, "oneoff", &one_off(third)).await;
    let moved = client
        .instance(&ax_bus::ids::InstanceId::for_fire(&job("oneoff"), second))
        .await
        .unwrap()
        .unwrap()
        .0;
    assert_eq!(
        (moved.state, moved.tag),
        (ax_bus::State::Cancelled, ax_bus::Tag::Superseded),
        "{moved:?}"
    );
    let deleted = ax(&nats.url(), &["job", "delete", "oneoff"]);
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    let (last, _) = client
        .instance(&ax_bus::ids::InstanceId::for_fire(&job("oneoff"), third))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (last.state, last.tag),
        (ax_bus::State::Cancelled, ax_bus::Tag::JobDeleted)
    );

    // Refused with cron; warned (and not fired) when already past.
    let dir = nats.path("specs");
    let both = dir.join("both.yaml");
    std::fs::write(
        &both,
        one_off(at + chrono::Duration::days(1)).replace("  at:", "  cron: '0 * * * *'\n  at:"),
    )
    .unwrap();
    let out = ax(&nats.url(), &["job", "apply", "-f", both.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("job.at: a job fires on its cron or once at `at`, not both"),
        "{}",
        stderr(&out)
    );
    let past = dir.join("past.yaml");
    std::fs::write(
        &past,
        one_off(ax_bus::time::now() - chrono::Duration::hours(1)),
    )
    .unwrap();
    let out = ax(&nats.url(), &["job", "apply", "-f", past.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("has passed"), "{}", stderr(&out));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        instances(&client, "oneoff").await.len(),
        3,
        "a past `at` fired when applied"
    );
}

/// The instance of a one-off job that still waits runs the job as last applied: changed, or
/// moved away and back, the one instance of the instant (its id unchanged) runs the last
/// definition once — never the one it was first created with. Deleted and applied again, it is
/// another job: the first one's instance stays cancelled with its reason, and the new one's
/// fire is an instance of its own, which runs the new command once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_one_off_instance_runs_its_job_as_last_applied() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    let ledger = nats.path("ledger");
    std::fs::create_dir_all(&ledger).unwrap();
    let spec = |name: &str, at: chrono::DateTime<chrono::Utc>, word: &str| {
        format!(
            "version: v1\njob:\n  name: {name}\n  at: '{}'\n  exec: {{ type: shell, command: 'echo {word} >> {}' }}\n",
            ax_bus::time::rfc3339(at),
            ledger.join(name).display()
        )
    };
    // Far enough ahead for the dozen applies below on a loaded machine.
    let at = ax_bus::time::now() + chrono::Duration::seconds(20);
    let later = at + chrono::Duration::seconds(60);
    let record = |name: &str, at| {
        let client = client.clone();
        let id = ax_bus::ids::InstanceId::for_fire(&job(name), at);
        async move { client.instance(&id).await.unwrap().unwrap().0 }
    };

    // Deleted (its instance cancelled at once), then applied again with another command.
    apply_job(&nats, "again", &spec("again", at, "old")).await;
    let deleted = ax(&nats.url(), &["job", "delete", "again"]);
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    let withdrawn = record("again", at).await;
    assert_eq!(
        (withdrawn.state, withdrawn.tag),
        (ax_bus::State::Cancelled, ax_bus::Tag::JobDeleted),
        "{withdrawn:?}"
    );
    apply_job(&nats, "again", &spec("again", at, "new")).await;
    let first = record("again", at).await;
    assert_eq!(
        (first.state, first.tag, first.attempt),
        (ax_bus::State::Cancelled, ax_bus::Tag::JobDeleted, 1),
        "the deleted job's instance stays cancelled: {first:?}"
    );
    assert!(
        first
            .message
            .contains("its job was deleted before the instance was due"),
        "{}",
        first.message
    );
    let (registered, _) = client.job(&job("again")).await.unwrap().unwrap();
    let new_id = ax_bus::ids::InstanceId::for_incarnation(
        &job("again"),
        at,
        registered.defined_at.expect("the job's incarnation"),
    );
    let (second, _) = client
        .instance(&new_id)
        .await
        .unwrap()
        .expect("its own instance");
    assert_eq!(
        (
            second.state,
            second.tag,
            second.attempt,
            second.expected_time
        ),
        (ax_bus::State::Running, ax_bus::Tag::Scheduled, 1, at),
        "{second:?}"
    );
    // Applied again unchanged: nothing new.
    apply_job(&nats, "again", &spec("again", at, "new")).await;
    assert_eq!(instances(&client, "again").await.len(), 2);

    // Changed in place: the waiting attempt gives way to one with the new command; the same
    // definition applied again changes nothing.
    apply_job(&nats, "changed", &spec("changed", at, "old")).await;
    apply_job(&nats, "changed", &spec("changed", at, "new")).await;
    apply_job(&nats, "changed", &spec("changed", at, "new")).await;
    assert_eq!(record("changed", at).await.attempt, 2);

    // Moved away and back: the first instant's instance is scheduled again, the other's
    // cancelled.
    apply_job(&nats, "moved", &spec("moved", at, "first")).await;
    apply_job(&nats, "moved", &spec("moved", later, "second")).await;
    apply_job(&nats, "moved", &spec("moved", at, "third")).await;
    let away = record("moved", later).await;
    assert_eq!(
        (away.state, away.tag),
        (ax_bus::State::Cancelled, ax_bus::Tag::Superseded)
    );

    for (name, ran, id) in [
        ("again", "new\n", new_id),
        (
            "changed",
            "new\n",
            ax_bus::ids::InstanceId::for_fire(&job("changed"), at),
        ),
        (
            "moved",
            "third\n",
            ax_bus::ids::InstanceId::for_fire(&job("moved"), at),
        ),
    ] {
        let done = final_record(&client, id.as_str(), Duration::from_secs(60)).await;
        assert_eq!(
            done.state,
            ax_bus::State::Success,
            "{name}: {done:?}\n{}",
            node.log_text()
        );
        assert!(done.started_at.unwrap() >= at, "{name} ran before its time");
        let instances = instances(&client, name).await;
        let wanted = if name == "changed" { 1 } else { 2 };
        assert_eq!(instances.len(), wanted, "{name}: {instances:#?}");
        // Each ran once, its last definition; the attempts before it stay in its history.
        let written = std::fs::read_to_string(ledger.join(name)).unwrap_or_default();
        assert_eq!(written, ran, "{name} ran");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_without_a_key_published_within_one_millisecond_are_each_an_instance() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "scheduler", &[]);
    apply_job(&nats, "later", NOOP).await;
    // Pipelined: many of them reach the server within the same millisecond.
    let mut acks = Vec::new();
    for _ in 0..100 {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(ax_bus::codec::CONTENT_TYPE, ax_bus::codec::JSON);
        acks.push(
            client
                .js
                .publish_with_headers(
                    "ax.control.trigger",
                    headers,
                    br#"{"name": "later"}"#.to_vec().into(),
                )
                .await
                .unwrap(),
        );
    }
    for ack in acks {
        ack.await.unwrap();
    }
    wait_for(Duration::from_secs(30), "100 instances", || async {
        (instances(&client, "later").await.len() == 100).then_some(())
    })
    .await;
}

/// Delayed triggers belong to the job they were created under: deleted and applied again
/// with another command before they are due, the job does not run them — not the deleted
/// command, not the new one; each is cancelled saying why. An edit (no delete) keeps them, and
/// a trigger of the job applied again runs its new command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_deleted_and_applied_again_runs_none_of_the_first_ones_delayed_triggers() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    let ledger = nats.path("ledger").join("ran");
    let job = |word: &str| {
        format!(
            "version: v1\njob:\n  name: redefined\n  exec: {{ type: shell, command: 'echo {word} >> {}' }}\n",
            ledger.display()
        )
    };
    apply_job(&nats, "redefined", &job("old")).await;
    let doomed: Vec<String> = (0..5)
        .map(|_| trigger(&nats, &["redefined", "--in", "6s"]))
        .collect();
    let deleted = ax(&nats.url(), &["job", "delete", "redefined"]);
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    apply_job(&nats, "redefined", &job("new")).await;
    let kept = trigger(&nats, &["redefined", "--in", "6s"]);
    // An edit is the same job: the trigger just made stays due.
    apply_job(&nats, "redefined", &job("new")).await;
    for id in &doomed {
        let record = final_record(&client, id, Duration::from_secs(60)).await;
        assert_eq!(
            record.state,
            ax_bus::State::Cancelled,
            "{id}: {record:?}\n{}",
            node.log_text()
        );
        assert!(
            record
                .message
                .contains("its job was deleted before the instance was due"),
            "{}",
            record.message
        );
    }
    let record = final_record(&client, &kept, Duration::from_secs(60)).await;
    assert_eq!(record.state, ax_bus::State::Success, "{record:?}");
    let ran = std::fs::read_to_string(&ledger).unwrap_or_default();
    assert_eq!(ran, "new\n", "what ran");
}

/// Triggers that arrive together are carried out side by side, yet a key sent five times in
/// the burst makes one instance (one answer `triggered`, four `already triggered`), and a
/// command behind them — deleting the job — waits for them: none is refused for a job gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_triggers_keeps_a_key_single_and_commands_in_order() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let mut node = AxProcess::node(&nats, "n1", "scheduler", &[]);
    apply_job(&nats, "later", NOOP).await;
    // Sent while no Scheduler runs, so that the next one takes them all in one burst — once
    // the server has dropped the killed Scheduler's pull requests: a command delivered to one
    // would come back only after the ack wait, behind the delete.
    node.kill9();
    wait_for(Duration::from_secs(30), "no pull request left", || async {
        let mut consumer: async_nats::jetstream::consumer::PullConsumer = client
            .js
            .get_stream("AX_CONTROL")
            .await
            .ok()?
            .get_consumer("scheduler-control")
            .await
            .ok()?;
        (consumer.info().await.ok()?.num_waiting == 0).then_some(())
    })
    .await;
    let inbox = client.nats.new_inbox();
    let mut answers = client.nats.subscribe(inbox.clone()).await.unwrap();
    for i in 0..25 {
        let body = if i % 5 == 0 {
            r#"{"name": "later", "key": "dup"}"#
        } else {
            r#"{"name": "later"}"#
        };
        publish_json(&client, body, &inbox).await;
    }
    publish_command(&client, "delete", r#"{"name": "later"}"#, &inbox).await;
    let node = AxProcess::node(&nats, "n2", "scheduler", &[]);
    let mut messages = Vec::new();
    for _ in 0..26 {
        let reply = answer(&mut answers, "every command").await;
        assert!(reply.ok, "{:?}\n{}", reply.errors, node.log_text());
        messages.push((reply.instance_id.clone(), reply.message.clone()));
    }
    let dup = |message: &str| {
        messages
            .iter()
            .filter(|(id, m)| id.as_deref() == Some("later.key-dup") && m == message)
            .count()
    };
    assert_eq!(
        (dup("triggered"), dup("already triggered")),
        (1, 4),
        "{messages:?}"
    );
    let others = messages
        .iter()
        .filter(|(id, m)| id.as_deref() != Some("later.key-dup") && m == "triggered")
        .count();
    assert_eq!(others, 20, "{messages:?}");
    // The delete was carried out last: its answer came after every trigger's.
    assert_eq!(
        messages.last().map(|(id, _)| id.is_none()),
        Some(true),
        "{messages:?}"
    );
    assert!(!client.job_exists(&"later".parse().unwrap()).await.unwrap());
}

/// A trigger of a job nothing in the dependency graph concerns is handed straight to the
/// Router (`ready`); one of a job another job depends on passes the DagCoordinator
/// (`created`), which creates the dependent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_passes_the_coordinator_only_when_the_graph_concerns_its_job() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(
        &nats,
        "lone",
        "version: v1\njob:\n  name: lone\n  exec: { type: shell, command: 'true' }\n",
    )
    .await;
    apply_job(
        &nats,
        "up",
        "version: v1\njob:\n  name: up\n  exec: { type: shell, command: 'true' }\n",
    )
    .await;
    apply_job(
        &nats,
        "down",
        "version: v1\njob:\n  name: down\n  deps: [ { name: up } ]\n  exec: { type: shell, command: 'true' }\n",
    )
    .await;
    let mut created = client
        .nats
        .subscribe(client.subjects().created_all())
        .await
        .unwrap();
    let mut ready = client
        .nats
        .subscribe(client.subjects().ready_all())
        .await
        .unwrap();
    let handed = |message: Option<async_nats::Message>| {
        let message = message.expect("a hand-off");
        let work: ax_bus::messages::WorkItem = ax_bus::codec::decode(&message.payload).unwrap();
        work.job().to_string()
    };
    let lone = trigger(&nats, &["lone"]);
    let first = tokio::time::timeout(Duration::from_secs(20), ready.next())
        .await
        .expect("lone handed to the Router");
    assert_eq!(handed(first), "lone");
    final_record(&client, &lone, Duration::from_secs(20)).await;
    // Its hand-off to the coordinator would have come before it ran.
    let passed = tokio::time::timeout(Duration::from_millis(500), created.next()).await;
    let passed = passed.map(|m| m.map(|m| m.subject.to_string()));
    assert!(passed.is_err(), "lone passed the coordinator: {passed:?}");
    let up = trigger(&nats, &["up"]);
    let first = tokio::time::timeout(Duration::from_secs(20), created.next())
        .await
        .expect("up handed to the coordinator");
    assert_eq!(handed(first), "up");
    final_record(&client, &up, Duration::from_secs(20)).await;
    let down = wait_for(Duration::from_secs(30), "the dependent to run", || async {
        instances(&client, "down")
            .await
            .into_iter()
            .find(|r| r.state == ax_bus::State::Success)
    })
    .await;
    assert_eq!(down.trigger, ax_bus::instance::Trigger::Deps);
}
