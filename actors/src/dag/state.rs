//! The DagCoordinator's view: pure data, told what happened, answering with what to do.
//!
//! It knows, for every (job, business date), the latest attempt and state of each instance, and
//! holds the instances that wait: for their dependencies (*same job + same business date +
//! success*, never "the latest run") or for an instance they are queued behind (a gate). An
//! instance is released when every condition is met, and ends `cancelled` (`upstream_failed`)
//! when an upstream for its date has ended without success — which, published as a result,
//! cascades further down. Jobs without a cron get their instance for a date as soon as an
//! upstream instance appears for it, so the whole chain is visible while it waits.
//!
//! Each change of a (job, date) re-evaluates only the conditions that name it (an index from
//! (job, date) to waiting instances): no rescans of jobs or instances.
//!
//! It holds the days of the jobs a decision can name ([`DagState::follows`]: upstreams,
//! downstreams, jobs that queue behind their previous instance), not of every job: the others'
//! instances are only saved in the deps bucket (for the re-run planner). A leader taking over
//! reads those jobs' recent days ([`DagState::restore`]); any other day — older or later, or
//! of a job that started to count since — is read when a wait first names it
//! ([`Action::ReadDays`], [`DagState::merge_days`]), and until it is in, what waits on it
//! waits. So its memory and its start grow with the DAG's recent work, not with all the work
//! of a deployment.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Duration, NaiveDate, Utc};

use ax_bus::ids::{InstanceId, JobName};
use ax_bus::instance::{State, Tag};
use ax_bus::messages::{DateInstances, ResultMessage, Waiting, WorkItem};
use ax_bus::spec::dataset::DatasetUri;
use ax_bus::spec::{JobSpec, Overlap};

pub(crate) use ax_bus::client::deps::DayKey;

/// What the coordinator must do.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Action {
    /// Read these days as stored and hand them to [`DagState::merge_days`]: a wait names them
    /// and the view does not hold them whole.
    ReadDays(Vec<DayKey>),
    /// Store how an instance of a (job, date) stands (see [`ax_bus::client::deps`]).
    SaveEntry {
        /// The job.
        job: JobName,
        /// The date.
        date: NaiveDate,
        /// The instance.
        instance_id: InstanceId,
        /// Its latest attempt.
        attempt: u32,
        /// That attempt's state.
        state: State,
    },
    /// Note in the deps bucket that `job` has instances of `date`, once, for a job no decision
    /// names: the re-run planner reads those instances from their records (see
    /// [`ax_bus::client::deps`]).
    NoteDay {
        /// The job.
        job: JobName,
        /// The date.
        date: NaiveDate,
    },
    /// Store a waiting instance and tag its record `waiting_deps`.
    Hold {
        /// The attempt.
        work: WorkItem,
        /// Since when it waits.
        since: DateTime<Utc>,
        /// What it waits for, for humans.
        reason: String,
    },
    /// Say in a held instance's record what it still waits for (something it waited for came).
    Note {
        /// The attempt.
        work: WorkItem,
        /// What it still waits for, for humans.
        reason: String,
    },
    /// Send the attempt to the Router (and forget it if it was held).
    Release {
        /// The attempt.
        work: WorkItem,
        /// Whether it was stored as waiting.
        held: bool,
    },
    /// End the instance without running it.
    End {
        /// The attempt.
        work: WorkItem,
        /// `cancelled` or `failed`.
        state: State,
        /// `upstream_failed` or `deps_timeout`.
        tag: Tag,
        /// Why, naming the upstream.
        message: String,
        /// Whether it was stored as waiting.
        held: bool,
    },
    /// Forget a stored waiting instance (it ended by other means).
    Forget {
        /// Its id.
        instance_id: InstanceId,
    },
    /// Store an instance split into sub-instances, waiting for them to end.
    HoldSplit {
        /// The parent attempt.
        work: WorkItem,
        /// Its children.
        children: Vec<InstanceId>,
    },
    /// Create the instance of a job without cron for a date.
    Create {
        /// The job.
        spec: Arc<JobSpec>,
        /// The date.
        date: NaiveDate,
    },
    /// Store that an instance's success updated its job's datasets for its business date.
    Updated(Vec<ax_bus::client::datasets::DatasetUpdate>),
}

#[derive(Clone, Debug)]
enum Condition {
    Succeeded {
        job: JobName,
        date: NaiveDate,
    },
    Ended {
        instance_id: InstanceId,
        job: JobName,
        date: NaiveDate,
    },
}

impl Condition {
    fn key(&self) -> DayKey {
        match self {
            Condition::Succeeded { job, date } | Condition::Ended { job, date, .. } => {
                (job.clone(), *date)
            }
        }
    }
}

enum Verdict {
    Met,
    Pending(String),
    Failed(String),
}

#[derive(Debug)]
struct Held {
    work: WorkItem,
    conditions: Vec<Condition>,
    deadline: Option<DateTime<Utc>>,
    /// What its record says it waits for.
    reason: String,
}

/// A parent instance waiting for its shards; a child's state is known once it ended.
#[derive(Debug)]
struct Join {
    parent: WorkItem,
    children: HashMap<InstanceId, Option<State>>,
}

/// The coordinator's state.
#[derive(Debug, Default)]
pub(crate) struct DagState {
    jobs: HashMap<JobName, Arc<JobSpec>>,
    dependents: HashMap<JobName, Vec<(JobName, i64)>>,
    /// The jobs run by their data (`on_datasets`, with a cron or without), by each of their
    /// inputs.
    readers: HashMap<DatasetUri, Vec<JobName>>,
    days: HashMap<DayKey, DateInstances>,
    /// When each (job, date) last changed: history untouched for `keep_days` is forgotten, like
    /// the deps bucket forgets keys not written for that long (whatever the date itself is, so a
    /// backfill of last year keeps its state while it runs).
    touched: HashMap<DayKey, DateTime<Utc>>,
    held: HashMap<InstanceId, Held>,
    watchers: HashMap<DayKey, HashSet<InstanceId>>,
    requested: HashSet<DayKey>,
    joins: HashMap<InstanceId, Join>,
    /// Shard results that arrived before their parent's split plan.
    early: HashMap<InstanceId, HashMap<InstanceId, State>>,
    /// The jobs whose days within `recent` were read when the view was built.
    restored: HashSet<JobName>,
    /// The dates read for them then (none: the view was not restored, and knows everything).
    recent: Option<std::ops::RangeInclusive<NaiveDate>>,
    /// Other days read since, and days being read.
    read: HashSet<DayKey>,
    reading: HashSet<DayKey>,
    /// The days of jobs no decision names that this view noted in the deps bucket (forgotten
    /// past [`NOTED_HELD`]: a day noted again is written again, to the same effect).
    noted: HashSet<DayKey>,
}

