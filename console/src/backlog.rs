//! Queue depths for `/metrics`, read from JetStream when the node is scraped: each priority's
//! ready queue, as its Routers' durable consumer counts it (pending: not yet delivered;
//! ack pending: delivered, not settled), and the delayed instances waiting for their time.

use std::time::Duration;

use ax_actors::metrics::QueueDepth;
use ax_bus::spec::Priority;
use ax_bus::AxClient;

/// How long reading the depths may take before the scrape goes on without them.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The ready queues' depths; a queue whose consumer does not exist yet (no Router ran) is left
/// out, and so is everything when JetStream does not answer in time.
pub(crate) async fn read(client: &AxClient) -> Option<Vec<QueueDepth>> {
    let read = async {
        let stream = client
            .js
            .get_stream(client.layout.flow_stream())
            .await
            .ok()?;
        let mut depths = Vec::new();
        for priority in Priority::ALL {
            let name = format!("router-ready-{}", priority.as_str());
            if let Ok(info) = stream.consumer_info(&name).await {
                depths.push(QueueDepth {
                    queue: format!("ready_{}", priority.as_str()),
                    pending: info.num_pending,
                    ack_pending: u64::try_from(info.num_ack_pending).unwrap_or(0),
                });
            }
        }
        // Delayed instances waiting for their time: a schedule each in the delayed stream.
        if let Ok(mut delayed) = client.js.get_stream(client.layout.delayed_stream()).await {
            if let Ok(info) = delayed.info().await {
                depths.push(QueueDepth {
                    queue: "delayed".into(),
                    pending: info.state.messages,
                    ack_pending: 0,
                });
            }
        }
        Some(depths)
    };
    tokio::time::timeout(READ_TIMEOUT, read)
        .await
        .ok()
        .flatten()
}
