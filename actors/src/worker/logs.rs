//! Shipping an attempt's output while it runs (see [`ax_bus::log`]).
//!
//! The pipes' readers hand every read to the attempt's [`LogSink`], which only appends to a
//! buffer under a short lock: a command never waits for NATS, however slow or absent. A
//! shipper task per attempt takes what was buffered at least every second (sooner when
//! [`EAGER_BYTES`] wait) and publishes it as numbered chunks, each acknowledged before the
//! next; a chunk that fails (NATS away) is kept and sent again every second until NATS is
//! back, under the same message id — the worker's memory is the spool, bounded by the cap.
//! Past the first part of the cap the output is no longer shipped as it comes: the last
//! [`tail_of`] bytes are kept in a ring and shipped at the end after a note of what was left
//! out. The shipper ends with the chunk that carries the end; a log with nothing written is
//! never published.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use ax_bus::ids::{InstanceId, TraceId};
use ax_bus::log::{LogChunk, LogEnd, LogPiece, LogStream};
use ax_bus::AxClient;

use crate::jetstream::publish;

/// How often what was written is shipped, at least.
const SHIP_EVERY: Duration = Duration::from_secs(1);
/// Buffered bytes that make the shipper go at once.
const EAGER_BYTES: usize = 64 * 1024;
/// The most bytes of output in one chunk (the server's default max payload is 1 MiB).
const CHUNK_BYTES: usize = 256 * 1024;
/// How long a failed publish waits before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The default cap of an attempt's log (`[worker] log_max_bytes`).
pub const DEFAULT_LOG_MAX_BYTES: usize = 8 * 1024 * 1024;

/// How many bytes of the end of a log are kept after a cut: a quarter of the cap.
pub(crate) fn tail_of(cap: usize) -> usize {
    cap / 4
}

/// What the readers wrote and the shipper has not taken yet.
#[derive(Debug, Default)]
struct Buffer {
    /// To ship as it comes.
    pending: Vec<LogPiece>,
    pending_bytes: usize,
    /// Bytes that may still be shipped as they come.
    head_left: usize,
    /// Past the head: the last bytes, shipped at the end — pieces of at most [`RING_PIECE`]
    /// bytes, the first of them starting `skip` bytes in (cut from the front without moving
    /// what stays).
    tail: VecDeque<LogPiece>,
    skip: usize,
    tail_bytes: usize,
    tail_cap: usize,
    /// Bytes written in all, and left out of the ring.
    total: u64,
    left_out: u64,
    finished: bool,
}

impl Buffer {
    fn new(cap: usize) -> Self {
        let tail_cap = tail_of(cap);
        Self {
            head_left: cap - tail_cap,
            tail_cap,
            ..Self::default()
        }
    }

    fn write(&mut self, stream: LogStream, mut data: &[u8]) {
        self.total += data.len() as u64;
        if self.head_left > 0 {
            let now = data.len().min(self.head_left);
            push(&mut self.pending, stream, &data[..now]);
            self.pending_bytes += now;
            self.head_left -= now;
            data = &data[now..];
        }
        if data.is_empty() {
            return;
        }
        push_back(&mut self.tail, stream, data);
        self.tail_bytes += data.len();
        while self.tail_bytes > self.tail_cap {
            let over = self.tail_bytes - self.tail_cap;
            let Some(front) = self.tail.front() else {
                break;
            };
            let left = front.data.len() - self.skip;
            let cut = over.min(left);
            if cut == left {
                self.tail.pop_front();
                self.skip = 0;
            } else {
                self.skip += cut;
            }
            self.tail_bytes -= cut;
            self.left_out += cut as u64;
        }
    }

    /// What to ship now; at the end, the ring (after a note if bytes were left out) and the
    /// end itself.
    fn take(&mut self) -> (Vec<LogPiece>, Option<LogEnd>) {
        let mut pieces = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        if !self.finished {
            return (pieces, None);
        }
        if self.left_out > 0 {
            let note = format!(
                "\n[ax: {} bytes left out here: the log is capped; its last {} bytes follow]\n",
                self.left_out, self.tail_bytes
            );
            pieces.push(LogPiece {
                stream: LogStream::Note,
                data: note.into_bytes(),
            });
        }
        let tail = self.tail_bytes as u64;
        let skip = std::mem::take(&mut self.skip);
        for (i, mut piece) in std::mem::take(&mut self.tail).into_iter().enumerate() {
            if i == 0 {
                piece.data.drain(..skip);
            }
            push(&mut pieces, piece.stream, &piece.data);
        }
        self.tail_bytes = 0;
        let end = LogEnd {
            bytes: self.total,
            left_out: self.left_out,
            tail: if self.left_out > 0 { tail } else { 0 },
        };
        (pieces, Some(end))
    }
}

/// Appends to the last piece when it is of the same stream.
fn push(pieces: &mut Vec<LogPiece>, stream: LogStream, data: &[u8]) {
    match pieces.last_mut() {
        Some(last) if last.stream == stream => last.data.extend_from_slice(data),
        _ => pieces.push(LogPiece {
            stream,
            data: data.to_vec(),
        }),
    }
}

