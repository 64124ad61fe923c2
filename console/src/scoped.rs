//! What a route touches, for a caller whose roles are in single namespaces (a token made with
//! `ax auth token create -n <namespace>`): the access check ([`crate::access::check`]) lets
//! such a caller reach a job's or an instance's routes where it holds the route's role in that
//! job's namespace, and the lists and the dashboard, which show only its namespaces' jobs and
//! instances (the dashboard without the figures of every namespace); every other page
//! (workers, queues, dead letters, the audit) is of every namespace, and needs a role in
//! every one.
//!
//! The commands a page or the API sends carry the caller's token, and the Scheduler checks
//! them again where they act ([`ax_bus::auth::Principal::role_in`]): a re-run or an apply
//! whose body names another namespace's jobs is refused there, whatever page sent it.

use ax_bus::auth::{Principal, Role};
use ax_bus::ids::{InstanceId, JobName};

/// What a route touches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Touches {
    /// One job's page, API or action.
    Job(JobName),
    /// One instance's page, API or action (its namespace is its record's job's).
    Instance(InstanceId),
    /// A list its handler keeps to the caller's namespaces, or a command whose body the
    /// Scheduler checks namespace by namespace (apply, re-run, backfill, an approval's
    /// decision), or the logout.
    Kept,
    /// Every namespace.
    Everything,
}

/// What `path` (as the router matches it) touches when asked with `method`.
pub(crate) fn touches(method: &str, path: &str) -> Touches {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let job = |name: &str| JobName::parse(name).map_or(Touches::Everything, Touches::Job);
    let instance = |id: &str| InstanceId::parse(id).map_or(Touches::Everything, Touches::Instance);
    match (method, segments.as_slice()) {
        (_, ["" | "jobs" | "instances" | "rerun" | "approvals" | "logout"])
        | (_, ["ui", "dashboard"])
        | (_, ["ui", "approvals", _, _])
        | (_, ["jobs", "new"])
        | (_, ["ui", "jobs", "validate" | "apply"])
        | (_, ["ui", "instances", "bulk"])
        | (_, ["ui", "rerun", _] | ["ui", "backfill"])
        | (_, ["api", "v1", "jobs" | "instances" | "rerun" | "backfill"]) => Touches::Kept,
        (_, ["jobs", name] | ["jobs", name, "edit"])
        | (_, ["api", "v1", "jobs", name] | ["api", "v1", "jobs", name, _])
        | (_, ["ui", "jobs", name, _]) => job(name),
        (_, ["instances", id])
        | (_, ["api", "v1", "instances", id] | ["api", "v1", "instances", id, _])
        | (_, ["ui", "instances", id, _]) => instance(id),
        _ => Touches::Everything,
    }
}

/// The namespaces whose jobs and instances a list shows `who`: `None` for every namespace
/// (a role in every one), else those they hold a role in.
pub(crate) fn seen(who: &Principal) -> Option<std::collections::BTreeSet<String>> {
    if who.role >= Some(Role::Viewer) {
        return None;
    }
    Some(who.namespaces.keys().map(|ns| ns.to_string()).collect())
}

/// What a list keeps: the namespaces it was asked for (`asked`), of those `seen` by the
/// caller ([`seen`]); `None`: every namespace.
pub(crate) fn kept(
    asked: Option<std::collections::BTreeSet<String>>,
    seen: Option<std::collections::BTreeSet<String>>,
) -> Option<std::collections::BTreeSet<String>> {
    match (asked, seen) {
        (Some(asked), Some(seen)) => Some(asked.intersection(&seen).cloned().collect()),
        (asked, None) => asked,
        (None, seen) => seen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_touches_its_job_or_instance_and_only_lists_and_checked_commands_are_kept() {
        let job = |n: &str| Touches::Job(n.parse().unwrap());
        let instance = |n: &str| Touches::Instance(n.parse().unwrap());
        for (method, path, touched) in [
            ("GET", "/jobs/payments.settle", job("payments.settle")),
            ("GET", "/jobs/payments.settle/edit", job("payments.settle")),
            (
                "POST",
                "/api/v1/jobs/payments.settle/trigger",
                job("payments.settle"),
            ),
            ("DELETE", "/api/v1/jobs/etl", job("etl")),
            ("POST", "/ui/jobs/etl/pause", job("etl")),
            (
                "GET",
                "/instances/a.x.20261207T000000000Z",
                instance("a.x.20261207T000000000Z"),
            ),
            (
                "POST",
                "/api/v1/instances/a.x.key-1/cancel",
                instance("a.x.key-1"),
            ),
            ("GET", "/ui/instances/a.x.key-1/log", instance("a.x.key-1")),
            ("GET", "/jobs", Touches::Kept),
            ("POST", "/api/v1/jobs", Touches::Kept),
            ("POST", "/ui/jobs/apply", Touches::Kept),
            ("POST", "/ui/instances/bulk", Touches::Kept),
            ("POST", "/api/v1/rerun", Touches::Kept),
            ("GET", "/approvals", Touches::Kept),
            (
                "POST",
                "/ui/approvals/00112233aabbccdd/approve",
                Touches::Kept,
            ),
            ("GET", "/", Touches::Kept),
            ("GET", "/ui/dashboard", Touches::Kept),
            ("GET", "/api/v1/status", Touches::Everything),
            ("GET", "/audit", Touches::Everything),
            ("POST", "/api/v1/queues/low/pause", Touches::Everything),
            ("POST", "/api/v1/dead-letters/3/replay", Touches::Everything),
            ("GET", "/jobs/Not A Name", Touches::Everything),
        ] {
            assert_eq!(touches(method, path), touched, "{method} {path}");
        }
    }
}
