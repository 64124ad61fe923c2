//! Backfills (`ax backfill`, `ax.control.backfill`), carried out by a Scheduler: one instance of
//! a job per business date, in date order, at most `parallel` running at once.
//!
//! The instance for the i-th date is created with a gate on the instance for date i − parallel,
//! so the DagCoordinator starts it only once that one has ended: the dates run in order, never
//! more than `parallel` at a time, and the order survives any restart because it is written into
//! the instances themselves. An instance that exists already for a date (the same job and
//! expected time) is left as it is. With `--with-downstream`, the instances of downstream jobs
//! that run on a cron are created for the matching dates too (they wait on their dependencies);
//! downstream jobs without cron get theirs from the DagCoordinator as usual.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use chrono::{Duration, NaiveDate};

use ax_bus::ids::{InstanceId, JobName};
use ax_bus::instance::Trigger;
use ax_bus::messages::{BackfillRequest, Gate, PlanStep};
use ax_bus::spec::JobSpec;
use ax_bus::State;

use crate::scheduler::control::CommandError;
use crate::scheduler::creator::{Created, Creates};
use crate::scheduler::fire_schedule::FireSchedule;
use crate::scheduler::new_instance::NewInstance;
use crate::scheduler::store::Registry;
use crate::ActorError;
use ax_bus::time::parse_biz_date;
use ax_bus::time::{biz_date_in, start_of_day};

/// The longest backfill, in dates.
pub(crate) const MAX_DATES: i64 = 366;

/// Creates the backfill's instances; a refusal (bad request) or what was created.
pub(crate) async fn backfill(
    registry: &impl Registry,
    creator: &impl Creates,
    request: &BackfillRequest,
) -> Result<Vec<PlanStep>, CommandError> {
    let registry = registry.specs().await?;
    let (spec, from, to) = checked(&registry, request)?;
    let parallel = request.parallel.unwrap_or(1) as usize;
    let downstream = if request.with_downstream {
        cron_downstream(&registry, &spec.name)
    } else {
        Vec::new()
    };
    let mut steps = Vec::new();
    let mut created_ids: Vec<(InstanceId, NaiveDate)> = Vec::new();
    let mut date = from;
    while date <= to {
        let gate = created_ids
            .len()
            .checked_sub(parallel)
            .and_then(|i| created_ids.get(i))
            .map(|(id, gate_date)| Gate {
                instance_id: id.clone(),
                job: spec.name.clone(),
                biz_date: gate_date.format("%Y-%m-%d").to_string(),
            });
        let (id, step) = create(creator, spec, date, gate).await?;
        created_ids.push((id, date));
        steps.push(step);
        for (job, offset) in &downstream {
            if let Some(downstream_spec) = registry.get(job) {
                let (_, step) = create(
                    creator,
                    downstream_spec,
                    date - Duration::days(*offset),
                    None,
                )
                .await?;
                steps.push(step);
            }
        }
        date += Duration::days(1);
    }
    Ok(steps)
}

/// The job and the dates of a backfill request, or why it is refused.
fn checked<'a>(
    registry: &'a BTreeMap<JobName, JobSpec>,
    request: &BackfillRequest,
) -> Result<(&'a JobSpec, NaiveDate, NaiveDate), CommandError> {
    let Some(spec) = registry.get(&request.job) else {
        return Err(CommandError::refused(format!(
            "no job named `{}`",
            request.job
        )));
    };
    let (from, to) = match (parse_biz_date(&request.from), parse_biz_date(&request.to)) {
        (Some(from), Some(to)) => (from, to),
        (None, _) => {
            return Err(CommandError::refused(format!(
                "--from `{}` is not a date (YYYY-MM-DD)",
                request.from
            )))
        }
        (_, None) => {
            return Err(CommandError::refused(format!(
                "--to `{}` is not a date (YYYY-MM-DD)",
                request.to
            )))
        }
    };
    if from > to {
        return Err(CommandError::refused(format!(
            "--from {from} is after --to {to}"
        )));
    }
    if request.parallel == Some(0) {
        return Err(CommandError::refused(
            "--parallel 0: at least 1 instance must run at once",
        ));
    }
    if (to - from).num_days() >= MAX_DATES {
        return Err(CommandError::refused(format!(
            "a backfill covers at most {MAX_DATES} dates"
        )));
    }
    Ok((spec, from, to))
}

