//! Manual re-runs (`ax rerun`, `ax.control.rerun`), carried out by a Scheduler.
//!
//! A re-run starts from roots — one instance (`--instance`), the instances of a job for a
//! business date (`--biz-date --root`), or every instance of a date whose job no other job of
//! that date depends on (`--biz-date`) — and follows the dependency graph down, date offsets
//! included. Each instance reached gets a line in the plan:
//! - a root runs again, unless `--failed-only` and it succeeded;
//! - a downstream instance runs again if it failed or was cancelled; a succeeded one stays
//!   unless `--force-downstream` (its output may already have been used);
//! - an instance still running or waiting for a retry stays.
//!
//! Instances run again in dependency order, each as a new attempt of the same instance (same id,
//! original params, a fresh retry budget), handed to the DagCoordinator, which holds each one
//! until its upstream's new attempt has succeeded. `--dry-run` returns the plan and changes
//! nothing. Every re-run, dry or not, is recorded on `ax.audit.rerun` by the control desk: who,
//! when, what, how, and the approval it needed.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use chrono::{Duration, NaiveDate};

use ax_bus::client::Updated;
use ax_bus::ids::{InstanceId, JobName, TraceId};
use ax_bus::messages::{DateInstances, PlanStep, RerunRequest, WorkItem};
use ax_bus::spec::JobSpec;
use ax_bus::State;

use crate::scheduler::control::CommandError;
use crate::scheduler::store::{History, Instances, Registry};
use crate::ActorError;
use ax_bus::client::deps::DayKey;
use ax_bus::time::parse_biz_date;

/// upstream job → (downstream job, date offset).
pub(crate) type Dependents = HashMap<JobName, Vec<(JobName, i64)>>;

/// Plans and (unless a dry run) carries out a re-run.
pub(crate) async fn rerun(
    store: &(impl Registry + Instances + History),
    request: &RerunRequest,
) -> Result<Vec<PlanStep>, CommandError> {
    let registry = store.specs().await?;
    let (roots, mut entries) = find_roots(store, request, &registry).await?;
    let dependents = dependents(&registry, request.force_downstream);
    let mut queue: VecDeque<DayKey> = entries.keys().cloned().collect();
    while let Some((job, date)) = queue.pop_front() {
        for (downstream, offset) in dependents.get(&job).into_iter().flatten() {
            let key = (downstream.clone(), date - Duration::days(*offset));
            if entries.contains_key(&key) {
                continue;
            }
            let day = store.day(&key.0, key.1).await?;
            if !day.instances.is_empty() {
                entries.insert(key.clone(), day);
                queue.push_back(key);
            }
        }
    }
    if request.biz_date.is_some() {
        // Every instance of the roots' days runs again: each must still have its record.
        refuse_noted_past_retention(store, &registry, &entries).await?;
    }
    let mut plan = decide(request, &dependents, &entries, &roots);
    for step in &mut plan {
        step.rewrites = registry
            .get(&step.job)
            .map(|spec| spec.produces.clone())
            .unwrap_or_default();
    }
    refuse_removed(store, &plan).await?;
    if !request.dry_run {
        for step in plan.iter_mut().filter(|s| s.will_run) {
            start_again(store, &registry, step).await?;
        }
    }
    Ok(plan)
}

/// Refuses a plan that would re-run an instance whose record is gone (its retention passed,
/// while the dependency history, kept longer, still lists it): a re-run starts again from the
/// record, so none of the plan is carried out.
async fn refuse_removed(store: &impl Instances, plan: &[PlanStep]) -> Result<(), CommandError> {
    let mut removed = Vec::new();
    for step in plan.iter().filter(|s| s.will_run) {
        if store.record(&step.instance_id).await?.is_none() {
            removed.push(step.instance_id.to_string());
        }
    }
    if removed.is_empty() {
        return Ok(());
    }
    let count = removed.len();
    removed.truncate(5);
    Err(CommandError::refused(format!(
        "cannot re-run: {count} instance(s) of the plan ended longer ago than their retention \
         (their job's `retention`, else `[retention] instances`) and their records were removed \
         ({}{}); nothing was re-run",
        removed.join(", "),
        if count > removed.len() { ", …" } else { "" }
    )))
}

