//! The fleet's state: queues, workers and their slots, nodes and their actors' health.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{DispatchId, InstanceId, NodeId, TraceId, WorkerId};

/// Whether a priority's queue is consumed (bucket `ax_queues`, key = priority).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    /// Paused queues keep their messages; nothing is dispatched from them.
    pub paused: bool,
    /// Who paused it: empty for an operator (`ax queue pause`), `backlog control` when the
    /// Routers' backlog control did, which alone resumes it by itself.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub by: String,
}

impl QueueState {
    /// Who pauses a queue when the backlog control does.
    pub const BY_BACKLOG: &'static str = "backlog control";
}

/// A namespace's share of the shared workers (bucket `ax_queues`, key `namespace.<ns>`): it
/// sits beside the priority queues' states because both say how the Routers hand out slots,
/// and every Router already follows that bucket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceSettings {
    /// Its weight in the fair share of free slots among namespaces with work waiting (1 to
    /// 1000; a namespace without settings weighs 1).
    #[serde(default = "one")]
    pub weight: u32,
    /// The most jobs it may hold (`ax job apply` refuses a new one beyond it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_jobs: Option<u32>,
    /// The most attempts it may have dispatched and running at once; the rest wait, unlost,
    /// until one ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running: Option<u32>,
    /// The most of its instances waiting to run (in its ready queues): a trigger beyond it is
    /// refused with the reason, until some have run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_waiting: Option<u32>,
}

fn one() -> u32 {
    1
}

impl Default for NamespaceSettings {
    fn default() -> Self {
        Self {
            weight: 1,
            max_jobs: None,
            max_running: None,
            max_waiting: None,
        }
    }
}

impl NamespaceSettings {
    /// The heaviest weight.
    pub const MOST_WEIGHT: u32 = 1000;
    /// The key prefix of namespace settings in the queues bucket.
    pub const KEY_PREFIX: &'static str = "namespace.";

    /// The key of `namespace`'s settings.
    pub fn key(namespace: &crate::ids::Namespace) -> String {
        format!("{}{namespace}", Self::KEY_PREFIX)
    }

    /// The namespace a key of the queues bucket holds settings of, if it is one.
    pub fn namespace_of(key: &str) -> Option<crate::ids::Namespace> {
        crate::ids::Namespace::parse(key.strip_prefix(Self::KEY_PREFIX)?).ok()
    }

    /// Why these settings cannot be stored, if they cannot.
    pub fn invalid(&self) -> Option<String> {
        if !(1..=Self::MOST_WEIGHT).contains(&self.weight) {
            return Some(format!(
                "weight {} is out of range: a weight is 1 to {}",
                self.weight,
                Self::MOST_WEIGHT
            ));
        }
        if self.max_running == Some(0) {
            return Some("max_running 0 would never run anything: at least 1".into());
        }
        if self.max_waiting == Some(0) {
            return Some("max_waiting 0 would refuse every trigger: at least 1".into());
        }
        None
    }
}

/// A worker's heartbeat, the value under its id in the workers bucket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// Worker id (`--id`).
    pub id: WorkerId,
    /// Host name.
    pub host: String,
    /// CPU cores.
    pub cores: u32,
    /// Concurrent attempts it runs.
    pub slots: u32,
    /// Its tags.
    pub tags: Vec<String>,
    /// Executor types it offers.
    pub executors: Vec<String>,
    /// What each of its executors says of itself (`describe`).
    #[serde(default)]
    pub described: Vec<ExecutorInfo>,
    /// Attempts running now.
    pub running: u32,
    /// Average duration of the attempts that ended in the last five minutes.
    #[serde(default)]
    pub avg_duration_ms: f64,
    /// Slots kept for higher priorities.
    #[serde(default)]
    pub reserved: Reserved,
    /// How its adaptive budget stands (absent: `slots` is fixed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<SlotBudget>,
    /// The attempts running now (for the Router, should the worker die).
    #[serde(default)]
    pub attempts: Vec<RunningAttempt>,
    /// How it keeps its attempts apart, and its room for attempts asking for `resources`
    /// (absent from workers of versions before it: they limit nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<crate::room::Isolation>,
    /// ax version.
    pub version: String,
    /// When it started.
    #[serde(with = "crate::time::wire")]
    pub started_at: DateTime<Utc>,
}

