//! `ax.control.auth`: making, listing and revoking API tokens ([`ax_bus::auth::token`]).
//!
//! Every change is a compare-and-swap on the token's entry, so two admins making the same
//! name at once get one token and one refusal, and a revocation cannot be undone by a
//! concurrent create. The first admin token (`bootstrap`) is made once: a marker is created
//! first, and a second bootstrap — or one while any admin token exists — is refused.

use async_nats::jetstream::kv::{CreateErrorKind, UpdateErrorKind};
use chrono::{DateTime, Utc};

use ax_bus::auth::token::TokenRecord;
use ax_bus::auth::Role;
use ax_bus::client::auth::BOOTSTRAP_KEY;
use ax_bus::codec;
use ax_bus::error::NatsError;
use ax_bus::ids::TokenName;
use ax_bus::messages::typed::Tokens;
use ax_bus::messages::AuthRequest;
use ax_bus::AxClient;

use super::caller::Caller;
use super::CommandError;
use crate::ActorError;

/// Carries out an `auth` command.
pub(crate) async fn handle(
    client: &AxClient,
    caller: &Caller,
    request: AuthRequest,
) -> Result<Tokens, CommandError> {
    match request {
        AuthRequest::Bootstrap { name, hash } => bootstrap(client, name, hash).await,
        AuthRequest::Create {
            name,
            role,
            hash,
            expires_at,
        } => create(client, caller, name, role, hash, expires_at).await,
        AuthRequest::List => {
            let tokens = client.token_records().await?;
            Ok(Tokens {
                message: format!("{} tokens", tokens.len()),
                tokens: tokens.iter().map(TokenRecord::listed).collect(),
                ..Tokens::default()
            })
        }
        AuthRequest::Revoke { name } => revoke(client, caller, name).await,
    }
}

fn checked_hash(hash: &str) -> Result<(), CommandError> {
    let ok = hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if ok {
        Ok(())
    } else {
        Err(CommandError::refused(
            "hash: must be the SHA-256 of the secret, 64 lowercase hex digits",
        ))
    }
}

async fn bootstrap(
    client: &AxClient,
    name: TokenName,
    hash: String,
) -> Result<Tokens, CommandError> {
    checked_hash(&hash)?;
    let already = || {
        CommandError::refused(
            "ax auth bootstrap was run already; an admin makes tokens with ax auth token create",
        )
    };
    let admins = client
        .token_records()
        .await?
        .into_iter()
        .any(|t| t.role == Role::Admin && t.revoked_at.is_none());
    if admins {
        return Err(already());
    }
    match client.tokens.create(BOOTSTRAP_KEY, "1".into()).await {
        Ok(_) => {}
        Err(e) if e.kind() == CreateErrorKind::AlreadyExists => return Err(already()),
        Err(e) => return Err(ActorError::from(NatsError::new("mark bootstrap", e)).into()),
    }
    store_new(client, &name, Role::Admin, hash, "bootstrap", None).await?;
    Ok(Tokens {
        message: format!("admin token `{name}` made"),
        ..Tokens::default()
    })
}

async fn create(
    client: &AxClient,
    caller: &Caller,
    name: TokenName,
    role: Role,
    hash: String,
    expires_at: Option<DateTime<Utc>>,
) -> Result<Tokens, CommandError> {
    checked_hash(&hash)?;
    if expires_at.is_some_and(|at| at <= ax_bus::time::now()) {
        return Err(CommandError::refused("expires: must be in the future"));
    }
    store_new(
        client,
        &name,
        role,
        hash,
        &caller.principal.name,
        expires_at,
    )
    .await?;
    Ok(Tokens {
        message: format!("{role} token `{name}` made"),
        ..Tokens::default()
    })
}

/// Stores a new token under `name`: a name never used, or a revoked token's.
async fn store_new(
    client: &AxClient,
    name: &TokenName,
    role: Role,
    hash: String,
    created_by: &str,
    expires_at: Option<DateTime<Utc>>,
) -> Result<(), CommandError> {
    let record = TokenRecord {
        name: name.clone(),
        role,
        hash,
        created_at: ax_bus::time::now(),
        created_by: created_by.to_string(),
        expires_at,
        revoked_at: None,
        revoked_by: None,
    };
    let payload = codec::encode(&record)?;
    let taken = || CommandError::refused(format!("name: a token `{name}` exists; revoke it first"));
    match client.token_record(name).await? {
        None => match client.tokens.create(name.as_str(), payload).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Err(taken()),
            Err(e) => {
                Err(ActorError::from(NatsError::new(format!("store token {name}"), e)).into())
            }
        },
        Some((old, revision)) if old.revoked_at.is_some() => {
            match client.tokens.update(name.as_str(), payload, revision).await {
                Ok(_) => Ok(()),
                Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Err(taken()),
                Err(e) => {
                    Err(ActorError::from(NatsError::new(format!("store token {name}"), e)).into())
                }
            }
        }
        Some(_) => Err(taken()),
    }
}

async fn revoke(
    client: &AxClient,
    caller: &Caller,
    name: TokenName,
) -> Result<Tokens, CommandError> {
    loop {
        let Some((mut record, revision)) = client.token_record(&name).await? else {
            return Err(CommandError::refused(format!("no token named `{name}`")));
        };
        if record.revoked_at.is_some() {
            return Ok(Tokens {
                message: format!("token `{name}` was revoked already"),
                ..Tokens::default()
            });
        }
        record.revoked_at = Some(ax_bus::time::now());
        record.revoked_by = Some(caller.principal.name.clone());
        match client
            .tokens
            .update(name.as_str(), codec::encode(&record)?, revision)
            .await
        {
            Ok(_) => {
                return Ok(Tokens {
                    message: format!("token `{name}` revoked"),
                    ..Tokens::default()
                })
            }
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => continue,
            Err(e) => {
                return Err(
                    ActorError::from(NatsError::new(format!("revoke token {name}"), e)).into(),
                )
            }
        }
    }
}
