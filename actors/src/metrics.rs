//! This process's metrics, for Prometheus: the article's four kinds (latency, errors, backlog,
//! resources), served as Prometheus text by every node's `/metrics`.
//!
//! - [`Metrics`]: the families the actors record into, and [`Metrics::encode`] (the
//!   Prometheus text format, [`CONTENT_TYPE`]);
//! - [`metrics`]: this process's instance (a node is a process, as its actor counters are);
//! - the collectors read at each scrape: the process (`/proc/self`: CPU seconds, resident
//!   memory, open descriptors, start time) and the actors' restarts, panics, stalls and ended
//!   pumps (the counters `ax nodes` shows);
//!
//! Names and units follow Prometheus's conventions (`ax_` prefix, base units, `_seconds`,
//! `_total`). No label is unbounded: never an instance or trace id; outcomes, tags, actors and
//! queues are small closed sets. Recording is an atomic add, nothing on the hot path waits.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use crate::runtime::supervision;

/// The content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// An attempt's end, as counted.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Finished {
    /// The namespace of its job (`default` for a job that names none).
    pub namespace: String,
    /// `success` or `failure`.
    pub outcome: &'static str,
    /// The tag it ended with (`completed`, `exit_code`, `timeout`, ...).
    pub tag: &'static str,
}

/// The families the actors record into.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// From an instance's expected time to its hand-off by the Scheduler.
    pub fire_lateness: Histogram,
    /// How long attempts ran on this worker.
    pub execution_duration: Histogram,
    /// Attempts that ended on this worker, by outcome and tag.
    pub attempts_finished: Family<Finished, Counter>,
    /// Trigger latency ([`ax_bus::figures::trigger_latency`]): from when a first attempt
    /// became due to its start.
    pub trigger_latency: Histogram,
    /// From a dispatch's storing to its worker's acknowledgement.
    pub dispatch_to_ack: Histogram,
    /// Retries started by this node's Scheduler.
    pub retries: Counter,
    /// Dead letters this node stored, by kind.
    pub dead_letters: Family<Kind, Counter>,
    /// Timers pending in this node's Scheduler's wheel.
    pub wheel_timers: Gauge,
    /// Partitions of the cron jobs this node's Scheduler owns.
    pub partitions_owned: Gauge,
    /// Partition handovers of this node's Scheduler, by kind (`taken`, `released`, `lost`).
    pub partition_handovers: Family<Kind, Counter>,
    /// Instances this node's DagCoordinator holds for their dependencies.
    pub deps_waiting: Gauge,
    /// Datasets whose update for a business date is late (`freshness`), as the leading
    /// DagCoordinator last found them.
    pub datasets_late: Gauge,
    /// Outcomes this worker's outbox holds that are not reported yet.
    pub outbox_unreported: Gauge,
    /// This worker's slots now (its adaptive budget, or the fixed count).
    pub worker_slots: Gauge,
    /// Runnable tasks per core, as this worker's adaptive budget last read them.
    pub worker_load_per_core: Gauge<f64, AtomicU64>,
    /// This worker's budget decisions that changed its slots, by reason.
    pub worker_budget_changes: Family<ReasonLabel, Counter>,
    /// Workers with a recent heartbeat, as the janitor's Router sees them.
    pub workers_live: Gauge,
    /// This node's clock minus the NATS server's, as last measured.
    pub clock_offset: Gauge<f64, AtomicU64>,
    /// Work waiting per priority, as the backlog control last read it (on the janitor's node).
    pub backlog_waiting: Family<PriorityLabel, Gauge>,
    /// Workers consuming each priority, as the backlog control last read them.
    pub backlog_workers: Family<PriorityLabel, Gauge>,
    /// Bytes in the node's data directory (the worker's outbox and scratch), read when scraped.
    pub data_dir_bytes: Gauge,
    /// Messages waiting in each queue, not yet delivered (read from JetStream when scraped).
    pub queue_pending: Family<QueueLabel, Gauge>,
    /// Messages of each queue delivered and not yet acknowledged (read when scraped).
    pub queue_ack_pending: Family<QueueLabel, Gauge>,
    /// The day's endings by state, as `ax status` counts them (read when scraped).
    pub day_ended: Family<DayState, Gauge>,
    /// The day's average trigger latency, as `ax status` gives it (read when scraped).
    pub day_trigger_latency: Family<Day, Gauge<f64, AtomicU64>>,
    /// The day's longest attempt, as `ax status` gives it (read when scraped).
    pub day_longest_run: Family<Day, Gauge<f64, AtomicU64>>,
    /// CPU time of the attempts that ended on this worker, by job (from their cgroups).
    pub attempt_cpu: Family<JobLabel, Histogram, fn() -> Histogram>,
    /// Peak memory of the attempts that ended on this worker, by job (from their cgroups).
    pub attempt_peak_memory: Family<JobLabel, Histogram, fn() -> Histogram>,
    /// The node's machine, as its last heartbeat read it.
    machine: MachineGauges,
}

