//! The Router's view of the workers: who is alive, what each can run, how loaded each is — and
//! the choice of a worker for an attempt in O(log n), pins, exclusions and fallback included
//! ([`Fleet::choose`]).
//!
//! A worker's score follows the Router's [`RoutingPolicy`] (`(running / usable cores) * 0.7 +
//! (avg_duration_ms / 1000) * 0.3` by default), where `running` counts its last heartbeat plus
//! what this Router sent it since. Workers are grouped into classes by what they offer (tags and
//! executor types); each class keeps its workers ordered by (score, a random draw, id), so the
//! best of a class is its first entry and equal scores are broken at random. An attempt's
//! eligible classes — those whose tags include all the job's tags and whose executors include
//! its type — are computed once per (tags, type) and cached. The clock and the random source
//! are given to the fleet, so its choices can be tested exactly.
//!
//! An attempt whose job asks for `resources` goes only to a worker that can limit them and has
//! room for them ([`ax_bus::room`]): what its heartbeat says its running attempts asked for,
//! plus what this Router sent it since. When no eligible worker has room, the choice says why
//! ([`Target::NoRoom`]), naming the request and the largest room there is.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use ax_bus::ids::WorkerId;
use ax_bus::messages::{WorkItem, WorkerInfo};
use ax_bus::room::{self, Isolation, Lack, Requested};
use ax_bus::routing::RoutingPolicy;
use ax_bus::spec::resources::Resources;

/// Where an attempt goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// This worker.
    Worker(WorkerId),
    /// Nobody can take it now.
    NoWorker,
    /// Workers could take it but none has room for its `resources` now: why.
    NoRoom(String),
    /// It may run on this worker only, and that worker is gone.
    PinnedGone(WorkerId),
}

/// What an attempt asks of the fleet: its pinned worker, if any, or the tags and the executor
/// a worker must offer.
#[derive(Clone, Debug)]
pub(crate) struct Request {
    pub(crate) pin: Option<WorkerId>,
    pub(crate) tags: Vec<String>,
    pub(crate) kind: String,
    pub(crate) resources: Resources,
}

impl Request {
    /// What `work` asks for.
    pub(crate) fn of(work: &WorkItem) -> Self {
        Self {
            pin: work.pin.clone(),
            tags: work.spec.tags.clone(),
            kind: work.spec.exec.name().to_string(),
            resources: work.spec.resources,
        }
    }
}

/// The fleet's clock (`Instant::now` in the Router).
pub(crate) type Now = Box<dyn Fn() -> Instant + Send>;

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
    /// What those asked for.
    recent_asked: Requested,
    rank: Rank,
}

impl Member {
    /// What stops an attempt asking for `resources` from going to it (`None`: it fits).
    fn lacks(&self, resources: &Resources) -> Option<Lack> {
        if resources.is_empty() {
            return None;
        }
        self.isolation().lacks(resources, self.recent_asked)
    }

    /// What stops an attempt asking for `resources` from ever running on it.
    fn never_fits(&self, resources: &Resources) -> Option<Lack> {
        self.isolation().never_fits(resources)
    }

    /// Its walls and room; a worker of a version before isolation limits nothing.
    fn isolation(&self) -> &Isolation {
        static LIMITS_NOTHING: Isolation = Isolation {
            cgroups: false,
            said: String::new(),
            limits: Vec::new(),
            memory_bytes: 0,
            cpu_millis: 0,
            requested: Requested {
                memory_bytes: 0,
                cpu_millis: 0,
            },
        };
        self.info.isolation.as_ref().unwrap_or(&LIMITS_NOTHING)
    }
}

/// The workers as this Router sees them.
pub(crate) struct Fleet {
    policy: RoutingPolicy,
    now: Now,
    draws: StdRng,
    members: HashMap<WorkerId, Member>,
    classes: HashMap<Class, BTreeSet<Rank>>,
    eligible: HashMap<(Vec<String>, String), Vec<Class>>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("policy", &self.policy)
            .field("members", &self.members)
            .finish_non_exhaustive()
    }
}

fn sorted(values: &[String]) -> Vec<String> {
    let mut v = values.to_vec();
    v.sort();
    v.dedup();
    v
}

impl Fleet {
    /// An empty fleet judging by `policy`, on the system clock, breaking ties with draws
    /// from the operating system's randomness.
    pub(crate) fn new(policy: RoutingPolicy) -> Self {
        Self::with(policy, Box::new(Instant::now), StdRng::from_os_rng())
    }

