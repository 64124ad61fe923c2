//! The one access check. Every request goes through [`check`] before any handler runs (the
//! server installs it around the whole application, so a route added later cannot skip it):
//! it finds the role the route needs ([`needed`]) and who is asking, and refuses what that
//! caller may not do.
//!
//! The check also refuses a forged state change ([`crate::csrf`]): a page of another site
//! cannot make a browser act, whatever the caller's role. And it answers only requests sent to
//! a host it serves ([`host_served`]): a page whose DNS name an attacker points at this server
//! (DNS rebinding) is same-origin to itself — its `Origin` and `Host` agree — so only the name
//! tells it apart.
//!
//! Roles are `viewer` < `operator` < `admin` ([`ax_bus::auth::Role`]). With `[auth]` off every
//! caller is the unverified anonymous admin of an open server — which is why the CLI binds it
//! to loopback unless told otherwise; with it on, every route but the login needs a valid
//! token, from a bearer header or the login's session.

use actix_web::http::header::HeaderMap;
use actix_web::http::Method;

use ax_bus::auth::token::Token;
pub use ax_bus::auth::{Principal, Role, Via};
use ax_bus::client::auth::CheckError;
use ax_bus::AxClient;

use crate::changes::{self, Does};
use crate::csrf::{self, Forged};
use crate::scoped::{self, Touches};
use crate::session::Sessions;
use crate::throttle::Throttle;

/// Who is asking, as the handlers see it (the check puts it in the request's extensions).
#[derive(Clone, Debug)]
pub struct Caller {
    /// Who.
    pub principal: Principal,
    /// The browser's CSRF token, which pages embed for their script to send back.
    pub csrf: String,
    /// Their token, carried on the commands they cause (none with auth off).
    pub token: Option<Token>,
    /// The door: the API or the console's pages.
    pub via: Via,
}

impl Caller {
    /// Whether they may do what needs `role` (pages leave out the controls they may not use).
    pub fn may(&self, role: Role) -> bool {
        self.principal.role >= Some(role)
    }
}

/// What the check needs to know who is asking.
#[derive(Clone, Debug, Default)]
pub struct Gate {
    /// Whether callers must prove who they are (`[auth] enabled`).
    pub auth: bool,
    /// Where tokens are checked.
    pub client: Option<AxClient>,
    /// The console's logins.
    pub sessions: Sessions,
    /// The node serving (for the audit).
    pub node: Option<ax_bus::ids::NodeId>,
    /// DNS names it answers for besides `localhost` and IP addresses (`[metrics] hosts`).
    pub hosts: Vec<String>,
    /// Failed sign-ins by address, and the waits they earn.
    pub throttle: Throttle,
}

/// Whether a request sent to `authority` (the request target's authority when it has one,
/// else its `Host`; with or without a port) is for this server: `localhost`, an IP address, or
/// one of the `names` it was given. A DNS rebinding attack needs a name of the attacker's,
/// which is none of these.
///
/// The authority is parsed as RFC 3986 reads it (`http::uri::Authority`), never split by
/// hand: `[::1]@evil.com` names `evil.com` (and a `Host` may carry no userinfo at all, RFC
/// 9110 §7.2), an IPv6 literal is only what its brackets hold, only a port may follow the
/// host, and anything that is no authority is refused.
pub fn host_served(authority: &str, names: &[String]) -> bool {
    let Ok(parsed) = authority.parse::<actix_web::http::uri::Authority>() else {
        return false;
    };
    if parsed.as_str().contains('@') {
        return false;
    }
    let host = parsed.host();
    // The parser is lenient after the host (`[::1]evil.com`, a port `80a`): what follows it
    // must be nothing or a port.
    let port = parsed.as_str().get(host.len()..).unwrap_or("x");
    let port_ok = port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()) && p.len() <= 5);
    if !parsed.as_str().starts_with(host) || !port_ok {
        return false;
    }
    let served_name = |name: &str| {
        name.parse::<std::net::Ipv4Addr>().is_ok()
            || name.eq_ignore_ascii_case("localhost")
            || names.iter().any(|n| n.eq_ignore_ascii_case(name))
    };
    match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(literal) => literal.parse::<std::net::Ipv6Addr>().is_ok(),
        None => !host.is_empty() && served_name(host),
    }
}

