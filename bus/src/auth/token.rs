//! API tokens: `axt_<name>_<64 hex digits>`.
//!
//! Whoever asks for a token generates it ([`Token::generate`]) and sends only its hash
//! (SHA-256 of the secret part, which is 256 random bits — a slow password hash buys nothing
//! there); the Scheduler stores the hash under the name in the tokens bucket. The secret is
//! printed once to whoever asked and never crosses the wire again except as a caller's
//! credential. A presented token is checked by hashing it and comparing the hashes in constant
//! time, so how long a wrong token takes does not depend on how much of it was right. A
//! revoked token stays in the bucket, marked, so its name cannot be taken over by accident
//! and the listing says when and by whom it was revoked.

use std::fmt;

use chrono::{DateTime, Utc};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use std::collections::BTreeMap;

use super::{Principal, Role};
use crate::ids::{Namespace, TokenName};

const PREFIX: &str = "axt_";
const SECRET_HEX: usize = 64;

/// A token's secret text, and the name it claims. Its `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    text: String,
    name: TokenName,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({}, ***)", self.name)
    }
}

/// Why a presented token grants nothing. No variant holds the secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// None was sent while auth is on.
    #[error("no token: auth is on (set AX_TOKEN or --token-file)")]
    Missing,
    /// Not of the form `axt_<name>_<64 hex digits>`.
    #[error("malformed token (expected axt_<name>_<64 hex digits>)")]
    Malformed,
    /// No token by that name, or the secret does not match.
    #[error("token `{0}` is not valid")]
    Invalid(String),
    /// Revoked.
    #[error("token `{0}` was revoked")]
    Revoked(String),
    /// Past its expiry.
    #[error("token `{name}` expired at {at}")]
    Expired {
        /// Its name.
        name: String,
        /// When it expired.
        at: String,
    },
}

impl Token {
    /// A new token named `name`, and the hash to store for it.
    pub fn generate(name: &TokenName) -> (Token, String) {
        let mut bytes = [0u8; SECRET_HEX / 2];
        rand::rng().fill_bytes(&mut bytes);
        let secret: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let hash = hash(&secret);
        let token = Token {
            text: format!("{PREFIX}{name}_{secret}"),
            name: name.clone(),
        };
        (token, hash)
    }

    /// A token as presented (header, file, environment), checked for its form only.
    pub fn parse(text: &str) -> Result<Token, TokenError> {
        let text = text.trim();
        let (name, _) = Self::split(text)?;
        Ok(Token {
            text: text.to_string(),
            name,
        })
    }

    /// The name and the secret.
    fn split(text: &str) -> Result<(TokenName, &str), TokenError> {
        let rest = text.strip_prefix(PREFIX).ok_or(TokenError::Malformed)?;
        let (name, secret) = rest.rsplit_once('_').ok_or(TokenError::Malformed)?;
        let name = TokenName::parse(name).map_err(|_| TokenError::Malformed)?;
        if secret.len() != SECRET_HEX
            || !secret
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(TokenError::Malformed);
        }
        Ok((name, secret))
    }

    /// The name it claims (to look its record up).
    pub fn name(&self) -> &TokenName {
        &self.name
    }

    /// The text to send (a header value, the file's content).
    pub fn expose(&self) -> &str {
        &self.text
    }

    /// Whether `record` is this token's and grants its roles at `now`: the caller it proves.
    pub fn check(
        &self,
        record: Option<&TokenRecord>,
        now: DateTime<Utc>,
    ) -> Result<Principal, TokenError> {
        let (name, secret) = Self::split(&self.text)?;
        let presented = hash(secret);
        // Compared even when there is no record, against a hash nothing matches, so an unknown
        // name costs what a wrong secret does.
        let stored = record.map_or(NO_HASH, |r| r.hash.as_str());
        let matches = bool::from(presented.as_bytes().ct_eq(stored.as_bytes()));
        let record = match record {
            Some(record) if matches && record.name == name => record,
            _ => return Err(TokenError::Invalid(name.to_string())),
        };
        if record.revoked_at.is_some() {
            return Err(TokenError::Revoked(name.to_string()));
        }
        if let Some(at) = record.expires_at {
            if at <= now {
                return Err(TokenError::Expired {
                    name: name.to_string(),
                    at: crate::time::rfc3339(at),
                });
            }
        }
        Ok(Principal::token(
            &name,
            record.role,
            record.namespaces.clone(),
        ))
    }
}

