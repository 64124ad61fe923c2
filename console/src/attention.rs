//! What on a business date needs an operator's look, as the dashboard lists it: the jobs
//! failing most, the instances that failed (with the last line they wrote to stderr), those stuck before they ran (waiting
//! on dependencies, for a worker, or for their time, well past when they were due), and those
//! running far longer than their job usually takes. Pure: the index hands the rows and each
//! job's usual duration.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};

use ax_bus::ids::JobName;
use ax_bus::State;

use crate::index::Row;

/// How many of a job's last successful runs its usual duration is the median of.
pub const USUAL_OF: usize = 20;
/// How long past its due time an instance that has not started counts as stuck.
pub const STUCK_AFTER: Duration = Duration::minutes(15);
/// The most rows each list shows (the instance list has the rest).
pub const LISTED: usize = 10;

/// The tags of an instance that waits to run (not a retry's wait: that one is planned).
const WAITING: [&str; 4] = ["waiting_deps", "queued", "no_worker", "scheduled"];

/// An instance that waits to run, and for how long past its due time.
#[derive(Clone, Debug, PartialEq)]
pub struct Stuck {
    /// The instance.
    pub row: Row,
    /// How long since it was due.
    pub waited: Duration,
}

/// An instance running longer than its job usually takes.
#[derive(Clone, Debug, PartialEq)]
pub struct Long {
    /// The instance.
    pub row: Row,
    /// How long it has run.
    pub running: Duration,
    /// How long its job usually takes.
    pub usual: Duration,
}

/// The lists, newest first each, at most [`LISTED`] rows each, with how many there are.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attention {
    /// Failed instances.
    pub failed: Vec<Row>,
    /// How many failed.
    pub failed_count: usize,
    /// Instances stuck before they ran.
    pub stuck: Vec<Stuck>,
    /// How many are stuck.
    pub stuck_count: usize,
    /// Instances running long.
    pub long: Vec<Long>,
    /// How many run long.
    pub long_count: usize,
    /// The jobs with the most failed instances, most first (at most five).
    pub failing_jobs: Vec<(String, u64)>,
}

/// Whether an attempt that has run `running` runs long for a job that usually takes `usual`:
/// more than twice as long, and a minute more at least (a job of seconds is not flagged for a
/// few seconds more).
pub fn runs_long(running: Duration, usual: Duration) -> bool {
    running > usual * 2 && running > usual + Duration::minutes(1)
}

/// The median of `durations` when there are at least three.
pub fn median(mut durations: Vec<Duration>) -> Option<Duration> {
    if durations.len() < 3 {
        return None;
    }
    durations.sort();
    Some(durations[durations.len() / 2])
}

/// The lists of `rows` (one business date's, newest due first) at `now`; `usual` gives a job's
/// usual duration.
pub fn of<'a>(
    rows: impl IntoIterator<Item = &'a Row>,
    usual: impl Fn(&JobName) -> Option<Duration>,
    now: DateTime<Utc>,
) -> Attention {
    let mut attention = Attention::default();
    let mut failing: BTreeMap<&str, u64> = BTreeMap::new();
    for row in rows {
        match row.state {
            State::Failed => {
                *failing.entry(row.job.as_str()).or_default() += 1;
                attention.failed_count += 1;
                if attention.failed.len() < LISTED {
                    attention.failed.push(row.clone());
                }
            }
            State::Running if row.tag == "executing" => {
                let Some(started) = row.started_at else {
                    continue;
                };
                let running = now - started;
                let Some(usual) = usual(&row.job) else {
                    continue;
                };
                if runs_long(running, usual) {
                    attention.long_count += 1;
                    if attention.long.len() < LISTED {
                        attention.long.push(Long {
                            row: row.clone(),
                            running,
                            usual,
                        });
                    }
                }
            }
            State::Running if WAITING.contains(&row.tag) => {
                let waited = now - row.expected_time;
                if waited > STUCK_AFTER {
                    attention.stuck_count += 1;
                    if attention.stuck.len() < LISTED {
                        attention.stuck.push(Stuck {
                            row: row.clone(),
                            waited,
                        });
                    }
                }
            }
            _ => {}
        }
    }
    let mut failing: Vec<(String, u64)> = failing
        .into_iter()
        .map(|(job, n)| (job.to_string(), n))
        .collect();
    failing.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    failing.truncate(FAILING_JOBS);
    attention.failing_jobs = failing;
    attention
}

