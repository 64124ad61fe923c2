//! Rules that need every job in view: a dependency must name a known job (registered, or in the
//! same apply), same-date dependencies and data runs must not form a cycle, and no job of
//! `default` is named like a namespace.
//!
//! Two kinds of edges make a job wait for another for the same business date: a `current`
//! dependency, and a dataset — a job run by its data (`on_datasets`) waits for every job that
//! `produces` one of them. Only these can close a cycle: an edge to an earlier date (`-1d`)
//! points into the past, so `a` may depend on yesterday's `a` ("depends on past") but not on
//! today's. A cycle of dependencies is a chain that never starts; one through datasets is
//! worse: with `rerun: always`, each run updates the other's input and starts it again, for
//! ever (an independent test saw 3,031 attempts in 20 s). A cycle is spelled in the direction
//! "waits for": `a -> b -> c -> a` means a needs b, b needs c, c needs a, and an edge through a
//! dataset names it (`a -(warehouse://y)-> b`: a runs on warehouse://y, which b writes).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::dataset::DatasetUri;
use super::{JobSpec, SpecError};
use crate::ids::JobName;

/// Why `job` cannot have its name: a namespace and a job of `default` never share a name. The
/// namespace is the first token of its jobs' subjects, record keys and instance ids
/// (`ax.log.payments.settle.…`), where a `default` job's name is too (`ax.log.payments.…`): the
/// NATS permissions that give a namespace's services its own (`ax.log.payments.>`) would give
/// them that job's as well.
fn name_clash(
    job: &JobSpec,
    jobs: &BTreeMap<&str, &JobSpec>,
    namespaces: &BTreeSet<&str>,
) -> Option<String> {
    let name = job.name.as_str();
    if job.name.in_default() {
        return namespaces.contains(name).then(|| {
            format!(
                "`{name}` is a namespace: a job of `default` cannot have its name, which would \
                 share the namespace's subjects"
            )
        });
    }
    let namespace = job.name.namespace();
    jobs.contains_key(namespace).then(|| {
        format!(
            "namespace `{namespace}` is the name of a job of `default`, which would share its \
             subjects: name the namespace otherwise"
        )
    })
}

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
    let namespaces: BTreeSet<&str> = jobs
        .values()
        .map(|j| j.name.namespace())
        .filter(|ns| *ns != crate::ids::DEFAULT_NAMESPACE)
        .collect();
    for job in applied {
        if let Some(clash) = name_clash(job, &jobs, &namespaces) {
            errors.push((job.name.clone(), SpecError::new("job.name", clash)));
        }
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
    let mut producers: HashMap<&DatasetUri, Vec<&str>> = HashMap::new();
    for (name, job) in &jobs {
        for uri in &job.produces {
            producers.entry(uri).or_default().push(name);
        }
    }
    let same_date: HashMap<&str, Vec<Edge<'_>>> = jobs
        .iter()
        .map(|(name, job)| {
            let deps = job
                .deps
                .iter()
                .filter(|d| d.offset_days() == Ok(0) && jobs.contains_key(d.name.as_str()))
                .map(|d| Edge {
                    to: d.name.as_str(),
                    via: None,
                });
            let data = job.on_datasets.iter().flat_map(|uri| {
                producers
                    .get(uri)
                    .into_iter()
                    .flatten()
                    .map(move |producer| Edge {
                        to: producer,
                        via: Some(uri),
                    })
            });
            (*name, deps.chain(data).collect())
        })
        .collect();
    let mut reported = BTreeSet::new();
    for job in applied {
        if let Some(cycle) = find_cycle(&same_date, &job.name) {
            let mut key: Vec<&str> = cycle.iter().map(|e| e.to).collect();
            key.sort_unstable();
            if !reported.insert(key) {
                continue;
            }
            let mut spelled = job.name.to_string();
            for edge in &cycle {
                match edge.via {
                    Some(uri) => spelled.push_str(&format!(" -({uri})-> {}", edge.to)),
                    None => spelled.push_str(&format!(" -> {}", edge.to)),
                }
            }
            let through_data = cycle.iter().any(|e| e.via.is_some());
            let (field, reason) = if through_data {
                (
                    "job.on_datasets",
                    format!(
                        "cycle through datasets: {spelled} (each run would update the other's \
                         input for the same business date)"
                    ),
                )
            } else {
                ("job.deps", format!("cycle: {spelled}"))
            };
            errors.push((job.name.clone(), SpecError::new(field, reason)));
        }
    }
    errors
}

