//! The deps bucket (`ax_deps`): how each instance of a (job, business date) stands, one key per
//! instance — `<YYYYMMDD>.<job>.<instance id>` → (attempt, state).
//!
//! Why one key per instance and not one per (job, date): a job firing every second has 86,400
//! instances a day, and a value holding all of them outgrows NATS's 1 MiB payload limit within
//! hours (the coordinator could then store nothing more), while each change rewrote the whole
//! day (quadratic work over the day). A change now writes one small value. One date's entries
//! are the key pattern `<YYYYMMDD>.>`, one (job, date)'s `<YYYYMMDD>.<job>.>` (job names are a
//! single token, `[a-z0-9_-]`).
//!
//! Each entry lives [`ax_bus::client::provision::HISTORY_MAX_AGE`] from its last change.
//!
//! Values written by earlier versions (one key per (job, date) holding the whole day) are read
//! and rewritten as entries when a coordinator takes the lead ([`restore`]).

use std::collections::BTreeMap;

use chrono::NaiveDate;

use ax_bus::client::kv_view::KvFeed;
use ax_bus::instance::State;
use ax_bus::messages::DateInstances;
use ax_bus::{codec, AxClient};

use crate::dag::state::DayKey;
use crate::jetstream::publish::AckWindow;
use crate::ActorError;

/// Everything stored, by (job, date).
pub type Days = BTreeMap<DayKey, DateInstances>;

const DATE_FORMAT: &str = "%Y%m%d";

/// The key of one instance's entry.
pub fn entry_key(job: &str, date: NaiveDate, instance_id: &str) -> String {
    format!("{}.{job}.{instance_id}", date.format(DATE_FORMAT))
}

/// What a key of the bucket names: one instance's entry, or (legacy) a whole day.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoredKey {
    /// An instance of a (job, date).
    Entry(DayKey, String),
    /// A whole (job, date), as versions before per-instance entries stored it.
    LegacyDay(DayKey),
}

/// The inverse of [`entry_key`]; also recognises legacy day keys.
pub fn parse_key(key: &str) -> Option<StoredKey> {
    let mut parts = key.splitn(3, '.');
    let date = NaiveDate::parse_from_str(parts.next()?, DATE_FORMAT).ok()?;
    let job = parts.next().filter(|j| !j.is_empty())?.to_string();
    Some(match parts.next() {
        Some(instance) if !instance.is_empty() => {
            StoredKey::Entry((job, date), instance.to_string())
        }
        Some(_) => return None,
        None => StoredKey::LegacyDay((job, date)),
    })
}

/// Encodes one entry's value.
pub fn encode_entry(attempt: u32, state: State) -> Result<bytes::Bytes, ActorError> {
    Ok(codec::encode(&(attempt, state))?)
}

/// Folds stored keys and values into days; what does not decode is logged and skipped.
fn fold(stored: Vec<(String, bytes::Bytes, u64)>) -> Days {
    let mut days = Days::new();
    for (key, value, _) in stored {
        match parse_key(&key) {
            Some(StoredKey::Entry(day, instance)) => match codec::decode::<(u32, State)>(&value) {
                Ok(entry) => {
                    days.entry(day)
                        .or_default()
                        .instances
                        .insert(instance, entry);
                }
                Err(e) => tracing::error!(%key, error = %e, "undecodable deps entry ignored"),
            },
            Some(StoredKey::LegacyDay(day)) => match codec::decode::<DateInstances>(&value) {
                Ok(legacy) => {
                    let instances = &mut days.entry(day).or_default().instances;
                    for (instance, entry) in legacy.instances {
                        // A per-instance entry is newer than the legacy day.
                        instances.entry(instance).or_insert(entry);
                    }
                }
                Err(e) => tracing::error!(%key, error = %e, "undecodable deps day ignored"),
            },
            None => tracing::error!(%key, "deps key of no known form ignored"),
        }
    }
    days
}

async fn read(client: &AxClient, pattern: &str) -> Result<Days, ActorError> {
    let stored = KvFeed::open(&client.js, &client.layout.deps_bucket(), pattern)
        .await?
        .snapshot()
        .await?;
    Ok(fold(stored))
}

