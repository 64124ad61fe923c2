//! What the control handlers need of the store and the bus, narrowed to a trait so that their
//! decisions — refusals, transitions, what is told — are unit-tested against memory, while the
//! integration tests keep the real nats-server. [`AxClient`] is the implementation that runs.

use ax_bus::client::Updated;
use ax_bus::ids::{InstanceId, TraceId};
use ax_bus::instance::TransitionRefused;
use ax_bus::{AxClient, InstanceRecord};

use crate::jetstream::publish;
use crate::ActorError;

/// The instance records an operator's command reads and moves, and how it tells an end.
pub(crate) trait Instances {
    /// The record of `id`, if there is one.
    async fn record(&self, id: &InstanceId) -> Result<Option<InstanceRecord>, ActorError>;
    /// Moves `id`'s record by `transition`, with a compare-and-swap that decides again on a
    /// record that moved meanwhile.
    async fn update<F>(&self, id: &InstanceId, transition: F) -> Result<Updated, ActorError>
    where
        F: Fn(&InstanceRecord) -> Result<InstanceRecord, TransitionRefused>;
    /// Tells that `record` ended: its result (under `msg_id`) and its event.
    async fn ended(&self, record: &InstanceRecord, msg_id: &str) -> Result<(), ActorError>;
    /// Asks `worker` to stop attempt `trace` (best effort).
    async fn stop_attempt(&self, worker: &str, trace: &TraceId);
}

impl Instances for AxClient {
    async fn record(&self, id: &InstanceId) -> Result<Option<InstanceRecord>, ActorError> {
        Ok(self.instance(id).await?.map(|(record, _)| record))
    }

    async fn update<F>(&self, id: &InstanceId, transition: F) -> Result<Updated, ActorError>
    where
        F: Fn(&InstanceRecord) -> Result<InstanceRecord, TransitionRefused>,
    {
        Ok(self.update_instance(id, transition).await?)
    }

    async fn ended(&self, record: &InstanceRecord, msg_id: &str) -> Result<(), ActorError> {
        publish::ended(self, record, msg_id).await
    }

    async fn stop_attempt(&self, worker: &str, trace: &TraceId) {
        publish::stop_attempt(self, worker, trace).await;
    }
}

/// The instances in memory, for the handlers' unit tests: what was written, ended and stopped.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct Memory {
    pub(crate) records: std::sync::Mutex<std::collections::BTreeMap<InstanceId, InstanceRecord>>,
    /// Each end told, with its message id.
    pub(crate) ended: std::sync::Mutex<Vec<(InstanceRecord, String)>>,
    /// Each stop asked: (worker, trace).
    pub(crate) stopped: std::sync::Mutex<Vec<(String, TraceId)>>,
}

#[cfg(test)]
impl Memory {
    /// Memory holding `records`.
    pub(crate) fn with(records: impl IntoIterator<Item = InstanceRecord>) -> Self {
        let memory = Self::default();
        if let Ok(mut held) = memory.records.lock() {
            held.extend(records.into_iter().map(|r| (r.instance_id.clone(), r)));
        }
        memory
    }
}

#[cfg(test)]
impl Instances for Memory {
    async fn record(&self, id: &InstanceId) -> Result<Option<InstanceRecord>, ActorError> {
        Ok(self.records.lock().unwrap().get(id).cloned())
    }

    async fn update<F>(&self, id: &InstanceId, transition: F) -> Result<Updated, ActorError>
    where
        F: Fn(&InstanceRecord) -> Result<InstanceRecord, TransitionRefused>,
    {
        let mut records = self.records.lock().unwrap();
        let Some(record) = records.get(id) else {
            return Ok(Updated::Missing);
        };
        Ok(match transition(record) {
            Ok(next) => {
                records.insert(id.clone(), next.clone());
                Updated::Written(Box::new(next), 0)
            }
            Err(refused) => Updated::Refused(refused),
        })
    }

    async fn ended(&self, record: &InstanceRecord, msg_id: &str) -> Result<(), ActorError> {
        self.ended
            .lock()
            .unwrap()
            .push((record.clone(), msg_id.to_string()));
        Ok(())
    }

    async fn stop_attempt(&self, worker: &str, trace: &TraceId) {
        self.stopped
            .lock()
            .unwrap()
            .push((worker.to_string(), trace.clone()));
    }
}
