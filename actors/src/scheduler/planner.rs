//! The Scheduler's in-memory view: the job registry and a time wheel of pending fires.
//!
//! Pure data: it is told "now" and the registry's changes and says which fires are due. The
//! Scheduler actor wraps it with I/O; tests drive it with any clock, through DST days and month
//! ends, in microseconds.
//!
//! Every cron job has at most one pending timer (its next fire). A timer carries the job's slot
//! and generation; editing, pausing or deleting the job bumps the generation, which turns the old
//! timer stale in place instead of searching the wheel for it. One-off timers (delayed retries)
//! carry their own payload.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use chrono::{DateTime, Utc};

use ax_bus::ids::{InstanceId, JobName, TraceId};
use ax_bus::messages::JobRecord;
use ax_bus::spec::JobSpec;

use crate::scheduler::fire_schedule::FireSchedule;
use crate::scheduler::time_wheel::TimeWheel;

/// A due cron fire.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Fire {
    /// The job definition at fire time.
    pub spec: Arc<JobSpec>,
    /// The tick (the instance's expected time).
    pub expected: DateTime<Utc>,
    /// Local date of the tick in the job's zone.
    pub biz_date: String,
    /// The job is paused: the tick is recorded as skipped, nothing runs.
    pub paused: bool,
}

/// A job whose missed ticks the misfire policy may catch up.
#[derive(Clone, Debug)]
pub(crate) struct CatchUpCandidate {
    /// The job.
    pub spec: Arc<JobSpec>,
    /// Its schedule.
    pub schedule: Arc<FireSchedule>,
    /// Ticks after this instant are this planner's to fire.
    pub scheduled_from: DateTime<Utc>,
    /// When the job was defined or last changed (the registry's `updated_at`).
    pub defined_at: DateTime<Utc>,
    /// Whether it is paused.
    pub paused: bool,
}

/// A due one-off timer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DueRetry {
    /// The instance waiting for its next attempt.
    pub instance_id: InstanceId,
    /// The attempt that failed.
    pub from_trace: TraceId,
    /// When it was due.
    pub due: DateTime<Utc>,
}

/// What came due.
#[derive(Debug, Default)]
pub(crate) struct Due {
    /// Cron fires, in time order per job.
    pub fires: Vec<Fire>,
    /// Retries.
    pub retries: Vec<DueRetry>,
}

#[derive(Clone, Copy, Debug)]
enum Timer {
    Cron { slot: u32, generation: u32 },
    OneOff(u32),
}

#[derive(Debug)]
struct Planned {
    spec: Arc<JobSpec>,
    /// Shared by every job with the same cron expression and zone.
    schedule: Option<Arc<FireSchedule>>,
    paused: bool,
    generation: u32,
    next_fire: Option<DateTime<Utc>>,
    /// The instant from which this planner computed the job's fires.
    scheduled_from: DateTime<Utc>,
    /// The registry's `updated_at`.
    defined_at: DateTime<Utc>,
}

/// Jobs and pending timers.
#[derive(Debug)]
pub(crate) struct Planner {
    jobs: Vec<Option<Planned>>,
    free_slots: Vec<u32>,
    by_name: HashMap<JobName, u32>,
    one_offs: Vec<Option<DueRetry>>,
    free_one_offs: Vec<u32>,
    wheel: TimeWheel<Timer>,
    /// Parsed schedules by (cron, zone): a parsed cron expression holds sets of every allowed
    /// value (its years alone are 130 of them), about 1.5 KiB, while a fleet of jobs shares
    /// few distinct expressions.
    schedules: HashMap<(String, String), Weak<FireSchedule>>,
}

fn ms(t: DateTime<Utc>) -> u64 {
    t.timestamp_millis().max(0) as u64
}

impl Planner {
    /// An empty planner whose time is `now`.
    pub(crate) fn new(now: DateTime<Utc>) -> Self {
        Self {
            jobs: Vec::new(),
            free_slots: Vec::new(),
            by_name: HashMap::new(),
            one_offs: Vec::new(),
            free_one_offs: Vec::new(),
            wheel: TimeWheel::new(ms(now)),
            schedules: HashMap::new(),
        }
    }