/// The node's machine: CPU busy, memory and the data directory's disk.
#[derive(Debug)]
struct MachineGauges {
    cpu_busy: Gauge<f64, AtomicU64>,
    memory_total: Gauge,
    memory_available: Gauge,
    disk_total: Gauge,
    disk_free: Gauge,
}

impl MachineGauges {
    fn register(r: &mut Registry) -> Self {
        let cpu_busy = Gauge::<f64, AtomicU64>::default();
        r.register(
            "node_cpu_busy_ratio",
            "The share of the machine's cores busy between the node's last two heartbeats",
            cpu_busy.clone(),
        );
        let bytes = |r: &mut Registry, name: &str, help: &str| {
            let gauge = Gauge::default();
            r.register_with_unit(name, help, Unit::Bytes, gauge.clone());
            gauge
        };
        Self {
            cpu_busy,
            memory_total: bytes(r, "node_memory_total", "The machine's memory (MemTotal)"),
            memory_available: bytes(
                r,
                "node_memory_available",
                "The machine's memory available to new work (MemAvailable)",
            ),
            disk_total: bytes(
                r,
                "node_disk_total",
                "The size of the file system of the node's data directory",
            ),
            disk_free: bytes(
                r,
                "node_disk_free",
                "What is free for the node on the file system of its data directory",
            ),
        }
    }
}

/// A job, as a label: `job_name`, since Prometheus gives every scraped series a `job` of its
/// own (the scrape job's) and would rename ours.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabel {
    /// Its name.
    pub job_name: String,
}

/// A day of the summary, as labels: its date and the time zone the date is in.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Day {
    /// `YYYY-MM-DD`.
    pub date: String,
    /// The summary's time zone.
    pub timezone: String,
}

/// A day and a final state, as labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DayState {
    /// `YYYY-MM-DD`.
    pub date: String,
    /// The summary's time zone.
    pub timezone: String,
    /// `success`, `failed` or `cancelled`.
    pub state: &'static str,
}

/// Why the adaptive budget changed, as a label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// `load_high`, `memory_low` or `room`.
    pub reason: &'static str,
}

/// A queue, as a label (`ready_high`, `ready_normal`, `ready_low`, `delayed`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    /// The queue.
    pub queue: String,
}

/// A priority, as a label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PriorityLabel {
    /// `high`, `normal` or `low`.
    pub priority: &'static str,
}

/// A kind, as a label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Kind {
    /// The kind (`exhausted`, `max_deliveries`, `undecodable`; `taken`, `released`, `lost`).
    pub kind: String,
}

impl Metrics {
    fn new() -> Self {
        let mut root = Registry::default();
        // The process's resources under the names every exporter gives them (`process_*`).
        root.register_collector(Box::new(ProcessCollector));
        let registry = root.sub_registry_with_prefix("ax");
        registry.register(
            "build",
            "ax's version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let Attempts {
            fire_lateness,
            execution_duration,
            attempts_finished,
            trigger_latency,
            dispatch_to_ack,
            retries,
            dead_letters,
        } = Attempts::register(registry);
        let Actors {
            wheel_timers,
            partitions_owned,
            partition_handovers,
            deps_waiting,
            datasets_late,
            outbox_unreported,
        } = Actors::register(registry);
        let Workers {
            worker_slots,
            worker_load_per_core,
            worker_budget_changes,
            workers_live,
            clock_offset,
            backlog_waiting,
            backlog_workers,
            data_dir_bytes,
        } = Workers::register(registry);
        let Reads {
            queue_pending,
            queue_ack_pending,
            day_ended,
            day_trigger_latency,
            day_longest_run,
        } = Reads::register(registry);
        let Used {
            attempt_cpu,
            attempt_peak_memory,
        } = Used::register(registry);
        let machine = MachineGauges::register(registry);
        registry.register_collector(Box::new(ActorCollector));
        Self {
            registry: root,
            fire_lateness,
            execution_duration,
            attempts_finished,
            trigger_latency,
            dispatch_to_ack,
            retries,
            dead_letters,
            wheel_timers,
            partitions_owned,
            partition_handovers,
            deps_waiting,
            datasets_late,
            outbox_unreported,
            worker_slots,
            worker_load_per_core,
            worker_budget_changes,
            workers_live,
            clock_offset,
            backlog_waiting,
            backlog_workers,
            data_dir_bytes,
            queue_pending,
            queue_ack_pending,
            day_ended,
            day_trigger_latency,
            day_longest_run,
            attempt_cpu,
            attempt_peak_memory,
            machine,
        }
    }

