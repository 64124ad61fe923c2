//! Freshness: a dataset a job `produces` with a `freshness` must be updated for each business
//! date within that long of the date's start (in the job's time zone). The leading
//! DagCoordinator looks every [`CHECK_EVERY`]: for each such dataset, the latest business date
//! whose deadline has passed (and passed after the job was defined: a new job is not late for
//! the days before it); no update recorded for it (see [`ax_bus::client::datasets`]) raises a
//! `freshness` alert (and counts in `ax_datasets_late`), and the update that comes later clears
//! it with a second alert.
//!
//! What has been alerted is kept in memory: a coordinator taking the lead tells an alert still
//! open once more.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_nats::jetstream;
use chrono::{DateTime, NaiveDate, Utc};
use futures::StreamExt;

use ax_bus::client::datasets::{update_key, DatasetUpdate};
use ax_bus::client::kv_view::{FeedItem, KvFeed};
use ax_bus::error::NatsError;
use ax_bus::ids::NodeId;
use ax_bus::messages::{AlertKind, JobRecord};
use ax_bus::spec::dataset::DatasetUri;
use ax_bus::{codec, AxClient};

use crate::jetstream::publish;
use crate::ActorError;

/// How often the datasets are looked at.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(5);

/// The latest business date whose deadline (`freshness` after its start in `tz`) has passed at
/// `now`, if that deadline passed after `since`.
pub(crate) fn date_due(
    tz: chrono_tz::Tz,
    freshness: Duration,
    since: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<(NaiveDate, DateTime<Utc>)> {
    let freshness = chrono::Duration::from_std(freshness).ok()?;
    let mut date = now.with_timezone(&tz).date_naive();
    let days = freshness.num_days() + 2;
    for _ in 0..=days {
        let deadline = ax_bus::time::start_of_day(tz, date) + freshness;
        if deadline <= now {
            return (deadline > since).then_some((date, deadline));
        }
        date = date.pred_opt()?;
    }
    None
}

/// Looks at the datasets every [`CHECK_EVERY`] until the connection fails. The jobs with a
/// `freshness` are kept from a feed over the registry (read once, then its changes); each check
/// reads one key of `ax_datasets` per dataset.
pub(crate) async fn watch(client: AxClient, node: NodeId) -> Result<(), ActorError> {
    let datasets = client
        .js
        .get_key_value(client.layout.datasets_bucket())
        .await
        .map_err(|e| NatsError::new("open the datasets bucket", e))?;
    let mut registry = KvFeed::open(&client.js, &client.layout.jobs_bucket(), ">")
        .await?
        .into_stream();
    let mut watched: BTreeMap<String, JobRecord> = BTreeMap::new();
    let mut late: BTreeSet<(DatasetUri, NaiveDate)> = BTreeSet::new();
    let mut every = tokio::time::interval(CHECK_EVERY);
    loop {
        tokio::select! {
            item = registry.next() => match item {
                Some(item) => follow(&mut watched, item?),
                None => return Err(ActorError::Stopped("the registry feed")),
            },
            _ = every.tick() => {
                check(&client, &node, &datasets, &watched, &mut late).await?;
            }
        }
    }
}

/// Keeps the registry's jobs that have a `freshness`.
fn follow(watched: &mut BTreeMap<String, JobRecord>, item: FeedItem) {
    match item {
        FeedItem::Put { key, value, .. } => match codec::decode::<JobRecord>(&value) {
            Ok(record) if !record.spec.freshness.is_empty() => {
                watched.insert(key, record);
            }
            _ => {
                watched.remove(&key);
            }
        },
        FeedItem::Deleted { key } => {
            watched.remove(&key);
        }
        FeedItem::Current => {}
    }
}

/// One look: an alert for each dataset newly late, one for each late one updated since.
async fn check(
    client: &AxClient,
    node: &NodeId,
    datasets: &jetstream::kv::Store,
    watched: &BTreeMap<String, JobRecord>,
    late: &mut BTreeSet<(DatasetUri, NaiveDate)>,
) -> Result<(), ActorError> {
    let now = ax_bus::time::now();
    for record in watched.values() {
        let spec = &record.spec;
        let tz: chrono_tz::Tz = spec.timezone.parse().unwrap_or(chrono_tz::UTC);
        let since = record.defined_at.unwrap_or(record.updated_at);
        for (uri, secs) in &spec.freshness {
            let Some((date, deadline)) = date_due(tz, Duration::from_secs(*secs), since, now)
            else {
                continue;
            };
            let key = update_key(uri, date);
            let update = datasets
                .get(&key)
                .await
                .map_err(|e| NatsError::new(format!("read dataset update {key}"), e))?
                .and_then(|bytes| codec::decode::<DatasetUpdate>(&bytes).ok());
            let date_text = date.format("%Y-%m-%d").to_string();
            let seen = (uri.clone(), date);
            match update {
                None if late.insert(seen.clone()) => {
                    let message = format!(
                        "dataset {uri} has no update for {date_text}: it was due by {} \
                         (freshness {}, produced by job {})",
                        ax_bus::time::rfc3339(deadline),
                        ax_bus::time::human_ms(i64::try_from(*secs).unwrap_or(i64::MAX) * 1000),
                        spec.name
                    );
                    publish::alert(client, node, AlertKind::Freshness, message, None).await;
                }
                Some(update) if late.remove(&seen) => {
                    let message = format!(
                        "dataset {uri} is fresh again: updated for {date_text} by {} at {}",
                        update.instance_id,
                        ax_bus::time::rfc3339(update.at)
                    );
                    publish::alert(client, node, AlertKind::Freshness, message, None).await;
                }
                _ => {}
            }
        }
    }
    // A date checked no more (the next one is due, or the dataset's freshness went): its alert
    // is not cleared, it is forgotten.
    late.retain(|(_, date)| now.date_naive() - *date <= chrono::Duration::days(32));
    crate::metrics::metrics()
        .datasets_late
        .set(i64::try_from(late.len()).unwrap_or(i64::MAX));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(text: &str) -> DateTime<Utc> {
        ax_bus::time::parse_instant(text).unwrap()
    }

    #[test]
    fn the_date_due_is_the_latest_whose_deadline_passed_after_the_job_was_defined() {
        let day = Duration::from_secs(86_400);
        let hours = |h: u64| Duration::from_secs(h * 3600);
        let long_ago = t("2026-01-01T00:00:00.000Z");
        let utc = chrono_tz::UTC;
        // 26 h: at 03:00 on Dec 5, Dec 4's deadline (Dec 5 02:00) has passed.
        let (date, deadline) =
            date_due(utc, hours(26), long_ago, t("2026-12-05T03:00:00.000Z")).unwrap();
        assert_eq!(date.to_string(), "2026-12-04");
        assert_eq!(deadline, t("2026-12-05T02:00:00.000Z"));
        // At 01:00, not yet: Dec 3's.
        let (date, _) = date_due(utc, hours(26), long_ago, t("2026-12-05T01:00:00.000Z")).unwrap();
        assert_eq!(date.to_string(), "2026-12-03");
        // A job defined after that deadline is not late for that date.
        assert_eq!(
            date_due(
                utc,
                hours(26),
                t("2026-12-05T02:30:00.000Z"),
                t("2026-12-05T03:00:00.000Z")
            ),
            None
        );
        // In the job's zone: Shanghai's Dec 5 starts at Dec 4 16:00 UTC.
        let shanghai: chrono_tz::Tz = "Asia/Shanghai".parse().unwrap();
        let (date, deadline) =
            date_due(shanghai, hours(1), long_ago, t("2026-12-04T17:30:00.000Z")).unwrap();
        assert_eq!(date.to_string(), "2026-12-05");
        assert_eq!(deadline, t("2026-12-04T17:00:00.000Z"));
        assert!(date_due(utc, day * 3, long_ago, t("2026-12-05T00:00:00.000Z")).is_some());
    }
}