/// Every job's instances for `date`.
pub async fn read_date(client: &AxClient, date: NaiveDate) -> Result<Days, ActorError> {
    read(client, &format!("{}.>", date.format(DATE_FORMAT))).await
}

/// The instances of `job` for `date`.
pub async fn read_day(
    client: &AxClient,
    job: &str,
    date: NaiveDate,
) -> Result<DateInstances, ActorError> {
    let pattern = format!("{}.{job}.>", date.format(DATE_FORMAT));
    Ok(read(client, &pattern)
        .await?
        .remove(&(job.to_string(), date))
        .unwrap_or_default())
}

/// Every stored day, for a coordinator taking the lead (one read of the bucket). Legacy day
/// values found are rewritten as entries (pipelined; entries already there win, being newer)
/// and deleted.
pub async fn restore(client: &AxClient) -> Result<Days, ActorError> {
    let stored = KvFeed::open(&client.js, &client.layout.deps_bucket(), ">")
        .await?
        .snapshot()
        .await?;
    let legacy: Vec<(DayKey, String)> = stored
        .iter()
        .filter_map(|(key, _, _)| match parse_key(key) {
            Some(StoredKey::LegacyDay(day)) => Some((day, key.clone())),
            _ => None,
        })
        .collect();
    let days = fold(stored);
    if legacy.is_empty() {
        return Ok(days);
    }
    let bucket = client.layout.deps_bucket();
    let mut acks = AckWindow::new(1024);
    for (day, _) in &legacy {
        for (instance, (attempt, state)) in
            days.get(day).map(|d| &d.instances).into_iter().flatten()
        {
            let key = entry_key(&day.0, day.1, instance);
            acks.push(
                client
                    .kv_put_pipelined(&bucket, &key, encode_entry(*attempt, *state)?)
                    .await?,
            )
            .await?;
        }
    }
    acks.flush().await?;
    for (_, key) in &legacy {
        client
            .deps
            .delete(key)
            .await
            .map_err(|e| ActorError::Nats(format!("delete legacy deps day {key}: {e}")))?;
    }
    tracing::info!(
        days = legacy.len(),
        "deps days of an earlier version stored per instance"
    );
    Ok(days)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn date() -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 11, 29).unwrap()
    }

    #[test]
    fn keys_round_trip_with_shard_ids_and_recognise_legacy_days() {
        let key = entry_key("stat", date(), "stat.20261129T000000000Z.s3");
        assert_eq!(key, "20261129.stat.stat.20261129T000000000Z.s3");
        assert_eq!(
            parse_key(&key),
            Some(StoredKey::Entry(
                ("stat".into(), date()),
                "stat.20261129T000000000Z.s3".into()
            ))
        );
        assert_eq!(
            parse_key("20261129.stat"),
            Some(StoredKey::LegacyDay(("stat".into(), date())))
        );
        assert_eq!(parse_key("2026-11-29.stat"), None);
        assert_eq!(parse_key("20261129..x"), None);
        assert_eq!(parse_key("20261129.stat."), None);
    }

    #[test]
    fn entries_win_over_a_legacy_day_and_bad_values_are_skipped() {
        let legacy = DateInstances {
            instances: [
                ("stat.a".to_string(), (1, State::Running)),
                ("stat.b".to_string(), (1, State::Success)),
            ]
            .into(),
        };
        let stored = vec![
            (
                "20261129.stat".to_string(),
                codec::encode(&legacy).unwrap(),
                1,
            ),
            (
                "20261129.stat.stat.a".to_string(),
                encode_entry(2, State::Failed).unwrap(),
                2,
            ),
            (
                "20261129.stat.stat.c".to_string(),
                bytes::Bytes::from_static(b"\xc1"),
                3,
            ),
        ];
        let days = fold(stored);
        let day = &days[&("stat".to_string(), date())].instances;
        assert_eq!(day.len(), 2);
        assert_eq!(day["stat.a"], (2, State::Failed));
        assert_eq!(day["stat.b"], (1, State::Success));
    }
}
