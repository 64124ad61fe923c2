//! The job registry's values (`ax_jobs`): a job's definition as applied, and why a value does
//! not decode.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::spec::JobSpec;

/// The value stored per job in the registry bucket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// The definition.
    pub spec: JobSpec,
    /// Paused jobs do not fire on their cron.
    pub paused: bool,
    /// Last change.
    #[serde(with = "crate::time::wire")]
    pub updated_at: DateTime<Utc>,
    /// When a job of this name was created; every later apply keeps it. A job deleted and
    /// applied again is another job: what the first one left waiting (a delayed trigger) is
    /// cancelled, not run under the second one's name. Absent on records written before it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::time::wire_opt"
    )]
    pub defined_at: Option<DateTime<Utc>>,
}

impl JobRecord {
    /// A registry value, decoded and checked by the rules of apply. Only the Schedulers write
    /// the registry, after those checks; but whoever may write its bucket could put anything
    /// there, and what the actors read from it is executed — so each reader checks again.
    pub fn from_registry(value: &[u8]) -> Result<Self, RegistryValueError> {
        let record: Self = crate::codec::decode(value)?;
        let errors = crate::spec::validate_spec(&record.spec);
        if errors.is_empty() {
            Ok(record)
        } else {
            Err(RegistryValueError::Invalid(
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            ))
        }
    }
}

/// Why a registry value is not taken as a job.
#[derive(Debug, thiserror::Error)]
pub enum RegistryValueError {
    /// Not a job record.
    #[error("does not decode as a job: {0}")]
    Decode(#[from] crate::codec::CodecError),
    /// A job that breaks the spec's rules (each `field: reason`).
    #[error("is not a valid job: {0}")]
    Invalid(String),
}
