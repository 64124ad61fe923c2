//! Alerts: a failure is published on `ax.alert.failure` and POSTed as JSON to the configured
//! webhook; a webhook that fails at first gets the alert again, with backoff, until it takes
//! it, and only once after that.

use crate::support;

use std::time::Duration;

use support::webhook::Webhook;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_reaches_the_webhook_through_its_errors_once() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let webhook = Webhook::start(2).await;
    let config = format!("[alerts]\nwebhook = \"{}\"\ntimeout = 2\n", webhook.url);
    let node = AxProcess::configured(&nats, "n1", "all", &config);
    apply_job(
        &nats,
        "broken",
        "version: v1\njob:\n  name: broken\n  exec: { type: shell, command: 'exit 3' }\n",
    )
    .await;
    let id = trigger(&nats, &["broken"]);
    let record = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(record.state, ax_bus::State::Failed);

    // Two refusals, then taken: the failure alert arrives three times, the last one answered 200.
    let bodies = wait_for_logged(
        Duration::from_secs(30),
        "the failure alert to be taken by the webhook",
        &[&node],
        || async {
            let bodies = webhook.bodies();
            bodies
                .iter()
                .any(|(status, body)| *status == 200 && body["kind"] == "failure")
                .then_some(bodies)
        },
    )
    .await;
    let failures: Vec<&(u16, serde_json::Value)> = bodies
        .iter()
        .filter(|(_, body)| body["kind"] == "failure")
        .collect();
    let statuses: Vec<u16> = failures.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses[..2], [500, 500], "{bodies:?}");
    let alert = &failures.last().unwrap().1;
    assert_eq!(alert["instance"], id.as_str());
    assert_eq!(alert["job"], "broken");
    assert_eq!(alert["node"], "n1");
    assert!(
        alert["message"]
            .as_str()
            .unwrap()
            .contains("failed for good after attempt 1: exit_code"),
        "{alert}"
    );
    // The dead-letter alert of the same failure follows; nothing taken is sent again.
    wait_for(Duration::from_secs(30), "the dead-letter alert", || async {
        webhook
            .bodies()
            .iter()
            .any(|(status, body)| *status == 200 && body["kind"] == "dead_letter")
            .then_some(())
    })
    .await;
    let taken = webhook
        .bodies()
        .iter()
        .filter(|(status, body)| *status == 200 && body["kind"] == "failure")
        .count();
    assert_eq!(taken, 1);
}
