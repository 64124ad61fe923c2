//! The clock guard through the whole system: a node whose clock is 30 s off the NATS server's
//! raises an alert, its Scheduler fires nothing and its worker refuses work (`clock_skew`);
//! once the clock is back, it says so and both resume.

use crate::support;

use std::time::Duration;

use ax_bus::messages::Alert;
use ax_bus::{codec, State, Tag};
use futures::StreamExt;
use support::*;

async fn next_alert(alerts: &mut async_nats::Subscriber, node: &AxProcess) -> Alert {
    let message = tokio::time::timeout(Duration::from_secs(20), alerts.next())
        .await
        .unwrap_or_else(|_| panic!("no clock alert; node log:\n{}", node.log_text()))
        .unwrap();
    codec::decode::<Alert>(&message.payload).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_clock_is_off_holds_off_until_it_is_back() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let mut alerts = client.nats.subscribe("ax.alert.clock_skew").await.unwrap();
    let offset_file = nats.path("n1").join("clock-offset");
    std::fs::create_dir_all(offset_file.parent().unwrap()).unwrap();
    std::fs::write(&offset_file, "30").unwrap();
    let node = AxProcess::spawn_with_env(
        Some(&nats.url()),
        &[
            "node",
            "--roles",
            "all",
            "--id",
            "n1",
            "--data-dir",
            nats.path("n1").join("data").to_str().unwrap(),
        ],
        &nats.path("n1"),
        &nats.path("n1").join("node.log"),
        &[("AX_TEST_CLOCK_OFFSET_FILE", offset_file.to_str().unwrap())],
    );
    let alert = next_alert(&mut alerts, &node).await;
    assert!(
        alert.message.contains("ms off the NATS server's") && alert.node == "n1",
        "{alert:?}"
    );

    apply_job(
        &nats,
        "every_second",
        "version: v1\njob:\n  name: every_second\n  cron: '* * * * * *'\n  exec: { type: shell, command: 'true' }\n",
    )
    .await;
    apply_job(
        &nats,
        "hello",
        "version: v1\njob:\n  name: hello\n  exec: { type: shell, command: 'true' }\n",
    )
    .await;
    // A trigger comes through the control subject (its time is the server's); the worker
    // refuses to run it.
    let id = trigger(&nats, &["hello"]);
    let refused = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(
        (refused.state, refused.tag),
        (State::Failed, Tag::ClockSkew),
        "{}",
        refused.message
    );
    assert!(refused.message.contains("clock is"), "{}", refused.message);
    assert!(
        instances(&client, "every_second").await.is_empty(),
        "a Scheduler with a wrong clock fired"
    );

    std::fs::write(&offset_file, "0").unwrap();
    let alert = next_alert(&mut alerts, &node).await;
    assert!(alert.message.contains("is back within 5 s"), "{alert:?}");
    wait_for(
        Duration::from_secs(20),
        "the cron job to fire again",
        || async {
            instances(&client, "every_second")
                .await
                .iter()
                .any(|r| r.state == State::Success)
                .then_some(())
        },
    )
    .await;
    let id = trigger(&nats, &["hello"]);
    let ran = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(ran.state, State::Success, "{}", ran.message);
}
