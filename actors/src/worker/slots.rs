//! A worker's slots, with room kept for higher priorities: `low` work may take at most
//! `slots - reserved.high - reserved.normal` of them, `normal` work at most
//! `slots - reserved.high`, `high` work all — so a saturated low queue can never starve high.

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use ax_bus::messages::Reserved;
use ax_bus::spec::Priority;

/// The slots of one worker.
#[derive(Debug)]
pub(crate) struct Slots {
    total: u32,
    reserved: Reserved,
    running: Mutex<u32>,
    freed: Notify,
}

/// One taken slot; released on drop.
#[derive(Debug)]
pub(crate) struct Permit {
    slots: Arc<Slots>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Ok(mut running) = self.slots.running.lock() {
            *running = running.saturating_sub(1);
        }
        self.slots.freed.notify_waiters();
    }
}

impl Slots {
    /// `total` slots, `reserved` of them kept for higher priorities.
    pub(crate) fn new(total: u32, reserved: Reserved) -> Arc<Self> {
        Arc::new(Self {
            total: total.max(1),
            reserved,
            running: Mutex::new(0),
            freed: Notify::new(),
        })
    }

    /// How many slots work of `priority` may occupy in all (at least one).
    pub(crate) fn limit(&self, priority: Priority) -> u32 {
        let kept = match priority {
            Priority::High => 0,
            Priority::Normal => self.reserved.high,
            Priority::Low => self.reserved.high + self.reserved.normal,
        };
        self.total.saturating_sub(kept).max(1)
    }

    /// Attempts running now.
    pub(crate) fn running(&self) -> u32 {
        self.running.lock().map(|r| *r).unwrap_or(0)
    }

    /// Waits for a slot that work of `priority` may take.
    pub(crate) async fn acquire(self: &Arc<Self>, priority: Priority) -> Permit {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Ok(mut running) = self.running.lock() {
                if *running < self.limit(priority) {
                    *running += 1;
                    return Permit {
                        slots: self.clone(),
                    };
                }
            }
            freed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn low_work_never_takes_the_reserved_slots() {
        let slots = Slots::new(4, Reserved { high: 1, normal: 1 });
        assert_eq!(
            [Priority::High, Priority::Normal, Priority::Low].map(|p| slots.limit(p)),
            [4, 3, 2]
        );
        let _a = slots.acquire(Priority::Low).await;
        let _b = slots.acquire(Priority::Low).await;
        let third_low =
            tokio::time::timeout(Duration::from_millis(50), slots.acquire(Priority::Low)).await;
        assert!(
            third_low.is_err(),
            "a third low attempt took a reserved slot"
        );
        let _c = slots.acquire(Priority::Normal).await;
        let _d = slots.acquire(Priority::High).await;
        assert_eq!(slots.running(), 4);
        let waiting = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.acquire(Priority::High).await })
        };
        drop(_c);
        let permit = tokio::time::timeout(Duration::from_secs(1), waiting).await;
        assert!(permit.is_ok(), "a freed slot was not handed on");
    }
}
