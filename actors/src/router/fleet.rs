//! The Router's view of the workers: who is alive, what each can run, how loaded each is — and
//! the choice of a worker for an attempt in O(log n).
//!
//! A worker's score is `(running / cores) * w_running + (avg_duration_ms / 1000) * w_duration`
//! (weights from the node config, 0.7 and 0.3 by default), where `running` counts its last
//! heartbeat plus what this Router sent it since. Workers are grouped into classes by what they
//! offer (tags and executor types); each class keeps its workers ordered by (score, a random
//! draw, id), so the best of a class is its first entry and equal scores are broken at random.
//! An attempt's eligible classes — those whose tags include all the job's tags and whose
//! executors include its type — are computed once per (tags, type) and cached.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use rand::Rng;

use ax_bus::ids::WorkerId;
use ax_bus::messages::WorkerInfo;

/// Score weights and liveness.
#[derive(Clone, Debug)]
pub struct Weights {
    /// Weight of running attempts per core.
    pub running: f64,
    /// Weight of the average duration in seconds.
    pub duration: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            running: 0.7,
            duration: 0.3,
        }
    }
}

/// What a class of workers offers.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Class {
    tags: Vec<String>,
    executors: Vec<String>,
}

/// A totally ordered score (scores are finite and non-negative).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Score(f64);

impl Eq for Score {}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Score {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

type Rank = (Score, u64, WorkerId);

#[derive(Debug)]
struct Member {
    info: WorkerInfo,
    class: Class,
    last_seen: Instant,
    /// Sent by this Router since the last heartbeat.
    recent: u32,
    rank: Rank,
}

/// The workers as this Router sees them.
#[derive(Debug)]
pub(crate) struct Fleet {
    weights: Weights,
    ttl: Duration,
    members: HashMap<WorkerId, Member>,
    classes: HashMap<Class, BTreeSet<Rank>>,
    eligible: HashMap<(Vec<String>, String), Vec<Class>>,
}

fn sorted(values: &[String]) -> Vec<String> {
    let mut v = values.to_vec();
    v.sort();
    v.dedup();
    v
}

/// A worker's score with `extra` running attempts counted.
pub fn score(weights: &Weights, info: &WorkerInfo, extra: u32) -> f64 {
    let running = f64::from(info.running + extra) / f64::from(info.cores.max(1));
    running * weights.running + (info.avg_duration_ms / 1000.0) * weights.duration
}

impl Fleet {
    /// An empty fleet; a worker without a heartbeat for `ttl` is dead.
    pub(crate) fn new(weights: Weights, ttl: Duration) -> Self {
        Self {
            weights,
            ttl,
            members: HashMap::new(),
            classes: HashMap::new(),
            eligible: HashMap::new(),
        }
    }

    fn rank_of(&self, info: &WorkerInfo, recent: u32) -> Rank {
        (
            Score(score(&self.weights, info, recent)),
            rand::rng().random(),
            info.id.clone(),
        )
    }

    /// A heartbeat arrived (`seen` is when, for a heartbeat replayed at start).
    pub(crate) fn heartbeat(&mut self, info: WorkerInfo, seen: Instant) {
        self.remove(&info.id.clone());
        let class = Class {
            tags: sorted(&info.tags),
            executors: sorted(&info.executors),
        };
        if !self.classes.contains_key(&class) {
            self.eligible.clear();
        }
        let rank = self.rank_of(&info, 0);
        self.classes
            .entry(class.clone())
            .or_default()
            .insert(rank.clone());
        self.members.insert(
            info.id.clone(),
            Member {
                info,
                class,
                last_seen: seen,
                recent: 0,
                rank,
            },
        );
    }

    /// Forgets a worker (its heartbeat key was deleted, or it was declared dead).
    pub(crate) fn remove(&mut self, id: &str) -> Option<WorkerInfo> {
        let member = self.members.remove(id)?;
        if let Some(set) = self.classes.get_mut(&member.class) {
            set.remove(&member.rank);
        }
        Some(member.info)
    }

