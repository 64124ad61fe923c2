//! The clock guard: every node measures how far its clock is from the NATS server's, and a node
//! whose clock is off by more than `max_clock_skew` stops doing what depends on it — its
//! Scheduler stops firing, its worker refuses dispatches (`failed`, tag `clock_skew`) — and
//! raises an alert, until the clock is back within the limit.
//!
//! The server's clock is read from JetStream: a probe message is stored on
//! `ax.internal.clock.<node>` and the server's store time is read back. That time lies between
//! the local times just before the publish and just after its ack, so the offset is known to
//! within half the round trip. The guard judges skew only when it is proven: `|offset| - rtt/2`
//! over the limit. A slow answer (queueing in the client, the network or the server) widens the
//! uncertainty; it is never mistaken for skew. Of a few probes the one with the shortest round
//! trip is kept.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::PublishAckFuture;
use chrono::{DateTime, Utc};

use ax_bus::error::During;
use ax_bus::error::NatsError;
use ax_bus::error::Reason;
use ax_bus::ids::NodeId;
use ax_bus::messages::AlertKind;
use ax_bus::AxClient;

use crate::jetstream::publish;
use crate::runtime::clock::Clock;
use crate::ActorError;

/// The limit when the config sets none.
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_secs(5);
/// How often the offset is measured.
pub(crate) const MEASURE_EVERY: Duration = Duration::from_secs(5);
/// Probes per measurement; the one with the shortest round trip counts.
const PROBES: usize = 3;

/// The local clock minus the server's, within ± `uncertainty_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offset {
    /// Local minus server, in milliseconds (positive: the local clock is ahead).
    pub millis: i64,
    /// Half the probe's round trip, in milliseconds.
    pub uncertainty_ms: i64,
}

impl Offset {
    /// From one probe: the local time before it was `sent`, the `server`'s stamp, the local time
    /// it was `answered`.
    pub fn from_probe(sent: DateTime<Utc>, server: DateTime<Utc>, answered: DateTime<Utc>) -> Self {
        let round_trip = (answered - sent).num_milliseconds().max(0);
        let midpoint = sent + chrono::Duration::milliseconds(round_trip / 2);
        Self {
            millis: (midpoint - server).num_milliseconds(),
            uncertainty_ms: round_trip / 2,
        }
    }

    /// Whether the clock is off by more than `limit` for every reading the uncertainty allows.
    pub fn beyond(&self, limit: Duration) -> bool {
        let limit_ms = i64::try_from(limit.as_millis()).unwrap_or(i64::MAX);
        self.millis.abs() - self.uncertainty_ms > limit_ms
    }
}

/// A node's view of its clock, shared by its actors.
#[derive(Clone, Debug)]
pub struct ClockGuard {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limit: Duration,
    skewed: AtomicBool,
    offset_ms: AtomicI64,
}