/// Why a request was refused.
#[derive(Debug, thiserror::Error)]
pub enum Denied {
    /// No valid token: 401 (pages send the browser to the login).
    #[error("{0}")]
    Unauthenticated(String),
    /// Tokens cannot be checked now (NATS away): 503.
    #[error("cannot check the token now: {0}")]
    Unavailable(String),
    /// The caller's role is below the route's.
    #[error("{method} {path} needs the {needed} role{place}; {who} is {roles}")]
    Role {
        /// The request's method.
        method: String,
        /// The request's path.
        path: String,
        /// What the route needs.
        needed: Role,
        /// Where it needs it (` in namespace `b``, ` in every namespace`), or nothing.
        place: String,
        /// Who asked.
        who: String,
        /// What they have, highest first.
        has: Option<Role>,
        /// Their roles as a sentence names them.
        roles: String,
    },
    /// A state change forged by another site, or without the page's token.
    #[error(transparent)]
    Forged(#[from] Forged),
    /// Too many wrong tokens from this address lately: 429, try again after the wait.
    #[error("too many wrong tokens from this address; try again in {} s", .0.as_secs().max(1))]
    Throttled(std::time::Duration),
    /// Sent to a name this server does not answer for.
    #[error("this server answers for localhost, IP addresses and the names in [metrics] hosts; not for `{0}`")]
    Host(String),
}

/// The role a request needs: reading (`GET`, `HEAD`) needs a viewer; a change what its route
/// does needs (`crate::changes`) — a command's role, the same the Scheduler checks again; any
/// change no route declares an admin.
pub fn needed(method: &str, path: &str) -> Role {
    if matches!(method, "GET" | "HEAD") {
        return Role::Viewer;
    }
    match changes::does(method, path) {
        Some(Does::Command(command)) => ax_bus::auth::role_of(command),
        Some(Does::Decide) | None => Role::Admin,
        Some(Does::Nothing(role)) => role,
    }
}

/// Routes anyone may reach: the login itself and the static files it needs.
fn public(path: &str) -> bool {
    path == "/login" || path.starts_with("/static/")
}

/// What a request looks like to the check.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// Its method.
    pub method: &'a Method,
    /// Its path as the router matches it: percent-escapes decoded (but `%2F`, `%25` and
    /// `%2B`, which no route takes), so the role found is the routed handler's.
    pub path: &'a str,
    /// The `Host` it was sent to.
    pub host: &'a str,
    /// Its headers.
    pub headers: &'a HeaderMap,
    /// The address it came from (failed sign-ins are counted by it).
    pub peer: Option<std::net::IpAddr>,
}

/// The check: who the caller is and their token, if they may make this request. With auth
/// on, the token comes from `Authorization: Bearer` (the API) or the login's session cookie
/// (the console) and is checked against the tokens bucket now; a state change made with a
/// session must carry the page's CSRF token too.
pub async fn check(
    request: Request<'_>,
    gate: &Gate,
) -> Result<(Principal, Option<Token>), Denied> {
    if !host_served(request.host, &gate.hosts) {
        return Err(Denied::Host(request.host.to_string()));
    }
    csrf::verify(request.method, request.host, request.headers)?;
    if !gate.auth {
        return Ok((Principal::unverified("anonymous"), None));
    }
    let bearer = request
        .headers
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let throttled = |peer| gate.throttle.wait(peer, std::time::Instant::now());
    if let Some(wait) = request
        .peer
        .filter(|_| bearer.is_some())
        .and_then(throttled)
    {
        return Err(Denied::Throttled(wait));
    }
    let wrong = |e: String| {
        if let Some(peer) = request.peer {
            gate.throttle.failed(peer, std::time::Instant::now());
        }
        Denied::Unauthenticated(e)
    };
    let token = match bearer {
        Some(text) => Some(Token::parse(text).map_err(|e| wrong(e.to_string()))?),
        None => {
            let token = gate.sessions.token(request.headers);
            if token.is_some()
                && !csrf::is_safe(request.method)
                && csrf::cookie_token(request.headers).is_none()
            {
                return Err(Forged::Token.into());
            }
            token
        }
    };
    if public(request.path) {
        return Ok((Principal::unverified("anonymous"), None));
    }
    let Some(client) = &gate.client else {
        return Err(Denied::Unavailable(
            "this node has no NATS connection".into(),
        ));
    };
    let who = match client.check_token(token.as_ref()).await {
        Ok(who) => {
            if let Some(peer) = request.peer.filter(|_| bearer.is_some()) {
                gate.throttle.succeeded(peer);
            }
            who
        }
        Err(CheckError::Token(e)) if bearer.is_some() => return Err(wrong(e.to_string())),
        Err(CheckError::Token(e)) => return Err(Denied::Unauthenticated(e.to_string())),
        Err(CheckError::Client(e)) => return Err(Denied::Unavailable(e.to_string())),
    };
    let needed = needed(request.method.as_str(), request.path);
    if who.role >= Some(needed) {
        return Ok((who, token));
    }
    // A token of single namespaces: where the route acts decides (see `scoped`).
    let place = match scoped::touches(request.method.as_str(), request.path) {
        _ if who.highest() < Some(needed) => None,
        Touches::Kept => return Ok((who, token)),
        Touches::Job(job) => Some(job.namespace().to_string()),
        Touches::Instance(id) => match client.instance(&id).await {
            Ok(Some((record, _))) => Some(record.job.namespace().to_string()),
            // None: its page says so, telling nothing of any namespace.
            Ok(None) => return Ok((who, token)),
            Err(e) => return Err(Denied::Unavailable(e.to_string())),
        },
        Touches::Everything => None,
    };
    if let Some(namespace) = &place {
        if who.role_in(namespace) >= Some(needed) {
            return Ok((who, token));
        }
    }
    Err(Denied::Role {
        method: request.method.to_string(),
        path: request.path.into(),
        needed,
        place: match place {
            Some(namespace) => format!(" in namespace `{namespace}`"),
            None if who.role.is_none() => " in every namespace".into(),
            None => String::new(),
        },
        who: who.name.clone(),
        has: who.highest(),
        roles: who.roles(),
    })
}

