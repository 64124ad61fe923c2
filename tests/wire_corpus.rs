//! Wire compatibility: during a rolling upgrade old and new nodes read each other's records and
//! messages, and a new node reads what the old ones stored. `tests/wire/corpus.json` holds what
//! today's code writes — samples of every kind of record and message it keeps in a bucket or a
//! stream, taken from a real deployment — and every later build must read them all: each
//! decodes into its type, and written back it keeps every field it was given (a field renamed
//! or removed fails; a field added is fine). docs/operations.md has the rule for changing a
//! wire type and the upgrade order.
//!
//! `AX_WRITE_WIRE_CORPUS=1 cargo nextest run -E 'test(/wire_corpus/)'` takes the samples
//! afresh: only when a change is meant to break compatibility, said in the upgrade notes.

use crate::support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use ax_bus::auth::audit::AuditRecord;
use ax_bus::figures::DaySummary;
use ax_bus::log::LogChunk;
use ax_bus::messages::{
    Alert, DelayedWork, JobRecord, NodeStatus, QueueState, ResultMessage, TickRecord, WorkItem,
    WorkerInfo,
};
use ax_bus::partition::{FiredThrough, PartitionOwner};
use ax_bus::{codec, AxClient, InstanceRecord};
use support::*;

/// Samples kept of each kind.
const PER_KIND: usize = 3;

/// Where samples are taken: a bucket (`ax_…`, values by key) or a stream (`AX_…`, messages by
/// subject), with the subjects' prefix and pattern.
const PLACES: &[(&str, &str, &str)] = &[
    ("ax_instances", "$KV.ax_instances.", ">"),
    ("ax_jobs", "$KV.ax_jobs.", ">"),
    ("ax_summary", "$KV.ax_summary.", ">"),
    ("ax_partitions", "$KV.ax_partitions.", ">"),
    ("ax_queues", "$KV.ax_queues.", ">"),
    ("ax_workers", "$KV.ax_workers.", ">"),
    ("ax_nodes", "$KV.ax_nodes.", ">"),
    ("AX_RESULTS", "ax.result.", ">"),
    ("AX_TICKS", "ax.internal.tick.", ">"),
    ("AX_AUDIT", "ax.audit.", ">"),
    ("AX_ALERTS", "ax.alert.", ">"),
    ("AX_LOGS", "ax.log.", ">"),
    ("AX_DELAYED", "ax.internal.delayed.", ">"),
    ("AX_FLOW", "ax.internal.ready.", ">"),
];

/// One sample: where it was, under which key or subject, its bytes (hex).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Sample {
    place: String,
    key: String,
    hex: String,
}

fn corpus_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/wire/corpus.json")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

/// `bytes` decoded as `T` and encoded again.
fn again<T: DeserializeOwned + Serialize>(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let value: T = codec::decode(bytes).map_err(|e| e.to_string())?;
    codec::encode(&value)
        .map(|b| b.to_vec())
        .map_err(|e| e.to_string())
}

/// A sample read by this build's type for its place, and written back.
fn read_back(sample: &Sample, bytes: &[u8]) -> Result<Vec<u8>, String> {
    match sample.place.as_str() {
        "ax_instances" => again::<InstanceRecord>(bytes),
        "ax_jobs" => {
            let record = JobRecord::from_registry(bytes).map_err(|e| e.to_string())?;
            codec::encode(&record)
                .map(|b| b.to_vec())
                .map_err(|e| e.to_string())
        }
        "ax_summary" => again::<DaySummary>(bytes),
        "ax_partitions" if sample.key.starts_with(ax_bus::partition::FIRED_PREFIX) => {
            again::<FiredThrough>(bytes)
        }
        // The deployment's number of partitions, and of instance buckets, as text.
        "ax_partitions" if counted(&sample.key) => {
            let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
            let count: u16 = text.trim().parse().map_err(|e| format!("{text}: {e}"))?;
            Ok(count.to_string().into_bytes())
        }
        "ax_partitions" => again::<PartitionOwner>(bytes),
        "ax_queues" => again::<QueueState>(bytes),
        "ax_workers" => again::<WorkerInfo>(bytes),
        "ax_nodes" => again::<NodeStatus>(bytes),
        "AX_RESULTS" => again::<ResultMessage>(bytes),
        "AX_TICKS" => again::<TickRecord>(bytes),
        "AX_AUDIT" => again::<AuditRecord>(bytes),
        "AX_ALERTS" => again::<Alert>(bytes),
        "AX_LOGS" => again::<LogChunk>(bytes),
        "AX_DELAYED" => again::<DelayedWork>(bytes),
        "AX_FLOW" => again::<WorkItem>(bytes),
        other => Err(format!("no type for place `{other}`")),
    }
}

