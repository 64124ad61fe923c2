//! Carrying out the DagCoordinator's [`Action`]s: stores and hand-offs are pipelined and
//! awaited together, record updates run 64 at a time, and the instances of jobs without cron
//! are created and fed back into the view (which may decide more).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use chrono::NaiveDate;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};

use ax_bus::client::deps::{encode_entry, entry_key};
use ax_bus::client::Updated;
use ax_bus::error::NatsError;
use ax_bus::ids::{InstanceId, NodeId, TraceId};
use ax_bus::instance::{State, Tag, TransitionRefused, Trigger};
use ax_bus::messages::{AlertKind, ResultMessage, Waiting, WorkItem};
use ax_bus::spec::dataset::DatasetUri;
use ax_bus::spec::{DataRerun, JobSpec};
use ax_bus::{codec, msg_id, AxClient, InstanceRecord};

use super::state::{Action, DagState, DayKey};
use crate::jetstream::burst;
use crate::jetstream::publish::{self, AckWindow};
use crate::ActorError;

const RECORD_UPDATES_IN_FLIGHT: usize = 64;
const CREATES_IN_FLIGHT: usize = 64;
const ACK_WINDOW: usize = 1024;

/// A record update that may run alongside the others of its batch.
type RecordJob = BoxFuture<'static, Result<(), ActorError>>;

/// One execution of a list of actions.
struct Execution {
    client: AxClient,
    node: NodeId,
    acks: AckWindow,
    /// The deps entries to store, as one burst.
    entries: Vec<burst::Item>,
    /// The datasets' updates to store, as one burst.
    updates: Vec<burst::Item>,
    /// One record update per instance: the last action decides it.
    records: BTreeMap<InstanceId, RecordJob>,
    creates: Vec<(Arc<JobSpec>, NaiveDate)>,
    /// The datasets updated by this execution, each for its date.
    fresh: BTreeSet<(DatasetUri, NaiveDate)>,
    /// Those not yet looked at for the jobs they run, with when they were updated.
    fresh_unseen: Vec<(DatasetUri, NaiveDate, chrono::DateTime<chrono::Utc>)>,
    /// Instances of jobs run by their data to run again for an input updated at that time.
    reruns: Vec<(Arc<JobSpec>, NaiveDate, chrono::DateTime<chrono::Utc>)>,
    /// Instances created here are born tagged `waiting_deps`, saying what they wait for: their
    /// record is written again only when that is no longer all (one dependency was met).
    created_here: HashMap<InstanceId, String>,
    /// Days to read for the view.
    reads: Vec<DayKey>,
    /// Days to note (see [`Action::NoteDay`]).
    notes: Vec<DayKey>,
}

/// Carries out `actions` against JetStream; created instances are fed back into `state`. Once
/// it returns Ok, everything the actions caused is stored; it returns the days to read for the
/// view ([`Action::ReadDays`]), which the coordinator reads without holding up its decisions.
pub(super) async fn execute(
    client: &AxClient,
    node: &NodeId,
    state: &mut DagState,
    actions: Vec<Action>,
) -> Result<Vec<DayKey>, ActorError> {
    let mut run = Execution {
        client: client.clone(),
        node: node.clone(),
        acks: AckWindow::new(ACK_WINDOW),
        entries: Vec::new(),
        updates: Vec::new(),
        records: BTreeMap::new(),
        creates: Vec::new(),
        fresh: BTreeSet::new(),
        fresh_unseen: Vec::new(),
        reruns: Vec::new(),
        created_here: HashMap::new(),
        reads: Vec::new(),
        notes: Vec::new(),
    };
    let mut queue: VecDeque<Action> = actions.into();
    loop {
        while let Some(action) = queue.pop_front() {
            run.apply(action).await?;
        }
        run.run_by_data(state).await?;
        if run.creates.is_empty() && run.reruns.is_empty() {
            break;
        }
        let now = ax_bus::time::now();
        for (work, message) in run.create_pending().await? {
            run.created_here.insert(work.instance_id.clone(), message);
            queue.extend(state.on_created(work, now));
        }
        for work in run.rerun_pending().await? {
            queue.extend(state.on_created(work, now));
        }
    }
    for stored in burst::publish(client, std::mem::take(&mut run.entries)) {
        stored.await?;
    }
    for stored in burst::publish(client, std::mem::take(&mut run.updates)) {
        stored.await?;
    }
    client.note_days(&run.notes).await?;
    run.acks.flush().await?;
    let mut updates =
        futures::stream::iter(run.records.into_values()).buffer_unordered(RECORD_UPDATES_IN_FLIGHT);
    while let Some(done) = updates.next().await {
        done?;
    }
    Ok(run.reads)
}

