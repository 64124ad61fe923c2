//! Hooks for the integration tests, compiled only with the `test-hooks` feature. The root
//! package turns it on through a dev-dependency, so the `ax` binary that `cargo test` and
//! `cargo nextest` build for the tests has them, and `cargo build` — release builds, `scripts/up`
//! — does not: there each hook is an empty function or the plain value, and no variable in a
//! production environment can reach one.
//!
//! - `failpoint`: `AX_FAILPOINT=<name>` kills the process at a named point;
//! - `dispatch_stall`: `AX_TEST_STALL_SECS` makes a worker hold each dispatch that long
//!   before it starts it — a worker that receives but does not acknowledge in time;
//! - `load_delay`: `AX_TEST_LOAD_DELAY_SECS` makes a Scheduler hold the end of each reading of
//!   the job registry that long — partitions taken stay loading (their jobs read so far fire)
//!   while the others rebalance;
//! - `lead_delay`: `AX_TEST_LEAD_DELAY_SECS` makes the DagCoordinator's reading of its view,
//!   when it takes the lead, that much longer;
//! - [`backup_pause`]: `AX_TEST_BACKUP_PAUSE_SECS` makes `ax backup` wait that long before
//!   its second stream, for a test to restart NATS in the middle of a backup;
//! - [`node_clock`]: `AX_TEST_CLOCK_OFFSET_FILE` shifts the node's clock by the seconds the
//!   file says (read every 200 ms), for tests of the clock guard.

pub(crate) mod failpoint;

use std::sync::Arc;
use std::time::Duration;

use crate::runtime::clock::{Clock, SystemClock};

/// How long a worker holds each dispatch before starting it (`AX_TEST_STALL_SECS`): a worker
/// that receives but does not acknowledge in time, for the Router's dispatch deadline.
#[cfg(feature = "test-hooks")]
pub(crate) fn dispatch_stall() -> Option<Duration> {
    static STALL: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *STALL.get_or_init(|| {
        std::env::var("AX_TEST_STALL_SECS")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .map(Duration::from_secs_f64)
    })
}

/// Without the test hooks: never.
#[cfg(not(feature = "test-hooks"))]
pub(crate) fn dispatch_stall() -> Option<Duration> {
    None
}

/// How long `ax backup` waits before its second stream (`AX_TEST_BACKUP_PAUSE_SECS`).
#[cfg(feature = "test-hooks")]
pub fn backup_pause() -> Option<Duration> {
    std::env::var("AX_TEST_BACKUP_PAUSE_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .map(Duration::from_secs_f64)
}

/// Without the test hooks: never.
#[cfg(not(feature = "test-hooks"))]
pub fn backup_pause() -> Option<Duration> {
    None
}

/// How long `ax instance buckets --set` waits once the records are copied, before it stores
/// the new count (`AX_TEST_REBUCKET_PAUSE_SECS`).
#[cfg(feature = "test-hooks")]
pub fn rebucket_pause() -> Option<Duration> {
    std::env::var("AX_TEST_REBUCKET_PAUSE_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .map(Duration::from_secs_f64)
}

/// Without the test hooks: never.
#[cfg(not(feature = "test-hooks"))]
pub fn rebucket_pause() -> Option<Duration> {
    None
}

/// How long a Scheduler holds the end of each reading of the job registry
/// (`AX_TEST_LOAD_DELAY_SECS`): partitions taken stay loading while the others rebalance.
#[cfg(feature = "test-hooks")]
pub(crate) fn load_delay() -> Option<Duration> {
    static DELAY: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| {
        std::env::var("AX_TEST_LOAD_DELAY_SECS")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .map(Duration::from_secs_f64)
    })
}

/// Without the test hooks: never.
#[cfg(not(feature = "test-hooks"))]
pub(crate) fn load_delay() -> Option<Duration> {
    None
}

/// How long the DagCoordinator takes, on top of the reading itself, to read its view back when
/// it takes the lead (`AX_TEST_LEAD_DELAY_SECS`): a lead longer than the lease lives, as a large
/// history on a loaded machine makes it.
#[cfg(feature = "test-hooks")]
pub(crate) fn lead_delay() -> Option<Duration> {
    std::env::var("AX_TEST_LEAD_DELAY_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .map(Duration::from_secs_f64)
}

/// Without the test hooks: never.
#[cfg(not(feature = "test-hooks"))]
pub(crate) fn lead_delay() -> Option<Duration> {
    None
}

/// The node's clock: the system clock, shifted (with the test hooks) by the seconds written in
/// the file `AX_TEST_CLOCK_OFFSET_FILE`, read every 200 ms — a node whose clock is wrong, then
/// right again. Called inside the node's tokio runtime.
#[cfg(feature = "test-hooks")]
pub fn node_clock() -> Arc<dyn Clock> {
    let Ok(path) = std::env::var("AX_TEST_CLOCK_OFFSET_FILE") else {
        return Arc::new(SystemClock);
    };
    let read = move |clock: &ShiftedClock| {
        let seconds: f64 = std::fs::read_to_string(&path)
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0.0);
        clock.shift((seconds * 1000.0) as i64);
    };
    let clock = ShiftedClock::default();
    read(&clock);
    let shifted = clock.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            read(&shifted);
        }
    });
    Arc::new(clock)
}

/// The node's clock: the system clock (built without the test hooks).
#[cfg(not(feature = "test-hooks"))]
pub fn node_clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// The system clock shifted by an offset that can change while it runs.
#[cfg(feature = "test-hooks")]
#[derive(Clone, Debug, Default)]
struct ShiftedClock {
    offset_ms: Arc<std::sync::atomic::AtomicI64>,
}

#[cfg(feature = "test-hooks")]
impl ShiftedClock {
    /// Shows the system time plus `offset_ms` from now on.
    fn shift(&self, offset_ms: i64) {
        self.offset_ms
            .store(offset_ms, std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(feature = "test-hooks")]
impl Clock for ShiftedClock {
    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        let offset = self.offset_ms.load(std::sync::atomic::Ordering::SeqCst);
        ax_bus::time::from_millis(ax_bus::time::to_millis(ax_bus::time::now()) + offset)
    }
}
