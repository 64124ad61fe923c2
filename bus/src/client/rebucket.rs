//! Moving the instance records into another number of buckets (`ax instance buckets --set
//! N`, see [`crate::client::instance_buckets`]): the migration of a deployment whose one
//! instances bucket became the leader that saturates first.
//!
//! It runs while no node does. Every writer reads the count once, when it connects, and a
//! node that went on writing by the old count would write records where nobody reads them;
//! so the move refuses while a node's heartbeat is younger than [`QUIET_FOR`]. Business
//! services that read records (the Python client) read the count when they connect too: they
//! reconnect after a move.
//!
//! One mechanism keeps it safe to cut short anywhere: before and after the copy, whatever the
//! stored count does not place where it lies — a record in a bucket its job does not hash to,
//! a bucket past the count — is removed (`clean_up`); nobody reads it. So a move starts
//! from a clean old layout, reads each bucket once, every kept revision in order, and writes
//! each record whose job hashes elsewhere under the new count into its new bucket revision by
//! revision, with its state header (a removal empties it there again). A record that does not
//! decode stops the move, the old layout whole. Only then is the new count stored, and the
//! clean-up by it removes the moved records from where they were and the buckets past it. Run
//! again, a move cut short before the count was stored starts afresh; one cut short after
//! finishes its clean-up. A moved revision's write time is the move's (JetStream stamps it),
//! so a moved final record is noted for its retention again and kept its retention from the
//! move.

use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::message::PublishMessage;
use futures::StreamExt;

use crate::client::instance_buckets::{index_of, COUNT_KEY, MAX_BUCKETS};
use crate::client::kv_view::{FeedItem, KvFeed};
use crate::client::record_writes::STATE_HEADER;
use crate::client::{AxClient, ClientError};
use crate::codec;
use crate::error::{During, NatsError};
use crate::ids::InstanceId;
use crate::instance::InstanceRecord;

/// How long every node's heartbeat must have been silent before records are moved (three
/// of a node's heartbeats, one every 5 s, and some).
pub const QUIET_FOR: Duration = Duration::from_secs(16);

/// Publishes awaited together.
const WINDOW: usize = 256;

/// Why a move did not happen or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum RebucketError {
    /// The count asked for is out of range.
    #[error("--set {0}: must be from 1 to {MAX_BUCKETS}")]
    Count(u16),
    /// A node is running (its heartbeat is recent).
    #[error("node {node} wrote its heartbeat {ago_s} s ago: stop every node (the console's too) and wait {quiet_s} s after the last one stopped; nothing was moved", quiet_s = QUIET_FOR.as_secs())]
    NodeRunning {
        /// The node.
        node: String,
        /// Seconds since its heartbeat.
        ago_s: i64,
    },
    /// NATS failed; running the move again finishes it.
    #[error("{0} (running the move again finishes it)")]
    Client(#[from] ClientError),
}

/// What a move did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Moved {
    /// The count before.
    pub from: u16,
    /// The count after.
    pub to: u16,
    /// Revisions of records written into their new bucket.
    pub revisions: u64,
}

/// Moves the records of `client`'s deployment into `to` buckets; `progress` is told each step.
/// `client` must have been opened after the nodes stopped (it holds the count it read).
/// `pause`: a wait once the records are copied, before the new count is stored (the tests cut
/// the move short in it).
pub async fn rebucket(
    client: &AxClient,
    to: u16,
    pause: Option<Duration>,
    mut progress: impl FnMut(&str),
) -> Result<Moved, RebucketError> {
    if !(1..=MAX_BUCKETS).contains(&to) {
        return Err(RebucketError::Count(to));
    }
    refuse_while_nodes_run(client).await?;
    let from = client.instances.count();
    clean_up(client, from, &mut progress).await?;
    let mut moved = Moved {
        from,
        to,
        ..Moved::default()
    };
    if from == to {
        return Ok(moved);
    }
    let layout = replicas_of_bucket_0(client).await?;
    layout
        .ensure_instance_buckets(&client.js, to)
        .await
        .map_err(|e| ClientError::from(NatsError::new("make the new instance buckets", e)))?;
    for bucket in 0..from {
        copy_bucket(client, bucket, to, &mut moved, &mut progress).await?;
    }
    if let Some(pause) = pause {
        tokio::time::sleep(pause).await;
    }
    client
        .partitions
        .put(COUNT_KEY, to.to_string().into())
        .await
        .during(|| "store the new number of instance buckets")
        .map_err(ClientError::from)?;
    progress(&format!(
        "{COUNT_KEY} = {to}: {} revisions moved",
        moved.revisions
    ));
    clean_up(client, to, &mut progress).await?;
    Ok(moved)
}

async fn refuse_while_nodes_run(client: &AxClient) -> Result<(), RebucketError> {
    let now = crate::time::now();
    let quiet = chrono::Duration::from_std(QUIET_FOR).unwrap_or_default();
    for node in client.nodes().await? {
        if now - node.seen_at < quiet {
            return Err(RebucketError::NodeRunning {
                node: node.node.to_string(),
                ago_s: (now - node.seen_at).num_seconds().max(0),
            });
        }
    }
    Ok(())
}

