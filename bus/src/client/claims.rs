//! Claims: the lease of a running attempt, and its revocation.
//!
//! What fences an attempt's start is its record: a worker starts it by compare-and-swapping the
//! record to `executing` from the revision it was dispatched with, and
//! [`InstanceRecord::started`](crate::InstanceRecord::started) refuses an attempt already
//! started or reserved for another dispatch (a re-dispatch, see
//! [`InstanceRecord::reserved_for`](crate::InstanceRecord::reserved_for)) — so of two
//! dispatches of one attempt (a redelivery, a re-dispatch racing a late worker) exactly one
//! runs it, whatever order their messages arrive in, and the record names it (worker and
//! dispatch). The claims bucket holds at most one key per attempt (trace id) for what the
//! record does not say while the attempt runs:
//! - **claimed** by a worker for a dispatch, with a lease: written by the worker's first
//!   renewal ([`AxClient::renew_claim`]), a third of the lease into the attempt — an attempt
//!   shorter than that writes none — and renewed while it runs;
//! - **revoked**: nobody may run it (its worker was declared dead; a new attempt replaces it) —
//!   written from the record for an attempt not yet renewed. A worker whose renewal finds its
//!   claim revoked or taken stops the attempt.
//!
//! Every change is a create-if-absent or a compare-and-swap on that key.
//!
//! Business code gets the same guarantee for its own side effects with [`AxClient::claim`]:
//! true for the first caller of a trace id, false for every later one.

use std::time::Duration;

use async_nats::jetstream::kv::{CreateErrorKind, Operation, UpdateErrorKind};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::client::{AxClient, ClientError};
use crate::codec;
use crate::error::{BoxError, NatsError};
use crate::ids::{DispatchId, InstanceId, TraceId, WorkerId};

/// The value under an attempt's key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// The dispatch allowed to run the attempt (none once the key is deleted; an empty
    /// string on the wire).
    #[serde(with = "crate::codec::empty_as_none")]
    pub dispatch: Option<DispatchId>,
    /// The worker running it, once claimed.
    pub worker: Option<WorkerId>,
    /// Until when the worker's claim holds without renewal.
    #[serde(default, with = "crate::time::wire_opt")]
    pub lease_until: Option<DateTime<Utc>>,
    /// Nobody may run the attempt any more.
    pub revoked: bool,
}

fn failed<E: Into<BoxError>>(what: &str, trace: &str) -> impl FnOnce(E) -> ClientError {
    let operation = format!("{what} {trace}");
    move |e| NatsError::new(operation, e).into()
}

fn lease_end(lease: Duration) -> DateTime<Utc> {
    crate::time::now() + chrono::Duration::milliseconds(lease.as_millis() as i64)
}

impl AxClient {
    /// The claim on attempt `trace` and its revision, if any.
    pub async fn claim_of(&self, trace: &TraceId) -> Result<Option<(Claim, u64)>, ClientError> {
        self.read_claim(trace).await
    }

    async fn read_claim(&self, key: &str) -> Result<Option<(Claim, u64)>, ClientError> {
        match self
            .claims
            .entry(key)
            .await
            .map_err(failed("read claim", key))?
        {
            Some(entry) if entry.operation == Operation::Put => {
                Ok(Some((codec::decode(&entry.value)?, entry.revision)))
            }
            Some(entry) => Ok(Some((
                Claim {
                    dispatch: None,
                    worker: None,
                    lease_until: None,
                    revoked: true,
                },
                entry.revision,
            ))),
            None => Ok(None),
        }
    }

