//! Who sent a control command, and whether they may.
//!
//! With `[auth] enabled`, a command must carry a token ([`ax_bus::auth::TOKEN_HEADER`]) that
//! the tokens bucket vouches for at this moment, of a role at least the command's
//! ([`ax_bus::auth::role_of`]); anything else is denied before a thing is read or written. The
//! one exception is `auth bootstrap`, which needs no token because it only works while no admin
//! token exists. With auth off every sender is an unverified admin, named by what it says.

use async_nats::jetstream;

use ax_bus::auth::token::{Token, TokenError};
use ax_bus::auth::{self, Principal, Role, Via};
use ax_bus::messages::commands::{Command, Request};
use ax_bus::messages::AuthRequest;

use super::scope::Scope;
use super::{CommandError, Received};
use crate::scheduler::store::TokenStore;

/// Who is acting, and through which door.
#[derive(Clone, Debug)]
pub(crate) struct Caller {
    /// Who.
    pub(crate) principal: Principal,
    /// Through which door.
    pub(crate) via: Via,
}

fn header<'m>(message: &'m jetstream::Message, name: &str) -> Option<&'m str> {
    message
        .headers
        .as_ref()
        .and_then(|h| h.get(name))
        .map(|v| v.as_str())
}

/// Who the message says sent it, before any check: its caller header (`user@host` from the
/// CLI, the served caller from the console and the API), else its `request`'s `requested_by`
/// (a sender of an earlier version, or a raw control message), else nobody (`anonymous`).
pub(crate) fn claimed(message: &jetstream::Message, request: &serde_json::Value) -> Caller {
    let said = header(message, auth::CALLER_HEADER)
        .filter(|name| !name.trim().is_empty())
        .or_else(|| request.get("requested_by").and_then(|s| s.as_str()))
        .unwrap_or_default();
    Caller {
        principal: Principal::unverified(said),
        via: Via::from_header(header(message, auth::VIA_HEADER)),
    }
}

/// What the caller check reads of a command: its kind, its request, the token it carries and
/// its name as it came.
pub(crate) struct Asked<'a> {
    pub(crate) kind: Option<Command>,
    pub(crate) request: Option<&'a Request>,
    pub(crate) token: Option<&'a str>,
    pub(crate) name: &'a str,
}

impl<'a> Asked<'a> {
    /// What `received` asks.
    pub(crate) fn of(received: &'a Received) -> Self {
        Self {
            kind: received.kind,
            request: received.request.as_ref().ok(),
            token: header(&received.message, auth::TOKEN_HEADER),
            name: received.name(),
        }
    }
}

