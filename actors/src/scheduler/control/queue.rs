//! `queue`: pause or resume the queue of one priority.

use ax_bus::error::During;
use ax_bus::messages::{ControlReply, QueueRequest, QueueState};
use ax_bus::{codec, AxClient};

use super::CommandError;

/// Pauses or resumes a priority's queue: the Routers stop (or start again) pulling from it;
/// nothing in it is lost.
pub(super) async fn set_queue(
    client: &AxClient,
    request: &QueueRequest,
) -> Result<ControlReply, CommandError> {
    let state = QueueState {
        paused: request.paused,
        by: String::new(),
    };
    client
        .queues
        .put(request.priority.as_str(), codec::encode(&state)?)
        .await
        .during(|| format!("set queue {}", request.priority.as_str()))?;
    Ok(ControlReply {
        ok: true,
        message: format!(
            "queue {} {}",
            request.priority.as_str(),
            if request.paused { "paused" } else { "resumed" }
        ),
        ..ControlReply::default()
    })
}