/// Whether `new` holds everything `old` holds: each key of a map (a nil in `old` may be left
/// out), each element of an array, each value equal.
fn covers(new: &rmpv::Value, old: &rmpv::Value, path: &str) -> Result<(), String> {
    use rmpv::Value;
    match (old, new) {
        (Value::Map(old), Value::Map(new)) => {
            for (key, old_value) in old {
                let name = key.as_str().map_or_else(|| key.to_string(), str::to_string);
                let here = format!("{path}.{name}");
                match new.iter().find(|(k, _)| k == key) {
                    Some((_, new_value)) => covers(new_value, old_value, &here)?,
                    None if old_value.is_nil() => {}
                    None => return Err(format!("{here}: no longer written")),
                }
            }
            Ok(())
        }
        (Value::Array(old), Value::Array(new)) if old.len() == new.len() => {
            for (i, (o, n)) in old.iter().zip(new).enumerate() {
                covers(n, o, &format!("{path}[{i}]"))?;
            }
            Ok(())
        }
        (old, new) if old == new => Ok(()),
        (old, new) => Err(format!("{path}: written as {old}, read back as {new}")),
    }
}

fn document(bytes: &[u8]) -> Result<rmpv::Value, String> {
    rmpv::decode::read_value(&mut &bytes[..]).map_err(|e| e.to_string())
}

/// The messages stored in `place` now, as (key or subject after the prefix, bytes): read one by
/// one by sequence, so that a work queue's messages held by their consumers and a delayed
/// instance's schedule are read too. Deletions (empty values) are left out.
async fn stored(client: &AxClient, place: &str, prefix: &str) -> Vec<(String, Vec<u8>)> {
    let stream = if place.starts_with("ax_") {
        format!("KV_{place}")
    } else {
        place.to_string()
    };
    let Ok(stream) = client.js.get_stream(&stream).await else {
        return Vec::new();
    };
    let Ok(info) = stream.get_info().await else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for seq in info.state.first_sequence..=info.state.last_sequence {
        let Ok(message) = stream.get_raw_message(seq).await else {
            continue;
        };
        let Some(key) = message.subject.strip_prefix(prefix) else {
            continue;
        };
        if !message.payload.is_empty() {
            out.push((key.to_string(), message.payload.to_vec()));
        }
    }
    out
}

/// Samples of every place of a deployment that has run a bit of everything.
async fn record(client: &AxClient) -> Vec<Sample> {
    let mut samples = Vec::new();
    for (place, prefix, _) in PLACES {
        let found = stored(client, place, prefix).await;
        assert!(!found.is_empty(), "nothing in {place} to take a sample of");
        let mut by_shape: BTreeMap<String, usize> = BTreeMap::new();
        for (key, value) in found {
            // A few of each key's first word (`p.` and `fired.` of the partitions, say).
            let shape = key.split('.').next().unwrap_or_default().to_string();
            let taken = by_shape.entry(shape).or_default();
            if *taken < PER_KIND {
                *taken += 1;
                samples.push(Sample {
                    place: place.to_string(),
                    key,
                    hex: hex(&value),
                });
            }
        }
    }
    samples
}