/// Checks the caller of the command `asked` (with `[auth] enabled`) and names them in
/// `caller`; refuses one who may not. A token scoped to namespaces must hold the command's
/// role in each namespace the command touches ([`super::scope`]).
pub(crate) async fn authorize(
    (store, enabled): (&impl TokenStore, bool),
    (asked, scope): (&Asked<'_>, &Scope),
    caller: &mut Caller,
) -> Result<(), CommandError> {
    if !enabled {
        return Ok(());
    }
    if matches!(
        asked.request,
        Some(Request::Auth(AuthRequest::Bootstrap { .. }))
    ) {
        caller.principal = Principal {
            name: "bootstrap".into(),
            role: None,
            namespaces: Default::default(),
            verified: false,
        };
        return Ok(());
    }
    let token = asked.token.map(Token::parse);
    // Until proven, the caller is the name their token claims, with no rights.
    caller.principal = Principal {
        name: match &token {
            Some(Ok(token)) => token.name().to_string(),
            _ => "anonymous".into(),
        },
        role: None,
        namespaces: Default::default(),
        verified: false,
    };
    let denied = |e: TokenError| CommandError::Denied(e.to_string());
    let token = token
        .transpose()
        .map_err(denied)?
        .ok_or(TokenError::Missing)
        .map_err(denied)?;
    let record = store.token(token.name()).await?;
    caller.principal = token
        .check(record.as_ref().map(|(r, _)| r), ax_bus::time::now())
        .map_err(denied)?;
    // A command no one knows is an admin's to be told so.
    let needed = asked.kind.map_or(Role::Admin, auth::role_of);
    let who = &caller.principal;
    if who.role >= Some(needed) {
        return Ok(());
    }
    let denied = |place: String| {
        CommandError::Denied(format!(
            "`{}` needs the {needed} role{place}; token `{}` is {}",
            asked.name,
            who.name,
            who.roles()
        ))
    };
    if who.highest() < Some(needed) || asked.request.is_none() {
        return Err(denied(String::new()));
    }
    let namespaces = match scope {
        Scope::Everywhere => None,
        Scope::In(namespaces) => Some(namespaces.iter().map(String::as_str)),
    };
    who.holds(needed, namespaces)
        .map_err(|place| denied(format!(" {place}")))
}

#[cfg(test)]
mod tests {
    use ax_bus::auth::token::TokenRecord;
    use ax_bus::ids::TokenName;
    use ax_bus::messages::{JobNameRequest, TriggerRequest};

    use super::*;
    use crate::scheduler::store::memory::{Keys, Memory};

    /// A token of `role` named `name`, stored (revoked or expired as asked), and its text.
    fn made(keys: &Keys, name: &str, role: Role, change: impl Fn(&mut TokenRecord)) -> String {
        let name = TokenName::parse(name).unwrap();
        let (token, hash) = Token::generate(&name);
        let mut record = TokenRecord {
            name: name.clone(),
            role: Some(role),
            namespaces: Default::default(),
            hash,
            created_at: ax_bus::time::now(),
            created_by: "root".into(),
            expires_at: None,
            revoked_at: None,
            revoked_by: None,
        };
        change(&mut record);
        keys.tokens.lock().unwrap().insert(name, (record, 1));
        token.expose().to_string()
    }

    fn nobody() -> Caller {
        Caller {
            principal: Principal::unverified("ops@host"),
            via: Via::Cli,
        }
    }

    /// Checks `request` sent with `token` as command `kind`: the caller named, or why denied.
    async fn check(
        keys: &Memory,
        kind: Command,
        request: &Request,
        token: Option<&str>,
    ) -> Result<Principal, String> {
        let asked = Asked {
            kind: Some(kind),
            request: Some(request),
            token,
            name: kind.name(),
        };
        let mut caller = nobody();
        let scope = super::super::scope::of(keys, request).await.unwrap();
        match authorize((keys, true), (&asked, &scope), &mut caller).await {
            Ok(()) => Ok(caller.principal),
            Err(CommandError::Denied(why)) => Err(why),
            Err(other) => panic!("neither allowed nor denied: {other:?}"),
        }
    }

    fn delete() -> Request {
        Request::Delete(JobNameRequest {
            name: "etl".parse().unwrap(),
        })
    }

    fn trigger() -> Request {
        trigger_of("etl")
    }

    fn trigger_of(job: &str) -> Request {
        Request::Trigger(
            serde_json::from_value::<TriggerRequest>(serde_json::json!({ "name": job })).unwrap(),
        )
    }

    #[tokio::test]
    async fn a_token_of_a_high_enough_role_names_its_caller() {
        let keys = Memory::default();
        let ops = made(&keys.keys, "ops", Role::Operator, |_| {});
        let who = check(&keys, Command::Trigger, &trigger(), Some(&ops))
            .await
            .unwrap();
        assert_eq!(
            (who.name.as_str(), who.role, who.verified),
            ("ops", Some(Role::Operator), true)
        );
        let why = check(&keys, Command::Delete, &delete(), Some(&ops))
            .await
            .unwrap_err();
        assert_eq!(
            why,
            "`delete` needs the admin role; token `ops` is operator"
        );
    }

    #[tokio::test]
    async fn a_token_of_a_namespace_acts_there_and_nowhere_else() {
        let keys = Memory::default();
        let ops = made(&keys.keys, "pay-ops", Role::Operator, |r| {
            r.role = None;
            r.namespaces = [("payments".parse().unwrap(), Role::Operator)].into();
        });
        let who = check(
            &keys,
            Command::Trigger,
            &trigger_of("payments/settle"),
            Some(&ops),
        )
        .await
        .unwrap();
        assert_eq!(who.role_in("payments"), Some(Role::Operator));
        let why = check(
            &keys,
            Command::Trigger,
            &trigger_of("ledger/close"),
            Some(&ops),
        )
        .await
        .unwrap_err();
        assert_eq!(
            why,
            "`trigger` needs the operator role in namespace `ledger`; token `pay-ops` is operator \
             in payments"
        );
        let why = check(&keys, Command::Trigger, &trigger_of("etl"), Some(&ops))
            .await
            .unwrap_err();
        assert!(why.contains("role in namespace `default`"), "{why}");
        // An instance's namespace is its record's job's.
        let record = ax_bus::InstanceRecord::first(
            &crate::test_fixtures::spec("ledger.close", None, &[]),
            ax_bus::time::now(),
            "2026-12-07".into(),
            Default::default(),
            ax_bus::instance::Trigger::Manual,
            ax_bus::time::now(),
        );
        let id = record.instance_id.clone();
        keys.records.lock().unwrap().insert(id.clone(), record);
        let cancel = Request::Cancel(ax_bus::messages::InstanceRequest {
            instance: id,
            reason: None,
            requested_by: String::new(),
        });
        let why = check(&keys, Command::Cancel, &cancel, Some(&ops))
            .await
            .unwrap_err();
        assert!(why.contains("role in namespace `ledger`"), "{why}");
        // What acts across namespaces needs the role in every one.
        let queue = Request::Queue(
            serde_json::from_value(serde_json::json!({"priority": "low", "paused": true})).unwrap(),
        );
        let why = check(&keys, Command::Queue, &queue, Some(&ops))
            .await
            .unwrap_err();
        assert!(why.contains("needs the admin role"), "{why}");
        // A role too low for the command anywhere is told as before.
        let why = check(&keys, Command::Delete, &delete(), Some(&ops))
            .await
            .unwrap_err();
        assert_eq!(
            why,
            "`delete` needs the admin role; token `pay-ops` is operator in payments"
        );
    }

    #[tokio::test]
    async fn no_token_a_malformed_an_unknown_a_revoked_or_an_expired_one_is_denied() {
        let keys = Memory::default();
        let revoked = made(&keys.keys, "gone", Role::Admin, |r| {
            r.revoked_at = Some(ax_bus::time::now());
        });
        let expired = made(&keys.keys, "old", Role::Admin, |r| {
            r.expires_at = Some(ax_bus::time::now() - chrono::Duration::seconds(1));
        });
        let (stranger, _) = Token::generate(&TokenName::parse("stranger").unwrap());
        let good = made(&keys.keys, "root", Role::Admin, |_| {});
        // The right name with another secret.
        let forged = format!(
            "{}{}",
            &good[..good.len() - 1],
            if good.ends_with('0') { '1' } else { '0' }
        );
        let cases = [
            (None, "no token"),
            (Some("axt_nope"), "malformed token"),
            (Some(stranger.expose()), "token `stranger` is not valid"),
            (Some(forged.as_str()), "token `root` is not valid"),
            (Some(revoked.as_str()), "token `gone` was revoked"),
            (Some(expired.as_str()), "token `old` expired at"),
        ];
        for (token, said) in cases {
            let why = check(&keys, Command::Trigger, &trigger(), token)
                .await
                .unwrap_err();
            assert!(why.starts_with(said), "{token:?}: {why}");
        }
    }

    #[tokio::test]
    async fn only_bootstrap_goes_without_a_token_and_with_auth_off_anyone_may() {
        let keys = Memory::default();
        let bootstrap = Request::Auth(AuthRequest::Bootstrap {
            name: TokenName::parse("root").unwrap(),
            hash: "0".repeat(64),
        });
        let who = check(&keys, Command::Auth, &bootstrap, None).await.unwrap();
        assert_eq!((who.name.as_str(), who.verified), ("bootstrap", false));
        let asked = Asked {
            kind: Some(Command::Delete),
            request: None,
            token: None,
            name: "delete",
        };
        let mut caller = nobody();
        authorize((&keys, false), (&asked, &Scope::Everywhere), &mut caller)
            .await
            .unwrap();
        assert_eq!(caller.principal.name, "ops@host");
        // An unknown command, auth on: an admin's to be told so.
        let operator = made(&keys.keys, "ops", Role::Operator, |_| {});
        let unknown = Asked {
            kind: None,
            request: None,
            token: Some(&operator),
            name: "explode",
        };
        let mut caller = nobody();
        match authorize((&keys, true), (&unknown, &Scope::Everywhere), &mut caller).await {
            Err(CommandError::Denied(why)) => {
                assert!(why.starts_with("`explode` needs the admin role"))
            }
            other => panic!("{other:?}"),
        }
    }
}
