//! The health summary (`ax status`, the console's dashboard): the day's summary the leading
//! DagCoordinator keeps ([`DaySummary`]), the queues' depths, the live workers and nodes, and
//! the alerts of the last hour — each read from what JetStream already holds, none by
//! scanning instance records.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use async_nats::jetstream::kv::Operation;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::client::{AxClient, ClientError};
use crate::codec;
use crate::error::{During, NatsError, Reason};
use crate::figures::DaySummary;
use crate::messages::Alert;
use crate::spec::Priority;

/// Heartbeats older than this count a worker as not live (the Routers' default TTL).
const LIVE_WITHIN: chrono::TimeDelta = chrono::TimeDelta::seconds(10);
/// The most alerts read for the summary.
const MAX_ALERTS: usize = 10_000;
/// How long reading the alerts may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A queue's depth, as JetStream counts it for the queue's consumer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueDepth {
    /// The queue: `ready_high`, `ready_normal`, `ready_low` (`default`'s), a namespace's
    /// `ready_<priority>.<namespace>`, or `delayed` (delayed instances waiting for their time).
    pub queue: String,
    /// Messages not yet delivered.
    pub pending: u64,
    /// Messages delivered and not yet acknowledged.
    pub ack_pending: u64,
}

impl QueueDepth {
    /// The namespace whose work the queue holds: a ready queue's namespace; `default` for
    /// `default`'s and for `delayed`, which holds every namespace's unsplit.
    pub fn namespace(&self) -> &str {
        match self.queue.split_once('.') {
            Some((_, namespace)) => namespace,
            None => crate::ids::DEFAULT_NAMESPACE,
        }
    }
}

/// The health summary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The day's summary (none before any result of that day).
    pub day: Option<DaySummary>,
    /// The queues' depths.
    pub queues: Vec<QueueDepth>,
    /// Workers whose heartbeat is recent.
    pub workers_live: usize,
    /// Nodes with a heartbeat in the last minute.
    pub nodes: Vec<String>,
    /// Alerts of the last hour, by kind.
    pub alerts_last_hour: BTreeMap<String, u64>,
}

impl AxClient {
    /// The health summary of `date` (`YYYY-MM-DD`), or of the latest day summarized.
    pub async fn status(&self, date: Option<&str>) -> Result<Status, ClientError> {
        let now = crate::time::now();
        let workers_live = self
            .workers()
            .await?
            .iter()
            .filter(|(_, seen)| now - *seen < LIVE_WITHIN)
            .count();
        let mut nodes: Vec<String> = self
            .nodes()
            .await?
            .into_iter()
            .map(|n| n.node.to_string())
            .collect();
        nodes.sort();
        let mut alerts_last_hour = BTreeMap::new();
        for alert in self.alerts_since(now - chrono::TimeDelta::hours(1)).await? {
            *alerts_last_hour
                .entry(alert.kind.as_str().to_string())
                .or_default() += 1;
        }
        Ok(Status {
            day: self.day_summary(date).await?,
            queues: self.queue_depths().await?,
            workers_live,
            nodes,
            alerts_last_hour,
        })
    }

    /// The summary of `date`, or of the latest day there is one of.
    pub async fn day_summary(&self, date: Option<&str>) -> Result<Option<DaySummary>, ClientError> {
        let key = match date {
            Some(date) => date.to_string(),
            None => {
                let mut keys = self
                    .summary
                    .keys()
                    .await
                    .during(|| "list the day summaries")?;
                let mut latest: Option<String> = None;
                while let Some(key) = keys.next().await {
                    let key = key.during(|| "list the day summaries")?;
                    if latest.as_ref().is_none_or(|l| key > *l) {
                        latest = Some(key);
                    }
                }
                match latest {
                    Some(key) => key,
                    None => return Ok(None),
                }
            }
        };
        match self
            .summary
            .entry(&key)
            .await
            .during(|| format!("read the summary of {key}"))?
        {
            Some(entry) if entry.operation == Operation::Put => {
                Ok(Some(codec::decode(&entry.value)?))
            }
            _ => Ok(None),
        }
    }

