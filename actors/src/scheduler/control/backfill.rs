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
use ax_bus::{AxClient, State};

use crate::scheduler::control::CommandError;
use crate::scheduler::creator::{Created, Creator};
use crate::scheduler::fire_schedule::FireSchedule;
use crate::scheduler::new_instance::NewInstance;
use crate::ActorError;
use ax_bus::time::parse_biz_date;
use ax_bus::time::{biz_date_in, start_of_day};

/// The longest backfill, in dates.
pub(crate) const MAX_DATES: i64 = 366;

/// Creates the backfill's instances; a refusal (bad request) or what was created.
pub(crate) async fn backfill(
    client: &AxClient,
    creator: &Creator,
    request: &BackfillRequest,
) -> Result<Vec<PlanStep>, CommandError> {
    let registry = client.job_specs().await?;
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
    creator: &Creator,
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
}
