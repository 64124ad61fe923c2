//! A hierarchical timing wheel with millisecond ticks: the Scheduler's store of pending fires.
//!
//! Six levels of 64 slots cover 64^6 ms (about 2.2 years); later deadlines wait in an overflow
//! list. An entry sits at the level given by the highest bit in which its deadline differs from
//! the wheel's current time, so insertion is O(1), the next deadline is found with one
//! `trailing_zeros` per level, and an entry is touched at most once per level on its way down
//! (the same layout as tokio's timer). Entries are a deadline and a small payload: a pending
//! timer costs about 16 bytes plus its share of slot vectors, not a task.
//!
//! The wheel owns no clock: callers pass "now" in milliseconds, which is what lets tests drive
//! it through days in microseconds.

const SLOT_BITS: u32 = 6;
const SLOTS: usize = 1 << SLOT_BITS;
const LEVELS: usize = 6;
/// The span the levels cover, in ms: deadlines outside the current aligned span overflow.
const RANGE: u64 = 1 << (SLOT_BITS as usize * LEVELS);

#[derive(Debug)]
struct Entry<T> {
    deadline: u64,
    item: T,
}

#[derive(Debug)]
struct Level<T> {
    slots: Vec<Vec<Entry<T>>>,
    occupied: u64,
}

impl<T> Level<T> {
    fn new() -> Self {
        Self {
            slots: (0..SLOTS).map(|_| Vec::new()).collect(),
            occupied: 0,
        }
    }
}

/// Pending items keyed by a deadline in milliseconds.
#[derive(Debug)]
pub(crate) struct TimeWheel<T> {
    levels: Vec<Level<T>>,
    overflow: Vec<Entry<T>>,
    due: Vec<Entry<T>>,
    elapsed: u64,
    len: usize,
}

fn level_for(elapsed: u64, deadline: u64) -> usize {
    let masked = (elapsed ^ deadline) | (SLOTS as u64 - 1);
    let significant = 63 - masked.leading_zeros() as usize;
    significant / SLOT_BITS as usize
}

fn slot_span(level: usize) -> u64 {
    1 << (SLOT_BITS as usize * level)
}

impl<T> TimeWheel<T> {
    /// An empty wheel whose current time is `now_ms`.
    pub(crate) fn new(now_ms: u64) -> Self {
        Self {
            levels: (0..LEVELS).map(|_| Level::new()).collect(),
            overflow: Vec::new(),
            due: Vec::new(),
            elapsed: now_ms,
            len: 0,
        }
    }

    /// Number of pending items.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is pending.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `item` due at `deadline_ms`; a deadline already past is due at the next poll.
    pub(crate) fn insert(&mut self, deadline_ms: u64, item: T) {
        self.len += 1;
        self.place(Entry {
            deadline: deadline_ms,
            item,
        });
    }

    fn place(&mut self, entry: Entry<T>) {
        if entry.deadline <= self.elapsed {
            self.due.push(entry);
            return;
        }
        let level = level_for(self.elapsed, entry.deadline);
        if level >= LEVELS {
            self.overflow.push(entry);
            return;
        }
        let slot = ((entry.deadline >> (SLOT_BITS as usize * level)) as usize) & (SLOTS - 1);
        let lvl = &mut self.levels[level];
        lvl.slots[slot].push(entry);
        lvl.occupied |= 1 << slot;
    }

