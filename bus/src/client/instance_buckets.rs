//! The instance records in a fixed number of buckets, each record in the one its job's name
//! hashes to.
//!
//! Why: an instance's record takes three of the seven writes JetStream stores for it (its
//! create, its start, its end), and a stream's writes are ordered by its one leader. On a
//! cluster the leader of a single instances bucket is the first server to saturate
//! (docs/benchmarks.md, "Planning a NATS cluster"); in several buckets, each a stream of its
//! own, their leaders spread over the servers.
//!
//! An instance's record lives in bucket `fnv1a32(the id's first token) mod count` — the first
//! token is its job's name, so one job's records share a bucket (a job's list reads one), and
//! the hash is the Schedulers' partitions' ([`crate::partition::of`]), which any client in any
//! language can compute. Bucket 0 is `ax_instances` and bucket `i` > 0 `ax_instances_<i>`: a
//! deployment of one bucket is exactly what it was before there could be more. The count is
//! stored as text in the partitions bucket under [`COUNT_KEY`] (absent: one), set by the first
//! node to start from its `[node] instance_buckets`, and changed only by
//! [`rebucket`](crate::client::rebucket), which moves the records while no node runs: a writer
//! that went on with the count it read would write where nobody reads.

use async_nats::jetstream::kv;

use crate::client::kv_view::{KvFeed, MergedFeed};
use crate::client::provision::Layout;
use crate::client::ClientError;
use crate::error::{During, NatsError, Reason};
use crate::ids::InstanceId;

/// The key, in the partitions bucket, of the number of instance buckets.
pub const COUNT_KEY: &str = "instance_buckets";

/// The most instance buckets a deployment may have.
pub const MAX_BUCKETS: u16 = 64;

/// The bucket, among `count`, of the record keyed `id` (an instance id).
pub fn index_of(id: &str, count: u16) -> u16 {
    let job = id.split('.').next().unwrap_or(id);
    crate::partition::of(job, count).0
}

/// The number of instance buckets stored in `partitions`: `None` when none is (one), an error
/// when what is stored is not a count.
pub async fn stored_count(partitions: &kv::Store) -> Result<Option<u16>, ClientError> {
    let value = partitions
        .get(COUNT_KEY)
        .await
        .during(|| "read the number of instance buckets")?;
    let Some(value) = value else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(&value);
    match text.trim().parse::<u16>() {
        Ok(n) if (1..=MAX_BUCKETS).contains(&n) => Ok(Some(n)),
        _ => Err(NatsError::new(
            "read the number of instance buckets",
            Reason(format!(
                "the partitions bucket's `{COUNT_KEY}` is `{text}`, not a count from 1 to {MAX_BUCKETS}"
            )),
        )
        .into()),
    }
}

/// The instance buckets, opened.
#[derive(Clone, Debug)]
pub struct InstanceBuckets {
    buckets: Vec<(String, kv::Store)>,
}

impl InstanceBuckets {
    /// Opens the `count` instance buckets of `layout`.
    pub(crate) async fn open(
        js: &async_nats::jetstream::Context,
        layout: &Layout,
        count: u16,
    ) -> Result<Self, ClientError> {
        let mut buckets = Vec::with_capacity(usize::from(count));
        for i in 0..count.max(1) {
            let name = layout.instance_bucket(i);
            let store = crate::client::open_bucket(js, &name).await?;
            buckets.push((name, store));
        }
        Ok(Self { buckets })
    }

    /// The number of buckets.
    pub fn count(&self) -> u16 {
        u16::try_from(self.buckets.len()).unwrap_or(MAX_BUCKETS)
    }

    /// The buckets' names, bucket 0 first.
    pub fn buckets(&self) -> impl Iterator<Item = &str> {
        self.buckets.iter().map(|(name, _)| name.as_str())
    }

    fn bucket(&self, id: &str) -> &(String, kv::Store) {
        let i = usize::from(index_of(id, self.count()));
        &self.buckets[i.min(self.buckets.len() - 1)]
    }

    /// The bucket that holds `id`'s record.
    pub fn bucket_of(&self, id: &InstanceId) -> &str {
        &self.bucket(id.as_str()).0
    }

    /// The subject `id`'s record is written on.
    pub fn subject_of(&self, id: &InstanceId) -> String {
        format!("$KV.{}.{id}", self.bucket_of(id))
    }

    /// The bucket that holds `id`'s record, to read it.
    pub fn store_of(&self, id: &InstanceId) -> &kv::Store {
        &self.bucket(id.as_str()).1
    }

    /// `id`'s record's last entry (a removal's marker included).
    pub async fn entry(&self, id: &InstanceId) -> Result<Option<kv::Entry>, kv::EntryError> {
        self.store_of(id).entry(id.as_str()).await
    }

    /// `id`'s record's kept revisions, oldest first.
    pub async fn history(&self, id: &InstanceId) -> Result<kv::History, kv::WatchError> {
        self.store_of(id).history(id.as_str()).await
    }

    /// A feed over every record of every bucket, or over `job`'s in the one that holds them.
    pub async fn feed(
        &self,
        js: &async_nats::jetstream::Context,
        job: Option<&str>,
        headers_only: bool,
    ) -> Result<MergedFeed, ClientError> {
        let (buckets, pattern): (Vec<&str>, String) = match job {
            Some(job) => (vec![self.bucket(job).0.as_str()], format!("{job}.>")),
            None => (self.buckets().collect(), ">".to_string()),
        };
        let mut feeds = Vec::with_capacity(buckets.len());
        for bucket in buckets {
            let feed = if headers_only {
                KvFeed::open_headers_only(js, bucket, &pattern).await?
            } else {
                KvFeed::open(js, bucket, &pattern).await?
            };
            feeds.push(feed);
        }
        Ok(MergedFeed::new(feeds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_s_records_share_a_bucket_and_with_one_it_is_bucket_0() {
        let a = index_of("nightly-etl.20261201T000000Z", 8);
        assert_eq!(index_of("nightly-etl.key-x", 8), a);
        assert_eq!(index_of("nightly-etl", 8), a);
        assert_eq!(
            a,
            crate::partition::of("nightly-etl", 8).0,
            "the Schedulers' hash"
        );
        assert_eq!(index_of("anything.at-all", 1), 0);
        // The Python client's test has the same numbers.
        let seven: Vec<u16> = ["nightly-etl", "py_echo", "report-7", "orders"]
            .iter()
            .map(|job| index_of(&format!("{job}.x"), 7))
            .collect();
        assert_eq!(seven, [4, 5, 1, 3]);
        let used: std::collections::BTreeSet<u16> = (0..100)
            .map(|i| index_of(&format!("job-{i}.x"), 3))
            .collect();
        assert_eq!(
            used.len(),
            3,
            "a hundred jobs use every one of three buckets"
        );
    }
}