impl Execution {
    async fn apply(&mut self, action: Action) -> Result<(), ActorError> {
        match action {
            Action::ReadDays(keys) => {
                self.reads.extend(keys);
                Ok(())
            }
            Action::SaveEntry {
                job,
                date,
                instance_id,
                attempt,
                state,
            } => {
                let bucket = self.client.layout.deps_bucket();
                let key = entry_key(&job, date, &instance_id);
                self.entries.push(burst::Item::kv_put(
                    &bucket,
                    &key,
                    encode_entry(attempt, state)?,
                ));
                Ok(())
            }
            Action::NoteDay { job, date } => {
                self.notes.push((job, date));
                Ok(())
            }
            Action::Hold {
                work,
                since,
                reason,
            } => self.hold(work, since, reason).await,
            Action::Release { work, held } => self.release(work, held).await,
            Action::Note { work, reason } => {
                let id = work.instance_id.clone();
                self.records
                    .insert(id, tag_waiting(self.client.clone(), work, reason).boxed());
                Ok(())
            }
            Action::End {
                work,
                state,
                tag,
                message,
                held,
            } => {
                if held {
                    self.forget(&work.instance_id).await?;
                }
                let job = end_instance(
                    self.client.clone(),
                    self.node.clone(),
                    work.clone(),
                    state,
                    tag,
                    message,
                );
                self.records.insert(work.instance_id, job.boxed());
                Ok(())
            }
            Action::Forget { instance_id } => self.forget(&instance_id).await,
            Action::Updated(updates) => {
                let bucket = self.client.layout.datasets_bucket();
                for update in updates {
                    let Some(date) = ax_bus::time::parse_biz_date(&update.biz_date) else {
                        continue;
                    };
                    let key = ax_bus::client::datasets::update_key(&update.dataset, date);
                    self.updates
                        .push(burst::Item::kv_put(&bucket, &key, codec::encode(&update)?));
                    if self.fresh.insert((update.dataset.clone(), date)) {
                        self.fresh_unseen.push((update.dataset, date, update.at));
                    }
                }
                Ok(())
            }
            Action::HoldSplit { work, children } => {
                let waiting = Waiting {
                    work,
                    since: ax_bus::time::now(),
                    children: Some(children),
                };
                self.store_waiting(&waiting).await
            }
            Action::Create { spec, date } => {
                self.creates.push((spec, date));
                Ok(())
            }
        }
    }

    /// Creates the instance of each job run by its data (`on_datasets`) whose inputs have all
    /// been updated for a date by now, one of them by this execution: create-if-absent, so
    /// once per job and date, however often its inputs are updated or a result redelivered.
    async fn run_by_data(&mut self, state: &DagState) -> Result<(), ActorError> {
        let mut datasets = None;
        for (dataset, date, at) in std::mem::take(&mut self.fresh_unseen) {
            for spec in state.run_by(&dataset) {
                let mut ready = true;
                for input in &spec.on_datasets {
                    if self.fresh.contains(&(input.clone(), date)) {
                        continue;
                    }
                    let store = match &datasets {
                        Some(store) => store,
                        None => datasets.insert(
                            self.client
                                .js
                                .get_key_value(self.client.layout.datasets_bucket())
                                .await
                                .map_err(|e| NatsError::new("open the datasets bucket", e))?,
                        ),
                    };
                    let key = ax_bus::client::datasets::update_key(input, date);
                    let kept = store
                        .get(&key)
                        .await
                        .map_err(|e| NatsError::new(format!("read dataset update {key}"), e))?;
                    if kept.is_none() {
                        ready = false;
                        break;
                    }
                }
                if ready {
                    if spec.rerun != DataRerun::Never {
                        self.reruns.push((spec.clone(), date, at));
                    }
                    self.creates.push((spec, date));
                }
            }
        }
        Ok(())
    }

