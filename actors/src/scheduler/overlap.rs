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

use crate::scheduler::store::{Instances, Latest};
use crate::ActorError;

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
    store: &(impl Instances + Latest),
    work: &WorkItem,
    policy: Overlap,
) -> Result<Decision, ActorError> {
    if policy == Overlap::Allow {
        return Ok(Decision::Proceed);
    }
    let job = work.job();
    let Some(previous_id) = store.latest(job).await? else {
        return Ok(Decision::Proceed);
    };
    if previous_id >= work.instance_id {
        return Ok(Decision::Proceed);
    }
    let Some(previous) = store.record(&previous_id).await? else {
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
            cancel(store, &previous, &work.instance_id).await?;
            Decision::Proceed
        }
    })
}

/// Cancels `previous` in favour of `by`, stopping its process where one runs.
async fn cancel(
    store: &impl Instances,
    previous: &InstanceRecord,
    by: &InstanceId,
) -> Result<(), ActorError> {
    let message = format!("superseded by {by}");
    let updated = store
        .update(&previous.instance_id, |r| {
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
        store.stop_attempt(worker, &previous.trace_id).await;
    }
    store
        .ended(&record, &msg_id::result(&record.trace_id))
        .await
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::store::memory::Memory;

    /// A fire of job `etl` due `minute` minutes past 10:00, queued, and its work item.
    fn fire(minute: i64) -> (InstanceRecord, WorkItem) {
        let spec = crate::test_fixtures::spec("etl", Some("0 * * * * *"), &[]);
        let due = chrono::NaiveDate::from_ymd_opt(2026, 12, 7)
            .and_then(|d| d.and_hms_opt(10, 0, 0))
            .map(|t| t.and_utc())
            .unwrap()
            + chrono::Duration::minutes(minute);
        let record = InstanceRecord::first(
            &spec,
            due,
            "2026-12-07".into(),
            Default::default(),
            ax_bus::instance::Trigger::Cron,
            due,
        );
        let work = WorkItem::for_attempt(&record, spec);
        (record, work)
    }

    fn memory_with(previous: &InstanceRecord) -> Memory {
        let memory = Memory::with([previous.clone()]);
        memory
            .latest
            .lock()
            .unwrap()
            .insert(previous.job.clone(), previous.instance_id.clone());
        memory
    }

    #[tokio::test]
    async fn a_fire_proceeds_when_nothing_earlier_is_still_open() {
        let (previous, _) = fire(0);
        let (_, work) = fire(1);
        // No latest instance noted; `allow` whatever is noted.
        let memory = Memory::default();
        assert_eq!(
            decide(&memory, &work, Overlap::Skip).await.unwrap(),
            Decision::Proceed
        );
        let memory = memory_with(&previous);
        assert_eq!(
            decide(&memory, &work, Overlap::Allow).await.unwrap(),
            Decision::Proceed
        );
        // The previous one ended.
        let mut ended = previous.clone();
        ended.state = State::Success;
        ended.tag = Tag::Completed;
        let memory = memory_with(&ended);
        assert_eq!(
            decide(&memory, &work, Overlap::Skip).await.unwrap(),
            Decision::Proceed
        );
        // The latest noted is this fire itself (a fire handled again).
        let (same, work) = fire(1);
        let memory = memory_with(&same);
        assert_eq!(
            decide(&memory, &work, Overlap::Skip).await.unwrap(),
            Decision::Proceed
        );
    }

    #[tokio::test]
    async fn skip_creates_nothing_and_queue_gates_on_the_previous() {
        let (previous, _) = fire(0);
        let (_, work) = fire(1);
        let memory = memory_with(&previous);
        match decide(&memory, &work, Overlap::Skip).await.unwrap() {
            Decision::Skip(why) => assert_eq!(
                why,
                format!("overlap skip: {} is still running", previous.instance_id)
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            decide(&memory, &work, Overlap::Queue).await.unwrap(),
            Decision::Queue(Gate {
                instance_id: previous.instance_id.clone(),
                job: previous.job.clone(),
                biz_date: previous.biz_date.clone(),
            })
        );
        // Deciding changed nothing.
        assert_eq!(
            memory.records.lock().unwrap()[&previous.instance_id],
            previous
        );
    }

    #[tokio::test]
    async fn cancel_previous_supersedes_a_running_one_and_stops_its_process() {
        let (mut previous, _) = fire(0);
        previous.tag = Tag::Executing;
        previous.worker = Some("w1".parse().unwrap());
        let (next, work) = fire(1);
        let memory = memory_with(&previous);
        assert_eq!(
            decide(&memory, &work, Overlap::CancelPrevious)
                .await
                .unwrap(),
            Decision::Proceed
        );
        let after = memory.records.lock().unwrap()[&previous.instance_id].clone();
        assert_eq!(
            (after.state, after.tag),
            (State::Cancelled, Tag::Superseded)
        );
        assert_eq!(after.message, format!("superseded by {}", next.instance_id));
        assert_eq!(
            memory.stopped.lock().unwrap().as_slice(),
            [("w1".to_string(), previous.trace_id.clone())]
        );
        assert_eq!(memory.ended.lock().unwrap().len(), 1);
        // A queued previous one is cancelled without a stop.
        let (queued, _) = fire(0);
        let memory = memory_with(&queued);
        decide(&memory, &work, Overlap::CancelPrevious)
            .await
            .unwrap();
        assert!(memory.stopped.lock().unwrap().is_empty());
        assert_eq!(memory.ended.lock().unwrap().len(), 1);
    }
}
