//! Weighted fair share of the workers' free slots among namespaces.
//!
//! With one namespace there is nobody to share with, and a Router sends every attempt at once
//! (the worker's queue holds what its slots cannot run yet). Once jobs of a second namespace
//! exist, a flood of one team queued at the workers would hold every slot while another
//! team's work waits behind it; so a Router then sends a worker no more than its slots and a
//! quarter more ([`capacity`]), and holds the rest back, unacknowledged in the namespace's own
//! ready queue (`ax.internal.ready.<priority>.<namespace>`), while the [`Share`] hands each
//! freed slot to the waiting namespace with the least service per weight (stride scheduling:
//! each grant adds `1 / weight` to its namespace's pass; a namespace that starts waiting again
//! starts from the lowest pass among those waiting, so idle time banks no credit). Priorities
//! still come first: high work never waits for room here (only for its namespace's quota of
//! running attempts), normal work is granted before low.
//!
//! A Router learns of a freed slot when the worker tells it of the end
//! ([`ax_bus::messages::WorkItem::tell_end`]), else at the worker's next heartbeat; it counts
//! what it sent each worker and did not hear end of ([`Outstanding`]). With several Routers
//! each shares what it holds; the workers' heartbeats carry what the others run.
//!
//! A namespace's quota of running attempts (`--max-running`) holds its attempts the same way
//! while that many are sent and not ended: counted as what this Router has at the workers, or
//! what their heartbeats say they run of it ([`running_by_namespace`]), whichever is more.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use ax_bus::ids::{Namespace, TraceId, WorkerId};
use ax_bus::messages::{NamespaceSettings, RunningAttempt, WorkerInfo};
use ax_bus::spec::Priority;

use super::{Request, Target};

/// The most attempts a Router lets wait at or run on `worker` while namespaces share it: its
/// slots and a quarter more (at least one), so that a slot freed is taken at once while the
/// Router hears of it, and no namespace's flood queues far ahead of the others'.
pub(crate) fn capacity(worker: &WorkerInfo) -> u32 {
    let slots = worker.slots.max(1);
    slots + slots.div_ceil(4)
}

/// How many attempts of each namespace of `namespaces` a worker's heartbeat says it runs (an
/// instance id starts with its job's name, which starts with its namespace; no `default` job
/// is named like a namespace).
pub(crate) fn running_by_namespace(
    attempts: &[RunningAttempt],
    namespaces: &std::collections::BTreeSet<Namespace>,
) -> HashMap<Namespace, u32> {
    let mut counts = HashMap::new();
    for attempt in attempts {
        let id = attempt.instance_id.to_string();
        let first = id.split('.').next().unwrap_or_default();
        if let Some(namespace) = namespaces.iter().find(|n| n.as_str() == first) {
            *counts.entry(namespace.clone()).or_default() += 1;
        }
    }
    counts
}

/// An attempt waiting for a slot, and where its worker is told.
#[derive(Debug)]
pub(crate) struct Waiter {
    pub(crate) request: Request,
    pub(crate) trace: TraceId,
    pub(crate) reply: oneshot::Sender<Target>,
}

/// The namespaces' waiting attempts and their service so far.
#[derive(Debug, Default)]
pub(crate) struct Share {
    weights: HashMap<Namespace, u32>,
    /// Most attempts dispatched and running at once, where a namespace has a quota.
    quotas: HashMap<Namespace, u32>,
    pass: HashMap<Namespace, f64>,
    /// FIFO per namespace and priority.
    waiting: BTreeMap<(usize, Namespace), VecDeque<Waiter>>,
}

fn rank(priority: Priority) -> usize {
    Priority::ALL
        .iter()
        .position(|p| *p == priority)
        .unwrap_or(Priority::ALL.len())
}

impl Share {
    /// Sets `namespace`'s weight and quota (`None`: weight 1, no quota).
    pub(crate) fn set(&mut self, namespace: Namespace, settings: Option<&NamespaceSettings>) {
        self.weights.remove(&namespace);
        self.quotas.remove(&namespace);
        if let Some(settings) = settings {
            self.weights
                .insert(namespace.clone(), settings.weight.max(1));
            if let Some(most) = settings.max_running {
                self.quotas.insert(namespace, most);
            }
        }
    }

    /// `namespace`'s quota of attempts dispatched and running, if it has one.
    pub(crate) fn quota(&self, namespace: &Namespace) -> Option<u32> {
        self.quotas.get(namespace).copied()
    }