    /// The parsed schedule of `cron` in `timezone`, shared with the jobs that have the same.
    fn schedule(&mut self, cron: &str, timezone: &str) -> Result<Arc<FireSchedule>, String> {
        let key = (cron.to_string(), timezone.to_string());
        if let Some(shared) = self.schedules.get(&key).and_then(Weak::upgrade) {
            return Ok(shared);
        }
        let parsed = Arc::new(FireSchedule::new(cron, timezone)?);
        if self.schedules.len() >= 1024 && self.schedules.len() > 2 * self.by_name.len() {
            self.schedules.retain(|_, shared| shared.strong_count() > 0);
        }
        self.schedules.insert(key, Arc::downgrade(&parsed));
        Ok(parsed)
    }

    /// Timers pending in the wheel.
    pub(crate) fn timers(&self) -> usize {
        self.wheel.len()
    }

    /// Number of jobs.
    pub(crate) fn job_count(&self) -> usize {
        self.by_name.len()
    }

    /// Adds or replaces a job. An unchanged schedule keeps its pending fire; a new or changed one
    /// fires next after `now`. A job whose cron does not parse keeps no timer (it was validated
    /// on apply, so this only happens with a registry written by something else).
    pub(crate) fn upsert(&mut self, record: &JobRecord, now: DateTime<Utc>) -> Result<(), String> {
        let spec = Arc::new(record.spec.clone());
        let schedule = match &spec.cron {
            Some(cron) => Some(self.schedule(cron, &spec.timezone)?),
            None => None,
        };
        let slot = match self.by_name.get(&spec.name) {
            Some(slot) => *slot,
            None => {
                let slot = self.free_slots.pop().unwrap_or_else(|| {
                    self.jobs.push(None);
                    (self.jobs.len() - 1) as u32
                });
                self.by_name.insert(spec.name.clone(), slot);
                slot
            }
        };
        let previous = self.jobs[slot as usize].take();
        if let Some(prev) = &previous {
            if *prev.spec == *spec && prev.paused == record.paused {
                self.jobs[slot as usize] = previous;
                return Ok(());
            }
        }
        let generation = previous
            .as_ref()
            .map_or(0, |p| p.generation.wrapping_add(1));
        let same_timing = previous
            .as_ref()
            .is_some_and(|p| p.spec.cron == spec.cron && p.spec.timezone == spec.timezone);
        // Paused jobs keep ticking: their ticks are recorded as skipped.
        let next_fire = match &schedule {
            Some(_) if same_timing => previous.as_ref().and_then(|p| p.next_fire),
            Some(schedule) => schedule.next_after(now),
            None => None,
        };
        let scheduled_from = match &previous {
            Some(p) if same_timing => p.scheduled_from,
            _ => now,
        };
        if let Some(at) = next_fire {
            self.wheel.insert(ms(at), Timer::Cron { slot, generation });
        }
        self.jobs[slot as usize] = Some(Planned {
            spec,
            schedule,
            paused: record.paused,
            generation,
            next_fire,
            scheduled_from,
            defined_at: record.updated_at,
        });
        Ok(())
    }

    /// The cron jobs, with the instant from which this planner fires them: the misfire policy
    /// looks at the ticks between a job's last recorded tick and that instant.
    pub(crate) fn catch_up_candidates(&self) -> Vec<CatchUpCandidate> {
        self.jobs
            .iter()
            .flatten()
            .filter_map(|p| {
                Some(CatchUpCandidate {
                    spec: p.spec.clone(),
                    schedule: p.schedule.clone()?,
                    scheduled_from: p.scheduled_from,
                    defined_at: p.defined_at,
                    paused: p.paused,
                })
            })
            .collect()
    }

    /// Removes a job; its pending timer turns stale.
    pub(crate) fn remove(&mut self, name: &str) {
        if let Some(slot) = self.by_name.remove(name) {
            self.jobs[slot as usize] = None;
            self.free_slots.push(slot);
        }
    }

    /// Removes every job whose name `keep` refuses (the jobs of partitions handed over).
    pub(crate) fn retain_jobs(&mut self, keep: impl Fn(&str) -> bool) {
        let gone: Vec<JobName> = self
            .by_name
            .keys()
            .filter(|name| !keep(name.as_str()))
            .cloned()
            .collect();
        for name in gone {
            self.remove(name.as_str());
        }
    }

