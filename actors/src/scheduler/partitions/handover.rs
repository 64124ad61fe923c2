//! Where each partition of a Scheduler stands in its handover, as a pure state: ownership
//! changes, readings of the registry, finished catch-ups and restarts go in; what the actor
//! must do comes out (the tick to report for each partition released, the registry reading to
//! wait for, the partitions to catch up, where a job read from the registry starts firing).
//! The actor only carries the answers out, so the cases the scale-out tests found are unit
//! tests here (as the DagCoordinator's state is, in `dag/state.rs`).
//!
//! A partition taken goes through three stages: *loading* (the registry is read again from
//! its start; the partition waits for the reading that delivers all its jobs), *catching up*
//! (its jobs' missed ticks are looked at) and *ready* (the keeper may say its fires are
//! settled).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};

use ax_bus::partition::{self, PartitionId};

use super::{Covered, Ownership};

/// How far before the last completed tick a restart replays the jobs defined or changed since:
/// longer than a registry watch can stay silent before it is found dead (two missed idle
/// heartbeats of 5 s, plus a request timeout). The fires it repeats are de-duplicated by their
/// instance ids.
const REPLAY_MARGIN: chrono::Duration = chrono::Duration::seconds(30);
/// How long after a handover its fired-through tick still says where the next owner starts:
/// longer than a rebalance takes, far shorter than a stop and start of every Scheduler.
const HANDOVER_FRESH: chrono::Duration = chrono::Duration::seconds(30);

/// A partition taken whose jobs are being loaded.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Loading {
    /// The tick its previous owner fired through, from a fresh handover (`None`: unknown, the
    /// misfire policy decides about the ticks before now).
    fired_through: Option<DateTime<Utc>>,
    /// Where its earlier owners left it.
    covered: Covered,
    /// The first reading of the registry that delivers all its jobs.
    reading: u64,
}

/// The partitions a Scheduler keeps, each loading, catching up or ready.
#[derive(Debug, Default)]
pub(crate) struct Handover {
    /// The deployment's number of partitions (0 until the keeper knows it).
    count: u16,
    /// Every partition kept (or being loaded).
    owned: BTreeSet<PartitionId>,
    /// Partitions taken whose jobs the registry has not delivered in full yet.
    loading: BTreeMap<PartitionId, Loading>,
    /// Partitions loaded whose missed ticks are still being looked at.
    catching_up: BTreeMap<PartitionId, Covered>,
    /// The registry reading asked for last: each take asks for one more, from the start.
    reading: u64,
}

/// What an ownership change asks of the actor.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Change {
    /// The partitions released, each with the tick through which this Scheduler fired its
    /// jobs (`None`: they were still loading or catching up; the next owner catches up by the
    /// misfire policy). Their jobs leave the wheel.
    pub released: BTreeMap<PartitionId, Option<DateTime<Utc>>>,
    /// Partitions were taken: the registry is read again from its start, as this reading.
    pub reload: Option<u64>,
}

impl Handover {
    /// The deployment's number of partitions (0 until known).
    pub(crate) fn count(&self) -> u16 {
        self.count
    }

    /// How many partitions are kept.
    pub(crate) fn kept(&self) -> usize {
        self.owned.len()
    }