impl TokenRecord {
    /// The record as a listing shows it: everything but the hash.
    pub fn listed(&self) -> TokenRecord {
        TokenRecord {
            hash: String::new(),
            ..self.clone()
        }
    }
}

/// A hash no secret has (of the right length, so the comparison takes as long).
const NO_HASH: &str = "----------------------------------------------------------------";

/// The stored form of a secret: SHA-256, hex.
pub fn hash(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A token as the tokens bucket holds it (under its name), and as listings show it, without
/// its hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Its name.
    pub name: TokenName,
    /// What it may do in every namespace; none for a token scoped to namespaces (left out,
    /// so that a node of a version before namespaces cannot read it and takes the token as
    /// invalid, never as one of every namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// What it may do in single namespaces.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub namespaces: BTreeMap<Namespace, Role>,
    /// SHA-256 of its secret, hex; empty (and left out) in listings ([`TokenRecord::listed`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hash: String,
    /// When it was made.
    #[serde(with = "crate::time::wire")]
    pub created_at: DateTime<Utc>,
    /// Who made it (a token's name; `bootstrap` for the first).
    pub created_by: String,
    /// When it stops working.
    #[serde(default, with = "crate::time::wire_opt")]
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was revoked.
    #[serde(default, with = "crate::time::wire_opt")]
    pub revoked_at: Option<DateTime<Utc>>,
    /// Who revoked it.
    #[serde(default)]
    pub revoked_by: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &TokenName, hash: String) -> TokenRecord {
        TokenRecord {
            name: name.clone(),
            role: Some(Role::Operator),
            namespaces: BTreeMap::new(),
            hash,
            created_at: crate::time::now(),
            created_by: "test".into(),
            expires_at: None,
            revoked_at: None,
            revoked_by: None,
        }
    }

    #[test]
    fn a_generated_token_checks_against_its_hash_only() {
        let name = TokenName::parse("ci-bot").unwrap();
        let (token, stored) = Token::generate(&name);
        assert!(token.expose().starts_with("axt_ci-bot_"));
        assert_eq!(format!("{token:?}"), "Token(ci-bot, ***)");
        let now = crate::time::now();
        let good = record(&name, stored);
        assert_eq!(
            token.check(Some(&good), now).map(|who| who.role),
            Ok(Some(Role::Operator))
        );
        let (other, _) = Token::generate(&name);
        assert_eq!(
            other.check(Some(&good), now),
            Err(TokenError::Invalid("ci-bot".into()))
        );
        assert_eq!(
            token.check(None, now),
            Err(TokenError::Invalid("ci-bot".into()))
        );
        let revoked = TokenRecord {
            revoked_at: Some(now),
            ..good.clone()
        };
        assert_eq!(
            token.check(Some(&revoked), now),
            Err(TokenError::Revoked("ci-bot".into()))
        );
        let expired = TokenRecord {
            expires_at: Some(now),
            ..good
        };
        assert!(matches!(
            token.check(Some(&expired), now),
            Err(TokenError::Expired { .. })
        ));
    }

    #[test]
    fn malformed_tokens_are_refused_without_echoing_them() {
        for bad in [
            "",
            "axt_",
            "axt_x_short",
            "bearer axt_a_00",
            "axt_Upper_0000000000000000000000000000000000000000000000000000000000000000",
            "axt_a_000000000000000000000000000000000000000000000000000000000000000g",
        ] {
            let err = Token::parse(bad).unwrap_err();
            assert_eq!(err, TokenError::Malformed, "{bad}");
            assert!(!err.to_string().contains("0000"));
        }
    }
}
