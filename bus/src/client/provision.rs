//! The JetStream objects ax needs, created (or brought up to date) idempotently by every node
//! at start; commands only open them.
//!
//! - `<AX>_CONTROL` (work queue, `ax.control.>`): commands, each taken by one Scheduler;
//! - `<AX>_FLOW` (work queue, `ax.internal.created.>`, `ax.internal.ready.>` and
//!   `ax.internal.retry.>`): instances on their way from the Scheduler through the
//!   DagCoordinator to the Router, and failed attempts with a retry left back to the Schedulers;
//! - `<AX>_DISPATCH` (work queue, `ax.internal.dispatch.>`): one consumer per worker;
//! - `<AX>_DELAYED` (work queue with message schedules, `ax.internal.delayed.>` and
//!   `ax.internal.due.>`): delayed triggers' attempts until they are due (see the Scheduler's
//!   `delayed` module);
//! - `<AX>_RESULTS` (limits, `ax.result.>`): every finished attempt, kept for a week, open to
//!   business services' own consumers;
//! - `<AX>_TICKS` (limits, `ax.internal.tick.>`, the last 1000 per job): what became of each
//!   cron tick, for `ax job history` and the misfire policy;
//! - `<AX>_AUDIT` (limits, `ax.audit.>`, 400 days): the audit trail, who did what and how;
//! - `<AX>_DEAD` (limits, `ax.internal.dead.>`, 30 days): dead letters, each the original payload
//!   with why it died in its headers;
//! - `<AX>_ADVISORIES` (work queue, the server's max-deliveries advisories about ax's streams):
//!   captured because advisories are plain core messages, lost when nobody listens; the
//!   dead-letter keeper turns each into a dead letter;
//! - `<AX>_ALERTS` (limits, `ax.alert.>`, 7 days): every alert, for the webhook forwarder and
//!   for whoever wants to read them later;
//! - `<AX>_LINEAGE` (limits, `ax.lineage.>`, 7 days): every attempt's start and end as
//!   OpenLineage run events (see [`crate::openlineage`]), for the HTTP forwarder and whoever
//!   reads them later;
//! - `<AX>_EXPIRY` (work queue, `ax.internal.expiry.>`): the instances whose records became
//!   final, by how long each is kept, until the janitor removes the records past it (see
//!   [`crate::client::retention`]);
//! - `<AX>_CLOCK` (file, `ax.internal.clock.>`, the last probe per node): where nodes read
//!   the server's clock (see the clock guard);
//! - buckets `<ax>_jobs` (registry), `<ax>_instances` (records, their last 64 revisions: the
//!   instance history; a final one removed after its retention), `<ax>_claims` (one key per
//!   attempt that ran), `<ax>_workers` (worker heartbeats), `<ax>_nodes` (node heartbeats:
//!   roles, restarts, stalls), `<ax>_deps` (instances per business date and job, 40 days),
//!   `<ax>_datasets` (each dataset's last update per business date, 40 days),
//!   `<ax>_waiting` (instances held for their dependencies), `<ax>_latest` (each job's latest
//!   instance), `<ax>_leases` (which node leads what; entries expire), `<ax>_queues` (which
//!   priority queues are paused), `<ax>_summary` (each day's summary, 400 days), `<ax>_inflight`
//!   (re-dispatches not yet claimed, see [`crate::client::in_flight`]), `<ax>_tokens` (API
//!   tokens' hashes by name), `<ax>_approvals` (re-runs waiting for, or past, a second
//!   person's decision) and `<ax>_answers` (the answers to commands sent with a message id,
//!   by stream sequence, for a request repeating that id; a few minutes).
//!
//! Message ids de-duplicate publishes within each stream's duplicate window; the buckets give
//! create-if-absent and compare-and-swap, which is where uniqueness really comes from.

use std::time::Duration;

use async_nats::jetstream::{self, stream};

use crate::ids::WorkerId;
use crate::spec::Priority;
use crate::subjects::Subjects;

