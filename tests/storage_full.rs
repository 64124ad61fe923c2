//! JetStream out of storage: every write ax makes is refused ("insufficient resources"). No
//! node exits or spins; a `storage` alert names the cause (and another says when there is room
//! again); a trigger is refused at once, saying the store is full, instead of being accepted
//! and lost; and once space returns everything resumes by itself — fires by
//! their misfire policy, nothing run twice, no attempt lost to a worker that could not store
//! its heartbeat (it holds its dispatches until it can).

use crate::support;

use std::collections::BTreeSet;

use futures::StreamExt;
use std::time::Duration;

use ax_bus::State;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_refuses_triggers_plainly_and_everything_resumes_when_space_returns() {
    let nats = TestNats::start_with_config(Some("jetstream: { max_file_store: 48MB }\n"), None);
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "scheduler,dag,router,worker", &[]);
    let ledger = nats.path("files").join("ledger");
    apply_job(
        &nats,
        "tick",
        &shell_job(
            "tick",
            "  cron: \"* * * * * *\"\n",
            &format!("echo $AX_INSTANCE_ID >> {}", ledger.display()),
        ),
    )
    .await;
    let succeeded = |after| succeeded_since(&client, "tick", after);
    let first = ax_bus::time::now();
    wait_for(Duration::from_secs(30), "the job to run", || {
        succeeded(first)
    })
    .await;

    let mut storage_alerts = client
        .nats
        .subscribe(client.subjects().alert("storage"))
        .await
        .unwrap();
    // Something else fills the store.
    let junk = client
        .js
        .create_stream(async_nats::jetstream::stream::Config {
            name: "JUNK".into(),
            subjects: vec!["junk.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let payload = bytes::Bytes::from(vec![b'x'; 512 * 1024]);
    let refusal = loop {
        match client.js.publish("junk.a", payload.clone()).await {
            Ok(ack) => {
                if let Err(e) = ack.await {
                    break ax_bus::error::NatsError::new("fill", e);
                }
            }
            Err(e) => break ax_bus::error::NatsError::new("fill", e),
        }
    };
    assert!(refusal.storage_full(), "{refusal}");
    let full_at = ax_bus::time::now();

    // A trigger is refused at once, saying why; nothing of it is half-accepted.
    let refused = ax(&nats.url(), &["job", "trigger", "tick"]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("JetStream's storage is full"),
        "{}",
        stderr(&refused)
    );
    // The nodes say why, to whoever listens (the alert cannot be stored).
    let full_alert = tokio::time::timeout(Duration::from_secs(20), storage_alerts.next())
        .await
        .expect("a storage alert while the store is full")
        .unwrap();
    let full_alert: ax_bus::messages::Alert = ax_bus::codec::decode(&full_alert.payload).unwrap();
    assert!(
        full_alert.message.contains("JetStream's storage is full"),
        "{}",
        full_alert.message
    );
    std::thread::sleep(Duration::from_secs(6));
    assert!(alive(node.pid().as_raw()), "{}", node.log_text());

    // Space returns: it all resumes by itself.
    drop(junk);
    client.js.delete_stream("JUNK").await.unwrap();
    let back = ax_bus::time::now() + chrono::TimeDelta::seconds(3);
    wait_for_logged(
        Duration::from_secs(60),
        "fires after space returned to run",
        &[&node],
        || succeeded(back),
    )
    .await;
    // The all-clear is kept.
    wait_for(
        Duration::from_secs(30),
        "the storage all-clear alert",
        || async {
            alerts_of(&client, "storage")
                .await
                .into_iter()
                .any(|a| a.message.contains("has room again"))
                .then_some(())
        },
    )
    .await;
    let triggered = ax(&nats.url(), &["job", "trigger", "tick"]);
    assert!(triggered.status.success(), "{}", stderr(&triggered));
    let records = wait_for_logged(
        Duration::from_secs(60),
        "every instance to end",
        &[&node],
        || async {
            let records = client.instances(Some(&support::job("tick"))).await.ok()?;
            records
                .iter()
                .all(|r| r.state.is_final())
                .then_some(records)
        },
    )
    .await;
    let failed: Vec<_> = records
        .iter()
        .filter(|r| r.state != State::Success)
        .map(|r| (r.instance_id.to_string(), r.tag, r.message.clone()))
        .collect();
    assert!(
        failed.is_empty(),
        "failed while or after the store was full: {failed:?}"
    );
    let lost: Vec<_> = records.iter().filter(|r| r.worker_losses > 0).collect();
    assert!(lost.is_empty(), "attempts lost: {lost:?}");
    let mut seen = BTreeSet::new();
    for line in lines_of(&ledger) {
        assert!(seen.insert(line.clone()), "{line} ran twice");
    }
    println!(
        "store full from {full_at} for 10 s or so: {} instances, none lost or run twice",
        records.len()
    );
    assert!(alive(node.pid().as_raw()), "{}", node.log_text());
}