/// Appends to the ring: to its last piece while that is of the same stream and under
/// [`RING_PIECE`] bytes.
fn push_back(pieces: &mut VecDeque<LogPiece>, stream: LogStream, data: &[u8]) {
    match pieces.back_mut() {
        Some(last) if last.stream == stream && last.data.len() < RING_PIECE => {
            last.data.extend_from_slice(data)
        }
        _ => pieces.push_back(LogPiece {
            stream,
            data: data.to_vec(),
        }),
    }
}

/// The size past which the ring starts a new piece: what its front is cut by, at most.
const RING_PIECE: usize = 64 * 1024;

/// Where an attempt's pipes write: never blocks beyond a short lock.
#[derive(Debug)]
pub struct LogSink {
    buffer: Mutex<Buffer>,
    wake: Notify,
}

impl LogSink {
    fn lock(&self) -> MutexGuard<'_, Buffer> {
        self.buffer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Bytes read from `stream`.
    pub(crate) fn write(&self, stream: LogStream, data: &[u8]) {
        let eager = {
            let mut buffer = self.lock();
            buffer.write(stream, data);
            buffer.pending_bytes >= EAGER_BYTES
        };
        if eager {
            self.wake.notify_one();
        }
    }

    /// The attempt is over: what is left is shipped with the end.
    pub(crate) fn finish(&self) {
        self.lock().finished = true;
        self.wake.notify_one();
    }
}

/// Starts the log of attempt `attempt` (`trace`) of `instance`, capped at `cap` bytes: the sink
/// to write to, and its shipper running until the log has ended and is shipped.
pub(crate) fn start(
    client: &AxClient,
    instance: &InstanceId,
    attempt: u32,
    trace: &TraceId,
    cap: usize,
) -> Arc<LogSink> {
    let sink = Arc::new(LogSink {
        buffer: Mutex::new(Buffer::new(cap)),
        wake: Notify::new(),
    });
    let shipper = Shipper {
        client: client.clone(),
        subject: client.subjects().log(instance.as_str(), attempt),
        trace: trace.clone(),
        seq: 0,
        sink: sink.clone(),
    };
    tokio::spawn(shipper.run());
    sink
}

/// `pieces` cut into chunks of at most [`CHUNK_BYTES`], numbered on from `seq`, the last one
/// carrying `end`; none for nothing, and none at all for a log that was never written to.
fn chunks(seq: &mut u64, pieces: Vec<LogPiece>, end: Option<LogEnd>) -> Vec<LogChunk> {
    let mut chunks: Vec<LogChunk> = Vec::new();
    let mut current: Vec<LogPiece> = Vec::new();
    let mut size = 0;
    let mut cut = |pieces: Vec<LogPiece>, end: Option<LogEnd>| {
        *seq += 1;
        LogChunk {
            seq: *seq,
            at: ax_bus::time::now(),
            pieces,
            end,
        }
    };
    for piece in pieces {
        let mut data = piece.data.as_slice();
        while !data.is_empty() {
            let now = data.len().min(CHUNK_BYTES - size);
            current.push(LogPiece {
                stream: piece.stream,
                data: data[..now].to_vec(),
            });
            size += now;
            data = &data[now..];
            if size == CHUNK_BYTES {
                chunks.push(cut(std::mem::take(&mut current), None));
                size = 0;
            }
        }
    }
    match (end, chunks.last_mut()) {
        (Some(end), Some(last)) if current.is_empty() => last.end = Some(end),
        // Something was written at some time: the end is said.
        (Some(end), _) if end.bytes > 0 => chunks.push(cut(current, Some(end))),
        _ if !current.is_empty() => chunks.push(cut(current, end)),
        _ => {}
    }
    chunks
}

/// Ships one attempt's log.
struct Shipper {
    client: AxClient,
    subject: String,
    trace: TraceId,
    seq: u64,
    sink: Arc<LogSink>,
}

impl Shipper {
    async fn run(mut self) {
        loop {
            let _ = tokio::time::timeout(SHIP_EVERY, self.sink.wake.notified()).await;
            let (pieces, end) = self.sink.lock().take();
            let ended = end.is_some();
            for chunk in chunks(&mut self.seq, pieces, end) {
                self.ship(&chunk).await;
            }
            if ended {
                return;
            }
        }
    }

