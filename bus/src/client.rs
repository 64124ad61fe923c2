//! [`AxClient`]: a connection to NATS with ax's streams and buckets at hand, and the
//! operations shared by the CLI, the actors and business services (control commands, reading
//! jobs and instances, compare-and-swap on instance records).

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use serde::Serialize;

use crate::codec::{self, CodecError};
use crate::instance::{InstanceRecord, TransitionRefused};
use crate::kv_view::{FeedError, KvFeed};
use chrono::{DateTime, Utc};

use crate::messages::{
    ControlReply, JobRecord, QueueState, TickRecord, WorkerInfo, REPLY_TO_HEADER,
};
use crate::provision::{Layout, ProvisionError};
use crate::subjects::Subjects;

/// How to connect.
#[derive(Clone, Debug)]
pub struct ConnectConfig {
    /// `nats://host:port` (credentials may be in the URL).
    pub url: String,
    /// Connection name shown by the server (`ax-cli`, `ax-node-<id>`).
    pub name: String,
    /// Subject prefix, `ax` by default.
    pub prefix: String,
    /// Replicas for streams and buckets.
    pub replicas: usize,
}

impl ConnectConfig {
    /// Defaults for `url`: prefix `ax`, 1 replica.
    pub fn new(url: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            name: name.into(),
            prefix: crate::subjects::DEFAULT_PREFIX.to_string(),
            replicas: 1,
        }
    }
}

/// What can go wrong talking to ax over NATS.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server could not be reached or refused us.
    #[error("cannot connect to NATS at {url}: {reason}")]
    Connect {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// Streams or buckets could not be set up.
    #[error(transparent)]
    Provision(#[from] ProvisionError),
    /// A NATS or JetStream operation failed.
    #[error("{operation}: {reason}")]
    Nats {
        /// What was attempted.
        operation: String,
        /// Why it failed.
        reason: String,
    },
    /// A stored or received value did not decode.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// A bucket could not be read.
    #[error(transparent)]
    Feed(#[from] FeedError),
    /// The command was stored but no Scheduler answered in time.
    #[error(
        "no Scheduler answered within {0:?}; the command is queued (control stream seq {1}) and \
         runs when one starts"
    )]
    NoAnswer(Duration, u64),
}

fn nats_err(operation: impl Into<String>) -> impl FnOnce(String) -> ClientError {
    let operation = operation.into();
    move |reason| ClientError::Nats { operation, reason }
}

/// The result of a compare-and-swap update of an instance record.
#[derive(Debug)]
pub enum Updated {
    /// Written; the new record and its revision.
    Written(Box<InstanceRecord>, u64),
    /// The transition rules refused it (stale or repeated).
    Refused(TransitionRefused),
    /// There is no such instance.
    Missing,
}

/// A connection with ax's JetStream objects.
#[derive(Clone)]
pub struct AxClient {
    /// The core connection.
    pub nats: async_nats::Client,
    /// The JetStream context.
    pub js: jetstream::Context,
    /// Names of subjects, streams and buckets.
    pub layout: Layout,
    /// Job registry.
    pub jobs: kv::Store,
    /// Instance records.
    pub instances: kv::Store,
    /// Attempt claims.
    pub claims: kv::Store,
    /// Worker heartbeats.
    pub workers: kv::Store,
    /// Instances per business date and job.
    pub deps: kv::Store,
    /// Instances held for their dependencies.
    pub waiting: kv::Store,
    /// Each job's latest instance.
    pub latest: kv::Store,
    /// Leases.
    pub leases: kv::Store,
    /// Paused queues.
    pub queues: kv::Store,
}

const CAS_ATTEMPTS: usize = 16;

impl AxClient {
    /// Connects and makes sure every stream and bucket exists.
    pub async fn connect(config: &ConnectConfig) -> Result<Self, ClientError> {
        let nats = async_nats::ConnectOptions::new()
            .name(&config.name)
            .connection_timeout(Duration::from_secs(5))
            .connect(&config.url)
            .await
            .map_err(|e| ClientError::Connect {
                url: config.url.clone(),
                reason: e.to_string(),
            })?;
        Self::from_client(
            nats,
            Layout::new(Subjects::new(&config.prefix), config.replicas),
        )
        .await
    }

