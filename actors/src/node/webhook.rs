//! Streams to webhooks: every alert published on `ax.alert.>` (kept in `<AX>_ALERTS`) POSTed as
//! JSON to a node's `[alerts] webhook`, and every OpenLineage event on `ax.lineage.>` (kept in
//! `<AX>_LINEAGE`) to its `[openlineage] url`.
//!
//! The streams make what they carry durable the moment the server has it, so an endpoint that
//! is down, slow or failing loses nothing: a POST that fails or answers other than 2xx is tried
//! again with a backoff doubling from 1 s to a minute. After ten tries the message becomes a
//! dead letter (`max_deliveries`), from where `ax dlq replay` sends it again. Every node with
//! the same kind of endpoint shares one durable consumer, so each message is POSTed by one of
//! them, in order.

use std::time::Duration;

use futures::StreamExt;

use ax_bus::error::During;
use ax_bus::ids::NodeId;
use ax_bus::messages::{Alert, AlertKind};
use ax_bus::openlineage::RunEvent;
use ax_bus::AxClient;

use crate::jetstream::consume::{self, ConsumerSpec};
use crate::ActorError;

/// Where a stream's messages go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookConfig {
    /// `http://` or `https://` URL that receives one POST per message.
    pub url: String,
    /// How long one POST may take.
    pub timeout: Duration,
}

/// The timeout of one POST when the config sets none.
pub const DEFAULT_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(5);

/// What is POSTed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Feed {
    /// Alerts, as JSON (they are stored as MessagePack).
    Alerts,
    /// OpenLineage run events (stored as the JSON they are sent as).
    Lineage,
}

impl Feed {
    /// The stream and the durable consumer every node of this feed shares.
    fn consumer(self, client: &AxClient, timeout: Duration) -> ConsumerSpec {
        let (stream, durable) = match self {
            Feed::Alerts => (client.layout.alerts_stream(), "alert-webhook"),
            Feed::Lineage => (client.layout.lineage_stream(), "openlineage-http"),
        };
        ConsumerSpec {
            ack_wait: timeout + Duration::from_secs(10),
            max_ack_pending: 1,
            max_deliver: consume::POISON_DELIVERIES,
            ..ConsumerSpec::new(stream, durable, String::new())
        }
    }

    /// The body of a POST for `payload`, or why there is none.
    fn body(self, payload: &[u8]) -> Result<Vec<u8>, String> {
        match self {
            Feed::Alerts => ax_bus::codec::decode::<Alert>(payload)
                .map_err(|e| e.to_string())
                .and_then(|alert| serde_json::to_vec(&alert).map_err(|e| e.to_string())),
            Feed::Lineage => serde_json::from_slice::<RunEvent>(payload)
                .map(|_| payload.to_vec())
                .map_err(|e| format!("not an OpenLineage run event: {e}")),
        }
    }

    /// Its name in logs.
    fn name(self) -> &'static str {
        match self {
            Feed::Alerts => "alert webhook",
            Feed::Lineage => "OpenLineage endpoint",
        }
    }
}

/// POSTs `feed`'s messages until its consumer ends or fails.
pub(crate) async fn forward(
    client: AxClient,
    config: WebhookConfig,
    node: NodeId,
    feed: Feed,
) -> Result<(), ActorError> {
    let http = reqwest::Client::builder()
        .timeout(config.timeout)
        .build()
        .during(|| "webhook client")?;
    let spec = feed.consumer(&client, config.timeout);
    let mut messages = consume::messages(&client, &spec, 1).await?;
    while let Some(message) = messages.next().await {
        let message = message.during(|| format!("the {} consumer", feed.name()))?;
        let body = match feed.body(&message.payload) {
            Ok(body) => body,
            Err(reason) => {
                consume::undecodable(&client, &node, AlertKind::Alert, &message, reason).await;
                continue;
            }
        };
        match post(&http, &config.url, body).await {
            Ok(()) => {
                consume::ack(&message).await;
            }
            Err(reason) => {
                let wait = consume::backoff(&message);
                tracing::warn!(url = %config.url, feed = feed.name(), subject = %message.subject, %reason, retry_in = ?wait, "not delivered; tried again later");
                consume::nak(&message, wait).await;
            }
        }
    }
    Ok(())
}

/// One POST of a JSON body; any answer but 2xx is a failure.
async fn post(http: &reqwest::Client, url: &str, body: Vec<u8>) -> Result<(), String> {
    let response = http
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
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