/// How long results stay in `<AX>_RESULTS`.
pub const RESULTS_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long a claim key lives: far longer than any redelivery of its dispatch.
pub const CLAIMS_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long a worker heartbeat stays in the bucket. Liveness is judged by the Routers, and
/// the janitor removes a dead worker's entry once it has handed its attempts over; the entry
/// must outlive any outage of every Router, or a worker that died meanwhile would be forgotten
/// with its queue and claims.
pub const WORKERS_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long a node heartbeat stays in the bucket: a node silent this long is gone from `ax nodes`.
pub const NODES_MAX_AGE: Duration = Duration::from_secs(60);
/// How long tick records and DAG history are kept.
pub const HISTORY_MAX_AGE: Duration = Duration::from_secs(40 * 24 * 3600);
/// Tick records kept per job.
pub const TICKS_PER_JOB: i64 = 1000;
/// Revisions kept of each instance record: the instance history (`ax instance history`) is
/// read from them, so every step that writes the record is kept with the record — the most a
/// key-value bucket keeps.
pub const RECORD_REVISIONS: i64 = 64;
/// How long a finished instance's record is kept unless its job or the creating node's config
/// says otherwise.
pub const INSTANCES_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long the marker left by a removed record stays (a reader of the bucket that is behind
/// sees the removal within it).
pub const REMOVAL_MARKER_TTL: Duration = Duration::from_secs(3600);
/// How long the day summaries are kept (one key a day: `ax status --date` answers for a year
/// back and more).
pub const SUMMARIES_MAX_AGE: Duration = Duration::from_secs(400 * 24 * 3600);
/// How long audit records are kept.
pub const AUDIT_MAX_AGE: Duration = Duration::from_secs(400 * 24 * 3600);
/// How long approvals are kept, decided or not (the audit keeps their story 400 days).
pub const APPROVALS_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long dead letters are kept.
pub const DEAD_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long attempt logs are kept.
pub const LOGS_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long OpenLineage events are kept.
pub const LINEAGE_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long alerts are kept.
pub const ALERTS_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long a lease lives without renewal.
pub const LEASE_TTL: Duration = Duration::from_secs(6);
/// De-duplication window of the streams.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// How long the answer to a command sent with a message id is kept: past the duplicate window,
/// in which a repeat of the id can come.
pub const ANSWERS_MAX_AGE: Duration = Duration::from_secs(300);

/// How long ax keeps what it keeps for a while (a node config's `[retention]`). `None` keeps
/// what the stream has (the default below for one that is made): a node without the setting
/// never undoes another's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// Finished instances' records (`ax_instances`; [`INSTANCES_MAX_AGE`]): stamped on the
    /// records this node creates, see [`crate::client::retention`].
    pub instances: Option<Duration>,
    /// Results (`AX_RESULTS`; [`RESULTS_MAX_AGE`]).
    pub results: Option<Duration>,
    /// Attempt logs (`AX_LOGS`; [`LOGS_MAX_AGE`]).
    pub logs: Option<Duration>,
    /// The audit trail (`AX_AUDIT`; [`AUDIT_MAX_AGE`]).
    pub audit: Option<Duration>,
    /// The tick ledger (`AX_TICKS`; [`HISTORY_MAX_AGE`]).
    pub ticks: Option<Duration>,
    /// Dead letters (`AX_DEAD`; [`DEAD_MAX_AGE`]).
    pub dead_letters: Option<Duration>,
    /// Alerts (`AX_ALERTS`; [`ALERTS_MAX_AGE`]).
    pub alerts: Option<Duration>,
    /// OpenLineage events (`AX_LINEAGE`; [`LINEAGE_MAX_AGE`]).
    pub lineage: Option<Duration>,
    /// The day summaries of `ax status --date` (`ax_summary`; [`SUMMARIES_MAX_AGE`]).
    pub summaries: Option<Duration>,
}

/// Names of the streams and buckets for one subject prefix.
#[derive(Clone, Debug)]
pub struct Layout {
    /// Subject names.
    pub subjects: Subjects,
    /// Replicas of every stream and bucket (1 on a single server, 3 on a cluster); `None`
    /// keeps what each one has (1 for one that is created) — what a CLI command or a node
    /// without the setting does, so that it never scales a cluster's streams down.
    pub replicas: Option<usize>,
    /// How long what is kept for a while is kept.
    pub retention: Retention,
    /// The instance buckets a first node sets (`[node] instance_buckets`, see
    /// [`crate::client::instance_buckets`]); `None`: one, when no node set them yet.
    pub instance_buckets: Option<u16>,
}

