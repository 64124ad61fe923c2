//! The headline figures of a day, each defined once, here: `ax status`, the console's
//! dashboard, `/metrics` and the API all read them from the [`DaySummary`] the leading
//! DagCoordinator keeps, or count them with the functions below, so that no two places can
//! give one name two meanings (an operator once read three failure counts and three average
//! latencies, of hours and of days, in the same hour).
//!
//! - **Trigger latency** ([`trigger_latency`]): an attempt's start minus when it became due —
//!   a cron tick's or a delayed trigger's instant, a manual trigger's acceptance, or the
//!   release of an instance that waited for its dependencies or was started by its inputs'
//!   updates ([`InstanceRecord::due_at`]). Only an instance's first attempt counts: a retry
//!   waits by design, and a re-run or a backfill is due on a schedule long past.
//! - **Longest run**: the longest attempt that ended on the day, whatever its outcome (a
//!   failed attempt that was retried, or one killed, counts like the last).
//! - **Ended, failed**: the instances' endings on the day, by end time — a final result
//!   (success, failed, cancelled); a re-run that ends counts again. The other count, a
//!   business date's instances by their current state (what `ax instance list --state failed
//!   --biz-date D` lists), is labelled "instances of D" wherever it is shown.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{InstanceId, JobName};
use crate::instance::{InstanceRecord, State, Trigger};
use crate::messages::ResultMessage;

/// The trigger latency of an attempt: its start minus when it became due (`due_at` where the
/// record has one, else its expected time), never negative; `None` for an attempt that does
/// not count — not started, not an instance's first, or a backfill's.
pub fn trigger_latency(
    attempt: u32,
    trigger: Option<Trigger>,
    expected_time: DateTime<Utc>,
    due_at: Option<DateTime<Utc>>,
    started_at: Option<DateTime<Utc>>,
) -> Option<TimeDelta> {
    if attempt != 1 || trigger == Some(Trigger::Backfill) {
        return None;
    }
    let late = started_at? - due_at.unwrap_or(expected_time);
    Some(late.max(TimeDelta::zero()))
}

impl ResultMessage {
    /// This attempt's [`trigger_latency`].
    pub fn trigger_latency(&self) -> Option<TimeDelta> {
        trigger_latency(
            self.attempt,
            self.trigger,
            self.expected_time,
            self.due_at,
            self.started_at,
        )
    }
}

impl InstanceRecord {
    /// The current attempt's [`trigger_latency`].
    pub fn trigger_latency(&self) -> Option<TimeDelta> {
        trigger_latency(
            self.attempt,
            Some(self.trigger),
            self.expected_time,
            self.due_at,
            self.started_at,
        )
    }
}

/// One day's summary (the article's five fields), kept up to date by the leading
/// DagCoordinator as results arrive: bucket `ax_summary`, key = the date (`YYYY-MM-DD`, in the
/// coordinator's `[status] timezone`). Incremental: each batch of results is added once (by
/// its stream sequence), never recounted from the records.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DaySummary {
    /// The date.
    pub date: String,
    /// The time zone the date is in.
    pub timezone: String,
    /// Instances' endings that day (a final result: success, failed or cancelled; a re-run
    /// that ends counts again).
    pub finished: u64,
    /// Of which succeeded.
    pub succeeded: u64,
    /// Of which failed.
    pub failed: u64,
    /// Of which were cancelled.
    pub cancelled: u64,
    /// Sum of the [`trigger_latency`] of the first attempts that ended that day, in ms.
    pub latency_ms_total: u64,
    /// How many first attempts the sum holds.
    pub latency_count: u64,
    /// The longest attempt that ended that day, whatever its outcome.
    #[serde(default)]
    pub longest: Option<LongestRun>,
    /// Failed endings per job.
    #[serde(default)]
    pub failures_by_job: BTreeMap<String, u64>,
    /// The last `AX_RESULTS` sequence added: a batch delivered again is not counted twice.
    pub applied_to: u64,
}

/// The longest attempt of a day.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LongestRun {
    /// The instance.
    pub instance_id: InstanceId,
    /// Its job.
    pub job: JobName,
    /// How long it ran, in ms.
    pub duration_ms: i64,
    /// Which attempt of the instance it was (absent from summaries of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
}

impl DaySummary {
    /// Adds result `sequence` (once: an earlier or repeated sequence changes nothing).
    pub fn add(&mut self, sequence: u64, result: &ResultMessage) {
        if sequence <= self.applied_to {
            return;
        }
        self.applied_to = sequence;
        // Every attempt that ran: a retried or a killed one too.
        if let Some(ran) = result.duration_ms {
            if self.longest.as_ref().is_none_or(|l| ran > l.duration_ms) {
                self.longest = Some(LongestRun {
                    instance_id: result.instance_id.clone(),
                    job: result.job.clone(),
                    duration_ms: ran,
                    attempt: Some(result.attempt),
                });
            }
        }
        // A first attempt, whether it ended the instance or a retry follows.
        if let Some(late) = result.trigger_latency() {
            self.latency_ms_total += u64::try_from(late.num_milliseconds()).unwrap_or(0);
            self.latency_count += 1;
        }
        match result.state {
            State::Success => self.succeeded += 1,
            State::Failed => {
                self.failed += 1;
                *self
                    .failures_by_job
                    .entry(result.job.to_string())
                    .or_default() += 1;
            }
            State::Cancelled => self.cancelled += 1,
            // Not the end of the instance (a retry comes, or a new attempt after a loss).
            State::Running | State::WaitingRetry => return,
        }
        self.finished += 1;
    }

