//! A worker's slots: a budget shared by the priorities.
//!
//! - **Room kept for higher priorities.** `low` work may take at most
//!   `budget - reserved.high - reserved.normal` slots, `normal` work at most
//!   `budget - reserved.high`, `high` work all of them (each at least one): high work takes the
//!   idle slots of lower priorities, never the other way round.
//! - **A freed slot goes to the highest priority waiting.** Each priority's pump waits for a
//!   slot holding the dispatch it took; a waiter takes a slot only while no higher priority
//!   waits, so once every slot is busy high work waits for one release at most, however many
//!   low dispatches queue behind it.
//! - **The budget moves.** With `[worker.adaptive]` the total follows the machine's pressure
//!   ([`super::budget`]); a smaller budget stops new starts until enough attempts end (running
//!   ones are never cut short), a larger one hands its slots to the waiters at once.
//! - **Room for what attempts ask.** An attempt whose job's `resources` ask for memory or CPU
//!   takes a slot only while what the running attempts asked for, and it, fit in the worker's
//!   room ([`ax_bus::room`]); the Routers send only where they see room, and this holds the
//!   line where their view is late (a burst sent between two heartbeats). One attempt alone
//!   always runs, so an attempt larger than the room cannot wait for ever.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use ax_bus::messages::Reserved;
use ax_bus::room::Requested;
use ax_bus::spec::Priority;

/// The slots of one worker.
#[derive(Debug)]
pub(crate) struct Slots {
    reserved: Reserved,
    /// The largest budget it may be given (the dispatch consumers are sized by it).
    most: u32,
    /// The memory and CPU its attempts may ask for together.
    room: Requested,
    state: Mutex<State>,
    changed: Notify,
}

#[derive(Debug)]
struct State {
    budget: u32,
    running: u32,
    /// What the running attempts asked for.
    asked: Requested,
    /// Pumps waiting for a slot, by rank (high first).
    waiting: [u32; 3],
}

/// One taken slot; released on drop.
#[derive(Debug)]
pub(crate) struct Permit {
    slots: Arc<Slots>,
    asked: Requested,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut state = self.slots.state();
        state.running = state.running.saturating_sub(1);
        state.asked = Requested {
            memory_bytes: state
                .asked
                .memory_bytes
                .saturating_sub(self.asked.memory_bytes),
            cpu_millis: state.asked.cpu_millis.saturating_sub(self.asked.cpu_millis),
        };
        drop(state);
        self.slots.changed.notify_waiters();
    }
}

/// A pump counted as waiting until it takes a slot or gives up (its future dropped).
struct Waiting<'a> {
    slots: &'a Slots,
    rank: usize,
    taken: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.taken {
            let mut state = self.slots.state();
            state.waiting[self.rank] = state.waiting[self.rank].saturating_sub(1);
            drop(state);
            // A lower priority may have held back for this one.
            self.slots.changed.notify_waiters();
        }
    }
}

fn rank(priority: Priority) -> usize {
    match priority {
        Priority::High => 0,
        Priority::Normal => 1,
        Priority::Low => 2,
    }
}