    /// Everything, in the Prometheus text format (0.0.4: what every scraper reads, and what
    /// `promtool check metrics` checks).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)?;
        Ok(text)
    }

    /// Sets the queues' depths, as just read from JetStream.
    pub fn set_queue_depths(&self, depths: &[ax_bus::client::status::QueueDepth]) {
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        for depth in depths {
            let label = QueueLabel {
                queue: depth.queue.clone(),
            };
            self.queue_pending
                .get_or_create(&label)
                .set(gauge(depth.pending));
            self.queue_ack_pending
                .get_or_create(&label)
                .set(gauge(depth.ack_pending));
        }
    }

    /// Sets the day's figures from its summary, just read (the families hold that day only).
    pub fn set_day(&self, summary: &ax_bus::figures::DaySummary) {
        let day = Day {
            date: summary.date.clone(),
            timezone: summary.timezone.clone(),
        };
        self.day_ended.clear();
        for (state, n) in [
            ("success", summary.succeeded),
            ("failed", summary.failed),
            ("cancelled", summary.cancelled),
        ] {
            let label = DayState {
                date: day.date.clone(),
                timezone: day.timezone.clone(),
                state,
            };
            self.day_ended
                .get_or_create(&label)
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.day_trigger_latency.clear();
        if let Some(ms) = summary.average_latency_ms() {
            self.day_trigger_latency
                .get_or_create(&day)
                .set(ms / 1000.0);
        }
        self.day_longest_run.clear();
        if let Some(longest) = &summary.longest {
            self.day_longest_run
                .get_or_create(&day)
                .set(longest.duration_ms as f64 / 1000.0);
        }
    }

    /// Sets the node's machine figures from its heartbeat's reading.
    pub fn set_machine(&self, machine: &ax_bus::messages::Machine) {
        let gauges = &self.machine;
        if let Some(busy) = machine.cpu_busy {
            gauges.cpu_busy.set(busy);
        }
        let set = |gauge: &Gauge, bytes: u64| gauge.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        set(&gauges.memory_total, machine.memory_total_bytes);
        set(&gauges.memory_available, machine.memory_available_bytes);
        set(&gauges.disk_total, machine.disk_total_bytes);
        set(&gauges.disk_free, machine.disk_free_bytes);
    }

    /// Observes what an attempt of `job` used, as far as its worker counted it.
    pub fn attempt_used(&self, job: &str, usage: ax_bus::Usage) {
        let label = JobLabel {
            job_name: job.into(),
        };
        if let Some(ms) = usage.cpu_ms {
            self.attempt_cpu
                .get_or_create(&label)
                .observe(ms as f64 / 1000.0);
        }
        if let Some(bytes) = usage.peak_memory_bytes {
            self.attempt_peak_memory
                .get_or_create(&label)
                .observe(bytes as f64);
        }
    }

    /// Counts an attempt of a job of `namespace` that ended after `seconds` of running.
    pub fn attempt_finished(
        &self,
        namespace: &str,
        (success, tag): (bool, ax_bus::Tag),
        seconds: Option<f64>,
    ) {
        let outcome = if success { "success" } else { "failure" };
        self.attempts_finished
            .get_or_create(&Finished {
                namespace: namespace.to_string(),
                outcome,
                tag: tag.as_str(),
            })
            .inc();
        if let Some(seconds) = seconds {
            self.execution_duration.observe(seconds.max(0.0));
        }
    }
}