/// The instance of `spec` for `date`: at the job's first cron fire of that date, or at the
/// start of the date for a job without cron.
fn expected_time(spec: &JobSpec, date: NaiveDate) -> chrono::DateTime<chrono::Utc> {
    let tz: chrono_tz::Tz = spec.timezone.parse().unwrap_or(chrono_tz::UTC);
    let start = start_of_day(tz, date);
    spec.cron
        .as_deref()
        .and_then(|cron| FireSchedule::new(cron, &spec.timezone).ok())
        .and_then(|schedule| schedule.next_after(start - Duration::milliseconds(1)))
        .filter(|fire| biz_date_in(tz, *fire) == date.format("%Y-%m-%d").to_string())
        .unwrap_or(start)
}

async fn create(
    creator: &impl Creates,
    spec: &JobSpec,
    date: NaiveDate,
    gate: Option<Gate>,
) -> Result<(InstanceId, PlanStep), ActorError> {
    let biz_date = date.format("%Y-%m-%d").to_string();
    let mut instance = NewInstance::new(
        spec,
        expected_time(spec, date),
        biz_date.clone(),
        spec.params.clone(),
        Trigger::Backfill,
        ax_bus::time::now(),
    );
    instance.work.gate = gate.clone();
    let id = instance.record.instance_id.clone();
    let created = creator.create(instance).await?;
    let (will_run, why) = match (created, gate) {
        (Created::Fired, Some(gate)) => (true, format!("created; runs after {}", gate.instance_id)),
        (Created::Fired, None) => (true, "created".to_string()),
        _ => (false, "exists already; left as it is".to_string()),
    };
    Ok((
        id.clone(),
        PlanStep {
            instance_id: id,
            job: spec.name.clone(),
            biz_date,
            state: State::Running,
            will_run,
            why,
            rewrites: spec.produces.clone(),
        },
    ))
}