    /// Starts again, per its `rerun` policy, each date's instance of a job run by its data
    /// whose input was updated again since its latest attempt started (the instance record's
    /// compare-and-swap decides, so a redelivered update starts nothing twice); the new
    /// attempts, for the view.
    async fn rerun_pending(&mut self) -> Result<Vec<WorkItem>, ActorError> {
        let mut works = Vec::new();
        for (spec, date, at) in std::mem::take(&mut self.reruns) {
            let tz: chrono_tz::Tz = spec.timezone.parse().unwrap_or(chrono_tz::UTC);
            let id = InstanceId::for_fire(&spec.name, ax_bus::time::start_of_day(tz, date));
            let trace = TraceId::random();
            let only_success = spec.rerun == DataRerun::IfSucceeded;
            match self
                .client
                .update_instance(&id, |r| r.rerun_for_update(&trace, at, only_success))
                .await?
            {
                Updated::Written(record, _) => {
                    publish::event(&self.client, &record).await;
                    works.push(WorkItem::for_attempt(&record, spec.clone()));
                }
                Updated::Refused(why @ TransitionRefused::DataRerunsSpent(_)) => {
                    let message = format!(
                        "{id} is not run again for {date}'s update of its inputs at {}: {why}",
                        ax_bus::time::rfc3339(at)
                    );
                    publish::alert_about(
                        &self.client,
                        &self.node,
                        AlertKind::DataRuns,
                        message,
                        &id,
                        &spec.name,
                    )
                    .await;
                }
                Updated::Refused(why) => {
                    tracing::debug!(instance = %id, %why, "not run again for its input's update");
                }
                Updated::Missing => {}
            }
        }
        Ok(works)
    }

    async fn store_waiting(&mut self, waiting: &Waiting) -> Result<(), ActorError> {
        let bucket = self.client.layout.waiting_bucket();
        let put = self
            .client
            .kv_put_pipelined(&bucket, &waiting.work.instance_id, codec::encode(waiting)?)
            .await?;
        self.acks.push(put).await
    }

    async fn forget(&mut self, instance_id: &InstanceId) -> Result<(), ActorError> {
        let bucket = self.client.layout.waiting_bucket();
        let delete = self
            .client
            .kv_delete_pipelined(&bucket, instance_id)
            .await?;
        self.acks.push(delete).await
    }

    async fn hold(
        &mut self,
        work: WorkItem,
        since: chrono::DateTime<chrono::Utc>,
        reason: String,
    ) -> Result<(), ActorError> {
        let id = work.instance_id.clone();
        let waiting = Waiting {
            work: work.clone(),
            since,
            children: None,
        };
        self.store_waiting(&waiting).await?;
        if self.created_here.get(&id) != Some(&reason) {
            self.records
                .insert(id, tag_waiting(self.client.clone(), work, reason).boxed());
        }
        Ok(())
    }

    async fn release(&mut self, mut work: WorkItem, held: bool) -> Result<(), ActorError> {
        // Due from now on when it waited for its dependencies, or when its expected time is
        // only its business date's midnight (made by its dependencies or its inputs).
        if held || work.trigger == Some(Trigger::Deps) {
            work.due_at = Some(ax_bus::time::now().max(work.expected_time));
        }
        let client = &self.client;
        let ack = publish::to_stream(
            client,
            client.subjects().ready_for(&work),
            &msg_id::ready(&work.trace_id),
            &work,
        )
        .await?;
        self.acks.push(ack).await?;
        if held {
            self.forget(&work.instance_id).await?;
        }
        // The record keeps its tag until the worker tags it `executing`.
        self.records.remove(&work.instance_id);
        Ok(())
    }