/// A node's heartbeat, the value under its name in the nodes bucket (shown by `ax nodes`): what
/// it runs and how its actors have fared since the process started.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Node name (`--id`).
    pub node: NodeId,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// The roles it runs.
    pub roles: Vec<String>,
    /// ax version.
    pub version: String,
    /// When the process started.
    #[serde(with = "crate::time::wire")]
    pub started_at: DateTime<Utc>,
    /// When this heartbeat was written.
    #[serde(with = "crate::time::wire")]
    pub seen_at: DateTime<Utc>,
    /// Per actor: panics, restarts, ended pumps and stalls.
    pub actors: BTreeMap<String, ActorHealth>,
    /// What its Scheduler fires (nodes without one: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<SchedulerShare>,
    /// How its Router scores workers and judges them alive (nodes without one: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<crate::routing::RoutingPolicy>,
    /// Its machine's CPU, memory and data directory's disk (absent where `/proc` or the disk
    /// could not be read, and from versions before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
}

/// A node's machine as its heartbeat reads it: the article's fourth class of figures (each
/// node's CPU, memory and disk).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// The share of all its cores busy since the heartbeat before (0 to 1; absent in a
    /// process's first heartbeat).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_busy: Option<f64>,
    /// Its memory (`MemTotal`, bytes).
    pub memory_total_bytes: u64,
    /// Its memory available to new work (`MemAvailable`, bytes).
    pub memory_available_bytes: u64,
    /// The size of the file system of the node's data directory (bytes).
    pub disk_total_bytes: u64,
    /// What is free on it for the node (bytes).
    pub disk_free_bytes: u64,
}

impl Machine {
    /// The share of the data directory's disk in use (0 to 1; 0 for a disk of no size).
    pub fn disk_used(&self) -> f64 {
        if self.disk_total_bytes == 0 {
            return 0.0;
        }
        1.0 - self.disk_free_bytes as f64 / self.disk_total_bytes as f64
    }

    /// The share of the memory in use (0 to 1).
    pub fn memory_used(&self) -> f64 {
        if self.memory_total_bytes == 0 {
            return 0.0;
        }
        1.0 - self.memory_available_bytes as f64 / self.memory_total_bytes as f64
    }
}

impl std::fmt::Display for Machine {
    /// `cpu 23%, memory 61% of 23.4Gi, disk 45% of 98.3Gi` (`cpu -` before a second reading).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let percent = |share: f64| format!("{:.0}%", share * 100.0);
        write!(
            f,
            "cpu {}, memory {} of {}, disk {} of {}",
            self.cpu_busy.map_or_else(|| "-".into(), percent),
            percent(self.memory_used()),
            crate::room::about(self.memory_total_bytes),
            percent(self.disk_used()),
            crate::room::about(self.disk_total_bytes)
        )
    }
}

/// A Scheduler's share of the cron jobs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedulerShare {
    /// The partitions it owns.
    pub partitions: Vec<crate::partition::PartitionId>,
    /// The jobs of those partitions in its wheel.
    pub jobs: usize,
}

impl NodeStatus {
    /// One line per actor that restarted, panicked or stalled since the node started (what
    /// `ax nodes` and the console's nodes page show); none when all went well.
    pub fn troubles(&self) -> Vec<String> {
        self.actors
            .iter()
            .filter(|(_, h)| h.panics + h.restarts + h.stalls > 0)
            .map(|(actor, h)| {
                format!(
                    "{actor}: {} restarts, {} panics, {} stalls",
                    h.restarts, h.panics, h.stalls
                )
            })
            .collect()
    }
}

/// What befell one actor of a node since its process started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActorHealth {
    /// Panics caught at its boundaries.
    pub panics: u64,
    /// Restarts by its supervisor.
    pub restarts: u64,
    /// Pumps that ended (NATS away, a subscription closed) and stopped it for a restart.
    pub pump_exits: u64,
    /// Times it left the watchdog's ping unanswered past the stall limit.
    pub stalls: u64,
}

