//! Who may do what, seen and decided in the console: the re-runs waiting for a second person
//! (approved or rejected here by an admin, through the same `approval` command as `ax
//! approvals`), and the audit trail (filtered like `ax audit list`).

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use serde::Deserialize;

use ax_bus::auth::approval::ApprovalState;
use ax_bus::auth::Role;
use ax_bus::ids::ApprovalId;
use ax_bus::messages::typed::Approvals;
use ax_bus::messages::ApprovalRequest;

use crate::actions;
use crate::changes::{changes, Does};
use crate::pages::{self, Chrome};
use crate::problem::Problem;
use crate::server::State;

/// The most audit records a page shows.
const AUDIT_ROWS: usize = 500;

pub(crate) fn routes(config: &mut web::ServiceConfig) {
    config
        .route("/approvals", web::get().to(approvals))
        .route("/audit", web::get().to(audit));
}

changes! {
    POST "/ui/approvals/{id}/approve" => approve, Does::Decide;
    POST "/ui/approvals/{id}/reject" => reject, Does::Decide;
}

struct ApprovalRow {
    id: String,
    state: &'static str,
    pending: bool,
    asked_by: String,
    what: String,
    runs: usize,
    expires: String,
    decided: String,
}

#[derive(Template)]
#[template(path = "approvals.html")]
struct ApprovalsPage {
    chrome: Chrome,
    approvals: Vec<ApprovalRow>,
}

async fn approvals(state: web::Data<State>, request: HttpRequest) -> HttpResponse {
    let client = pages::or_return!(pages::client(&state, &request));
    let all = match client.approvals().await {
        Ok(all) => all,
        Err(e) => {
            return pages::error_page(&request, StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
    };
    let now = ax_bus::time::now();
    // A caller of single namespaces sees the approvals whose plans stay within them.
    let who = pages::caller(&request).principal;
    let mut rows: Vec<ApprovalRow> = all
        .iter()
        .filter(|a| who.holds(Role::Viewer, a.namespaces()).is_ok())
        .map(|a| {
            let pending = a.pending_at(now);
            let state = if a.state == ApprovalState::Pending && !pending {
                ApprovalState::Expired
            } else {
                a.state
            };
            ApprovalRow {
                id: a.id.to_string(),
                state: state.as_str(),
                pending,
                asked_by: a.requested_by.name.clone(),
                what: a.describe(),
                runs: a.plan.iter().filter(|s| s.will_run).count(),
                expires: ax_bus::time::rfc3339(a.expires_at),
                decided: match (&a.decided_by, &a.reason) {
                    (Some(by), Some(reason)) => format!("{by}: {reason}"),
                    (Some(by), None) => by.clone(),
                    _ => String::new(),
                },
            }
        })
        .collect();
    rows.sort_by_key(|r| !r.pending);
    let chrome = Chrome::of(&pages::caller(&request), "approvals");
    pages::html(
        StatusCode::OK,
        &ApprovalsPage {
            chrome,
            approvals: rows,
        },
    )
}

fn approval_id(text: &str) -> Result<ApprovalId, Problem> {
    ApprovalId::parse(text).map_err(|e| Problem::Malformed(format!("id: {e}")))
}

async fn decide(state: &State, request: ApprovalRequest) -> Result<Approvals, Problem> {
    actions::approval(crate::api::client(state)?, &request).await
}

async fn approve(state: web::Data<State>, id: web::Path<String>) -> HttpResponse {
    let decided = match approval_id(&id) {
        Ok(id) => decide(&state, ApprovalRequest::Approve { id }).await,
        Err(e) => Err(e),
    };
    pages::replied(decided)
}

#[derive(Debug, Deserialize)]
struct RejectForm {
    #[serde(default)]
    reason: String,
}

async fn reject(
    state: web::Data<State>,
    id: web::Path<String>,
    form: web::Form<RejectForm>,
) -> HttpResponse {
    let decided = match approval_id(&id) {
        Ok(id) => {
            let reason = form.reason.trim().to_string();
            decide(&state, ApprovalRequest::Reject { id, reason }).await
        }
        Err(e) => Err(e),
    };
    pages::replied(decided)
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AuditQuery {
    since: Option<String>,
    actor: Option<String>,
    action: Option<String>,
}

struct AuditRow {
    at: String,
    actor: String,
    role: String,
    via: String,
    action: String,
    outcome: &'static str,
    approval: String,
    message: String,
}

#[derive(Template)]
#[template(path = "audit.html")]
struct AuditPage {
    chrome: Chrome,
    since: String,
    actor: String,
    action: String,
    shown: usize,
    total: usize,
    records: Vec<AuditRow>,
}

async fn audit(
    state: web::Data<State>,
    request: HttpRequest,
    query: web::Query<AuditQuery>,
) -> HttpResponse {
    let client = pages::or_return!(pages::client(&state, &request));
    let since_text = query
        .since
        .clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "24h".into());
    let since = match ax_bus::time::parse_since(&since_text) {
        Ok(since) => since,
        Err(e) => {
            return pages::error_page(&request, StatusCode::BAD_REQUEST, format!("since: {e}"))
        }
    };
    let actor = query.actor.clone().unwrap_or_default();
    let action = query.action.clone().unwrap_or_default();
    let records = match client.audit_since(since).await {
        Ok(records) => records,
        Err(e) => {
            return pages::error_page(&request, StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
    };
    let kept: Vec<_> = records
        .into_iter()
        .filter(|r| actor.is_empty() || r.actor == actor)
        .filter(|r| action.is_empty() || r.action == action)
        .collect();
    let total = kept.len();
    let rows: Vec<AuditRow> = kept
        .into_iter()
        .rev()
        .take(AUDIT_ROWS)
        .map(|r| AuditRow {
            at: ax_bus::time::rfc3339(r.at),
            actor: r.actor,
            role: r.role.to_string(),
            via: r.via.to_string(),
            action: if r.dry_run {
                format!("{} (dry run)", r.action)
            } else {
                r.action
            },
            outcome: r.outcome.as_str(),
            approval: match (r.approval, r.approved_by) {
                (Some(id), Some(by)) => format!("{id} by {by}"),
                (Some(id), None) => id.to_string(),
                _ => String::new(),
            },
            message: r.message,
        })
        .collect();
    let chrome = Chrome::of(&pages::caller(&request), "audit");
    pages::html(
        StatusCode::OK,
        &AuditPage {
            chrome,
            since: since_text,
            actor,
            action,
            shown: rows.len(),
            total,
            records: rows,
        },
    )
}