/// Refuses a plan over a day of a job nothing depended on whose first instance was noted
/// longer ago than the job's retention: such a day lists its instances from their records,
/// and some may have been removed (where an entry per instance would still name them, see
/// [`refuse_removed`]), so none of the plan is carried out rather than a part.
async fn refuse_noted_past_retention(
    store: &impl Instances,
    registry: &BTreeMap<JobName, JobSpec>,
    entries: &BTreeMap<DayKey, DateInstances>,
) -> Result<(), CommandError> {
    let now = ax_bus::time::now();
    let mut gone = Vec::new();
    for ((job, date), day) in entries {
        let Some(noted_at) = day.noted_at else {
            continue;
        };
        let mut retention = registry.get(job).and_then(|spec| spec.retention);
        if retention.is_none() {
            if let Some(id) = day.instances.keys().next() {
                retention = store.record(id).await?.and_then(|r| r.retention);
            }
        }
        let kept = retention.map(|secs| Duration::seconds(i64::try_from(secs).unwrap_or(i64::MAX)));
        let past = match kept {
            Some(kept) => noted_at
                .checked_add_signed(kept)
                .is_some_and(|until| until < now),
            // No instance left to say: all are gone.
            None => day.instances.is_empty(),
        };
        if past {
            gone.push(format!("`{job}` for {date}"));
        }
    }
    if gone.is_empty() {
        return Ok(());
    }
    Err(CommandError::refused(format!(
        "cannot re-run: some instances of {} may have ended longer ago than their retention \
         (their job's `retention`, else `[retention] instances`) and their records been removed; \
         nothing was re-run",
        gone.join(", ")
    )))
}

/// Which instances are roots, with the (job, date) entries they belong to.
type Roots = (BTreeSet<InstanceId>, BTreeMap<DayKey, DateInstances>);

async fn find_roots(
    store: &(impl Instances + History),
    request: &RerunRequest,
    registry: &BTreeMap<JobName, JobSpec>,
) -> Result<Roots, CommandError> {
    let mut entries = BTreeMap::new();
    let mut roots = BTreeSet::new();
    match (&request.instance, &request.biz_date) {
        (Some(_), Some(_)) | (None, None) => {
            return Err(CommandError::refused(
                "give either --instance or --biz-date",
            ))
        }
        (Some(id), None) => {
            if request.root.is_some() {
                return Err(CommandError::refused(
                    "--root goes with --biz-date, not --instance",
                ));
            }
            let Some(record) = store.record(id).await? else {
                return Err(CommandError::refused(ax_bus::client::retention::missing(
                    id,
                )));
            };
            let Some(date) = parse_biz_date(&record.biz_date) else {
                return Err(CommandError::refused(format!(
                    "instance `{id}` has no valid business date"
                )));
            };
            let key = (record.job.clone(), date);
            let mut day = store.day(&key.0, key.1).await?;
            day.instances
                .insert(record.instance_id.clone(), (record.attempt, record.state));
            entries.insert(key, day);
            roots.insert(record.instance_id);
        }
        (None, Some(date_text)) => {
            let Some(date) = parse_biz_date(date_text) else {
                return Err(CommandError::refused(format!(
                    "--biz-date `{date_text}` is not a date (YYYY-MM-DD)"
                )));
            };
            entries.extend(store.date(date).await?);
            let day_jobs: BTreeSet<&JobName> = entries.keys().map(|(j, _)| j).collect();
            let root_jobs: Vec<JobName> = match &request.root {
                Some(root) => {
                    if !registry.contains_key(root) {
                        return Err(CommandError::refused(format!("no job named `{root}`")));
                    }
                    if !day_jobs.contains(root) {
                        return Err(CommandError::refused(format!(
                            "no instance of `{root}` for {date}"
                        )));
                    }
                    vec![root.clone()]
                }
                None => {
                    if entries.is_empty() {
                        return Err(CommandError::refused(format!("no instance for {date}")));
                    }
                    // Jobs of the date that no other job of the date depends on.
                    day_jobs
                        .iter()
                        .filter(|job| {
                            !registry.get(**job).is_some_and(|spec| {
                                spec.deps
                                    .iter()
                                    .any(|d| d.offset_days() == Ok(0) && day_jobs.contains(&d.name))
                            })
                        })
                        .map(|j| (*j).clone())
                        .collect()
                }
            };
            entries.retain(|(job, _), _| root_jobs.contains(job));
            for day in entries.values() {
                roots.extend(day.instances.keys().cloned());
            }
        }
    }
    Ok((roots, entries))
}

