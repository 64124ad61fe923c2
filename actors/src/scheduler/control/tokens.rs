//! `ax.control.auth`: making, listing and revoking API tokens ([`ax_bus::auth::token`]).
//!
//! Every change is a compare-and-swap on the token's entry, so two admins making the same
//! name at once get one token and one refusal, and a revocation cannot be undone by a
//! concurrent create. The first admin token (`bootstrap`) is made once: a marker is created
//! first, and a second bootstrap — or one while any admin token exists — is refused.

use chrono::{DateTime, Utc};

use ax_bus::auth::token::TokenRecord;
use ax_bus::auth::Role;
use ax_bus::ids::{Namespace, TokenName};
use ax_bus::messages::typed::Tokens;
use ax_bus::messages::AuthRequest;

use super::caller::Caller;
use super::CommandError;
use crate::scheduler::store::TokenStore;

/// Carries out an `auth` command.
pub(crate) async fn handle(
    store: &impl TokenStore,
    caller: &Caller,
    request: AuthRequest,
) -> Result<Tokens, CommandError> {
    match request {
        AuthRequest::Bootstrap { name, hash } => bootstrap(store, name, hash).await,
        AuthRequest::Create {
            name,
            role,
            namespaces,
            hash,
            expires_at,
        } => {
            let grant = Grant { role, namespaces };
            create(store, caller, name, grant, hash, expires_at).await
        }
        AuthRequest::List => {
            let tokens = store.tokens().await?;
            Ok(Tokens {
                message: format!("{} tokens", tokens.len()),
                tokens: tokens.iter().map(TokenRecord::listed).collect(),
                ..Tokens::default()
            })
        }
        AuthRequest::Revoke { name } => revoke(store, caller, name).await,
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
    store: &impl TokenStore,
    name: TokenName,
    hash: String,
) -> Result<Tokens, CommandError> {
    checked_hash(&hash)?;
    let already = || {
        CommandError::refused(
            "ax auth bootstrap was run already; an admin makes tokens with ax auth token create",
        )
    };
    let admins = store
        .tokens()
        .await?
        .into_iter()
        .any(|t| t.role == Some(Role::Admin) && t.revoked_at.is_none());
    if admins || !store.mark_bootstrap().await? {
        return Err(already());
    }
    let grant = Grant {
        role: Role::Admin,
        namespaces: Vec::new(),
    };
    store_new(store, &name, &grant, hash, "bootstrap", None).await?;
    Ok(Tokens {
        message: format!("admin token `{name}` made"),
        ..Tokens::default()
    })
}

/// What a new token may do: `role` everywhere, or in `namespaces` only.
struct Grant {
    role: Role,
    namespaces: Vec<Namespace>,
}

async fn create(
    store: &impl TokenStore,
    caller: &Caller,
    name: TokenName,
    grant: Grant,
    hash: String,
    expires_at: Option<DateTime<Utc>>,
) -> Result<Tokens, CommandError> {
    checked_hash(&hash)?;
    if expires_at.is_some_and(|at| at <= ax_bus::time::now()) {
        return Err(CommandError::refused("expires: must be in the future"));
    }
    let by = &caller.principal.name;
    store_new(store, &name, &grant, hash, by, expires_at).await?;
    let role = grant.role;
    Ok(Tokens {
        message: match grant.namespaces.as_slice() {
            [] => format!("{role} token `{name}` made"),
            namespaces => format!(
                "token `{name}` made, {role} in {}",
                namespaces
                    .iter()
                    .map(Namespace::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
        ..Tokens::default()
    })
}

/// Stores a new token under `name`: a name never used, or a revoked token's.
async fn store_new(
    store: &impl TokenStore,
    name: &TokenName,
    grant: &Grant,
    hash: String,
    created_by: &str,
    expires_at: Option<DateTime<Utc>>,
) -> Result<(), CommandError> {
    let scoped = !grant.namespaces.is_empty();
    let record = TokenRecord {
        name: name.clone(),
        role: (!scoped).then_some(grant.role),
        namespaces: grant
            .namespaces
            .iter()
            .map(|namespace| (namespace.clone(), grant.role))
            .collect(),
        hash,
        created_at: ax_bus::time::now(),
        created_by: created_by.to_string(),
        expires_at,
        revoked_at: None,
        revoked_by: None,
    };
    let taken = || CommandError::refused(format!("name: a token `{name}` exists; revoke it first"));
    let over = match store.token(name).await? {
        None => None,
        Some((old, revision)) if old.revoked_at.is_some() => Some(revision),
        Some(_) => return Err(taken()),
    };
    // Written meanwhile by a create of the same name: one of the two is refused.
    if !store.put_token(&record, over).await? {
        return Err(taken());
    }
    Ok(())
}

async fn revoke(
    store: &impl TokenStore,
    caller: &Caller,
    name: TokenName,
) -> Result<Tokens, CommandError> {
    loop {
        let Some((mut record, revision)) = store.token(&name).await? else {
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
        // Written meanwhile (a second revocation): read it again.
        if store.put_token(&record, Some(revision)).await? {
            return Ok(Tokens {
                message: format!("token `{name}` revoked"),
                ..Tokens::default()
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use ax_bus::auth::{Principal, Via};

    use super::*;
    use crate::scheduler::store::memory::Keys;

    const HASH: &str = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8";

    fn admin() -> Caller {
        Caller {
            principal: Principal::token(&name("root"), Some(Role::Admin), Default::default()),
            via: Via::Cli,
        }
    }

    fn name(text: &str) -> TokenName {
        TokenName::parse(text).unwrap()
    }

    fn make(token: &str, role: Role) -> AuthRequest {
        AuthRequest::Create {
            name: name(token),
            role,
            namespaces: Vec::new(),
            hash: HASH.into(),
            expires_at: None,
        }
    }

    async fn refused(store: &Keys, request: AuthRequest) -> String {
        match handle(store, &admin(), request).await {
            Err(CommandError::Refused(why)) => why.join("; "),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[tokio::test]
    async fn bootstrap_makes_one_admin_token_once() {
        let keys = Keys::default();
        let first = AuthRequest::Bootstrap {
            name: name("root"),
            hash: HASH.into(),
        };
        let made = handle(&keys, &admin(), first.clone()).await.unwrap();
        assert_eq!(made.message, "admin token `root` made");
        let (root, _) = keys.token(&name("root")).await.unwrap().unwrap();
        assert_eq!(
            (root.role, root.created_by.as_str()),
            (Some(Role::Admin), "bootstrap")
        );
        assert!(refused(&keys, first).await.contains("was run already"));
        // The marker alone refuses a second bootstrap, even with the admin token revoked.
        keys.tokens.lock().unwrap().clear();
        let again = AuthRequest::Bootstrap {
            name: name("other"),
            hash: HASH.into(),
        };
        assert!(refused(&keys, again).await.contains("was run already"));
    }

    #[tokio::test]
    async fn a_bad_hash_or_a_past_expiry_is_refused_naming_its_field() {
        let keys = Keys::default();
        let short = AuthRequest::Create {
            name: name("ci"),
            role: Role::Operator,
            namespaces: Vec::new(),
            hash: "abc".into(),
            expires_at: None,
        };
        assert!(refused(&keys, short).await.starts_with("hash: "));
        let upper = AuthRequest::Create {
            name: name("ci"),
            role: Role::Operator,
            namespaces: Vec::new(),
            hash: HASH.to_uppercase(),
            expires_at: None,
        };
        assert!(refused(&keys, upper).await.starts_with("hash: "));
        let past = AuthRequest::Create {
            name: name("ci"),
            role: Role::Operator,
            namespaces: Vec::new(),
            hash: HASH.into(),
            expires_at: Some(ax_bus::time::now() - chrono::Duration::seconds(1)),
        };
        assert!(refused(&keys, past).await.starts_with("expires: "));
        assert!(keys.tokens.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_name_is_taken_until_its_token_is_revoked() {
        let keys = Keys::default();
        let made = handle(&keys, &admin(), make("ci", Role::Operator))
            .await
            .unwrap();
        assert_eq!(made.message, "operator token `ci` made");
        assert_eq!(
            keys.token(&name("ci")).await.unwrap().unwrap().0.created_by,
            "root"
        );
        assert!(refused(&keys, make("ci", Role::Viewer))
            .await
            .contains("a token `ci` exists"));
        let revoke = AuthRequest::Revoke { name: name("ci") };
        let revoked = handle(&keys, &admin(), revoke.clone()).await.unwrap();
        assert_eq!(revoked.message, "token `ci` revoked");
        let (record, _) = keys.token(&name("ci")).await.unwrap().unwrap();
        assert_eq!(record.revoked_by.as_deref(), Some("root"));
        // Revoking twice is answered, not refused; the name is free again.
        let again = handle(&keys, &admin(), revoke).await.unwrap();
        assert_eq!(again.message, "token `ci` was revoked already");
        handle(&keys, &admin(), make("ci", Role::Viewer))
            .await
            .unwrap();
        let listed = handle(&keys, &admin(), AuthRequest::List).await.unwrap();
        assert_eq!(listed.tokens.len(), 1);
        assert_eq!(listed.tokens[0].role, Some(Role::Viewer));
        assert!(
            listed.tokens[0].hash.is_empty(),
            "a listing never shows a hash"
        );
    }

    #[tokio::test]
    async fn a_token_of_namespaces_holds_its_role_there_and_none_everywhere() {
        let keys = Keys::default();
        let request = AuthRequest::Create {
            name: name("pay-ops"),
            role: Role::Operator,
            namespaces: vec!["payments".parse().unwrap(), "ledger".parse().unwrap()],
            hash: HASH.into(),
            expires_at: None,
        };
        let made = handle(&keys, &admin(), request).await.unwrap();
        assert_eq!(
            made.message,
            "token `pay-ops` made, operator in payments, ledger"
        );
        let (record, _) = keys.token(&name("pay-ops")).await.unwrap().unwrap();
        assert_eq!(record.role, None);
        let roles: Vec<(&str, Role)> = record
            .namespaces
            .iter()
            .map(|(ns, role)| (ns.as_str(), *role))
            .collect();
        assert_eq!(
            roles,
            [("ledger", Role::Operator), ("payments", Role::Operator)]
        );
        // Stored without a role everywhere: a node before namespaces cannot read it, and
        // takes the token as invalid rather than as an operator's of every namespace.
        let stored = serde_json::to_value(&record).unwrap();
        assert!(stored.get("role").is_none(), "{stored}");
    }

    #[tokio::test]
    async fn revoking_an_unknown_token_is_refused() {
        let keys = Keys::default();
        let why = refused(&keys, AuthRequest::Revoke { name: name("nope") }).await;
        assert_eq!(why, "no token named `nope`");
    }
}
