//! Jobs with `at:`: fired once, at that instant, then defined without firing again.
//!
//! Applying such a job creates its one instance at once, as a delayed trigger does (see
//! [`crate::scheduler::delayed`]): the record is `scheduled` under the id of the fire
//! (`<job>.<at>`), and JetStream keeps the wait. So it survives every Scheduler's death like
//! any delayed instance, a re-apply of the same definition finds the instance created (and
//! changes nothing), and an `at` that has passed when the job is first applied creates nothing
//! (apply warns).
//!
//! The instance that still waits always runs the job as last applied: moving `at` cancels the
//! instance of the old instant (tag `superseded`); deleting the job cancels it at once (tag
//! `job_deleted`; the due message, should that write fail, finds the job gone); changing the
//! job otherwise cancels the waiting attempt and schedules a new attempt of the same instance
//! with the new definition — the instance id, the business code's idempotency key, stays that
//! of the instant. A job deleted and applied again is another job (another incarnation, with
//! its own `defined_at`), as for its delayed triggers: the deleted one's instance stays
//! cancelled, with its reason, and the new one's fire is an instance of its own
//! ([`InstanceId::for_incarnation`]) — business code that took the first id as done is not
//! told that a different job ran under it. Each waiting attempt carries the job's
//! `defined_at`, so an attempt of a deleted job never runs under its successor.

use chrono::{DateTime, Utc};

use ax_bus::client::Updated;
use ax_bus::error::During;
use ax_bus::ids::{InstanceId, JobName, TraceId};
use ax_bus::instance::Trigger;
use ax_bus::messages::{Change, StoredRecord, WorkItem};
use ax_bus::spec::JobSpec;
use ax_bus::{AxClient, InstanceRecord, State, Tag};

use crate::jetstream::publish;
use crate::scheduler::creator::{Creates, Creator};
use crate::scheduler::delayed;
use crate::scheduler::new_instance::NewInstance;
use crate::ActorError;

/// The id of the fire of one-off job `name` at `at`, for its incarnation defined at
/// `defined_at`, and its record if there is one: the fire's own id, unless the instance there
/// was cancelled with its job's deletion — an earlier incarnation's — then this incarnation's
/// ([`InstanceId::for_incarnation`]). Without `defined_at` (a registry entry written before
/// incarnations were kept) the fire's own id.
async fn instance_of(
    client: &AxClient,
    name: &JobName,
    at: DateTime<Utc>,
    defined_at: Option<DateTime<Utc>>,
) -> Result<(InstanceId, Option<(InstanceRecord, u64)>), ActorError> {
    let id = InstanceId::for_fire(name, at);
    let found = client.instance(&id).await?;
    let earlier = |r: &InstanceRecord| r.state == State::Cancelled && r.tag == Tag::JobDeleted;
    match (found, defined_at) {
        (Some((record, _)), Some(defined_at)) if earlier(&record) => {
            let id = InstanceId::for_incarnation(name, at, defined_at);
            let found = client.instance(&id).await?;
            Ok((id, found))
        }
        (found, _) => Ok((id, found)),
    }
}

/// A job just stored, as [`on_apply`] needs it.
pub(crate) struct Stored<'a> {
    pub spec: &'a JobSpec,
    /// How the store changed it.
    pub change: Change,
    /// When a job of this name was created (the registry's `defined_at`).
    pub defined_at: Option<DateTime<Utc>>,
    /// Its `at` before this apply.
    pub previous_at: Option<&'a str>,
}

/// After a job was stored: the old instant's instance cancelled if `at` moved, the new one's
/// created — or, if it exists and waits under an older definition or was withdrawn before its
/// time, scheduled again with this one — if it lies ahead.
async fn on_apply(client: &AxClient, creator: &Creator, job: Stored<'_>) -> Result<(), ActorError> {
    let spec = job.spec;
    let at = spec.at.as_deref().and_then(instant);
    if let Some(before) = job.previous_at.and_then(instant).filter(|b| Some(*b) != at) {
        let why = match at {
            Some(at) => format!("its job's `at` moved to {}", ax_bus::time::rfc3339(at)),
            None => "its job no longer has `at`".to_string(),
        };
        let (id, _) = instance_of(client, &spec.name, before, job.defined_at).await?;
        withdraw(client, &id, Tag::Superseded, &why).await?;
    }
    let now = ax_bus::time::now();
    let Some(at) = at.filter(|at| *at > now) else {
        return Ok(());
    };
    let tz: chrono_tz::Tz = spec.timezone.parse().unwrap_or(chrono_tz::UTC);
    let mut instance = NewInstance::new(
        spec,
        at,
        ax_bus::time::biz_date_in(tz, at),
        spec.params.clone(),
        Trigger::Cron,
        now,
    )
    .delayed_until(at);
    instance.defined_at = job.defined_at;
    let (id, found) = instance_of(client, &spec.name, at, job.defined_at).await?;
    if id != instance.record.instance_id {
        instance = instance.under_id(id.clone());
    }
    match found {
        None => {
            creator.create(instance).await?;
        }
        Some((record, _)) if record.state == State::Running && record.tag == Tag::Scheduled => {
            if job.change == Change::Unchanged {
                return Ok(());
            }
            let why = "its job was changed before the instance was due";
            // Released meanwhile (it fell due): that fire has happened.
            if let Some(withdrawn) = withdraw(client, &id, Tag::Superseded, why).await? {
                rearm(client, instance, withdrawn, "its job was changed").await?;
            }
        }
        Some((record, revision))
            if record.state == State::Cancelled
                && matches!(record.tag, Tag::JobDeleted | Tag::Superseded) =>
        {
            let known = StoredRecord {
                record: Box::new(record),
                revision,
            };
            rearm(client, instance, known, "its job was applied again").await?;
        }
        // It ran, runs, or an operator ended it: the one fire of the instant happened.
        Some(_) => {}
    }
    Ok(())
}