    /// The best live worker for a job with `tags` and executor `kind`, other than those in
    /// `exclude`; it is counted as one attempt busier.
    pub(crate) fn pick(
        &mut self,
        tags: &[String],
        kind: &str,
        exclude: &[WorkerId],
    ) -> Option<WorkerId> {
        let key = (sorted(tags), kind.to_string());
        if !self.eligible.contains_key(&key) {
            let classes = self
                .classes
                .keys()
                .filter(|c| {
                    c.executors.iter().any(|e| e == kind)
                        && key.0.iter().all(|t| c.tags.contains(t))
                })
                .cloned()
                .collect();
            self.eligible.insert(key.clone(), classes);
        }
        let now = Instant::now();
        let mut best: Option<Rank> = None;
        for class in self.eligible.get(&key).into_iter().flatten() {
            let Some(set) = self.classes.get(class) else {
                continue;
            };
            // Skip the excluded and the silent (few: the janitor removes the dead).
            let candidate = set.iter().find(|(_, _, id)| {
                !exclude.contains(id)
                    && self
                        .members
                        .get(id)
                        .is_some_and(|m| now.duration_since(m.last_seen) < self.ttl)
            });
            if let Some(rank) = candidate {
                if best.as_ref().is_none_or(|b| rank < b) {
                    best = Some(rank.clone());
                }
            }
        }
        let (_, _, id) = best?;
        self.charge(&id);
        Some(id)
    }

    /// Whether `id` is in the registry as this Router sees it, alive or not yet judged dead.
    pub(crate) fn knows(&self, id: &str) -> bool {
        self.members.contains_key(id)
    }

    /// Whether `id` is known and its heartbeat recent.
    pub(crate) fn alive(&self, id: &str) -> bool {
        self.members
            .get(id)
            .is_some_and(|m| m.last_seen.elapsed() < self.ttl)
    }