    /// Follows the keeper's word (nothing before its first round): partitions no longer held
    /// are released, saying through which tick they were fired (`last_tick`, unless they were
    /// not ready); partitions newly held start loading, from where their previous owner left
    /// them if that handover is fresh at `now`.
    pub(crate) fn apply(
        &mut self,
        ownership: &Ownership,
        last_tick: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Option<Change> {
        if !ownership.settled {
            return None;
        }
        self.count = ownership.count;
        let lost: Vec<PartitionId> = self
            .owned
            .iter()
            .filter(|p| !ownership.held.contains_key(p))
            .copied()
            .collect();
        let mut change = Change::default();
        for p in lost {
            let through = match (self.loading.remove(&p), self.catching_up.remove(&p)) {
                (Some(loading), _) => loading.fired_through,
                // Its missed ticks not all looked at: the next owner looks at them.
                (None, Some(_)) => None,
                (None, None) => Some(last_tick),
            };
            change.released.insert(p, through);
            self.owned.remove(&p);
        }
        let gained: Vec<_> = ownership
            .held
            .iter()
            .filter(|(p, _)| !self.owned.contains(p))
            .collect();
        if !gained.is_empty() {
            self.reading += 1;
            change.reload = Some(self.reading);
        }
        for (p, start) in gained {
            // A handover long past (every Scheduler was stopped meanwhile) is a restart: the
            // misfire policy decides about the ticks since.
            let fresh = start
                .fired_through
                .filter(|through| now - *through <= HANDOVER_FRESH);
            self.owned.insert(*p);
            let loading = Loading {
                fired_through: fresh,
                covered: Covered {
                    through: start.covered,
                    failover: start.failover,
                },
                reading: self.reading,
            };
            self.loading.insert(*p, loading);
        }
        Some(change)
    }

    /// The instant after which `job`, read from the registry as defined or changed at
    /// `updated_at`, fires (`None`: its partition is not kept here):
    /// - in a partition handed over fresh, after the tick its previous owner fired through
    ///   (or its definition, if later), no later than `now` should a clock have been ahead
    ///   (what was fired early, firing again finds created);
    /// - in a partition taken from a Scheduler gone (or from nobody), from `now`, as at a
    ///   process start: the misfire policy looks at the ticks before;
    /// - otherwise as [`fires_from`] says.
    pub(crate) fn fires_from(
        &self,
        job: &str,
        updated_at: DateTime<Utc>,
        replay_from: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let p = partition::of(job, self.count);
        if !self.owned.contains(&p) {
            return None;
        }
        Some(match self.loading.get(&p).map(|l| l.fired_through) {
            Some(Some(through)) => through.max(updated_at).min(now),
            Some(None) => now,
            None => fires_from(replay_from, updated_at, now),
        })
    }

    /// The registry has delivered every job it held, in reading `reading`: the partitions
    /// waiting for that reading (or an earlier one) are loaded and start catching up; they are
    /// returned, each with where its earlier owners left it.
    pub(crate) fn loaded(&mut self, reading: u64) -> BTreeMap<PartitionId, Covered> {
        let taken: BTreeMap<PartitionId, Covered> = self
            .loading
            .iter()
            .filter(|(_, l)| l.reading <= reading)
            .map(|(p, l)| (*p, l.covered))
            .collect();
        self.loading.retain(|p, _| !taken.contains_key(p));
        self.catching_up.extend(taken.iter().map(|(p, c)| (*p, *c)));
        taken
    }

    /// The missed ticks of `partitions` are looked at (and handed to the creator).
    pub(crate) fn caught_up<'a>(&mut self, partitions: impl IntoIterator<Item = &'a PartitionId>) {
        for p in partitions {
            self.catching_up.remove(p);
        }
    }

    /// The partitions kept whose jobs are loaded and whose missed ticks are looked at.
    pub(crate) fn ready(&self) -> BTreeSet<PartitionId> {
        self.owned
            .iter()
            .filter(|p| !self.loading.contains_key(p) && !self.catching_up.contains_key(p))
            .copied()
            .collect()
    }

    /// The actor restarts: it reads the registry afresh (its readings count from 0 again),
    /// and a catch-up cut short is looked at again (what it created is found created) with
    /// the misfire policy deciding about the ticks before now.
    pub(crate) fn restarted(&mut self) {
        self.reading = 0;
        for loading in self.loading.values_mut() {
            loading.reading = 0;
        }
        for (p, covered) in std::mem::take(&mut self.catching_up) {
            let loading = Loading {
                fired_through: None,
                covered,
                reading: 0,
            };
            self.loading.insert(p, loading);
        }
    }
}