/// The most days [`DagState::noted`] holds.
const NOTED_HELD: usize = 100_000;

impl DagState {
    /// An empty view.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The jobs run by their data (`on_datasets`) that `uri` is one of the inputs of.
    pub(crate) fn run_by(&self, uri: &DatasetUri) -> Vec<Arc<JobSpec>> {
        self.readers
            .get(uri)
            .into_iter()
            .flatten()
            .filter_map(|name| self.jobs.get(name).cloned())
            .collect()
    }

    /// Instances waiting now.
    pub(crate) fn held_count(&self) -> usize {
        self.held.len()
    }

    /// How many (job, date) days it holds.
    pub(crate) fn days_count(&self) -> usize {
        self.days.len()
    }

    /// Whether the days of `job` can matter to a decision: something depends on it, it
    /// depends on something, or its instances queue behind their previous one.
    pub(crate) fn follows(&self, job: &JobName) -> bool {
        self.dependents.get(job).is_some_and(|d| !d.is_empty())
            || self
                .jobs
                .get(job)
                .is_some_and(|spec| !spec.deps.is_empty() || spec.overlap == Overlap::Queue)
    }

    /// The jobs whose days it holds (see [`DagState::follows`]).
    pub(crate) fn followed(&self) -> Vec<JobName> {
        let mut jobs: Vec<JobName> = self
            .jobs
            .keys()
            .chain(self.dependents.keys())
            .filter(|job| self.follows(job))
            .cloned()
            .collect();
        jobs.sort();
        jobs.dedup();
        jobs
    }

    /// Whether the view holds every stored instance of `key` (its day was read, or it saw
    /// it whole): else a decision must not be taken on it. A view not restored from a store
    /// (a new one) has seen everything.
    fn known(&self, key: &DayKey) -> bool {
        self.read.contains(key)
            || self
                .recent
                .as_ref()
                .is_none_or(|dates| self.restored.contains(&key.0) && dates.contains(&key.1))
    }

    /// Adds or replaces a job of the registry.
    pub(crate) fn upsert_job(&mut self, spec: JobSpec) {
        self.remove_job(&spec.name.clone());
        for dep in &spec.deps {
            if let Ok(offset) = dep.offset_days() {
                self.dependents
                    .entry(dep.name.clone())
                    .or_default()
                    .push((spec.name.clone(), offset));
            }
        }
        for uri in &spec.on_datasets {
            self.readers
                .entry(uri.clone())
                .or_default()
                .push(spec.name.clone());
        }
        self.jobs.insert(spec.name.clone(), Arc::new(spec));
    }

    /// Removes a job of the registry.
    pub(crate) fn remove_job(&mut self, name: &str) {
        if let Some(old) = self.jobs.remove(name) {
            for dep in &old.deps {
                if let Some(list) = self.dependents.get_mut(&dep.name) {
                    list.retain(|(downstream, _)| downstream != name);
                }
            }
            for uri in &old.on_datasets {
                if let Some(list) = self.readers.get_mut(uri) {
                    list.retain(|reader| reader != name);
                }
            }
        }
    }

    /// The days `keys` as stored ([`Action::ReadDays`]; `days` holds those with entries):
    /// now known, a stored entry taken by the same rule as a live one ([`supersedes`]), so it
    /// never undoes what the view saw meanwhile; what waits on them is decided again.
    pub(crate) fn merge_days(
        &mut self,
        keys: Vec<DayKey>,
        mut days: std::collections::BTreeMap<DayKey, DateInstances>,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        for key in keys {
            self.reading.remove(&key);
            self.read.insert(key.clone());
            self.touched.entry(key.clone()).or_insert(now);
            let day = self.days.entry(key.clone()).or_default();
            for (instance, (attempt, state)) in days.remove(&key).unwrap_or_default().instances {
                if supersedes(day.instances.get(&instance), attempt, state) {
                    day.instances.insert(instance, (attempt, state));
                }
            }
            self.reevaluate(&key, &mut actions);
        }
        actions
    }

    /// Loads stored state (after winning the lead): the days of every job followed for the
    /// dates `recent` (the others are read when a wait names them), the waits; decides what
    /// stored waits can end now.
    pub(crate) fn restore(
        &mut self,
        recent: std::ops::RangeInclusive<NaiveDate>,
        days: Vec<(DayKey, DateInstances)>,
        waiting: Vec<Waiting>,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        self.restored = self.followed().into_iter().collect();
        self.recent = Some(recent);
        for (key, day) in days {
            self.touched.insert(key.clone(), now);
            self.days.insert(key, day);
        }
        let mut actions = Vec::new();
        for entry in waiting {
            if let Some(date) = ax_bus::time::parse_biz_date(&entry.work.biz_date) {
                self.hold(entry.work, date, entry.since, now, true, &mut actions);
            }
        }
        actions
    }

    /// A new attempt exists (first attempt, re-run, or an instance created here).
    pub(crate) fn on_created(&mut self, work: WorkItem, now: DateTime<Utc>) -> Vec<Action> {
        let mut actions = Vec::new();
        let Some(date) = ax_bus::time::parse_biz_date(&work.biz_date) else {
            actions.push(Action::Release { work, held: false });
            return actions;
        };
        if let Some(held) = self.held.get(&work.instance_id) {
            if held.work.trace_id == work.trace_id {
                return actions; // a repeated delivery of what is held already
            }
        }
        let job = work.job().clone();
        self.note(
            (job.clone(), date),
            &work.instance_id,
            work.attempt,
            State::Running,
            now,
            &mut actions,
        );
        self.create_dependents(&job, date, now, &mut actions);
        let replaced = self.unhold(&work.instance_id).is_some();
        self.hold(work, date, now, now, replaced, &mut actions);
        actions
    }

