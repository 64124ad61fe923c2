//! Console logins: a browser that signed in with a token holds a random session id in an
//! `HttpOnly`, `SameSite=Strict` cookie; the token stays on the server, in memory, and is
//! checked again against the tokens bucket on every request (a revoked token ends its sessions
//! at once). Sessions live 12 hours and belong to the node that made them: behind a load
//! balancer, pin a browser to one console node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::cookie::{Cookie, SameSite};
use actix_web::http::header::HeaderMap;
use rand::RngCore;

use ax_bus::auth::token::Token;

/// The cookie holding a browser's session id.
pub const COOKIE: &str = "ax_session";
/// How long a session lasts.
const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// The most sessions kept (the oldest go first beyond it).
const MOST: usize = 10_000;

/// The sessions of this node.
#[derive(Clone, Debug, Default)]
pub struct Sessions(Arc<Mutex<HashMap<String, (Token, Instant)>>>);

impl Sessions {
    /// A new session for `token`; its id.
    pub fn open(&self, token: Token) -> String {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        map.retain(|_, (_, until)| *until > now);
        if map.len() >= MOST {
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, (_, until))| *until)
                .map(|(id, _)| id.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(id.clone(), (token, now + LIFETIME));
        id
    }

    /// The token of the request's session, if it has a live one.
    pub fn token(&self, headers: &HeaderMap) -> Option<Token> {
        let id = session_id(headers)?;
        let map = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        map.get(&id)
            .filter(|(_, until)| *until > Instant::now())
            .map(|(token, _)| token.clone())
    }

    /// Ends the request's session.
    pub fn close(&self, headers: &HeaderMap) {
        if let Some(id) = session_id(headers) {
            let mut map = self
                .0
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            map.remove(&id);
        }
    }
}

/// The session id of the request's cookie.
fn session_id(headers: &HeaderMap) -> Option<String> {
    crate::csrf::cookie_value(headers, COOKIE)
}

/// The cookie giving a browser session `id`, or (with an empty id) ending it.
pub fn cookie(id: &str) -> Cookie<'static> {
    let mut cookie = Cookie::build(COOKIE, id.to_string())
        .path("/")
        .http_only(true)
        .same_site(SameSite::Strict)
        .finish();
    if id.is_empty() {
        cookie.make_removal();
    }
    cookie
}
