//! The job commands: `apply` (create or update jobs, all or nothing), `delete`, `pause` and
//! `resume`. Each changes the registry (`ax_jobs`) with compare-and-swap, so two at once never
//! lose one another's change; a one-off job's waiting instance follows its job (see
//! [`crate::scheduler::one_off`]).

use ax_bus::ids::JobName;
use ax_bus::instance::Trigger;
use ax_bus::messages::typed::{Applied, Done};
use ax_bus::messages::{ApplyRequest, Change, JobChange, JobRecord};
use ax_bus::spec;

use super::CommandError;
use crate::scheduler::new_instance::NewInstance;
use crate::scheduler::one_off::{self, OneOffs};
use crate::scheduler::store::Registry;
use crate::ActorError;

/// What a problem in an apply's `yaml` names as its file.
pub(crate) const YAML_SOURCE: &str = "yaml";

/// What an apply is checked against besides the registry.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    /// How far ahead a one-off job's `at` may be (`[scheduler] max_delay_days`).
    pub(super) max_delay: std::time::Duration,
    /// The largest message the server takes: every fire's hand-off carries the job.
    pub(super) max_payload: usize,
}

pub(super) async fn apply(
    (registry, one_offs): (&impl Registry, &impl OneOffs),
    mut request: ApplyRequest,
    limits: Limits,
) -> Result<Applied, CommandError> {
    if let Some(text) = request.yaml.take() {
        let parsed = spec::yaml::parse_str(YAML_SOURCE, &text)
            .map_err(|e| CommandError::refused(e.to_string()))?;
        request.jobs.extend(parsed.into_iter().map(|job| job.doc));
    }
    let registered: Vec<spec::JobSpec> = registry.specs().await?.into_values().collect();
    checked(&request.jobs, &registered, limits).map_err(CommandError::Refused)?;
    let held = registered.iter().map(|s| &s.name).collect();
    let over = super::namespace::over_quota(
        request.jobs.iter().map(|d| &d.job.name),
        &held,
        &registry.namespaces().await?,
    );
    if !over.is_empty() {
        return Err(CommandError::Refused(over));
    }
    let mut changes = Vec::new();
    for doc in request.jobs {
        let previous_at = match registry.job(&doc.job.name).await? {
            Some((record, _)) => record.spec.at,
            None => None,
        };
        let (change, defined_at) = store_job(registry, doc.job.clone()).await?;
        let stored = one_off::Stored {
            spec: &doc.job,
            change: change.change,
            defined_at,
            previous_at: previous_at.as_deref(),
        };
        one_offs.applied(stored).await?;
        changes.push(change);
    }
    Ok(Applied {
        changes,
        message: String::new(),
    })
}

