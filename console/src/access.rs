//! The one access check. Every request goes through [`check`] before any handler runs (the
//! server installs it around the whole application, so a route added later cannot skip it):
//! it finds the role the route needs ([`needed`]) and who is asking, and refuses what that
//! caller may not do.
//!
//! The check also refuses a forged state change ([`crate::csrf`]): a page of another site
//! cannot make a browser act, whatever the caller's role.
//!
//! Roles are `viewer` < `operator` < `admin`. Until identities exist (the RBAC work), every
//! caller is the anonymous admin of an open server — which is why the CLI binds it to loopback
//! unless told otherwise.

use std::fmt;

use actix_web::http::header::HeaderMap;
use actix_web::http::Method;

use crate::csrf::{self, Forged};

/// What a caller may do, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Reads everything.
    Viewer,
    /// Runs and stops work.
    Operator,
    /// Changes definitions and rights.
    Admin,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        })
    }
}

/// Who is asking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// A name for the audit.
    pub name: String,
    /// What they may do.
    pub role: Role,
}

/// Who is asking, as the handlers see it (the check puts it in the request's extensions).
#[derive(Clone, Debug)]
pub struct Caller {
    /// Who.
    pub principal: Principal,
    /// The browser's CSRF token, which pages embed for their script to send back.
    pub csrf: String,
}

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// The caller's role is below the route's.
    #[error("{method} {path} needs the {needed} role; {who} is {has}")]
    Role {
        /// The request's method.
        method: String,
        /// The request's path.
        path: String,
        /// What the route needs.
        needed: Role,
        /// Who asked.
        who: String,
        /// What they have.
        has: Role,
    },
    /// A state change forged by another site, or without the page's token.
    #[error(transparent)]
    Forged(#[from] Forged),
}

/// The role a request needs: reading (`GET`, `HEAD`) needs a viewer, anything else an
/// operator at least; routes that change definitions or rights will ask for more here.
pub fn needed(method: &str, _path: &str) -> Role {
    match method {
        "GET" | "HEAD" => Role::Viewer,
        _ => Role::Operator,
    }
}

/// Who is asking: with no identities configured, the anonymous admin.
pub fn principal() -> Principal {
    Principal {
        name: "anonymous".into(),
        role: Role::Admin,
    }
}

/// What a request looks like to the check.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// Its method.
    pub method: &'a Method,
    /// Its path.
    pub path: &'a str,
    /// The `Host` it was sent to.
    pub host: &'a str,
    /// Its headers.
    pub headers: &'a HeaderMap,
}

/// The check: the caller, if they may make this request.
pub fn check(request: Request<'_>) -> Result<Principal, Denied> {
    csrf::verify(request.method, request.host, request.headers)?;
    let who = principal();
    let needed = needed(request.method.as_str(), request.path);
    if who.role >= needed {
        return Ok(who);
    }
    Err(Denied::Role {
        method: request.method.to_string(),
        path: request.path.into(),
        needed,
        who: who.name,
        has: who.role,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_needs_a_viewer_and_changing_an_operator() {
        assert_eq!(needed("GET", "/metrics"), Role::Viewer);
        assert_eq!(needed("POST", "/api/v1/anything"), Role::Operator);
        assert!(Role::Viewer < Role::Operator && Role::Operator < Role::Admin);
        let headers = HeaderMap::new();
        let request = Request {
            method: &Method::GET,
            path: "/metrics",
            host: "127.0.0.1:8080",
            headers: &headers,
        };
        assert_eq!(check(request).unwrap().role, Role::Admin);
    }
}