/// A gauge registered as `name` with `help`.
fn registered_gauge(registry: &mut Registry, name: &str, help: &str) -> Gauge {
    let gauge = Gauge::default();
    registry.register(name, help, gauge.clone());
    gauge
}
/// The families of what becomes of attempts: their lateness, run time, ends, latency, acknowledgements, retries and dead letters.
struct Attempts {
    fire_lateness: Histogram,
    execution_duration: Histogram,
    attempts_finished: Family<Finished, Counter>,
    trigger_latency: Histogram,
    dispatch_to_ack: Histogram,
    retries: Counter,
    dead_letters: Family<Kind, Counter>,
}

impl Attempts {
    fn register(r: &mut Registry) -> Self {
        let fire_lateness = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        r.register_with_unit(
            "fire_lateness",
            "From an instance's expected time to its hand-off by the Scheduler",
            Unit::Seconds,
            fire_lateness.clone(),
        );
        let execution_duration = Histogram::new(exponential_buckets(0.01, 4.0, 12));
        r.register_with_unit(
            "execution_duration",
            "How long attempts ran on this worker, from start to end",
            Unit::Seconds,
            execution_duration.clone(),
        );
        let attempts_finished = Family::<Finished, Counter>::default();
        r.register(
            "attempts_finished",
            "Attempts that ended on this worker, by outcome and tag",
            attempts_finished.clone(),
        );
        let trigger_latency = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        r.register_with_unit(
            "trigger_latency",
            "From when a first attempt became due (its instant, its acceptance, or its release by dependencies or data) to its start on this worker; backfills left out",
            Unit::Seconds,
            trigger_latency.clone(),
        );
        let dispatch_to_ack = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        r.register_with_unit(
            "dispatch_to_ack",
            "From a dispatch's storing to its worker's acknowledgement",
            Unit::Seconds,
            dispatch_to_ack.clone(),
        );
        let retries = Counter::default();
        r.register(
            "retries",
            "Retries started by this node's Scheduler",
            retries.clone(),
        );
        let dead_letters = Family::<Kind, Counter>::default();
        r.register(
            "dead_letters",
            "Dead letters this node stored, by kind",
            dead_letters.clone(),
        );
        Self {
            fire_lateness,
            execution_duration,
            attempts_finished,
            trigger_latency,
            dispatch_to_ack,
            retries,
            dead_letters,
        }
    }
}

/// The families of what attempts used, per job: their CPU time and peak memory.
struct Used {
    attempt_cpu: Family<JobLabel, Histogram, fn() -> Histogram>,
    attempt_peak_memory: Family<JobLabel, Histogram, fn() -> Histogram>,
}

impl Used {
    fn register(r: &mut Registry) -> Self {
        // 10 ms to about 11 hours of CPU; 1 MiB to 1 TiB of memory.
        let cpu: Family<JobLabel, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.01, 4.0, 12)));
        r.register_with_unit(
            "attempt_cpu",
            "CPU time, user and system, of the attempts that ended on this worker, by job (from their cgroups)",
            Unit::Seconds,
            cpu.clone(),
        );
        let memory: Family<JobLabel, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1024.0 * 1024.0, 4.0, 11))
            });
        r.register_with_unit(
            "attempt_peak_memory",
            "The most memory the processes of the attempts that ended on this worker held at once, by job (from their cgroups)",
            Unit::Bytes,
            memory.clone(),
        );
        Self {
            attempt_cpu: cpu,
            attempt_peak_memory: memory,
        }
    }
}

/// The families of what the Scheduler, the DagCoordinator and the Reporter hold.
struct Actors {
    wheel_timers: Gauge,
    partitions_owned: Gauge,
    partition_handovers: Family<Kind, Counter>,
    deps_waiting: Gauge,
    datasets_late: Gauge,
    outbox_unreported: Gauge,
}