    /// Schedules a retry.
    pub(crate) fn add_retry(&mut self, retry: DueRetry) {
        let at = ms(retry.due);
        let index = match self.free_one_offs.pop() {
            Some(i) => {
                self.one_offs[i as usize] = Some(retry);
                i
            }
            None => {
                self.one_offs.push(Some(retry));
                (self.one_offs.len() - 1) as u32
            }
        };
        self.wheel.insert(at, Timer::OneOff(index));
    }

    /// When to look again: the earliest pending timer (or `None`).
    pub(crate) fn next_wake(&self) -> Option<DateTime<Utc>> {
        self.wheel
            .next_deadline()
            .map(|d| ax_bus::time::from_millis(d as i64))
    }

    /// Everything due by `now`; each fired job's next fire is scheduled after the fired tick, so
    /// ticks missed while this process lagged fire in order rather than being skipped.
    pub(crate) fn advance(&mut self, now: DateTime<Utc>) -> Due {
        let mut due = Due::default();
        let mut expired = Vec::new();
        // A fire scheduled from an expired one may itself be due: loop until quiet.
        loop {
            expired.clear();
            self.wheel.poll(ms(now), &mut expired);
            if expired.is_empty() {
                return due;
            }
            for (deadline, timer) in expired.drain(..) {
                match timer {
                    Timer::Cron { slot, generation } => {
                        if let Some(fire) = self.fire(slot, generation, deadline) {
                            due.fires.push(fire);
                        }
                    }
                    Timer::OneOff(index) => {
                        if let Some(retry) = self.one_offs[index as usize].take() {
                            self.free_one_offs.push(index);
                            due.retries.push(retry);
                        }
                    }
                }
            }
        }
    }

