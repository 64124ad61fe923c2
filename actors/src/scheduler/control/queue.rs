//! `queue`: pause or resume the queue of one priority.

use ax_bus::messages::typed::Done;
use ax_bus::messages::{QueueRequest, QueueState};

use super::CommandError;
use crate::scheduler::store::Registry;

/// Pauses or resumes a priority's queue: the Routers stop (or start again) pulling from it;
/// nothing in it is lost.
pub(super) async fn set_queue(
    registry: &impl Registry,
    request: &QueueRequest,
) -> Result<Done, CommandError> {
    let state = QueueState {
        paused: request.paused,
        by: String::new(),
    };
    registry.set_queue(request.priority, &state).await?;
    Ok(Done {
        message: format!(
            "queue {} {}",
            request.priority.as_str(),
            if request.paused { "paused" } else { "resumed" }
        ),
        ..Done::default()
    })
}