    /// Creates the instances asked for so far; returns the attempts that wait, each with what
    /// its record says it waits for.
    async fn create_pending(&mut self) -> Result<Vec<(WorkItem, String)>, ActorError> {
        let client = self.client.clone();
        let made: Vec<_> = futures::stream::iter(self.creates.drain(..))
            .map(|(spec, date)| create_for_date(client.clone(), spec, date))
            .buffered(CREATES_IN_FLIGHT)
            .collect()
            .await;
        let mut works = Vec::new();
        for work in made {
            works.extend(work?);
        }
        Ok(works)
    }
}

/// Tags the record `waiting_deps` (informational: a refusal means it moved on).
async fn tag_waiting(client: AxClient, work: WorkItem, reason: String) -> Result<(), ActorError> {
    if let Updated::Written(record, _) = client
        .update_instance(&work.instance_id, |r| r.waiting(&work.trace_id, &reason))
        .await?
    {
        publish::event(&client, &record).await;
    }
    Ok(())
}

/// Ends an instance that will not run, and publishes its result (which cascades further).
async fn end_instance(
    client: AxClient,
    node: NodeId,
    work: WorkItem,
    state: State,
    tag: Tag,
    message: String,
) -> Result<(), ActorError> {
    let updated = client
        .update_instance(&work.instance_id, |r| {
            r.ended_early(&work.trace_id, state, tag, &message)
        })
        .await?;
    let record: InstanceRecord = match updated {
        Updated::Written(record, _) => *record,
        Updated::Refused(_) | Updated::Missing => return Ok(()),
    };
    publish::to_stream_acked(
        &client,
        client.subjects().result(&record.job),
        &msg_id::result(&record.trace_id),
        &ResultMessage::from_record(&record),
    )
    .await?;
    if record.state == State::Failed && work.shard.is_none() {
        publish::failed_for_good(&client, &node, &work, record.tag, &record.message).await?;
    }
    publish::event(&client, &record).await;
    Ok(())
}

/// Creates the instance of a job without cron for `date`. When it exists already (a crash after
/// creating it), its record tells whether it still waits. With the attempt, its record's
/// message.
async fn create_for_date(
    client: AxClient,
    spec: Arc<JobSpec>,
    date: NaiveDate,
) -> Result<Option<(WorkItem, String)>, ActorError> {
    let tz: chrono_tz::Tz = spec.timezone.parse().unwrap_or(chrono_tz::UTC);
    let expected = ax_bus::time::start_of_day(tz, date);
    let mut record = InstanceRecord::first(
        &spec,
        expected,
        date.format("%Y-%m-%d").to_string(),
        spec.params.clone(),
        Trigger::Deps,
        ax_bus::time::now(),
    );
    record.tag = Tag::WaitingDeps;
    client.stamp_retention(&mut record);
    let deps: Vec<String> = spec
        .deps
        .iter()
        .filter_map(|d| {
            let at = date + chrono::Duration::days(d.offset_days().ok()?);
            Some(format!("`{}` for {at}", d.name))
        })
        .collect();
    record.message = if deps.is_empty() {
        format!("its inputs were all updated for {date}")
    } else {
        format!("waiting for {}", deps.join(", "))
    };
    if client.create_instance(&record).await? {
        publish::event(&client, &record).await;
        let work = WorkItem::for_attempt(&record, spec.clone());
        return Ok(Some((work, record.message)));
    }
    let existing = client.instance(&record.instance_id).await?;
    Ok(existing.and_then(|(record, _)| {
        let waits =
            record.state == State::Running && matches!(record.tag, Tag::Queued | Tag::WaitingDeps);
        waits.then(|| (WorkItem::for_attempt(&record, spec.clone()), record.message))
    }))
}
