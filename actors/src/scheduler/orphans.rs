//! Orphans: instances whose creator stopped between writing the record and handing the first
//! attempt on (to the DagCoordinator or the Router).
//!
//! Most never happen: a first attempt's trace id is derived from the instance id, so every
//! Scheduler racing for a fire holds the same attempt, and one that loses the create-if-absent
//! race to a record of that same attempt, still untouched, hands it on as well (the creator's
//! message id makes the copies one; see `creator`). What is left is a record of a *different*
//! attempt found untouched — written by a creator of another version, or by something else
//! that wrote the record and stopped. Every Scheduler that finds one keeps an eye on it: after
//! [`ORPHAN_GRACE`], if the record is still the untouched first attempt (`running`, tag
//! `queued`), it **adopts** it by publishing the hand-off under the message id the creator
//! would have used. That is safe whoever is right: if the creator did hand it on, JetStream's
//! de-duplication window (two minutes, longer than the grace) drops the copy and its ack says
//! so — nothing happens; if not, the attempt goes on, and an `orphan` alert says which
//! instance was adopted by whom. A stale copy could at worst be a second dispatch of the same
//! attempt, which the record's `executing` fence makes harmless (one dispatch starts it).
//!
//! A lone Scheduler has no rival to hand its orphans on; it finds them itself on restart,
//! among the ticks it missed (see the Scheduler's misfire handling), before any is recorded as
//! skipped.
//!
//! Flagged, not adopted: an instance found too late for the de-duplication window to vouch
//! for the copy (a Scheduler catching up long after), and one of a job whose overlap policy is
//! not `allow` (its place in the queue behind the previous instance is only known to the
//! creator). Those raise an `orphan` alert naming the instance, for an operator to look at.

use std::time::Duration;

use ax_bus::client::provision::DUPLICATE_WINDOW;
use ax_bus::error::During;
use ax_bus::ids::NodeId;
use ax_bus::messages::{AlertKind, WorkItem};
use ax_bus::spec::Overlap;
use ax_bus::{AxClient, State, Tag};

use crate::jetstream::publish;
use crate::outcome::ORPHAN_GRACE;
use crate::scheduler::new_instance::NewInstance;
use crate::ActorError;

/// What became of a watched instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It moved on (or is gone): not an orphan.
    Fine,
    /// The hand-off was there already (the copy was a duplicate).
    HandedOn,
    /// It was an orphan; this node handed it on.
    Adopted,
    /// It looks orphaned but cannot be adopted safely; an alert says why.
    Flagged(String),
}

/// Watches `instance`, found already created by someone else, on a task of its own.
pub(crate) fn watch(client: AxClient, node: NodeId, instance: NewInstance) {
    tokio::spawn(async move {
        tokio::time::sleep(ORPHAN_GRACE).await;
        for _ in 0..3 {
            match check(&client, &node, &instance).await {
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!(instance = %instance.record.instance_id, error = %e, "orphan check failed; trying again");
                    tokio::time::sleep(ORPHAN_GRACE).await;
                }
            }
        }
    });
}

/// Looks at the instance once and adopts or flags it if it is an orphan.
pub(crate) async fn check(
    client: &AxClient,
    node: &NodeId,
    instance: &NewInstance,
) -> Result<Verdict, ActorError> {
    let id = &instance.record.instance_id;
    let Some((record, _)) = client.instance(id).await? else {
        return Ok(Verdict::Fine);
    };
    let untouched = record.state == State::Running
        && record.tag == Tag::Queued
        && record.attempt == 1
        && record.run_start == 1;
    if !untouched {
        return Ok(Verdict::Fine);
    }
    let age = (ax_bus::time::now() - record.created_at)
        .to_std()
        .unwrap_or_default();
    let spec = instance.work.spec.clone();
    let work = WorkItem::for_attempt(&record, spec);
    let too_old = age + Duration::from_secs(5) >= DUPLICATE_WINDOW;
    let why_not = if too_old {
        Some(
            "too old for the de-duplication window to make a second hand-off safe; look at it \
             and cancel or re-run it"
                .to_string(),
        )
    } else if instance.work.spec.overlap != Overlap::Allow {
        Some(format!(
            "its job's overlap policy ({:?}) needs the creator's place in the queue",
            instance.work.spec.overlap
        ))
    } else {
        None
    };
    if let Some(why) = why_not {
        let message = format!(
            "instance {id} is still queued {}s after its creation and was not handed on: {why}",
            age.as_secs()
        );
        publish::instance_alert(client, node, AlertKind::Orphan, message.clone(), &work).await;
        return Ok(Verdict::Flagged(message));
    }
    let (subject, msg_id) = instance.hand_off_to(client.subjects());
    let ack = publish::to_stream(client, subject, &msg_id, &work)
        .await?
        .await
        .during(|| format!("adopt {id}"))?;
    if ack.duplicate {
        return Ok(Verdict::HandedOn);
    }
    publish::instance_alert(
        client,
        node,
        AlertKind::Orphan,
        format!(
            "instance {id} was created {}s ago by a Scheduler that stopped before handing it on; adopted by {node}",
            age.as_secs()
        ),
        &work,
    )
    .await;
    tracing::warn!(instance = %id, "orphan adopted");
    Ok(Verdict::Adopted)
}