    /// The average trigger latency in ms, if any first attempt ran.
    pub fn average_latency_ms(&self) -> Option<f64> {
        (self.latency_count > 0).then(|| self.latency_ms_total as f64 / self.latency_count as f64)
    }

    /// The average trigger latency as people read it (`1.3 s`, `4m 05s`), as every place
    /// that shows it writes it.
    pub fn average_latency_text(&self) -> Option<String> {
        self.average_latency_ms()
            .map(|ms| crate::time::human_ms(ms.round() as i64))
    }

    /// The `n` jobs with the most failed endings, most first (ties by name).
    pub fn top_failing(&self, n: usize) -> Vec<(String, u64)> {
        let mut jobs: Vec<(String, u64)> = self
            .failures_by_job
            .iter()
            .map(|(job, count)| (job.clone(), *count))
            .collect();
        jobs.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        jobs.truncate(n);
        jobs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance::Tag;

    fn result(job: &str, state: State, attempt: u32, ran_ms: i64) -> ResultMessage {
        let expected = crate::time::now();
        ResultMessage {
            instance_id: format!("{job}.20261202T000000000Z").parse().unwrap(),
            trace_id: crate::ids::TraceId::random(),
            job: job.parse().unwrap(),
            biz_date: "2026-12-02".into(),
            attempt,
            state,
            tag: Tag::Completed,
            message: String::new(),
            output: serde_json::Value::Null,
            worker: None,
            expected_time: expected,
            started_at: Some(expected + TimeDelta::milliseconds(10)),
            finished_at: expected + TimeDelta::milliseconds(10 + ran_ms),
            duration_ms: Some(ran_ms),
            exit_code: None,
            next_attempt_at: None,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            usage: None,
            shard: None,
            trigger: Some(Trigger::Cron),
            due_at: None,
        }
    }

    #[test]
    fn an_ending_counts_once_and_every_attempt_can_be_the_longest() {
        let mut day = DaySummary::default();
        day.add(1, &result("a", State::Success, 1, 100));
        // A first attempt of 900 ms that failed and was retried: the longest run, and its
        // latency counts although the instance ends later.
        day.add(2, &result("b", State::WaitingRetry, 1, 900));
        day.add(3, &result("b", State::Failed, 2, 700));
        day.add(4, &result("c", State::Failed, 1, 5));
        // A delivery again: nothing counted twice.
        day.add(3, &result("b", State::Failed, 2, 700));
        day.add(2, &result("b", State::WaitingRetry, 1, 900));
        assert_eq!(
            (day.finished, day.succeeded, day.failed, day.applied_to),
            (3, 1, 2, 4)
        );
        assert_eq!(
            day.top_failing(5),
            [("b".to_string(), 1), ("c".to_string(), 1)]
        );
        let longest = day.longest.clone().unwrap();
        assert_eq!(
            (longest.job.as_str(), longest.duration_ms, longest.attempt),
            ("b", 900, Some(1))
        );
        // First attempts only: a, b's first and c.
        assert_eq!(day.latency_count, 3);
        assert_eq!(day.average_latency_ms(), Some(10.0));
    }

    #[test]
    fn latency_counts_from_when_an_attempt_became_due() {
        let mut day = DaySummary::default();
        // Made by its dependencies for a past date (expected at that date's midnight) and
        // released 3 s before it started 40 ms later: 40 ms, not days.
        let mut released = result("down", State::Success, 1, 5);
        released.trigger = Some(Trigger::Deps);
        released.expected_time -= TimeDelta::days(3);
        released.due_at = released.started_at.map(|s| s - TimeDelta::milliseconds(40));
        assert_eq!(
            released.trigger_latency(),
            Some(TimeDelta::milliseconds(40))
        );
        day.add(1, &released);
        // A backfill, due on a past date's schedule, ran "late" by months: ended, no latency.
        let mut backfilled = result("d", State::Success, 1, 5);
        backfilled.trigger = Some(Trigger::Backfill);
        backfilled.started_at = Some(backfilled.expected_time + TimeDelta::days(60));
        day.add(2, &backfilled);
        // A re-run (attempt 3) is no first attempt.
        let mut rerun = result("e", State::Success, 3, 5);
        rerun.started_at = Some(rerun.expected_time + TimeDelta::days(1));
        day.add(3, &rerun);
        // Started before its expected time (a clock a little behind): no negative latency.
        let mut early = result("f", State::Success, 1, 5);
        early.started_at = Some(early.expected_time - TimeDelta::seconds(1));
        day.add(4, &early);
        assert_eq!((day.finished, day.latency_count), (4, 2));
        assert_eq!(day.average_latency_ms(), Some(20.0));
    }
}
