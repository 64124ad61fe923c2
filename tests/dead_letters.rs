//! Dead letters: an instance out of retries lands in `AX_DEAD` with its work item and the
//! reason, and `ax dlq replay` runs it again as a new attempt (recorded on `ax.audit.dlq`); a
//! dispatch that its worker never settles reaches its maximum deliveries, becomes a dead letter
//! and fails its attempt instead of hanging; any other dead message is put back on its subject.

use crate::support;

use std::time::Duration;

use async_nats::jetstream::message::PublishMessage;
use ax_bus::dead_letter;
use ax_bus::messages::{DlqReplay, TriggerRequest, WorkItem};
use ax_bus::{codec, State, Tag};
use support::*;

/// The replays carried out, as the audit recorded them.
async fn audit_of_replays(client: &ax_bus::AxClient) -> Vec<DlqReplay> {
    client
        .audit_since(chrono::DateTime::UNIX_EPOCH)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.action == "replay" && r.outcome == ax_bus::auth::audit::Outcome::Done)
        // A re-run's detail holds its plan beside the letter.
        .map(|r| r.detail.get("detail").cloned().unwrap_or(r.detail))
        .map(|detail| serde_json::from_value(detail).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_out_of_retries_is_a_dead_letter_and_replays_as_a_new_attempt() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let fixed = nats.path("jobs").join("fixed");
    apply_job(
        &nats,
        "fragile",
        &format!(
            "version: v1\njob:\n  name: fragile\n  exec:\n    type: shell\n    command: 'echo trying >&2; test -f {}'\n  retry: {{ times: 1, interval: 1 }}\n  params: {{ region: eu }}\n",
            fixed.display()
        ),
    )
    .await;
    let id = trigger(&nats, &["fragile"]);
    let record = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(
        (record.state, record.tag, record.attempt),
        (State::Failed, Tag::ExitCode, 2)
    );

    let letters = wait_for(Duration::from_secs(10), "the dead letter", || async {
        let letters = client.dead_letters().await.unwrap();
        (!letters.is_empty()).then_some(letters)
    })
    .await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.kind, dead_letter::EXHAUSTED);
    assert_eq!(letter.instance.as_deref(), Some(id.as_str()));
    assert_eq!(letter.trace.as_deref(), Some(record.trace_id.as_str()));
    assert_eq!(letter.job.as_deref(), Some("fragile"));
    assert!(
        letter
            .reason
            .contains("after attempt 2: exit_code: exit code 1"),
        "{}",
        letter.reason
    );
    // The full payload: the last work item, spec and params included.
    let stored = client.dead_letter(letter.id).await.unwrap().unwrap();
    let work: WorkItem = codec::decode(&stored.payload).unwrap();
    assert_eq!((work.attempt, work.job().as_str()), (2, "fragile"));
    assert_eq!(work.params["region"], "eu");
    let out = ax(&nats.url(), &["dlq", "list"]);
    assert!(stdout(&out).contains(&id), "{}", stdout(&out));
    let row = stdout(&out)
        .lines()
        .find(|l| l.contains(&id))
        .unwrap()
        .to_string();
    assert!(
        row.contains(" open "),
        "nothing happened to it since: {row}"
    );

    // Fixed, then replayed: a new attempt that succeeds; the letter is gone, the replay recorded.
    std::fs::write(&fixed, "").unwrap();
    let out = ax(&nats.url(), &["dlq", "replay", &letter.id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("replayed (rerun)"),
        "{}",
        stdout(&out)
    );
    let again = wait_for(Duration::from_secs(30), "the replayed attempt", || async {
        let (record, _) = client.instance(&support::id(&id)).await.unwrap()?;
        (record.attempt == 3 && record.state.is_final()).then_some(record)
    })
    .await;
    assert_eq!(again.state, State::Success, "{}", again.message);
    assert!(client.dead_letters().await.unwrap().is_empty());
    let audit = audit_of_replays(&client).await;
    assert_eq!(audit.len(), 1);
    assert_eq!(
        (audit[0].letter.id, audit[0].action.as_str()),
        (letter.id, "rerun")
    );

    // The same id again: gone.
    let out = ax(&nats.url(), &["dlq", "replay", &letter.id.to_string()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no such dead letter"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_never_settled_reaches_max_deliveries_and_fails_its_attempt() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let config = nats.path("n1").join("node.toml");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    // The worker holds each dispatch far longer than its ack wait; the Router does not step in.
    std::fs::write(
        &config,
        "[worker]\nslots = 16\ndispatch_ack_wait = 1\n[router]\nack_timeout = 600\n",
    )
    .unwrap();
    let _node = AxProcess::spawn_with_env(
        Some(&nats.url()),
        &[
            "node",
            "--roles",
            "all",
            "--id",
            "n1",
            "--data-dir",
            nats.path("n1").join("data").to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
        &nats.path("n1"),
        &nats.path("n1").join("node.log"),
        &[("AX_TEST_STALL_SECS", "120")],
    );
    apply_job(
        &nats,
        "stuck",
        "version: v1\njob:\n  name: stuck\n  exec: { type: shell, command: 'true' }\n",
    )
    .await;
    let id = trigger(&nats, &["stuck"]);
    let record = final_record(&client, &id, Duration::from_secs(60)).await;
    assert_eq!(
        (record.state, record.tag),
        (State::Failed, Tag::DeadLetter),
        "{}",
        record.message
    );
    // The record ends before the Reporter publishes the failure's own dead letter: wait for both.
    let letters = wait_for(Duration::from_secs(30), "both dead letters", || async {
        let letters = client.dead_letters().await.ok()?;
        let both = letters
            .iter()
            .any(|l| l.kind == dead_letter::MAX_DELIVERIES)
            && letters.iter().any(|l| l.kind == dead_letter::EXHAUSTED);
        both.then_some(letters)
    })
    .await;
    let dead_dispatch = letters
        .iter()
        .find(|l| l.kind == dead_letter::MAX_DELIVERIES)
        .unwrap_or_else(|| panic!("{letters:?}"));
    assert_eq!(dead_dispatch.instance.as_deref(), Some(id.as_str()));
    assert_eq!(dead_dispatch.subject, "ax.internal.dispatch.n1.normal");
    assert!(
        dead_dispatch.reason.contains("delivered 10 times"),
        "{}",
        dead_dispatch.reason
    );
    // It is out of the dispatch stream, and the failure itself is a dead letter too.
    let mut dispatch = client.js.get_stream("AX_DISPATCH").await.unwrap();
    assert_eq!(dispatch.info().await.unwrap().state.messages, 0);
    assert!(
        letters.iter().any(|l| l.kind == dead_letter::EXHAUSTED
            && l.instance.as_deref() == Some(id.as_str())),
        "{letters:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_command_is_put_back_on_its_subject() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(
        &nats,
        "hello",
        "version: v1\njob:\n  name: hello\n  exec: { type: shell, command: 'true' }\n",
    )
    .await;
    // A trigger command as the keeper would have kept it after its last delivery.
    let mut headers = codec::msgpack_headers();
    headers.insert(
        dead_letter::REASON,
        "delivered 10 times to consumer scheduler-control",
    );
    headers.insert(dead_letter::SUBJECT, "ax.control.trigger");
    headers.insert(dead_letter::NODE, "n0");
    let request = TriggerRequest {
        name: support::job("hello"),
        biz_date: Some("2026-01-02".into()),
        params: Default::default(),
        key: None,
        at: None,
        delay: None,
    };
    client
        .js
        .send_publish(
            "ax.internal.dead.max_deliveries",
            PublishMessage::build()
                .headers(headers)
                .payload(codec::encode(&request).unwrap()),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let letters = client.dead_letters().await.unwrap();
    assert_eq!(letters.len(), 1);
    let out = ax(
        &nats.url(),
        &["dlq", "replay", &letters[0].id.to_string(), "--json"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let audit: DlqReplay = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(audit.action, "republished");
    let record = wait_for(Duration::from_secs(30), "the replayed trigger", || async {
        instances(&client, "hello")
            .await
            .into_iter()
            .find(|r| r.biz_date == "2026-01-02" && r.state.is_final())
    })
    .await;
    assert_eq!(record.state, State::Success);
    assert!(client.dead_letters().await.unwrap().is_empty());
}