    /// Publishes `chunk`, again every second until it is acknowledged.
    async fn ship(&self, chunk: &LogChunk) {
        let id = format!("log.{}.{}", self.trace, chunk.seq);
        let mut failures = 0u32;
        loop {
            match publish::to_stream_acked(&self.client, self.subject.clone(), &id, chunk).await {
                Ok(()) => {
                    if failures > 0 {
                        tracing::info!(subject = %self.subject, seq = chunk.seq, failures, "log chunk shipped after all");
                    }
                    return;
                }
                Err(e) => {
                    if failures == 0 {
                        tracing::warn!(subject = %self.subject, seq = chunk.seq, error = %e, "log chunk not shipped; kept and sent again every second");
                    }
                    failures += 1;
                    tokio::time::sleep(RETRY_AFTER).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(pieces: &[LogPiece]) -> String {
        pieces
            .iter()
            .map(|p| String::from_utf8_lossy(&p.data).into_owned())
            .collect()
    }

    #[test]
    fn output_within_the_cap_is_shipped_whole_and_in_order() {
        let mut buffer = Buffer::new(1000);
        buffer.write(LogStream::Stdout, b"one\n");
        buffer.write(LogStream::Stdout, b"two\n");
        buffer.write(LogStream::Stderr, b"oops\n");
        let (pieces, end) = buffer.take();
        assert_eq!(end, None);
        assert_eq!(pieces.len(), 2, "same-stream writes merged");
        assert_eq!(text(&pieces), "one\ntwo\noops\n");
        buffer.write(LogStream::Stdout, b"three\n");
        buffer.finished = true;
        let (pieces, end) = buffer.take();
        assert_eq!(text(&pieces), "three\n");
        assert_eq!(
            end,
            Some(LogEnd {
                bytes: 19,
                left_out: 0,
                tail: 0
            })
        );
    }

    #[test]
    fn past_the_cap_the_head_and_the_last_bytes_are_kept_with_a_note() {
        // Cap 400: 300 bytes shipped as they come, the last 100 kept for the end.
        let mut buffer = Buffer::new(400);
        let lines: Vec<String> = (0..100).map(|i| format!("line {i:04}\n")).collect();
        for line in &lines {
            buffer.write(LogStream::Stdout, line.as_bytes());
        }
        let (head, end) = buffer.take();
        assert_eq!(end, None);
        let all = lines.concat();
        assert_eq!(text(&head), all[..300]);
        buffer.finished = true;
        let (rest, end) = buffer.take();
        let end = end.unwrap();
        assert_eq!((end.bytes, end.left_out, end.tail), (1000, 600, 100));
        assert_eq!(rest[0].stream, LogStream::Note);
        assert!(text(&rest[..1]).contains("600 bytes left out"));
        assert_eq!(text(&rest[1..]), all[900..]);
    }

    #[test]
    fn the_kept_tail_is_exactly_the_last_bytes_across_ring_pieces() {
        // A ring of 200 KiB (several pieces) cut from the front over and over.
        let cap = 800 * 1024;
        let mut buffer = Buffer::new(cap);
        let mut all = Vec::new();
        for i in 0..400u32 {
            let stream = if i % 7 == 0 {
                LogStream::Stderr
            } else {
                LogStream::Stdout
            };
            let read: Vec<u8> = (0..8192u32).map(|j| ((i * 31 + j) % 251) as u8).collect();
            buffer.write(stream, &read);
            all.push((stream, read));
        }
        let (head, _) = buffer.take();
        buffer.finished = true;
        let (rest, end) = buffer.take();
        let end = end.unwrap();
        let bytes: Vec<u8> = all.iter().flat_map(|(_, d)| d.iter().copied()).collect();
        assert_eq!(end.bytes, bytes.len() as u64);
        assert_eq!(end.tail, tail_of(cap) as u64);
        let shipped: Vec<u8> = head.iter().flat_map(|p| p.data.iter().copied()).collect();
        assert_eq!(shipped, bytes[..cap - tail_of(cap)]);
        let kept: Vec<u8> = rest[1..]
            .iter()
            .flat_map(|p| p.data.iter().copied())
            .collect();
        assert_eq!(kept, bytes[bytes.len() - tail_of(cap)..]);
        // Each byte kept with its stream.
        let stderr_kept: usize = rest[1..]
            .iter()
            .filter(|p| p.stream == LogStream::Stderr)
            .map(|p| p.data.len())
            .sum();
        assert!(
            stderr_kept > 0 && stderr_kept.is_multiple_of(8192),
            "{stderr_kept}"
        );
    }

    #[test]
    fn chunks_are_numbered_cut_to_size_and_the_last_carries_the_end() {
        let mut seq = 0;
        let big = LogPiece {
            stream: LogStream::Stdout,
            data: vec![b'x'; CHUNK_BYTES * 2 + 10],
        };
        let shipped = chunks(&mut seq, vec![big], None);
        assert_eq!(shipped.iter().map(|c| c.seq).collect::<Vec<_>>(), [1, 2, 3]);
        assert!(shipped.iter().all(|c| c.end.is_none()));
        assert_eq!(shipped[2].pieces[0].data.len(), 10);
        let end = LogEnd {
            bytes: 5,
            ..LogEnd::default()
        };
        // Nothing left but the end: a chunk of its own.
        let last = chunks(&mut seq, Vec::new(), Some(end));
        assert_eq!((last.len(), last[0].seq, last[0].end), (1, 4, Some(end)));
        // A log never written to is never published.
        let mut none = 0;
        assert!(chunks(&mut none, Vec::new(), Some(LogEnd::default())).is_empty());
        assert!(chunks(&mut none, Vec::new(), None).is_empty());
    }
}
