//! Where "now" comes from. Production uses the system clock; tests use a [`ManualClock`] they
//! set and advance, so cron across midnight, DST days and month ends run without sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};

/// A source of the current instant.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Now, at millisecond precision.
    fn now(&self) -> DateTime<Utc>;
}

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        ax_bus::time::now()
    }
}

/// A clock that moves only when told to.
#[derive(Clone, Debug)]
pub struct ManualClock {
    millis: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock showing `at`.
    pub fn new(at: DateTime<Utc>) -> Self {
        Self {
            millis: Arc::new(AtomicI64::new(at.timestamp_millis())),
        }
    }

    /// Sets the time.
    pub fn set(&self, at: DateTime<Utc>) {
        self.millis.store(at.timestamp_millis(), Ordering::SeqCst);
    }

    /// Moves the time forward.
    pub fn advance(&self, by: chrono::Duration) {
        self.millis
            .fetch_add(by.num_milliseconds(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        ax_bus::time::from_millis(self.millis.load(Ordering::SeqCst))
    }
}