/// upstream job → (downstream job, offset).
///
/// With `datasets`, a job that consumes a dataset another writes counts as its dependent for
/// the same business date too (what `--force-downstream` follows).
fn dependents(registry: &BTreeMap<JobName, JobSpec>, datasets: bool) -> Dependents {
    let mut map = Dependents::new();
    for spec in registry.values() {
        for dep in &spec.deps {
            if let Ok(offset) = dep.offset_days() {
                map.entry(dep.name.clone())
                    .or_default()
                    .push((spec.name.clone(), offset));
            }
        }
    }
    if datasets {
        let lineage = ax_bus::spec::dataset::Lineage::of(registry.values());
        for spec in registry.values() {
            for uri in &spec.produces {
                for reader in lineage.consumers(uri).filter(|j| **j != spec.name) {
                    let edges = map.entry(spec.name.clone()).or_default();
                    if !edges.contains(&(reader.clone(), 0)) {
                        edges.push((reader.clone(), 0));
                    }
                }
            }
        }
    }
    map
}

/// The plan: every instance of `entries`, upstream before downstream, with its fate.
pub(crate) fn decide(
    request: &RerunRequest,
    dependents: &Dependents,
    entries: &BTreeMap<DayKey, DateInstances>,
    roots: &BTreeSet<InstanceId>,
) -> Vec<PlanStep> {
    // Kahn's order over the (job, date) entries, so an upstream is always re-run first.
    let mut indegree: BTreeMap<&DayKey, usize> = entries.keys().map(|k| (k, 0)).collect();
    let edges = |key: &DayKey| -> Vec<DayKey> {
        dependents
            .get(&key.0)
            .into_iter()
            .flatten()
            .map(|(job, offset)| (job.clone(), key.1 - Duration::days(*offset)))
            .filter(|k| entries.contains_key(k) && k != key)
            .collect()
    };
    for key in entries.keys() {
        for next in edges(key) {
            if let Some(n) = indegree.get_mut(&next) {
                *n += 1;
            }
        }
    }
    let mut ready: VecDeque<DayKey> = indegree
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(k, _)| (*k).clone())
        .collect();
    let mut order = Vec::new();
    let mut placed: BTreeSet<DayKey> = BTreeSet::new();
    while let Some(key) = ready.pop_front() {
        placed.insert(key.clone());
        for next in edges(&key) {
            if let Some(n) = indegree.get_mut(&next) {
                *n = n.saturating_sub(1);
                if *n == 0 && !placed.contains(&next) {
                    ready.push_back(next);
                }
            }
        }
        order.push(key);
    }
    order.extend(entries.keys().filter(|k| !placed.contains(*k)).cloned());
    let mut steps = Vec::new();
    for key in order {
        let Some(day) = entries.get(&key) else {
            continue;
        };
        for (id, (_, state)) in &day.instances {
            let is_root = roots.contains(id);
            if request.instance.is_some() && key_has_root(day, roots) && !is_root {
                // Another instance of the same job and date as the named one: not asked for.
                continue;
            }
            let (will_run, why) = fate(request, is_root, *state);
            steps.push(PlanStep {
                instance_id: id.clone(),
                job: key.0.clone(),
                biz_date: date_text(key.1),
                state: *state,
                will_run,
                why,
                rewrites: Vec::new(),
            });
        }
    }
    steps
}

fn key_has_root(day: &DateInstances, roots: &BTreeSet<InstanceId>) -> bool {
    day.instances.keys().any(|id| roots.contains(id))
}

fn date_text(date: NaiveDate) -> String {
    date.format("%Y-%m-%d").to_string()
}

