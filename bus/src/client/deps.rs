//! The deps bucket (`ax_deps`): how each instance of a (job, business date) stands, one key per
//! instance — `<YYYYMMDD>.<job>.<instance id>` → (attempt, state). The DagCoordinator writes
//! it; the re-run planner and the executors' `{{deps.<job>.output.<field>}}` read it.
//!
//! Why one key per instance and not one per (job, date): a job firing every second has 86,400
//! instances a day, and a value holding all of them outgrows NATS's 1 MiB payload limit within
//! hours, while each change rewrote the whole day (quadratic work over the day). A change now
//! writes one small value. One date's entries are the key pattern `<YYYYMMDD>.>`, one (job,
//! date)'s `<YYYYMMDD>.<job>.>` (a job's name is one token in `default`, two elsewhere:
//! `payments.settle`, whose instance ids start with it too).
//!
//! Only the jobs a decision names — upstreams, downstreams, jobs that queue behind their previous
//! instance — have an entry per instance. A job nothing depends on has a note of each day it
//! has instances of instead, `<YYYYMMDD>.<job>` holding an empty day ([`note_value`], written
//! once a day by [`AxClient::note_days`]), and its instances of a noted day are read from their
//! records when a day is read ([`AxClient::days_of`]): an entry per instance cost every
//! instance of every job a store and its answer, for the re-run planner alone.
//!
//! Each entry lives [`crate::client::provision::HISTORY_MAX_AGE`] from its last change. Values
//! written by earlier versions (one key per (job, date) holding the whole day) are recognised
//! ([`StoredKey::LegacyDay`]) and folded in; the DagCoordinator rewrites them when it takes the
//! lead.

use std::collections::{BTreeMap, BTreeSet};

use chrono::NaiveDate;

use crate::client::kv_view::KvFeed;
use crate::client::{AxClient, ClientError};
use crate::codec::{self, CodecError};
use crate::error::NatsError;
use crate::ids::{InstanceId, JobName};
use crate::instance::State;
use crate::messages::DateInstances;
use crate::InstanceRecord;

/// A job and a business date.
pub type DayKey = (JobName, NaiveDate);

/// Everything stored, by (job, date).
pub type Days = BTreeMap<DayKey, DateInstances>;

const DATE_FORMAT: &str = "%Y%m%d";
/// How many days one read of [`AxClient::deps_entries_of_days`] names (two subject filters each).
const DAYS_PER_READ: usize = 2_000;
/// Notes of days written at once.
const NOTES_IN_FLIGHT: usize = 64;

/// The key of one instance's entry.
pub fn entry_key(job: &JobName, date: NaiveDate, instance_id: &InstanceId) -> String {
    format!("{}.{job}.{instance_id}", date.format(DATE_FORMAT))
}

/// What a key of the bucket names: one instance's entry, or (legacy) a whole day.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoredKey {
    /// An instance of a (job, date).
    Entry(DayKey, InstanceId),
    /// A whole (job, date), as versions before per-instance entries stored it.
    LegacyDay(DayKey),
}

/// The inverse of [`entry_key`]; also recognises legacy day keys.
pub fn parse_key(key: &str) -> Option<StoredKey> {
    let (date, rest) = key.split_once('.')?;
    let date = NaiveDate::parse_from_str(date, DATE_FORMAT).ok()?;
    // The job's name is one token in `default` and two elsewhere (`payments.settle`), and an
    // instance id starts with its job's name: the job is the longest start the rest repeats.
    let mut dots = rest.match_indices('.').map(|(at, _)| at);
    let (first, second) = (dots.next(), dots.next());
    for end in [second, first].into_iter().flatten() {
        let (job, instance) = (&rest[..end], &rest[end + 1..]);
        let repeated = instance
            .strip_prefix(job)
            .is_some_and(|after| after.starts_with('.'));
        if let (true, Ok(job), Ok(instance)) =
            (repeated, JobName::parse(job), InstanceId::parse(instance))
        {
            return Some(StoredKey::Entry((job, date), instance));
        }
    }
    Some(match first {
        Some(end) => StoredKey::Entry(
            (JobName::parse(&rest[..end]).ok()?, date),
            InstanceId::parse(&rest[end + 1..]).ok()?,
        ),
        None => StoredKey::LegacyDay((JobName::parse(rest).ok()?, date)),
    })
}

/// The key of the note of `job`'s `date` (the key a whole day had in earlier versions).
pub fn day_key(job: &JobName, date: NaiveDate) -> String {
    format!("{}.{job}", date.format(DATE_FORMAT))
}

/// The value of a day's note made at `at`: an empty day, which earlier versions read as a day
/// of no instances.
pub fn note_value(at: chrono::DateTime<chrono::Utc>) -> Result<bytes::Bytes, CodecError> {
    codec::encode(&DateInstances {
        noted_at: Some(at),
        ..Default::default()
    })
}