    /// Whether any namespace has a quota.
    pub(crate) fn has_quotas(&self) -> bool {
        !self.quotas.is_empty()
    }

    fn weight(&self, namespace: &Namespace) -> f64 {
        f64::from(self.weights.get(namespace).copied().unwrap_or(1))
    }

    /// Counts one slot given to `namespace`.
    pub(crate) fn charge(&mut self, namespace: &Namespace) {
        let step = 1.0 / self.weight(namespace);
        *self.pass.entry(namespace.clone()).or_default() += step;
    }

    /// Whether `namespace` has attempts waiting at `priority` (a new one waits behind them).
    pub(crate) fn waits(&self, namespace: &Namespace, priority: Priority) -> bool {
        self.waiting
            .get(&(rank(priority), namespace.clone()))
            .is_some_and(|q| !q.is_empty())
    }

    /// Whether anything waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Puts `waiter` of `namespace` in line.
    pub(crate) fn wait(&mut self, namespace: Namespace, priority: Priority, waiter: Waiter) {
        let idle = !self.waiting.keys().any(|(_, n)| *n == namespace);
        if idle {
            // Back from idle: no credit for the time it asked for nothing.
            let lowest = self
                .waiting
                .keys()
                .filter_map(|(_, n)| self.pass.get(n))
                .copied()
                .fold(f64::INFINITY, f64::min);
            if lowest.is_finite() {
                let pass = self.pass.entry(namespace.clone()).or_default();
                *pass = pass.max(lowest);
            }
        }
        self.waiting
            .entry((rank(priority), namespace))
            .or_default()
            .push_back(waiter);
    }

    /// Hands slots to the waiting attempts, higher priorities first and then the namespace
    /// with the least pass, while `place` finds a worker with room for one (`None`: none has);
    /// an attempt whose puller is gone gives its place back to the next.
    /// `place` is told the namespace's quota of running attempts, if it has one.
    pub(crate) fn grant(
        &mut self,
        mut place: impl FnMut(&Namespace, Option<u32>, &Waiter) -> Option<Target>,
    ) {
        loop {
            let mut order: Vec<(usize, f64, Namespace)> = self
                .waiting
                .keys()
                .map(|(r, n)| (*r, self.pass.get(n).copied().unwrap_or(0.0), n.clone()))
                .collect();
            order.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
            let mut granted = false;
            for (r, _, namespace) in order {
                let key = (r, namespace.clone());
                let Some(queue) = self.waiting.get_mut(&key) else {
                    continue;
                };
                let Some(head) = queue.front() else {
                    self.waiting.remove(&key);
                    continue;
                };
                if head.reply.is_closed() {
                    queue.pop_front();
                    if queue.is_empty() {
                        self.waiting.remove(&key);
                    }
                    granted = true;
                    break;
                }
                let quota = self.quotas.get(&namespace).copied();
                let Some(target) = place(&namespace, quota, head) else {
                    continue;
                };
                let Some(waiter) = queue.pop_front() else {
                    continue;
                };
                if queue.is_empty() {
                    self.waiting.remove(&key);
                }
                self.charge(&namespace);
                let _ = waiter.reply.send(target);
                granted = true;
                break;
            }
            if !granted {
                return;
            }
        }
    }
}

/// What this Router sent each worker while namespaces share it, and has not heard end of.
#[derive(Debug, Default)]
pub(crate) struct Outstanding {
    sent: HashMap<WorkerId, HashMap<TraceId, Sent>>,
}

/// One attempt sent.
#[derive(Debug)]
struct Sent {
    namespace: Namespace,
    /// When its worker acknowledged it.
    started: Option<Instant>,
    /// When it was sent.
    at: Instant,
}

/// How long after its acknowledgement an attempt a heartbeat does not list counts as ended: a
/// heartbeat written just before the attempt started may arrive after its acknowledgement, but
/// not a whole heartbeat period and more later.
const LISTED_WITHIN: Duration = Duration::from_secs(5);

/// How long a dispatch never acknowledged counts: by then the Router's acknowledgement deadline
/// (5 s by default) has handed it to a worker again under a new dispatch, perhaps another one,
/// whose acknowledgement (of the same attempt) counts it where it runs.
const UNSTARTED_WITHIN: Duration = Duration::from_secs(15);

impl Outstanding {
    /// `trace`, of `namespace`, was sent to `worker` at `now`.
    pub(crate) fn sent(
        &mut self,
        worker: &WorkerId,
        trace: TraceId,
        namespace: Namespace,
        now: Instant,
    ) {
        let sent = Sent {
            namespace,
            started: None,
            at: now,
        };
        self.sent
            .entry(worker.clone())
            .or_default()
            .insert(trace, sent);
    }

