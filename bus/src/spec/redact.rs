//! What of a spec may be shown: secrets in URLs and headers redacted.
//!
//! A job's URL may carry `user:password@`, and its headers an API key; both reach logs,
//! failure messages and `ax job get` unless taken out. Shown, a URL's password becomes `***`,
//! and so does the value of a header whose name says it holds a secret (`Authorization`,
//! `Cookie`, anything with `token`, `key`, `secret`, `password` or `auth`). Better still, a job
//! takes such a header from the worker's environment (`exec.header_env`) and the spec never
//! holds it.

use super::{ExecSpec, JobSpec};

/// What a redacted value shows.
pub const REDACTED: &str = "***";

/// `url` with its password, if any, as `***`.
pub fn url(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let authority_end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    let Some(at) = url[start..authority_end].rfind('@').map(|i| start + i) else {
        return url.to_string();
    };
    match url[start..at].find(':').map(|i| start + i) {
        Some(colon) => format!("{}:{REDACTED}{}", &url[..colon], &url[at..]),
        None => url.to_string(),
    }
}

/// Whether a header of that name holds a secret.
pub fn is_secret_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name == "cookie"
        || ["auth", "token", "key", "secret", "password", "session"]
            .iter()
            .any(|word| name.contains(word))
}

/// `spec` as it may be shown.
pub fn spec(spec: &JobSpec) -> JobSpec {
    let mut shown = spec.clone();
    if let ExecSpec::Http(http) = &mut shown.exec {
        http.url = url(&http.url);
        for (name, value) in http.headers.iter_mut() {
            if is_secret_header(name) {
                *value = REDACTED.to_string();
            }
        }
    }
    shown
}

/// The first field of `spec` that holds a redacted value (`***`) rather than a secret: a
/// document copied from `ax job get` or the console, which must not be applied as it is (the
/// secret would become `***`).
pub fn redacted_field(spec: &JobSpec) -> Option<String> {
    let ExecSpec::Http(http) = &spec.exec else {
        return None;
    };
    if http.url.contains(&format!(":{REDACTED}@")) {
        return Some("job.exec.url".into());
    }
    http.headers
        .iter()
        .find(|(name, value)| is_secret_header(name) && value.as_str() == REDACTED)
        .map(|(name, _)| format!("job.exec.headers.{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redacted_document_is_told_from_one_with_its_secrets() {
        let mut job: JobSpec = serde_json::from_value(serde_json::json!({
            "name": "call", "timezone": "UTC",
            "exec": {"type": "http", "url": "https://u:pw@example.com/",
                     "headers": {"X-Api-Key": "k", "Accept": "***"}},
        }))
        .unwrap();
        assert_eq!(redacted_field(&job), None);
        let shown = spec(&job);
        assert_eq!(redacted_field(&shown).as_deref(), Some("job.exec.url"));
        if let ExecSpec::Http(http) = &mut job.exec {
            http.headers.insert("X-Api-Key".into(), REDACTED.into());
        }
        assert_eq!(
            redacted_field(&job).as_deref(),
            Some("job.exec.headers.X-Api-Key")
        );
    }

    #[test]
    fn passwords_in_urls_are_never_shown() {
        assert_eq!(
            url("https://etl:s3cret@api.example.com/run?x=1"),
            "https://etl:***@api.example.com/run?x=1"
        );
        assert_eq!(
            url("https://api.example.com/run?to=a@b"),
            "https://api.example.com/run?to=a@b"
        );
        assert_eq!(
            url("https://etl@api.example.com/"),
            "https://etl@api.example.com/"
        );
        assert_eq!(url("postgres://u:p@w:d@db/x"), "postgres://u:***@db/x");
    }

    #[test]
    fn secret_headers_are_told_by_their_names() {
        for name in [
            "Authorization",
            "X-Api-Key",
            "Cookie",
            "X-Auth-Token",
            "Client-Secret",
        ] {
            assert!(is_secret_header(name), "{name}");
        }
        for name in ["X-Team", "Accept", "Content-Type"] {
            assert!(!is_secret_header(name), "{name}");
        }
    }
}