/// The client's layout with the replicas of bucket 0's stream: new buckets get as many.
async fn replicas_of_bucket_0(
    client: &AxClient,
) -> Result<crate::client::provision::Layout, ClientError> {
    let info = client
        .stream_info(&format!("KV_{}", client.layout.instance_bucket(0)))
        .await?;
    let mut layout = client.layout.clone();
    layout.replicas = Some(info.config.num_replicas.max(1));
    Ok(layout)
}

/// Writes every record of bucket `index` whose job hashes elsewhere among `to` into its new
/// bucket, revision by revision.
async fn copy_bucket(
    client: &AxClient,
    index: u16,
    to: u16,
    moved: &mut Moved,
    progress: &mut impl FnMut(&str),
) -> Result<(), RebucketError> {
    let bucket = client.layout.instance_bucket(index);
    let mut feed = KvFeed::open_stream(
        &client.js,
        &format!("KV_{bucket}"),
        &format!("$KV.{bucket}."),
        ">",
        DeliverPolicy::All,
    )
    .await
    .map_err(ClientError::from)?;
    let mut acks: Vec<(String, PublishAckFuture)> = Vec::new();
    while let Some(item) = feed.next().await {
        let (key, write) = match item.map_err(ClientError::from)? {
            FeedItem::Current => break,
            FeedItem::Put { key, value, .. } => (key, Some(value)),
            FeedItem::Deleted { key } => (key, None),
        };
        let target = index_of(&key, to);
        if target == index {
            continue;
        }
        let target = client.layout.instance_bucket(target);
        let Some(value) = write else {
            // A removal: what it removed goes (a marker would outlive its own expiry here).
            settle(&mut acks).await?;
            purge_key(client, &target, &key).await?;
            continue;
        };
        let record: InstanceRecord = codec::decode(&value).map_err(ClientError::from)?;
        if record.state.is_final() {
            if let Ok(id) = key.parse::<InstanceId>() {
                client.note_final(&id, &record).await?;
            }
        }
        let message = PublishMessage::build()
            .header(STATE_HEADER, record.state.as_str())
            .payload(value);
        let subject = format!("$KV.{target}.{key}");
        let ack = client
            .js
            .send_publish(subject, message)
            .await
            .during(|| format!("move instance {key}"))
            .map_err(ClientError::from)?;
        acks.push((key, ack));
        moved.revisions += 1;
        if acks.len() >= WINDOW {
            settle(&mut acks).await?;
        }
    }
    settle(&mut acks).await?;
    progress(&format!(
        "{bucket}: copied, {} revisions moved so far",
        moved.revisions
    ));
    Ok(())
}

/// Awaits the answers of the writes made so far.
async fn settle(acks: &mut Vec<(String, PublishAckFuture)>) -> Result<(), ClientError> {
    for (key, ack) in acks.drain(..) {
        ack.await
            .map_err(|e| NatsError::new(format!("move instance {key}"), e))?;
    }
    Ok(())
}

/// Removes every message of `key` from `bucket` (no marker is left).
async fn purge_key(client: &AxClient, bucket: &str, key: &str) -> Result<(), ClientError> {
    let name = format!("KV_{bucket}");
    let stream = client
        .js
        .get_stream(&name)
        .await
        .during(|| format!("read stream {name}"))?;
    stream
        .purge()
        .filter(format!("$KV.{bucket}.{key}"))
        .await
        .during(|| format!("purge {key} from {bucket}"))?;
    Ok(())
}

/// Removes what count `count` does not place where it lies (nobody reads it): from buckets 0
/// to `count` − 1 the records whose job hashes elsewhere, and the buckets from `count` on.
async fn clean_up(
    client: &AxClient,
    count: u16,
    progress: &mut impl FnMut(&str),
) -> Result<(), ClientError> {
    for index in 0..count {
        let bucket = client.layout.instance_bucket(index);
        let keys = KvFeed::open_headers_only(&client.js, &bucket, ">")
            .await?
            .snapshot()
            .await?;
        let mut purged = 0u64;
        for (key, ..) in keys {
            if index_of(&key, count) != index {
                purge_key(client, &bucket, &key).await?;
                purged += 1;
            }
        }
        if purged > 0 {
            progress(&format!(
                "{bucket}: {purged} records placed elsewhere purged"
            ));
        }
    }
    let past: Vec<String> = (count..MAX_BUCKETS)
        .map(|i| format!("KV_{}", client.layout.instance_bucket(i)))
        .collect();
    let mut names = client.js.stream_names();
    let mut gone = Vec::new();
    while let Some(name) = names.next().await {
        let name = name.during(|| "list the streams")?;
        if past.contains(&name) {
            gone.push(name);
        }
    }
    for name in gone {
        client
            .js
            .delete_stream(&name)
            .await
            .during(|| format!("delete stream {name}"))?;
        progress(&format!("{name}: deleted (past the count)"));
    }
    Ok(())
}