impl ClockGuard {
    /// A guard with `limit`; the clock counts as good until a measurement says otherwise.
    pub fn new(limit: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                limit,
                skewed: AtomicBool::new(false),
                offset_ms: AtomicI64::new(0),
            }),
        }
    }

    /// Whether the last measurement proved the clock off by more than the limit.
    pub fn skewed(&self) -> bool {
        self.inner.skewed.load(Ordering::Relaxed)
    }

    /// The last measured offset in milliseconds (local minus server).
    pub fn offset_ms(&self) -> i64 {
        self.inner.offset_ms.load(Ordering::Relaxed)
    }

    /// The limit.
    pub fn limit(&self) -> Duration {
        self.inner.limit
    }

    /// Takes a measurement into account; returns whether the verdict changed.
    pub fn judge(&self, offset: Offset) -> bool {
        self.inner.offset_ms.store(offset.millis, Ordering::Relaxed);
        crate::metrics::metrics()
            .clock_offset
            .set(offset.millis as f64 / 1000.0);
        let skewed = offset.beyond(self.inner.limit);
        self.inner.skewed.swap(skewed, Ordering::Relaxed) != skewed
    }

    /// Measures the offset of `clock` to the server: the best of a few probes.
    pub async fn measure(
        client: &AxClient,
        clock: &dyn Clock,
        node: &NodeId,
    ) -> Result<Offset, ActorError> {
        let subject = client.subjects().clock(node);
        let stream = client
            .js
            .get_stream(client.layout.clock_stream())
            .await
            .during(|| "open clock stream")?;
        let mut best: Option<Offset> = None;
        for _ in 0..PROBES {
            let sent = clock.now();
            let ack: PublishAckFuture = client
                .js
                .publish(subject.clone(), bytes::Bytes::new())
                .await
                .during(|| "clock probe")?;
            let sequence = ack.await.during(|| "clock probe")?.sequence;
            let answered = clock.now();
            let stored = stream
                .get_raw_message(sequence)
                .await
                .during(|| "read clock probe")?;
            let server = ax_bus::time::from_server(stored.time);
            let offset = Offset::from_probe(sent, server, answered);
            if best.is_none_or(|b| offset.uncertainty_ms < b.uncertainty_ms) {
                best = Some(offset);
            }
        }
        best.ok_or_else(|| {
            NatsError::new("clock probe", Reason("no clock probe answered".into())).into()
        })
    }

    /// Measures every [`MEASURE_EVERY`] for ever, and alerts on `ax.alert.clock_skew` when the
    /// clock goes off (again every minute while it stays off) and when it is back.
    pub async fn run(self, client: AxClient, clock: Arc<dyn Clock>, node: NodeId) {
        let mut last_alert: Option<std::time::Instant> = None;
        loop {
            match Self::measure(&client, clock.as_ref(), &node).await {
                Ok(offset) => {
                    let changed = self.judge(offset);
                    let due = last_alert.is_none_or(|at| at.elapsed() >= Duration::from_secs(60));
                    if self.skewed() && (changed || due) {
                        publish::alert(
                            &client,
                            &node,
                            AlertKind::ClockSkew,
                            format!(
                                "clock of node {node} is {} ms off the NATS server's (± {} ms), more than the {} s allowed: its Scheduler stops firing and its worker refuses dispatches until it is back",
                                offset.millis,
                                offset.uncertainty_ms,
                                self.limit().as_secs_f64()
                            ),
                            None,
                        )
                        .await;
                        last_alert = Some(std::time::Instant::now());
                    } else if changed {
                        publish::alert(
                            &client,
                            &node,
                            AlertKind::ClockSkew,
                            format!(
                                "clock of node {node} is back within {} s of the NATS server's ({} ms ± {} ms)",
                                self.limit().as_secs_f64(),
                                offset.millis,
                                offset.uncertainty_ms
                            ),
                            None,
                        )
                        .await;
                        last_alert = None;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "clock offset not measured"),
            }
            tokio::time::sleep(MEASURE_EVERY).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        ax_bus::time::from_millis(1_800_000_000_000 + ms)
    }

    #[test]
    fn the_offset_is_taken_at_the_midpoint_of_the_round_trip() {
        let offset = Offset::from_probe(at(10_000), at(3_000), at(10_010));
        assert_eq!(
            offset,
            Offset {
                millis: 7_005,
                uncertainty_ms: 5
            }
        );
        assert!(offset.beyond(Duration::from_secs(5)));
        assert!(!offset.beyond(Duration::from_secs(8)));
        let behind = Offset::from_probe(at(0), at(6_000), at(2));
        assert_eq!(behind.millis, -5_999);
        assert!(behind.beyond(Duration::from_secs(5)));
    }

    #[test]
    fn a_slow_answer_is_never_taken_for_skew() {
        // The server stamped the probe as soon as it came, then the answer queued for 12 s:
        // clocks in agreement, a long round trip.
        let offset = Offset::from_probe(at(0), at(1), at(12_000));
        assert_eq!(offset.uncertainty_ms, 6_000);
        assert!(!offset.beyond(Duration::from_secs(5)));
        // The probe queued 12 s before the server stamped it: the same.
        let offset = Offset::from_probe(at(0), at(11_999), at(12_000));
        assert!(!offset.beyond(Duration::from_secs(5)));
    }

    #[test]
    fn the_verdict_changes_only_when_the_limit_is_crossed() {
        let guard = ClockGuard::new(Duration::from_secs(5));
        let good = Offset {
            millis: 100,
            uncertainty_ms: 1,
        };
        let bad = Offset {
            millis: -9_000,
            uncertainty_ms: 1,
        };
        assert!(!guard.judge(good));
        assert!(guard.judge(bad));
        assert!(guard.skewed());
        assert_eq!(guard.offset_ms(), -9_000);
        assert!(!guard.judge(bad));
        assert!(guard.judge(good));
        assert!(!guard.skewed());
    }
}