    /// Uses an existing connection.
    pub async fn from_client(
        nats: async_nats::Client,
        layout: Layout,
    ) -> Result<Self, ClientError> {
        let js = jetstream::new(nats.clone());
        layout.ensure(&js).await?;
        let bucket = |name: String| {
            let js = js.clone();
            async move {
                js.get_key_value(&name)
                    .await
                    .map_err(|e| ClientError::Nats {
                        operation: format!("open bucket {name}"),
                        reason: e.to_string(),
                    })
            }
        };
        Ok(Self {
            jobs: bucket(layout.jobs_bucket()).await?,
            instances: bucket(layout.instances_bucket()).await?,
            claims: bucket(layout.claims_bucket()).await?,
            workers: bucket(layout.workers_bucket()).await?,
            deps: bucket(layout.deps_bucket()).await?,
            waiting: bucket(layout.waiting_bucket()).await?,
            latest: bucket(layout.latest_bucket()).await?,
            leases: bucket(layout.leases_bucket()).await?,
            queues: bucket(layout.queues_bucket()).await?,
            nats,
            js,
            layout,
        })
    }

    /// Subject names.
    pub fn subjects(&self) -> &Subjects {
        &self.layout.subjects
    }

    /// Publishes a control command (MessagePack) and waits up to `timeout` for the reply.
    pub async fn control<T: Serialize>(
        &self,
        command: &str,
        request: &T,
        timeout: Duration,
    ) -> Result<ControlReply, ClientError> {
        let inbox = self.nats.new_inbox();
        let mut replies = self
            .nats
            .subscribe(inbox.clone())
            .await
            .map_err(|e| nats_err("subscribe to reply inbox")(e.to_string()))?;
        let mut headers = codec::msgpack_headers();
        headers.insert(REPLY_TO_HEADER, inbox.as_str());
        let subject = self.subjects().control(command);
        let ack = self
            .js
            .publish_with_headers(subject.clone(), headers, codec::encode(request)?)
            .await
            .map_err(|e| nats_err(format!("publish {subject}"))(e.to_string()))?
            .await
            .map_err(|e| nats_err(format!("publish {subject}"))(e.to_string()))?;
        match tokio::time::timeout(timeout, replies.next()).await {
            Ok(Some(message)) => Ok(codec::decode(&message.payload)?),
            _ => Err(ClientError::NoAnswer(timeout, ack.sequence)),
        }
    }

    /// One job's record.
    pub async fn job(&self, name: &str) -> Result<Option<(JobRecord, u64)>, ClientError> {
        match self
            .jobs
            .entry(name)
            .await
            .map_err(|e| nats_err(format!("read job {name}"))(e.to_string()))?
        {
            Some(entry) if entry.operation == kv::Operation::Put => {
                Ok(Some((codec::decode(&entry.value)?, entry.revision)))
            }
            _ => Ok(None),
        }
    }

    /// Every job, by name.
    pub async fn jobs(&self) -> Result<Vec<JobRecord>, ClientError> {
        let feed = KvFeed::open(&self.js, &self.layout.jobs_bucket(), ">").await?;
        feed.snapshot()
            .await?
            .into_iter()
            .map(|(_, value, _)| codec::decode(&value).map_err(ClientError::from))
            .collect()
    }

    /// The last `limit` tick records of `job`, oldest first.
    pub async fn ticks(&self, job: &str, limit: usize) -> Result<Vec<TickRecord>, ClientError> {
        let prefix = format!("{}.", self.subjects().tick_all().trim_end_matches(".>"));
        let feed = KvFeed::open_stream(
            &self.js,
            &self.layout.ticks_stream(),
            &prefix,
            job,
            jetstream::consumer::DeliverPolicy::All,
        )
        .await?;
        let all = feed.history().await?;
        let skip = all.len().saturating_sub(limit);
        all.into_iter()
            .skip(skip)
            .map(|(_, value)| codec::decode(&value).map_err(ClientError::from))
            .collect()
    }

    /// The last tick record of every job that has one.
    pub async fn last_ticks(&self) -> Result<Vec<TickRecord>, ClientError> {
        let prefix = format!("{}.", self.subjects().tick_all().trim_end_matches(".>"));
        let feed = KvFeed::open_stream(
            &self.js,
            &self.layout.ticks_stream(),
            &prefix,
            ">",
            jetstream::consumer::DeliverPolicy::LastPerSubject,
        )
        .await?;
        feed.snapshot()
            .await?
            .into_iter()
            .map(|(_, value, _)| codec::decode(&value).map_err(ClientError::from))
            .collect()
    }

