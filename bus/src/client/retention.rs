//! How finished instance records leave the instances bucket once their retention has passed.
//!
//! A record that is not final never expires: a trigger due in a year, an instance waiting for
//! its dependencies, a long attempt. A final one is kept for its retention, decided when the
//! instance is created ([`InstanceRecord::retention`]: its job's `retention`, else the creating
//! node's `[retention] instances`, else [`INSTANCES_MAX_AGE`]) and counted from its last write.
//!
//! Why an index and not per-message TTLs: a record is many revisions (its history), and a TTL
//! on the final write would remove that write alone, bringing an earlier, open revision back.
//! Why not the server's message schedules: each pending one is held in the server's memory, a
//! month of instances at a million a day would be thirty million of them.
//!
//! So every write that makes a record final is preceded by a note in `<AX>_EXPIRY`, on
//! `ax.internal.expiry.<seconds kept>` (`AxClient::note_final`); the notes asked for while an
//! earlier one is on its way share a message, one id a line
//! ([`crate::client::expiry_notes`]). Within one subject the messages come in the order of
//! their records' ends, which is the order they fall due: the janitor reads each subject from
//! its head and removes each record whose time has come ([`AxClient::remove_expired`]),
//! waiting for the head otherwise. What it costs: an id's 27 bytes and a share of a message's
//! overhead of store per finished instance for its retention, and nothing in anyone's memory.
//!
//! The removal is a purge of the key (its revisions go with it) under compare-and-swap on the
//! revision read: a record written meanwhile (re-run, say) is left alone, and its own final
//! write is in the index again. The purge's marker tells every view of the bucket (the
//! console's index, the consistency sweep) to drop the row, and expires itself after
//! [`marker_ttl`] (an hour, or the retention if shorter).

use std::time::Duration;

use async_nats::jetstream::message::PublishMessage;
use chrono::{DateTime, Utc};

use crate::client::expiry_notes::MOST_PER_MESSAGE;
use crate::client::provision::{INSTANCES_MAX_AGE, REMOVAL_MARKER_TTL};
use crate::client::record_writes::wrong_last_sequence;
use crate::client::{AxClient, ClientError};
use crate::error::{During, NatsError};
use crate::ids::InstanceId;
use crate::instance::InstanceRecord;

/// A record whose last write is later than its index message by more than this was written
/// again after it (a re-run that ended again, with an index message of its own): the older
/// message is dropped rather than waited for.
pub const REWRITTEN_AFTER: Duration = Duration::from_secs(60);

/// What became of one index message.
#[derive(Debug, PartialEq, Eq)]
pub enum Expiry {
    /// The record was removed.
    Removed,
    /// Nothing to remove: the record is gone, open again, or was written again after the
    /// message (its later final write has its own).
    Nothing,
    /// The record is kept until then.
    KeptUntil(DateTime<Utc>),
}

/// What to say of an instance id without a record: it never existed, or it was removed.
pub fn missing(id: impl std::fmt::Display) -> String {
    format!(
        "no instance `{id}`: none was made under that id, or it ended longer ago than its \
         retention (its job's `retention`, else `[retention] instances`, {} days unless set) \
         and its record was removed",
        INSTANCES_MAX_AGE.as_secs() / 86_400
    )
}

/// How long the marker of a record removed after `kept` stays: [`REMOVAL_MARKER_TTL`], or as
/// long as the record was kept if that is shorter (not under [`MIN_MARKER_TTL`]), so that a
/// short retention leaves no hour of markers behind.
pub fn marker_ttl(kept: Duration) -> Duration {
    kept.clamp(MIN_MARKER_TTL, REMOVAL_MARKER_TTL)
}

/// The shortest a removal marker stays.
pub const MIN_MARKER_TTL: Duration = Duration::from_secs(10);

/// The seconds an instance's record is kept once final.
pub fn kept_secs(record: &InstanceRecord) -> u64 {
    record
        .retention
        .unwrap_or(INSTANCES_MAX_AGE.as_secs())
        .max(1)
}

/// The seconds of an index subject (`ax.internal.expiry.<seconds>`), if it is one.
pub fn subject_secs(subject: &str) -> Option<u64> {
    subject.rsplit('.').next()?.parse().ok().filter(|s| *s > 0)
}

/// The subject part of the mark that the records of a deployment older than retention were
/// noted once (see [`AxClient::note_unnoted`]).
pub const BACKFILLED: &str = "backfilled";

