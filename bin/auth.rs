//! `ax auth`, `ax approvals`, `ax audit`: tokens, two-person approvals and the audit trail.
//! Each change is a control command the Schedulers check and record; secrets are made here
//! and only their hashes leave the machine.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};

use ax_bus::auth::token::Token;
use ax_bus::ids::Namespace;
use ax_bus::messages::{ApprovalRequest, AuthRequest};
use ax_bus::AxClient;

use crate::args::{ApprovalsCommand, AuthCommand, TokenCommand};
use crate::jobs::{print_plan, send, Planned, CONTROL_TIMEOUT, PLANNED_TIMEOUT};
use crate::table;

/// Prints a new token once, or writes it to `out` (0600).
fn hand_over(token: &Token, out: Option<&Path>) -> Result<()> {
    match out {
        None => {
            println!("{}", token.expose());
            eprintln!("keep it now: it is not shown again (only its hash is stored)");
        }
        Some(path) => {
            use std::os::unix::fs::OpenOptionsExt;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("--out {}", path.display()))?;
            writeln!(file, "{}", token.expose())
                .with_context(|| format!("--out {}", path.display()))?;
            eprintln!("token written to {}", path.display());
        }
    }
    Ok(())
}

/// `ax auth …`.
pub(crate) async fn run(
    client: &AxClient,
    command: AuthCommand,
    namespace: Option<&Namespace>,
    json: bool,
) -> Result<()> {
    match command {
        AuthCommand::Bootstrap { name, out } => {
            let (token, hash) = Token::generate(&name);
            let reply = send(
                client,
                &AuthRequest::Bootstrap { name, hash },
                CONTROL_TIMEOUT,
            )
            .await?;
            eprintln!("{}", reply.message);
            hand_over(&token, out.as_deref())
        }
        AuthCommand::Token(TokenCommand::Create {
            name,
            role,
            expires,
            out,
        }) => {
            let expires_at = expires.as_deref().map(expiry).transpose()?;
            let (token, hash) = Token::generate(&name);
            let reply = send(
                client,
                &AuthRequest::Create {
                    name,
                    role,
                    namespaces: namespace.into_iter().cloned().collect(),
                    hash,
                    expires_at,
                },
                CONTROL_TIMEOUT,
            )
            .await?;
            eprintln!("{}", reply.message);
            hand_over(&token, out.as_deref())
        }
        AuthCommand::Token(TokenCommand::List) => {
            let reply = send(client, &AuthRequest::List, CONTROL_TIMEOUT).await?;
            if json {
                return table::json(&reply.tokens);
            }
            let rows: Vec<Vec<String>> = reply
                .tokens
                .iter()
                .map(|t| {
                    vec![
                        t.name.to_string(),
                        ax_bus::auth::Principal::token(&t.name, t.role, t.namespaces.clone())
                            .roles(),
                        instant(Some(t.created_at)),
                        t.created_by.clone(),
                        instant(t.expires_at),
                        match (&t.revoked_at, &t.revoked_by) {
                            (Some(at), by) => format!(
                                "revoked {} by {}",
                                instant(Some(*at)),
                                by.as_deref().unwrap_or("?")
                            ),
                            (None, _) => "active".into(),
                        },
                    ]
                })
                .collect();
            table::print(
                &["NAME", "ROLE", "CREATED", "BY", "EXPIRES", "STATE"],
                &rows,
            );
            Ok(())
        }
        AuthCommand::Token(TokenCommand::Revoke { name }) => {
            let reply = send(client, &AuthRequest::Revoke { name }, CONTROL_TIMEOUT).await?;
            println!("{}", reply.message);
            Ok(())
        }
    }
}

/// When a token made now with `--expires TEXT` stops working.
fn expiry(text: &str) -> Result<DateTime<Utc>> {
    let after = ax_bus::time::parse_delay(text).map_err(|e| anyhow::anyhow!("--expires: {e}"))?;
    chrono::Duration::from_std(after)
        .ok()
        .and_then(|d| ax_bus::time::now().checked_add_signed(d))
        .ok_or_else(|| anyhow::anyhow!("--expires: `{text}` is too far ahead"))
}