impl Actors {
    fn register(r: &mut Registry) -> Self {
        let wheel_timers = registered_gauge(
            r,
            "wheel_timers",
            "Timers pending in this node's Scheduler's wheel",
        );
        let partitions_owned = registered_gauge(
            r,
            "partitions_owned",
            "Partitions of the cron jobs this node's Scheduler owns",
        );
        let partition_handovers = Family::<Kind, Counter>::default();
        r.register(
            "partition_handovers",
            "Partition handovers of this node's Scheduler, by kind (taken, released, lost)",
            partition_handovers.clone(),
        );
        let deps_waiting = registered_gauge(
            r,
            "deps_waiting",
            "Instances this node's DagCoordinator holds for their dependencies",
        );
        let datasets_late = registered_gauge(
            r,
            "datasets_late",
            "Datasets whose update for a business date is late (freshness), on the leading DagCoordinator",
        );
        let outbox_unreported = registered_gauge(
            r,
            "outbox_unreported",
            "Outcomes this worker's outbox holds that are not reported yet",
        );
        Self {
            wheel_timers,
            partitions_owned,
            partition_handovers,
            deps_waiting,
            datasets_late,
            outbox_unreported,
        }
    }
}

/// The families of the workers' slots and budget, the fleet, the clock, the backlog and the node's disk.
struct Workers {
    worker_slots: Gauge,
    worker_load_per_core: Gauge<f64, AtomicU64>,
    worker_budget_changes: Family<ReasonLabel, Counter>,
    workers_live: Gauge,
    clock_offset: Gauge<f64, AtomicU64>,
    backlog_waiting: Family<PriorityLabel, Gauge>,
    backlog_workers: Family<PriorityLabel, Gauge>,
    data_dir_bytes: Gauge,
}

impl Workers {
    fn register(r: &mut Registry) -> Self {
        let worker_slots = registered_gauge(
            r,
            "worker_slots",
            "This worker's slots now: its adaptive budget, or the fixed count",
        );
        let worker_load_per_core = Gauge::<f64, AtomicU64>::default();
        r.register(
            "worker_load_per_core",
            "Runnable tasks per core, as this worker's adaptive budget last read them",
            worker_load_per_core.clone(),
        );
        let worker_budget_changes = Family::<ReasonLabel, Counter>::default();
        r.register(
            "worker_budget_changes",
            "Decisions of this worker's adaptive budget that changed its slots, by reason",
            worker_budget_changes.clone(),
        );
        let workers_live = registered_gauge(
            r,
            "workers_live",
            "Workers with a recent heartbeat, as the janitor's Router sees them",
        );
        let clock_offset = Gauge::<f64, AtomicU64>::default();
        r.register_with_unit(
            "clock_offset",
            "This node's clock minus the NATS server's, as last measured",
            Unit::Seconds,
            clock_offset.clone(),
        );
        let backlog_waiting = Family::<PriorityLabel, Gauge>::default();
        r.register(
            "backlog_waiting",
            "Work waiting per priority (ready queue and workers' queues), as the backlog control read it",
            backlog_waiting.clone(),
        );
        let backlog_workers = Family::<PriorityLabel, Gauge>::default();
        r.register(
            "backlog_workers",
            "Workers consuming each priority, as the backlog control read them",
            backlog_workers.clone(),
        );
        let data_dir_bytes = Gauge::default();
        r.register_with_unit(
            "data_dir",
            "Bytes in the node's data directory, read when scraped",
            Unit::Bytes,
            data_dir_bytes.clone(),
        );
        Self {
            worker_slots,
            worker_load_per_core,
            worker_budget_changes,
            workers_live,
            clock_offset,
            backlog_waiting,
            backlog_workers,
            data_dir_bytes,
        }
    }
}

/// The families of what is read when scraped: the queues' depths and the day's figures.
struct Reads {
    queue_pending: Family<QueueLabel, Gauge>,
    queue_ack_pending: Family<QueueLabel, Gauge>,
    day_ended: Family<DayState, Gauge>,
    day_trigger_latency: Family<Day, Gauge<f64, AtomicU64>>,
    day_longest_run: Family<Day, Gauge<f64, AtomicU64>>,
}

impl Reads {
    fn register(r: &mut Registry) -> Self {
        let queue_pending = Family::<QueueLabel, Gauge>::default();
        r.register(
            "queue_pending",
            "Messages waiting in a queue, not yet delivered to a consumer",
            queue_pending.clone(),
        );
        let queue_ack_pending = Family::<QueueLabel, Gauge>::default();
        r.register(
            "queue_ack_pending",
            "Messages of a queue delivered and not yet acknowledged",
            queue_ack_pending.clone(),
        );
        let day_ended = Family::<DayState, Gauge>::default();
        r.register(
            "day_ended",
            "Instances' endings on the latest summarized day by final state, as ax status counts them (a re-run that ends counts again)",
            day_ended.clone(),
        );
        let day_trigger_latency = Family::<Day, Gauge<f64, AtomicU64>>::default();
        r.register_with_unit(
            "day_trigger_latency_average",
            "Average trigger latency of the first attempts that ended on the latest summarized day, as ax status gives it",
            Unit::Seconds,
            day_trigger_latency.clone(),
        );
        let day_longest_run = Family::<Day, Gauge<f64, AtomicU64>>::default();
        r.register_with_unit(
            "day_longest_run",
            "The longest attempt that ended on the latest summarized day, as ax status gives it",
            Unit::Seconds,
            day_longest_run.clone(),
        );
        Self {
            queue_pending,
            queue_ack_pending,
            day_ended,
            day_trigger_latency,
            day_longest_run,
        }
    }
}

