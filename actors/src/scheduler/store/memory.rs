//! The store in memory, for the decisions' unit tests (compiled for tests only).

use ax_bus::auth::token::TokenRecord;
use ax_bus::client::reports::{Delivery, Report, ReportState};
use ax_bus::client::Updated;
use ax_bus::ids::{InstanceId, JobName, TokenName, TraceId};
use ax_bus::instance::TransitionRefused;
use ax_bus::messages::{JobRecord, QueueState};
use ax_bus::spec::Priority;
use ax_bus::InstanceRecord;

use super::{Instances, Latest, Registry, Reports, TokenStore};
use crate::ActorError;

/// The instances in memory, for the decisions' unit tests: what was written, ended and stopped,
/// and each job's latest instance.
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
#[derive(Debug, Default)]
pub(crate) struct Jobs {
    pub(crate) jobs: std::sync::Mutex<std::collections::BTreeMap<JobName, (JobRecord, u64)>>,
    pub(crate) queues: std::sync::Mutex<std::collections::BTreeMap<Priority, QueueState>>,
    /// How many writes found the entry moved on; the first `races` writes are made to.
    pub(crate) races: std::sync::atomic::AtomicUsize,
}

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

impl Latest for Memory {
    async fn latest(&self, job: &JobName) -> Result<Option<InstanceId>, ActorError> {
        Ok(self.latest.lock().unwrap().get(job).cloned())
    }
}

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

/// The tokens in memory: each with its revision, and whether the bootstrap was marked.
#[derive(Debug, Default)]
pub(crate) struct Keys {
    pub(crate) tokens: std::sync::Mutex<std::collections::BTreeMap<TokenName, (TokenRecord, u64)>>,
    pub(crate) bootstrapped: std::sync::atomic::AtomicBool,
}

impl TokenStore for Keys {
    async fn tokens(&self) -> Result<Vec<TokenRecord>, ActorError> {
        Ok(self
            .tokens
            .lock()
            .unwrap()
            .values()
            .map(|(t, _)| t.clone())
            .collect())
    }

    async fn token(&self, name: &TokenName) -> Result<Option<(TokenRecord, u64)>, ActorError> {
        Ok(self.tokens.lock().unwrap().get(name).cloned())
    }

    async fn mark_bootstrap(&self) -> Result<bool, ActorError> {
        Ok(!self
            .bootstrapped
            .swap(true, std::sync::atomic::Ordering::SeqCst))
    }

    async fn put_token(&self, record: &TokenRecord, over: Option<u64>) -> Result<bool, ActorError> {
        let mut tokens = self.tokens.lock().unwrap();
        let at = tokens.get(&record.name).map(|(_, revision)| *revision);
        if at != over {
            return Ok(false);
        }
        tokens.insert(record.name.clone(), (record.clone(), at.unwrap_or(0) + 1));
        Ok(true)
    }
}
