//! Splitting an instance into sub-instances: `shards: N` gives N shards routed independently;
//! `broadcast: true` gives one run per eligible worker, each pinned to its worker.
//!
//! The children are instances of the same job (`<parent>.s<i>` for shards, `<parent>.w-<worker>`
//! for broadcast runs) with their own records, attempts and retries; their trace ids derive from
//! the parent's, so that a split done again after a crash names the same attempts (their
//! creation and dispatch de-duplicate). The plan goes to the DagCoordinator, which ends the
//! parent — `success` when every child succeeded, `failed` with tag `shards_failed` otherwise —
//! once they all have.

use ax_bus::client::Updated;
use ax_bus::ids::{IdError, InstanceId, WorkerId};
use ax_bus::instance::TransitionRefused;
use ax_bus::messages::{ShardRef, SplitPlan, WorkItem};
use ax_bus::msg_id;
use ax_bus::{InstanceRecord, State, Tag};

use super::{Dispatcher, Eligible};
use crate::jetstream::publish;
use crate::ActorError;

/// Splits `parent`; the children to dispatch, or `None` when a broadcast finds no worker.
pub(crate) async fn expand(
    dispatcher: &Dispatcher,
    parent: &WorkItem,
) -> Result<Option<Vec<WorkItem>>, ActorError> {
    let client = &dispatcher.client;
    let spec = &parent.spec;
    let children: Vec<(InstanceId, Option<WorkerId>)> = if spec.broadcast {
        let workers = dispatcher
            .router
            .send(Eligible {
                tags: spec.tags.clone(),
                kind: spec.exec.kind.clone(),
            })
            .await?;
        if workers.is_empty() {
            return Ok(None);
        }
        workers
            .into_iter()
            .map(|w| Ok((parent.instance_id.child(&format!("w-{w}"))?, Some(w))))
            .collect::<Result<_, IdError>>()?
    } else {
        (0..spec.shards.unwrap_or(1))
            .map(|i| Ok((parent.instance_id.child(&format!("s{i}"))?, None)))
            .collect::<Result<_, IdError>>()?
    };
    let Some((parent_record, _)) = client.instance(&parent.instance_id).await? else {
        return Ok(Some(Vec::new()));
    };
    let total = children.len() as u32;
    let planned: Vec<InstanceId> = children.iter().map(|(id, _)| id.clone()).collect();
    let mut works = Vec::with_capacity(children.len());
    for (index, (id, pin)) in children.into_iter().enumerate() {
        let index = index as u32;
        let shard = ShardRef {
            parent: parent.instance_id.clone(),
            parent_trace: parent.trace_id.clone(),
            index,
            total,
        };
        let trace = parent.trace_id.child(index);
        let record = InstanceRecord {
            instance_id: id.clone(),
            trace_id: trace.clone(),
            attempt: 1,
            run_start: 1,
            state: State::Running,
            tag: Tag::Queued,
            created_at: ax_bus::time::now(),
            started_at: None,
            finished_at: None,
            worker: None,
            message: format!("{} of {total} of {}", index + 1, parent.instance_id),
            output: serde_json::Value::Null,
            next_attempt_at: None,
            exit_code: None,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            shard: Some(shard.clone()),
            worker_losses: 0,
            pin: pin.clone(),
            ..parent_record.clone()
        };
        let Some(record) = place_child(client, record).await? else {
            continue;
        };
        works.push(WorkItem {
            instance_id: id,
            trace_id: trace,
            attempt: record.attempt,
            run_start: record.run_start,
            biz_date: parent.biz_date.clone(),
            expected_time: parent.expected_time,
            params: parent.params.clone(),
            spec: spec.clone(),
            worker: None,
            gate: None,
            dispatch: None,
            router: None,
            shard: Some(shard),
            pin,
            stored: None,
        });
    }
    let plan = SplitPlan {
        parent: parent.clone(),
        children: planned.clone(),
    };
    publish::to_stream_acked(
        client,
        client.subjects().split(parent.job()),
        &msg_id::split(&parent.trace_id),
        &plan,
    )
    .await?;
    if let Updated::Written(record, _) = client
        .update_instance(&parent.instance_id, |r| {
            r.split(&parent.trace_id, planned.len())
        })
        .await?
    {
        publish::event(client, &record).await;
    }
    Ok(Some(works))
}

/// Creates the child's record, or finds it: `Some` with what to dispatch, `None` when there is
/// nothing to dispatch. A split done again (after a crash) finds its own children and leaves
/// those that moved on (a retry has its own dispatch); a child left by an earlier run of its
/// parent (a re-run) starts again under this run's trace, unless that earlier run of it has not
/// ended yet — then it counts for the parent when it ends.
async fn place_child(
    client: &ax_bus::AxClient,
    record: InstanceRecord,
) -> Result<Option<InstanceRecord>, ActorError> {
    if client.create_instance(&record).await? {
        return Ok(Some(record));
    }
    let trace = record.trace_id.clone();
    let this_split = record.shard.clone();
    match client
        .update_instance(&record.instance_id, |r| {
            if r.shard == this_split {
                Err(TransitionRefused::StaleAttempt {
                    reported: trace.clone(),
                    current: r.trace_id.clone(),
                })
            } else {
                r.rerun(&trace)
            }
        })
        .await?
    {
        Updated::Written(restarted, _) => {
            publish::event(client, &restarted).await;
            Ok(Some(*restarted))
        }
        Updated::Refused(refused) => {
            tracing::debug!(child = %record.instance_id, %refused, "child already placed: not dispatched again");
            Ok(None)
        }
        Updated::Missing => Ok(None),
    }
}