/// Counts a fire expected at `expected` as handed on now (its lateness).
pub(crate) fn fire_handed_on(expected: chrono::DateTime<chrono::Utc>) {
    if let Some(metrics) = recording() {
        let late = (chrono::Utc::now() - expected)
            .num_microseconds()
            .unwrap_or(0) as f64
            / 1e6;
        metrics.fire_lateness.observe(late.max(0.0));
    }
}

/// Records the slots a worker offers (at its start).
pub(crate) fn slots_offered(slots: u32) {
    if let Some(metrics) = recording() {
        metrics.worker_slots.set(i64::from(slots));
    }
}

/// Records an adaptive budget's decision: `slots` now, after a change or not.
pub(crate) fn budget_decided(slots: u32, state: &ax_bus::messages::SlotBudget, changed: bool) {
    if let Some(metrics) = recording() {
        metrics.worker_slots.set(i64::from(slots));
        metrics.worker_load_per_core.set(state.load_per_core);
        if changed {
            metrics
                .worker_budget_changes
                .get_or_create(&ReasonLabel {
                    reason: state.reason.as_str(),
                })
                .inc();
        }
    }
}

/// This process's metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

/// Whether the actors record (on unless [`set_recording`] said otherwise).
static RECORDING: AtomicBool = AtomicBool::new(true);

/// The metrics to record into, unless recording is off.
pub fn recording() -> Option<&'static Metrics> {
    RECORDING.load(Ordering::Relaxed).then(metrics)
}

/// Turns recording on or off for the whole process: how `ax bench` measures what metrics cost
/// the hot path (with them and without them in the same run).
pub fn set_recording(on: bool) {
    RECORDING.store(on, Ordering::Relaxed);
}

/// A family a collector writes: its name, its help, and its value in what is read.
type Described<T> = (&'static str, &'static str, fn(&T) -> u64);

/// The actors' restarts, panics, stalls and ended pumps since the process started.
#[derive(Debug)]
struct ActorCollector;

