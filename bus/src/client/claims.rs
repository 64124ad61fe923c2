//! Claims: the right to execute one attempt, held by one worker at a time, with a lease.
//!
//! Each attempt (trace id) has at most one key in the claims bucket:
//! - **reserved** for a dispatch: only that dispatch may claim it (the Router writes this when it
//!   re-dispatches an attempt whose first worker never acknowledged — the first dispatch can then
//!   never run);
//! - **claimed** by a worker for a dispatch, with a lease the worker renews while it runs;
//! - **revoked**: nobody may run it (its worker was declared dead; a new attempt replaces it). A
//!   worker whose renewal finds its claim revoked or taken stops the attempt.
//!
//! Every change is a create-if-absent or a compare-and-swap on that key, so the claim is a fence:
//! two workers can never both hold it, whatever order their messages arrive in.
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
use crate::ids::{DispatchId, TraceId, WorkerId};

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

/// What a worker's claim came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The attempt is this worker's to run; renew with this revision.
    Won {
        /// Revision of the claim key.
        revision: u64,
        /// The claim was this worker's already, for this dispatch: a previous process of the
        /// worker claimed it (and may have started it) before it restarted.
        resumed: bool,
    },
    /// Someone else holds it, or it was revoked or reserved for another dispatch.
    Lost(Option<Claim>),
}

/// What a reservation came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reservation {
    /// The attempt is reserved for the new dispatch.
    Reserved,
    /// A worker claimed it meanwhile (its acknowledgement was late or lost).
    Held(Claim),
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

    /// A worker claims attempt `trace` for dispatch `dispatch`, with a lease of `lease`.
    pub async fn claim_attempt(
        &self,
        trace: &TraceId,
        dispatch: &DispatchId,
        worker: &WorkerId,
        lease: Duration,
    ) -> Result<ClaimOutcome, ClientError> {
        let mine = Claim {
            dispatch: Some(dispatch.clone()),
            worker: Some(worker.clone()),
            lease_until: Some(lease_end(lease)),
            revoked: false,
        };
        // Most attempts have no claim yet (nothing reserved them): create first, and read only
        // when one is there — one round trip on the common path instead of two.
        let mut current: Option<(Claim, u64)> = None;
        loop {
            let (written, resumed) = match &current {
                None => match self.claims.create(trace, codec::encode(&mine)?).await {
                    Ok(revision) => {
                        return Ok(ClaimOutcome::Won {
                            revision,
                            resumed: false,
                        })
                    }
                    Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {
                        current = self.read_claim(trace).await?;
                        continue;
                    }
                    Err(e) => return Err(failed("claim", trace)(e)),
                },
                Some((claim, revision)) => {
                    let reserved_for_me = !claim.revoked
                        && claim.dispatch.as_ref() == Some(dispatch)
                        && (claim.worker.is_none() || claim.worker.as_ref() == Some(worker));
                    if !reserved_for_me {
                        return Ok(ClaimOutcome::Lost(Some(claim.clone())));
                    }
                    let resumed = claim.worker.as_ref() == Some(worker);
                    let written = self
                        .claims
                        .update(trace, codec::encode(&mine)?, *revision)
                        .await;
                    (written, resumed)
                }
            };
            match written {
                Ok(revision) => return Ok(ClaimOutcome::Won { revision, resumed }),
                Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => {
                    current = self.read_claim(trace).await?;
                }
                Err(e) => return Err(failed("claim", trace)(e)),
            }
        }
    }

    /// Renews a held claim for another `lease`; `None` when it was revoked or taken (the
    /// attempt must stop).
    pub async fn renew_claim(
        &self,
        trace: &TraceId,
        revision: u64,
        dispatch: &DispatchId,
        worker: &WorkerId,
        lease: Duration,
    ) -> Result<Option<u64>, ClientError> {
        let renewed = Claim {
            dispatch: Some(dispatch.clone()),
            worker: Some(worker.clone()),
            lease_until: Some(lease_end(lease)),
            revoked: false,
        };
        match self
            .claims
            .update(trace, codec::encode(&renewed)?, revision)
            .await
        {
            Ok(revision) => Ok(Some(revision)),
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Ok(None),
            Err(e) => Err(failed("renew claim", trace)(e)),
        }
    }

    /// Reserves attempt `trace` for a new dispatch, unless a worker holds it.
    pub async fn reserve_attempt(
        &self,
        trace: &TraceId,
        dispatch: &DispatchId,
    ) -> Result<Reservation, ClientError> {
        let reserved = Claim {
            dispatch: Some(dispatch.clone()),
            worker: None,
            lease_until: None,
            revoked: false,
        };
        loop {
            let written = match self.read_claim(trace).await? {
                None => match self.claims.create(trace, codec::encode(&reserved)?).await {
                    Ok(_) => return Ok(Reservation::Reserved),
                    Err(e) if e.kind() == CreateErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(failed("reserve", trace)(e)),
                },
                Some((claim, _)) if claim.worker.is_some() && !claim.revoked => {
                    return Ok(Reservation::Held(claim))
                }
                Some((_, revision)) => {
                    self.claims
                        .update(trace, codec::encode(&reserved)?, revision)
                        .await
                }
            };
            match written {
                Ok(_) => return Ok(Reservation::Reserved),
                Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => continue,
                Err(e) => return Err(failed("reserve", trace)(e)),
            }
        }
    }

    /// Revokes the claim on `trace` held by `worker` (declared dead): nobody runs that attempt
    /// any more, and the worker, should it come back, fails its next renewal. True when the
    /// claim is revoked — now, or already, from `worker` (so that handling the loss can be run
    /// again after a failure halfway); false when `worker` does not hold it.
    pub async fn revoke_claim(
        &self,
        trace: &TraceId,
        worker: &WorkerId,
    ) -> Result<bool, ClientError> {
        loop {
            let Some((claim, revision)) = self.read_claim(trace).await? else {
                return Ok(false);
            };
            if claim.worker.as_ref() != Some(worker) {
                return Ok(false);
            }
            if claim.revoked {
                return Ok(true);
            }
            let revoked = Claim {
                revoked: true,
                ..claim
            };
            match self
                .claims
                .update(trace, codec::encode(&revoked)?, revision)
                .await
            {
                Ok(_) => return Ok(true),
                Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => continue,
                Err(e) => return Err(failed("revoke", trace)(e)),
            }
        }
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
