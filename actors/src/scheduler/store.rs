//! What the Scheduler's decisions need of the store and the bus — the control handlers, the
//! overlap policy — narrowed to traits so that the decisions (refusals, transitions, what is
//! told) are unit-tested against memory, while the integration tests keep the real
//! nats-server. [`AxClient`] is the implementation that runs.

use async_nats::jetstream::kv::UpdateErrorKind;

use ax_bus::client::reports::{Delivery, Report, ReportState};
use ax_bus::client::Updated;
use ax_bus::error::{During, NatsError};
use ax_bus::ids::{InstanceId, JobName, TraceId};
use ax_bus::instance::TransitionRefused;
use ax_bus::messages::{JobRecord, QueueState};
use ax_bus::spec::Priority;
use ax_bus::{codec, AxClient, InstanceRecord};

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

/// The reports awaited of attempts whose endpoint answered `202 Accepted` (the claims bucket's
/// `report.<trace>` keys).
pub(crate) trait Reports {
    /// What became of attempt `trace`'s report, if any attempt ever waited for one.
    async fn report_state(&self, trace: &TraceId) -> Result<Option<ReportState>, ActorError>;
    /// Hands `report` to the attempt waiting for it, with a compare-and-swap on its key.
    async fn deliver_report(
        &self,
        trace: &TraceId,
        report: &Report,
    ) -> Result<Delivery, ActorError>;
}

impl Reports for AxClient {
    async fn report_state(&self, trace: &TraceId) -> Result<Option<ReportState>, ActorError> {
        Ok(AxClient::report_state(self, trace)
            .await?
            .map(|(state, _)| state))
    }

    async fn deliver_report(
        &self,
        trace: &TraceId,
        report: &Report,
    ) -> Result<Delivery, ActorError> {
        Ok(AxClient::deliver_report(self, trace, report).await?)
    }
}

/// Each job's latest instance (bucket `ax_latest`, kept for the jobs whose overlap policy is
/// not `allow`).
pub(crate) trait Latest {
    /// The latest instance noted for `job`, if one is (a value that is no instance id is none).
    async fn latest(&self, job: &JobName) -> Result<Option<InstanceId>, ActorError>;
}

impl Latest for AxClient {
    async fn latest(&self, job: &JobName) -> Result<Option<InstanceId>, ActorError> {
        let value = self
            .latest
            .get(job)
            .await
            .during(|| format!("read latest instance of {job}"))?;
        Ok(value.and_then(|v| InstanceId::parse(std::str::from_utf8(&v).ok()?).ok()))
    }
}

/// The job registry and the queues' states, as `pause`, `resume` and `queue` change them.
pub(crate) trait Registry {
    /// Job `name`'s record and its revision, if it has one.
    async fn job(&self, name: &JobName) -> Result<Option<(JobRecord, u64)>, ActorError>;
    /// Writes `record` over revision `revision` of `name`; `false` when the entry moved on
    /// since (read it again).
    async fn swap_job(
        &self,
        name: &JobName,
        record: &JobRecord,
        revision: u64,
    ) -> Result<bool, ActorError>;
    /// Sets a priority's queue's state.
    async fn set_queue(&self, priority: Priority, state: &QueueState) -> Result<(), ActorError>;
}

impl Registry for AxClient {
    async fn job(&self, name: &JobName) -> Result<Option<(JobRecord, u64)>, ActorError> {
        Ok(AxClient::job(self, name).await?)
    }

    async fn swap_job(
        &self,
        name: &JobName,
        record: &JobRecord,
        revision: u64,
    ) -> Result<bool, ActorError> {
        match self
            .jobs
            .update(name, codec::encode(record)?, revision)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Ok(false),
            Err(e) => Err(NatsError::new(format!("update job {name}"), e).into()),
        }
    }

    async fn set_queue(&self, priority: Priority, state: &QueueState) -> Result<(), ActorError> {
        self.queues
            .put(priority.as_str(), codec::encode(state)?)
            .await
            .during(|| format!("set queue {}", priority.as_str()))?;
        Ok(())
    }
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

/// The instances in memory, for the decisions' unit tests: what was written, ended and stopped,
/// and each job's latest instance.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct Memory {
    pub(crate) records: std::sync::Mutex<std::collections::BTreeMap<InstanceId, InstanceRecord>>,
    pub(crate) latest: std::sync::Mutex<std::collections::BTreeMap<JobName, InstanceId>>,
    pub(crate) reports: std::sync::Mutex<std::collections::BTreeMap<TraceId, ReportState>>,
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

/// The registry in memory, for the handlers' unit tests: each job with its revision, and the
/// writes it refused as moved on.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct Jobs {
    pub(crate) jobs: std::sync::Mutex<std::collections::BTreeMap<JobName, (JobRecord, u64)>>,
    pub(crate) queues: std::sync::Mutex<std::collections::BTreeMap<Priority, QueueState>>,
    /// How many writes found the entry moved on; the first `races` writes are made to.
    pub(crate) races: std::sync::atomic::AtomicUsize,
}

#[cfg(test)]
impl Registry for Jobs {
    async fn job(&self, name: &JobName) -> Result<Option<(JobRecord, u64)>, ActorError> {
        Ok(self.jobs.lock().unwrap().get(name).cloned())
    }

    async fn swap_job(
        &self,
        name: &JobName,
        record: &JobRecord,
        revision: u64,
    ) -> Result<bool, ActorError> {
        use std::sync::atomic::Ordering;
        let mut jobs = self.jobs.lock().unwrap();
        let Some((held, at)) = jobs.get_mut(name) else {
            return Ok(false);
        };
        // Another writer got there first, as often as the test asks.
        if self.races.load(Ordering::SeqCst) > 0 {
            self.races.fetch_sub(1, Ordering::SeqCst);
            *at += 1;
            return Ok(false);
        }
        if *at != revision {
            return Ok(false);
        }
        *held = record.clone();
        *at += 1;
        Ok(true)
    }

    async fn set_queue(&self, priority: Priority, state: &QueueState) -> Result<(), ActorError> {
        self.queues.lock().unwrap().insert(priority, state.clone());
        Ok(())
    }
}

#[cfg(test)]
impl Latest for Memory {
    async fn latest(&self, job: &JobName) -> Result<Option<InstanceId>, ActorError> {
        Ok(self.latest.lock().unwrap().get(job).cloned())
    }
}

#[cfg(test)]
impl Reports for Memory {
    async fn report_state(&self, trace: &TraceId) -> Result<Option<ReportState>, ActorError> {
        Ok(self.reports.lock().unwrap().get(trace).cloned())
    }

    async fn deliver_report(
        &self,
        trace: &TraceId,
        report: &Report,
    ) -> Result<Delivery, ActorError> {
        let mut reports = self.reports.lock().unwrap();
        Ok(match reports.get(trace) {
            None => Delivery::Unknown,
            Some(ReportState::Reported(_)) => Delivery::AlreadyReported,
            Some(ReportState::Closed { reason }) => Delivery::Closed(reason.clone()),
            Some(ReportState::Waiting { .. }) => {
                reports.insert(trace.clone(), ReportState::Reported(report.clone()));
                Delivery::Accepted
            }
        })
    }
}
