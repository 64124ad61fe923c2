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
use ax_bus::room;
use ax_bus::{AxClient, InstanceRecord, State, Tag};

use super::{Dispatcher, Eligible};
use crate::jetstream::publish;
use crate::ActorError;

/// What splitting an instance gives.
pub(crate) enum Split {
    /// The children to dispatch.
    Children(Vec<WorkItem>),
    /// A broadcast finds no worker: why, where workers of its tags and executor exist but none
    /// can ever hold its `resources` (`None`: none offers them).
    NoWorker(Option<String>),
}

/// Splits `parent` into its children, or says why a broadcast has none yet.
pub(crate) async fn expand(
    dispatcher: &Dispatcher,
    parent: &WorkItem,
) -> Result<Split, ActorError> {
    let client = &dispatcher.client;
    let spec = &parent.spec;
    let children = if spec.broadcast {
        let eligible = Eligible {
            tags: spec.tags.clone(),
            kind: spec.exec.name().to_string(),
            resources: spec.resources,
        };
        match dispatcher.router.send(eligible).await? {
            Ok(workers) => workers
                .into_iter()
                .map(|w| Ok((parent.instance_id.child(&format!("w-{w}"))?, Some(w))))
                .collect::<Result<Vec<_>, IdError>>()?,
            Err(lacks) => {
                let why = (!lacks.is_empty()).then(|| room::nowhere(&spec.resources, &lacks));
                return Ok(Split::NoWorker(why));
            }
        }
    } else {
        (0..spec.shards.unwrap_or(1))
            .map(|i| Ok((parent.instance_id.child(&format!("s{i}"))?, None)))
            .collect::<Result<Vec<_>, IdError>>()?
    };
    let Some((parent_record, _)) = client.instance(&parent.instance_id).await? else {
        return Ok(Split::Children(Vec::new()));
    };
    let total = children.len() as u32;
    let planned: Vec<InstanceId> = children.iter().map(|(id, _)| id.clone()).collect();
    let mut works = Vec::with_capacity(children.len());
    for (index, (id, pin)) in children.into_iter().enumerate() {
        let record = child_record(&parent_record, parent, id, pin, index as u32, total);
        if let Some(record) = place_child(client, record).await? {
            works.push(WorkItem::for_attempt(&record, parent.spec.clone()));
        }
    }
    announce(client, parent, planned).await?;
    Ok(Split::Children(works))
}

/// The record of child `index` of `total`: the parent's, as a fresh first attempt whose trace
/// derives from the parent's.
fn child_record(
    parent_record: &InstanceRecord,
    parent: &WorkItem,
    id: InstanceId,
    pin: Option<WorkerId>,
    index: u32,
    total: u32,
) -> InstanceRecord {
    let shard = ShardRef {
        parent: parent.instance_id.clone(),
        parent_trace: parent.trace_id.clone(),
        index,
        total,
    };
    InstanceRecord {
        instance_id: id,
        trace_id: parent.trace_id.child(index),
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
        shard: Some(shard),
        worker_losses: 0,
        pin,
        created_by: None,
        dispatch: None,
        reserved: None,
        written_by: None,
        ..parent_record.clone()
    }
}

/// Tells the DagCoordinator what the parent waits for, and tags the parent `sharded`.
async fn announce(
    client: &AxClient,
    parent: &WorkItem,
    children: Vec<InstanceId>,
) -> Result<(), ActorError> {
    let count = children.len();
    let plan = SplitPlan {
        parent: parent.clone(),
        children,
    };
    publish::to_stream_acked(
        client,
        client.subjects().split(parent.job()),
        &msg_id::split(&parent.trace_id),
        &plan,
    )
    .await?;
    if let Updated::Written(record, _) = client
        .update_instance(&parent.instance_id, |r| r.split(&parent.trace_id, count))
        .await?
    {
        publish::event(client, &record).await;
    }
    Ok(())
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