    /// The start of the earliest occupied slot: no item is due before it (an item at a higher
    /// level may be due later; polling at this time moves it down).
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        if !self.due.is_empty() {
            return Some(self.elapsed);
        }
        if let Some((deadline, _, _)) = self.next_slot() {
            return Some(deadline);
        }
        self.overflow
            .iter()
            .map(|e| e.deadline)
            .min()
            .map(|d| (d - d % RANGE).max(self.elapsed + 1))
    }

    /// (slot start, level, slot) of the earliest occupied slot. Every entry shares its level's
    /// window with the current time and lies in a later slot of it, and entries at lower levels
    /// are due before those at higher ones, so the lowest occupied slot of the lowest occupied
    /// level is the earliest.
    fn next_slot(&self) -> Option<(u64, usize, usize)> {
        let (level, lvl) = self
            .levels
            .iter()
            .enumerate()
            .find(|(_, lvl)| lvl.occupied != 0)?;
        let span = slot_span(level);
        let level_span = span * SLOTS as u64;
        let slot = lvl.occupied.trailing_zeros() as usize;
        let level_start = self.elapsed - self.elapsed % level_span;
        Some((level_start + slot as u64 * span, level, slot))
    }

    /// Moves time to `now_ms` and appends every item due by then to `out` as
    /// `(deadline, item)`, in deadline order per slot.
    pub(crate) fn poll(&mut self, now_ms: u64, out: &mut Vec<(u64, T)>) {
        for entry in self.due.drain(..) {
            out.push((entry.deadline, entry.item));
            self.len -= 1;
        }
        if now_ms < self.elapsed {
            return;
        }
        while let Some((slot_start, level, slot)) = self.next_slot() {
            if slot_start > now_ms {
                break;
            }
            self.elapsed = self.elapsed.max(slot_start);
            let lvl = &mut self.levels[level];
            lvl.occupied &= !(1 << slot);
            let entries = std::mem::take(&mut lvl.slots[slot]);
            for entry in entries {
                // Level 0 slots are one millisecond wide: all due. Higher ones move down.
                if level == 0 {
                    out.push((entry.deadline, entry.item));
                    self.len -= 1;
                } else {
                    self.place(entry);
                }
            }
            for entry in self.due.drain(..) {
                out.push((entry.deadline, entry.item));
                self.len -= 1;
            }
        }
        self.elapsed = now_ms;
        if !self.overflow.is_empty() {
            let elapsed = self.elapsed;
            let (near, far): (Vec<_>, Vec<_>) = std::mem::take(&mut self.overflow)
                .into_iter()
                // Past due counts as near: a jump of time beyond a deadline in the overflow
                // (its level taken from the XOR would be past the levels) makes it due now.
                .partition(|e| e.deadline <= elapsed || level_for(elapsed, e.deadline) < LEVELS);
            self.overflow = far;
            for entry in near {
                self.place(entry);
            }
            for entry in self.due.drain(..) {
                out.push((entry.deadline, entry.item));
                self.len -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn items_come_out_at_their_deadline_not_before() {
        let mut wheel = TimeWheel::new(1_000);
        wheel.insert(1_005, "a");
        wheel.insert(1_100, "b");
        wheel.insert(1_000 + 70_000, "c");
        let mut out = Vec::new();
        wheel.poll(1_004, &mut out);
        assert!(out.is_empty());
        wheel.poll(1_005, &mut out);
        assert_eq!(out, [(1_005, "a")]);
        out.clear();
        wheel.poll(71_000, &mut out);
        assert_eq!(out, [(1_100, "b"), (71_000, "c")]);
        assert!(wheel.is_empty());
    }

    #[test]
    fn past_deadlines_are_due_at_once() {
        let mut wheel = TimeWheel::new(500);
        wheel.insert(10, 1);
        assert_eq!(wheel.next_deadline(), Some(500));
        let mut out = Vec::new();
        wheel.poll(500, &mut out);
        assert_eq!(out, [(10, 1)]);
    }

    #[test]
    fn far_deadlines_wait_in_overflow() {
        let mut wheel = TimeWheel::new(0);
        let far = RANGE * 3 + 17;
        wheel.insert(far, ());
        let mut out = Vec::new();
        wheel.poll(far - 1, &mut out);
        assert!(out.is_empty());
        wheel.poll(far, &mut out);
        assert_eq!(out.len(), 1);
    }

    /// Random inserts and polls against a sorted reference: same items, each at the first poll
    /// at or after its deadline, and next_deadline never later than the earliest item.
    #[test]
    fn matches_a_reference_model() {
        for seed in 0..40u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let start = rng.random_range(0..1u64 << 40);
            let mut wheel = TimeWheel::new(start);
            let mut reference: Vec<(u64, u32)> = Vec::new();
            let mut now = start;
            let mut id = 0u32;
            for _ in 0..400 {
                for _ in 0..rng.random_range(0..8) {
                    let horizon =
                        [10u64, 1_000, 100_000, 10_000_000, 1 << 37][rng.random_range(0..5)];
                    let deadline = now + rng.random_range(0..horizon);
                    wheel.insert(deadline, id);
                    reference.push((deadline, id));
                    id += 1;
                }
                if let (Some(next), Some(min)) =
                    (wheel.next_deadline(), reference.iter().map(|r| r.0).min())
                {
                    assert!(
                        next <= min.max(now),
                        "seed {seed}: next {next} > earliest {min}"
                    );
                }
                let step = [1u64, 50, 5_000, 3_000_000][rng.random_range(0..4)];
                now += rng.random_range(0..step);
                let mut out = Vec::new();
                wheel.poll(now, &mut out);
                let mut expected: Vec<(u64, u32)> =
                    reference.iter().copied().filter(|r| r.0 <= now).collect();
                reference.retain(|r| r.0 > now);
                out.sort();
                expected.sort();
                assert_eq!(out, expected, "seed {seed} at {now}");
                assert_eq!(wheel.len(), reference.len());
            }
        }
    }
}

#[cfg(test)]
mod properties {
    //! The wheel against the simplest model that could be right: a list of (deadline, id),
    //! from which a poll at `now` takes everything due by then.

    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        /// An item due `offset` ms from the wheel's time (negative: already past).
        Insert(i64),
        /// Time moves on by this many ms.
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            // Near, far (every level), past the levels' range (the overflow), and past due.
            3 => (0i64..200).prop_map(Op::Insert),
            2 => (0i64..(1 << 30)).prop_map(Op::Insert),
            1 => ((RANGE as i64)..(RANGE as i64 * 3)).prop_map(Op::Insert),
            1 => (-5_000i64..0).prop_map(Op::Insert),
            4 => prop_oneof![0u64..50, 0u64..100_000, 0u64..(RANGE * 2)].prop_map(Op::Advance),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn polls_give_exactly_what_is_due(start in 0u64..(1 << 40), ops in prop::collection::vec(op(), 1..200)) {
            let mut wheel = TimeWheel::new(start);
            let mut model: Vec<(u64, usize)> = Vec::new();
            let mut now = start;
            for (id, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Insert(offset) => {
                        let deadline = now.saturating_add_signed(offset);
                        wheel.insert(deadline, id);
                        model.push((deadline, id));
                    }
                    Op::Advance(by) => {
                        now += by;
                        let mut out = Vec::new();
                        wheel.poll(now, &mut out);
                        let mut got: Vec<(u64, usize)> = out;
                        got.sort_unstable();
                        let mut due: Vec<(u64, usize)> =
                            model.iter().copied().filter(|(d, _)| *d <= now).collect();
                        due.sort_unstable();
                        model.retain(|(d, _)| *d > now);
                        prop_assert_eq!(got, due, "poll at {}", now);
                    }
                }
                prop_assert_eq!(wheel.len(), model.len());
                if let (Some(next), Some(earliest)) =
                    (wheel.next_deadline(), model.iter().map(|(d, _)| *d).min())
                {
                    // Nothing is due before the wheel says to look again.
                    prop_assert!(next <= earliest.max(now), "next {} > earliest {}", next, earliest);
                }
            }
        }
    }
}