    fn fire(&mut self, slot: u32, generation: u32, deadline: u64) -> Option<Fire> {
        let planned = self.jobs.get_mut(slot as usize)?.as_mut()?;
        if planned.generation != generation {
            return None;
        }
        let schedule = planned.schedule.as_ref()?;
        let expected = ax_bus::time::from_millis(deadline as i64);
        planned.next_fire = schedule.next_after(expected);
        if let Some(next) = planned.next_fire {
            self.wheel
                .insert(ms(next), Timer::Cron { slot, generation });
        }
        Some(Fire {
            spec: planned.spec.clone(),
            expected,
            biz_date: schedule.biz_date(expected),
            paused: planned.paused,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ax_bus::spec::ExecSpec;
    use chrono::Duration;

    fn record(name: &str, cron: &str, paused: bool) -> JobRecord {
        JobRecord {
            spec: crate::test_fixtures::spec(name, Some(cron), &[]),
            paused,
            updated_at: ax_bus::time::now(),
            defined_at: None,
        }
    }

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn fires_every_tick_once_in_order() {
        let start = t("2026-11-29T23:59:58.500Z");
        let mut planner = Planner::new(start);
        planner
            .upsert(&record("s", "* * * * * *", false), start)
            .unwrap();
        let mut seen = Vec::new();
        let mut now = start;
        for _ in 0..40 {
            now += Duration::milliseconds(100);
            seen.extend(planner.advance(now).fires.into_iter().map(|f| f.expected));
        }
        // 23:59:59, 00:00:00 (a new business date), 00:00:01, 00:00:02
        assert_eq!(seen.len(), 4);
        assert_eq!(seen[1], t("2026-11-30T00:00:00Z"));
        assert!(seen.windows(2).all(|w| w[1] - w[0] == Duration::seconds(1)));
    }

    #[test]
    fn a_lagging_process_fires_every_missed_tick() {
        let start = t("2026-01-01T00:00:00.500Z");
        let mut planner = Planner::new(start);
        planner
            .upsert(&record("s", "* * * * * *", false), start)
            .unwrap();
        let due = planner.advance(start + Duration::milliseconds(5_000));
        assert_eq!(due.fires.len(), 5);
    }

    #[test]
    fn paused_jobs_tick_as_paused_and_edits_and_deletes_stop_the_old_timer() {
        let start = t("2026-01-01T00:00:00Z");
        let mut planner = Planner::new(start);
        planner
            .upsert(&record("a", "*/10 * * * * *", false), start)
            .unwrap();
        planner
            .upsert(&record("a", "*/10 * * * * *", true), start)
            .unwrap();
        let paused = planner.advance(start + Duration::seconds(30)).fires;
        assert_eq!(paused.len(), 3, "a paused job keeps ticking");
        assert!(paused.iter().all(|f| f.paused));
        let now = start + Duration::seconds(30);
        planner
            .upsert(&record("a", "*/10 * * * * *", false), now)
            .unwrap();
        let fires = planner.advance(now + Duration::seconds(10)).fires;
        assert_eq!(fires.len(), 1);
        assert_eq!(fires[0].expected, t("2026-01-01T00:00:40Z"));
        assert!(!fires[0].paused);
        planner.remove("a");
        assert!(planner
            .advance(now + Duration::seconds(60))
            .fires
            .is_empty());
        assert_eq!(planner.job_count(), 0);
    }

    #[test]
    fn jobs_with_the_same_cron_and_zone_share_one_parsed_schedule() {
        let now = t("2026-03-01T00:00:00Z");
        let mut planner = Planner::new(now);
        for (name, zone) in [("a", "UTC"), ("b", "UTC"), ("c", "Europe/Paris")] {
            let mut job = record(name, "0 3 * * *", false);
            job.spec.timezone = zone.into();
            planner.upsert(&job, now).unwrap();
        }
        let candidates = planner.catch_up_candidates();
        let of = |name: &str| {
            candidates
                .iter()
                .find(|c| c.spec.name.as_str() == name)
                .map(|c| c.schedule.clone())
                .unwrap()
        };
        assert!(Arc::ptr_eq(&of("a"), &of("b")));
        assert!(!Arc::ptr_eq(&of("a"), &of("c")));
        // Each still fires on its own zone's time.
        assert_ne!(of("a").next_after(now), of("c").next_after(now));
    }

    #[test]
    fn re_applying_the_same_schedule_keeps_the_pending_fire() {
        let start = t("2026-01-01T00:00:00Z");
        let mut planner = Planner::new(start);
        planner
            .upsert(&record("a", "0 * * * * *", false), start)
            .unwrap();
        let mut edited = record("a", "0 * * * * *", false);
        edited.spec.exec = ExecSpec::shell("echo changed");
        planner
            .upsert(&edited, start + Duration::seconds(59))
            .unwrap();
        let fires = planner.advance(start + Duration::seconds(60)).fires;
        assert_eq!(fires.len(), 1);
        assert_eq!(fires[0].spec.exec, ExecSpec::shell("echo changed"));
    }

    #[test]
    fn retries_come_due_at_their_time() {
        let start = t("2026-01-01T00:00:00Z");
        let mut planner = Planner::new(start);
        planner.add_retry(DueRetry {
            instance_id: ax_bus::ids::InstanceId::parse("a.x").unwrap(),
            from_trace: ax_bus::ids::TraceId::random(),
            due: start + Duration::milliseconds(1500),
        });
        assert!(planner
            .advance(start + Duration::milliseconds(1499))
            .retries
            .is_empty());
        assert_eq!(
            planner
                .advance(start + Duration::milliseconds(1500))
                .retries
                .len(),
            1
        );
    }

    #[test]
    fn dst_days_in_new_york_fire_daily_0230_once_each() {
        let start = t("2026-03-07T00:00:00Z");
        let mut planner = Planner::new(start);
        let mut job = record("ny", "30 2 * * *", false);
        job.spec.timezone = "America/New_York".into();
        planner.upsert(&job, start).unwrap();
        let mut dates = Vec::new();
        let mut now = start;
        // Walk to the fall change a minute at a time.
        while now < t("2026-11-03T00:00:00Z") {
            now += Duration::minutes(1);
            dates.extend(planner.advance(now).fires.into_iter().map(|f| f.biz_date));
        }
        let mut unique = dates.clone();
        unique.dedup();
        assert_eq!(unique, dates, "a date fired twice");
        assert!(dates.contains(&"2026-03-08".to_string()));
        assert!(dates.contains(&"2026-11-01".to_string()));
        assert_eq!(dates.len(), 241);
    }
}
