//! Signing in and out of the console (with `[auth]` on): a token pasted once opens a session
//! ([`crate::session`]); the token is checked as any bearer token is, and a wrong one is told
//! in one line that never repeats it.

use std::time::Instant;

use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use serde::Deserialize;

use ax_bus::auth::token::Token;
use ax_bus::auth::Role;
use ax_bus::client::auth::CheckError;

use crate::access::Denied;
use crate::changes::{changes, Does};
use crate::pages::{self, Chrome, Outcome};
use crate::server::State;
use crate::session;

pub(crate) fn routes(config: &mut web::ServiceConfig) {
    config.route("/login", web::get().to(page));
}

changes! {
    // Anyone may sign in (the check lets the login through); signing out changes nothing.
    POST "/login" => sign_in, Does::Nothing(Role::Viewer);
    POST "/logout" => sign_out, Does::Nothing(Role::Viewer);
}

#[derive(Template)]
#[template(path = "login.html")]
struct Login {
    chrome: Chrome,
}

async fn page(request: HttpRequest) -> HttpResponse {
    let chrome = Chrome::of(&pages::caller(&request), "login");
    pages::html(StatusCode::OK, &Login { chrome })
}

#[derive(Debug, Deserialize)]
struct SignIn {
    token: String,
}

async fn sign_in(
    state: web::Data<State>,
    request: HttpRequest,
    form: web::Form<SignIn>,
) -> HttpResponse {
    let refused = |status, text: String| pages::html(status, &Outcome::failed(text));
    let throttle = &state.gate.throttle;
    let peer = request.peer_addr().map(|a| a.ip());
    if let Some(wait) = peer.and_then(|peer| throttle.wait(peer, Instant::now())) {
        let mut response = refused(
            StatusCode::TOO_MANY_REQUESTS,
            Denied::Throttled(wait).to_string(),
        );
        response.headers_mut().insert(
            header::RETRY_AFTER,
            header::HeaderValue::from(wait.as_secs().max(1)),
        );
        return response;
    }
    let wrong = |text: String| {
        if let Some(peer) = peer {
            throttle.failed(peer, Instant::now());
        }
        refused(StatusCode::UNAUTHORIZED, text)
    };
    let token = match Token::parse(&form.token) {
        Ok(token) => token,
        Err(e) => return wrong(e.to_string()),
    };
    let Some(client) = &state.gate.client else {
        return refused(
            StatusCode::SERVICE_UNAVAILABLE,
            "this node has no NATS connection".into(),
        );
    };
    match client.check_token(Some(&token)).await {
        Ok(who) => {
            if let Some(peer) = peer {
                throttle.succeeded(peer);
            }
            let id = state.gate.sessions.open(token);
            tracing::info!(who = %who.name, roles = %who.roles(), "signed in to the console");
            HttpResponse::Ok()
                .cookie(session::cookie(&id))
                .insert_header(("HX-Redirect", "/"))
                .content_type("text/html; charset=utf-8")
                .body(format!("signed in as {}", who.name))
        }
        Err(CheckError::Token(e)) => wrong(e.to_string()),
        Err(CheckError::Client(e)) => refused(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn sign_out(state: web::Data<State>, request: HttpRequest) -> HttpResponse {
    state.gate.sessions.close(request.headers());
    HttpResponse::Ok()
        .cookie(session::cookie(""))
        .insert_header(("HX-Redirect", "/login"))
        .finish()
}
