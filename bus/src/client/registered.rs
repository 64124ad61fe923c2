//! Whether a definition is one the job registry holds or held.
//!
//! The registry is written only by the Schedulers, after the checks of apply; everything else
//! that carries a definition (a dispatch, a retry, a split) copies it. A credential allowed to
//! publish on one of those subjects — a Router's, or a worker's retries — could still put any
//! command into a message, and the worker would run it. So a worker runs a dispatch only if its
//! definition is one of the registry's retained revisions of the job (the bucket keeps the last
//! ten per job: an attempt created before an edit still runs as it was defined), and only a
//! valid one (an entry written past the Schedulers' checks counts for nothing).

use std::time::Duration;

use async_nats::jetstream::kv::Operation;
use futures::StreamExt;

use crate::client::{AxClient, ClientError};
use crate::error::{During, NatsError, Reason};
use crate::messages::JobRecord;
use crate::spec::JobSpec;

/// How long reading a job's history may take before the check gives up (and is tried again).
const HISTORY_TIMEOUT: Duration = Duration::from_secs(10);

impl AxClient {
    /// Whether `spec` is a valid revision of its job that the registry still holds: the latest
    /// (one read, the usual case), else one of the older ones.
    pub async fn is_registered(&self, spec: &JobSpec) -> Result<bool, ClientError> {
        let name = &spec.name;
        let latest = self
            .jobs
            .entry(name)
            .await
            .during(|| format!("read job {name}"))?;
        let Some(latest) = latest.filter(|e| e.operation == Operation::Put) else {
            // Deleted (or never defined): nothing of it may run any more.
            return Ok(false);
        };
        if defines(&latest.value, spec) {
            return Ok(true);
        }
        let read = async {
            let mut history = self
                .jobs
                .history(name)
                .await
                .during(|| format!("read the history of job {name}"))?;
            while let Some(entry) = history.next().await {
                let entry = entry.during(|| format!("read the history of job {name}"))?;
                if entry.revision >= latest.revision {
                    break;
                }
                if entry.operation == Operation::Put && defines(&entry.value, spec) {
                    return Ok(true);
                }
            }
            Ok(false)
        };
        tokio::time::timeout(HISTORY_TIMEOUT, read)
            .await
            .map_err(|_| {
                NatsError::new(
                    format!("read the history of job {name}"),
                    Reason(format!("no end within {HISTORY_TIMEOUT:?}")),
                )
            })?
    }
}

/// Whether registry value `value` is a valid job defined as `spec`.
fn defines(value: &[u8], spec: &JobSpec) -> bool {
    JobRecord::from_registry(value).is_ok_and(|record| record.spec == *spec)
}
