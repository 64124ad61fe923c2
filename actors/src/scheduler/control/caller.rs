//! Who sent a control command, and whether they may.
//!
//! With `[auth] enabled`, a command must carry a token ([`ax_bus::auth::TOKEN_HEADER`]) that
//! the tokens bucket vouches for at this moment, of a role at least the command's
//! ([`ax_bus::auth::role_of`]); anything else is denied before a thing is read or written. The
//! one exception is `auth bootstrap`, which needs no token because it only works while no admin
//! token exists. With auth off every sender is an unverified admin, named by what it says.

use async_nats::jetstream;

use ax_bus::auth::{self, token::Token, Principal, Role, Via};
use ax_bus::client::auth::CheckError;
use ax_bus::messages::commands::Request;
use ax_bus::messages::AuthRequest;

use super::{CommandError, Desk, Received};

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

/// Checks the caller of the command `received` and names them in `caller`; refuses one who
/// may not.
pub(crate) async fn authorize(
    desk: &Desk,
    received: &Received,
    caller: &mut Caller,
) -> Result<(), CommandError> {
    if !desk.auth.enabled {
        return Ok(());
    }
    let message = &received.message;
    if matches!(
        received.request,
        Ok(Request::Auth(AuthRequest::Bootstrap { .. }))
    ) {
        caller.principal = Principal {
            name: "bootstrap".into(),
            role: Role::Viewer,
            verified: false,
        };
        return Ok(());
    }
    let token = header(message, auth::TOKEN_HEADER).map(Token::parse);
    // Until proven, the caller is the name their token claims, with no rights.
    caller.principal = Principal {
        name: match &token {
            Some(Ok(token)) => token.name().to_string(),
            _ => "anonymous".into(),
        },
        role: Role::Viewer,
        verified: false,
    };
    let token = match token.transpose() {
        Ok(token) => token,
        Err(e) => return Err(CommandError::Denied(e.to_string())),
    };
    caller.principal = match desk.client.check_token(token.as_ref()).await {
        Ok(principal) => principal,
        Err(CheckError::Token(e)) => return Err(CommandError::Denied(e.to_string())),
        Err(CheckError::Client(e)) => return Err(CommandError::Transient(e.into())),
    };
    // A command no one knows is an admin's to be told so.
    let needed = received.kind.map_or(Role::Admin, auth::role_of);
    if caller.principal.role < needed {
        return Err(CommandError::Denied(format!(
            "`{}` needs the {needed} role; token `{}` is {}",
            received.name(),
            caller.principal.name,
            caller.principal.role
        )));
    }
    Ok(())
}
