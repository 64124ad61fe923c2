//! Jobs with `at:`: fired once, at that instant, then defined without firing again.
//!
//! Applying such a job creates its one instance at once, as a delayed trigger does (see
//! [`crate::scheduler::delayed`]): the record is `scheduled` under the id of the fire
//! (`<job>.<at>`), and JetStream keeps the wait. So it survives every Scheduler's death like
//! any delayed instance, a re-apply finds the instance created (and changes nothing), and an
//! `at` that has passed when the job is first applied creates nothing (apply warns). Moving
//! `at` cancels the instance of the old instant if it still waits (tag `superseded`); deleting
//! the job cancels it when it falls due (tag `job_deleted`).

use chrono::{DateTime, Utc};

use ax_bus::client::Updated;
use ax_bus::ids::InstanceId;
use ax_bus::instance::Trigger;
use ax_bus::spec::JobSpec;
use ax_bus::{AxClient, State, Tag};

use crate::jetstream::publish;
use crate::scheduler::creator::Creator;
use crate::scheduler::new_instance::NewInstance;
use crate::ActorError;

/// After `spec` was stored (its `at` before was `previous`): the old instant's instance
/// cancelled if `at` moved, the new one's created if it lies ahead.
pub(crate) async fn on_apply(
    client: &AxClient,
    creator: &Creator,
    spec: &JobSpec,
    previous: Option<&str>,
) -> Result<(), ActorError> {
    let at = spec.at.as_deref().and_then(instant);
    if let Some(before) = previous.and_then(instant).filter(|b| Some(*b) != at) {
        let why = match at {
            Some(at) => format!("its job's `at` moved to {}", ax_bus::time::rfc3339(at)),
            None => "its job no longer has `at`".to_string(),
        };
        supersede(client, &InstanceId::for_fire(&spec.name, before), &why).await?;
    }
    let now = ax_bus::time::now();
    let Some(at) = at.filter(|at| *at > now) else {
        return Ok(());
    };
    let tz: chrono_tz::Tz = spec.timezone.parse().unwrap_or(chrono_tz::UTC);
    let instance = NewInstance::new(
        spec,
        at,
        ax_bus::time::biz_date_in(tz, at),
        spec.params.clone(),
        Trigger::Cron,
        now,
    )
    .delayed_until(at);
    creator.create(instance).await?;
    Ok(())
}

fn instant(text: &str) -> Option<DateTime<Utc>> {
    ax_bus::time::parse_instant(text).ok()
}

/// Cancels `id` if it still waits for its time.
async fn supersede(client: &AxClient, id: &InstanceId, why: &str) -> Result<(), ActorError> {
    let updated = client
        .update_instance(id, |r| {
            if r.tag != Tag::Scheduled {
                return Err(ax_bus::instance::TransitionRefused::NotScheduled(r.tag));
            }
            r.ended_early(&r.trace_id, State::Cancelled, Tag::Superseded, why)
        })
        .await?;
    if let Updated::Written(record, _) = updated {
        publish::event(client, &record).await;
    }
    Ok(())
}
