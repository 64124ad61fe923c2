//! Rules that need every job in view: a dependency must name a known job (registered, or in the
//! same apply), and same-date dependencies must not form a cycle.
//!
//! Only `current` edges can close a cycle: an edge to an earlier date (`-1d`) points into the
//! past, so `a` may depend on yesterday's `a` ("depends on past") but not on today's. A cycle is
//! spelled in the direction "depends on": `a -> b -> c -> a` means a needs b, b needs c, c
//! needs a.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{JobSpec, SpecError};
use crate::ids::JobName;

/// Checks the jobs of an apply against the registry, where an applied job replaces a registered
/// one of the same name. Returns `(job, error)` pairs.
pub fn validate_graph<'a>(
    applied: &[&'a JobSpec],
    registered: impl IntoIterator<Item = &'a JobSpec>,
) -> Vec<(JobName, SpecError)> {
    let mut jobs: BTreeMap<&str, &JobSpec> = registered
        .into_iter()
        .map(|j| (j.name.as_str(), j))
        .collect();
    for job in applied {
        jobs.insert(job.name.as_str(), job);
    }
    let mut errors = Vec::new();
    for job in applied {
        for (i, dep) in job.deps.iter().enumerate() {
            if !jobs.contains_key(dep.name.as_str()) {
                errors.push((
                    job.name.clone(),
                    SpecError::new(
                        format!("job.deps[{i}].name"),
                        format!(
                            "unknown job `{}` (neither registered nor in this apply)",
                            dep.name
                        ),
                    ),
                ));
            }
        }
    }
    let same_date: HashMap<&str, Vec<&str>> = jobs
        .iter()
        .map(|(name, job)| {
            let edges = job
                .deps
                .iter()
                .filter(|d| d.offset_days() == Ok(0) && jobs.contains_key(d.name.as_str()))
                .map(|d| d.name.as_str())
                .collect();
            (*name, edges)
        })
        .collect();
    let mut reported = BTreeSet::new();
    for job in applied {
        if let Some(cycle) = find_cycle(&same_date, &job.name) {
            let mut key: Vec<&str> = cycle[..cycle.len() - 1].to_vec();
            key.sort_unstable();
            if reported.insert(key) {
                errors.push((
                    job.name.clone(),
                    SpecError::new("job.deps", format!("cycle: {}", cycle.join(" -> "))),
                ));
            }
        }
    }
    errors
}

/// A cycle through `start`, as the path start -> ... -> start.
fn find_cycle<'a>(edges: &HashMap<&'a str, Vec<&'a str>>, start: &'a str) -> Option<Vec<&'a str>> {
    // Depth-first search for a path from start's dependencies back to start.
    let mut path = vec![start];
    let mut next_edge = vec![0usize];
    let mut visited = BTreeSet::new();
    while let Some(top) = path.last().copied() {
        let depth = path.len() - 1;
        let children = edges.get(top).map(Vec::as_slice).unwrap_or_default();
        if next_edge[depth] < children.len() {
            let child = children[next_edge[depth]];
            next_edge[depth] += 1;
            if child == start {
                path.push(start);
                return Some(path);
            }
            if visited.insert(child) {
                path.push(child);
                next_edge.push(0);
            }
        } else {
            path.pop();
            next_edge.pop();
        }
    }
    None
}

/// The jobs that depend on `name`.
pub fn dependents_of<'a>(
    name: &str,
    registered: impl IntoIterator<Item = &'a JobSpec>,
) -> Vec<JobName> {
    registered
        .into_iter()
        .filter(|j| j.name != name && j.deps.iter().any(|d| d.name == name))
        .map(|j| j.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str, deps: &[(&str, &str)]) -> JobSpec {
        serde_json::from_value(serde_json::json!({
            "name": name,
            "exec": {"type": "shell", "command": "true"},
            "deps": deps.iter().map(|(n, d)| serde_json::json!({"name": n, "biz_date": d})).collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    #[test]
    fn a_cycle_is_spelled_out() {
        let (a, b, c) = (
            job("a", &[("b", "current")]),
            job("b", &[("c", "current")]),
            job("c", &[("a", "current")]),
        );
        let errors = validate_graph(&[&a, &b, &c], []);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].1.reason, "cycle: a -> b -> c -> a");
    }

    #[test]
    fn a_cycle_closed_by_the_registry_is_found() {
        let registered = [job("b", &[("c", "current")]), job("c", &[("a", "current")])];
        let a = job("a", &[("b", "current")]);
        let errors = validate_graph(&[&a], registered.iter());
        assert_eq!(errors[0].1.reason, "cycle: a -> b -> c -> a");
    }

    #[test]
    fn past_dates_do_not_close_cycles() {
        let a = job("a", &[("b", "current"), ("a", "-1d")]);
        let b = job("b", &[("a", "-1d")]);
        assert!(validate_graph(&[&a, &b], []).is_empty());
    }

    #[test]
    fn unknown_deps_are_errors_unless_applied_together() {
        let stat = job("stat", &[("sync", "current")]);
        let errors = validate_graph(&[&stat], []);
        assert_eq!(errors[0].1.field, "job.deps[0].name");
        let sync = job("sync", &[]);
        assert!(validate_graph(&[&stat, &sync], []).is_empty());
        assert!(validate_graph(&[&stat], [&sync]).is_empty());
        assert_eq!(dependents_of("sync", [&stat, &sync]), ["stat"]);
    }
}
