//! Reading what the auth actors write: checking a presented token against the tokens bucket
//! (the Schedulers before every command, the console before every request), the approvals,
//! and the audit trail.
//!
//! A token is looked up on every check rather than cached: a revocation is seen by every
//! node on its next check (a KV read, well under a millisecond on a local server), and there is
//! no cache to go stale.

use async_nats::jetstream::{self, kv};
use chrono::{DateTime, Utc};

use crate::auth::approval::Approval;
use crate::auth::audit::AuditRecord;
use crate::auth::token::{Token, TokenError, TokenRecord};
use crate::auth::Principal;
use crate::client::kv_view::KvFeed;
use crate::client::{AxClient, ClientError};
use crate::codec;
use crate::error::During;
use crate::ids::{ApprovalId, TokenName};

/// Why a check granted nothing.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The token grants nothing (the caller's fault: 401).
    #[error(transparent)]
    Token(#[from] TokenError),
    /// NATS failed (nobody's fault: try again).
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// The key under which `ax auth bootstrap` marks that the first admin token was made (not a
/// token name: names cannot start with `_`).
pub const BOOTSTRAP_KEY: &str = "_bootstrap";

impl AxClient {
    /// Who `token` proves the caller is, at this moment.
    pub async fn check_token(&self, token: Option<&Token>) -> Result<Principal, CheckError> {
        let token = token.ok_or(TokenError::Missing)?;
        let record = self.token_record(token.name()).await?;
        Ok(token.check(record.as_ref().map(|(r, _)| r), crate::time::now())?)
    }

    /// A token's record and its revision, if one was ever made by that name.
    pub async fn token_record(
        &self,
        name: &TokenName,
    ) -> Result<Option<(TokenRecord, u64)>, ClientError> {
        match self
            .tokens
            .entry(name.as_str())
            .await
            .during(|| format!("read token {name}"))?
        {
            Some(entry) if entry.operation == kv::Operation::Put => {
                Ok(Some((codec::decode(&entry.value)?, entry.revision)))
            }
            _ => Ok(None),
        }
    }

    /// Every token made, by name.
    pub async fn token_records(&self) -> Result<Vec<TokenRecord>, ClientError> {
        let feed = KvFeed::open(&self.js, &self.layout.tokens_bucket(), ">").await?;
        Ok(feed
            .snapshot()
            .await?
            .into_iter()
            .filter(|(key, _, _)| key != BOOTSTRAP_KEY)
            .filter_map(|(key, value, _)| match codec::decode(&value) {
                Ok(record) => Some(record),
                Err(e) => {
                    tracing::warn!(token = %key, error = %e, "token entry left out");
                    None
                }
            })
            .collect())
    }

    /// One approval and its revision.
    pub async fn approval(&self, id: &ApprovalId) -> Result<Option<(Approval, u64)>, ClientError> {
        match self
            .approvals
            .entry(id.as_str())
            .await
            .during(|| format!("read approval {id}"))?
        {
            Some(entry) if entry.operation == kv::Operation::Put => {
                Ok(Some((codec::decode(&entry.value)?, entry.revision)))
            }
            _ => Ok(None),
        }
    }

    /// Every approval kept (30 days), newest first.
    pub async fn approvals(&self) -> Result<Vec<Approval>, ClientError> {
        let feed = KvFeed::open(&self.js, &self.layout.approvals_bucket(), ">").await?;
        let mut all: Vec<Approval> = feed
            .snapshot()
            .await?
            .into_iter()
            .filter_map(|(key, value, _)| match codec::decode(&value) {
                Ok(approval) => Some(approval),
                Err(e) => {
                    tracing::warn!(approval = %key, error = %e, "approval entry left out");
                    None
                }
            })
            .collect();
        all.sort_by_key(|a: &Approval| std::cmp::Reverse(a.created_at));
        Ok(all)
    }

    /// The audit records since `since`, oldest first.
    pub async fn audit_since(&self, since: DateTime<Utc>) -> Result<Vec<AuditRecord>, ClientError> {
        let prefix = format!("{}.", self.subjects().audit_all().trim_end_matches(".>"));
        let feed = KvFeed::open_stream(
            &self.js,
            &self.layout.audit_stream(),
            &prefix,
            ">",
            jetstream::consumer::DeliverPolicy::ByStartTime {
                start_time: time::OffsetDateTime::from_unix_timestamp(since.timestamp())
                    .unwrap_or(time::OffsetDateTime::UNIX_EPOCH),
            },
        )
        .await?;
        Ok(feed
            .history()
            .await?
            .into_iter()
            .filter_map(|(subject, value)| match codec::decode(&value) {
                Ok(record) => Some(record),
                Err(e) => {
                    tracing::debug!(%subject, error = %e, "audit entry of an older format left out");
                    None
                }
            })
            .collect())
    }
}
