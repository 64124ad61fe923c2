//! A feed over a bucket ([`KvFeed`]): every write arrives once, across its snapshot and after
//! (while keys are written all along); once past the snapshot it reads on without a
//! last-per-key consumer and without a filter over the whole bucket (for which the server
//! would count pending messages key by key at every purge of the stream); a dropped feed's
//! consumer goes at once, not after the server's 30 s.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::{consumer::DeliverPolicy, kv};
use ax_bus::client::kv_view::{FeedItem, KvFeed};
use futures::StreamExt;

use crate::support;
use support::*;

const BUCKET: &str = "feedtest";
const KEYS: usize = 50;
const WRITES: usize = 600;

/// The test bucket (file storage, so that it outlives a restart), each of its keys written once.
async fn bucket_of_keys(js: &async_nats::jetstream::Context) -> kv::Store {
    let store = js
        .create_key_value(kv::Config {
            bucket: BUCKET.into(),
            history: 5,
            storage: async_nats::jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .unwrap();
    for k in 0..KEYS {
        store.put(format!("k{k}"), "0".into()).await.unwrap();
    }
    store
}

/// The consumers of the bucket's stream: their deliver policy and filter.
async fn consumers(js: &async_nats::jetstream::Context) -> Vec<(DeliverPolicy, String)> {
    let stream = js.get_stream(format!("KV_{BUCKET}")).await.unwrap();
    let mut all = Vec::new();
    let mut infos = stream.consumers();
    while let Some(info) = infos.next().await {
        let info = info.unwrap();
        all.push((info.config.deliver_policy, info.config.filter_subject));
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_reads_every_write_once_then_reads_on_without_counting_by_key() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let js = client.js.clone();
    let store = bucket_of_keys(&js).await;
    // Writes go on while the feed opens, reads its snapshot and reads on.
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut last = BTreeMap::new();
            for w in 1..=WRITES {
                let key = format!("k{}", w % KEYS);
                store.put(&key, w.to_string().into()).await.unwrap();
                last.insert(key, w.to_string());
                if w % 25 == 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            last
        })
    };
    let mut feed = KvFeed::open(&js, BUCKET, ">").await.unwrap();
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut last_revision = 0;
    let mut read = |item: FeedItem, seen: &mut BTreeMap<String, String>| match item {
        FeedItem::Put {
            key,
            value,
            revision,
            ..
        } => {
            // In the stream's order, each once: a revision never comes twice or backwards.
            assert!(revision > last_revision, "{revision} after {last_revision}");
            last_revision = revision;
            seen.insert(key, String::from_utf8(value.to_vec()).unwrap());
            false
        }
        FeedItem::Deleted { key } => panic!("{key} deleted"),
        FeedItem::Current => true,
    };
    let within = Duration::from_secs(60);
    tokio::time::timeout(within, async {
        while !read(feed.next().await.unwrap().unwrap(), &mut seen) {}
    })
    .await
    .expect("the snapshot in a minute");
    // One write more once the writer is done, so that there is always one to read on to.
    let mut last = writer.await.unwrap();
    store.put("k0", "end".into()).await.unwrap();
    last.insert("k0".into(), "end".into());
    tokio::time::timeout(within, async {
        while seen != last {
            assert!(!read(feed.next().await.unwrap().unwrap(), &mut seen));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("not every write arrived: {seen:?}"));
    // Past its snapshot: one consumer, reading on from a sequence, no filter.
    let live = consumers(&js).await;
    assert_eq!(live.len(), 1, "{live:?}");
    assert!(
        matches!(live[0], (DeliverPolicy::ByStartSequence { .. }, ref filter) if filter.is_empty()),
        "{live:?}"
    );
    // Dropped, its consumer goes at once.
    drop(feed);
    wait_for(
        Duration::from_secs(10),
        "the dropped feed's consumer to go",
        || async { consumers(&js).await.is_empty().then_some(()) },
    )
    .await;
}

/// A NATS restart while a feed is past its snapshot, its next read (the swap of its consumer)
/// started during the outage: every write made after the restart arrives once and in order,
/// and the feed reads on with one consumer, from a sequence. (The restart alone ends the
/// last-per-key consumer too: the client makes its ordered consumer again from the last
/// message it had.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_goes_on_across_a_nats_restart_and_still_reads_on() {
    let mut nats = TestNats::start();
    let client = nats.client().await;
    let js = client.js.clone();
    let store = bucket_of_keys(&js).await;
    let mut feed = KvFeed::open(&js, BUCKET, ">").await.unwrap();
    let within = Duration::from_secs(60);
    tokio::time::timeout(within, async {
        while !matches!(feed.next().await.unwrap().unwrap(), FeedItem::Current) {}
    })
    .await
    .expect("the snapshot in a minute");
    // The next read (which swaps the consumer) starts while the server is down; the first
    // write comes once it is back.
    let mut last_revision = 0;
    let write = |round: usize| {
        let (store, value) = (store.clone(), format!("after{round}"));
        async move {
            wait_for(within, "a write after the restart", || async {
                store.put("k1", value.clone().into()).await.ok()
            })
            .await;
        }
    };
    let (_, first, _) = tokio::join!(
        nats.outage(Duration::from_secs(2)),
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            tokio::time::timeout(within, feed.next()).await
        },
        async {
            tokio::time::sleep(Duration::from_millis(2500)).await;
            write(0).await;
        }
    );
    let mut pending = Some(first.expect("an item after the restart"));
    for round in 0..20 {
        let value = format!("after{round}");
        if round > 0 {
            write(round).await;
        }
        let item = match pending.take() {
            Some(item) => item,
            None => tokio::time::timeout(within, feed.next())
                .await
                .expect("each write arrives"),
        };
        match item.expect("the feed goes on").unwrap() {
            FeedItem::Put {
                key,
                value: got,
                revision,
                ..
            } => {
                assert!(revision > last_revision, "{revision} after {last_revision}");
                last_revision = revision;
                assert_eq!((key.as_str(), &got[..]), ("k1", value.as_bytes()));
            }
            other => panic!("{other:?}"),
        }
    }
    // One consumer, from a sequence (a consumer the client made again during the outage, if
    // the swap was refused then, is left to the server, which drops it 30 s after its reader).
    wait_for(
        Duration::from_secs(45),
        "one consumer reading on",
        || async {
            let live = consumers(&js).await;
            (live.len() == 1 && matches!(live[0].0, DeliverPolicy::ByStartSequence { .. }))
                .then_some(())
        },
    )
    .await;
}
