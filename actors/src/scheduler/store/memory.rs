//! The store in memory, for the decisions' unit tests (compiled for tests only).

use std::collections::BTreeMap;
use std::sync::Mutex;

use chrono::NaiveDate;

use ax_bus::auth::approval::Approval;
use ax_bus::auth::audit::AuditRecord;
use ax_bus::auth::token::TokenRecord;
use ax_bus::client::deps::{DayKey, Days};
use ax_bus::client::reports::{Delivery, Report, ReportState};
use ax_bus::client::Updated;
use ax_bus::dead_letter::DeadLetter;
use ax_bus::ids::{ApprovalId, InstanceId, JobName, Namespace, TokenName, TraceId};
use ax_bus::instance::TransitionRefused;
use ax_bus::messages::{DateInstances, JobRecord, NamespaceSettings, QueueState, WorkItem};
use ax_bus::spec::{JobSpec, Priority};
use ax_bus::InstanceRecord;

use super::{
    ApprovalStore, AuditLog, DeadLetters, History, Instances, Latest, Registry, Reports, TokenStore,
};
use crate::scheduler::creator::{Created, Creates};
use crate::scheduler::new_instance::NewInstance;
use crate::scheduler::one_off::{OneOffs, Stored};
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
    /// Each new attempt handed on (a re-run's).
    pub(crate) handed: Mutex<Vec<WorkItem>>,
    /// The registry.
    pub(crate) registry: Jobs,
    /// The dependency history.
    pub(crate) days: Mutex<Days>,
    /// The approvals, each with its revision.
    pub(crate) approvals: Mutex<BTreeMap<ApprovalId, (Approval, u64)>>,
    /// Each audit record, with its key.
    pub(crate) audited: Mutex<Vec<(u64, AuditRecord)>>,
    /// The dead letters.
    pub(crate) letters: Mutex<BTreeMap<u64, DeadLetter>>,
    /// Each letter put back: (id, subject).
    pub(crate) put_back: Mutex<Vec<(u64, String)>>,
    /// Each job whose waiting one-off instance was told of an apply or a deletion.
    pub(crate) one_offs: Mutex<Vec<(JobName, &'static str)>>,
    /// The tokens.
    pub(crate) keys: Keys,
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

    /// `self` with `specs` registered as jobs.
    pub(crate) fn registering(self, specs: impl IntoIterator<Item = JobSpec>) -> Self {
        let now = ax_bus::time::now();
        for spec in specs {
            let record = JobRecord {
                spec,
                paused: false,
                updated_at: now,
                defined_at: None,
            };
            let mut jobs = self.registry.jobs.lock().unwrap();
            jobs.insert(record.spec.name.clone(), (record, 1));
        }
        self
    }

    /// `self` with each record held written into the dependency history of its day.
    pub(crate) fn with_history(self) -> Self {
        {
            let records = self.records.lock().unwrap();
            let mut days = self.days.lock().unwrap();
            for record in records.values() {
                let Some(date) = ax_bus::time::parse_biz_date(&record.biz_date) else {
                    continue;
                };
                days.entry((record.job.clone(), date))
                    .or_default()
                    .instances
                    .insert(record.instance_id.clone(), (record.attempt, record.state));
            }
        }
        self
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

    async fn hand_on(&self, _record: &InstanceRecord, work: &WorkItem) -> Result<(), ActorError> {
        self.handed.lock().unwrap().push(work.clone());
        Ok(())
    }
}

/// The registry in memory, for the handlers' unit tests: each job with its revision, and the
/// writes it refused as moved on.
#[derive(Debug, Default)]
pub(crate) struct Jobs {
    pub(crate) jobs: std::sync::Mutex<std::collections::BTreeMap<JobName, (JobRecord, u64)>>,
    pub(crate) queues: std::sync::Mutex<std::collections::BTreeMap<Priority, QueueState>>,
    pub(crate) namespaces: std::sync::Mutex<BTreeMap<Namespace, NamespaceSettings>>,
    /// What each namespace has waiting to run.
    pub(crate) waiting: std::sync::Mutex<BTreeMap<String, u64>>,
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

    async fn job_exists(&self, name: &JobName) -> Result<bool, ActorError> {
        Ok(self.jobs.lock().unwrap().contains_key(name))
    }

    async fn create_job(&self, name: &JobName, record: &JobRecord) -> Result<bool, ActorError> {
        let mut jobs = self.jobs.lock().unwrap();
        if jobs.contains_key(name) {
            return Ok(false);
        }
        jobs.insert(name.clone(), (record.clone(), 1));
        Ok(true)
    }

    async fn delete_job(&self, name: &JobName) -> Result<(), ActorError> {
        self.jobs.lock().unwrap().remove(name);
        Ok(())
    }

    async fn specs(&self) -> Result<BTreeMap<JobName, JobSpec>, ActorError> {
        let jobs = self.jobs.lock().unwrap();
        Ok(jobs
            .iter()
            .map(|(name, (record, _))| (name.clone(), record.spec.clone()))
            .collect())
    }

    async fn set_queue(&self, priority: Priority, state: &QueueState) -> Result<(), ActorError> {
        self.queues.lock().unwrap().insert(priority, state.clone());
        Ok(())
    }

    async fn namespaces(&self) -> Result<BTreeMap<Namespace, NamespaceSettings>, ActorError> {
        Ok(self.namespaces.lock().unwrap().clone())
    }

    async fn waiting(&self, namespace: &str) -> Result<u64, ActorError> {
        Ok(self
            .waiting
            .lock()
            .unwrap()
            .get(namespace)
            .copied()
            .unwrap_or(0))
    }

    async fn set_namespace(
        &self,
        namespace: &Namespace,
        settings: Option<&NamespaceSettings>,
    ) -> Result<(), ActorError> {
        let mut namespaces = self.namespaces.lock().unwrap();
        match settings {
            Some(settings) => namespaces.insert(namespace.clone(), settings.clone()),
            None => namespaces.remove(namespace),
        };
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

/// The tokens of [`Memory`] are its [`Keys`].
impl TokenStore for Memory {
    async fn tokens(&self) -> Result<Vec<TokenRecord>, ActorError> {
        self.keys.tokens().await
    }

    async fn token(&self, name: &TokenName) -> Result<Option<(TokenRecord, u64)>, ActorError> {
        self.keys.token(name).await
    }

    async fn mark_bootstrap(&self) -> Result<bool, ActorError> {
        self.keys.mark_bootstrap().await
    }

    async fn put_token(&self, record: &TokenRecord, over: Option<u64>) -> Result<bool, ActorError> {
        self.keys.put_token(record, over).await
    }
}

/// The registry of [`Memory`] is its [`Jobs`].
impl Registry for Memory {
    async fn job(&self, name: &JobName) -> Result<Option<(JobRecord, u64)>, ActorError> {
        self.registry.job(name).await
    }

    async fn swap_job(
        &self,
        name: &JobName,
        record: &JobRecord,
        revision: u64,
    ) -> Result<bool, ActorError> {
        self.registry.swap_job(name, record, revision).await
    }

    async fn job_exists(&self, name: &JobName) -> Result<bool, ActorError> {
        self.registry.job_exists(name).await
    }

    async fn create_job(&self, name: &JobName, record: &JobRecord) -> Result<bool, ActorError> {
        self.registry.create_job(name, record).await
    }

    async fn delete_job(&self, name: &JobName) -> Result<(), ActorError> {
        self.registry.delete_job(name).await
    }

    async fn specs(&self) -> Result<BTreeMap<JobName, JobSpec>, ActorError> {
        self.registry.specs().await
    }

    async fn set_queue(&self, priority: Priority, state: &QueueState) -> Result<(), ActorError> {
        self.registry.set_queue(priority, state).await
    }

    async fn namespaces(&self) -> Result<BTreeMap<Namespace, NamespaceSettings>, ActorError> {
        self.registry.namespaces().await
    }

    async fn waiting(&self, namespace: &str) -> Result<u64, ActorError> {
        self.registry.waiting(namespace).await
    }

    async fn set_namespace(
        &self,
        namespace: &Namespace,
        settings: Option<&NamespaceSettings>,
    ) -> Result<(), ActorError> {
        self.registry.set_namespace(namespace, settings).await
    }
}

impl History for Memory {
    async fn day(&self, job: &JobName, date: NaiveDate) -> Result<DateInstances, ActorError> {
        let key: DayKey = (job.clone(), date);
        Ok(self
            .days
            .lock()
            .unwrap()
            .get(&key)
            .cloned()
            .unwrap_or_default())
    }

    async fn date(&self, date: NaiveDate) -> Result<Days, ActorError> {
        let days = self.days.lock().unwrap();
        Ok(days
            .iter()
            .filter(|((_, on), _)| *on == date)
            .map(|(key, day)| (key.clone(), day.clone()))
            .collect())
    }
}

impl ApprovalStore for Memory {
    async fn approvals(&self) -> Result<Vec<Approval>, ActorError> {
        let approvals = self.approvals.lock().unwrap();
        Ok(approvals.values().map(|(a, _)| a.clone()).collect())
    }

    async fn approval(&self, id: &ApprovalId) -> Result<Option<(Approval, u64)>, ActorError> {
        Ok(self.approvals.lock().unwrap().get(id).cloned())
    }

    async fn create_approval(&self, approval: &Approval) -> Result<bool, ActorError> {
        let mut approvals = self.approvals.lock().unwrap();
        if approvals.contains_key(&approval.id) {
            return Ok(false);
        }
        approvals.insert(approval.id.clone(), (approval.clone(), 1));
        Ok(true)
    }

    async fn swap_approval(
        &self,
        approval: &Approval,
        revision: u64,
    ) -> Result<Option<u64>, ActorError> {
        let mut approvals = self.approvals.lock().unwrap();
        match approvals.get_mut(&approval.id) {
            Some((held, at)) if *at == revision => {
                *held = approval.clone();
                // Other keys are written between: a revision is no count of this one's writes.
                *at += 10;
                Ok(Some(*at))
            }
            _ => Ok(None),
        }
    }
}

impl AuditLog for Memory {
    async fn audit(&self, key: u64, record: &AuditRecord) -> Result<(), ActorError> {
        self.audited.lock().unwrap().push((key, record.clone()));
        Ok(())
    }
}

/// Instances created in memory: each one made, in order; a second creation of an id is
/// de-duplicated, as the instances bucket's create-if-absent does.
#[derive(Debug, Default)]
pub(crate) struct Made {
    pub(crate) made: Mutex<Vec<NewInstance>>,
}

impl Creates for Made {
    async fn create(&self, instance: NewInstance) -> Result<Created, ActorError> {
        let mut made = self.made.lock().unwrap();
        let id = &instance.record.instance_id;
        if made.iter().any(|m| m.record.instance_id == *id) {
            return Ok(Created::Deduplicated);
        }
        made.push(instance);
        Ok(Created::Fired)
    }
}

impl DeadLetters for Memory {
    async fn letter(&self, id: u64) -> Result<Option<DeadLetter>, ActorError> {
        Ok(self.letters.lock().unwrap().get(&id).cloned())
    }

    async fn put_back(&self, id: u64, subject: &str) -> Result<(), ActorError> {
        self.put_back
            .lock()
            .unwrap()
            .push((id, subject.to_string()));
        Ok(())
    }

    async fn remove_letter(&self, id: u64) -> Result<(), ActorError> {
        self.letters.lock().unwrap().remove(&id);
        Ok(())
    }
}

impl OneOffs for Memory {
    async fn applied(&self, job: Stored<'_>) -> Result<(), ActorError> {
        let mut told = self.one_offs.lock().unwrap();
        told.push((job.spec.name.clone(), "applied"));
        Ok(())
    }

    async fn deleted(
        &self,
        name: &JobName,
        _at: Option<&str>,
        _defined_at: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<(), ActorError> {
        self.one_offs
            .lock()
            .unwrap()
            .push((name.clone(), "deleted"));
        Ok(())
    }
}