    /// `worker` acknowledged `trace` at `now`: it runs there.
    pub(crate) fn started(&mut self, worker: &WorkerId, trace: &TraceId, now: Instant) {
        if let Some(sent) = self.sent.get_mut(worker).and_then(|s| s.get_mut(trace)) {
            sent.started = Some(now);
        }
    }

    /// How many attempts of `namespace` this Router has at the workers.
    pub(crate) fn of(&self, namespace: &Namespace) -> u32 {
        let count = self
            .sent
            .values()
            .flat_map(|s| s.values())
            .filter(|s| s.namespace == *namespace)
            .count();
        u32::try_from(count).unwrap_or(u32::MAX)
    }

    /// `trace` ended on `worker`.
    pub(crate) fn ended(&mut self, worker: &WorkerId, trace: &TraceId) {
        if let Some(sent) = self.sent.get_mut(worker) {
            sent.remove(trace);
        }
    }

    /// A heartbeat of `worker` that runs `running`, heard at `now`: what it started a while
    /// ago and does not run any more ended (its end's word was lost), and what it never
    /// acknowledged for long went elsewhere (or was acknowledged unheard) and is not counted
    /// here any more unless the worker says it runs it.
    pub(crate) fn heard(&mut self, worker: &WorkerId, running: &[RunningAttempt], now: Instant) {
        let Some(sent) = self.sent.get_mut(worker) else {
            return;
        };
        let runs: HashSet<&TraceId> = running.iter().map(|a| &a.trace_id).collect();
        sent.retain(|trace, sent| {
            let since = |at: Instant| now.saturating_duration_since(at);
            let stale = match sent.started {
                Some(at) => since(at) > LISTED_WITHIN,
                None => since(sent.at) > UNSTARTED_WITHIN,
            };
            !stale || runs.contains(trace)
        });
    }

    /// `worker` is gone.
    pub(crate) fn forget(&mut self, worker: &WorkerId) {
        self.sent.remove(worker);
    }