/// An executor as it describes itself (shown by `ax executors`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutorInfo {
    /// The `exec.type` that selects it.
    pub name: String,
    /// `builtin` or `plugin`.
    pub kind: String,
    /// Its version.
    pub version: String,
    /// What it does, in a line.
    pub description: String,
}

/// Where a worker's adaptive budget stands: its bounds, the pressure it last read and why its
/// slots are what they are (`slots` in [`WorkerInfo`] is the budget now).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SlotBudget {
    /// The smallest budget.
    pub min: u32,
    /// The largest budget.
    pub max: u32,
    /// The last decision's reason.
    pub reason: BudgetReason,
    /// Runnable tasks per core on the machine, averaged over the last decision's samples.
    pub load_per_core: f64,
    /// The machine's available memory (`MemAvailable`), the lowest of those samples.
    pub memory_available_bytes: u64,
    /// Dispatches waiting for a slot when it decided.
    pub waiting: u32,
}

/// Why a worker's budget is what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetReason {
    /// No decision yet: the configured `slots`, within the bounds.
    Start,
    /// Shrunk (or kept at its minimum): available memory under `memory_min`.
    MemoryLow,
    /// Shrunk (or kept at its minimum): more runnable tasks per core than `load_high`.
    LoadHigh,
    /// Grown (or kept at its maximum): work waited while the load was under `load_low`.
    Room,
    /// Kept: the load between `load_low` and `load_high`, or nothing waiting.
    Steady,
}

impl BudgetReason {
    /// Its name (`load_high`), as in JSON and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::MemoryLow => "memory_low",
            Self::LoadHigh => "load_high",
            Self::Room => "room",
            Self::Steady => "steady",
        }
    }
}

/// Slots a worker keeps for higher priorities: `low` work may use at most
/// `slots - high - normal` of them, `normal` work at most `slots - high`, `high` work all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reserved {
    /// Kept for high-priority work.
    #[serde(default)]
    pub high: u32,
    /// Kept for normal- and high-priority work.
    #[serde(default)]
    pub normal: u32,
}

/// An attempt a worker runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningAttempt {
    /// The instance.
    pub instance_id: InstanceId,
    /// The attempt.
    pub trace_id: TraceId,
    /// The dispatch it came with.
    pub dispatch: DispatchId,
    /// Its job's `lease` in seconds: no Router hands it to another worker before this worker
    /// has been silent that long (absent: the worker TTL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_secs: Option<u64>,
}

#[cfg(test)]
mod node_status_tests {
    use super::*;

    #[test]
    fn a_node_names_only_the_actors_that_had_trouble() {
        let at = crate::time::now();
        let mut node = NodeStatus {
            node: "n1".parse().unwrap(),
            host: "h".into(),
            pid: 1,
            roles: vec!["scheduler".into()],
            version: "0".into(),
            started_at: at,
            seen_at: at,
            actors: BTreeMap::from([
                ("scheduler".to_string(), ActorHealth::default()),
                (
                    "router".to_string(),
                    ActorHealth {
                        restarts: 2,
                        panics: 1,
                        ..ActorHealth::default()
                    },
                ),
            ]),
            scheduler: None,
            router: None,
            machine: None,
        };
        assert_eq!(node.troubles(), ["router: 2 restarts, 1 panics, 0 stalls"]);
        node.actors.clear();
        assert!(node.troubles().is_empty());
    }

    #[test]
    fn a_machine_says_the_share_of_its_disk_and_memory_in_use() {
        let machine = Machine {
            cpu_busy: Some(0.25),
            memory_total_bytes: 8 << 30,
            memory_available_bytes: 2 << 30,
            disk_total_bytes: 100,
            disk_free_bytes: 5,
        };
        assert!((machine.disk_used() - 0.95).abs() < 1e-9);
        assert!((machine.memory_used() - 0.75).abs() < 1e-9);
        assert_eq!(Machine::default().disk_used(), 0.0);
        assert_eq!(
            machine.to_string(),
            "cpu 25%, memory 75% of 8Gi, disk 95% of 100"
        );
    }
}
