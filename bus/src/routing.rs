//! The Routers' policy: how a worker is scored and when a silent worker counts as dead.
//!
//! One value, because three places need the same answer: the Router chooses by it, and the
//! console and `ax worker list` show each worker's score and liveness. A Router's node
//! heartbeat carries the policy it was configured with ([`crate::messages::NodeStatus`]), so
//! those views compute with the weights and the TTL the Routers really use, not defaults of
//! their own.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::messages::WorkerInfo;

/// Score weights: a worker's score is `(running / usable cores) * running + (avg_duration_ms /
/// 1000) * duration`, the usable cores being its cores or its slots if fewer (a worker whose
/// adaptive budget shrank to one slot is full with one attempt, whatever its cores); the
/// lowest wins.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Weights {
    /// Weight of running attempts per core.
    pub running: f64,
    /// Weight of the average duration in seconds.
    pub duration: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            running: 0.7,
            duration: 0.3,
        }
    }
}

/// The default time without a heartbeat after which a worker is dead.
pub const DEFAULT_WORKER_TTL: Duration = Duration::from_secs(10);

/// How the Routers score workers and judge them alive.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoutingPolicy {
    /// The score's weights.
    pub weights: Weights,
    /// Milliseconds without a heartbeat after which a worker is dead.
    pub worker_ttl_ms: u64,
}

impl Default for RoutingPolicy {
    fn default() -> Self {
        Self {
            weights: Weights::default(),
            worker_ttl_ms: DEFAULT_WORKER_TTL.as_millis() as u64,
        }
    }
}

impl RoutingPolicy {
    /// The policy with `weights` and `worker_ttl`.
    pub fn new(weights: Weights, worker_ttl: Duration) -> Self {
        Self {
            weights,
            worker_ttl_ms: u64::try_from(worker_ttl.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// Time without a heartbeat after which a worker is dead.
    pub fn worker_ttl(&self) -> Duration {
        Duration::from_millis(self.worker_ttl_ms)
    }

    /// Whether a worker whose last heartbeat is `age` old is alive.
    pub fn alive(&self, age: Duration) -> bool {
        age < self.worker_ttl()
    }

    /// A worker's score with `extra` running attempts counted (finite and non-negative for
    /// non-negative weights).
    pub fn score(&self, info: &WorkerInfo, extra: u32) -> f64 {
        let usable = info.cores.min(info.slots).max(1);
        let running = f64::from(info.running.saturating_add(extra)) / f64::from(usable);
        running * self.weights.running + (info.avg_duration_ms / 1000.0) * self.weights.duration
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(running: u32, cores: u32, avg_duration_ms: f64) -> WorkerInfo {
        WorkerInfo {
            id: "w".parse().unwrap(),
            host: "h".into(),
            cores,
            slots: 8,
            tags: Vec::new(),
            executors: vec!["shell".into()],
            described: Vec::new(),
            running,
            avg_duration_ms,
            reserved: Default::default(),
            budget: None,
            attempts: Vec::new(),
            isolation: None,
            version: "t".into(),
            started_at: crate::time::now(),
        }
    }

    #[test]
    fn the_score_follows_the_weights() {
        let default = RoutingPolicy::default();
        // 2 running on 4 cores, 500 ms on average: 0.5 * 0.7 + 0.5 * 0.3.
        assert!((default.score(&info(2, 4, 500.0), 0) - 0.5).abs() < 1e-9);
        // One more sent since the heartbeat: 0.75 * 0.7 + 0.15.
        assert!((default.score(&info(2, 4, 500.0), 1) - 0.675).abs() < 1e-9);
        let load_only = RoutingPolicy::new(
            Weights {
                running: 1.0,
                duration: 0.0,
            },
            DEFAULT_WORKER_TTL,
        );
        assert!((load_only.score(&info(2, 4, 500.0), 0) - 0.5).abs() < 1e-9);
        // No cores reported counts as one.
        assert!((load_only.score(&info(3, 0, 0.0), 0) - 3.0).abs() < 1e-9);
        // Fewer slots than cores (an adaptive budget that shrank): the slots count.
        let shrunk = WorkerInfo {
            slots: 1,
            ..info(1, 4, 0.0)
        };
        assert!((load_only.score(&shrunk, 0) - 1.0).abs() < 1e-9);
        assert!(load_only.score(&shrunk, 0) > load_only.score(&info(3, 4, 0.0), 0));
    }

    #[test]
    fn a_worker_is_alive_until_its_ttl() {
        let policy = RoutingPolicy::new(Weights::default(), Duration::from_secs(30));
        assert!(policy.alive(Duration::from_secs(29)));
        assert!(!policy.alive(Duration::from_secs(30)));
        assert_eq!(RoutingPolicy::default().worker_ttl(), DEFAULT_WORKER_TTL);
    }
}
