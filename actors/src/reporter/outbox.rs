//! The worker's durable outbox: every attempt's outcome is appended and fsync'd here before
//! anything is published, so a result a worker produced survives a NATS outage, a crash of the
//! worker, or both.
//!
//! The file is a sequence of records `[len: u32 LE][crc32: u32 LE][msgpack]`. An outcome record
//! stays pending until a `done` record for its trace id follows. On open the file is read
//! through: a torn record at the end (a crash mid-write) or a corrupt one anywhere is reported
//! and skipped — the reader re-synchronises on the next record whose checksum holds — and the
//! pending outcomes are rewritten to a fresh file, so damage never blocks what follows it.
//! Appends are batched: one fsync covers every outcome of a batch.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::outcome::Outcome;
use ax_bus::ids::TraceId;

const HEADER: usize = 8;
const MAX_RECORD: usize = 16 * 1024 * 1024;
/// Rewrite the file when nothing is pending and it has grown past this.
const COMPACT_AT: u64 = 4 * 1024 * 1024;

#[derive(Serialize, Deserialize)]
enum Record {
    Outcome(Box<Outcome>),
    Done { trace_id: TraceId },
}

/// The outbox file.
#[derive(Debug)]
pub(crate) struct Outbox {
    path: PathBuf,
    file: File,
    size: u64,
    pending: BTreeMap<TraceId, (u64, Outcome)>,
    next_order: u64,
}

/// Something skipped while reading the outbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Damage {
    /// Byte offset of the bad record.
    pub offset: u64,
    /// What was wrong.
    pub reason: String,
}

fn encode(record: &Record) -> io::Result<Vec<u8>> {
    let payload = rmp_serde::to_vec_named(record).map_err(io::Error::other)?;
    let mut bytes = Vec::with_capacity(HEADER + payload.len());
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    bytes.extend_from_slice(&payload);
    Ok(bytes)
}

/// The record at `offset`, and its total length, if one is whole and intact there.
fn record_at(data: &[u8], offset: usize) -> Result<(Record, usize), String> {
    let header = data
        .get(offset..offset + HEADER)
        .ok_or("torn record header")?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if len == 0 || len > MAX_RECORD {
        return Err(format!("implausible record length {len}"));
    }
    let payload = data
        .get(offset + HEADER..offset + HEADER + len)
        .ok_or("torn record (shorter than its length)")?;
    if crc32fast::hash(payload) != crc {
        return Err("checksum mismatch".into());
    }
    let record = rmp_serde::from_slice(payload).map_err(|e| format!("undecodable: {e}"))?;
    Ok((record, HEADER + len))
}

impl Outbox {
    /// Opens (or creates) the outbox at `path`, returning what was skipped as damaged.
    pub(crate) fn open(path: &Path) -> io::Result<(Self, Vec<Damage>)> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let data = match std::fs::read(path) {
            Ok(data) => data,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut pending = BTreeMap::new();
        let mut damage = Vec::new();
        let mut order = 0u64;
        let mut offset = 0usize;
        while offset < data.len() {
            match record_at(&data, offset) {
                Ok((record, len)) => {
                    match record {
                        Record::Outcome(outcome) => {
                            pending.insert(outcome.end.trace_id.clone(), (order, *outcome));
                            order += 1;
                        }
                        Record::Done { trace_id } => {
                            pending.remove(&trace_id);
                        }
                    }
                    offset += len;
                }
                Err(reason) => {
                    damage.push(Damage {
                        offset: offset as u64,
                        reason,
                    });
                    offset = (offset + 1..data.len())
                        .find(|o| record_at(&data, *o).is_ok())
                        .unwrap_or(data.len());
                }
            }
        }
        let mut outbox = Self::rewrite(path, pending, order)?;
        outbox.next_order = order;
        Ok((outbox, damage))
    }