    /// Every worker's last heartbeat, with when the server stored it.
    pub async fn workers(&self) -> Result<Vec<(WorkerInfo, DateTime<Utc>)>, ClientError> {
        let feed = KvFeed::open(&self.js, &self.layout.workers_bucket(), ">").await?;
        feed.snapshot_timed()
            .await?
            .into_iter()
            .map(|(_, value, _, at)| Ok((codec::decode(&value)?, at)))
            .collect()
    }

    /// Which priority queues are paused.
    pub async fn paused_queues(&self) -> Result<Vec<crate::spec::Priority>, ClientError> {
        let feed = KvFeed::open(&self.js, &self.layout.queues_bucket(), ">").await?;
        let mut paused = Vec::new();
        for (key, value, _) in feed.snapshot().await? {
            let state: QueueState = codec::decode(&value)?;
            if state.paused {
                if let Some(p) = crate::spec::Priority::ALL
                    .into_iter()
                    .find(|p| p.as_str() == key)
                {
                    paused.push(p);
                }
            }
        }
        Ok(paused)
    }

    /// One instance's record and revision.
    pub async fn instance(&self, id: &str) -> Result<Option<(InstanceRecord, u64)>, ClientError> {
        match self
            .instances
            .entry(id)
            .await
            .map_err(|e| nats_err(format!("read instance {id}"))(e.to_string()))?
        {
            Some(entry) if entry.operation == kv::Operation::Put => {
                Ok(Some((codec::decode(&entry.value)?, entry.revision)))
            }
            _ => Ok(None),
        }
    }

    /// The records of one job's instances (or all), oldest first.
    pub async fn instances(&self, job: Option<&str>) -> Result<Vec<InstanceRecord>, ClientError> {
        let pattern = match job {
            Some(job) => format!("{job}.>"),
            None => ">".to_string(),
        };
        let feed = KvFeed::open(&self.js, &self.layout.instances_bucket(), &pattern).await?;
        let mut records: Vec<InstanceRecord> = feed
            .snapshot()
            .await?
            .into_iter()
            .map(|(_, value, _)| codec::decode(&value))
            .collect::<Result<_, _>>()?;
        records.sort_by(|a, b| {
            (a.expected_time, &a.instance_id).cmp(&(b.expected_time, &b.instance_id))
        });
        Ok(records)
    }

    /// Puts `value` under `key` in `bucket` without waiting: the returned future is the
    /// server's ack. Writes published in order on this connection are applied in order.
    pub async fn kv_put_pipelined(
        &self,
        bucket: &str,
        key: &str,
        value: bytes::Bytes,
    ) -> Result<jetstream::context::PublishAckFuture, ClientError> {
        self.js
            .publish(format!("$KV.{bucket}.{key}"), value)
            .await
            .map_err(|e| nats_err(format!("put {bucket}/{key}"))(e.to_string()))
    }

    /// Deletes `key` from `bucket` without waiting (see [`AxClient::kv_put_pipelined`]).
    pub async fn kv_delete_pipelined(
        &self,
        bucket: &str,
        key: &str,
    ) -> Result<jetstream::context::PublishAckFuture, ClientError> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("KV-Operation", "DEL");
        self.js
            .publish_with_headers(format!("$KV.{bucket}.{key}"), headers, bytes::Bytes::new())
            .await
            .map_err(|e| nats_err(format!("delete {bucket}/{key}"))(e.to_string()))
    }

    /// Applies `transition` to an instance record with compare-and-swap, re-reading and
    /// re-applying on a concurrent write, so that every writer's rules see the latest state.
    pub async fn update_instance<F>(&self, id: &str, transition: F) -> Result<Updated, ClientError>
    where
        F: Fn(&InstanceRecord) -> Result<InstanceRecord, TransitionRefused>,
    {
        for _ in 0..CAS_ATTEMPTS {
            let Some((record, revision)) = self.instance(id).await? else {
                return Ok(Updated::Missing);
            };
            let next = match transition(&record) {
                Ok(next) => next,
                Err(refused) => return Ok(Updated::Refused(refused)),
            };
            match self
                .instances
                .update(id, codec::encode(&next)?, revision)
                .await
            {
                Ok(revision) => return Ok(Updated::Written(Box::new(next), revision)),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
                Err(e) => return Err(nats_err(format!("update instance {id}"))(e.to_string())),
            }
        }
        Err(nats_err(format!("update instance {id}"))(format!(
            "still contended after {CAS_ATTEMPTS} attempts"
        )))
    }
}
