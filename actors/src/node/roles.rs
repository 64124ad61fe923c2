//! A node's roles: `scheduler`, `dag`, `router`, `worker`, `reporter` and `admin` (the web
//! console and its JSON API on the node's HTTP server; no actor). A worker's outcomes
//! go through the reporter on the same node (its outbox is a local file), so `worker` brings
//! `reporter` with it and `reporter` is refused without `worker`.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// What a node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Cron, time wheel, control commands, retries.
    Scheduler,
    /// Dependencies.
    Dag,
    /// Routing to workers.
    Router,
    /// Executing attempts.
    Worker,
    /// Reporting outcomes (beside a worker).
    Reporter,
    /// Serving the console and its JSON API (with `--http`).
    Admin,
}

impl Role {
    /// The roles that run actors: what `all` means. `admin` (the console, which binds an HTTP
    /// port) is named on its own, so that nodes started with `all` side by side on one host
    /// do not all reach for 8080.
    pub const ACTORS: [Role; 5] = [
        Role::Scheduler,
        Role::Dag,
        Role::Router,
        Role::Worker,
        Role::Reporter,
    ];

    /// Every role.
    pub const ALL: [Role; 6] = [
        Role::Scheduler,
        Role::Dag,
        Role::Router,
        Role::Worker,
        Role::Reporter,
        Role::Admin,
    ];

    /// The name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Scheduler => "scheduler",
            Role::Dag => "dag",
            Role::Router => "router",
            Role::Worker => "worker",
            Role::Reporter => "reporter",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a list of roles is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RoleError {
    /// A name that is no role.
    #[error("unknown role `{0}` (scheduler, dag, router, worker, reporter, admin)")]
    Unknown(String),
    /// An empty list.
    #[error("no role given")]
    None,
    /// A reporter without its worker.
    #[error("role `reporter` reports a worker's outcomes and needs `worker` on the same node")]
    ReporterWithoutWorker,
}

impl FromStr for Role {
    type Err = RoleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| RoleError::Unknown(s.to_string()))
    }
}

/// Parses `scheduler,dag,...` (or `all`), adding `reporter` to `worker`.
pub fn parse_roles(text: &str) -> Result<BTreeSet<Role>, RoleError> {
    let mut roles = BTreeSet::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part == "all" {
            roles.extend(Role::ACTORS);
        } else {
            roles.insert(part.parse()?);
        }
    }
    if roles.is_empty() {
        return Err(RoleError::None);
    }
    if roles.contains(&Role::Reporter) && !roles.contains(&Role::Worker) {
        return Err(RoleError::ReporterWithoutWorker);
    }
    if roles.contains(&Role::Worker) {
        roles.insert(Role::Reporter);
    }
    Ok(roles)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_and_worker_brings_its_reporter() {
        assert_eq!(parse_roles("all").unwrap().len(), 5);
        assert!(!parse_roles("all").unwrap().contains(&Role::Admin));
        assert!(parse_roles("all,admin").unwrap().contains(&Role::Admin));
        let roles = parse_roles("scheduler, worker").unwrap();
        assert!(roles.contains(&Role::Reporter));
        assert_eq!(
            parse_roles("reporter"),
            Err(RoleError::ReporterWithoutWorker)
        );
        assert!(parse_roles("scheduler,janitor")
            .unwrap_err()
            .to_string()
            .contains("unknown role `janitor`"));
        assert!(parse_roles("").is_err());
    }
}