impl Collector for ActorCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let counters = supervision::counters();
        let families: [Described<ax_bus::messages::ActorHealth>; 4] = [
            (
                "actor_restarts",
                "Restarts of an actor by its supervisor",
                |h| h.restarts,
            ),
            (
                "actor_panics",
                "Panics caught at an actor's boundaries",
                |h| h.panics,
            ),
            (
                "actor_stalls",
                "Times an actor or one of its pumps stalled past the watchdog's limit",
                |h| h.stalls,
            ),
            (
                "actor_pump_exits",
                "Pumps of an actor that ended and stopped it for a restart",
                |h| h.pump_exits,
            ),
        ];
        for (name, help, value) in families {
            let counter = ConstCounter::new(0u64);
            let mut family = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            for (actor, health) in &counters {
                let labels = [("actor", actor.as_str())];
                ConstCounter::new(value(health)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The process's resources, read from `/proc/self` at each scrape (Linux).
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(process) = read_process() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(process.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu",
            "CPU time the process used, user and system",
            Some(&Unit::Seconds),
            cpu.metric_type(),
        )?)?;
        let gauges: [(&str, &str, Option<Unit>, f64); 3] = [
            (
                "process_resident_memory",
                "Resident memory of the process",
                Some(Unit::Bytes),
                process.resident_bytes,
            ),
            (
                "process_open_fds",
                "Open file descriptors of the process",
                None,
                process.open_fds,
            ),
            (
                "process_start_time",
                "When the process started, since the Unix epoch",
                Some(Unit::Seconds),
                process.start_time_seconds,
            ),
        ];
        for (name, help, unit, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(
                name,
                help,
                unit.as_ref(),
                gauge.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

/// What `/proc/self` says of this process.
#[derive(Debug, PartialEq)]
struct Process {
    cpu_seconds: f64,
    resident_bytes: f64,
    open_fds: f64,
    start_time_seconds: f64,
}

fn read_process() -> Option<Process> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()? as f64;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()? as f64;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
    parse_process(&stat, &uptime, &statm, ticks, page, open_fds, now_seconds())
}

fn now_seconds() -> f64 {
    ax_bus::time::to_millis(ax_bus::time::now()) as f64 / 1000.0
}

/// The figures of `/proc/self/stat` (utime, stime and starttime in clock ticks, fields 14, 15
/// and 22 — counted after the command name, which may hold spaces), `/proc/uptime` and
/// `/proc/self/statm` (resident pages, field 2).
fn parse_process(
    stat: &str,
    uptime: &str,
    statm: &str,
    ticks: f64,
    page: f64,
    open_fds: f64,
    now: f64,
) -> Option<Process> {
    let after_name = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Field 3 (state) is the first after the name.
    let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
    let cpu_seconds = (field(14)? + field(15)?) / ticks;
    let started_after_boot = field(22)? / ticks;
    let up = uptime.split_whitespace().next()?.parse::<f64>().ok()?;
    let resident_pages = statm.split_whitespace().nth(1)?.parse::<f64>().ok()?;
    Some(Process {
        cpu_seconds,
        resident_bytes: resident_pages * page,
        open_fds,
        start_time_seconds: now - up + started_after_boot,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_figures_are_read_past_a_command_name_with_spaces() {
        let stat = "4242 (ax (node) x) S 1 4242 4242 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 \
                    8 0 1000 123456 300 0 0";
        let process = parse_process(
            stat,
            "5000.00 9000.00",
            "30000 300 100 1 0 0 0",
            100.0,
            4096.0,
            12.0,
            1_000_000.0,
        )
        .unwrap();
        assert_eq!(
            process,
            Process {
                cpu_seconds: 3.0,
                resident_bytes: 300.0 * 4096.0,
                open_fds: 12.0,
                start_time_seconds: 1_000_000.0 - 5000.0 + 10.0,
            }
        );
    }

    #[test]
    fn the_text_names_every_family_with_its_unit_and_no_id_labels() {
        let m = metrics();
        m.attempt_finished("default", (true, ax_bus::Tag::Completed), Some(0.5));
        m.attempt_finished("payments", (false, ax_bus::Tag::Timeout), Some(2.0));
        m.fire_lateness.observe(0.003);
        m.attempt_used(
            "etl_daily",
            ax_bus::Usage {
                cpu_ms: Some(1500),
                peak_memory_bytes: Some(3 << 20),
            },
        );
        m.set_machine(&ax_bus::messages::Machine {
            cpu_busy: Some(0.5),
            memory_total_bytes: 8 << 30,
            memory_available_bytes: 2 << 30,
            disk_total_bytes: 100 << 30,
            disk_free_bytes: 5 << 30,
        });
        m.set_queue_depths(&[ax_bus::client::status::QueueDepth {
            queue: "ready_low".into(),
            pending: 150,
            ack_pending: 2,
        }]);
        let text = m.encode().unwrap();
        for needle in [
            "ax_build_info{version=",
            "ax_fire_lateness_seconds_bucket{le=",
            "ax_execution_duration_seconds_count",
            "ax_attempts_finished_total{namespace=\"payments\",outcome=\"failure\",tag=\"timeout\"}",
            "ax_queue_pending{queue=\"ready_low\"} 150",
            "ax_queue_ack_pending{queue=\"ready_low\"} 2",
            "ax_attempt_cpu_seconds_sum{job_name=\"etl_daily\"} 1.5",
            "ax_attempt_cpu_seconds_bucket{job_name=\"etl_daily\",le=\"2.56\"} 1",
            "ax_attempt_peak_memory_bytes_bucket{job_name=\"etl_daily\",le=\"4.194304e+06\"} 1",
            "ax_node_cpu_busy_ratio 0.5",
            "ax_node_disk_free_bytes 5368709120",
            "ax_node_disk_total_bytes 107374182400",
            "ax_node_memory_available_bytes 2147483648",
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
        ] {
            assert!(text.contains(needle), "{needle} not in:\n{text}");
        }
    }
}