    /// Writes `pending` to a fresh file and swaps it in atomically.
    fn rewrite(
        path: &Path,
        pending: BTreeMap<TraceId, (u64, Outcome)>,
        next_order: u64,
    ) -> io::Result<Self> {
        let tmp = path.with_extension("tmp");
        let mut bytes = Vec::new();
        let mut ordered: Vec<&(u64, Outcome)> = pending.values().collect();
        ordered.sort_by_key(|(order, _)| *order);
        for (_, outcome) in ordered {
            bytes.extend(encode(&Record::Outcome(Box::new(outcome.clone())))?);
        }
        {
            let mut file = File::create(&tmp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
        let file = OpenOptions::new().append(true).open(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            size: bytes.len() as u64,
            pending,
            next_order,
        })
    }

    /// Appends outcomes and makes them durable with one fsync.
    pub(crate) fn append(&mut self, outcomes: &[Outcome]) -> io::Result<()> {
        let mut bytes = Vec::new();
        for outcome in outcomes {
            bytes.extend(encode(&Record::Outcome(Box::new(outcome.clone())))?);
        }
        self.file.write_all(&bytes)?;
        self.file.sync_data()?;
        self.size += bytes.len() as u64;
        for outcome in outcomes {
            self.pending.insert(
                outcome.end.trace_id.clone(),
                (self.next_order, outcome.clone()),
            );
            self.next_order += 1;
        }
        Ok(())
    }

    /// Records that an outcome was reported. Not fsync'd: losing it only means reporting again,
    /// which the result stream and the instance record both de-duplicate.
    pub(crate) fn mark_done(&mut self, trace_id: &TraceId) -> io::Result<()> {
        if self.pending.remove(trace_id).is_none() {
            return Ok(());
        }
        let bytes = encode(&Record::Done {
            trace_id: trace_id.clone(),
        })?;
        self.file.write_all(&bytes)?;
        self.size += bytes.len() as u64;
        if self.pending.is_empty() && self.size > COMPACT_AT {
            *self = Self::rewrite(&self.path, BTreeMap::new(), self.next_order)?;
        }
        Ok(())
    }

    /// How many outcomes are waiting.
    pub(crate) fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether an outcome for `trace_id` is waiting.
    pub(crate) fn contains(&self, trace_id: &TraceId) -> bool {
        self.pending.contains_key(trace_id)
    }

    /// Outcomes not yet reported, oldest first.
    pub(crate) fn pending(&self) -> Vec<Outcome> {
        let mut ordered: Vec<&(u64, Outcome)> = self.pending.values().collect();
        ordered.sort_by_key(|(order, _)| *order);
        ordered.into_iter().map(|(_, o)| o.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ax_bus::ids::{InstanceId, WorkerId};
    use ax_bus::instance::{AttemptEnd, Tag};
    use ax_bus::messages::WorkItem;

    /// A valid trace id named by `name`.
    fn tr(name: &str) -> TraceId {
        TraceId::first_of(&InstanceId::parse(name).unwrap())
    }

    fn outcome(name: &str) -> Outcome {
        let trace = tr(name);
        let spec: ax_bus::spec::JobDocument = serde_json::from_str(
            r#"{"version":"v1","job":{"name":"j","exec":{"type":"shell","command":"true"}}}"#,
        )
        .unwrap();
        Outcome {
            work: WorkItem {
                worker: Some(WorkerId::parse("w").unwrap()),
                ..WorkItem::first(
                    InstanceId::parse("j.20260101T000000000Z").unwrap(),
                    trace.clone(),
                    "2026-01-01",
                    spec.job,
                )
            },
            end: AttemptEnd {
                exit_code: Some(0),
                ..AttemptEnd::new(
                    trace,
                    WorkerId::parse("w").unwrap(),
                    true,
                    Tag::Completed,
                    ax_bus::time::now(),
                )
            },
            written: None,
        }
    }

    fn traces(outbox: &Outbox) -> Vec<TraceId> {
        outbox
            .pending()
            .into_iter()
            .map(|o| o.end.trace_id)
            .collect()
    }

    #[test]
    fn pending_outcomes_survive_a_reopen_until_done() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox.log");
        let (mut outbox, damage) = Outbox::open(&path).unwrap();
        assert!(damage.is_empty());
        outbox.append(&[outcome("a"), outcome("b")]).unwrap();
        outbox.append(&[outcome("c")]).unwrap();
        outbox.mark_done(&tr("b")).unwrap();
        drop(outbox);
        let (outbox, damage) = Outbox::open(&path).unwrap();
        assert!(damage.is_empty());
        assert_eq!(traces(&outbox), [tr("a"), tr("c")]);
        assert!(outbox.contains(&tr("c")) && !outbox.contains(&tr("b")));
    }

    #[test]
    fn a_torn_tail_is_skipped_with_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox.log");
        let (mut outbox, _) = Outbox::open(&path).unwrap();
        outbox.append(&[outcome("a"), outcome("b")]).unwrap();
        drop(outbox);
        let len = std::fs::metadata(&path).unwrap().len();
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(len - 10).unwrap();
        let (outbox, damage) = Outbox::open(&path).unwrap();
        assert_eq!(traces(&outbox), [tr("a")]);
        assert_eq!(damage.len(), 1);
        // The rewrite left a clean file.
        let (_, damage) = Outbox::open(&path).unwrap();
        assert!(damage.is_empty());
    }

    #[test]
    fn a_corrupt_record_in_the_middle_does_not_block_the_ones_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outbox.log");
        let (mut outbox, _) = Outbox::open(&path).unwrap();
        outbox.append(&[outcome("a")]).unwrap();
        let first_len = std::fs::metadata(&path).unwrap().len() as usize;
        outbox.append(&[outcome("b"), outcome("c")]).unwrap();
        drop(outbox);
        let mut bytes = std::fs::read(&path).unwrap();
        // Garble the length and payload of "b".
        bytes[first_len] ^= 0xff;
        bytes[first_len + 20] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let (outbox, damage) = Outbox::open(&path).unwrap();
        assert_eq!(traces(&outbox), [tr("a"), tr("c")]);
        assert_eq!(damage.len(), 1);
        assert_eq!(damage[0].offset, first_len as u64);
    }
}
