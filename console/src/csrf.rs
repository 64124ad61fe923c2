//! Cross-site request forgery: no page of another site may make a browser change anything in
//! ax. Two independent locks on every state change (any method but `GET`, `HEAD`, `OPTIONS`):
//!
//! 1. **Origin.** A browser names the page's origin on every cross-origin state change
//!    (`Origin`, and `Sec-Fetch-Site` in current browsers): a request from another site is
//!    refused, whatever it carries. Clients that are not browsers (the CLI, scripts, a test)
//!    send neither and are not affected.
//! 2. **Token.** The console gives each browser a random token in a `SameSite=Strict` cookie and
//!    in the page (`<meta name="csrf-token">`); its script sends it back in the
//!    `X-CSRF-Token` header. A request that carries the cookie must carry the same token in
//!    the header (compared in constant time): a cookie alone proves nothing.
//!
//! A cross-site page cannot read the token (same-origin policy) nor set the header without a
//! CORS preflight, which this server never grants.

use actix_web::cookie::{Cookie, SameSite};
use actix_web::http::header::HeaderMap;
use actix_web::http::Method;
use rand::RngCore;
use subtle::ConstantTimeEq;

/// The cookie that holds a browser's token.
pub const COOKIE: &str = "ax_csrf";
/// The header a page's script sends the token back in.
pub const HEADER: &str = "x-csrf-token";

/// Why a state change was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Forged {
    /// The request comes from a page of another site.
    #[error("refused: a request from another site ({0}) may not change anything")]
    CrossSite(String),
    /// The request carries the console's cookie but not its token.
    #[error("refused: the X-CSRF-Token header is missing or does not match (reload the page)")]
    Token,
}

/// Whether a request with this method changes nothing.
pub fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Checks a request: safe methods pass; a state change must come from this server's own
/// origin (`host` is the `Host` the request was sent to) and, when it carries the cookie,
/// carry the token.
pub fn verify(method: &Method, host: &str, headers: &HeaderMap) -> Result<(), Forged> {
    if is_safe(method) {
        return Ok(());
    }
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = header("sec-fetch-site") {
        if site != "same-origin" && site != "none" {
            return Err(Forged::CrossSite(format!("Sec-Fetch-Site: {site}")));
        }
    }
    if let Some(origin) = header("origin") {
        let ours = origin
            .split_once("://")
            .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host));
        if !ours {
            return Err(Forged::CrossSite(format!("Origin: {origin}")));
        }
    }
    let Some(cookie) = cookie_token(headers) else {
        return Ok(());
    };
    let sent = header(HEADER).unwrap_or_default();
    if bool::from(sent.as_bytes().ct_eq(cookie.as_bytes())) && !cookie.is_empty() {
        Ok(())
    } else {
        Err(Forged::Token)
    }
}

/// The token of the request's cookie, if it has one.
pub fn cookie_token(headers: &HeaderMap) -> Option<String> {
    cookie_value(headers, COOKIE)
}

/// The value of the request's cookie `name`, if it has one.
pub fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(actix_web::http::header::COOKIE)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| Cookie::parse(pair.trim().to_string()).ok())
        .find(|c| c.name() == name)
        .map(|c| c.value().to_string())
}

/// A new random token (256 bits, hex).
pub fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The cookie that gives a browser `token`.
pub fn cookie(token: &str) -> Cookie<'static> {
    Cookie::build(COOKIE, token.to_string())
        .path("/")
        .http_only(true)
        .same_site(SameSite::Strict)
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn reads_pass_and_changes_need_our_origin_and_the_token_of_the_cookie() {
        let host = "127.0.0.1:8080";
        assert!(verify(
            &Method::GET,
            host,
            &headers(&[("origin", "https://evil.example")])
        )
        .is_ok());
        // A script: no cookie, no origin.
        assert!(verify(&Method::POST, host, &headers(&[])).is_ok());
        // Another site, however it is dressed.
        let evil = verify(
            &Method::POST,
            host,
            &headers(&[("origin", "https://evil.example")]),
        );
        assert!(matches!(evil, Err(Forged::CrossSite(_))));
        let sibling = verify(
            &Method::POST,
            host,
            &headers(&[("sec-fetch-site", "same-site")]),
        );
        assert!(matches!(sibling, Err(Forged::CrossSite(_))));
        // A browser of ours: the cookie needs its token.
        let cookie = format!("{COOKIE}=abc123; other=1");
        let ours = [
            ("origin", "http://127.0.0.1:8080"),
            ("cookie", cookie.as_str()),
        ];
        assert_eq!(
            verify(&Method::POST, host, &headers(&ours)),
            Err(Forged::Token)
        );
        let wrong = [ours[0], ours[1], (HEADER, "abc124")];
        assert_eq!(
            verify(&Method::DELETE, host, &headers(&wrong)),
            Err(Forged::Token)
        );
        let right = [ours[0], ours[1], (HEADER, "abc123")];
        assert!(verify(&Method::POST, host, &headers(&right)).is_ok());
        assert_eq!(new_token().len(), 64);
        assert_ne!(new_token(), new_token());
    }
}
