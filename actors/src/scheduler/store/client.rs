//! The store as it runs: each trait of [`super`] on the [`AxClient`], over NATS.

use async_nats::jetstream::kv::{CreateErrorKind, UpdateErrorKind};

use ax_bus::auth::token::TokenRecord;
use ax_bus::client::auth::BOOTSTRAP_KEY;

use ax_bus::client::reports::{Delivery, Report, ReportState};
use ax_bus::client::Updated;
use ax_bus::error::{During, NatsError};
use ax_bus::ids::{InstanceId, JobName, TokenName, TraceId};
use ax_bus::instance::TransitionRefused;
use ax_bus::messages::{JobRecord, QueueState};
use ax_bus::spec::Priority;
use ax_bus::{codec, AxClient, InstanceRecord};

use super::{Instances, Latest, Registry, Reports, TokenStore};
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
