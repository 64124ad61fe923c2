//! Attempt logs: what a process-based attempt writes to stdout and stderr, shipped by its
//! worker while it runs (at least every second) as numbered chunks on `<prefix>.log.<instance
//! id>.<attempt>` in the `<AX>_LOGS` stream, and read back by the CLI, the console and the
//! clients — live, or after the attempt.
//!
//! An attempt's log is kept whole up to a cap (the worker's `[worker] log_max_bytes`, 8 MiB by
//! default): past the first part of it, only the last [`LogEnd::tail`] bytes are kept and
//! shipped at the end after a note that says how much was left out. The last chunk carries
//! [`LogEnd`]; an attempt that wrote nothing has no log at all. A chunk may be delivered twice
//! (shipped again after a lost acknowledgement, beyond the stream's duplicate window): readers
//! keep one per sequence number ([`AttemptLog::add`]).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Which output a piece of log comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogStream {
    /// The process's standard output.
    Stdout,
    /// Its standard error.
    Stderr,
    /// A line from ax itself (how much of a long log was left out).
    Note,
}

impl LogStream {
    /// `stdout`, `stderr` or `note`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stdout => "stdout",
            Self::Stderr => "stderr",
            Self::Note => "note",
        }
    }
}

/// One piece of an attempt's output, in the order it was read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogPiece {
    /// Where it comes from.
    pub stream: LogStream,
    /// The bytes (not necessarily whole lines, nor whole UTF-8 characters); MessagePack `bin`
    /// on the wire.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// What the last chunk of a log says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEnd {
    /// Every byte the attempt wrote.
    pub bytes: u64,
    /// Of those, how many were left out (past the cap).
    pub left_out: u64,
    /// How many bytes of the end of the output were kept after a cut.
    pub tail: u64,
}

/// One message of an attempt's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogChunk {
    /// 1, 2, … in shipping order.
    pub seq: u64,
    /// When it was shipped.
    #[serde(with = "crate::time::wire")]
    pub at: DateTime<Utc>,
    /// Its pieces, in order.
    pub pieces: Vec<LogPiece>,
    /// Set on the last chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<LogEnd>,
}

/// An attempt's log as read so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttemptLog {
    /// The chunks, in sequence order, each once.
    pub chunks: Vec<LogChunk>,
}

impl AttemptLog {
    /// Adds a chunk read from the stream: false (and nothing added) for one already held.
    pub fn add(&mut self, chunk: LogChunk) -> bool {
        if self.chunks.iter().any(|c| c.seq == chunk.seq) {
            return false;
        }
        let at = self.chunks.partition_point(|c| c.seq < chunk.seq);
        self.chunks.insert(at, chunk);
        true
    }

    /// The end, once the last chunk is here.
    pub fn end(&self) -> Option<LogEnd> {
        self.chunks.iter().find_map(|c| c.end)
    }

    /// Every piece in order.
    pub fn pieces(&self) -> impl Iterator<Item = &LogPiece> {
        self.chunks.iter().flat_map(|c| c.pieces.iter())
    }

    /// The bytes of one output (`stream`), concatenated.
    pub fn bytes_of(&self, stream: LogStream) -> Vec<u8> {
        self.pieces()
            .filter(|p| p.stream == stream)
            .flat_map(|p| p.data.iter().copied())
            .collect()
    }

    /// Whether nothing was read.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(seq: u64, data: &str) -> LogChunk {
        LogChunk {
            seq,
            at: crate::time::now(),
            pieces: vec![LogPiece {
                stream: LogStream::Stdout,
                data: data.as_bytes().to_vec(),
            }],
            end: None,
        }
    }

    #[test]
    fn a_chunk_delivered_twice_or_late_is_kept_once_in_its_place() {
        let mut log = AttemptLog::default();
        assert!(log.add(chunk(1, "a\n")));
        assert!(log.add(chunk(3, "c\n")));
        assert!(!log.add(chunk(1, "a\n")));
        assert!(log.add(chunk(2, "b\n")));
        assert_eq!(log.bytes_of(LogStream::Stdout), b"a\nb\nc\n");
        assert_eq!(log.end(), None);
        let mut last = chunk(4, "");
        last.end = Some(LogEnd {
            bytes: 6,
            ..LogEnd::default()
        });
        log.add(last);
        assert_eq!(log.end().map(|e| e.bytes), Some(6));
    }

    #[test]
    fn a_chunk_round_trips_through_the_codec() {
        let mut c = chunk(7, "héllo\n");
        c.pieces.push(LogPiece {
            stream: LogStream::Stderr,
            data: vec![0xff, 0x00, b'\n'],
        });
        let bytes = crate::codec::encode(&c).unwrap();
        assert_eq!(crate::codec::decode::<LogChunk>(&bytes).unwrap(), c);
    }
}