/// Every problem of the jobs of an apply, each naming its job, in three rounds (each job's
/// own rules and its `at`, then whether each fire fits a message, then the graph with the
/// registry's jobs): all or nothing.
fn checked(
    jobs: &[spec::JobDocument],
    registered: &[spec::JobSpec],
    limits: Limits,
) -> Result<(), Vec<String>> {
    let docs: Vec<&spec::JobDocument> = jobs.iter().collect();
    let mut errors: Vec<String> =
        spec::check_documents(&docs, |i| format!("first as document {}", i + 1))
            .into_iter()
            .map(|(i, e)| format!("{}: {e}", docs[i].job.name))
            .collect();
    let now = ax_bus::time::now();
    for doc in jobs {
        let at = doc.job.at.as_deref().map(ax_bus::time::parse_instant);
        if let Some(Ok(at)) = at {
            if let Err(e) = super::trigger::within(at, now, limits.max_delay) {
                errors.push(format!("{}: job.at: {e}", doc.job.name));
            }
        }
    }
    if jobs.is_empty() {
        errors.push("the apply holds no job".to_string());
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    // A job whose every fire would be too big to hand on is refused now, not fire by fire.
    for doc in jobs {
        let fire = NewInstance::new(
            &doc.job,
            now,
            now.format("%Y-%m-%d").to_string(),
            doc.job.params.clone(),
            Trigger::Cron,
            now,
        );
        if let Err(e) = fire.too_big_for(limits.max_payload) {
            errors.push(format!("{}: {e}", doc.job.name));
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let applied: Vec<&spec::JobSpec> = jobs.iter().map(|d| &d.job).collect();
    for (job, e) in spec::graph::validate_graph(&applied, registered) {
        errors.push(format!("{job}: {e}"));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Stores `spec` (created, or changed if it differs from what is stored): how, and when a job
/// of its name was created.
async fn store_job(
    registry: &impl Registry,
    spec: spec::JobSpec,
) -> Result<(JobChange, Option<chrono::DateTime<chrono::Utc>>), CommandError> {
    let name = spec.name.clone();
    loop {
        let existing = registry.job(&name).await?;
        let change = match &existing {
            None => Change::Created,
            Some((record, _)) if record.spec == spec => {
                let change = JobChange {
                    name,
                    change: Change::Unchanged,
                };
                return Ok((change, record.defined_at));
            }
            Some(_) => Change::Updated,
        };
        let now = ax_bus::time::now();
        let record = JobRecord {
            spec: spec.clone(),
            paused: existing.as_ref().is_some_and(|(r, _)| r.paused),
            updated_at: now,
            // Created now, or kept: an edit is the same job.
            defined_at: match &existing {
                None => Some(now),
                Some((r, _)) => r.defined_at,
            },
        };
        let written = match existing {
            None => registry.create_job(&name, &record).await?,
            Some((_, revision)) => registry.swap_job(&name, &record, revision).await?,
        };
        if written {
            return Ok((JobChange { name, change }, record.defined_at));
        }
        // A concurrent apply changed the job meanwhile: compare again.
    }
}

pub(super) fn no_such_job(name: &JobName) -> CommandError {
    CommandError::refused(format!("no job named `{name}`"))
}

pub(super) async fn delete(
    (registry, one_offs): (&impl Registry, &impl OneOffs),
    name: &JobName,
) -> Result<Done, CommandError> {
    // Existence of the entry, not of a valid job: an entry written past the Schedulers' checks
    // is deleted like any other.
    if !registry.job_exists(name).await? {
        return Err(no_such_job(name));
    }
    // An entry that does not decode has no `at` to withdraw.
    let (at, defined_at) = match registry.job(name).await {
        Ok(Some((record, _))) => (record.spec.at, record.defined_at),
        Ok(None) | Err(ActorError::Client(ax_bus::ClientError::Codec(_))) => (None, None),
        Err(e) => return Err(e.into()),
    };
    let registered: Vec<spec::JobSpec> = registry.specs().await?.into_values().collect();
    let dependents = spec::graph::dependents_of(name, &registered);
    if !dependents.is_empty() {
        let dependents: Vec<&str> = dependents.iter().map(|d| d.as_str()).collect();
        return Err(CommandError::refused(format!(
            "`{name}` is a dependency of {}; change or delete them first",
            dependents.join(", ")
        )));
    }
    registry.delete_job(name).await?;
    one_offs.deleted(name, at.as_deref(), defined_at).await?;
    Ok(Done {
        message: format!("deleted {name}"),
        ..Done::default()
    })
}

pub(super) async fn set_paused(
    registry: &impl Registry,
    name: &JobName,
    paused: bool,
) -> Result<Done, CommandError> {
    let verb = if paused { "paused" } else { "resumed" };
    loop {
        let Some((mut record, revision)) = registry.job(name).await? else {
            return Err(no_such_job(name));
        };
        let message = if record.paused == paused {
            format!("{name} was already {verb}")
        } else {
            record.paused = paused;
            record.updated_at = ax_bus::time::now();
            // Written meanwhile (an apply, another pause): read it again.
            if !registry.swap_job(name, &record, revision).await? {
                continue;
            }
            format!("{name} {verb}")
        };
        return Ok(Done {
            message,
            ..Done::default()
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use ax_bus::messages::QueueRequest;
    use ax_bus::spec::Priority;

    use super::*;
    use crate::scheduler::store::memory::Jobs;

    fn registry_of(names: &[&str]) -> Jobs {
        let jobs = Jobs::default();
        for name in names {
            let record = JobRecord {
                spec: crate::test_fixtures::spec(name, Some("0 0 * * * *"), &[]),
                paused: false,
                updated_at: ax_bus::time::now(),
                defined_at: None,
            };
            jobs.jobs
                .lock()
                .unwrap()
                .insert(name.parse().unwrap(), (record, 1));
        }
        jobs
    }

    fn paused(jobs: &Jobs, name: &str) -> bool {
        jobs.jobs.lock().unwrap()[&name.parse::<JobName>().unwrap()]
            .0
            .paused
    }

    #[tokio::test]
    async fn a_pause_is_written_once_and_said_again_as_already_done() {
        let jobs = registry_of(&["etl"]);
        let name: JobName = "etl".parse().unwrap();
        let reply = set_paused(&jobs, &name, true).await.unwrap();
        assert_eq!(reply.message, "etl paused");
        assert!(paused(&jobs, "etl"));
        let again = set_paused(&jobs, &name, true).await.unwrap();
        assert_eq!(again.message, "etl was already paused");
        let resumed = set_paused(&jobs, &name, false).await.unwrap();
        assert_eq!(resumed.message, "etl resumed");
        assert!(!paused(&jobs, "etl"));
    }

    #[tokio::test]
    async fn a_pause_that_races_another_write_reads_the_job_again() {
        let jobs = registry_of(&["etl"]);
        jobs.races.store(2, Ordering::SeqCst);
        let reply = set_paused(&jobs, &"etl".parse().unwrap(), true)
            .await
            .unwrap();
        assert_eq!(reply.message, "etl paused");
        assert!(paused(&jobs, "etl"));
        assert_eq!(jobs.races.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn an_unknown_job_is_refused_by_its_name() {
        let jobs = registry_of(&[]);
        match set_paused(&jobs, &"nope".parse().unwrap(), true).await {
            Err(CommandError::Refused(why)) => assert_eq!(why, ["no job named `nope`"]),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_queue_is_paused_and_resumed_by_an_operator() {
        let jobs = registry_of(&[]);
        let request = QueueRequest {
            priority: Priority::Low,
            paused: true,
        };
        let reply = crate::scheduler::control::queue::set_queue(&jobs, &request)
            .await
            .unwrap();
        assert_eq!(reply.message, "queue low paused");
        let state = jobs.queues.lock().unwrap()[&Priority::Low].clone();
        assert!(state.paused && state.by.is_empty(), "{state:?}");
    }

    mod applied {
        use ax_bus::messages::{ApplyRequest, Change};

        use super::super::*;
        use crate::scheduler::store::memory::Memory;
        use crate::test_fixtures::spec;

        const LIMITS: Limits = Limits {
            max_delay: std::time::Duration::from_secs(86_400),
            max_payload: 1024 * 1024,
        };

        fn yaml(text: &str) -> ApplyRequest {
            ApplyRequest {
                jobs: Vec::new(),
                yaml: Some(text.into()),
            }
        }

        const TWO: &str = "version: v1\njob:\n  name: load\n  cron: \"0 1 * * *\"\n  exec: {type: shell, command: \"true\"}\n---\nversion: v1\njob:\n  name: report\n  deps: [{name: load}]\n  exec: {type: shell, command: \"true\"}\n";

        fn refused<T: std::fmt::Debug>(outcome: Result<T, CommandError>) -> Vec<String> {
            match outcome {
                Err(CommandError::Refused(why)) => why,
                other => panic!("not refused: {other:?}"),
            }
        }

        fn changes(applied: &Applied) -> Vec<(&str, Change)> {
            applied
                .changes
                .iter()
                .map(|c| (c.name.as_str(), c.change))
                .collect()
        }

        #[tokio::test]
        async fn an_apply_creates_then_finds_unchanged_then_updates_keeping_pause_and_birth() {
            let memory = Memory::default();
            let store = (&memory, &memory);
            let made = apply(store, yaml(TWO), LIMITS).await.unwrap();
            assert_eq!(
                changes(&made),
                [("load", Change::Created), ("report", Change::Created)]
            );
            let load: JobName = "load".parse().unwrap();
            let born = memory.job(&load).await.unwrap().unwrap().0.defined_at;
            assert!(born.is_some());
            let same = apply(store, yaml(TWO), LIMITS).await.unwrap();
            assert_eq!(
                changes(&same),
                [("load", Change::Unchanged), ("report", Change::Unchanged)]
            );
            set_paused(&memory, &load, true).await.unwrap();
            let edited = yaml(&TWO.replace("0 1 * * *", "0 2 * * *"));
            let updated = apply(store, edited, LIMITS).await.unwrap();
            assert_eq!(changes(&updated)[0], ("load", Change::Updated));
            let (record, _) = memory.job(&load).await.unwrap().unwrap();
            assert_eq!(record.spec.cron.as_deref(), Some("0 2 * * *"));
            assert!(record.paused, "an edit keeps the pause");
            assert_eq!(record.defined_at, born, "an edit is the same job");
            assert_eq!(
                memory.one_offs.lock().unwrap().len(),
                6,
                "each job stored is told"
            );
        }

        #[tokio::test]
        async fn an_apply_that_races_another_write_compares_again() {
            let memory = Memory::default().registering([spec("load", None, &[])]);
            memory
                .registry
                .races
                .store(1, std::sync::atomic::Ordering::SeqCst);
            let applied = apply((&memory, &memory), yaml(TWO), LIMITS).await.unwrap();
            assert_eq!(changes(&applied)[0], ("load", Change::Updated));
            let (record, _) = memory.job(&"load".parse().unwrap()).await.unwrap().unwrap();
            assert_eq!(record.spec.cron.as_deref(), Some("0 1 * * *"));
        }

        #[tokio::test]
        async fn an_apply_is_all_or_nothing_and_names_each_problem() {
            let memory = Memory::default();
            let store = (&memory, &memory);
            // One bad job refuses the good one with it.
            let bad =
                format!("{TWO}---\nversion: v1\njob:\n  name: Bad Name\n  exec: {{type: shell, command: x}}\n");
            let why = refused(apply(store, yaml(&bad), LIMITS).await);
            assert!(!why.is_empty());
            // A dependency on no job, and an `at` past the limit.
            let orphan = "version: v1\njob:\n  name: report\n  deps: [{name: nowhere}]\n  exec: {type: shell, command: \"true\"}\n";
            let why = refused(apply(store, yaml(orphan), LIMITS).await);
            assert!(why[0].starts_with("report: "), "{why:?}");
            let at = ax_bus::time::rfc3339(ax_bus::time::now() + chrono::Duration::days(3));
            let late = format!(
                "version: v1\njob:\n  name: once\n  at: \"{at}\"\n  exec: {{type: shell, command: \"true\"}}\n"
            );
            let why = refused(apply(store, yaml(&late), LIMITS).await);
            assert!(
                why[0].starts_with("once: job.at: ") && why[0].contains("more than 1 days ahead"),
                "{why:?}"
            );
            let small = Limits {
                max_payload: 256,
                ..LIMITS
            };
            let why = refused(apply(store, yaml(TWO), small).await);
            assert_eq!(why.len(), 2, "{why:?}");
            let none = ApplyRequest {
                jobs: Vec::new(),
                yaml: None,
            };
            assert_eq!(
                refused(apply(store, none, LIMITS).await),
                ["the apply holds no job"]
            );
            assert!(memory.registry.jobs.lock().unwrap().is_empty());
            assert!(memory.one_offs.lock().unwrap().is_empty());
        }

        #[tokio::test]
        async fn a_job_something_depends_on_is_not_deleted() {
            let memory = Memory::default();
            let store = (&memory, &memory);
            apply(store, yaml(TWO), LIMITS).await.unwrap();
            let load: JobName = "load".parse().unwrap();
            let why = refused(delete(store, &load).await);
            assert_eq!(
                why,
                ["`load` is a dependency of report; change or delete them first"]
            );
            let report: JobName = "report".parse().unwrap();
            let deleted = delete(store, &report).await.unwrap();
            assert_eq!(deleted.message, "deleted report");
            delete(store, &load).await.unwrap();
            assert!(memory.registry.jobs.lock().unwrap().is_empty());
            let why = refused(delete(store, &load).await);
            assert_eq!(why, ["no job named `load`"]);
            let told = memory.one_offs.lock().unwrap();
            assert_eq!(
                told[told.len() - 2..],
                [(report, "deleted"), (load, "deleted")]
            );
        }
    }
}