/// An edge of the same-date graph: the job waits for `to`, through dataset `via` if it is run
/// by its data.
#[derive(Clone, Copy, Debug)]
struct Edge<'a> {
    to: &'a str,
    via: Option<&'a DatasetUri>,
}

/// A cycle through `start`, as its edges from start back to start.
fn find_cycle<'a>(
    edges: &HashMap<&'a str, Vec<Edge<'a>>>,
    start: &'a str,
) -> Option<Vec<Edge<'a>>> {
    // Depth-first search for a path from start's edges back to start.
    let mut path: Vec<Edge<'a>> = Vec::new();
    let mut next_edge = vec![0usize];
    let mut visited = BTreeSet::new();
    loop {
        let top = path.last().map_or(start, |e| e.to);
        let depth = path.len();
        let children = edges.get(top).map(Vec::as_slice).unwrap_or_default();
        if next_edge[depth] < children.len() {
            let child = children[next_edge[depth]];
            next_edge[depth] += 1;
            if child.to == start {
                path.push(child);
                return Some(path);
            }
            if visited.insert(child.to) {
                path.push(child);
                next_edge.push(0);
            }
        } else if path.pop().is_some() {
            next_edge.pop();
        } else {
            return None;
        }
    }
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

    fn data_job(name: &str, produces: &[&str], on_datasets: &[&str]) -> JobSpec {
        serde_json::from_value(serde_json::json!({
            "name": name,
            "exec": {"type": "noop"},
            "produces": produces,
            "consumes": on_datasets,
            "on_datasets": on_datasets,
            "rerun": "always",
        }))
        .unwrap()
    }

    #[test]
    fn a_cycle_through_datasets_is_refused_naming_them() {
        // The independent test's pair: each runs on the other's output.
        let a = data_job("a", &["w://x"], &["w://y"]);
        let b = data_job("b", &["w://y"], &["w://x"]);
        let errors = validate_graph(&[&a, &b], []);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].1.field, "job.on_datasets");
        assert_eq!(
            errors[0].1.reason,
            "cycle through datasets: a -(w://y)-> b -(w://x)-> a (each run would update the \
             other's input for the same business date)"
        );
        // Closed by a job applied again over a registry without a cycle.
        let registered = [a.clone(), data_job("b", &["w://y"], &[])];
        assert!(validate_graph(&[&registered[1]], registered.iter()).is_empty());
        let errors = validate_graph(&[&b], registered.iter());
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0]
            .1
            .reason
            .starts_with("cycle through datasets: b -(w://x)-> a"));
        // A job run by what it writes itself, and a cycle of a dataset and a dependency.
        let own = data_job("own", &["w://z"], &["w://z"]);
        let errors = validate_graph(&[&own], []);
        assert!(errors[0]
            .1
            .reason
            .starts_with("cycle through datasets: own -(w://z)-> own"));
        let mut report = data_job("report", &[], &["w://x"]);
        report.produces = vec![];
        let mut load = job("load", &[("report", "current")]);
        load.produces = vec![DatasetUri::parse("w://x").unwrap()];
        let errors = validate_graph(&[&report, &load], []);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0]
                .1
                .reason
                .contains("report -(w://x)-> load -> report"),
            "{errors:?}"
        );
        // A chain through datasets without a cycle is fine.
        let c = data_job("c", &["w://c"], &["w://x"]);
        assert!(validate_graph(&[&a, &c], []).is_empty());
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

    #[test]
    fn a_dependency_crosses_namespaces_by_its_whole_name_and_no_default_job_is_named_like_one() {
        // payments.settle waits for ledger.close (another namespace) and rates (`default`).
        let close = job("ledger.close", &[]);
        let rates = job("rates", &[]);
        let settle = job(
            "payments.settle",
            &[("ledger.close", "current"), ("rates", "current")],
        );
        assert!(validate_graph(&[&settle], [&close, &rates]).is_empty());
        // A `default` job named like a namespace, whichever comes first.
        let clash = job("ledger", &[]);
        let errors = validate_graph(&[&clash], [&close]);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].1.reason.contains("`ledger` is a namespace"),
            "{errors:?}"
        );
        let errors = validate_graph(&[&close], [&clash]);
        assert!(errors[0]
            .1
            .reason
            .contains("namespace `ledger` is the name of a job"));
        let errors = validate_graph(&[&close, &clash], []);
        assert_eq!(errors.len(), 2, "{errors:?}");
    }
}