    /// Every live worker that can run a job with `tags` and executor `kind`, sorted by id.
    pub(crate) fn eligible_all(&self, tags: &[String], kind: &str) -> Vec<WorkerId> {
        let mut ids: Vec<WorkerId> = self
            .members
            .iter()
            .filter(|(_, m)| {
                m.last_seen.elapsed() < self.ttl
                    && m.info.executors.iter().any(|e| e == kind)
                    && tags.iter().all(|t| m.info.tags.contains(t))
            })
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// Counts one more attempt sent to `id` (re-ranks it); for dispatches not chosen by
    /// [`Fleet::pick`] (pinned ones).
    pub(crate) fn charge(&mut self, id: &str) {
        let Some(member) = self.members.get_mut(id) else {
            return;
        };
        member.recent += 1;
        let rank = (
            Score(score(&self.weights, &member.info, member.recent)),
            rand::rng().random(),
            member.info.id.clone(),
        );
        let old = std::mem::replace(&mut member.rank, rank.clone());
        if let Some(set) = self.classes.get_mut(&member.class) {
            set.remove(&old);
            set.insert(rank);
        }
    }

    /// Workers whose heartbeat is older than the TTL.
    pub(crate) fn silent(&self) -> Vec<(WorkerId, WorkerInfo)> {
        let now = Instant::now();
        self.members
            .iter()
            .filter(|(_, m)| now.duration_since(m.last_seen) >= self.ttl)
            .map(|(id, m)| (id.clone(), m.info.clone()))
            .collect()
    }

    /// Counts every known worker as just seen: after this Router could not hear heartbeats
    /// (its own NATS connection was down, or it has just taken over the janitor lease), their
    /// absence proves nothing, and each gets a full TTL to be heard again.
    pub(crate) fn grant_grace(&mut self, now: Instant) {
        for member in self.members.values_mut() {
            member.last_seen = member.last_seen.max(now);
        }
    }

    /// Number of known workers.
    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// The workers whose heartbeat is recent.
    pub(crate) fn live(&self) -> Vec<WorkerId> {
        self.members
            .values()
            .filter(|m| m.last_seen.elapsed() < self.ttl)
            .map(|m| m.info.id.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: &str, tags: &[&str], running: u32, cores: u32, avg_ms: f64) -> WorkerInfo {
        WorkerInfo {
            id: WorkerId::parse(id).unwrap(),
            host: "h".into(),
            cores,
            slots: 8,
            tags: tags.iter().map(|t| t.to_string()).collect(),
            executors: vec!["shell".into(), "noop".into()],
            described: Vec::new(),
            running,
            avg_duration_ms: avg_ms,
            reserved: Default::default(),
            attempts: vec![],
            version: "t".into(),
            started_at: ax_bus::time::now(),
        }
    }

    fn fleet() -> Fleet {
        Fleet::new(Weights::default(), Duration::from_secs(10))
    }

    #[test]
    fn the_lowest_score_wins_and_tags_filter() {
        let mut fleet = fleet();
        let now = Instant::now();
        fleet.heartbeat(info("busy", &["etl"], 4, 2, 0.0), now);
        fleet.heartbeat(info("idle", &["etl"], 0, 2, 0.0), now);
        fleet.heartbeat(info("gpu", &["etl", "gpu"], 1, 2, 0.0), now);
        assert_eq!(fleet.pick(&[], "shell", &[]).as_deref(), Some("idle"));
        assert_eq!(
            fleet.pick(&["gpu".into()], "shell", &[]).as_deref(),
            Some("gpu")
        );
        assert_eq!(fleet.pick(&["etl".into()], "python", &[]), None);
        assert_eq!(fleet.pick(&["db".into()], "shell", &[]), None);
    }

    #[test]
    fn slow_workers_score_worse() {
        let w = Weights::default();
        assert!(
            score(&w, &info("a", &[], 0, 2, 5_000.0), 0)
                > score(&w, &info("b", &[], 1, 2, 100.0), 0)
        );
    }

    #[test]
    fn dispatches_spread_and_ties_break_at_random() {
        let mut fleet = fleet();
        let now = Instant::now();
        for id in ["a", "b", "c"] {
            fleet.heartbeat(info(id, &[], 0, 1, 0.0), now);
        }
        let mut counts: HashMap<WorkerId, u32> = HashMap::new();
        for _ in 0..300 {
            *counts
                .entry(fleet.pick(&[], "shell", &[]).unwrap())
                .or_default() += 1;
        }
        assert_eq!(
            counts.values().copied().collect::<BTreeSet<_>>(),
            BTreeSet::from([100])
        );
        // Among three equal workers, each is first sometimes.
        let mut firsts = BTreeSet::new();
        for _ in 0..100 {
            let mut fresh = Fleet::new(Weights::default(), Duration::from_secs(10));
            for id in ["a", "b", "c"] {
                fresh.heartbeat(info(id, &[], 0, 1, 0.0), now);
            }
            firsts.insert(fresh.pick(&[], "shell", &[]).unwrap());
        }
        assert_eq!(firsts.len(), 3);
    }

    #[test]
    fn excluded_and_silent_workers_are_passed_over() {
        let mut fleet = fleet();
        let long_ago = Instant::now() - Duration::from_secs(60);
        fleet.heartbeat(info("dead", &[], 0, 8, 0.0), long_ago);
        fleet.heartbeat(info("a", &[], 3, 1, 0.0), Instant::now());
        fleet.heartbeat(info("b", &[], 5, 1, 0.0), Instant::now());
        assert_eq!(
            fleet
                .pick(&[], "shell", &[WorkerId::parse("a").unwrap()])
                .as_deref(),
            Some("b")
        );
        assert_eq!(fleet.silent().len(), 1);
        assert!(fleet.remove("dead").is_some());
    }

    #[test]
    fn fifty_workers_pick_in_logarithmic_time() {
        let mut fleet = fleet();
        let now = Instant::now();
        for i in 0..50 {
            fleet.heartbeat(
                info(&format!("w{i}"), &[], i % 7, 4, f64::from(i) * 10.0),
                now,
            );
        }
        let started = Instant::now();
        for _ in 0..100_000 {
            fleet.pick(&[], "shell", &[]).unwrap();
        }
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
