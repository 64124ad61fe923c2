//! Which jobs the dependency graph concerns, judged on the whole job registry.
//!
//! A fire (cron or trigger) goes from the Scheduler straight to the Router when nothing in the
//! graph concerns its job; otherwise it passes the DagCoordinator, which holds it for its
//! dependencies, queues it behind the job's earlier instances, joins its shards, or creates the
//! jobs that run on it alone. Whether some job depends on a job must be known over the whole
//! registry: with partitioned Schedulers a job's dependent is often another Scheduler's, and a
//! fire that skipped the coordinator then never created it. So every Scheduler notes the
//! dependencies of every job its registry feed delivers, whether it holds the job or not, and
//! shares what it knows with its control desk (manual triggers). Until the feed has delivered
//! the registry once, nothing is known, and every fire passes the coordinator.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use ax_bus::ids::JobName;
use ax_bus::spec::{JobSpec, Overlap};

/// The graph's view shared by a Scheduler and its control desk; cheap to clone.
#[derive(Clone, Debug, Default)]
pub(crate) struct Graph(Arc<Mutex<Known>>);

#[derive(Debug, Default)]
struct Known {
    /// How many jobs depend on each job.
    dependents: HashMap<JobName, usize>,
    /// The upstream jobs of each job that has dependencies.
    upstreams: HashMap<JobName, Vec<JobName>>,
    /// Whether the registry has been delivered once.
    loaded: bool,
}

impl Graph {
    fn known(&self) -> MutexGuard<'_, Known> {
        // Nothing here is left half-changed by a panic: a poisoned lock is still right.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Notes the dependencies of `spec`, a job of the registry (replacing what was noted of it).
    pub(crate) fn note_deps(&self, spec: &JobSpec) {
        let mut known = self.known();
        known.forget(&spec.name);
        let mut upstreams: Vec<JobName> = spec.deps.iter().map(|d| d.name.clone()).collect();
        upstreams.sort_unstable();
        upstreams.dedup();
        for upstream in &upstreams {
            *known.dependents.entry(upstream.clone()).or_default() += 1;
        }
        if !upstreams.is_empty() {
            known.upstreams.insert(spec.name.clone(), upstreams);
        }
    }

    /// Forgets the dependencies of job `name` (deleted from the registry, or unreadable there).
    pub(crate) fn forget_deps(&self, name: &str) {
        self.known().forget(name);
    }

    /// The registry has been delivered once: from now on what is noted is the whole graph.
    pub(crate) fn loaded(&self) {
        self.known().loaded = true;
    }

    /// Whether an instance of `spec` concerns the DagCoordinator: it has dependencies, some job
    /// depends on it, its instances queue behind each other (the coordinator must know each of
    /// them to hold the next), or it splits into shards (the coordinator joins them) — or the
    /// registry has not been read yet.
    pub(crate) fn needs_coordinator(&self, spec: &JobSpec) -> bool {
        if !spec.deps.is_empty() || spec.overlap == Overlap::Queue || spec.splits() {
            return true;
        }
        let known = self.known();
        !known.loaded || known.dependents.contains_key(&spec.name)
    }
}

impl Known {
    fn forget(&mut self, name: &str) {
        for upstream in self.upstreams.remove(name).into_iter().flatten() {
            if let Some(count) = self.dependents.get_mut(&upstream) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    self.dependents.remove(&upstream);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, deps: &[&str]) -> JobSpec {
        let deps: Vec<serde_json::Value> = deps
            .iter()
            .map(|d| serde_json::json!({"name": d}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "name": name,
            "deps": deps,
            "exec": {"type": "noop"},
        }))
        .unwrap()
    }

    #[test]
    fn the_coordinator_is_needed_by_jobs_in_the_graph_only() {
        let graph = Graph::default();
        let (lone, up, down) = (spec("lone", &[]), spec("up", &[]), spec("down", &["up"]));
        assert!(
            graph.needs_coordinator(&lone),
            "nothing is known before the registry is read"
        );
        // `down` may be another Scheduler's: only its dependencies are noted.
        for s in [&lone, &up, &down] {
            graph.note_deps(s);
        }
        graph.loaded();
        assert!(!graph.needs_coordinator(&lone));
        assert!(graph.needs_coordinator(&up));
        assert!(graph.needs_coordinator(&down));
        // Noted again (an edit, a replay of the registry): counted once.
        graph.note_deps(&down);
        graph.forget_deps("down");
        assert!(!graph.needs_coordinator(&up));
    }
}
