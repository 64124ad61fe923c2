//! Alerts to a webhook: every alert published on `ax.alert.>` is kept in `<AX>_ALERTS` and, when
//! a node is configured with a webhook URL, POSTed there as JSON.
//!
//! Alerts are core NATS publishes (any actor raises them, best effort); the stream makes them
//! durable the moment the server has them, so a webhook that is down, slow or failing loses
//! nothing: a POST that fails or answers other than 2xx is tried again with a backoff doubling
//! from 1 s to a minute. After ten tries the alert becomes a dead letter (`max_deliveries`),
//! from where `ax dlq replay` sends it again. Every node with a webhook shares one durable
//! consumer, so each alert is POSTed by one of them, in order.

use std::time::Duration;

use futures::StreamExt;

use ax_bus::error::During;
use ax_bus::ids::NodeId;
use ax_bus::messages::{Alert, AlertKind};
use ax_bus::AxClient;

use crate::jetstream::consume::{self, ConsumerSpec};
use crate::ActorError;

/// Where alerts go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookConfig {
    /// `http://` or `https://` URL that receives one POST per alert.
    pub url: String,
    /// How long one POST may take.
    pub timeout: Duration,
}

/// The timeout of one POST when the config sets none.
pub const DEFAULT_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(5);

/// POSTs alerts until the consumer ends or fails.
pub(crate) async fn forward(
    client: AxClient,
    config: WebhookConfig,
    node: NodeId,
) -> Result<(), ActorError> {
    let http = reqwest::Client::builder()
        .timeout(config.timeout)
        .build()
        .during(|| "webhook client")?;
    let spec = ConsumerSpec {
        ack_wait: config.timeout + Duration::from_secs(10),
        max_ack_pending: 1,
        max_deliver: consume::POISON_DELIVERIES,
        ..ConsumerSpec::new(
            client.layout.alerts_stream(),
            "alert-webhook",
            String::new(),
        )
    };
    let mut messages = consume::messages(&client, &spec, 1).await?;
    while let Some(message) = messages.next().await {
        let message = message.during(|| "alert consumer")?;
        let Some(alert) =
            consume::decode_or_dead_letter::<Alert>(&client, &node, AlertKind::Alert, &message)
                .await
        else {
            continue;
        };
        match post(&http, &config.url, &alert).await {
            Ok(()) => {
                consume::ack(&message).await;
            }
            Err(reason) => {
                let wait = consume::backoff(&message);
                tracing::warn!(url = %config.url, kind = %alert.kind, %reason, retry_in = ?wait, "alert not delivered to the webhook");
                consume::nak(&message, wait).await;
            }
        }
    }
    Ok(())
}

/// One POST; any answer but 2xx is a failure.
async fn post(http: &reqwest::Client, url: &str, alert: &Alert) -> Result<(), String> {
    let response = http
        .post(url)
        .json(alert)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("answered {status}"))
    }
}
