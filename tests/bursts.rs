//! Bursts (`ax_actors::jetstream::burst`): a hot path's publishes sent as one fast-ingest batch.
//! Against a real nats-server: each message is stored once and in order, with a few answers
//! for the whole burst; a burst sent again stores nothing twice; a stream that takes no batches
//! gets the messages one by one; a message the server cannot take fails alone, and so does each
//! one a full stream refuses; bursts open
//! together are each stored in full and in order; across a NATS restart every message
//! reported stored is in the stream, none twice; and the Scheduler's creator, whose hand-offs
//! are bursts, creates and hands on each of 1,500 fires due together once across a restart.

use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream::stream;
use futures::StreamExt;

use ax_actors::jetstream::burst::{self, Item};
use ax_bus::codec;
use ax_bus::spec::Priority;
use ax_bus::AxClient;

use support::*;

/// `n` items numbered from `from`, each de-duplicated by its number, on the dispatch subjects.
fn items(client: &AxClient, from: u64, n: u64) -> Vec<Item> {
    (from..from + n)
        .map(|i| {
            let subject = client
                .subjects()
                .dispatch(&format!("w{}", i % 4), Priority::Normal);
            Item::new(subject, &format!("burst-{i}"), &i).unwrap()
        })
        .collect()
}

/// What each stored message of `stream` says, in the stream's order.
async fn stored(client: &AxClient, stream: &str) -> Vec<u64> {
    let stream = client.js.get_stream(stream).await.unwrap();
    let last = stream.get_info().await.unwrap().state.last_sequence;
    let mut out = Vec::new();
    for seq in 1..=last {
        if let Ok(message) = stream.get_raw_message(seq).await {
            out.push(codec::decode::<u64>(&message.payload).unwrap());
        }
    }
    out
}