/// After job `name`, whose `at` was `at` and which was created at `defined_at`, was
/// deleted: its instance cancelled if it still waits.
async fn on_delete(
    client: &AxClient,
    name: &JobName,
    at: Option<&str>,
    defined_at: Option<DateTime<Utc>>,
) -> Result<(), ActorError> {
    let Some(at) = at.and_then(instant) else {
        return Ok(());
    };
    let why = "its job was deleted before the instance was due";
    let (id, _) = instance_of(client, name, at, defined_at).await?;
    withdraw(client, &id, Tag::JobDeleted, why).await.map(drop)
}

/// A new attempt of `instance`'s record (withdrawn before its time; `known` as last read or
/// written) scheduled with its definition: the wait published first, then the record moved to
/// it — a wait whose record write failed finds another attempt current when due, and is
/// dropped.
async fn rearm(
    client: &AxClient,
    mut instance: NewInstance,
    known: StoredRecord,
    why: &str,
) -> Result<(), ActorError> {
    let trace = TraceId::random();
    let id = instance.record.instance_id.clone();
    let next = match known.record.rearmed(&trace, why) {
        Ok(next) => next,
        Err(refused) => {
            tracing::debug!(instance = %id, %refused, "not scheduled again");
            return Ok(());
        }
    };
    instance.work = WorkItem::for_attempt(&next, instance.work.spec);
    instance.record = next;
    delayed::schedule(client, &instance)
        .await?
        .await
        .during(|| format!("schedule {id} again"))?;
    if let Updated::Written(record, _) = client
        .update_instance_from(&id, Some(known), |r| r.rearmed(&trace, why))
        .await?
    {
        publish::event(client, &record).await;
    }
    Ok(())
}

fn instant(text: &str) -> Option<DateTime<Utc>> {
    ax_bus::time::parse_instant(text).ok()
}

/// Cancels `id` with `tag` if it still waits for its time: the record written, if it did.
async fn withdraw(
    client: &AxClient,
    id: &InstanceId,
    tag: Tag,
    why: &str,
) -> Result<Option<StoredRecord>, ActorError> {
    let updated = client
        .update_instance(id, |r| {
            if r.tag != Tag::Scheduled {
                return Err(ax_bus::instance::TransitionRefused::NotScheduled(r.tag));
            }
            r.ended_early(&r.trace_id, State::Cancelled, tag, why)
        })
        .await?;
    let Updated::Written(record, revision) = updated else {
        return Ok(None);
    };
    publish::event(client, &record).await;
    Ok(Some(StoredRecord { record, revision }))
}
/// What follows a one-off job's `at` as the job is applied or deleted: the [`Follower`] that
/// runs, or memory in the job commands' unit tests.
pub(crate) trait OneOffs {
    /// `job` was stored: its waiting instance follows ([`on_apply`]).
    async fn applied(&self, job: Stored<'_>) -> Result<(), ActorError>;
    /// Job `name` was deleted: its waiting instance, if any, is withdrawn ([`on_delete`]).
    async fn deleted(
        &self,
        name: &JobName,
        at: Option<&str>,
        defined_at: Option<DateTime<Utc>>,
    ) -> Result<(), ActorError>;
}

/// The one-off jobs' waiting instances, followed in the store and made by the creator.
pub(crate) struct Follower<'a> {
    pub(crate) client: &'a AxClient,
    pub(crate) creator: &'a Creator,
}

impl OneOffs for Follower<'_> {
    async fn applied(&self, job: Stored<'_>) -> Result<(), ActorError> {
        on_apply(self.client, self.creator, job).await
    }

    async fn deleted(
        &self,
        name: &JobName,
        at: Option<&str>,
        defined_at: Option<DateTime<Utc>>,
    ) -> Result<(), ActorError> {
        on_delete(self.client, name, at, defined_at).await
    }
}
