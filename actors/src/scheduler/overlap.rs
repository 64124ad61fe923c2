//! The overlap policy: what happens when a job fires while its previous instance still runs.
//!
//! The previous instance is the one named under the job in the `ax_latest` bucket (kept only
//! for jobs whose policy is not `allow`). `skip` creates nothing and records the tick as skipped;
//! `queue` creates the instance with a gate on the previous one, so the DagCoordinator holds it
//! until that one ends; `cancel_previous` cancels the previous instance (tag `superseded`),
//! stops its process if a worker runs it, and proceeds.

use bytes::Bytes;

use async_nats::jetstream::kv::{CreateErrorKind, UpdateErrorKind};
use ax_bus::client::Updated;
use ax_bus::error::During;
use ax_bus::error::NatsError;
use ax_bus::ids::{InstanceId, JobName};
use ax_bus::messages::{Gate, WorkItem};
use ax_bus::msg_id;
use ax_bus::spec::Overlap;
use ax_bus::{AxClient, InstanceRecord, State, Tag};

use crate::ActorError;

use crate::jetstream::publish;

/// What to do with a fire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Create the instance as usual.
    Proceed,
    /// Create nothing; the reason goes into the tick record.
    Skip(String),
    /// Create the instance, gated on the previous one.
    Queue(Gate),
}

/// Applies `policy` to the fire of `work`.
pub(crate) async fn decide(
    client: &AxClient,
    work: &WorkItem,
    policy: Overlap,
) -> Result<Decision, ActorError> {
    if policy == Overlap::Allow {
        return Ok(Decision::Proceed);
    }
    let job = work.job();
    let latest = client
        .latest
        .get(job)
        .await
        .during(|| format!("read latest instance of {job}"))?;
    let Some(previous_id) = latest.and_then(|v| {
        let text = std::str::from_utf8(&v).ok()?;
        InstanceId::parse(text).ok()
    }) else {
        return Ok(Decision::Proceed);
    };
    if previous_id >= work.instance_id {
        return Ok(Decision::Proceed);
    }
    let Some((previous, _)) = client.instance(&previous_id).await? else {
        return Ok(Decision::Proceed);
    };
    if previous.state.is_final() {
        return Ok(Decision::Proceed);
    }
    Ok(match policy {
        Overlap::Allow => Decision::Proceed,
        Overlap::Skip => Decision::Skip(format!(
            "overlap skip: {previous_id} is still {}",
            previous.state
        )),
        Overlap::Queue => Decision::Queue(Gate {
            instance_id: previous_id,
            job: job.clone(),
            biz_date: previous.biz_date,
        }),
        Overlap::CancelPrevious => {
            cancel(client, &previous, &work.instance_id).await?;
            Decision::Proceed
        }
    })
}

/// Cancels `previous` in favour of `by`, stopping its process where one runs.
async fn cancel(
    client: &AxClient,
    previous: &InstanceRecord,
    by: &InstanceId,
) -> Result<(), ActorError> {
    let message = format!("superseded by {by}");
    let updated = client
        .update_instance(&previous.instance_id, |r| {
            r.ended_early(
                &previous.trace_id,
                State::Cancelled,
                Tag::Superseded,
                &message,
            )
        })
        .await?;
    let Updated::Written(record, _) = updated else {
        return Ok(());
    };
    if let (Tag::Executing, Some(worker)) = (previous.tag, &previous.worker) {
        publish::stop_attempt(client, worker, &previous.trace_id).await;
    }
    publish::ended(client, &record, &msg_id::result(&record.trace_id)).await
}

/// Records `instance_id` as the job's latest instance, unless a later one is there already.
pub(crate) async fn note_latest(
    client: &AxClient,
    job: &JobName,
    instance_id: &InstanceId,
) -> Result<(), ActorError> {
    loop {
        let entry = client
            .latest
            .entry(job)
            .await
            .during(|| format!("read latest instance of {job}"))?;
        let value = Bytes::from(instance_id.to_string());
        let failed = |e: ax_bus::error::BoxError| {
            ActorError::from(NatsError::new(format!("note latest instance of {job}"), e))
        };
        let revision = match entry {
            Some(entry) => {
                let live = entry.operation == async_nats::jetstream::kv::Operation::Put;
                if live && entry.value.as_ref() >= instance_id.as_bytes() {
                    return Ok(());
                }
                entry.revision
            }
            None => match client.latest.create(job, value).await {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == CreateErrorKind::AlreadyExists => continue,
                Err(e) => return Err(failed(e.into())),
            },
        };
        match client.latest.update(job, value, revision).await {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => continue,
            Err(e) => return Err(failed(e.into())),
        }
    }
}