/// A provisioning failure, naming the object.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up JetStream {object}: {source}")]
pub struct ProvisionError {
    /// The stream or bucket.
    pub object: String,
    /// The server's or client's reason.
    #[source]
    pub source: crate::error::BoxError,
}

impl Layout {
    /// The layout for `subjects` with `replicas` (see [`Layout::replicas`]).
    pub fn new(subjects: Subjects, replicas: Option<usize>) -> Self {
        Self {
            subjects,
            replicas: replicas.map(|n| n.max(1)),
            retention: Retention::default(),
            instance_buckets: None,
        }
    }

    /// The stream `name`'s retention setting: `Some(setting)` for a stream whose age is a
    /// setting (the setting itself `None` when this layout keeps what the stream has), `None`
    /// for a stream whose age is ax's own.
    fn age_setting(&self, name: &str) -> Option<Option<Duration>> {
        let r = &self.retention;
        let kept = [
            (self.results_stream(), r.results),
            (self.logs_stream(), r.logs),
            (self.audit_stream(), r.audit),
            (self.ticks_stream(), r.ticks),
            (self.dead_stream(), r.dead_letters),
            (self.alerts_stream(), r.alerts),
            (self.lineage_stream(), r.lineage),
            (format!("KV_{}", self.summary_bucket()), r.summaries),
        ];
        kept.into_iter()
            .find(|(stream, _)| stream == name)
            .map(|(_, setting)| setting)
    }

    fn stream_name(&self, what: &str) -> String {
        format!(
            "{}_{what}",
            self.subjects.storage_tag().to_ascii_uppercase()
        )
    }

    fn bucket_name(&self, what: &str) -> String {
        format!("{}_{what}", self.subjects.storage_tag())
    }

