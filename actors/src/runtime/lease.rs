//! Leases: which node leads a role that must act as one (the DagCoordinator, whose decisions
//! come from an in-memory view).
//!
//! A lease is a key in the leases bucket, created if absent and renewed with compare-and-swap;
//! the bucket's age limit removes it a few seconds after its holder stops renewing, and a
//! candidate's create then succeeds. Safety never rests on the lease alone: every decision a
//! leader takes is also guarded by compare-and-swap on instance records and by message ids, so
//! two leaders for a moment (a paused process) duplicate work that is then refused, nothing
//! more.

use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{CreateErrorKind, UpdateErrorKind};

use ax_bus::client::provision::LEASE_TTL;
use ax_bus::ids::NodeId;
use ax_bus::AxClient;

use crate::ActorError;

/// How often a candidate tries, and a holder renews.
const RENEW_EVERY: Duration = Duration::from_millis(1500);
const TRY_EVERY: Duration = Duration::from_secs(1);

/// A held lease.
pub(crate) struct Lease {
    client: AxClient,
    key: String,
    node: NodeId,
    revision: u64,
}

impl Lease {
    /// The revision under which the lease is held: it grows with every acquisition, so it
    /// numbers terms of leadership.
    pub(crate) fn revision(&self) -> u64 {
        self.revision
    }

    /// Waits until `node` holds the lease `key`. A lease left by this same node (a restart of
    /// the actor or of the process) is taken over at once.
    pub(crate) async fn acquire(
        client: &AxClient,
        key: &str,
        node: &NodeId,
    ) -> Result<Self, ActorError> {
        let mut announced = false;
        loop {
            match client
                .leases
                .create(key, node.as_str().to_string().into())
                .await
            {
                Ok(revision) => return Ok(Self::held(client, key, node, revision)),
                Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {
                    if let Ok(Some(entry)) = client.leases.entry(key).await {
                        if entry.value.as_ref() == node.as_bytes() {
                            if let Ok(revision) = client
                                .leases
                                .update(key, node.as_str().to_string().into(), entry.revision)
                                .await
                            {
                                return Ok(Self::held(client, key, node, revision));
                            }
                        } else if !announced {
                            tracing::info!(
                                lease = key,
                                holder = %String::from_utf8_lossy(&entry.value),
                                "standing by"
                            );
                            announced = true;
                        }
                    }
                }
                Err(e) => tracing::warn!(lease = key, error = %e, "cannot try the lease"),
            }
            tokio::time::sleep(TRY_EVERY).await;
        }
    }

    fn held(client: &AxClient, key: &str, node: &NodeId, revision: u64) -> Self {
        tracing::info!(lease = key, %node, "lease acquired");
        Self {
            client: client.clone(),
            key: key.to_string(),
            node: node.clone(),
            revision,
        }
    }

    /// Renews the lease until it is lost; returns why. A renewal that fails for a transient
    /// reason is retried while the lease cannot have expired yet.
    pub(crate) async fn keep(mut self) -> ActorError {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(RENEW_EVERY).await;
            if let Err(lost) = self.renew(&mut renewed).await {
                return lost;
            }
        }
    }

    /// Runs `work` while renewing the lease, as [`Lease::keep`] does: what a new leader does
    /// before it leads (reading its view back, which takes seconds under load) must not let
    /// the lease lapse, or it never leads — each lead outlasting the lease, lost, begun again.
    pub(crate) async fn renewed_during<T>(
        &mut self,
        work: impl std::future::Future<Output = T>,
    ) -> Result<T, ActorError> {
        tokio::pin!(work);
        let mut renewed = Instant::now();
        let mut due =
            tokio::time::interval_at(tokio::time::Instant::now() + RENEW_EVERY, RENEW_EVERY);
        loop {
            tokio::select! {
                done = &mut work => return Ok(done),
                _ = due.tick() => self.renew(&mut renewed).await?,
            }
        }
    }

    /// One renewal; `renewed` is when the last one succeeded. An error when the lease is lost
    /// (taken, or unrenewed for as long as it lives).
    async fn renew(&mut self, renewed: &mut Instant) -> Result<(), ActorError> {
        match self
            .client
            .leases
            .update(
                &self.key,
                self.node.as_str().to_string().into(),
                self.revision,
            )
            .await
        {
            Ok(revision) => {
                self.revision = revision;
                *renewed = Instant::now();
                Ok(())
            }
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => {
                Err(ActorError::LeaseLost(self.key.clone()))
            }
            Err(e) => {
                if renewed.elapsed() + RENEW_EVERY >= LEASE_TTL {
                    return Err(ActorError::LeaseLost(self.key.clone()));
                }
                tracing::warn!(lease = %self.key, error = %e, "renewal failed; retrying");
                Ok(())
            }
        }
    }
}