    /// Each priority's ready queue as its Routers' consumer counts it (a queue no Router has
    /// consumed yet is left out), each namespace's after `default`'s, and the delayed
    /// instances waiting for their time.
    pub async fn queue_depths(&self) -> Result<Vec<QueueDepth>, ClientError> {
        let flow = self
            .js
            .get_stream(self.layout.flow_stream())
            .await
            .during(|| "open the flow stream")?;
        // `default`'s queue of each priority, then each other namespace's
        // (`ready_<priority>.<namespace>`, its consumer `router-ready-<priority>-<namespace>`).
        let mut queues: Vec<(String, String)> = Priority::ALL
            .iter()
            .map(|p| {
                let name = format!("router-ready-{}", p.as_str());
                (name, format!("ready_{}", p.as_str()))
            })
            .collect();
        let mut names = flow.consumer_names();
        let mut namespaced = Vec::new();
        while let Some(name) = futures::StreamExt::next(&mut names).await {
            let name = name.during(|| "list the flow stream's consumers")?;
            for priority in Priority::ALL {
                let prefix = format!("router-ready-{}-", priority.as_str());
                if let Some(namespace) = name.strip_prefix(&prefix) {
                    let queue = format!("ready_{}.{namespace}", priority.as_str());
                    namespaced.push((name.clone(), queue));
                }
            }
        }
        namespaced.sort_by(|a, b| a.1.cmp(&b.1));
        queues.extend(namespaced);
        let mut depths = Vec::new();
        for (name, queue) in queues {
            if let Ok(info) = flow.consumer_info(&name).await {
                depths.push(QueueDepth {
                    queue,
                    pending: info.num_pending,
                    ack_pending: u64::try_from(info.num_ack_pending).unwrap_or(0),
                });
            }
        }
        let mut delayed = self
            .js
            .get_stream(self.layout.delayed_stream())
            .await
            .during(|| "open the delayed stream")?;
        let info = delayed.info().await.during(|| "read the delayed stream")?;
        depths.push(QueueDepth {
            queue: "delayed".into(),
            pending: info.state.messages,
            ack_pending: 0,
        });
        Ok(depths)
    }

    /// The alerts stored since `since`, oldest first (at most ten thousand).
    pub async fn alerts_since(&self, since: DateTime<Utc>) -> Result<Vec<Alert>, ClientError> {
        let what = || format!("read the alerts since {since}");
        let read = async {
            let stream = self
                .js
                .get_stream(self.layout.alerts_stream())
                .await
                .during(what)?;
            let start_time = time::OffsetDateTime::from_unix_timestamp_nanos(
                i128::from(since.timestamp_millis()) * 1_000_000,
            )
            .map_err(|e| NatsError::new(what(), e))?;
            let consumer = stream
                .create_consumer(pull::OrderedConfig {
                    deliver_policy: DeliverPolicy::ByStartTime { start_time },
                    ..Default::default()
                })
                .await
                .during(what)?;
            let mut alerts = Vec::new();
            if consumer.cached_info().num_pending == 0 {
                return Ok(alerts);
            }
            let mut messages = consumer.messages().await.during(what)?;
            while let Some(message) = messages.next().await {
                let message = message.during(what)?;
                if let Ok(alert) = codec::decode::<Alert>(&message.payload) {
                    alerts.push(alert);
                }
                let left = message.info().map(|i| i.pending).unwrap_or(0);
                if left == 0 || alerts.len() >= MAX_ALERTS {
                    break;
                }
            }
            Ok::<_, ClientError>(alerts)
        };
        tokio::time::timeout(READ_TIMEOUT, read)
            .await
            .map_err(|_| {
                ClientError::from(NatsError::new(
                    what(),
                    Reason(format!("no end within {READ_TIMEOUT:?}")),
                ))
            })?
    }
}