/// Awaits every answer, all within a minute (a publisher that gives up on lost acks one by
/// one, 5 s each, misses it); the numbers reported stored.
async fn outcomes(stored: Vec<burst::Stored>, from: u64) -> (Vec<u64>, usize) {
    let mut ok = Vec::new();
    let mut failed = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for (i, answer) in stored.into_iter().enumerate() {
        match tokio::time::timeout_at(deadline, answer)
            .await
            .expect("every message of a burst is answered within a minute")
        {
            Ok(()) => ok.push(from + i as u64),
            Err(_) => failed += 1,
        }
    }
    (ok, failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_stored_once_in_order_with_a_few_answers() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let stream = client.layout.dispatch_stream();
    // Every answer the server sends to a client inbox, the batch's included.
    let monitor = async_nats::connect(nats.url()).await.unwrap();
    let mut answers = monitor.subscribe("_INBOX.>").await.unwrap();
    monitor.flush().await.unwrap();

    let (ok, failed) = outcomes(burst::publish(&client, items(&client, 0, 1_000)), 0).await;
    assert_eq!((ok.len(), failed), (1_000, 0));
    let mut count = 0;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(500), answers.next()).await {
        count += 1;
    }
    drop(answers);
    eprintln!("{count} answers for 1,000 messages");
    // A plain publish is answered once per message; the batch every 512 or so, and at its
    // start and end.
    assert!(count <= 20, "{count} answers for 1,000 messages");
    assert_eq!(
        stored(&client, &stream).await,
        (0..1_000).collect::<Vec<_>>()
    );

    // The same burst again (a redelivery of what caused it) with 500 new: nothing twice.
    let (ok, failed) = outcomes(burst::publish(&client, items(&client, 500, 1_000)), 500).await;
    assert_eq!((ok.len(), failed), (1_000, 0));
    assert_eq!(
        stored(&client, &stream).await,
        (0..1_500).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_batches_gets_the_burst_one_by_one() {
    let nats = TestNats::start();
    let client = nats.client().await;
    client
        .js
        .create_stream(stream::Config {
            name: "PLAIN".into(),
            subjects: vec!["plain.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let items = (0..300)
        .map(|i: u64| Item::new(format!("plain.{i}"), &format!("p-{i}"), &i).unwrap())
        .collect();
    let (ok, failed) = outcomes(burst::publish(&client, items), 0).await;
    assert_eq!((ok.len(), failed), (300, 0));
    assert_eq!(stored(&client, "PLAIN").await, (0..300).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_server_cannot_take_fails_alone() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let stream = client.layout.dispatch_stream();
    let max_payload = client.nats.server_info().max_payload;
    let mut items = items(&client, 0, 10);
    // Larger than the server takes (its max_payload): refused before it leaves the client.
    items[4] = Item::new(
        client.subjects().dispatch("w0", Priority::Normal),
        "burst-too-large",
        &vec![7u8; max_payload + 1],
    )
    .unwrap();
    let answers: Vec<_> = burst::publish(&client, items);
    let mut results = Vec::new();
    for answer in answers {
        results.push(answer.await.is_ok());
    }
    assert_eq!(
        results,
        [true, true, true, true, false, true, true, true, true, true]
    );
    assert_eq!(stored(&client, &stream).await, [0, 1, 2, 3, 5, 6, 7, 8, 9]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_a_nats_restart_what_is_reported_stored_is_stored_once() {
    let mut nats = TestNats::start();
    let client = nats.client().await;
    let stream = client.layout.dispatch_stream();
    let answers = burst::publish(&client, items(&client, 0, 50_000));
    // Restarted while the burst is on its way.
    wait_for(
        Duration::from_secs(60),
        "part of the burst stored",
        || async {
            let info = client
                .js
                .get_stream(&stream)
                .await
                .ok()?
                .get_info()
                .await
                .ok()?;
            (info.state.messages >= 1_000).then_some(())
        },
    )
    .await;
    nats.server.restart().unwrap();
    let (ok, failed) = outcomes(answers, 0).await;
    let kept = wait_for(
        Duration::from_secs(60),
        "the stream readable again",
        || async {
            client.js.get_stream(&stream).await.ok()?;
            Some(stored(&client, &stream).await)
        },
    )
    .await;
    let unique: BTreeSet<u64> = kept.iter().copied().collect();
    eprintln!(
        "{} reported stored, {failed} not; {} in the stream",
        ok.len(),
        kept.len()
    );
    assert_eq!(unique.len(), kept.len(), "a message stored twice");
    let lost: Vec<_> = ok.iter().filter(|i| !unique.contains(i)).take(10).collect();
    assert!(
        lost.is_empty(),
        "reported stored, not in the stream: {lost:?}"
    );
    assert!(!ok.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_open_together_on_one_stream_are_each_stored_in_full() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let stream = client.layout.dispatch_stream();
    // The second batch open on a stream starts at an answer a message and ramps up.
    let first = burst::publish(&client, items(&client, 0, 2_000));
    let second = burst::publish(&client, items(&client, 2_000, 2_000));
    let ((ok_first, failed_first), (ok_second, failed_second)) =
        tokio::join!(outcomes(first, 0), outcomes(second, 2_000));
    assert_eq!(
        (ok_first.len(), failed_first, ok_second.len(), failed_second),
        (2_000, 0, 2_000, 0)
    );
    let kept = stored(&client, &stream).await;
    assert_eq!(kept.iter().copied().collect::<BTreeSet<_>>().len(), 4_000);
    // Each burst's messages are stored in its order.
    for range in [0..2_000u64, 2_000..4_000] {
        let own: Vec<u64> = kept.iter().copied().filter(|i| range.contains(i)).collect();
        assert_eq!(own, range.collect::<Vec<_>>());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_stream_stores_what_fits_and_the_rest_is_reported_not_stored() {
    let nats = TestNats::start();
    let client = nats.client().await;
    // Refuses the sixth message on: the batch ends there (an error in the batch), and what
    // follows is published one by one, each refused for itself.
    client
        .js
        .create_stream(stream::Config {
            name: "FULL".into(),
            subjects: vec!["full.>".into()],
            max_messages: 5,
            discard: stream::DiscardPolicy::New,
            allow_batch_publish: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let items = (0..10)
        .map(|i: u64| Item::new(format!("full.{i}"), &format!("f-{i}"), &i).unwrap())
        .collect();
    let mut results = Vec::new();
    for answer in burst::publish(&client, items) {
        results.push(answer.await.is_ok());
    }
    assert_eq!(
        results,
        [true, true, true, true, true, false, false, false, false, false]
    );
    assert_eq!(stored(&client, "FULL").await, [0, 1, 2, 3, 4]);
}

/// The creator's pipeline under a burst bigger than its batches: 1,500 jobs due at one instant
/// on a Scheduler-only node, the nats-server stopped for 2 s just as they fire, while records
/// are being stored and handed on. Every fire is created once and handed on once: one record
/// per job, and one hand-off per instance in `AX_FLOW`, for every instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fires_due_together_across_a_nats_restart_are_created_and_handed_on_once_each() {
    const JOBS: usize = 1_500;
    let mut nats = TestNats::start();
    let client = nats.client().await;
    set_up(&nats.url()).await;
    let at = ax_bus::time::now() + chrono::Duration::seconds(20);
    let at = chrono::DurationRound::duration_trunc(at, chrono::Duration::seconds(1)).unwrap();
    let cron = ax_bench::cron_at(at);
    let mut acks = Vec::with_capacity(JOBS);
    for i in 0..JOBS {
        let spec: ax_bus::JobSpec = serde_json::from_value(serde_json::json!({
            "name": format!("b{i}"),
            "cron": cron,
            "exec": {"type": "noop"},
        }))
        .unwrap();
        let record = ax_bus::messages::JobRecord {
            spec,
            paused: false,
            updated_at: ax_bus::time::now(),
            defined_at: None,
        };
        let subject = format!("$KV.{}.b{i}", client.layout.jobs_bucket());
        let ack = client
            .js
            .publish(subject, codec::encode(&record).unwrap())
            .await
            .unwrap();
        acks.push(ack);
    }
    for ack in acks {
        ack.await.unwrap();
    }
    let node = AxProcess::node(&nats, "n1", "scheduler", &[]);
    let wait = (at - ax_bus::time::now())
        .to_std()
        .expect("jobs stored before their instant");
    tokio::time::sleep(wait + Duration::from_millis(40)).await;
    nats.outage(Duration::from_secs(2)).await;
    let client = nats.client().await;
    // One hand-off per instance, each instance of the instant once.
    let handed = wait_for_logged(
        Duration::from_secs(120),
        "every fire handed on",
        &[&node],
        || async {
            let handed = hand_offs(&client).await;
            (handed.len() >= JOBS).then_some(handed)
        },
    )
    .await;
    let mut ids = std::collections::BTreeMap::<String, usize>::new();
    for work in &handed {
        assert_eq!(work.expected_time, at, "{}", work.instance_id);
        *ids.entry(work.instance_id.to_string()).or_default() += 1;
    }
    assert_eq!(ids.len(), JOBS, "instances handed on");
    assert!(
        ids.values().all(|n| *n == 1),
        "an instance handed on twice: {:?}",
        ids.iter().find(|(_, n)| **n > 1)
    );
    let records = client.instances(None).await.unwrap();
    assert_eq!(records.len(), JOBS, "one record per job");
    for record in &records {
        assert_eq!(ids.get(&record.instance_id.to_string()), Some(&1));
    }
}

/// Every hand-off waiting in `AX_FLOW` (a work-queue stream: read message by message).
async fn hand_offs(client: &AxClient) -> Vec<ax_bus::messages::WorkItem> {
    let Ok(mut stream) = client.js.get_stream(client.layout.flow_stream()).await else {
        return Vec::new();
    };
    let Ok(info) = stream.info().await else {
        return Vec::new();
    };
    let (first, last) = (info.state.first_sequence, info.state.last_sequence);
    let mut works = Vec::new();
    for seq in first..=last {
        if let Ok(message) = stream.get_raw_message(seq).await {
            if message.subject.starts_with("ax.internal.ready.") {
                if let Ok(work) = codec::decode(&message.payload) {
                    works.push(work);
                }
            }
        }
    }
    works
}