impl Slots {
    /// A budget of `budget` slots, at most `most`, `reserved` of them kept for higher
    /// priorities, with `room` for what attempts ask for.
    pub(crate) fn new(budget: u32, most: u32, reserved: Reserved, room: Requested) -> Arc<Self> {
        let most = most.max(1);
        Arc::new(Self {
            reserved,
            most,
            room,
            state: Mutex::new(State {
                budget: budget.clamp(1, most),
                running: 0,
                asked: Requested::default(),
                waiting: [0; 3],
            }),
            changed: Notify::new(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding it; a poisoned lock still holds consistent counts.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn limit_in(&self, budget: u32, priority: Priority) -> u32 {
        let kept = match priority {
            Priority::High => 0,
            Priority::Normal => self.reserved.high,
            Priority::Low => self.reserved.high + self.reserved.normal,
        };
        budget.saturating_sub(kept).max(1)
    }

    /// How many slots work of `priority` may occupy now (at least one).
    pub(crate) fn limit(&self, priority: Priority) -> u32 {
        let budget = self.state().budget;
        self.limit_in(budget, priority)
    }

    /// How many slots work of `priority` may occupy at the largest budget.
    pub(crate) fn most(&self, priority: Priority) -> u32 {
        self.limit_in(self.most, priority)
    }

    /// The budget now.
    pub(crate) fn budget(&self) -> u32 {
        self.state().budget
    }

    /// Sets the budget (clamped to 1..=most); waiters take what it frees at once.
    pub(crate) fn set_budget(&self, budget: u32) {
        self.state().budget = budget.clamp(1, self.most);
        self.changed.notify_waiters();
    }

    /// Attempts running now.
    pub(crate) fn running(&self) -> u32 {
        self.state().running
    }

    /// What the attempts holding a slot asked for together (the heartbeat's `requested`: the
    /// room they take from the moment they take their slot, as the gate counts it).
    pub(crate) fn asked(&self) -> Requested {
        self.state().asked
    }

    /// Pumps waiting for a slot now (work that a larger budget would start).
    pub(crate) fn waiting(&self) -> u32 {
        self.state().waiting.iter().sum()
    }

    /// Whether an attempt asking for `asked` fits beside what runs (alone, it always does).
    fn fits(&self, state: &State, asked: Requested) -> bool {
        let taken = state.asked.plus(asked);
        state.running == 0
            || asked == Requested::default()
            || (taken.memory_bytes <= self.room.memory_bytes
                && taken.cpu_millis <= self.room.cpu_millis)
    }

    /// Waits for a slot that work of `priority` asking for `asked` may take: one under its
    /// limit, with room for `asked`, and no higher priority waiting.
    pub(crate) async fn acquire(self: &Arc<Self>, priority: Priority, asked: Requested) -> Permit {
        let rank = rank(priority);
        self.state().waiting[rank] += 1;
        let mut waiting = Waiting {
            slots: self,
            rank,
            taken: false,
        };
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = self.state();
                let higher_waits = state.waiting[..rank].iter().any(|w| *w > 0);
                if !higher_waits
                    && state.running < self.limit_in(state.budget, priority)
                    && self.fits(&state, asked)
                {
                    state.running += 1;
                    state.asked = state.asked.plus(asked);
                    state.waiting[rank] -= 1;
                    waiting.taken = true;
                    let more = state.running < state.budget && state.waiting.iter().any(|w| *w > 0);
                    drop(state);
                    if more {
                        // Others held back for this one, or a larger budget freed several.
                        self.changed.notify_waiters();
                    }
                    return Permit {
                        slots: self.clone(),
                        asked,
                    };
                }
            }
            changed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const SHORT: Duration = Duration::from_millis(50);
    const LONG: Duration = Duration::from_secs(5);
    const GIB: u64 = 1 << 30;
    /// More room than any test asks for.
    const ROOMY: Requested = Requested {
        memory_bytes: 1 << 40,
        cpu_millis: 1_000_000,
    };

    fn memory(gib: u64) -> Requested {
        Requested {
            memory_bytes: gib * GIB,
            cpu_millis: 0,
        }
    }

    /// A pump of `priority` waiting for a slot, on a task of its own.
    fn waiter(slots: &Arc<Slots>, priority: Priority) -> tokio::task::JoinHandle<Permit> {
        let slots = slots.clone();
        tokio::spawn(async move { slots.acquire(priority, Requested::default()).await })
    }

    /// Returns once `n` pumps wait.
    async fn until_waiting(slots: &Slots, n: u32) {
        tokio::time::timeout(LONG, async {
            while slots.waiting() < n {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{n} pumps never waited"));
    }

    #[tokio::test]
    async fn low_work_never_takes_the_reserved_slots() {
        let slots = Slots::new(4, 4, Reserved { high: 1, normal: 1 }, ROOMY);
        assert_eq!(
            [Priority::High, Priority::Normal, Priority::Low].map(|p| slots.limit(p)),
            [4, 3, 2]
        );
        let _a = slots.acquire(Priority::Low, Requested::default()).await;
        let _b = slots.acquire(Priority::Low, Requested::default()).await;
        let third_low =
            tokio::time::timeout(SHORT, slots.acquire(Priority::Low, Requested::default())).await;
        assert!(
            third_low.is_err(),
            "a third low attempt took a reserved slot"
        );
        assert_eq!(slots.waiting(), 0, "a given-up wait is no longer counted");
        let _c = slots.acquire(Priority::Normal, Requested::default()).await;
        let _d = slots.acquire(Priority::High, Requested::default()).await;
        assert_eq!(slots.running(), 4);
        let waiting = waiter(&slots, Priority::High);
        drop(_c);
        let permit = tokio::time::timeout(LONG, waiting).await;
        assert!(permit.is_ok(), "a freed slot was not handed on");
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_the_high_work_waiting_not_to_low() {
        // No reservation: low fills every slot, and more low work queues.
        let slots = Slots::new(2, 2, Reserved::default(), ROOMY);
        let first = slots.acquire(Priority::Low, Requested::default()).await;
        let _second = slots.acquire(Priority::Low, Requested::default()).await;
        let low = waiter(&slots, Priority::Low);
        until_waiting(&slots, 1).await;
        let high = waiter(&slots, Priority::High);
        until_waiting(&slots, 2).await;
        // One release: the high work takes it, the low work still waits.
        drop(first);
        let high = tokio::time::timeout(LONG, high)
            .await
            .expect("high work waited for more than one release")
            .expect("the high pump");
        assert!(
            !low.is_finished(),
            "low work took the slot high work waited for"
        );
        assert_eq!(slots.running(), 2);
        drop(high);
        tokio::time::timeout(LONG, low)
            .await
            .expect("the low work takes the next release")
            .expect("the low pump");
    }

    #[tokio::test]
    async fn a_larger_budget_starts_the_waiting_work_and_a_smaller_one_holds_new_starts() {
        let slots = Slots::new(1, 3, Reserved::default(), ROOMY);
        assert_eq!(slots.most(Priority::Low), 3);
        let first = slots.acquire(Priority::Low, Requested::default()).await;
        let waiters = [waiter(&slots, Priority::Low), waiter(&slots, Priority::Low)];
        until_waiting(&slots, 2).await;
        slots.set_budget(3);
        let mut permits = Vec::new();
        for waiter in waiters {
            let permit = tokio::time::timeout(LONG, waiter)
                .await
                .expect("a larger budget started the waiting work")
                .expect("the pump");
            permits.push(permit);
        }
        assert_eq!(slots.running(), 3);
        // Shrunk below what runs: nothing is cut short, nothing new starts until it drains.
        slots.set_budget(1);
        assert_eq!(slots.running(), 3);
        permits.pop();
        let next =
            tokio::time::timeout(SHORT, slots.acquire(Priority::High, Requested::default())).await;
        assert!(next.is_err(), "work started over a smaller budget");
        permits.clear();
        drop(first);
        tokio::time::timeout(LONG, slots.acquire(Priority::High, Requested::default()))
            .await
            .expect("starts once what runs is under the budget");
        slots.set_budget(99);
        assert_eq!(slots.budget(), 3, "the budget stays within its bounds");
    }

    #[tokio::test]
    async fn an_attempt_waits_for_room_for_what_it_asks_and_one_alone_always_runs() {
        let room = Requested {
            memory_bytes: 8 * GIB,
            cpu_millis: 4000,
        };
        let slots = Slots::new(4, 4, Reserved::default(), room);
        let six = slots.acquire(Priority::Normal, memory(6)).await;
        // A slot is free but the memory is not: it waits, holding back lower priorities too.
        let four = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire(Priority::Normal, memory(4)).await }
        });
        until_waiting(&slots, 1).await;
        let asking_nothing = slots.acquire(Priority::High, Requested::default()).await;
        assert_eq!(slots.running(), 2, "work asking nothing still runs");
        let two = tokio::time::timeout(SHORT, slots.acquire(Priority::High, memory(2)))
            .await
            .expect("what fits beside the 6 GiB runs");
        assert_eq!(slots.waiting(), 1);
        assert_eq!(
            slots.asked(),
            memory(8),
            "what the heartbeat says is asked for"
        );
        drop(six);
        let four = tokio::time::timeout(LONG, four)
            .await
            .expect("the room freed starts it")
            .expect("the pump");
        let cpu = Requested {
            memory_bytes: 0,
            cpu_millis: 4001,
        };
        assert!(
            tokio::time::timeout(SHORT, slots.acquire(Priority::High, cpu))
                .await
                .is_err(),
            "over the CPU room beside others"
        );
        drop((four, two, asking_nothing));
        assert_eq!(
            slots.asked(),
            Requested::default(),
            "every permit gave its room back"
        );
        // Larger than the whole room: alone, it runs rather than waiting for ever.
        tokio::time::timeout(LONG, slots.acquire(Priority::Low, memory(64)))
            .await
            .expect("one attempt alone always runs");
    }
}