    /// The Router split `parent` into `children`: the parent ends once they all have.
    pub(crate) fn on_split(&mut self, parent: WorkItem, children: Vec<InstanceId>) -> Vec<Action> {
        if self.joins.contains_key(&parent.instance_id) {
            return Vec::new();
        }
        let mut actions = vec![Action::HoldSplit {
            work: parent.clone(),
            children: children.clone(),
        }];
        let early = self.early.remove(&parent.instance_id).unwrap_or_default();
        let join = Join {
            children: children
                .into_iter()
                .map(|c| {
                    let state = early.get(&c).copied();
                    (c, state)
                })
                .collect(),
            parent,
        };
        self.join(join, &mut actions);
        actions
    }

    /// A stored split, as restored after a restart, with what its children's records say.
    pub(crate) fn restore_split(
        &mut self,
        parent: WorkItem,
        children: Vec<(InstanceId, Option<State>)>,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let join = Join {
            parent,
            children: children.into_iter().collect(),
        };
        self.join(join, &mut actions);
        actions
    }

    /// Keeps `join` unless all its children ended; then ends the parent.
    fn join(&mut self, join: Join, actions: &mut Vec<Action>) {
        if join.children.values().any(Option::is_none) {
            self.joins.insert(join.parent.instance_id.clone(), join);
            return;
        }
        let total = join.children.len();
        let mut failed: Vec<&InstanceId> = join
            .children
            .iter()
            .filter(|(_, s)| **s != Some(State::Success))
            .map(|(id, _)| id)
            .collect();
        failed.sort();
        let (state, tag, message) = if failed.is_empty() {
            (
                State::Success,
                Tag::Completed,
                format!("all {total} succeeded"),
            )
        } else {
            let names: Vec<&str> = failed.iter().map(|s| s.as_str()).collect();
            (
                State::Failed,
                Tag::ShardsFailed,
                format!(
                    "{} of {total} did not succeed: {}",
                    failed.len(),
                    names.join(", ")
                ),
            )
        };
        actions.push(Action::End {
            work: join.parent,
            state,
            tag,
            message,
            held: true,
        });
    }

    fn on_child(
        &mut self,
        parent: &InstanceId,
        child: &InstanceId,
        state: State,
        actions: &mut Vec<Action>,
    ) {
        let ended = state.is_final().then_some(state);
        match self.joins.remove(parent) {
            Some(mut join) => {
                if let Some(slot) = join.children.get_mut(child) {
                    *slot = ended;
                }
                self.join(join, actions);
            }
            None => {
                if let Some(state) = ended {
                    self.early
                        .entry(parent.clone())
                        .or_default()
                        .insert(child.clone(), state);
                }
            }
        }
    }

    /// An attempt ended (or moved to `waiting_retry`), as published on `ax.result.<job>`.
    pub(crate) fn on_result(&mut self, result: &ResultMessage, now: DateTime<Utc>) -> Vec<Action> {
        let mut actions = Vec::new();
        if let Some(shard) = &result.shard {
            // A shard is not an instance of its job for dependencies: it only counts for its
            // parent.
            self.on_child(
                &shard.parent,
                &result.instance_id,
                result.state,
                &mut actions,
            );
            return actions;
        }
        let Some(date) = ax_bus::time::parse_biz_date(&result.biz_date) else {
            return actions;
        };
        if let Some(updated) = self.datasets_updated(result) {
            actions.push(updated);
        }
        let superseded = self
            .held
            .get(&result.instance_id)
            .is_some_and(|h| result.state.is_final() && result.attempt >= h.work.attempt);
        if superseded {
            self.unhold(&result.instance_id);
            actions.push(Action::Forget {
                instance_id: result.instance_id.clone(),
            });
        }
        self.note(
            (result.job.clone(), date),
            &result.instance_id,
            result.attempt,
            result.state,
            now,
            &mut actions,
        );
        actions
    }

    /// The datasets a successful instance updated: those its output names (see
    /// [`ax_bus::spec::dataset::named_in`]), else those its job declares it `produces`, for its
    /// business date.
    fn datasets_updated(&self, result: &ResultMessage) -> Option<Action> {
        if result.state != State::Success {
            return None;
        }
        let named = ax_bus::spec::dataset::named_in(&result.output, &result.biz_date);
        let updated: Vec<(ax_bus::spec::dataset::DatasetUri, String)> = match named {
            Some(named) => named,
            None => self
                .jobs
                .get(&result.job)?
                .produces
                .iter()
                .map(|uri| (uri.clone(), result.biz_date.clone()))
                .collect(),
        };
        if updated.is_empty() {
            return None;
        }
        Some(Action::Updated(
            updated
                .into_iter()
                .map(
                    |(dataset, biz_date)| ax_bus::client::datasets::DatasetUpdate {
                        dataset,
                        biz_date,
                        job: result.job.clone(),
                        instance_id: result.instance_id.clone(),
                        attempt: result.attempt,
                        at: result.finished_at,
                    },
                )
                .collect(),
        ))
    }