    /// How many attempts this Router has at `worker`.
    pub(crate) fn at(&self, worker: &WorkerId) -> u32 {
        self.sent
            .get(worker)
            .map_or(0, |s| u32::try_from(s.len()).unwrap_or(u32::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ax_bus::spec::resources::Resources;

    fn ns(name: &str) -> Namespace {
        Namespace::parse(name).unwrap()
    }

    fn request() -> Request {
        Request {
            pin: None,
            tags: Vec::new(),
            kind: "shell".into(),
            resources: Resources::default(),
        }
    }

    /// `n` attempts of `namespace` wait; their receivers, to see who was granted.
    fn line_up(
        share: &mut Share,
        namespace: &str,
        priority: Priority,
        n: usize,
    ) -> Vec<oneshot::Receiver<Target>> {
        (0..n)
            .map(|_| {
                let (reply, rx) = oneshot::channel();
                let trace = TraceId::random();
                let waiter = Waiter {
                    request: request(),
                    trace,
                    reply,
                };
                share.wait(ns(namespace), priority, waiter);
                rx
            })
            .collect()
    }

    /// How many of `receivers` were granted since the last look.
    fn granted(receivers: &mut [oneshot::Receiver<Target>]) -> usize {
        receivers
            .iter_mut()
            .map(|r| r.try_recv().is_ok())
            .filter(|got| *got)
            .count()
    }

    /// One slot at a time, `slots` times.
    fn free(share: &mut Share, slots: usize) {
        for _ in 0..slots {
            let mut room = 1;
            share.grant(|_, _, _| {
                (room > 0).then(|| {
                    room -= 1;
                    Target::Worker(WorkerId::parse("w1").unwrap())
                })
            });
        }
    }

    #[test]
    fn freed_slots_go_to_namespaces_by_weight_and_one_alone_gets_them_all() {
        let mut share = Share::default();
        let heavy = NamespaceSettings {
            weight: 2,
            ..NamespaceSettings::default()
        };
        share.set(ns("a"), Some(&heavy));
        let mut a = line_up(&mut share, "a", Priority::Normal, 100);
        let mut b = line_up(&mut share, "b", Priority::Normal, 200);
        free(&mut share, 150);
        assert_eq!((granted(&mut a), granted(&mut b)), (100, 50));
        // `a` runs out; `b` alone takes every slot.
        free(&mut share, 150);
        assert_eq!((granted(&mut a), granted(&mut b)), (0, 150));
        assert!(share.is_empty());
    }

    #[test]
    fn a_namespace_back_from_idle_banks_no_credit_and_normal_goes_before_low() {
        let mut share = Share::default();
        let mut a = line_up(&mut share, "a", Priority::Normal, 100);
        free(&mut share, 60);
        assert_eq!(granted(&mut a), 60);
        // `b` comes late: it shares from now on, rather than taking 60 slots in a row.
        let mut b = line_up(&mut share, "b", Priority::Normal, 100);
        free(&mut share, 20);
        assert_eq!((granted(&mut a), granted(&mut b)), (10, 10));
        // Low work waits for the normal work of every namespace.
        let mut low = line_up(&mut share, "c", Priority::Low, 5);
        free(&mut share, 10);
        assert_eq!(granted(&mut low), 0);
        assert_eq!(granted(&mut a) + granted(&mut b), 10);
        // No room: nothing is granted, and nothing is lost.
        share.grant(|_, _, _| None);
        assert_eq!(granted(&mut a) + granted(&mut b) + granted(&mut low), 0);
        assert!(share.waits(&ns("c"), Priority::Low));
    }

    #[test]
    fn a_waiter_whose_puller_is_gone_gives_its_slot_to_the_next() {
        let mut share = Share::default();
        let gone = line_up(&mut share, "a", Priority::Normal, 1);
        let mut next = line_up(&mut share, "a", Priority::Normal, 1);
        drop(gone);
        free(&mut share, 1);
        assert_eq!(granted(&mut next), 1);
        assert!(share.is_empty());
    }

    #[test]
    fn a_heartbeats_attempts_count_by_the_namespace_their_ids_start_with() {
        let namespaces = [ns("a"), ns("b")].into_iter().collect();
        let running = |id: &str| RunningAttempt {
            instance_id: id.parse().unwrap(),
            trace_id: TraceId::random(),
            dispatch: ax_bus::ids::DispatchId::random(),
            lease_secs: None,
        };
        let attempts = [
            running("a.flood.20261207T000000Z-1"),
            running("a.other.20261207T000000Z-1"),
            running("b.flood.20261207T000000Z-1"),
            running("etl.20261207T000000Z-1"),
        ];
        let counts = running_by_namespace(&attempts, &namespaces);
        assert_eq!(counts.get(&ns("a")), Some(&2));
        assert_eq!(counts.get(&ns("b")), Some(&1));
        assert_eq!(counts.len(), 2);
    }

    #[test]
    fn what_a_router_has_at_a_worker_ends_by_word_or_by_heartbeat() {
        let w = WorkerId::parse("w1").unwrap();
        let trace = |c: char| TraceId::parse(&c.to_string().repeat(32)).unwrap();
        let mut outstanding = Outstanding::default();
        let at = Instant::now();
        for c in ['a', 'b', 'c'] {
            outstanding.sent(&w, trace(c), ns("x"), at);
        }
        outstanding.ended(&w, &trace('a'));
        assert_eq!(outstanding.at(&w), 2);
        assert_eq!((outstanding.of(&ns("x")), outstanding.of(&ns("y"))), (2, 0));
        // `b` started and its end's word was lost: the heartbeats no longer list it. One
        // heard just after it started may have been written before: it stays till a later
        // one. `c` waits at the worker unstarted: it stays, until its acknowledgement deadline
        // has long sent it elsewhere.
        outstanding.started(&w, &trace('b'), at);
        outstanding.heard(&w, &[], at + Duration::from_secs(1));
        assert_eq!(outstanding.at(&w), 2);
        outstanding.heard(&w, &[], at + Duration::from_secs(6));
        assert_eq!(outstanding.at(&w), 1);
        outstanding.heard(&w, &[], at + Duration::from_secs(16));
        assert_eq!(outstanding.at(&w), 0);
        // One the worker says it runs stays, whatever its age.
        outstanding.sent(&w, trace('d'), ns("x"), at);
        let listed = RunningAttempt {
            instance_id: "x.job.20261207T000000Z-1".parse().unwrap(),
            trace_id: trace('d'),
            dispatch: ax_bus::ids::DispatchId::random(),
            lease_secs: None,
        };
        outstanding.heard(&w, &[listed], at + Duration::from_secs(60));
        assert_eq!(outstanding.at(&w), 1);
        outstanding.forget(&w);
        assert_eq!(outstanding.at(&w), 0);
    }
}
