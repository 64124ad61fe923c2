//! Re-dispatches in flight, kept in JetStream rather than in one Router's memory.
//!
//! A first dispatch needs no record: it waits in its worker's queue, and if the worker dies
//! the janitor drains the queue. A re-dispatch is different — the Router reserves the attempt
//! for a new dispatch (in its record), which fences the first one off for good — so from the
//! moment it
//! decides to re-dispatch until a worker starts the attempt, the Router that made it is the
//! only one that knows the attempt is in the air. Killed in between, it would leave the
//! attempt reserved for a dispatch nobody sends or runs (issue #15). So the Router writes the
//! intent here first (`ax_inflight`, one key per attempt: the work, where it goes, by when it
//! must be started), then reserves, then sends; whichever Router holds the janitor lease
//! sweeps the bucket and finishes what a dead one left: a started attempt's entry is removed,
//! an overdue one not started is re-dispatched under a new reservation.

use async_nats::jetstream::kv::Operation;
use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};

use crate::client::{AxClient, ClientError};
use crate::codec;
use crate::error::{During, NatsError};
use crate::ids::{NodeId, TraceId, WorkerId};
use crate::messages::WorkItem;

/// A re-dispatch from its decision until a worker starts it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InFlight {
    /// The attempt as re-dispatched, with the dispatch id it is reserved for.
    pub work: WorkItem,
    /// The worker it was sent to; none when it went back to the ready queue.
    pub to: Option<WorkerId>,
    /// When its worker must have started it.
    #[serde(with = "crate::time::wire")]
    pub ack_by: DateTime<Utc>,
    /// Workers that already failed to take the attempt.
    pub excluded: Vec<WorkerId>,
    /// The Router that made it.
    pub by: NodeId,
}

impl AxClient {
    /// Records a re-dispatch about to be made (it replaces the attempt's earlier one).
    pub async fn put_in_flight(&self, entry: &InFlight) -> Result<(), ClientError> {
        let trace = &entry.work.trace_id;
        self.in_flight
            .put(trace.as_str(), codec::encode(entry)?)
            .await
            .during(|| format!("record re-dispatch {trace}"))?;
        Ok(())
    }

    /// Forgets the re-dispatch of `trace`: started, or no longer needed.
    pub async fn settle_in_flight(&self, trace: &TraceId) -> Result<(), ClientError> {
        self.in_flight
            .delete(trace.as_str())
            .await
            .during(|| format!("settle re-dispatch {trace}"))?;
        Ok(())
    }

    /// The re-dispatch of `trace` recorded now, if any.
    pub async fn in_flight_of(&self, trace: &TraceId) -> Result<Option<InFlight>, ClientError> {
        match self
            .in_flight
            .entry(trace.as_str())
            .await
            .during(|| format!("read re-dispatch {trace}"))?
        {
            Some(entry) if entry.operation == Operation::Put => {
                Ok(Some(codec::decode(&entry.value)?))
            }
            _ => Ok(None),
        }
    }

    /// Every re-dispatch in flight; an undecodable entry (of a newer version, say) is skipped
    /// with a warning.
    pub async fn in_flight(&self) -> Result<Vec<InFlight>, ClientError> {
        let failed = |e: async_nats::Error| NatsError::new("list re-dispatches", e);
        let keys: Vec<String> = match self.in_flight.keys().await {
            Ok(keys) => keys.try_collect().await.map_err(|e| failed(e.into()))?,
            Err(e) => return Err(failed(e.into()).into()),
        };
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let Ok(trace) = TraceId::parse(&key) else {
                tracing::warn!(%key, "an in-flight entry of no attempt ignored");
                continue;
            };
            match self.in_flight_of(&trace).await {
                Ok(Some(entry)) => out.push(entry),
                Ok(None) => {}
                Err(ClientError::Codec(e)) => {
                    tracing::warn!(%trace, error = %e, "undecodable in-flight entry ignored")
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}