fn instant(at: Option<DateTime<Utc>>) -> String {
    at.map(ax_bus::time::rfc3339).unwrap_or_else(|| "-".into())
}

/// `ax approvals …`.
pub(crate) async fn approvals(
    client: &AxClient,
    command: ApprovalsCommand,
    json: bool,
) -> Result<()> {
    let (request, timeout) = match command {
        ApprovalsCommand::List => (ApprovalRequest::List, CONTROL_TIMEOUT),
        ApprovalsCommand::Approve { id } => (ApprovalRequest::Approve { id }, PLANNED_TIMEOUT),
        ApprovalsCommand::Reject { id, reason } => {
            (ApprovalRequest::Reject { id, reason }, CONTROL_TIMEOUT)
        }
    };
    let listing = matches!(request, ApprovalRequest::List);
    let reply = send(client, &request, timeout).await?;
    if !listing {
        if json {
            return table::json(&reply);
        }
        println!("{}", reply.message);
        if !reply.plan.is_empty() {
            print_plan(&reply.plan, false, Planned::Done)?;
        }
        return Ok(());
    }
    if json {
        return table::json(&reply.approvals);
    }
    let rows: Vec<Vec<String>> = reply
        .approvals
        .iter()
        .map(|a| {
            vec![
                a.id.to_string(),
                a.state.as_str().to_string(),
                a.requested_by.name.clone(),
                a.describe(),
                a.plan.iter().filter(|s| s.will_run).count().to_string(),
                instant(Some(a.expires_at)),
                a.decided_by.clone().unwrap_or_default(),
            ]
        })
        .collect();
    table::print(
        &[
            "ID",
            "STATE",
            "ASKED BY",
            "RE-RUN",
            "RUNS",
            "EXPIRES",
            "DECIDED BY",
        ],
        &rows,
    );
    Ok(())
}

/// Which audit records `ax audit list` shows.
pub(crate) struct AuditFilter {
    /// `24h`, `7d`, or an RFC 3339 instant.
    pub since: String,
    /// Only this actor's.
    pub actor: Option<String>,
    /// Only this action.
    pub action: Option<String>,
    /// Only what acted in this namespace (`-n`).
    pub namespace: Option<Namespace>,
}

/// `ax audit list`.
pub(crate) async fn audit(client: &AxClient, filter: &AuditFilter, json: bool) -> Result<()> {
    let since =
        ax_bus::time::parse_since(&filter.since).map_err(|e| anyhow::anyhow!("--since: {e}"))?;
    let records: Vec<_> = client
        .audit_since(since)
        .await?
        .into_iter()
        .filter(|r| filter.actor.as_ref().is_none_or(|a| &r.actor == a))
        .filter(|r| filter.action.as_ref().is_none_or(|a| &r.action == a))
        .filter(|r| {
            filter
                .namespace
                .as_ref()
                .is_none_or(|ns| r.namespaces.iter().any(|n| n == ns.as_str()))
        })
        .collect();
    if json {
        return table::json(&records);
    }
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                ax_bus::time::rfc3339(r.at),
                r.actor.clone(),
                r.role.to_string(),
                r.via.to_string(),
                if r.namespaces.is_empty() {
                    "*".to_string()
                } else {
                    r.namespaces.join(",")
                },
                if r.dry_run {
                    format!("{} (dry run)", r.action)
                } else {
                    r.action.clone()
                },
                r.outcome.as_str().to_string(),
                r.approval
                    .as_ref()
                    .map(|id| match &r.approved_by {
                        Some(by) => format!("{id} by {by}"),
                        None => id.to_string(),
                    })
                    .unwrap_or_default(),
                r.message.clone(),
            ]
        })
        .collect();
    table::print(
        &[
            "AT",
            "ACTOR",
            "ROLE",
            "VIA",
            "NAMESPACES",
            "ACTION",
            "OUTCOME",
            "APPROVAL",
            "MESSAGE",
        ],
        &rows,
    );
    Ok(())
}