/// The days among `stored` that are notes (see [`note_value`]), not days of an earlier version.
pub fn noted(stored: &[(String, bytes::Bytes, u64)]) -> BTreeSet<DayKey> {
    stored
        .iter()
        .filter_map(|(key, value, _)| match parse_key(key) {
            Some(StoredKey::LegacyDay(day)) => codec::decode::<DateInstances>(value)
                .is_ok_and(|d| d.instances.is_empty())
                .then_some(day),
            _ => None,
        })
        .collect()
}

/// Encodes one entry's value.
pub fn encode_entry(attempt: u32, state: State) -> Result<bytes::Bytes, CodecError> {
    codec::encode(&(attempt, state))
}

/// Folds stored keys and values into days; what does not decode is logged and skipped.
pub fn fold(stored: Vec<(String, bytes::Bytes, u64)>) -> Days {
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
                    let day = days.entry(day).or_default();
                    day.noted_at = day.noted_at.or(legacy.noted_at);
                    for (instance, entry) in legacy.instances {
                        // A per-instance entry is newer than the legacy day.
                        day.instances.entry(instance).or_insert(entry);
                    }
                }
                Err(e) => tracing::error!(%key, error = %e, "undecodable deps day ignored"),
            },
            None => tracing::error!(%key, "deps key of no known form ignored"),
        }
    }
    days
}

impl AxClient {
    /// The raw entries of the deps bucket whose keys match `pattern`.
    pub async fn deps_entries(
        &self,
        pattern: &str,
    ) -> Result<Vec<(String, bytes::Bytes, u64)>, ClientError> {
        Ok(KvFeed::open(&self.js, &self.layout.deps_bucket(), pattern)
            .await?
            .snapshot()
            .await?)
    }

    /// The raw entries of the days `keys` (legacy day values too), read by their subjects:
    /// the rest of the bucket is not read.
    pub async fn deps_entries_of_days(
        &self,
        keys: &[DayKey],
    ) -> Result<Vec<(String, bytes::Bytes, u64)>, ClientError> {
        let mut entries = Vec::new();
        // One consumer per read: the server scans the stream from its first match once per
        // consumer, so fewer, larger reads cost less (two filters a day).
        for chunk in keys.chunks(DAYS_PER_READ) {
            let patterns: Vec<String> = chunk
                .iter()
                .flat_map(|(job, date)| {
                    let day = format!("{}.{job}", date.format(DATE_FORMAT));
                    [format!("{day}.>"), day]
                })
                .collect();
            let feed = KvFeed::open_any(&self.js, &self.layout.deps_bucket(), &patterns).await?;
            entries.extend(feed.snapshot().await?);
        }
        Ok(entries)
    }

    /// Every job's instances for `date`.
    pub async fn deps_of_date(&self, date: NaiveDate) -> Result<Days, ClientError> {
        let pattern = format!("{}.>", date.format(DATE_FORMAT));
        self.days_of(self.deps_entries(&pattern).await?).await
    }

    /// The days `stored` holds, folded ([`fold`]), the instances of the noted ones read from
    /// their records.
    pub async fn days_of(
        &self,
        stored: Vec<(String, bytes::Bytes, u64)>,
    ) -> Result<Days, ClientError> {
        let notes = noted(&stored);
        let mut days = fold(stored);
        self.add_noted(&mut days, notes).await?;
        Ok(days)
    }

    /// Notes `days` (see [`day_key`]); a note already stored, or a day of an earlier version
    /// stored under its key, is left as it is.
    pub async fn note_days(&self, days: &[DayKey]) -> Result<(), ClientError> {
        use async_nats::jetstream::kv::CreateErrorKind;
        use futures::StreamExt;
        let value = note_value(crate::time::now())?;
        let mut creates = futures::stream::iter(days)
            .map(|(job, date)| {
                let (key, value) = (day_key(job, *date), value.clone());
                async move {
                    match self.deps.create(&key, value).await {
                        Ok(_) => Ok(()),
                        Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(()),
                        Err(e) => Err(NatsError::new(format!("note deps day {key}"), e)),
                    }
                }
            })
            .buffer_unordered(NOTES_IN_FLIGHT);
        while let Some(created) = creates.next().await {
            created?;
        }
        Ok(())
    }

