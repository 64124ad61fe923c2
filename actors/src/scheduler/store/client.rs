//! The store as it runs: each trait of [`super`] on the [`AxClient`], over NATS.

use async_nats::jetstream::kv::{CreateErrorKind, UpdateErrorKind};

use std::collections::BTreeMap;

use chrono::NaiveDate;

use ax_bus::auth::approval::Approval;
use ax_bus::auth::audit::AuditRecord;
use ax_bus::auth::token::TokenRecord;
use ax_bus::client::auth::BOOTSTRAP_KEY;
use ax_bus::client::deps::Days;
use ax_bus::dead_letter::DeadLetter;
use ax_bus::error::Reason;

use ax_bus::client::reports::{Delivery, Report, ReportState};
use ax_bus::client::Updated;
use ax_bus::error::{During, NatsError};
use ax_bus::ids::{ApprovalId, InstanceId, JobName, Namespace, TokenName, TraceId};
use ax_bus::instance::TransitionRefused;
use ax_bus::messages::{DateInstances, JobRecord, NamespaceSettings, QueueState, WorkItem};
use ax_bus::spec::{JobSpec, Priority};
use ax_bus::{codec, msg_id, AxClient, InstanceRecord};

use super::{
    ApprovalStore, AuditLog, DeadLetters, History, Instances, Latest, Registry, Reports, TokenStore,
};
use crate::jetstream::publish;
use crate::ActorError;

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

    async fn job_exists(&self, name: &JobName) -> Result<bool, ActorError> {
        Ok(AxClient::job_exists(self, name).await?)
    }

    async fn create_job(&self, name: &JobName, record: &JobRecord) -> Result<bool, ActorError> {
        match self.jobs.create(name, codec::encode(record)?).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(NatsError::new(format!("store job {name}"), e).into()),
        }
    }

    async fn delete_job(&self, name: &JobName) -> Result<(), ActorError> {
        self.jobs
            .delete(name)
            .await
            .during(|| format!("delete job {name}"))?;
        Ok(())
    }

    async fn specs(&self) -> Result<BTreeMap<JobName, JobSpec>, ActorError> {
        Ok(self.job_specs().await?)
    }

    async fn set_queue(&self, priority: Priority, state: &QueueState) -> Result<(), ActorError> {
        self.queues
            .put(priority.as_str(), codec::encode(state)?)
            .await
            .during(|| format!("set queue {}", priority.as_str()))?;
        Ok(())
    }

    async fn namespaces(&self) -> Result<BTreeMap<Namespace, NamespaceSettings>, ActorError> {
        Ok(self.namespace_settings().await?)
    }

    async fn waiting(&self, namespace: &str) -> Result<u64, ActorError> {
        let what = || format!("count the ready queues of {namespace}");
        let stream = self
            .js
            .get_stream(self.layout.flow_stream())
            .await
            .during(what)?;
        // `default`'s queues are the priorities' own subjects, a namespace's one token more.
        let queues = self.subjects().ready_all();
        let queues = queues.trim_end_matches(".>");
        let filter = if namespace == ax_bus::ids::DEFAULT_NAMESPACE {
            format!("{queues}.*")
        } else {
            format!("{queues}.*.{namespace}")
        };
        let mut counts = stream.info_with_subjects(filter).await.during(what)?;
        let mut waiting = 0;
        while let Some(entry) = futures::StreamExt::next(&mut counts).await {
            waiting += entry.during(what)?.1 as u64;
        }
        Ok(waiting)
    }

    async fn set_namespace(
        &self,
        namespace: &Namespace,
        settings: Option<&NamespaceSettings>,
    ) -> Result<(), ActorError> {
        let key = NamespaceSettings::key(namespace);
        let what = || format!("set namespace {namespace}");
        match settings {
            Some(settings) => {
                self.queues
                    .put(&key, codec::encode(settings)?)
                    .await
                    .during(what)?;
            }
            None => self.queues.delete(&key).await.during(what)?,
        }
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

    async fn hand_on(&self, record: &InstanceRecord, work: &WorkItem) -> Result<(), ActorError> {
        publish::to_stream_acked(
            self,
            self.subjects().created(&record.job),
            &msg_id::created(&record.trace_id),
            work,
        )
        .await?;
        publish::event(self, record).await;
        Ok(())
    }
}