    /// `AX_CONTROL`.
    pub fn control_stream(&self) -> String {
        self.stream_name("CONTROL")
    }
    /// `AX_FLOW`.
    pub fn flow_stream(&self) -> String {
        self.stream_name("FLOW")
    }
    /// `AX_DISPATCH`.
    pub fn dispatch_stream(&self) -> String {
        self.stream_name("DISPATCH")
    }
    /// The durable consumer worker `worker` reads its `priority` queue of `AX_DISPATCH` with.
    pub fn worker_consumer(&self, worker: &WorkerId, priority: Priority) -> String {
        format!("worker-{worker}-{}", priority.as_str())
    }
    /// The consumer the Routers' janitor drains that queue with when the worker is judged dead.
    /// A work-queue stream allows one consumer per subject, so while it exists the worker
    /// cannot open its own: the worker removes one it finds (see the worker's pumps), and the
    /// server removes one left idle.
    pub fn drain_consumer(&self, worker: &WorkerId, priority: Priority) -> String {
        format!("janitor-{worker}-{}", priority.as_str())
    }
    /// `AX_DELAYED`.
    pub fn delayed_stream(&self) -> String {
        self.stream_name("DELAYED")
    }
    /// `AX_RESULTS`.
    pub fn results_stream(&self) -> String {
        self.stream_name("RESULTS")
    }
    /// `ax_jobs`.
    pub fn jobs_bucket(&self) -> String {
        self.bucket_name("jobs")
    }
    /// `ax_instances`.
    pub fn instances_bucket(&self) -> String {
        self.bucket_name("instances")
    }
    /// Instance bucket `i`: `ax_instances` for 0, `ax_instances_<i>` for the others (see
    /// [`crate::client::instance_buckets`]).
    pub fn instance_bucket(&self, i: u16) -> String {
        match i {
            0 => self.instances_bucket(),
            i => format!("{}_{i}", self.instances_bucket()),
        }
    }
    /// `ax_claims`.
    pub fn claims_bucket(&self) -> String {
        self.bucket_name("claims")
    }
    /// `ax_inflight`.
    pub fn in_flight_bucket(&self) -> String {
        self.bucket_name("inflight")
    }
    /// `ax_workers`.
    pub fn workers_bucket(&self) -> String {
        self.bucket_name("workers")
    }
    /// `ax_nodes`.
    pub fn nodes_bucket(&self) -> String {
        self.bucket_name("nodes")
    }
    /// `AX_TICKS`.
    pub fn ticks_stream(&self) -> String {
        self.stream_name("TICKS")
    }
    /// `AX_AUDIT`.
    pub fn audit_stream(&self) -> String {
        self.stream_name("AUDIT")
    }
    /// `<AX>_DEAD`.
    pub fn dead_stream(&self) -> String {
        self.stream_name("DEAD")
    }
    /// `<AX>_ALERTS`.
    pub fn alerts_stream(&self) -> String {
        self.stream_name("ALERTS")
    }
    /// `<AX>_LINEAGE`.
    pub fn lineage_stream(&self) -> String {
        self.stream_name("LINEAGE")
    }
    /// `<AX>_LOGS`.
    pub fn logs_stream(&self) -> String {
        self.stream_name("LOGS")
    }
    /// `<AX>_EXPIRY`.
    pub fn expiry_stream(&self) -> String {
        self.stream_name("EXPIRY")
    }
    /// `<AX>_CLOCK`.
    pub fn clock_stream(&self) -> String {
        self.stream_name("CLOCK")
    }
    /// `<AX>_ADVISORIES`.
    pub fn advisories_stream(&self) -> String {
        self.stream_name("ADVISORIES")
    }
    /// The max-deliveries advisories of every consumer of ax's work streams.
    pub fn max_deliveries_subjects(&self) -> Vec<String> {
        [
            self.control_stream(),
            self.flow_stream(),
            self.dispatch_stream(),
            self.results_stream(),
            self.alerts_stream(),
            self.lineage_stream(),
        ]
        .iter()
        .map(|stream| format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.*"))
        .collect()
    }
    /// `ax_deps`.
    pub fn deps_bucket(&self) -> String {
        self.bucket_name("deps")
    }
    /// `ax_waiting`.
    pub fn waiting_bucket(&self) -> String {
        self.bucket_name("waiting")
    }
    /// `ax_latest`.
    pub fn latest_bucket(&self) -> String {
        self.bucket_name("latest")
    }
    /// `ax_leases`.
    pub fn leases_bucket(&self) -> String {
        self.bucket_name("leases")
    }
    /// `ax_partitions`: the number of partitions of the cron jobs and each one's owner.
    pub fn partitions_bucket(&self) -> String {
        self.bucket_name("partitions")
    }
    /// `ax_queues`.
    pub fn queues_bucket(&self) -> String {
        self.bucket_name("queues")
    }
    /// `ax_summary`: each day's summary (the health summary of `ax status`).
    pub fn summary_bucket(&self) -> String {
        self.bucket_name("summary")
    }
    /// `ax_tokens`: API tokens' hashes by name.
    pub fn tokens_bucket(&self) -> String {
        self.bucket_name("tokens")
    }
    /// `ax_approvals`: re-runs waiting for (or past) a second person's decision.
    pub fn approvals_bucket(&self) -> String {
        self.bucket_name("approvals")
    }
    /// `ax_answers`: the answers to commands sent with a message id, by stream sequence.
    pub fn answers_bucket(&self) -> String {
        self.bucket_name("answers")
    }
    /// `ax_datasets`: each dataset's last update per business date.
    pub fn datasets_bucket(&self) -> String {
        self.bucket_name("datasets")
    }

    /// The names of every stream ax needs, the buckets' (`KV_<bucket>`) included: what a
    /// permission that names streams one by one must list.
    pub fn stream_names(&self) -> Vec<String> {
        self.streams()
            .into_iter()
            .map(|c| c.name)
            .chain([self.clock_stream()])
            .chain(
                self.buckets()
                    .into_iter()
                    .map(|(bucket, ..)| format!("KV_{bucket}")),
            )
            .collect()
    }

    /// The streams of instance buckets 1 to `count` − 1 (bucket 0's is among
    /// [`Layout::stream_names`]).
    pub fn instance_bucket_streams(&self, count: u16) -> Vec<String> {
        (1..count)
            .map(|i| format!("KV_{}", self.instance_bucket(i)))
            .collect()
    }

    /// The streams ax needs, as JetStream configs (replicas are set when they are ensured).
    fn streams(&self) -> Vec<stream::Config> {
        use stream::RetentionPolicy::{Limits, WorkQueue};
        let s = &self.subjects;
        let plain = |name: String, subjects: Vec<String>, retention, max_age| stream::Config {
            name,
            subjects,
            retention,
            max_age,
            storage: stream::StorageType::File,
            duplicate_window: DUPLICATE_WINDOW,
            allow_direct: true,
            // Fast-ingest batches (`actors::jetstream::burst`): a hot path's publishes made
            // together are answered every so many messages instead of one by one.
            allow_batch_publish: true,
            ..Default::default()
        };
        let history = |name: String, subject: String, max_age, per_subject| stream::Config {
            max_messages_per_subject: per_subject,
            ..plain(name, vec![subject], Limits, max_age)
        };
        vec![
            plain(
                self.control_stream(),
                vec![s.control_all()],
                WorkQueue,
                Duration::from_secs(24 * 3600),
            ),
            plain(
                self.flow_stream(),
                vec![s.created_all(), s.ready_all(), s.retry_all(), s.split_all()],
                WorkQueue,
                Duration::ZERO,
            ),
            plain(
                self.dispatch_stream(),
                vec![s.dispatch_all()],
                WorkQueue,
                Duration::ZERO,
            ),
            // Schedules of delayed instances and what the server publishes at their time; a
            // work queue, so a fired schedule (which the server removes) and a released due
            // message leave nothing behind.
            stream::Config {
                allow_message_schedules: true,
                ..plain(
                    self.delayed_stream(),
                    vec![s.delayed_all(), s.due_all()],
                    WorkQueue,
                    Duration::ZERO,
                )
            },
            plain(
                self.results_stream(),
                vec![s.result_all()],
                Limits,
                RESULTS_MAX_AGE,
            ),
            history(
                self.ticks_stream(),
                s.tick_all(),
                HISTORY_MAX_AGE,
                TICKS_PER_JOB,
            ),
            history(self.audit_stream(), s.audit_all(), AUDIT_MAX_AGE, -1),
            plain(self.dead_stream(), vec![s.dead_all()], Limits, DEAD_MAX_AGE),
            plain(
                self.advisories_stream(),
                self.max_deliveries_subjects(),
                WorkQueue,
                DEAD_MAX_AGE,
            ),
            plain(
                self.alerts_stream(),
                vec![s.alert_all()],
                Limits,
                ALERTS_MAX_AGE,
            ),
            plain(self.logs_stream(), vec![s.log_all()], Limits, LOGS_MAX_AGE),
            plain(
                self.lineage_stream(),
                vec![s.lineage_all()],
                Limits,
                LINEAGE_MAX_AGE,
            ),
            plain(
                self.expiry_stream(),
                vec![s.expiry_all()],
                WorkQueue,
                Duration::ZERO,
            ),
        ]
    }

    /// The buckets ax needs: (name, history, max age).
    fn buckets(&self) -> Vec<(String, i64, Duration)> {
        vec![
            (self.jobs_bucket(), 10, Duration::ZERO),
            (self.deps_bucket(), 1, HISTORY_MAX_AGE),
            (self.datasets_bucket(), 1, HISTORY_MAX_AGE),
            (self.waiting_bucket(), 1, Duration::ZERO),
            (self.latest_bucket(), 1, Duration::ZERO),
            (self.leases_bucket(), 1, LEASE_TTL),
            (self.partitions_bucket(), 1, Duration::ZERO),
            (self.queues_bucket(), 1, Duration::ZERO),
            (self.summary_bucket(), 1, SUMMARIES_MAX_AGE),
            (self.instances_bucket(), RECORD_REVISIONS, Duration::ZERO),
            (self.tokens_bucket(), 1, Duration::ZERO),
            (self.approvals_bucket(), 1, APPROVALS_MAX_AGE),
            (self.answers_bucket(), 1, ANSWERS_MAX_AGE),
            (self.claims_bucket(), 1, CLAIMS_MAX_AGE),
            (self.workers_bucket(), 1, WORKERS_MAX_AGE),
            (self.in_flight_bucket(), 1, CLAIMS_MAX_AGE),
            (self.nodes_bucket(), 1, NODES_MAX_AGE),
        ]
    }

    /// Creates what is missing and updates what differs, stream by stream and bucket by
    /// bucket; what is already as it should be is only read. Reading first matters: on a
    /// cluster, an update of a stream another node is creating at that moment goes unanswered
    /// (and so does the creation) until the request times out, so nodes starting together must
    /// write only what they have to.
    pub async fn ensure(&self, js: &jetstream::Context) -> Result<(), ProvisionError> {
        for config in self.streams() {
            self.ensure_stream(js, config).await?;
        }
        self.ensure_clock_stream(js).await?;
        for (bucket, history, max_age) in self.buckets() {
            self.ensure_stream(js, bucket_stream(&bucket, history, max_age))
                .await?;
        }
        self.agree_instance_buckets(js).await?;
        Ok(())
    }

    /// Makes sure the instance buckets exist and their count is stored: the count stored if
    /// there is one, else [`Layout::instance_buckets`] (one when unset). Every bucket is made
    /// before the count names it, so a reader that reads the count finds them. Returns the
    /// deployment's count.
    async fn agree_instance_buckets(&self, js: &jetstream::Context) -> Result<u16, ProvisionError> {
        use crate::client::instance_buckets::{stored_count, COUNT_KEY, MAX_BUCKETS};
        let failed = |source: crate::error::BoxError| ProvisionError {
            object: format!(
                "the number of instance buckets (`{COUNT_KEY}` in the partitions bucket)"
            ),
            source,
        };
        let partitions = js
            .get_key_value(self.partitions_bucket())
            .await
            .map_err(|e| failed(e.into()))?;
        let wanted = self.instance_buckets.unwrap_or(1).clamp(1, MAX_BUCKETS);
        let count = loop {
            if let Some(count) = stored_count(&partitions)
                .await
                .map_err(|e| failed(e.into()))?
            {
                break count;
            }
            self.ensure_instance_buckets(js, wanted).await?;
            match partitions
                .create(COUNT_KEY, wanted.to_string().into())
                .await
            {
                Ok(_) => break wanted,
                Err(e) if e.kind() == jetstream::kv::CreateErrorKind::AlreadyExists => continue,
                Err(e) => return Err(failed(e.into())),
            }
        };
        self.ensure_instance_buckets(js, count).await?;
        if self.instance_buckets.is_some_and(|w| w != count) {
            tracing::warn!(
                stored = count,
                configured = wanted,
                "this deployment's instance records are in {count} buckets: [node] instance_buckets = {wanted} is ignored (`ax instance buckets --set` changes it)"
            );
        }
        Ok(count)
    }

    /// Makes instance buckets 1 to `count` − 1 (bucket 0 is among [`Self::buckets`]).
    pub(crate) async fn ensure_instance_buckets(
        &self,
        js: &jetstream::Context,
        count: u16,
    ) -> Result<(), ProvisionError> {
        for i in 1..count {
            let bucket = self.instance_bucket(i);
            self.ensure_stream(js, bucket_stream(&bucket, RECORD_REVISIONS, Duration::ZERO))
                .await?;
        }
        Ok(())
    }

    /// The stream `name` as it is, if it exists.
    async fn existing(
        js: &jetstream::Context,
        name: &str,
    ) -> Result<Option<stream::Config>, ProvisionError> {
        use jetstream::context::GetStreamErrorKind;
        match js.get_stream(name).await {
            Ok(stream) => Ok(Some(stream.cached_info().config.clone())),
            Err(e) => match e.kind() {
                GetStreamErrorKind::JetStream(js)
                    if js.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND =>
                {
                    Ok(None)
                }
                _ => Err(ProvisionError {
                    object: format!("stream {name}"),
                    source: e.into(),
                }),
            },
        }
    }

    /// The replicas a stream gets: the configured number, else what it has (1 when new).
    fn replicas_for(&self, have: Option<&stream::Config>) -> usize {
        self.replicas
            .unwrap_or_else(|| have.map_or(1, |c| c.num_replicas.max(1)))
    }

    async fn ensure_stream(
        &self,
        js: &jetstream::Context,
        want: stream::Config,
    ) -> Result<(), ProvisionError> {
        let name = want.name.clone();
        let failed = |source: crate::error::BoxError| ProvisionError {
            object: format!("stream {name}"),
            source,
        };
        loop {
            let have = Self::existing(js, &name).await?;
            let mut config = want.clone();
            config.num_replicas = self.replicas_for(have.as_ref());
            match (self.age_setting(&name), &have) {
                (Some(Some(age)), _) => config.max_age = age,
                (Some(None), Some(have)) => config.max_age = have.max_age,
                _ => {}
            }
            // JetStream takes no de-duplication window longer than the age.
            if !config.max_age.is_zero() && config.duplicate_window > config.max_age {
                config.duplicate_window = config.max_age;
            }
            return match have {
                Some(have) if !differs(&config, &have) => Ok(()),
                Some(_) => js
                    .update_stream(config)
                    .await
                    .map(drop)
                    .map_err(|e| failed(e.into())),
                None => match js.create_stream(config).await {
                    Ok(_) => Ok(()),
                    // Another node made it meanwhile, perhaps with other settings (replicas,
                    // retention): read it and update what differs.
                    Err(e) if created_meanwhile(&e) => continue,
                    Err(e) => Err(failed(e.into())),
                },
            };
        }
    }

    /// The clock probes' stream: one message per node, file storage (a memory stream is gone
    /// after a server restart, and with it every clock measurement). The probes are
    /// disposable, so a stream whose storage cannot be updated in place (a memory stream made
    /// by an earlier version) is made again.
    async fn ensure_clock_stream(&self, js: &jetstream::Context) -> Result<(), ProvisionError> {
        let clock = stream::Config {
            name: self.clock_stream(),
            subjects: vec![self.subjects.clock_all()],
            max_messages_per_subject: 1,
            max_age: Duration::from_secs(3600),
            storage: stream::StorageType::File,
            allow_direct: true,
            ..Default::default()
        };
        let have = Self::existing(js, &clock.name).await?;
        if have.is_some_and(|c| c.storage != stream::StorageType::File) {
            if let Err(e) = js.delete_stream(self.clock_stream()).await {
                tracing::debug!(error = %e, "clock stream not deleted before being made again");
            }
        }
        self.ensure_stream(js, clock).await
    }
}

/// The stream behind bucket `bucket`: what `create_key_value` makes, except that reads go to
/// the stream's leader (`allow_direct` off). With direct gets, any replica answers a read, and
/// one that has just rejoined its cluster answers from behind: an instance created a moment
/// ago reads as missing, a claim as free. Every decision ax takes on a read (a compare-and-swap,
/// an "unknown instance", a free claim) needs the latest value, so no bucket allows them.
fn bucket_stream(bucket: &str, history: i64, max_age: Duration) -> stream::Config {
    stream::Config {
        name: format!("KV_{bucket}"),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: history,
        max_age,
        storage: stream::StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        discard: stream::DiscardPolicy::New,
        allow_direct: false,
        allow_batch_publish: true,
        // A removed record leaves a marker that expires (see `retention`).
        allow_message_ttl: true,
        ..Default::default()
    }
}

/// Whether the stream as it is (`have`) differs from `want` in what ax sets.
fn differs(want: &stream::Config, have: &stream::Config) -> bool {
    let per_subject = |n: i64| if n <= 0 { -1 } else { n };
    want.subjects != have.subjects
        || want.retention != have.retention
        || want.max_age != have.max_age
        || want.storage != have.storage
        || want.num_replicas != have.num_replicas
        || want.allow_direct != have.allow_direct
        || want.allow_message_schedules != have.allow_message_schedules
        || want.allow_batch_publish != have.allow_batch_publish
        || want.allow_message_ttl != have.allow_message_ttl
        || per_subject(want.max_messages_per_subject) != per_subject(have.max_messages_per_subject)
        || (!want.duplicate_window.is_zero() && want.duplicate_window != have.duplicate_window)
}

/// Whether a creation failed because the stream exists now (another node made it).
fn created_meanwhile(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(js) = e.downcast_ref::<jetstream::Error>() {
            return js.error_code() == jetstream::ErrorCode::STREAM_NAME_EXIST;
        }
        if let Some(jetstream::context::CreateStreamErrorKind::JetStream(js)) = e
            .downcast_ref::<jetstream::context::CreateStreamError>()
            .map(|e| e.kind())
        {
            return js.error_code() == jetstream::ErrorCode::STREAM_NAME_EXIST;
        }
        next = e.source();
    }
    false
}