    /// Adds to `days` the instances of the noted days `notes`, read from their records (each
    /// job's once); a day whose records are all gone (past their retention) stays, with no
    /// instances. Shards are not instances of their job for dependencies, and an entry already
    /// there is kept.
    async fn add_noted(&self, days: &mut Days, notes: BTreeSet<DayKey>) -> Result<(), ClientError> {
        let mut by_job: BTreeMap<JobName, BTreeSet<NaiveDate>> = BTreeMap::new();
        for (job, date) in &notes {
            by_job.entry(job.clone()).or_default().insert(*date);
        }
        for (job, dates) in by_job {
            let records = self
                .instances
                .feed(&self.js, Some(job.as_str()), false)
                .await?
                .snapshot()
                .await?;
            for (key, value, _) in records {
                let record = match codec::decode::<InstanceRecord>(&value) {
                    Ok(record) => record,
                    Err(e) => {
                        tracing::debug!(%key, error = %e, "undecodable record not counted");
                        continue;
                    }
                };
                let date = crate::time::parse_biz_date(&record.biz_date);
                let Some(date) = date.filter(|d| record.job == job && dates.contains(d)) else {
                    continue;
                };
                if record.shard.is_some() {
                    continue;
                }
                days.entry((job.clone(), date))
                    .or_default()
                    .instances
                    .entry(record.instance_id)
                    .or_insert((record.attempt, record.state));
            }
        }
        Ok(())
    }

    /// The instances of `job` for `date` (a legacy day value too).
    pub async fn deps_of_day(
        &self,
        job: &JobName,
        date: NaiveDate,
    ) -> Result<DateInstances, ClientError> {
        let key = (job.clone(), date);
        let entries = self
            .deps_entries_of_days(std::slice::from_ref(&key))
            .await?;
        Ok(self
            .days_of(entries)
            .await?
            .remove(&key)
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn date() -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 11, 29).unwrap()
    }

    fn job(name: &str) -> JobName {
        JobName::parse(name).unwrap()
    }

    fn id(text: &str) -> InstanceId {
        InstanceId::parse(text).unwrap()
    }

    #[test]
    fn a_key_of_a_job_outside_default_names_the_whole_job() {
        for (name, instance) in [
            ("payments.settle", "payments.settle.20261129T000000000Z.s3"),
            ("a.a", "a.a.key-a.a"),
            ("payments", "payments.key-settle.payments"),
            ("stat", "stat.20261129T000000000Z"),
        ] {
            let key = entry_key(&job(name), date(), &id(instance));
            assert_eq!(
                parse_key(&key),
                Some(StoredKey::Entry((job(name), date()), id(instance))),
                "{key}"
            );
        }
    }

    #[test]
    fn keys_round_trip_with_shard_ids_and_recognise_legacy_days() {
        let key = entry_key(&job("stat"), date(), &id("stat.20261129T000000000Z.s3"));
        assert_eq!(key, "20261129.stat.stat.20261129T000000000Z.s3");
        assert_eq!(
            parse_key(&key),
            Some(StoredKey::Entry(
                (job("stat"), date()),
                id("stat.20261129T000000000Z.s3")
            ))
        );
        assert_eq!(
            parse_key("20261129.stat"),
            Some(StoredKey::LegacyDay((job("stat"), date())))
        );
        assert_eq!(parse_key("2026-11-29.stat"), None);
        assert_eq!(parse_key("20261129..x"), None);
        assert_eq!(parse_key("20261129.stat."), None);
    }

    #[test]
    fn a_note_is_an_empty_day_and_a_bad_or_full_day_is_not_one() {
        let at = crate::time::now();
        let full = codec::encode(&DateInstances {
            instances: [(id("stat.a"), (1, State::Success))].into(),
            ..Default::default()
        })
        .unwrap();
        let stored = vec![
            ("20261129.stat".to_string(), note_value(at).unwrap(), 1),
            ("20261129.load".to_string(), full, 2),
            (
                "20261129.bad".to_string(),
                bytes::Bytes::from_static(b"\xc1"),
                3,
            ),
            (
                entry_key(&job("stat"), date(), &id("stat.b")),
                encode_entry(1, State::Running).unwrap(),
                4,
            ),
        ];
        assert_eq!(noted(&stored), [(job("stat"), date())].into());
        // Folded, the note is a day of no instances that says when it was noted; the day of an
        // earlier version keeps its instances; the undecodable value is skipped.
        let days = fold(stored);
        assert_eq!(days[&(job("stat"), date())].noted_at, Some(at));
        assert_eq!(days[&(job("load"), date())].instances.len(), 1);
        assert!(!days.contains_key(&(job("bad"), date())));
    }

    #[test]
    fn entries_win_over_a_legacy_day_and_bad_values_are_skipped() {
        let legacy = DateInstances {
            instances: [
                (id("stat.a"), (1, State::Running)),
                (id("stat.b"), (1, State::Success)),
            ]
            .into(),
            ..Default::default()
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
        let day = &days[&(job("stat"), date())].instances;
        assert_eq!(day.len(), 2);
        assert_eq!(day["stat.a"], (2, State::Failed));
        assert_eq!(day["stat.b"], (1, State::Success));
    }
}
