//! # DagCoordinator
//! Owns the dependency state per business date (once dependencies exist; for now every job is
//! independent). Reads `ax.internal.created.>`; writes `ax.internal.ready.<priority>`.
//!
//! Today it releases every created attempt at once, so the hand-off is in place for the
//! dependency logic: batches of up to 256 are published with their acks awaited together, and
//! each source message is acknowledged only after its hand-off is stored, so a crash between
//! the two redelivers rather than loses (the ready stream's message ids absorb the repeat).

use std::time::Duration;

use actix::prelude::*;
use futures::StreamExt;

use ax_bus::messages::WorkItem;
use ax_bus::AxClient;

use crate::consume::{self, ConsumerSpec};
use crate::supervision::{note_restart, spawn_pump};
use crate::{publish, ActorError};

const ACTOR: &str = "dag";
const BATCH: usize = 256;

/// The DagCoordinator actor.
pub struct DagCoordinator {
    client: AxClient,
    node: String,
}

impl DagCoordinator {
    /// A coordinator on `client`.
    pub fn new(client: AxClient, node: String) -> Self {
        Self { client, node }
    }
}

impl Actor for DagCoordinator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        spawn_pump(
            ACTOR,
            "created",
            ctx,
            release(self.client.clone(), self.node.clone()),
        );
        tracing::info!(node = %self.node, "dag coordinator started");
    }
}

impl Supervised for DagCoordinator {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        note_restart(ACTOR);
    }
}

async fn release(client: AxClient, node: String) -> Result<(), ActorError> {
    let spec = ConsumerSpec {
        stream: client.layout.flow_stream(),
        durable: "dag-created".into(),
        filter: client.subjects().created_all(),
        ack_wait: Duration::from_secs(30),
        max_ack_pending: 4 * BATCH as i64,
    };
    let mut batches = consume::messages(&client, &spec, BATCH)
        .await?
        .ready_chunks(BATCH);
    while let Some(batch) = batches.next().await {
        let mut pending = Vec::with_capacity(batch.len());
        for message in batch {
            let message =
                message.map_err(|e| ActorError::Nats(format!("created consumer: {e}")))?;
            let Some(work) =
                consume::decode_or_drop::<WorkItem>(&client, &node, "flow", &message).await
            else {
                continue;
            };
            let ack = publish::to_stream(
                &client,
                client.subjects().ready(work.spec.priority),
                &format!("ready:{}", work.trace_id),
                &work,
            )
            .await?;
            pending.push((message, ack, ()));
        }
        consume::settle(pending).await;
    }
    Ok(())
}