/// Jobs with a cron downstream of `root` (transitively), with their total date offset.
fn cron_downstream(registry: &BTreeMap<JobName, JobSpec>, root: &JobName) -> Vec<(JobName, i64)> {
    let mut found = Vec::new();
    let mut seen = BTreeSet::from([root.clone()]);
    let mut queue = VecDeque::from([(root.clone(), 0i64)]);
    while let Some((job, offset)) = queue.pop_front() {
        for spec in registry.values() {
            for dep in spec.deps.iter().filter(|d| d.name == job) {
                let Ok(dep_offset) = dep.offset_days() else {
                    continue;
                };
                if seen.insert(spec.name.clone()) {
                    let total = offset + dep_offset;
                    if spec.cron.is_some() {
                        found.push((spec.name.clone(), total));
                    }
                    queue.push_back((spec.name.clone(), total));
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::spec;

    #[test]
    fn downstream_cron_jobs_are_found_with_their_offsets() {
        let registry: BTreeMap<JobName, JobSpec> = [
            spec("a", Some("0 1 * * *"), &[]),
            spec("b", None, &[("a", "current")]),
            spec("c", Some("0 3 * * *"), &[("b", "-1d")]),
        ]
        .into_iter()
        .map(|s| (s.name.clone(), s))
        .collect();
        let a = JobName::parse("a").unwrap();
        let c = JobName::parse("c").unwrap();
        assert_eq!(cron_downstream(&registry, &a), [(c, -1)]);
    }

    #[test]
    fn a_cron_job_is_backfilled_at_its_first_fire_of_the_date() {
        let daily = spec("a", Some("30 2 * * *"), &[]);
        let date = parse_biz_date("2026-03-08").unwrap();
        let mut zoned = daily.clone();
        zoned.timezone = "America/New_York".into();
        // 02:30 does not exist that day in New York: the fire is at 03:00 new time.
        assert_eq!(
            ax_bus::time::rfc3339(expected_time(&zoned, date)),
            "2026-03-08T07:00:00.000Z"
        );
        assert_eq!(
            ax_bus::time::rfc3339(expected_time(&daily, date)),
            "2026-03-08T02:30:00.000Z"
        );
        let plain = spec("b", None, &[]);
        assert_eq!(
            ax_bus::time::rfc3339(expected_time(&plain, date)),
            "2026-03-08T00:00:00.000Z"
        );
    }

    mod carried_out {
        use super::super::*;
        use crate::scheduler::store::memory::{Made, Memory};
        use crate::test_fixtures::spec;

        /// `load` daily at 01:00, `report` (no cron) on it, `mail` daily on report's day before.
        fn registry() -> Memory {
            Memory::default().registering([
                spec("load", Some("0 1 * * *"), &[]),
                spec("report", None, &[("load", "current")]),
                spec("mail", Some("0 3 * * *"), &[("report", "-1d")]),
            ])
        }

        fn request(from: &str, to: &str, parallel: Option<u32>) -> BackfillRequest {
            BackfillRequest {
                job: JobName::parse("load").unwrap(),
                from: from.into(),
                to: to.into(),
                with_downstream: false,
                parallel,
                requested_by: "ops@host".into(),
            }
        }

        fn refused(outcome: Result<Vec<PlanStep>, CommandError>) -> String {
            match outcome {
                Err(CommandError::Refused(why)) => why.join("; "),
                other => panic!("not refused: {other:?}"),
            }
        }

        #[tokio::test]
        async fn each_date_is_one_instance_gated_on_the_one_parallel_dates_before() {
            let (registry, made) = (registry(), Made::default());
            let plan = backfill(
                &registry,
                &made,
                &request("2026-01-01", "2026-01-04", Some(2)),
            )
            .await
            .unwrap();
            let made = made.made.lock().unwrap();
            let dates: Vec<_> = made.iter().map(|m| m.record.biz_date.as_str()).collect();
            assert_eq!(
                dates,
                ["2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"]
            );
            let gates: Vec<_> = made
                .iter()
                .map(|m| m.work.gate.as_ref().map(|g| g.instance_id.clone()))
                .collect();
            assert_eq!(gates[..2], [None, None]);
            assert_eq!(gates[2].as_ref(), Some(&made[0].record.instance_id));
            assert_eq!(gates[3].as_ref(), Some(&made[1].record.instance_id));
            assert!(made.iter().all(|m| m.record.trigger == Trigger::Backfill));
            assert_eq!(
                ax_bus::time::rfc3339(made[0].record.expected_time),
                "2026-01-01T01:00:00.000Z"
            );
            assert!(plan.iter().all(|s| s.will_run));
            assert!(plan[2].why.starts_with("created; runs after "), "{plan:?}");
        }

        #[tokio::test]
        async fn a_date_that_has_its_instance_is_left_as_it_is() {
            let (registry, made) = (registry(), Made::default());
            backfill(&registry, &made, &request("2026-01-02", "2026-01-02", None))
                .await
                .unwrap();
            let plan = backfill(&registry, &made, &request("2026-01-01", "2026-01-03", None))
                .await
                .unwrap();
            let runs: Vec<_> = plan.iter().map(|s| s.will_run).collect();
            assert_eq!(runs, [true, false, true]);
            assert_eq!(plan[1].why, "exists already; left as it is");
            assert_eq!(made.made.lock().unwrap().len(), 3);
        }

        #[tokio::test]
        async fn with_downstream_its_cron_jobs_get_their_offset_dates() {
            let (registry, made) = (registry(), Made::default());
            let asked = BackfillRequest {
                with_downstream: true,
                ..request("2026-01-01", "2026-01-02", None)
            };
            let plan = backfill(&registry, &made, &asked).await.unwrap();
            let steps: Vec<_> = plan
                .iter()
                .map(|s| (s.job.as_str(), s.biz_date.as_str()))
                .collect();
            // mail reads report's day before: load's 1 January is mail's 2 January.
            assert_eq!(
                steps,
                [
                    ("load", "2026-01-01"),
                    ("mail", "2026-01-02"),
                    ("load", "2026-01-02"),
                    ("mail", "2026-01-03"),
                ]
            );
        }

        #[tokio::test]
        async fn a_bad_backfill_is_refused_naming_why_and_makes_nothing() {
            let (registry, made) = (registry(), Made::default());
            let cases = [
                (
                    request("2026-01-02", "2026-01-01", None),
                    "--from 2026-01-02 is after --to 2026-01-01",
                ),
                (
                    request("2026-01-01", "2026-01-02", Some(0)),
                    "--parallel 0: at least 1 instance must run at once",
                ),
                (
                    request("2026-01-01", "2027-01-02", None),
                    "a backfill covers at most 366 dates",
                ),
                (
                    request("01/01/2026", "2026-01-02", None),
                    "--from `01/01/2026` is not a date (YYYY-MM-DD)",
                ),
                (
                    BackfillRequest {
                        job: JobName::parse("nope").unwrap(),
                        ..request("2026-01-01", "2026-01-01", None)
                    },
                    "no job named `nope`",
                ),
            ];
            for (asked, why) in cases {
                assert_eq!(refused(backfill(&registry, &made, &asked).await), why);
            }
            assert!(made.made.lock().unwrap().is_empty());
        }
    }
}