impl AxClient {
    /// Notes every final record once, for a deployment whose records ended before their ends
    /// were noted (an earlier version's): each is noted as ending now, so it goes a retention
    /// from now — later than its own end would say, never earlier. A mark in `<AX>_EXPIRY`
    /// (`ax.internal.expiry.backfilled`) says it was done; true when this call did it. A record
    /// noted already is noted twice, which removes it once. Records written without their state
    /// in a header (older still) are not looked at.
    pub async fn note_unnoted(&self) -> Result<Option<u64>, ClientError> {
        use futures::StreamExt;
        let mark = self.subjects().expiry_mark(BACKFILLED);
        let stream = self
            .js
            .get_stream(self.layout.expiry_stream())
            .await
            .during(|| "open the expiry stream")?;
        match stream.direct_get_last_for_subject(&mark).await {
            Ok(_) => return Ok(None),
            Err(e) if e.kind() == async_nats::jetstream::stream::DirectGetErrorKind::NotFound => {}
            Err(e) => return Err(NatsError::new("read the backfill mark", e).into()),
        }
        let default = self
            .layout
            .retention
            .instances
            .unwrap_or(INSTANCES_MAX_AGE)
            .as_secs()
            .max(1);
        let subject = self.subjects().expiry(default);
        let mut feed = self
            .instances
            .feed(&self.js, None, true)
            .await?
            .into_stream();
        let mut pending = Vec::new();
        let mut noted = 0u64;
        let mut ids: Vec<String> = Vec::new();
        while let Some(item) = feed.next().await {
            let (key, headers) = match item? {
                crate::client::kv_view::FeedItem::Put { key, headers, .. } => (key, headers),
                crate::client::kv_view::FeedItem::Deleted { .. } => continue,
                crate::client::kv_view::FeedItem::Current => break,
            };
            let final_state = crate::client::record_writes::state_of(headers.as_ref())
                .is_some_and(crate::instance::State::is_final);
            if !final_state {
                continue;
            }
            ids.push(key);
            noted += 1;
            if ids.len() >= MOST_PER_MESSAGE {
                let payload = std::mem::take(&mut ids).join("\n");
                pending.push(
                    self.js
                        .send_publish(
                            subject.clone(),
                            PublishMessage::build().payload(payload.into()),
                        )
                        .await
                        .during(|| "note an earlier record's end")?,
                );
            }
            if pending.len() >= 64 {
                for ack in pending.drain(..) {
                    ack.await.during(|| "note an earlier record's end")?;
                }
            }
        }
        if !ids.is_empty() {
            pending.push(
                self.js
                    .send_publish(
                        subject,
                        PublishMessage::build().payload(ids.join("\n").into()),
                    )
                    .await
                    .during(|| "note an earlier record's end")?,
            );
        }
        for ack in pending {
            ack.await.during(|| "note an earlier record's end")?;
        }
        self.js
            .publish(mark, noted.to_string().into())
            .await
            .during(|| "mark the backfill")?
            .await
            .during(|| "mark the backfill")?;
        Ok(Some(noted))
    }

    /// The retention a record created by this node gets: its job's, else this node's
    /// `[retention] instances` (else none: [`INSTANCES_MAX_AGE`] when it ends).
    pub fn stamp_retention(&self, record: &mut InstanceRecord) {
        if record.retention.is_none() {
            record.retention = self.layout.retention.instances.map(|d| d.as_secs().max(1));
        }
    }

    /// Notes in `<AX>_EXPIRY` that `record` is about to be written final: awaited before the
    /// write, so that no final record goes unnoted (a note whose write then fails finds the
    /// record open and is dropped). Notes asked for together share a message
    /// ([`crate::client::expiry_notes`]).
    pub(crate) async fn note_final(
        &self,
        id: &InstanceId,
        record: &InstanceRecord,
    ) -> Result<(), ClientError> {
        let subject = self.subjects().expiry(kept_secs(record));
        self.expiry_notes.note(&self.js, subject, id).await
    }

    /// Removes instance `id`'s record if it is final and its last write is older than
    /// `kept`, given that its index message was stored at `noted`.
    pub async fn remove_expired(
        &self,
        id: &InstanceId,
        kept: Duration,
        noted: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Expiry, ClientError> {
        let entry = self
            .instances
            .entry(id)
            .await
            .during(|| format!("read instance {id}"))?;
        let Some(entry) =
            entry.filter(|e| e.operation == async_nats::jetstream::kv::Operation::Put)
        else {
            return Ok(Expiry::Nothing);
        };
        let record: InstanceRecord = crate::codec::decode(&entry.value)?;
        if !record.state.is_final() {
            return Ok(Expiry::Nothing);
        }
        let written = crate::time::from_server(entry.created);
        let rewritten = chrono::Duration::from_std(REWRITTEN_AFTER).unwrap_or_default();
        if written - noted > rewritten {
            return Ok(Expiry::Nothing);
        }
        let due = written + chrono::Duration::from_std(kept).unwrap_or(chrono::Duration::MAX);
        if due > now {
            return Ok(Expiry::KeptUntil(due));
        }
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("KV-Operation", "PURGE");
        headers.insert("Nats-Rollup", "sub");
        headers.insert(
            "Nats-TTL",
            format!("{}s", marker_ttl(kept).as_secs()).as_str(),
        );
        let purge = PublishMessage::build()
            .headers(headers)
            .expected_last_subject_sequence(entry.revision);
        let subject = self.instances.subject_of(id);
        let answer = self
            .js
            .send_publish(subject, purge)
            .await
            .during(|| format!("remove instance {id}"))?
            .await;
        match answer {
            Ok(_) => Ok(Expiry::Removed),
            // Written meanwhile: that write decides (its own note if it is final).
            Err(e) if wrong_last_sequence(&e) => Ok(Expiry::Nothing),
            Err(e) => Err(NatsError::new(format!("remove instance {id}"), e).into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_subject_names_its_seconds() {
        assert_eq!(subject_secs("ax.internal.expiry.20"), Some(20));
        assert_eq!(subject_secs("ax.internal.expiry.0"), None);
        assert_eq!(subject_secs("ax.internal.expiry.x"), None);
    }

    #[test]
    fn a_removal_marker_lives_an_hour_or_the_retention_if_shorter() {
        let secs = |s| Duration::from_secs(s);
        assert_eq!(marker_ttl(secs(30 * 86_400)), secs(3600));
        assert_eq!(marker_ttl(secs(120)), secs(120));
        assert_eq!(marker_ttl(secs(3)), secs(10));
    }

    #[test]
    fn a_record_of_an_earlier_version_is_kept_the_default() {
        let mut record = crate::instance::tests::record();
        record.retention = None;
        assert_eq!(kept_secs(&record), INSTANCES_MAX_AGE.as_secs());
        record.retention = Some(90);
        assert_eq!(kept_secs(&record), 90);
    }
}