/// A deployment where every place has something: a chain, a retry, output, a delayed trigger,
/// a paused cron job (skipped ticks), a paused queue holding work, a malformed command.
async fn run_a_bit_of_everything(nats: &TestNats) {
    let node = AxProcess::node(nats, "n1", "all", &[]);
    let jobs = [
        (
            "extract",
            "  exec: { type: shell, command: 'echo extracted; echo warn >&2' }\n",
        ),
        (
            "load",
            "  deps: [ { name: extract } ]\n  exec: { type: shell, command: 'echo loaded' }\n",
        ),
        (
            "flaky",
            "  retry: { times: 1, interval: 1 }\n  exec: { type: shell, command: 'exit 3' }\n",
        ),
        ("ticking", "  cron: '* * * * * *'\n  exec: { type: noop }\n"),
        ("later", "  exec: { type: noop }\n"),
        ("backlog", "  priority: low\n  exec: { type: noop }\n"),
    ];
    for (name, rest) in jobs {
        apply_job(
            nats,
            name,
            &format!("version: v1\njob:\n  name: {name}\n{rest}"),
        )
        .await;
    }
    let client = nats.client().await;
    let extract = trigger(nats, &["extract"]);
    let flaky = trigger(nats, &["flaky"]);
    trigger(nats, &["later", "--in", "1h"]);
    final_record(&client, &extract, Duration::from_secs(60)).await;
    final_record(&client, &flaky, Duration::from_secs(60)).await;
    wait_for(Duration::from_secs(60), "load to run", || async {
        instances(&client, "load")
            .await
            .first()
            .filter(|r| r.state.is_final())
            .map(|_| ())
    })
    .await;
    let paused = ax(&nats.url(), &["job", "pause", "ticking"]);
    assert!(paused.status.success(), "{}", stderr(&paused));
    let queue = ax(&nats.url(), &["queue", "pause", "low"]);
    assert!(queue.status.success(), "{}", stderr(&queue));
    trigger(nats, &["backlog"]);
    client
        .nats
        .publish(client.subjects().control("trigger"), "{not json".into())
        .await
        .unwrap();
    // Every place has something: the summary and the skipped ticks come last.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut empty = Vec::new();
        for (place, prefix, _) in PLACES {
            if stored(&client, place, prefix).await.is_empty() {
                empty.push(*place);
            }
        }
        if empty.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nothing in {empty:?}\n{}",
            node.log_text()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    drop(node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_todays_code_stores_is_read_by_this_build() {
    if std::env::var_os("AX_WRITE_WIRE_CORPUS").is_some() {
        let nats = TestNats::start();
        run_a_bit_of_everything(&nats).await;
        let samples = record(&nats.client().await).await;
        std::fs::create_dir_all(corpus_path().parent().unwrap()).unwrap();
        let text = serde_json::to_string_pretty(&samples).unwrap();
        std::fs::write(corpus_path(), text + "\n").unwrap();
    }
    let text = std::fs::read_to_string(corpus_path()).expect("tests/wire/corpus.json");
    let samples: Vec<Sample> = serde_json::from_str(&text).expect("the corpus");
    let places: std::collections::BTreeSet<&str> =
        samples.iter().map(|s| s.place.as_str()).collect();
    for (place, _, _) in PLACES {
        assert!(
            places.contains(place),
            "the corpus has no sample of {place}"
        );
    }
    let mut broken = Vec::new();
    for sample in &samples {
        let bytes = unhex(&sample.hex);
        let checked = read_back(sample, &bytes).and_then(|written| {
            if counted(&sample.key) {
                // Text, not MessagePack: read back as it was.
                return (written == bytes)
                    .then_some(())
                    .ok_or_else(|| "not read back".to_string());
            }
            covers(&document(&written)?, &document(&bytes)?, "")
        });
        if let Err(e) = checked {
            broken.push(format!("{} {}: {e}", sample.place, sample.key));
        }
    }
    assert!(
        broken.is_empty(),
        "not read as written:\n{}",
        broken.join("\n")
    );
}

/// The check itself: a renamed field, a removed one and a changed value are caught; an added
/// field and a nil left out are not.
#[test]
fn the_check_catches_a_renamed_or_removed_field_and_allows_an_added_one() {
    use rmpv::Value;
    let map = |pairs: Vec<(&str, Value)>| {
        Value::Map(
            pairs
                .into_iter()
                .map(|(k, v)| (Value::from(k), v))
                .collect(),
        )
    };
    let old = map(vec![
        ("job", Value::from("etl")),
        ("attempt", Value::from(2)),
        ("worker", Value::Nil),
        ("shard", map(vec![("index", Value::from(1))])),
    ]);
    let added = map(vec![
        ("job", Value::from("etl")),
        ("attempt", Value::from(2)),
        (
            "shard",
            map(vec![("index", Value::from(1)), ("total", Value::from(4))]),
        ),
        ("new_field", Value::from(true)),
    ]);
    assert_eq!(covers(&added, &old, ""), Ok(()));
    let renamed = map(vec![
        ("job_name", Value::from("etl")),
        ("attempt", Value::from(2)),
        ("shard", map(vec![("index", Value::from(1))])),
    ]);
    assert_eq!(
        covers(&renamed, &old, ""),
        Err(".job: no longer written".to_string())
    );
    let changed = map(vec![
        ("job", Value::from("etl")),
        ("attempt", Value::from("2")),
        ("shard", map(vec![("index", Value::from(1))])),
    ]);
    assert!(covers(&changed, &old, "").is_err());
    let nested = map(vec![
        ("job", Value::from("etl")),
        ("attempt", Value::from(2)),
        ("shard", map(vec![])),
    ]);
    assert_eq!(
        covers(&nested, &old, ""),
        Err(".shard.index: no longer written".to_string())
    );
}

/// Whether a key of the partitions bucket holds a count as text.
fn counted(key: &str) -> bool {
    key == ax_bus::partition::COUNT_KEY || key == ax_bus::client::instance_buckets::COUNT_KEY
}