/// The instant after which a job read from the registry fires: now for a live change; after a
/// restart, the last completed tick — unless the job was defined or changed shortly before it,
/// when that tick may not have seen it (a registry watch goes silent for seconds before it is
/// found dead): then every tick after its definition.
fn fires_from(
    replay_from: Option<DateTime<Utc>>,
    updated_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> DateTime<Utc> {
    match replay_from {
        Some(base) if updated_at > base - REPLAY_MARGIN => updated_at,
        Some(base) => base,
        None => now,
    }
}

#[cfg(test)]
mod tests {
    use super::super::Start;
    use super::*;
    use chrono::{Duration, TimeZone};

    fn at(second: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, 17, 55, 0).unwrap() + Duration::seconds(second)
    }

    /// The keeper's word: `count` partitions, these held with their starts.
    fn ownership(count: u16, held: &[(u16, Start)], version: u64) -> Ownership {
        Ownership {
            count,
            held: held.iter().map(|(p, s)| (PartitionId(*p), *s)).collect(),
            version,
            settled: true,
        }
    }

    /// A job name in partition `p` of `count`.
    fn job_in(p: u16, count: u16) -> String {
        (0..)
            .map(|i| format!("job{i}"))
            .find(|name| partition::of(name, count) == PartitionId(p))
            .unwrap()
    }

    fn ids(ps: &[u16]) -> BTreeSet<PartitionId> {
        ps.iter().map(|p| PartitionId(*p)).collect()
    }

    #[test]
    fn nothing_is_kept_before_the_keepers_first_round() {
        let mut handover = Handover::default();
        let unsettled = Ownership {
            settled: false,
            ..ownership(4, &[(0, Start::default())], 1)
        };
        assert_eq!(handover.apply(&unsettled, at(0), at(0)), None);
        assert_eq!(handover.kept(), 0);
        assert_eq!(handover.fires_from(&job_in(0, 4), at(0), None, at(0)), None);
    }

    #[test]
    fn a_partition_taken_is_ready_once_loaded_and_caught_up() {
        let mut handover = Handover::default();
        let change = handover
            .apply(&ownership(4, &[(1, Start::default())], 1), at(0), at(0))
            .unwrap();
        assert_eq!(change.reload, Some(1));
        assert!(change.released.is_empty());
        assert!(handover.ready().is_empty());
        // A reading begun before the take does not deliver its jobs.
        assert!(handover.loaded(0).is_empty());
        let taken = handover.loaded(1);
        assert_eq!(taken.keys().copied().collect::<BTreeSet<_>>(), ids(&[1]));
        assert!(handover.ready().is_empty(), "still catching up");
        handover.caught_up(taken.keys());
        assert_eq!(handover.ready(), ids(&[1]));
    }

    #[test]
    fn a_fresh_handover_fires_after_the_tick_its_previous_owner_fired_through() {
        let mut handover = Handover::default();
        let start = Start {
            fired_through: Some(at(10)),
            covered: Some(at(8)),
            failover: false,
        };
        handover.apply(&ownership(4, &[(2, start)], 1), at(0), at(12));
        let job = job_in(2, 4);
        // After the tick fired through, or the definition if later; never after now.
        assert_eq!(
            handover.fires_from(&job, at(-100), None, at(12)),
            Some(at(10))
        );
        assert_eq!(
            handover.fires_from(&job, at(11), None, at(12)),
            Some(at(11))
        );
        assert_eq!(
            handover.fires_from(&job, at(20), None, at(12)),
            Some(at(12))
        );
        // Where its earlier owners left it goes to the catch-up.
        let taken = handover.loaded(1);
        assert_eq!(
            taken[&PartitionId(2)],
            Covered {
                through: Some(at(8)),
                failover: false
            }
        );
        // Loaded: its jobs fire as live changes do, from now.
        assert_eq!(
            handover.fires_from(&job, at(-100), None, at(13)),
            Some(at(13))
        );
    }

    #[test]
    fn a_stale_handover_or_a_dead_owners_partition_fires_from_now() {
        let mut handover = Handover::default();
        let stale = Start {
            fired_through: Some(at(0)),
            covered: None,
            failover: false,
        };
        let dead = Start {
            fired_through: None,
            covered: Some(at(50)),
            failover: true,
        };
        handover.apply(&ownership(4, &[(0, stale), (3, dead)], 1), at(0), at(31));
        assert_eq!(
            handover.fires_from(&job_in(0, 4), at(-5), None, at(31)),
            Some(at(31))
        );
        assert_eq!(
            handover.fires_from(&job_in(3, 4), at(-5), None, at(31)),
            Some(at(31))
        );
        assert_eq!(
            handover.fires_from(&job_in(1, 4), at(-5), None, at(31)),
            None
        );
        let taken = handover.loaded(1);
        assert!(taken[&PartitionId(3)].failover);
    }

    #[test]
    fn a_release_says_through_which_tick_only_a_ready_partition_was_fired() {
        let mut handover = Handover::default();
        let fresh = Start {
            fired_through: Some(at(5)),
            ..Start::default()
        };
        handover.apply(
            &ownership(
                4,
                &[(0, Start::default()), (1, fresh), (2, Start::default())],
                1,
            ),
            at(0),
            at(6),
        );
        // 0 and 2 loaded, 0 caught up; 1 still loading.
        handover.loading.get_mut(&PartitionId(1)).unwrap().reading = 2;
        handover.loaded(1);
        handover.caught_up([PartitionId(0)].iter());
        let change = handover
            .apply(&ownership(4, &[], 2), at(9), at(10))
            .unwrap();
        // Ready: the last tick. Loading: what its previous owner fired through (its jobs
        // fired nothing here yet). Catching up: unknown, the next owner looks at the misses.
        assert_eq!(change.released[&PartitionId(0)], Some(at(9)));
        assert_eq!(change.released[&PartitionId(1)], Some(at(5)));
        assert_eq!(change.released[&PartitionId(2)], None);
        assert_eq!(change.reload, None);
        assert_eq!(handover.kept(), 0);
        assert!(handover.ready().is_empty());
    }

    #[test]
    fn a_take_during_a_load_waits_for_the_reading_that_follows_it() {
        let mut handover = Handover::default();
        handover.apply(&ownership(4, &[(0, Start::default())], 1), at(0), at(0));
        let change = handover
            .apply(
                &ownership(4, &[(0, Start::default()), (1, Start::default())], 2),
                at(0),
                at(0),
            )
            .unwrap();
        assert_eq!(change.reload, Some(2));
        // The first reading ends: only the first partition's jobs are all in it.
        assert_eq!(
            handover.loaded(1).keys().copied().collect::<BTreeSet<_>>(),
            ids(&[0])
        );
        assert_eq!(
            handover.loaded(2).keys().copied().collect::<BTreeSet<_>>(),
            ids(&[1])
        );
    }

    #[test]
    fn a_restart_reads_everything_again_and_looks_at_a_cut_catch_up_again() {
        let mut handover = Handover::default();
        let fresh = Start {
            fired_through: Some(at(5)),
            covered: Some(at(4)),
            failover: false,
        };
        handover.apply(
            &ownership(
                8,
                &[(0, Start::default()), (1, fresh), (2, Start::default())],
                1,
            ),
            at(0),
            at(6),
        );
        handover.loaded(1);
        handover.caught_up([PartitionId(2)].iter());
        handover.apply(
            &ownership(
                8,
                &[
                    (0, Start::default()),
                    (1, fresh),
                    (2, Start::default()),
                    (3, fresh),
                ],
                2,
            ),
            at(6),
            at(6),
        );
        handover.restarted();
        // Every partition not ready waits for the first reading after the restart; the one
        // cut off mid catch-up no longer trusts its handover (the misfire policy decides).
        assert_eq!(handover.ready(), ids(&[2]));
        assert_eq!(
            handover.fires_from(&job_in(1, 8), at(0), None, at(7)),
            Some(at(7))
        );
        assert_eq!(
            handover.fires_from(&job_in(3, 8), at(0), None, at(7)),
            Some(at(5))
        );
        let taken = handover.loaded(0);
        assert_eq!(
            taken.keys().copied().collect::<BTreeSet<_>>(),
            ids(&[0, 1, 3])
        );
        assert_eq!(taken[&PartitionId(1)].through, Some(at(4)));
        // The next take asks for reading 1 of the restarted feed.
        let change = handover
            .apply(
                &ownership(
                    4,
                    &[
                        (0, Start::default()),
                        (1, fresh),
                        (2, Start::default()),
                        (3, fresh),
                        (4, Start::default()),
                    ],
                    3,
                ),
                at(7),
                at(7),
            )
            .unwrap();
        assert_eq!(change.reload, Some(1));
    }

    #[test]
    fn a_restart_replays_a_recent_job_from_its_definition_and_the_others_from_the_last_tick() {
        let base = at(40);
        let now = base + Duration::seconds(16);
        // Applied while the registry watch was silent, before the last completed tick.
        let recent = base - Duration::seconds(8);
        assert_eq!(fires_from(Some(base), recent, now), recent);
        // Applied after it.
        let after = base + Duration::seconds(3);
        assert_eq!(fires_from(Some(base), after, now), after);
        // Unchanged for long: from the last completed tick, as before.
        let old = base - Duration::days(3);
        assert_eq!(fires_from(Some(base), old, now), base);
        // A live change: from now.
        assert_eq!(fires_from(None, recent, now), now);
    }
}
