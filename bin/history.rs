//! `ax history export`: finished instances as JSON Lines, for a warehouse or an auditor to keep
//! what retention removes.
//!
//! The records are read one at a time from a feed over the instances bucket (never all held:
//! a deployment keeps millions), each with its history (every step of every attempt), and
//! written as they come; progress goes to stderr.

use std::io::Write;

use anyhow::{bail, Context, Result};
use chrono::{DateTime, NaiveDate, Utc};
use futures::StreamExt;

use ax_bus::client::kv_view::FeedItem;
use ax_bus::ids::JobName;
use ax_bus::{codec, AxClient, InstanceRecord};

/// How often progress is told.
const PROGRESS_EVERY: u64 = 10_000;

/// The span of end times exported: `[from, to)`.
pub(crate) struct Span {
    from: DateTime<Utc>,
    to: DateTime<Utc>,
}

impl Span {
    /// `--from` and `--to`, each a date (`YYYY-MM-DD`, whole days in UTC, `--to` included) or
    /// an instant (RFC 3339).
    pub(crate) fn parse(from: &str, to: &str) -> Result<Self> {
        let from = bound(from, false).with_context(|| format!("--from {from:?}"))?;
        let to = bound(to, true).with_context(|| format!("--to {to:?}"))?;
        if to <= from {
            bail!("--to must be after --from");
        }
        Ok(Self { from, to })
    }

    fn holds(&self, at: DateTime<Utc>) -> bool {
        self.from <= at && at < self.to
    }
}

/// A date's start (or, for `--to`, the next day's), or an instant.
fn bound(text: &str, end: bool) -> Result<DateTime<Utc>> {
    if let Ok(date) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        let day = if end {
            date.succ_opt().unwrap_or(date)
        } else {
            date
        };
        return Ok(day.and_time(chrono::NaiveTime::MIN).and_utc());
    }
    ax_bus::time::parse_instant(text)
        .map_err(|e| anyhow::anyhow!("{e} (a date YYYY-MM-DD or an RFC 3339 instant)"))
}

/// One exported line.
#[derive(serde::Serialize)]
struct Line<'a> {
    record: &'a InstanceRecord,
    history: Vec<ax_bus::history::Step>,
}

/// Writes every final instance (of `job`, or all) that ended within `span`.
pub(crate) async fn export(client: &AxClient, span: &Span, job: Option<&JobName>) -> Result<()> {
    let mut feed = client.instances_feed(job).await?.into_stream();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let (mut scanned, mut exported) = (0u64, 0u64);
    while let Some(item) = feed.next().await {
        let (key, value) = match item? {
            FeedItem::Put { key, value, .. } => (key, value),
            FeedItem::Deleted { .. } => continue,
            FeedItem::Current => break,
        };
        scanned += 1;
        if scanned % PROGRESS_EVERY == 0 {
            eprintln!("{scanned} records read, {exported} exported");
        }
        let record: InstanceRecord = match codec::decode(&value) {
            Ok(record) => record,
            Err(e) => {
                eprintln!("instance {key}: not exported, its record does not decode: {e}");
                continue;
            }
        };
        let ended = record.finished_at.filter(|_| record.state.is_final());
        if !ended.is_some_and(|at| span.holds(at)) {
            continue;
        }
        let history = client
            .instance_history(&record.instance_id)
            .await?
            .map(|h| h.steps)
            .unwrap_or_default();
        serde_json::to_writer(
            &mut out,
            &Line {
                record: &record,
                history,
            },
        )?;
        out.write_all(b"\n")?;
        exported += 1;
    }
    out.flush()?;
    eprintln!("{exported} instances exported ({scanned} records read)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_whole_days_and_the_end_is_included() {
        let span = Span::parse("2026-12-01", "2026-12-02").unwrap();
        let at = |t: &str| ax_bus::time::parse_instant(t).unwrap();
        assert!(!span.holds(at("2026-11-30T23:59:59.999Z")));
        assert!(span.holds(at("2026-12-01T00:00:00.000Z")));
        assert!(span.holds(at("2026-12-02T23:59:59.999Z")));
        assert!(!span.holds(at("2026-12-03T00:00:00.000Z")));
        let instants = Span::parse("2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z").unwrap();
        assert!(!instants.holds(at("2026-12-01T11:00:00.000Z")));
        let error = Span::parse("yesterday", "2026-12-02").err().unwrap();
        assert!(
            format!("{error:#}").starts_with("--from \"yesterday\": "),
            "{error:#}"
        );
        assert!(Span::parse("2026-12-02", "2026-12-01").is_err());
    }
}
