//! The day's summary (`ax status`, the console's dashboard): what the leading coordinator adds
//! up from the results it consumes anyway, one [`DaySummary`] per date in the summary's time
//! zone, in the bucket `ax_summary`.
//!
//! Incremental and exact: a batch of results is added to the day's entry — skipping the
//! sequences that entry already holds — and written with a compare-and-swap before the batch
//! is acknowledged. A coordinator that dies in between sees the batch again and adds nothing
//! twice; one that took the lead meanwhile finds the entry moved on and reads it again. One
//! write per batch and day, not per instance.

use std::collections::BTreeMap;

use async_nats::jetstream::{self, kv};
use chrono_tz::Tz;

use ax_bus::error::{During, NatsError};
use ax_bus::figures::DaySummary;
use ax_bus::messages::ResultMessage;
use ax_bus::{codec, AxClient};

use crate::ActorError;

/// How often a contended write is tried again before the batch is left for redelivery.
const ATTEMPTS: usize = 8;

/// Adds a batch of result messages to their days' summaries (by the day each ended, in `tz`).
pub(crate) async fn add(
    client: &AxClient,
    tz: Tz,
    messages: &[jetstream::Message],
) -> Result<(), ActorError> {
    let mut days: BTreeMap<String, Vec<(u64, ResultMessage)>> = BTreeMap::new();
    for message in messages {
        let (Ok(info), Ok(result)) = (
            message.info(),
            codec::decode::<ResultMessage>(&message.payload),
        ) else {
            continue;
        };
        let date = ax_bus::time::biz_date_in(tz, result.finished_at);
        days.entry(date)
            .or_default()
            .push((info.stream_sequence, result));
    }
    for (date, results) in days {
        add_to_day(client, tz, &date, &results).await?;
    }
    Ok(())
}

async fn add_to_day(
    client: &AxClient,
    tz: Tz,
    date: &str,
    results: &[(u64, ResultMessage)],
) -> Result<(), ActorError> {
    let what = || format!("the summary of {date}");
    for _ in 0..ATTEMPTS {
        let entry = client.summary.entry(date).await.during(what)?;
        let (mut summary, revision) = match entry {
            Some(entry) if entry.operation == kv::Operation::Put => (
                codec::decode::<DaySummary>(&entry.value)?,
                Some(entry.revision),
            ),
            _ => (
                DaySummary {
                    date: date.to_string(),
                    timezone: tz.name().to_string(),
                    ..DaySummary::default()
                },
                None,
            ),
        };
        let before = summary.applied_to;
        for (sequence, result) in results {
            summary.add(*sequence, result);
        }
        if summary.applied_to == before {
            return Ok(());
        }
        let value = codec::encode(&summary)?;
        // Written meanwhile (another coordinator briefly leading): read it again.
        match revision {
            Some(revision) => match client.summary.update(date, value, revision).await {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {}
                Err(e) => return Err(NatsError::new(what(), e).into()),
            },
            None => match client.summary.create(date, value).await {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {}
                Err(e) => return Err(NatsError::new(what(), e).into()),
            },
        }
    }
    Err(NatsError::new(
        what(),
        ax_bus::error::Reason(format!("still contended after {ATTEMPTS} attempts")),
    )
    .into())
}