/// How many of the jobs failing most are named.
const FAILING_JOBS: usize = 5;

#[cfg(test)]
mod tests {
    use super::*;

    fn at(minute: i64) -> DateTime<Utc> {
        chrono::NaiveDate::from_ymd_opt(2026, 12, 1)
            .and_then(|d| d.and_hms_opt(10, 0, 0))
            .map(|t| t.and_utc())
            .unwrap_or_default()
            + Duration::minutes(minute)
    }

    fn row(id: &str, job: &str, state: State, tag: &'static str, due: i64) -> Row {
        Row::sample(id, job, state, tag, at(due))
    }

    #[test]
    fn failed_stuck_and_long_running_instances_are_listed_apart() {
        let now = at(60);
        let mut long = row("etl.2", "etl", State::Running, "executing", 0);
        long.started_at = Some(at(10));
        let mut short = row("etl.3", "etl", State::Running, "executing", 50);
        short.started_at = Some(at(55));
        let mut unknown = row("new.1", "new", State::Running, "executing", 0);
        unknown.started_at = Some(at(0));
        let rows = vec![
            row("a.1", "a", State::Failed, "exit_code", 58),
            row("b.1", "b", State::Running, "waiting_deps", 0),
            row("b.2", "b", State::Running, "waiting_deps", 50),
            row("c.1", "c", State::Running, "queued", 30),
            row("d.1", "d", State::WaitingRetry, "exit_code", 0),
            row("e.1", "e", State::Success, "completed", 0),
            long,
            short,
            unknown,
        ];
        let usual = |job: &JobName| (job.as_str() == "etl").then(|| Duration::minutes(5));
        let attention = of(&rows, usual, now);
        let ids = |rows: Vec<&Row>| -> Vec<String> {
            rows.iter().map(|r| r.instance_id.to_string()).collect()
        };
        assert_eq!(ids(attention.failed.iter().collect()), ["a.1"]);
        // Due 60 and 30 minutes ago; the one due 10 minutes ago is not stuck yet.
        assert_eq!(
            ids(attention.stuck.iter().map(|s| &s.row).collect()),
            ["b.1", "c.1"]
        );
        assert_eq!(attention.stuck[0].waited, Duration::minutes(60));
        // 50 minutes against a usual 5; the one of 5 minutes, and one of a job with no
        // history, are not flagged.
        assert_eq!(
            ids(attention.long.iter().map(|l| &l.row).collect()),
            ["etl.2"]
        );
        assert_eq!(
            (
                attention.failed_count,
                attention.stuck_count,
                attention.long_count
            ),
            (1, 2, 1)
        );
    }

    #[test]
    fn a_job_runs_long_at_twice_its_usual_time_and_a_minute_more() {
        let s = Duration::seconds;
        assert!(!runs_long(s(25), s(10)), "seconds more of a short job");
        assert!(runs_long(s(75), s(10)));
        assert!(!runs_long(s(1100), s(600)));
        assert!(runs_long(s(1300), s(600)));
        assert_eq!(median(vec![s(3), s(1)]), None);
        assert_eq!(median(vec![s(3), s(1), s(100)]), Some(s(3)));
    }

    #[test]
    fn each_list_shows_at_most_ten_and_counts_them_all() {
        let rows: Vec<Row> = (0..25)
            .map(|i| row(&format!("f.{i}"), "f", State::Failed, "exit_code", 0))
            .collect();
        let attention = of(&rows, |_| None, at(0));
        assert_eq!(
            (attention.failed.len(), attention.failed_count),
            (LISTED, 25)
        );
    }
}