impl TokenStore for AxClient {
    async fn tokens(&self) -> Result<Vec<TokenRecord>, ActorError> {
        Ok(self.token_records().await?)
    }

    async fn token(&self, name: &TokenName) -> Result<Option<(TokenRecord, u64)>, ActorError> {
        Ok(self.token_record(name).await?)
    }

    async fn mark_bootstrap(&self) -> Result<bool, ActorError> {
        match self.tokens.create(BOOTSTRAP_KEY, "1".into()).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(NatsError::new("mark bootstrap", e).into()),
        }
    }

    async fn put_token(&self, record: &TokenRecord, over: Option<u64>) -> Result<bool, ActorError> {
        let (name, payload) = (record.name.as_str(), codec::encode(record)?);
        let during = || format!("store token {name}");
        match over {
            None => match self.tokens.create(name, payload).await {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(NatsError::new(during(), e).into()),
            },
            Some(revision) => match self.tokens.update(name, payload, revision).await {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Ok(false),
                Err(e) => Err(NatsError::new(during(), e).into()),
            },
        }
    }
}

impl History for AxClient {
    async fn day(&self, job: &JobName, date: NaiveDate) -> Result<DateInstances, ActorError> {
        Ok(self.deps_of_day(job, date).await?)
    }

    async fn date(&self, date: NaiveDate) -> Result<Days, ActorError> {
        Ok(self.deps_of_date(date).await?)
    }
}

impl ApprovalStore for AxClient {
    async fn approvals(&self) -> Result<Vec<Approval>, ActorError> {
        Ok(AxClient::approvals(self).await?)
    }

    async fn approval(&self, id: &ApprovalId) -> Result<Option<(Approval, u64)>, ActorError> {
        Ok(AxClient::approval(self, id).await?)
    }

    async fn create_approval(&self, approval: &Approval) -> Result<bool, ActorError> {
        let id = approval.id.as_str();
        match self.approvals.create(id, codec::encode(approval)?).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(NatsError::new(format!("store approval {id}"), e).into()),
        }
    }

    async fn swap_approval(
        &self,
        approval: &Approval,
        revision: u64,
    ) -> Result<Option<u64>, ActorError> {
        let id = approval.id.as_str();
        match self
            .approvals
            .update(id, codec::encode(approval)?, revision)
            .await
        {
            Ok(revision) => Ok(Some(revision)),
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Ok(None),
            Err(e) => Err(NatsError::new(format!("update approval {id}"), e).into()),
        }
    }
}

/// How often an audit record is tried before its command is handed back for redelivery.
const AUDIT_TRIES: usize = 4;

impl AuditLog for AxClient {
    async fn audit(&self, key: u64, record: &AuditRecord) -> Result<(), ActorError> {
        let msg_id = if key == 0 {
            msg_id::audit(&record.action)
        } else {
            format!("audit:{key}:{}", record.action)
        };
        let subject = self.subjects().audit(&record.action);
        let mut pause = std::time::Duration::from_millis(250);
        for _ in 1..AUDIT_TRIES {
            match publish::to_stream_acked(self, subject.clone(), &msg_id, record).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::debug!(error = %e, retry_in = ?pause, "audit record not stored yet");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
            }
        }
        publish::to_stream_acked(self, subject, &msg_id, record).await
    }
}

impl DeadLetters for AxClient {
    async fn letter(&self, id: u64) -> Result<Option<DeadLetter>, ActorError> {
        Ok(self
            .dead_letter(id)
            .await?
            .map(|stored| DeadLetter::from_stored(&stored)))
    }

    async fn put_back(&self, id: u64, subject: &str) -> Result<(), ActorError> {
        // Read again for its bytes: a letter removed meanwhile (another replay) is a failure
        // for now, and the command, redelivered, finds it gone.
        let Some(stored) = self.dead_letter(id).await? else {
            let gone = Reason(format!("dead letter {id} was removed meanwhile"));
            return Err(NatsError::new(format!("replay dead letter {id}"), gone).into());
        };
        Ok(self.republish_dead_letter(id, subject, &stored).await?)
    }

    async fn remove_letter(&self, id: u64) -> Result<(), ActorError> {
        self.remove_dead_letter(id).await?;
        Ok(())
    }
}
