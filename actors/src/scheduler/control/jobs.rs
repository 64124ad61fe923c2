//! The job commands: `apply` (create or update jobs, all or nothing), `delete`, `pause` and
//! `resume`. Each changes the registry (`ax_jobs`) with compare-and-swap, so two at once never
//! lose one another's change; a one-off job's waiting instance follows its job (see
//! [`crate::scheduler::one_off`]).

use async_nats::jetstream::{kv::CreateErrorKind, kv::UpdateErrorKind};

use ax_bus::error::{During, NatsError};
use ax_bus::ids::JobName;
use ax_bus::instance::Trigger;
use ax_bus::messages::typed::{Applied, Done};
use ax_bus::messages::{ApplyRequest, Change, JobChange, JobRecord};
use ax_bus::{codec, spec, AxClient};

use super::CommandError;
use crate::scheduler::creator::Creator;
use crate::scheduler::new_instance::NewInstance;
use crate::scheduler::one_off;
use crate::scheduler::store::Registry;
use crate::ActorError;

/// What a problem in an apply's `yaml` names as its file.
pub(crate) const YAML_SOURCE: &str = "yaml";

pub(super) async fn apply(
    client: &AxClient,
    creator: &Creator,
    mut request: ApplyRequest,
    max_delay: std::time::Duration,
) -> Result<Applied, CommandError> {
    if let Some(text) = request.yaml.take() {
        let parsed = spec::yaml::parse_str(YAML_SOURCE, &text)
            .map_err(|e| CommandError::refused(e.to_string()))?;
        request.jobs.extend(parsed.into_iter().map(|job| job.doc));
    }
    let docs: Vec<&spec::JobDocument> = request.jobs.iter().collect();
    let mut errors: Vec<String> =
        spec::check_documents(&docs, |i| format!("first as document {}", i + 1))
            .into_iter()
            .map(|(i, e)| format!("{}: {e}", docs[i].job.name))
            .collect();
    let now = ax_bus::time::now();
    for doc in &request.jobs {
        let at = doc.job.at.as_deref().map(ax_bus::time::parse_instant);
        if let Some(Ok(at)) = at {
            if let Err(e) = super::trigger::within(at, now, max_delay) {
                errors.push(format!("{}: job.at: {e}", doc.job.name));
            }
        }
    }
    if request.jobs.is_empty() {
        errors.push("the apply holds no job".to_string());
    }
    if !errors.is_empty() {
        return Err(CommandError::Refused(errors));
    }
    // A job whose every fire would be too big to hand on is refused now, not fire by fire.
    let max_payload = client.nats.server_info().max_payload;
    for doc in &request.jobs {
        let now = ax_bus::time::now();
        let fire = NewInstance::new(
            &doc.job,
            now,
            now.format("%Y-%m-%d").to_string(),
            doc.job.params.clone(),
            Trigger::Cron,
            now,
        );
        if let Err(e) = fire.too_big_for(max_payload) {
            errors.push(format!("{}: {e}", doc.job.name));
        }
    }
    if !errors.is_empty() {
        return Err(CommandError::Refused(errors));
    }
    let registered: Vec<spec::JobSpec> = client.jobs().await?.into_iter().map(|r| r.spec).collect();
    let applied: Vec<&spec::JobSpec> = request.jobs.iter().map(|d| &d.job).collect();
    for (job, e) in spec::graph::validate_graph(&applied, &registered) {
        errors.push(format!("{job}: {e}"));
    }
    if !errors.is_empty() {
        return Err(CommandError::Refused(errors));
    }
    let mut changes = Vec::new();
    for doc in request.jobs {
        let previous_at = match client.job(&doc.job.name).await? {
            Some((record, _)) => record.spec.at,
            None => None,
        };
        let (change, defined_at) = store_job(client, doc.job.clone()).await?;
        let stored = one_off::Stored {
            spec: &doc.job,
            change: change.change,
            defined_at,
            previous_at: previous_at.as_deref(),
        };
        one_off::on_apply(client, creator, stored).await?;
        changes.push(change);
    }
    Ok(Applied {
        changes,
        message: String::new(),
    })
}

/// Stores `spec` (created, or changed if it differs from what is stored): how, and when a job
/// of its name was created.
async fn store_job(
    client: &AxClient,
    spec: spec::JobSpec,
) -> Result<(JobChange, Option<chrono::DateTime<chrono::Utc>>), CommandError> {
    let name = spec.name.clone();
    loop {
        let existing = client.job(&name).await?;
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
        let payload = codec::encode(&record)?;
        let written = match existing {
            None => match client.jobs.create(&name, payload).await {
                Err(e) if e.kind() == CreateErrorKind::AlreadyExists => false,
                Err(e) => {
                    return Err(
                        ActorError::from(NatsError::new(format!("store job {name}"), e)).into(),
                    )
                }
                Ok(_) => true,
            },
            Some((_, revision)) => match client.jobs.update(&name, payload, revision).await {
                Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => false,
                Err(e) => {
                    return Err(
                        ActorError::from(NatsError::new(format!("store job {name}"), e)).into(),
                    )
                }
                Ok(_) => true,
            },
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

pub(super) async fn delete(client: &AxClient, name: &JobName) -> Result<Done, CommandError> {
    // Existence of the entry, not of a valid job: an entry written past the Schedulers' checks
    // is deleted like any other.
    if !client.job_exists(name).await? {
        return Err(no_such_job(name));
    }
    // An entry that does not decode has no `at` to withdraw.
    let (at, defined_at) = match client.job(name).await {
        Ok(Some((record, _))) => (record.spec.at, record.defined_at),
        Ok(None) | Err(ax_bus::ClientError::Codec(_)) => (None, None),
        Err(e) => return Err(e.into()),
    };
    let registered: Vec<spec::JobSpec> = client.jobs().await?.into_iter().map(|r| r.spec).collect();
    let dependents = spec::graph::dependents_of(name, &registered);
    if !dependents.is_empty() {
        let dependents: Vec<&str> = dependents.iter().map(|d| d.as_str()).collect();
        return Err(CommandError::refused(format!(
            "`{name}` is a dependency of {}; change or delete them first",
            dependents.join(", ")
        )));
    }
    client
        .jobs
        .delete(name)
        .await
        .during(|| format!("delete job {name}"))?;
    one_off::on_delete(client, name, at.as_deref(), defined_at).await?;
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
}
