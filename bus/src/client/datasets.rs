//! The datasets bucket (`ax_datasets`): the last update of each dataset for each business date
//! — which job's instance and attempt wrote it, and when — one key per (dataset, date):
//! `<dataset key>.<YYYYMMDD>`, the dataset key the first 16 hex digits of the URI's SHA-256
//! (URIs hold characters no key may). The DagCoordinator writes it when an instance of a job
//! that `produces` datasets succeeds; `ax lineage DATASET` reads it.

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::client::kv_view::KvFeed;
use crate::client::{AxClient, ClientError};
use crate::codec;
use crate::ids::{InstanceId, JobName};
use crate::spec::dataset::DatasetUri;

/// An update of a dataset for a business date.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DatasetUpdate {
    /// The dataset.
    pub dataset: DatasetUri,
    /// The business date it was written for (`YYYY-MM-DD`).
    pub biz_date: String,
    /// The job that wrote it.
    pub job: JobName,
    /// Its instance.
    pub instance_id: InstanceId,
    /// The attempt that succeeded.
    pub attempt: u32,
    /// When that attempt ended.
    #[serde(with = "crate::time::wire")]
    pub at: DateTime<Utc>,
}

/// The key part that names `uri`.
pub fn dataset_key(uri: &DatasetUri) -> String {
    let digest = Sha256::digest(uri.as_str().as_bytes());
    hex::encode(&digest[..8])
}

/// The key of `uri`'s update for `date`.
pub fn update_key(uri: &DatasetUri, date: NaiveDate) -> String {
    format!("{}.{}", dataset_key(uri), date.format("%Y%m%d"))
}

impl AxClient {
    /// The updates of `uri` kept, the latest business date first.
    pub async fn dataset_updates(
        &self,
        uri: &DatasetUri,
    ) -> Result<Vec<DatasetUpdate>, ClientError> {
        let pattern = format!("{}.>", dataset_key(uri));
        let feed = KvFeed::open(&self.js, &self.layout.datasets_bucket(), &pattern).await?;
        let mut updates: Vec<DatasetUpdate> = feed
            .snapshot()
            .await?
            .into_iter()
            .map(|(_, value, _)| codec::decode(&value))
            .collect::<Result<_, _>>()?;
        updates.sort_by(|a, b| b.biz_date.cmp(&a.biz_date));
        Ok(updates)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dataset_key_is_short_stable_and_a_valid_key_token() {
        let uri = DatasetUri::parse("warehouse://orders").unwrap();
        let key = update_key(&uri, NaiveDate::from_ymd_opt(2026, 12, 1).unwrap());
        assert_eq!(key.len(), 16 + 1 + 8);
        assert!(key.ends_with(".20261201"), "{key}");
        assert_eq!(
            key,
            update_key(&uri, NaiveDate::from_ymd_opt(2026, 12, 1).unwrap())
        );
        let other = DatasetUri::parse("warehouse://order").unwrap();
        assert_ne!(dataset_key(&uri), dataset_key(&other));
    }
}