fn fate(request: &RerunRequest, is_root: bool, state: State) -> (bool, String) {
    if !state.is_final() {
        return (false, format!("still {state}"));
    }
    match (is_root, state) {
        (true, State::Success) if request.failed_only => {
            (false, "succeeded; --failed-only leaves it".into())
        }
        (true, _) => (true, format!("root; was {state}")),
        (false, State::Success) if request.force_downstream => {
            (true, "downstream; succeeded; --force-downstream".into())
        }
        (false, State::Success) => (
            false,
            "downstream; succeeded; stays (use --force-downstream to re-run it)".into(),
        ),
        (false, _) => (true, format!("downstream; was {state}")),
    }
}

/// Starts a planned instance again; a step whose instance moved meanwhile becomes "stays".
async fn start_again(
    store: &impl Instances,
    registry: &BTreeMap<JobName, JobSpec>,
    step: &mut PlanStep,
) -> Result<(), ActorError> {
    let Some(spec) = registry.get(&step.job) else {
        step.will_run = false;
        step.why = "its job was deleted".into();
        return Ok(());
    };
    let trace = TraceId::random();
    let record = match store.update(&step.instance_id, |r| r.rerun(&trace)).await? {
        Updated::Written(record, _) => *record,
        Updated::Refused(refused) => {
            step.will_run = false;
            step.why = format!("not re-run: {refused}");
            return Ok(());
        }
        Updated::Missing => {
            step.will_run = false;
            step.why = "the instance record is gone".into();
            return Ok(());
        }
    };
    let work = WorkItem::for_attempt(&record, spec.clone());
    store.hand_on(&record, &work).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(text: &str) -> InstanceId {
        InstanceId::parse(text).unwrap()
    }

    fn job(name: &str) -> JobName {
        JobName::parse(name).unwrap()
    }

    fn request(failed_only: bool, force: bool) -> RerunRequest {
        RerunRequest {
            instance: None,
            biz_date: Some("2026-01-01".into()),
            root: Some(job("a")),
            failed_only,
            force_downstream: force,
            dry_run: true,
            requested_by: "test".into(),
        }
    }

    fn day(name: &str, state: State) -> DateInstances {
        DateInstances {
            instances: [(id(name), (1, state))].into_iter().collect(),
            ..Default::default()
        }
    }

    /// a -> b (same date) -> c (next date), and d depends on a but succeeded.
    fn graph() -> (Dependents, BTreeMap<DayKey, DateInstances>) {
        let d1 = parse_biz_date("2026-01-01").unwrap();
        let d2 = parse_biz_date("2026-01-02").unwrap();
        let dependents: Dependents = [
            (job("a"), vec![(job("b"), 0), (job("d"), 0)]),
            (job("b"), vec![(job("c"), -1)]),
        ]
        .into_iter()
        .collect();
        let entries = [
            ((job("c"), d2), day("c.2", State::Cancelled)),
            ((job("b"), d1), day("b.1", State::Failed)),
            ((job("a"), d1), day("a.1", State::Success)),
            ((job("d"), d1), day("d.1", State::Success)),
        ]
        .into_iter()
        .collect();
        (dependents, entries)
    }

    fn lines(steps: &[PlanStep]) -> Vec<(String, bool)> {
        steps
            .iter()
            .map(|s| (s.instance_id.to_string(), s.will_run))
            .collect()
    }

    #[test]
    fn the_default_reruns_the_root_and_what_failed_below_it() {
        let (dependents, entries) = graph();
        let roots = [id("a.1")].into_iter().collect();
        let steps = decide(&request(false, false), &dependents, &entries, &roots);
        assert_eq!(
            lines(&steps),
            [
                ("a.1".into(), true),
                ("b.1".into(), true),
                ("d.1".into(), false),
                ("c.2".into(), true)
            ]
        );
        assert!(steps[2].why.contains("--force-downstream"));
    }

    #[test]
    fn failed_only_leaves_every_success_alone() {
        let (dependents, entries) = graph();
        let roots = [id("a.1")].into_iter().collect();
        let steps = decide(&request(true, false), &dependents, &entries, &roots);
        assert_eq!(
            lines(&steps),
            [
                ("a.1".into(), false),
                ("b.1".into(), true),
                ("d.1".into(), false),
                ("c.2".into(), true)
            ]
        );
    }

    #[test]
    fn force_downstream_reruns_succeeded_downstream_instances_too() {
        let (dependents, entries) = graph();
        let roots = [id("a.1")].into_iter().collect();
        let steps = decide(&request(false, true), &dependents, &entries, &roots);
        assert!(steps.iter().all(|s| s.will_run));
    }

    #[test]
    fn running_instances_stay() {
        let (dependents, mut entries) = graph();
        let d1 = parse_biz_date("2026-01-01").unwrap();
        entries.insert((job("b"), d1), day("b.1", State::WaitingRetry));
        let roots = [id("a.1")].into_iter().collect();
        let steps = decide(&request(false, false), &dependents, &entries, &roots);
        assert_eq!(steps[1].why, "still waiting_retry");
        assert!(!steps[1].will_run);
    }

    mod carried_out {
        use ax_bus::InstanceRecord;

        use super::*;
        use crate::scheduler::store::memory::Memory;
        use crate::test_fixtures::{ended, spec};

        /// load (failed) ← report (cancelled, same day) ← mail (succeeded, same day).
        fn chain() -> (Memory, [InstanceRecord; 3]) {
            let specs = [
                spec("load", None, &[]),
                spec("report", None, &[("load", "current")]),
                spec("mail", None, &[("report", "current")]),
            ];
            let records = [
                ended(&specs[0], "2026-01-01", State::Failed),
                ended(&specs[1], "2026-01-01", State::Cancelled),
                ended(&specs[2], "2026-01-01", State::Success),
            ];
            let memory = Memory::with(records.clone())
                .registering(specs)
                .with_history();
            (memory, records)
        }

        fn one(record: &InstanceRecord, dry_run: bool) -> RerunRequest {
            RerunRequest {
                instance: Some(record.instance_id.clone()),
                dry_run,
                requested_by: "ops@host".into(),
                ..RerunRequest::default()
            }
        }

        fn refused(outcome: Result<Vec<PlanStep>, CommandError>) -> String {
            match outcome {
                Err(CommandError::Refused(why)) => why.join("; "),
                other => panic!("not refused: {other:?}"),
            }
        }

        /// A day of a job nothing depends on lists the instances whose records are kept: once
        /// its first instance was noted longer ago than the job's retention, some may be gone,
        /// and a re-run of the date is refused whole; one of an instance is not.
        #[tokio::test]
        async fn a_date_noted_longer_ago_than_its_retention_is_refused_whole() {
            let mut solo = spec("solo", None, &[]);
            solo.retention = Some(3600);
            let record = ended(&solo, "2026-01-01", State::Failed);
            let memory = Memory::with([record.clone()])
                .registering([solo])
                .with_history();
            let date = parse_biz_date("2026-01-01").unwrap();
            let note = |hours_ago: i64| {
                let at = ax_bus::time::now() - Duration::hours(hours_ago);
                let mut days = memory.days.lock().unwrap();
                days.get_mut(&(job("solo"), date)).unwrap().noted_at = Some(at);
            };
            let by_date = RerunRequest {
                biz_date: Some("2026-01-01".into()),
                dry_run: true,
                ..RerunRequest::default()
            };
            note(0);
            let plan = rerun(&memory, &by_date).await.unwrap();
            assert_eq!(plan.len(), 1);
            note(2);
            let why = refused(rerun(&memory, &by_date).await);
            assert!(
                why.contains("`solo` for 2026-01-01") && why.contains("nothing was re-run"),
                "{why}"
            );
            let plan = rerun(&memory, &one(&record, true)).await.unwrap();
            assert_eq!(plan.len(), 1);
        }

        #[tokio::test]
        async fn a_rerun_starts_the_root_and_what_failed_below_it_as_new_attempts() {
            let (memory, [load, report, mail]) = chain();
            let plan = rerun(&memory, &one(&load, false)).await.unwrap();
            let runs: Vec<_> = plan.iter().map(|s| (s.job.as_str(), s.will_run)).collect();
            assert_eq!(runs, [("load", true), ("report", true), ("mail", false)]);
            let handed: Vec<_> = memory
                .handed
                .lock()
                .unwrap()
                .iter()
                .map(|w| w.instance_id.clone())
                .collect();
            assert_eq!(
                handed,
                [load.instance_id.clone(), report.instance_id.clone()]
            );
            let records = memory.records.lock().unwrap();
            for record in [&load, &report] {
                let now = &records[&record.instance_id];
                assert_eq!((now.attempt, now.state), (2, State::Running));
                assert_ne!(now.trace_id, record.trace_id, "a new attempt, a new trace");
            }
            assert_eq!(records[&mail.instance_id], mail, "a success below stays");
        }

        #[tokio::test]
        async fn a_dry_run_plans_and_changes_nothing() {
            let (memory, [load, ..]) = chain();
            let plan = rerun(&memory, &one(&load, true)).await.unwrap();
            assert_eq!(plan.len(), 3);
            assert!(memory.handed.lock().unwrap().is_empty());
            assert_eq!(memory.records.lock().unwrap()[&load.instance_id], load);
        }

        #[tokio::test]
        async fn a_plan_with_a_removed_record_runs_none_of_it() {
            let (memory, [load, report, _]) = chain();
            memory.records.lock().unwrap().remove(&report.instance_id);
            let why = refused(rerun(&memory, &one(&load, false)).await);
            assert!(why.contains("their records were removed"), "{why}");
            assert!(why.contains(report.instance_id.as_str()), "{why}");
            assert!(memory.handed.lock().unwrap().is_empty());
            assert_eq!(memory.records.lock().unwrap()[&load.instance_id], load);
        }

        #[tokio::test]
        async fn a_bad_request_is_refused_naming_what_is_wrong() {
            let (memory, [load, ..]) = chain();
            let both = RerunRequest {
                biz_date: Some("2026-01-01".into()),
                ..one(&load, false)
            };
            assert!(
                refused(rerun(&memory, &both).await).contains("either --instance or --biz-date")
            );
            let bad_date = RerunRequest {
                biz_date: Some("01/01/2026".into()),
                ..RerunRequest::default()
            };
            assert!(refused(rerun(&memory, &bad_date).await).contains("is not a date"));
            let no_root = RerunRequest {
                biz_date: Some("2026-01-01".into()),
                root: Some(job("nope")),
                ..RerunRequest::default()
            };
            assert_eq!(
                refused(rerun(&memory, &no_root).await),
                "no job named `nope`"
            );
            let gone = RerunRequest {
                instance: Some(id("load.20250101T000000000Z")),
                ..RerunRequest::default()
            };
            assert!(!refused(rerun(&memory, &gone).await).is_empty());
            assert!(memory.handed.lock().unwrap().is_empty());
        }

        #[tokio::test]
        async fn an_instance_that_started_since_its_day_was_read_stays() {
            let (memory, [load, report, _]) = chain();
            // The history still says cancelled; the record, read when starting it, says running.
            {
                let mut records = memory.records.lock().unwrap();
                records.get_mut(&report.instance_id).unwrap().state = State::Running;
            }
            let plan = rerun(&memory, &one(&load, false)).await.unwrap();
            assert!(plan[0].will_run, "{plan:?}");
            assert!(!plan[1].will_run, "{plan:?}");
            assert!(plan[1].why.starts_with("not re-run: "), "{plan:?}");
            let handed = memory.handed.lock().unwrap();
            assert_eq!(handed.len(), 1);
            assert_eq!(handed[0].instance_id, load.instance_id);
        }

        #[tokio::test]
        async fn a_root_still_running_stays() {
            let (memory, [load, report, _]) = chain();
            {
                let mut records = memory.records.lock().unwrap();
                records.get_mut(&load.instance_id).unwrap().state = State::Running;
            }
            let plan = rerun(&memory, &one(&load, false)).await.unwrap();
            assert_eq!(
                (plan[0].will_run, plan[0].why.as_str()),
                (false, "still running")
            );
            // What failed below it runs again once the root's attempt ends well: the
            // DagCoordinator holds it until then.
            let handed = memory.handed.lock().unwrap();
            assert_eq!(handed.len(), 1);
            assert_eq!(handed[0].instance_id, report.instance_id);
        }
    }
}