    /// Ends the waits that outlived their `deps_timeout`, and forgets (job, date) entries that
    /// nothing waits on and that have not changed for `keep_days`.
    pub(crate) fn expire(&mut self, now: DateTime<Utc>, keep_days: i64) -> Vec<Action> {
        let mut actions = Vec::new();
        let due: Vec<InstanceId> = self
            .held
            .iter()
            .filter(|(_, h)| h.deadline.is_some_and(|d| d <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            if let Some(held) = self.unhold(&id) {
                let reason = self.describe_pending(&held).unwrap_or_default();
                let seconds = held.work.spec.deps_timeout.unwrap_or_default();
                actions.push(Action::End {
                    work: held.work,
                    state: State::Failed,
                    tag: Tag::DepsTimeout,
                    message: format!("waited more than {seconds}s: {reason}"),
                    held: true,
                });
            }
        }
        let stale = now - Duration::days(keep_days);
        let forget: Vec<DayKey> = self
            .touched
            .iter()
            .filter(|(key, at)| **at < stale && !self.watchers.contains_key(*key))
            .map(|(key, _)| key.clone())
            .collect();
        for key in forget {
            self.touched.remove(&key);
            self.days.remove(&key);
            self.requested.remove(&key);
            self.read.remove(&key);
        }
        actions
    }

    fn note(
        &mut self,
        key: DayKey,
        instance_id: &InstanceId,
        attempt: u32,
        state: State,
        now: DateTime<Utc>,
        actions: &mut Vec<Action>,
    ) {
        let (job, date) = (key.0.clone(), key.1);
        if !self.follows(&job) && !self.watchers.contains_key(&key) {
            // No decision names its days: the re-run planner finds its instances by their
            // records, from a note of the day.
            if self.noted.len() >= NOTED_HELD {
                self.noted.clear();
            }
            if self.noted.insert(key) {
                actions.push(Action::NoteDay { job, date });
            }
            return;
        }
        self.touched.insert(key.clone(), now);
        let day = self.days.entry(key.clone()).or_default();
        if !supersedes(day.instances.get(instance_id), attempt, state) {
            return;
        }
        day.instances.insert(instance_id.clone(), (attempt, state));
        actions.push(Action::SaveEntry {
            job,
            date,
            instance_id: instance_id.clone(),
            attempt,
            state,
        });
        self.reevaluate(&key, actions);
    }

    fn create_dependents(
        &mut self,
        job: &JobName,
        date: NaiveDate,
        now: DateTime<Utc>,
        actions: &mut Vec<Action>,
    ) {
        let Some(dependents) = self.dependents.get(job) else {
            return;
        };
        for (downstream, offset) in dependents {
            let Some(spec) = self.jobs.get(downstream) else {
                continue;
            };
            if spec.cron.is_some() {
                continue;
            }
            let target = date - Duration::days(*offset);
            let key = (downstream.clone(), target);
            let known = self.days.get(&key).is_some_and(|d| !d.instances.is_empty());
            if !known && self.requested.insert(key.clone()) {
                self.touched.entry(key).or_insert(now);
                actions.push(Action::Create {
                    spec: spec.clone(),
                    date: target,
                });
            }
        }
    }

    fn conditions_of(work: &WorkItem, date: NaiveDate) -> Vec<Condition> {
        let mut conditions: Vec<Condition> = work
            .spec
            .deps
            .iter()
            .filter_map(|dep| {
                let offset = dep.offset_days().ok()?;
                Some(Condition::Succeeded {
                    job: dep.name.clone(),
                    date: date + Duration::days(offset),
                })
            })
            .collect();
        if let Some(gate) = &work.gate {
            if let Some(gate_date) = ax_bus::time::parse_biz_date(&gate.biz_date) {
                conditions.push(Condition::Ended {
                    instance_id: gate.instance_id.clone(),
                    job: gate.job.clone(),
                    date: gate_date,
                });
            }
        }
        conditions
    }

    /// Holds `work` until its conditions are met, or ends or releases it at once.
    fn hold(
        &mut self,
        work: WorkItem,
        date: NaiveDate,
        since: DateTime<Utc>,
        now: DateTime<Utc>,
        stored: bool,
        actions: &mut Vec<Action>,
    ) {
        let conditions = Self::conditions_of(&work, date);
        let deadline = work
            .spec
            .deps_timeout
            .filter(|_| !work.spec.deps.is_empty())
            .map(|s| {
                // Bounded at apply; a record from before the bound still cannot overflow.
                let wait = s.min(ax_bus::spec::MAX_DEPS_TIMEOUT_SECS) as i64;
                since
                    .checked_add_signed(Duration::seconds(wait))
                    .unwrap_or(DateTime::<Utc>::MAX_UTC)
            });
        let unread: Vec<DayKey> = conditions
            .iter()
            .map(Condition::key)
            .filter(|key| !self.known(key) && !self.reading.contains(key))
            .collect();
        if !unread.is_empty() {
            self.reading.extend(unread.iter().cloned());
            actions.push(Action::ReadDays(unread));
        }
        let mut held = Held {
            work,
            conditions,
            deadline,
            reason: String::new(),
        };
        match self.verdict(&held) {
            Verdict::Met => actions.push(Action::Release {
                work: held.work,
                held: stored,
            }),
            Verdict::Failed(message) => actions.push(Action::End {
                work: held.work,
                state: State::Cancelled,
                tag: Tag::UpstreamFailed,
                message,
                held: stored,
            }),
            Verdict::Pending(reason) => {
                // The record is tagged `waiting_deps` now: the copy it came with is stale.
                held.work.stored = None;
                held.reason = reason.clone();
                if held.deadline.is_some_and(|d| d <= now) {
                    let seconds = held.work.spec.deps_timeout.unwrap_or_default();
                    actions.push(Action::End {
                        work: held.work,
                        state: State::Failed,
                        tag: Tag::DepsTimeout,
                        message: format!("waited more than {seconds}s: {reason}"),
                        held: stored,
                    });
                    return;
                }
                if !stored {
                    actions.push(Action::Hold {
                        work: held.work.clone(),
                        since,
                        reason,
                    });
                }
                let id = held.work.instance_id.clone();
                for condition in &held.conditions {
                    self.watchers
                        .entry(condition.key())
                        .or_default()
                        .insert(id.clone());
                }
                self.held.insert(id, held);
            }
        }
    }

    fn unhold(&mut self, instance_id: &InstanceId) -> Option<Held> {
        let held = self.held.remove(instance_id)?;
        for condition in &held.conditions {
            let key = condition.key();
            if let Some(set) = self.watchers.get_mut(&key) {
                set.remove(instance_id);
                if set.is_empty() {
                    self.watchers.remove(&key);
                }
            }
        }
        Some(held)
    }

    fn reevaluate(&mut self, key: &DayKey, actions: &mut Vec<Action>) {
        let Some(ids) = self.watchers.get(key).cloned() else {
            return;
        };
        for id in ids {
            let verdict = match self.held.get(&id) {
                Some(held) => self.verdict(held),
                None => continue,
            };
            match verdict {
                Verdict::Pending(reason) => {
                    // One of several dependencies met: the record names what is still missing.
                    if let Some(held) = self.held.get_mut(&id) {
                        if held.reason != reason {
                            held.reason = reason.clone();
                            actions.push(Action::Note {
                                work: held.work.clone(),
                                reason,
                            });
                        }
                    }
                }
                Verdict::Met => {
                    if let Some(held) = self.unhold(&id) {
                        actions.push(Action::Release {
                            work: held.work,
                            held: true,
                        });
                    }
                }
                Verdict::Failed(message) => {
                    if let Some(held) = self.unhold(&id) {
                        actions.push(Action::End {
                            work: held.work,
                            state: State::Cancelled,
                            tag: Tag::UpstreamFailed,
                            message,
                            held: true,
                        });
                    }
                }
            }
        }
    }

    fn verdict(&self, held: &Held) -> Verdict {
        let mut pending = Vec::new();
        for condition in &held.conditions {
            if !self.known(&condition.key()) {
                // Being read: nothing is decided on part of a day.
                pending.push(match condition {
                    Condition::Succeeded { job, date } => format!("`{job}` for {date}"),
                    Condition::Ended { instance_id, .. } => format!("{instance_id} to end"),
                });
                continue;
            }
            match condition {
                Condition::Succeeded { job, date } => {
                    let day = self.days.get(&(job.clone(), *date));
                    let states: Vec<State> = day
                        .map(|d| d.instances.values().map(|(_, s)| *s).collect())
                        .unwrap_or_default();
                    if states.contains(&State::Success) {
                        continue;
                    }
                    if !states.is_empty() && states.iter().all(|s| s.is_final()) {
                        let how = if states.contains(&State::Failed) {
                            "failed"
                        } else {
                            "was cancelled"
                        };
                        return Verdict::Failed(format!("upstream `{job}` for {date} {how}"));
                    }
                    pending.push(format!("`{job}` for {date}"));
                }
                Condition::Ended {
                    instance_id,
                    job,
                    date,
                } => {
                    let running = self
                        .days
                        .get(&(job.clone(), *date))
                        .and_then(|d| d.instances.get(instance_id))
                        .is_some_and(|(_, s)| !s.is_final());
                    if running {
                        pending.push(format!("{instance_id} to end"));
                    }
                }
            }
        }
        if pending.is_empty() {
            Verdict::Met
        } else {
            Verdict::Pending(format!("waiting for {}", pending.join(", ")))
        }
    }

    fn describe_pending(&self, held: &Held) -> Option<String> {
        match self.verdict(held) {
            Verdict::Pending(reason) => Some(reason),
            _ => None,
        }
    }
}

/// Whether an instance's (`attempt`, `state`) replaces what is known of it: a later attempt
/// wins; within an attempt, an end is never undone by a late repeat of its start.
fn supersedes(known: Option<&(u32, State)>, attempt: u32, state: State) -> bool {
    match known {
        None => true,
        Some((old_attempt, old_state)) => {
            let undoes_an_end = old_state.is_final() && !state.is_final();
            attempt > *old_attempt
                || (attempt == *old_attempt && *old_state != state && !undoes_an_end)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::spec;
    use ax_bus::ids::{TraceId, WorkerId};
    use ax_bus::instance::{AttemptEnd, Tag};
    use ax_bus::messages::Gate;

    fn work(spec: &JobSpec, date: &str, attempt: u32) -> WorkItem {
        WorkItem {
            attempt,
            ..WorkItem::first(
                id(&format!("{}.{date}", spec.name)),
                TraceId::first_of(&id(&format!("{}.{date}.{attempt}", spec.name))),
                date,
                spec.clone(),
            )
        }
    }

    fn result(work: &WorkItem, state: State) -> ResultMessage {
        let end = AttemptEnd::new(
            work.trace_id.clone(),
            WorkerId::parse("w").unwrap(),
            state == State::Success,
            Tag::Completed,
            ax_bus::time::now(),
        );
        ResultMessage::new(work, &end, state, None)
    }

    /// What `work`'s result in `state` releases.
    fn released_by(dag: &mut DagState, work: &WorkItem, state: State) -> Vec<String> {
        released(&dag.on_result(&result(work, state), now()))
    }

    fn released(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Release { work, .. } => Some(work.instance_id.to_string()),
                _ => None,
            })
            .collect()
    }

    fn ended(actions: &[Action]) -> Vec<(String, Tag, String)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::End {
                    work, tag, message, ..
                } => Some((work.instance_id.to_string(), *tag, message.clone())),
                _ => None,
            })
            .collect()
    }

    fn id(text: &str) -> InstanceId {
        InstanceId::parse(text).unwrap()
    }

    fn job(name: &str) -> JobName {
        JobName::parse(name).unwrap()
    }

    fn now() -> DateTime<Utc> {
        ax_bus::time::now()
    }

    #[test]
    fn the_jobs_run_by_a_dataset_follow_the_registry() {
        let uri = DatasetUri::parse("w://orders").unwrap();
        let data_job = |name: &str, inputs: &[&str]| -> JobSpec {
            let mut job = spec(name, None, &[]);
            job.on_datasets = inputs
                .iter()
                .map(|u| DatasetUri::parse(u).unwrap())
                .collect();
            job.consumes = job.on_datasets.clone();
            job
        };
        let mut state = DagState::new();
        state.upsert_job(data_job("report", &["w://orders", "w://pay"]));
        state.upsert_job(data_job("other", &["w://pay"]));
        let names = |state: &DagState| -> Vec<String> {
            state
                .run_by(&uri)
                .iter()
                .map(|s| s.name.to_string())
                .collect()
        };
        assert_eq!(names(&state), ["report"]);
        // Edited to read something else, then deleted: no longer run by it.
        state.upsert_job(data_job("report", &["w://pay"]));
        assert!(names(&state).is_empty());
        state.upsert_job(data_job("report", &["w://orders"]));
        assert_eq!(names(&state), ["report"]);
        state.remove_job("report");
        assert!(names(&state).is_empty());
    }

    #[test]
    fn the_stat_job_waits_for_both_syncs_of_the_same_date() {
        let order = spec("sync_order_daily", Some("0 1 * * *"), &[]);
        let pay = spec("sync_pay_daily", Some("0 1 * * *"), &[]);
        let stat = spec(
            "order_stat_daily",
            Some("0 2 * * *"),
            &[
                ("sync_order_daily", "current"),
                ("sync_pay_daily", "current"),
            ],
        );
        let mut dag = DagState::new();
        for s in [&order, &pay, &stat] {
            dag.upsert_job(s.clone());
        }
        let (o1, p1, s1) = (
            work(&order, "2026-01-01", 1),
            work(&pay, "2026-01-01", 1),
            work(&stat, "2026-01-01", 1),
        );
        let p2 = work(&pay, "2026-01-02", 1);
        assert_eq!(
            released(&dag.on_created(o1.clone(), now())),
            [o1.instance_id.as_str()]
        );
        assert_eq!(
            released(&dag.on_created(p1.clone(), now())),
            [p1.instance_id.as_str()]
        );
        let held = dag.on_created(s1.clone(), now());
        assert!(matches!(held.last(), Some(Action::Hold { .. })), "{held:?}");
        let noted = dag.on_result(&result(&o1, State::Success), now());
        assert!(released(&noted).is_empty());
        // Its record now names only what is still missing.
        assert!(
            noted.iter().any(|a| matches!(a, Action::Note { reason, .. }
                if reason == "waiting for `sync_pay_daily` for 2026-01-01")),
            "{noted:?}"
        );
        // Another date's success does not count.
        dag.on_created(p2.clone(), now());
        assert!(released_by(&mut dag, &p2, State::Success).is_empty());
        // A retry in between does not count either.
        assert!(released_by(&mut dag, &p1, State::WaitingRetry).is_empty());
        let mut p1b = p1.clone();
        p1b.attempt = 2;
        assert_eq!(
            released_by(&mut dag, &p1b, State::Success),
            [s1.instance_id.as_str()]
        );
        assert_eq!(dag.held_count(), 0);
    }

    #[test]
    fn a_failed_upstream_cancels_the_downstream_and_the_cascade_goes_on() {
        let a = spec("a", Some("0 1 * * *"), &[]);
        let b = spec("b", None, &[("a", "current")]);
        let c = spec("c", None, &[("b", "current")]);
        let mut dag = DagState::new();
        for s in [&a, &b, &c] {
            dag.upsert_job(s.clone());
        }
        let a1 = work(&a, "2026-01-01", 1);
        let actions = dag.on_created(a1.clone(), now());
        // b has no cron: its instance for the date is created as soon as a's appears.
        let creates: Vec<_> = actions
            .iter()
            .filter_map(|x| match x {
                Action::Create { spec, date } => Some((spec.name.clone(), *date)),
                _ => None,
            })
            .collect();
        assert_eq!(
            creates,
            [(
                job("b"),
                ax_bus::time::parse_biz_date("2026-01-01").unwrap()
            )]
        );
        let b1 = work(&b, "2026-01-01", 1);
        let actions = dag.on_created(b1.clone(), now());
        assert!(actions
            .iter()
            .any(|x| matches!(x, Action::Create { spec, .. } if spec.name == "c")));
        let c1 = work(&c, "2026-01-01", 1);
        dag.on_created(c1.clone(), now());
        let ends = ended(&dag.on_result(&result(&a1, State::Failed), now()));
        assert_eq!(
            ends,
            [(
                b1.instance_id.to_string(),
                Tag::UpstreamFailed,
                "upstream `a` for 2026-01-01 failed".into()
            )]
        );
        // The cancellation is published as b's result; it cancels c in turn.
        let ends = ended(&dag.on_result(&result(&b1, State::Cancelled), now()));
        assert_eq!(ends[0].0, c1.instance_id.to_string());
        assert!(ends[0].2.contains("`b` for 2026-01-01 was cancelled"));
    }

    #[test]
    fn past_date_offsets_match_earlier_dates() {
        let sync = spec("sync", Some("0 1 * * *"), &[]);
        let weekly = spec(
            "weekly",
            Some("0 3 * * *"),
            &[("sync", "-7d"), ("weekly", "-1d")],
        );
        let mut dag = DagState::new();
        dag.upsert_job(sync.clone());
        dag.upsert_job(weekly.clone());
        let w = work(&weekly, "2026-03-10", 1);
        assert!(released(&dag.on_created(w.clone(), now())).is_empty());
        let s = work(&sync, "2026-03-03", 1);
        dag.on_created(s.clone(), now());
        assert!(released_by(&mut dag, &s, State::Success).is_empty());
        let yesterday = work(&weekly, "2026-03-09", 1);
        dag.on_created(yesterday.clone(), now());
        assert_eq!(
            released_by(&mut dag, &yesterday, State::Success),
            [w.instance_id.to_string()]
        );
    }

    #[test]
    fn a_rerun_upstream_is_pending_again() {
        let a = spec("a", Some("0 1 * * *"), &[]);
        let b = spec("b", Some("0 2 * * *"), &[("a", "current")]);
        let mut dag = DagState::new();
        dag.upsert_job(a.clone());
        dag.upsert_job(b.clone());
        let a1 = work(&a, "2026-01-01", 1);
        dag.on_created(a1.clone(), now());
        dag.on_result(&result(&a1, State::Success), now());
        // Both re-run: a's new attempt makes b wait again.
        let a2 = work(&a, "2026-01-01", 2);
        dag.on_created(a2.clone(), now());
        let b2 = work(&b, "2026-01-01", 2);
        assert!(released(&dag.on_created(b2.clone(), now())).is_empty());
        // A late repeat of attempt 1's success changes nothing.
        assert!(released_by(&mut dag, &a1, State::Success).is_empty());
        assert_eq!(
            released_by(&mut dag, &a2, State::Success),
            [b2.instance_id.to_string()]
        );
    }

    fn day() -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 1, 1).unwrap()
    }

    /// A day of `job` holding `instance` at `attempt` in `state`, as stored.
    fn stored(
        job_name: &str,
        instance: &InstanceId,
        attempt: u32,
        state: State,
    ) -> std::collections::BTreeMap<DayKey, DateInstances> {
        let day_of = DateInstances {
            instances: [(instance.clone(), (attempt, state))].into(),
            ..Default::default()
        };
        [((job(job_name), day()), day_of)].into()
    }

    fn reads(actions: &[Action]) -> Vec<DayKey> {
        actions
            .iter()
            .flat_map(|a| match a {
                Action::ReadDays(keys) => keys.clone(),
                _ => Vec::new(),
            })
            .collect()
    }

    #[test]
    fn a_job_nothing_depends_on_is_saved_not_held() {
        let s = spec("s", Some("* * * * *"), &[]);
        let mut dag = DagState::new();
        dag.upsert_job(s.clone());
        let s1 = work(&s, "2026-01-01", 1);
        let actions = dag.on_result(&result(&s1, State::Success), now());
        assert_eq!(
            actions,
            [Action::NoteDay {
                job: job("s"),
                date: day()
            }]
        );
        assert_eq!((dag.days_count(), dag.followed()), (0, vec![]));
        // Its day is noted once, not each instance.
        let mut s2 = work(&s, "2026-01-01", 1);
        s2.instance_id = id("s.2");
        assert_eq!(dag.on_result(&result(&s2, State::Success), now()), []);
        let b = spec("b", Some("0 2 * * *"), &[("s", "current")]);
        dag.upsert_job(b);
        assert_eq!(dag.followed(), [job("b"), job("s")]);
    }

    #[test]
    fn a_restored_view_reads_a_day_it_does_not_hold_before_deciding_on_it() {
        let s = spec("s", Some("* * * * *"), &[]);
        let mut dag = DagState::new();
        dag.upsert_job(s.clone());
        // Restored while nothing depended on `s`: none of its days were read.
        let actions = dag.restore(day()..=day(), Vec::new(), Vec::new(), now());
        assert!(actions.is_empty());
        let b = spec("b", Some("0 2 * * *"), &[("s", "current")]);
        dag.upsert_job(b.clone());
        let (b1, mut b2) = (work(&b, "2026-01-01", 1), work(&b, "2026-01-01", 1));
        b2.instance_id = id("b.other");
        b2.trace_id = TraceId::first_of(&b2.instance_id);
        let actions = dag.on_created(b1.clone(), now());
        assert_eq!(reads(&actions), [(job("s"), day())]);
        assert!(released(&actions).is_empty());
        // Read once, however many wait on it; a failure seen meanwhile decides nothing.
        assert!(reads(&dag.on_created(b2.clone(), now())).is_empty());
        let s1 = work(&s, "2026-01-01", 1);
        let actions = dag.on_result(&result(&s1, State::Failed), now());
        assert!(ended(&actions).is_empty(), "{actions:?}");
        // The day as stored: another instance of `s` succeeded for it.
        let actions = dag.merge_days(
            vec![(job("s"), day())],
            stored("s", &id("s.earlier"), 1, State::Success),
            now(),
        );
        let mut out = released(&actions);
        out.sort();
        assert_eq!(out, ["b.2026-01-01", "b.other"]);
        // Known now: another wait on it reads nothing.
        let b3 = WorkItem {
            instance_id: id("b.third"),
            ..work(&b, "2026-01-01", 1)
        };
        let actions = dag.on_created(b3, now());
        assert!(reads(&actions).is_empty());
        assert_eq!(released(&actions), ["b.third"]);
    }

    #[test]
    fn stored_days_read_late_never_undo_what_the_view_saw_since() {
        let s = spec("s", Some("* * * * *"), &[]);
        let b = spec("b", Some("0 2 * * *"), &[("s", "current")]);
        let mut dag = DagState::new();
        dag.upsert_job(s.clone());
        dag.upsert_job(b.clone());
        // Attempt 2 failed while the stored day was read; it says attempt 1 succeeded.
        let s2 = work(&s, "2026-01-01", 2);
        dag.on_result(&result(&s2, State::Failed), now());
        let key = (job("s"), day());
        let stored_now = |attempt, state| stored("s", &s2.instance_id, attempt, state);
        dag.merge_days(vec![key.clone()], stored_now(1, State::Success), now());
        assert_eq!(
            dag.days[&key].instances[&s2.instance_id],
            (2, State::Failed)
        );
        // A later attempt stored wins; a late start of it undoes nothing.
        dag.merge_days(vec![key.clone()], stored_now(3, State::Success), now());
        assert_eq!(
            dag.days[&key].instances[&s2.instance_id],
            (3, State::Success)
        );
        dag.merge_days(vec![key.clone()], stored_now(3, State::Running), now());
        assert_eq!(
            dag.days[&key].instances[&s2.instance_id],
            (3, State::Success)
        );
    }

    #[test]
    fn a_gate_on_a_day_not_read_yet_holds() {
        let mut a = spec("a", Some("* * * * *"), &[]);
        a.overlap = Overlap::Queue;
        let mut dag = DagState::new();
        dag.upsert_job(a.clone());
        let later = day() + Duration::days(3);
        dag.restore(day()..=day(), Vec::new(), Vec::new(), now());
        let first = work(&a, "2026-01-04", 1);
        let mut second = work(&a, "2026-01-04", 1);
        second.instance_id = id("a.second");
        second.trace_id = TraceId::first_of(&second.instance_id);
        second.gate = Some(Gate {
            instance_id: first.instance_id.clone(),
            job: job("a"),
            biz_date: "2026-01-04".into(),
        });
        let actions = dag.on_created(second, now());
        assert_eq!(reads(&actions), [(job("a"), later)]);
        assert!(released(&actions).is_empty(), "{actions:?}");
        let actions = dag.merge_days(
            vec![(job("a"), later)],
            [(
                (job("a"), later),
                DateInstances {
                    instances: [(first.instance_id.clone(), (1, State::Running))].into(),
                    ..Default::default()
                },
            )]
            .into(),
            now(),
        );
        assert!(released(&actions).is_empty(), "the previous one still runs");
        assert_eq!(released_by(&mut dag, &first, State::Success), ["a.second"]);
    }

    #[test]
    fn a_gate_holds_until_the_previous_instance_ends() {
        // Gates come with `overlap: queue`.
        let mut a = spec("a", Some("* * * * *"), &[]);
        a.overlap = Overlap::Queue;
        let mut dag = DagState::new();
        dag.upsert_job(a.clone());
        let first = work(&a, "2026-01-01", 1);
        dag.on_created(first.clone(), now());
        let mut second = work(&a, "2026-01-01", 1);
        second.instance_id = id("a.second");
        second.trace_id = TraceId::first_of(&second.instance_id);
        second.gate = Some(Gate {
            instance_id: first.instance_id.clone(),
            job: job("a"),
            biz_date: "2026-01-01".into(),
        });
        assert!(released(&dag.on_created(second.clone(), now())).is_empty());
        assert_eq!(released_by(&mut dag, &first, State::Failed), ["a.second"]);
    }

    #[test]
    fn deps_timeout_fails_a_long_wait() {
        let a = spec("a", Some("0 1 * * *"), &[]);
        let mut b = spec("b", Some("0 2 * * *"), &[("a", "current")]);
        b.deps_timeout = Some(60);
        let mut dag = DagState::new();
        dag.upsert_job(a);
        dag.upsert_job(b.clone());
        let start = now();
        dag.on_created(work(&b, "2026-01-01", 1), start);
        assert!(dag.expire(start + Duration::seconds(59), 40).is_empty());
        let ends = ended(&dag.expire(start + Duration::seconds(61), 40));
        assert_eq!(ends[0].1, Tag::DepsTimeout);
        assert!(ends[0].2.contains("`a` for 2026-01-01"), "{}", ends[0].2);
    }

    #[test]
    fn a_restored_wait_is_released_by_what_happened_meanwhile() {
        let a = spec("a", Some("0 1 * * *"), &[]);
        let b = spec("b", Some("0 2 * * *"), &[("a", "current")]);
        let mut dag = DagState::new();
        dag.upsert_job(a.clone());
        dag.upsert_job(b.clone());
        let b1 = work(&b, "2026-01-01", 1);
        let day = DateInstances {
            instances: [(id("a.x"), (1, State::Success))].into_iter().collect(),
            ..Default::default()
        };
        let date = ax_bus::time::parse_biz_date("2026-01-01").unwrap();
        let actions = dag.restore(
            date..=date,
            vec![(
                (
                    job("a"),
                    ax_bus::time::parse_biz_date("2026-01-01").unwrap(),
                ),
                day,
            )],
            vec![Waiting {
                work: b1.clone(),
                since: now(),
                children: None,
            }],
            now(),
        );
        assert_eq!(
            actions,
            vec![Action::Release {
                work: b1,
                held: true
            }]
        );
    }

    #[test]
    fn a_wide_fan_out_and_a_long_chain_resolve_in_linear_time() {
        let root = spec("root", Some("0 1 * * *"), &[]);
        let mut dag = DagState::new();
        dag.upsert_job(root.clone());
        let leaves: Vec<JobSpec> = (0..10_000)
            .map(|i| {
                spec(
                    &format!("leaf{i}"),
                    Some("0 2 * * *"),
                    &[("root", "current")],
                )
            })
            .collect();
        for leaf in &leaves {
            dag.upsert_job(leaf.clone());
        }
        let r = work(&root, "2026-01-01", 1);
        dag.on_created(r.clone(), now());
        for leaf in &leaves {
            dag.on_created(work(leaf, "2026-01-01", 1), now());
        }
        let started = std::time::Instant::now();
        assert_eq!(released_by(&mut dag, &r, State::Success).len(), 10_000);
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        assert_eq!(dag.held_count(), 0);
    }

    #[test]
    fn history_is_forgotten_by_age_of_change_not_by_date() {
        let a = spec("a", None, &[]);
        let b = spec("b", None, &[("a", "current")]);
        let mut dag = DagState::new();
        dag.upsert_job(a.clone());
        dag.upsert_job(b.clone());
        let start = now();
        // A date far in the past, as a backfill or a re-run would touch it.
        let old = work(&a, "2020-01-01", 1);
        dag.on_created(old.clone(), start);
        dag.on_result(&result(&old, State::Success), start);
        assert!(dag.expire(start + Duration::days(1), 40).is_empty());
        let b_old = work(&b, "2020-01-01", 1);
        assert_eq!(
            released(&dag.on_created(b_old, start + Duration::days(1))),
            ["b.2020-01-01"]
        );
        dag.expire(start + Duration::days(50), 40);
        assert!(dag.days.is_empty(), "untouched history is forgotten");
    }

    #[test]
    fn a_split_instance_ends_when_all_its_shards_have() {
        let job = spec("big", None, &[]);
        let mut dag = DagState::new();
        dag.upsert_job(job.clone());
        let parent = work(&job, "2026-01-01", 1);
        let child = |i: u32, state: State| {
            let mut r = result(&parent, state);
            r.instance_id = parent.instance_id.child(&format!("s{i}")).unwrap();
            r.shard = Some(ax_bus::messages::ShardRef {
                parent: parent.instance_id.clone(),
                parent_trace: parent.trace_id.clone(),
                index: i,
                total: 3,
            });
            r
        };
        // One shard ends before the plan arrives.
        assert!(dag.on_result(&child(0, State::Success), now()).is_empty());
        let children: Vec<InstanceId> = (0..3)
            .map(|i| parent.instance_id.child(&format!("s{i}")).unwrap())
            .collect();
        let actions = dag.on_split(parent.clone(), children.clone());
        assert!(matches!(actions[0], Action::HoldSplit { .. }));
        assert!(ended(&dag.on_result(&child(1, State::WaitingRetry), now())).is_empty());
        assert!(ended(&dag.on_result(&child(1, State::Success), now())).is_empty());
        let done = dag.on_result(&child(2, State::Failed), now());
        let ends: Vec<_> = done
            .iter()
            .filter_map(|a| match a {
                Action::End {
                    state,
                    tag,
                    message,
                    ..
                } => Some((*state, *tag, message.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(ends.len(), 1);
        assert_eq!((ends[0].0, ends[0].1), (State::Failed, Tag::ShardsFailed));
        assert!(ends[0].2.contains(".s2"), "{}", ends[0].2);
        // Shards never count as instances of their job for dependencies.
        assert!(dag.days.is_empty());
    }

    #[test]
    fn a_change_stores_the_one_instance_that_changed() {
        let mut dag = DagState::new();
        let a = spec("a", Some("* * * * * *"), &[]);
        dag.upsert_job(a.clone());
        dag.upsert_job(spec("b", None, &[("a", "current")]));
        let start = ax_bus::time::now();
        let mut saved = Vec::new();
        for i in 0..3 {
            let mut w = work(&a, "2026-11-29", 1);
            w.instance_id = id(&format!("a.{i}"));
            saved.extend(
                dag.on_created(w, start)
                    .into_iter()
                    .filter_map(|a| match a {
                        Action::SaveEntry {
                            instance_id,
                            attempt,
                            state,
                            ..
                        } => Some((instance_id, attempt, state)),
                        _ => None,
                    }),
            );
        }
        assert_eq!(
            saved,
            vec![
                (id("a.0"), 1, State::Running),
                (id("a.1"), 1, State::Running),
                (id("a.2"), 1, State::Running),
            ]
        );
    }
}
