//! Reading an instance's history: the revisions the instances bucket keeps of its record,
//! told as steps by [`crate::history`].

use std::time::Duration;

use async_nats::jetstream::kv::Operation;
use futures::StreamExt;

use crate::client::provision::RECORD_REVISIONS;
use crate::client::{AxClient, ClientError};
use crate::codec;
use crate::error::{During, NatsError, Reason};
use crate::history::{History, Revision};
use crate::ids::InstanceId;

/// How long reading a record's revisions may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

impl AxClient {
    /// The history of instance `id`, from the revisions of its record; `None` when there is
    /// no such instance.
    pub async fn instance_history(&self, id: &InstanceId) -> Result<Option<History>, ClientError> {
        let what = || format!("read the history of instance {id}");
        let read = async {
            let mut entries = self.instances.history(id).await.during(what)?;
            let mut revisions = Vec::new();
            while let Some(entry) = entries.next().await {
                let entry = entry.during(what)?;
                if entry.operation != Operation::Put {
                    continue;
                }
                revisions.push(Revision {
                    revision: entry.revision,
                    at: crate::time::from_server(entry.created),
                    record: codec::decode(&entry.value)?,
                });
            }
            Ok::<_, ClientError>(revisions)
        };
        let revisions = tokio::time::timeout(READ_TIMEOUT, read)
            .await
            .map_err(|_| {
                NatsError::new(what(), Reason(format!("no end within {READ_TIMEOUT:?}")))
            })??;
        if revisions.is_empty() {
            return Ok(None);
        }
        let kept = usize::try_from(RECORD_REVISIONS).unwrap_or(usize::MAX);
        Ok(Some(History::of(id.clone(), &revisions, kept)))
    }
}