    /// Renews the lease of the attempt `trace` that `worker` runs for `dispatch` for another
    /// `lease`: the claim's revision, or `None` when it was revoked or another worker holds it
    /// (the attempt must stop). The first renewal (`revision` none) writes the claim (or
    /// renews the one an earlier try wrote, its answer lost).
    pub async fn renew_claim(
        &self,
        trace: &TraceId,
        revision: Option<u64>,
        dispatch: &DispatchId,
        worker: &WorkerId,
        lease: Duration,
    ) -> Result<Option<u64>, ClientError> {
        let renewed = codec::encode(&Claim {
            dispatch: Some(dispatch.clone()),
            worker: Some(worker.clone()),
            lease_until: Some(lease_end(lease)),
            revoked: false,
        })?;
        let Some(revision) = revision else {
            match self.claims.create(trace, renewed.clone()).await {
                Ok(revision) => return Ok(Some(revision)),
                Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {}
                Err(e) => return Err(failed("claim", trace)(e)),
            }
            loop {
                let Some((claim, current)) = self.read_claim(trace).await? else {
                    // Gone meanwhile (expired): nothing vouches for this worker any more.
                    return Ok(None);
                };
                if claim.revoked || claim.worker.as_ref() != Some(worker) {
                    return Ok(None);
                }
                match self.claims.update(trace, renewed.clone(), current).await {
                    Ok(revision) => return Ok(Some(revision)),
                    Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => continue,
                    Err(e) => return Err(failed("claim", trace)(e)),
                }
            }
        };
        match self.claims.update(trace, renewed, revision).await {
            Ok(next) => Ok(Some(next)),
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Ok(None),
            Err(e) => Err(failed("renew claim", trace)(e)),
        }
    }

    /// Revokes the claim on attempt `trace` of `instance` held by `worker` (declared dead):
    /// nobody runs that attempt any more, and the worker, should it come back, fails its next
    /// renewal. An attempt its worker started but did not renew yet has no claim (or only the
    /// reservation of its dispatch): its record says who started it, and the revoked claim is
    /// written from it. True when the claim is revoked — now, or already, from `worker` (so that
    /// handling the loss can be run again after a failure halfway); false when `worker` does
    /// not hold the attempt.
    pub async fn revoke_claim(
        &self,
        instance: &InstanceId,
        trace: &TraceId,
        worker: &WorkerId,
    ) -> Result<bool, ClientError> {
        loop {
            let current = self.read_claim(trace).await?;
            let revoked = match &current {
                Some((claim, _)) if claim.worker.is_some() => {
                    if claim.worker.as_ref() != Some(worker) {
                        return Ok(false);
                    }
                    if claim.revoked {
                        return Ok(true);
                    }
                    Claim {
                        revoked: true,
                        ..claim.clone()
                    }
                }
                _ => match self.started_by(instance, trace, worker).await? {
                    Some(dispatch) => Claim {
                        dispatch,
                        worker: Some(worker.clone()),
                        lease_until: None,
                        revoked: true,
                    },
                    None => return Ok(false),
                },
            };
            let revoked = codec::encode(&revoked)?;
            match current {
                None => match self.claims.create(trace, revoked).await {
                    Ok(_) => return Ok(true),
                    Err(e) if e.kind() == CreateErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(failed("revoke", trace)(e)),
                },
                Some((_, revision)) => match self.claims.update(trace, revoked, revision).await {
                    Ok(_) => return Ok(true),
                    Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => continue,
                    Err(e) => return Err(failed("revoke", trace)(e)),
                },
            }
        }
    }

    /// The dispatch with which `worker` started attempt `trace` of `instance`, as its record
    /// says; `None` when the record does not say `worker` started it.
    async fn started_by(
        &self,
        instance: &InstanceId,
        trace: &TraceId,
        worker: &WorkerId,
    ) -> Result<Option<Option<DispatchId>>, ClientError> {
        let Some((record, _)) = self.instance(instance).await? else {
            return Ok(None);
        };
        let started = record.started_by(trace) == Some(worker);
        Ok(started.then(|| record.dispatch.and_then(|note| note.dispatch)))
    }

    /// For business code: true for the first caller of `trace_id` (the attempt's `AX_TRACE_ID`),
    /// false for every later one, so a side effect guarded by it happens once per attempt even
    /// if the code runs twice. `owner` is recorded for whoever looks.
    ///
    /// ```no_run
    /// # async fn f(client: ax_bus::AxClient) -> Result<(), ax_bus::ClientError> {
    /// let trace: ax_bus::ids::TraceId = std::env::var("AX_TRACE_ID")
    ///     .unwrap_or_default()
    ///     .parse()?;
    /// if client.claim(&trace, "billing-service").await? {
    ///     // write the ledger entry
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn claim(&self, trace_id: &TraceId, owner: &str) -> Result<bool, ClientError> {
        let key = format!("biz.{trace_id}");
        match self.claims.create(&key, owner.to_string().into()).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(failed("claim", trace_id)(e)),
        }
    }
}