/// Records a refusal on the audit trail (`ax.audit.http`) when it says something: a state
/// change refused, or a token presented and refused (a revoked one, a role too low). A page
/// read without any token — a browser on its way to the login — is not recorded. Sent in the
/// background: the answer does not wait for it.
pub fn audit_refusal(
    gate: &Gate,
    request: &actix_web::dev::ServiceRequest,
    denied: &Denied,
    via: Via,
) {
    let (Some(client), Some(node)) = (gate.client.clone(), gate.node.clone()) else {
        return;
    };
    let headers = request.headers();
    let bearer = headers
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let presented = bearer.is_some() || gate.sessions.token(headers).is_some();
    if csrf::is_safe(request.method()) && !presented && !matches!(denied, Denied::Role { .. }) {
        return;
    }
    if matches!(denied, Denied::Throttled(_)) {
        // Its wrong tokens are on the trail already; the waits they earned are not news.
        return;
    }
    let (actor, role, verified) = match denied {
        Denied::Role { who, has, .. } => (who.clone(), has.unwrap_or(Role::Viewer), true),
        _ => (
            bearer
                .and_then(|text| Token::parse(text).ok())
                .or_else(|| gate.sessions.token(headers))
                .map_or_else(|| "anonymous".to_string(), |t| t.name().to_string()),
            Role::Viewer,
            false,
        ),
    };
    let record = ax_bus::auth::audit::AuditRecord {
        action: "http".into(),
        actor,
        role,
        verified,
        via,
        namespaces: Vec::new(),
        request: serde_json::json!({
            "method": request.method().as_str(),
            "path": request.path(),
        }),
        outcome: ax_bus::auth::audit::Outcome::Denied,
        message: denied.to_string(),
        approval: None,
        approved_by: None,
        dry_run: false,
        detail: serde_json::Value::Null,
        at: ax_bus::time::now(),
        node,
    };
    actix_web::rt::spawn(async move {
        let published = match ax_bus::codec::encode(&record) {
            Ok(payload) => client
                .js
                .publish_with_headers(
                    client.subjects().audit("http"),
                    ax_bus::codec::msgpack_headers(),
                    payload,
                )
                .await
                .map(|_| ()),
            Err(e) => {
                tracing::warn!(error = %e, "a refusal's audit record does not encode");
                return;
            }
        };
        if let Err(e) = published {
            tracing::warn!(error = %e, "a refusal was not recorded on the audit stream");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_needs_a_viewer_a_change_its_commands_role_and_anything_else_an_admin() {
        assert_eq!(needed("GET", "/metrics"), Role::Viewer);
        assert_eq!(needed("HEAD", "/api/v1/jobs"), Role::Viewer);
        assert_eq!(needed("POST", "/logout"), Role::Viewer);
        for operator in [
            ("POST", "/api/v1/jobs/x/trigger"),
            ("POST", "/api/v1/jobs/x/pause"),
            ("POST", "/api/v1/instances/x.1/kill"),
            ("POST", "/api/v1/rerun"),
            ("POST", "/api/v1/dead-letters/7/replay"),
            ("POST", "/ui/rerun/run"),
            ("POST", "/ui/instances/bulk"),
            ("POST", "/ui/jobs/validate"),
        ] {
            assert_eq!(
                needed(operator.0, operator.1),
                Role::Operator,
                "{operator:?}"
            );
        }
        for admin in [
            ("POST", "/api/v1/jobs"),
            ("DELETE", "/api/v1/jobs/x"),
            ("POST", "/ui/jobs/x/delete"),
            ("POST", "/ui/jobs/apply"),
            ("POST", "/ui/instances/x/mark"),
            ("POST", "/ui/queues/low/pause"),
            ("POST", "/api/v1/queues/low/resume"),
            ("POST", "/ui/approvals/0123456789abcdef/approve"),
            // Not a route of the table: closed to operators, whatever it would do.
            ("POST", "/api/v1/jobs/x/trigger/now"),
            ("POST", "/ui/jobs/x/explode"),
            ("PUT", "/api/v1/jobs/x/trigger"),
            ("POST", "/api/v1/jobs//trigger"),
            ("POST", "/api/v1/new-thing"),
        ] {
            assert_eq!(needed(admin.0, admin.1), Role::Admin, "{admin:?}");
        }
    }

    #[actix_web::test]
    async fn with_auth_off_everyone_is_the_unverified_admin() {
        let headers = HeaderMap::new();
        let request = Request {
            method: &Method::GET,
            path: "/metrics",
            host: "127.0.0.1:8080",
            headers: &headers,
            peer: None,
        };
        let (who, token) = check(request, &Gate::default()).await.unwrap();
        assert_eq!(
            (who.role, who.verified, token),
            (Some(Role::Admin), false, None)
        );
    }

    #[test]
    fn only_localhost_addresses_and_named_hosts_are_served() {
        let names = vec!["ax.example.com".to_string()];
        for host in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "[::1]:8080",
            "[::1]",
            "[::ffff:127.0.0.1]:80",
            "10.0.0.5",
            "ax.example.com:443",
            "AX.example.com",
        ] {
            assert!(host_served(host, &names), "{host}");
        }
        for host in [
            "rebind.example:8080",
            "localhost.rebind.example",
            "127.0.0.1.nip.io:8080",
            "ax.example.com.evil.org",
            "",
            // Userinfo: the host is what follows the `@`, and a Host carries none anyway.
            "[::1]@evil.com",
            "127.0.0.1@evil.com",
            "localhost:8080@evil.com",
            "evil.com@127.0.0.1",
            // No authority at all, or not an IPv6 literal between the brackets.
            "[::1]evil.com",
            "[evil.com]",
            "[::1",
            "::1",
            "127.0.0.1:80a",
            "127.0.0.1:+80",
            "127.0.0.1/evil",
            "local host",
        ] {
            assert!(!host_served(host, &names), "{host}");
        }
    }

    #[actix_web::test]
    async fn with_auth_on_no_token_is_unauthenticated_and_a_bad_one_never_echoed() {
        let gate = Gate {
            auth: true,
            ..Gate::default()
        };
        let request = |path, headers| Request {
            method: &Method::GET,
            path,
            host: "127.0.0.1:8080",
            headers,
            peer: None,
        };
        // No client: the check cannot be made, and says so.
        let none = HeaderMap::new();
        assert!(matches!(
            check(request("/jobs", &none), &gate).await,
            Err(Denied::Unavailable(_))
        ));
        let mut bad = HeaderMap::new();
        bad.insert(
            actix_web::http::header::AUTHORIZATION,
            actix_web::http::header::HeaderValue::from_static("Bearer axt_x_secret-ish"),
        );
        let denied = check(request("/jobs", &bad), &gate).await.unwrap_err();
        assert!(matches!(denied, Denied::Unauthenticated(_)));
        assert!(!denied.to_string().contains("secret-ish"));
        // The login page is reachable without one.
        assert!(check(request("/login", &none), &gate).await.is_ok());
    }
}
