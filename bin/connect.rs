//! Which NATS server a command talks to, and connecting to it.
//!
//! `--nats` and `AX_NATS_URL` win; otherwise the URL that `ax up` recorded in `./.ax/nats.url`
//! (so commands run from the folder of a local cluster find it even on a non-default port);
//! otherwise `nats://127.0.0.1:4222`.

use std::path::Path;

use anyhow::{Context, Result};

use ax_bus::auth::token::Token;
use ax_bus::auth::Via;
use ax_bus::client::{redact, AxClient, ConnectConfig};

/// The file in a data dir that records the cluster's URL.
pub(crate) const URL_FILE: &str = "nats.url";
const DEFAULT_URL: &str = "nats://127.0.0.1:4222";

/// The URL to use, and where it came from (for error messages).
pub(crate) fn resolve_url(flag: Option<&str>) -> (String, String) {
    if let Some(url) = flag {
        return (url.to_string(), "--nats / AX_NATS_URL".to_string());
    }
    let recorded = Path::new(".ax").join(URL_FILE);
    if let Ok(text) = std::fs::read_to_string(&recorded) {
        let url = text.trim();
        if !url.is_empty() {
            return (
                url.to_string(),
                format!("recorded in {}", recorded.display()),
            );
        }
    }
    (DEFAULT_URL.to_string(), "default".to_string())
}

/// Connects a CLI command; its commands carry the caller's token, if there is one.
pub(crate) async fn connect(
    flag: Option<&str>,
    prefix: &str,
    token_file: Option<&Path>,
) -> Result<AxClient> {
    let token = token(token_file)?;
    let (url, origin) = resolve_url(flag);
    let mut config = ConnectConfig::new(&url, "ax-cli");
    config.prefix = prefix.to_string();
    Ok(AxClient::connect(&config)
        .await
        .with_context(|| format!("NATS URL {} ({origin})", redact(&url)))?
        .acting_as(token, Via::Cli)
        .claiming(&crate::jobs::requested_by()))
}

/// The caller's token: `AX_TOKEN`, else the `--token-file` (`AX_TOKEN_FILE`); none when neither
/// is set. A malformed one is an error naming where it came from (never its text).
fn token(file: Option<&Path>) -> Result<Option<Token>> {
    if let Ok(text) = std::env::var("AX_TOKEN") {
        if !text.trim().is_empty() {
            return Token::parse(&text)
                .map(Some)
                .map_err(|e| anyhow::anyhow!("AX_TOKEN: {e}"));
        }
    }
    let Some(file) = file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("--token-file {}", file.display()))?;
    Token::parse(&text)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("--token-file {}: {e}", file.display()))
}