    /// An empty fleet with its clock and its random source given.
    pub(crate) fn with(policy: RoutingPolicy, now: Now, draws: StdRng) -> Self {
        Self {
            policy,
            now,
            draws,
            members: HashMap::new(),
            classes: HashMap::new(),
            eligible: HashMap::new(),
        }
    }

    fn rank_of(&mut self, info: &WorkerInfo, recent: u32) -> Rank {
        (
            Score(self.policy.score(info, recent)),
            self.draws.random(),
            info.id.clone(),
        )
    }

    fn fresh(&self, member: &Member, now: Instant) -> bool {
        self.policy
            .alive(now.saturating_duration_since(member.last_seen))
    }

    /// Where the attempt `request` goes: its pinned worker if it has one (gone: nowhere else),
    /// else the best live eligible worker with room for its resources, not `excluded` — or an
    /// excluded one when no other can take it; none with room: why. The chosen worker is
    /// charged, so the next choice sees its load and what it was sent.
    pub(crate) fn choose(&mut self, request: &Request, excluded: &[WorkerId]) -> Target {
        if let Some(worker) = &request.pin {
            if !self.alive(worker) {
                return Target::PinnedGone(worker.clone());
            }
            self.charge(worker, Requested::of(&request.resources));
            return Target::Worker(worker.clone());
        }
        let mut chosen = self.fitting(request, excluded, &|_| true);
        if chosen.is_err() && !excluded.is_empty() {
            chosen = self.fitting(request, &[], &|_| true);
        }
        match chosen {
            Ok(worker) => Target::Worker(worker),
            Err(lacks) if lacks.is_empty() => Target::NoWorker,
            Err(lacks) => Target::NoRoom(room::nowhere(&request.resources, &lacks)),
        }
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
                recent_asked: Requested::default(),
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

    /// The best live worker for a job with `tags` and executor `kind` that asks for no
    /// resources, other than those in `exclude`; it is counted as one attempt busier. (The
    /// benchmark's and the tests' way in: the Router places whole requests with
    /// [`Self::choose`].)
    #[cfg(any(test, feature = "bench"))]
    pub(crate) fn pick(
        &mut self,
        tags: &[String],
        kind: &str,
        exclude: &[WorkerId],
    ) -> Option<WorkerId> {
        let request = Request {
            pin: None,
            tags: tags.to_vec(),
            kind: kind.to_string(),
            resources: Resources::default(),
        };
        self.fitting(&request, exclude, &|_| true).ok()
    }

    /// The best live worker for `request` (not pinned) with room for its resources and below
    /// the `free` test of its heartbeat (the fair share's capacity), counted as one attempt
    /// busier; `None` when no eligible worker has room now.
    pub(crate) fn choose_with_room(
        &mut self,
        request: &Request,
        free: &dyn Fn(&WorkerInfo) -> bool,
    ) -> Option<WorkerId> {
        self.fitting(request, &[], free).ok()
    }

    /// The best live worker for `request` with room for its resources that passes `free`,
    /// other than those in `exclude`; or what each live eligible worker lacks (none: no live
    /// worker offers its tags and executor).
    fn best(
        &mut self,
        request: &Request,
        exclude: &[WorkerId],
        free: &dyn Fn(&WorkerInfo) -> bool,
    ) -> Result<WorkerId, Vec<Lack>> {
        let key = (sorted(&request.tags), request.kind.clone());
        let (tags, kind) = (&key.0, key.1.as_str());
        if !self.eligible.contains_key(&key) {
            let classes = self
                .classes
                .keys()
                .filter(|c| {
                    c.executors.iter().any(|e| e == kind) && tags.iter().all(|t| c.tags.contains(t))
                })
                .cloned()
                .collect();
            self.eligible.insert(key.clone(), classes);
        }
        let now = (self.now)();
        let mut best: Option<Rank> = None;
        let mut lacks = Vec::new();
        for class in self.eligible.get(&key).into_iter().flatten() {
            let Some(set) = self.classes.get(class) else {
                continue;
            };
            // Skip the excluded and the silent (few: the janitor removes the dead), and those
            // without room (none, for work that asks for nothing).
            let candidate = set.iter().find(|(_, _, id)| {
                let Some(member) = self.members.get(id) else {
                    return false;
                };
                if exclude.contains(id) || !self.fresh(member, now) || !free(&member.info) {
                    return false;
                }
                match member.lacks(&request.resources) {
                    None => true,
                    Some(lack) => {
                        lacks.push(lack);
                        false
                    }
                }
            });
            if let Some(rank) = candidate {
                if best.as_ref().is_none_or(|b| rank < b) {
                    best = Some(rank.clone());
                }
            }
        }
        let Some((_, _, id)) = best else {
            return Err(lacks);
        };
        Ok(id)
    }

    /// [`Self::best`], counted as one attempt busier.
    fn fitting(
        &mut self,
        request: &Request,
        exclude: &[WorkerId],
        free: &dyn Fn(&WorkerInfo) -> bool,
    ) -> Result<WorkerId, Vec<Lack>> {
        let id = self.best(request, exclude, free)?;
        self.charge(&id, Requested::of(&request.resources));
        Ok(id)
    }

    /// Where `request` goes when no live worker could ever take it now, however idle: no
    /// worker offers its tags and executor, or none has room for its resources. `None`: some
    /// could.
    pub(crate) fn unplaceable(&mut self, request: &Request) -> Option<Target> {
        match self.best(request, &[], &|_| true) {
            Ok(_) => None,
            Err(lacks) if lacks.is_empty() => Some(Target::NoWorker),
            Err(lacks) => Some(Target::NoRoom(room::nowhere(&request.resources, &lacks))),
        }
    }

    /// Whether `id` is in the registry as this Router sees it, alive or not yet judged dead.
    pub(crate) fn knows(&self, id: &str) -> bool {
        self.members.contains_key(id)
    }

    /// Whether `id` is known and its heartbeat recent.
    pub(crate) fn alive(&self, id: &str) -> bool {
        let now = (self.now)();
        self.members.get(id).is_some_and(|m| self.fresh(m, now))
    }

    /// Every live worker that can run a job with `tags`, executor `kind` and `resources`,
    /// sorted by id: one that cannot enforce a limit it sets, or offers less than it asks in
    /// all, is left out (as one without its tags); one busy now is not (the run waits there
    /// for its room). None: what those of its tags and executor lack (none at all: empty).
    pub(crate) fn eligible_all(
        &self,
        tags: &[String],
        kind: &str,
        resources: &Resources,
    ) -> Result<Vec<WorkerId>, Vec<Lack>> {
        let now = (self.now)();
        let mut lacks = Vec::new();
        let mut ids: Vec<WorkerId> = self
            .members
            .iter()
            .filter(|(_, m)| {
                self.fresh(m, now)
                    && m.info.executors.iter().any(|e| e == kind)
                    && tags.iter().all(|t| m.info.tags.contains(t))
            })
            .filter(|(_, m)| match m.never_fits(resources) {
                None => true,
                Some(lack) => {
                    lacks.push(lack);
                    false
                }
            })
            .map(|(id, _)| id.clone())
            .collect();
        if ids.is_empty() {
            return Err(lacks);
        }
        ids.sort();
        Ok(ids)
    }

    /// Counts one more attempt sent to `id`, asking for `asked` (re-ranks it).
    fn charge(&mut self, id: &str, asked: Requested) {
        let Some(member) = self.members.get_mut(id) else {
            return;
        };
        member.recent += 1;
        member.recent_asked = member.recent_asked.plus(asked);
        let rank = (
            Score(self.policy.score(&member.info, member.recent)),
            self.draws.random(),
            member.info.id.clone(),
        );
        let old = std::mem::replace(&mut member.rank, rank.clone());
        if let Some(set) = self.classes.get_mut(&member.class) {
            set.remove(&old);
            set.insert(rank);
        }
    }

    /// Workers to hand over: silent for longer than the TTL and than the lease of every
    /// attempt they said they run (a job's `lease`: until it has run out, the worker may still
    /// be running it, cut off from NATS). New attempts stop going to a worker at the TTL.
    pub(crate) fn silent(&self) -> Vec<(WorkerId, WorkerInfo)> {
        let now = (self.now)();
        self.members
            .iter()
            .filter(|(_, m)| {
                let silent_for = now.saturating_duration_since(m.last_seen);
                let lease = m.info.attempts.iter().filter_map(|a| a.lease_secs).max();
                !self.fresh(m, now)
                    && lease.is_none_or(|secs| silent_for > Duration::from_secs(secs))
            })
            .map(|(id, m)| (id.clone(), m.info.clone()))
            .collect()
    }

    /// Counts every known worker as just seen: after this Router could not hear heartbeats
    /// (its own NATS connection was down, or it has just taken over the janitor lease), their
    /// absence proves nothing, and each gets a full TTL to be heard again.
    pub(crate) fn grant_grace(&mut self) {
        let now = (self.now)();
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
        let now = (self.now)();
        self.members
            .values()
            .filter(|m| self.fresh(m, now))
            .map(|m| m.info.id.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
            budget: None,
            attempts: vec![],
            isolation: None,
            version: "t".into(),
            started_at: ax_bus::time::now(),
        }
    }

    /// A clock the test moves by hand.
    #[derive(Clone)]
    struct TestClock {
        start: Instant,
        offset_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    }

    impl TestClock {
        fn new() -> Self {
            Self {
                start: Instant::now(),
                offset_ms: Default::default(),
            }
        }

        fn now(&self) -> Instant {
            self.start
                + Duration::from_millis(self.offset_ms.load(std::sync::atomic::Ordering::SeqCst))
        }

        fn advance(&self, by: Duration) {
            self.offset_ms
                .fetch_add(by.as_millis() as u64, std::sync::atomic::Ordering::SeqCst);
        }

        fn fleet(&self, seed: u64) -> Fleet {
            let clock = self.clone();
            Fleet::with(
                RoutingPolicy::default(),
                Box::new(move || clock.now()),
                StdRng::seed_from_u64(seed),
            )
        }
    }

    fn fleet() -> Fleet {
        Fleet::new(RoutingPolicy::default())
    }

    fn request(pin: Option<&str>, tags: &[&str], kind: &str) -> Request {
        Request {
            pin: pin.map(|p| WorkerId::parse(p).unwrap()),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            kind: kind.into(),
            resources: Resources::default(),
        }
    }

    /// A worker that limits memory and CPU, offering `memory` and `cores`, of which its running
    /// attempts asked for `asked`.
    fn roomy(id: &str, memory: &str, cores: u32, asked: &str) -> WorkerInfo {
        let parse = |m: &str| ax_bus::spec::resources::Memory::parse(m).unwrap().0;
        WorkerInfo {
            isolation: Some(Isolation {
                cgroups: true,
                said: String::new(),
                limits: vec!["memory".into(), "cpu".into(), "pids".into()],
                memory_bytes: parse(memory),
                cpu_millis: cores * 1000,
                requested: Requested {
                    memory_bytes: parse(asked),
                    cpu_millis: 0,
                },
            }),
            ..info(id, &[], 0, cores, 0.0)
        }
    }

    fn asking(memory: &str) -> Request {
        Request {
            resources: Resources {
                memory: Some(ax_bus::spec::resources::Memory::parse(memory).unwrap()),
                ..Resources::default()
            },
            ..request(None, &[], "shell")
        }
    }

    #[test]
    fn work_asking_for_memory_goes_where_there_is_room_and_says_why_when_none_has() {
        let clock = TestClock::new();
        let mut fleet = clock.fleet(7);
        let now = clock.now();
        fleet.heartbeat(roomy("big", "8Gi", 4, "0"), now);
        fleet.heartbeat(roomy("small", "4Gi", 4, "2Gi"), now);
        fleet.heartbeat(info("old", &[], 0, 64, 0.0), now);
        // The old worker limits nothing: it gets work asking for nothing, never the rest.
        assert_eq!(fleet.choose(&asking("4Gi"), &[]), worker("big"));
        assert_eq!(fleet.choose(&asking("4Gi"), &[]), worker("big"));
        assert_eq!(
            fleet.choose(&asking("4Gi"), &[]),
            Target::NoRoom("no worker with 4Gi memory free; largest 2Gi".into()),
            "what this Router sent since the heartbeats counts"
        );
        assert_eq!(fleet.choose(&asking("2Gi"), &[]), worker("small"));
        // A heartbeat says what runs now: the big worker's attempts ended.
        fleet.heartbeat(roomy("big", "8Gi", 4, "0"), clock.now());
        assert_eq!(fleet.choose(&asking("8Gi"), &[]), worker("big"));
        // Larger than any worker's whole room: it waits, saying so.
        assert_eq!(
            fleet.choose(&asking("16Gi"), &[]),
            Target::NoRoom("no worker with 16Gi memory free; largest 0".into())
        );
        fleet.remove("big");
        fleet.remove("small");
        assert_eq!(
            fleet.choose(&asking("1Gi"), &[]),
            Target::NoRoom(
                "no live worker of its tags and executor can limit its memory (cgroups)".into()
            )
        );
        assert_eq!(
            fleet.choose(&request(None, &[], "shell"), &[]),
            worker("old")
        );
        assert_eq!(
            fleet.choose(&request(None, &[], "python"), &[]),
            Target::NoWorker
        );
    }

    fn worker(id: &str) -> Target {
        Target::Worker(WorkerId::parse(id).unwrap())
    }

    #[test]
    fn a_broadcast_asking_for_resources_runs_on_each_worker_that_can_ever_hold_it() {
        let clock = TestClock::new();
        let mut fleet = clock.fleet(3);
        let now = clock.now();
        fleet.heartbeat(roomy("big", "8Gi", 4, "0"), now);
        fleet.heartbeat(roomy("busy", "8Gi", 4, "7Gi"), now);
        fleet.heartbeat(roomy("small", "1Gi", 4, "0"), now);
        fleet.heartbeat(info("old", &[], 0, 64, 0.0), now);
        let ids = |resources: &Resources| -> Vec<String> {
            fleet
                .eligible_all(&[], "shell", resources)
                .unwrap_or_default()
                .into_iter()
                .map(|w| w.to_string())
                .collect()
        };
        // Asking for nothing: every worker, the one that limits nothing too.
        assert_eq!(ids(&Resources::default()), ["big", "busy", "old", "small"]);
        // 2Gi: not the worker that limits nothing, nor the one offering 1Gi in all; the busy
        // one is in (its run waits there for the room).
        assert_eq!(ids(&asking("2Gi").resources), ["big", "busy"]);
        // More than any offers: none, saying why (no executor or tags: no lack to say).
        let huge = asking("16Gi").resources;
        assert_eq!(
            fleet
                .eligible_all(&[], "shell", &huge)
                .map_err(|lacks| room::nowhere(&huge, &lacks)),
            Err("no worker with 16Gi memory free; largest 8Gi".to_string())
        );
        assert_eq!(
            fleet.eligible_all(&[], "python", &Resources::default()),
            Err(Vec::new())
        );
        let pids = Resources {
            pids: Some(64),
            ..Resources::default()
        };
        assert_eq!(ids(&pids), ["big", "busy", "small"]);
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
    fn the_policy_s_weights_decide() {
        let clock = TestClock::new();
        // Busy but quick against idle but slow: the default weights prefer the busy one
        // (2/2 * 0.7 = 0.7 against 5 s * 0.3 = 1.5); weights on load alone prefer the idle one.
        let heartbeats = |fleet: &mut Fleet| {
            fleet.heartbeat(info("busy", &[], 2, 2, 0.0), clock.now());
            fleet.heartbeat(info("slow", &[], 0, 2, 5_000.0), clock.now());
        };
        let mut default = clock.fleet(1);
        heartbeats(&mut default);
        assert_eq!(
            default.choose(&request(None, &[], "shell"), &[]),
            worker("busy")
        );
        let load_only = ax_bus::routing::Weights {
            running: 1.0,
            duration: 0.0,
        };
        let ticking = clock.clone();
        let mut by_load = Fleet::with(
            RoutingPolicy::new(load_only, Duration::from_secs(10)),
            Box::new(move || ticking.now()),
            StdRng::seed_from_u64(1),
        );
        heartbeats(&mut by_load);
        assert_eq!(
            by_load.choose(&request(None, &[], "shell"), &[]),
            worker("slow")
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
        // Among three equal workers, each is first for some seed; the same seed, the same one.
        let clock = TestClock::new();
        let first = |seed: u64| {
            let mut fresh = clock.fleet(seed);
            for id in ["a", "b", "c"] {
                fresh.heartbeat(info(id, &[], 0, 1, 0.0), clock.now());
            }
            fresh.pick(&[], "shell", &[]).unwrap()
        };
        let firsts: BTreeSet<WorkerId> = (0..100).map(first).collect();
        assert_eq!(firsts.len(), 3);
        assert_eq!(first(42), first(42));
    }

    #[test]
    fn excluded_and_silent_workers_are_passed_over() {
        let clock = TestClock::new();
        let mut fleet = clock.fleet(7);
        fleet.heartbeat(info("dead", &[], 0, 8, 0.0), clock.now());
        clock.advance(Duration::from_secs(9));
        fleet.heartbeat(info("a", &[], 3, 1, 0.0), clock.now());
        fleet.heartbeat(info("b", &[], 5, 1, 0.0), clock.now());
        // "dead" is the best score and still within its TTL of 10 s.
        assert_eq!(
            fleet.choose(&request(None, &[], "shell"), &[]),
            worker("dead")
        );
        clock.advance(Duration::from_secs(1));
        // Now it is silent: passed over, listed as silent, not alive.
        let a = WorkerId::parse("a").unwrap();
        assert_eq!(
            fleet.choose(&request(None, &[], "shell"), std::slice::from_ref(&a)),
            worker("b")
        );
        assert_eq!(fleet.silent().len(), 1);
        assert!(!fleet.alive("dead"));
        assert_eq!(fleet.live().len(), 2);
        assert!(fleet.remove("dead").is_some());
    }

    #[test]
    fn a_worker_running_a_leased_attempt_is_handed_over_only_once_the_lease_ran_out() {
        let clock = TestClock::new();
        let mut fleet = clock.fleet(5);
        let mut leased = info("leased", &[], 1, 1, 0.0);
        leased.attempts.push(ax_bus::messages::RunningAttempt {
            instance_id: ax_bus::ids::InstanceId::parse("j.20260101T000000000Z").unwrap(),
            trace_id: ax_bus::ids::TraceId::random(),
            dispatch: ax_bus::ids::DispatchId::random(),
            lease_secs: Some(60),
        });
        fleet.heartbeat(leased, clock.now());
        fleet.heartbeat(info("plain", &[], 0, 1, 0.0), clock.now());
        clock.advance(Duration::from_secs(11));
        // Both past the TTL: no new attempt goes to either, only the one without a lease is
        // handed over.
        assert!(!fleet.alive("leased") && !fleet.alive("plain"));
        let silent: Vec<String> = fleet
            .silent()
            .into_iter()
            .map(|(id, _)| id.to_string())
            .collect();
        assert_eq!(silent, ["plain"]);
        clock.advance(Duration::from_secs(49));
        assert_eq!(fleet.silent().len(), 1, "60 s are not over yet");
        clock.advance(Duration::from_secs(1));
        assert_eq!(fleet.silent().len(), 2);
    }

    #[test]
    fn a_pin_goes_to_its_worker_or_nowhere() {
        let clock = TestClock::new();
        let mut fleet = clock.fleet(3);
        fleet.heartbeat(info("a", &[], 0, 1, 0.0), clock.now());
        fleet.heartbeat(info("pinned", &["gpu"], 9, 1, 0.0), clock.now());
        // Pinned: its worker whatever its load, tags and exclusions, and charged for it.
        let pinned = WorkerId::parse("pinned").unwrap();
        assert_eq!(
            fleet.choose(
                &request(Some("pinned"), &[], "shell"),
                std::slice::from_ref(&pinned)
            ),
            worker("pinned")
        );
        assert_eq!(fleet.members["pinned"].recent, 1);
        // Its worker silent: gone, never another worker.
        clock.advance(Duration::from_secs(10));
        fleet.heartbeat(info("a", &[], 0, 1, 0.0), clock.now());
        assert_eq!(
            fleet.choose(&request(Some("pinned"), &[], "shell"), &[]),
            Target::PinnedGone(pinned)
        );
        // Unknown: gone too.
        assert_eq!(
            fleet.choose(&request(Some("ghost"), &[], "shell"), &[]),
            Target::PinnedGone(WorkerId::parse("ghost").unwrap())
        );
    }

    #[test]
    fn an_excluded_worker_is_taken_when_no_other_can_and_nobody_is_no_worker() {
        let clock = TestClock::new();
        let mut fleet = clock.fleet(5);
        fleet.heartbeat(info("only", &["etl"], 0, 1, 0.0), clock.now());
        fleet.heartbeat(info("other", &[], 0, 1, 0.0), clock.now());
        let only = WorkerId::parse("only").unwrap();
        // The only worker with the tag was excluded (it did not acknowledge in time): better
        // it again than nobody.
        assert_eq!(
            fleet.choose(
                &request(None, &["etl"], "shell"),
                std::slice::from_ref(&only)
            ),
            worker("only")
        );
        assert_eq!(
            fleet.choose(&request(None, &["gpu"], "shell"), &[]),
            Target::NoWorker
        );
        assert_eq!(
            fleet.choose(&request(None, &[], "python"), &[]),
            Target::NoWorker
        );
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
