//! Compare-and-swap updates of instance records that start from a record the caller wrote
//! itself (the worker's `executing` write, handed to its Reporter): one round trip when nobody
//! changed the record since, and the same outcome as a fresh read when somebody did. A first
//! attempt's dispatch carries the record its creator stored, for the worker's first write.
//! An attempt that goes straight from its creation to its worker's end is stored as one
//! revision that tells its whole history; any other keeps every revision.

use crate::support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use ax_actors::NewInstance;
use ax_bus::client::Updated;
use ax_bus::instance::{TransitionRefused, Trigger};
use ax_bus::messages::StoredRecord;
use ax_bus::spec::JobDocument;
use ax_bus::{codec, AxClient, InstanceRecord, State};
use support::*;

/// A queued first attempt, as a Scheduler creates it.
fn queued() -> InstanceRecord {
    let spec: JobDocument =
        serde_json::from_str(r#"{"version":"v1","job":{"name":"j","exec":{"type":"noop"}}}"#)
            .unwrap();
    let now = ax_bus::time::now();
    NewInstance::new(
        &spec.job,
        now,
        "2026-11-30".into(),
        Default::default(),
        Trigger::Manual,
        now,
    )
    .record
}

/// Appends `mark` to the message, refusing a record whose message lacks `needs`.
fn mark(
    needs: &'static str,
    mark: &'static str,
) -> impl Fn(&InstanceRecord) -> Result<InstanceRecord, TransitionRefused> {
    move |r| {
        if !r.message.contains(needs) {
            return Err(TransitionRefused::AlreadyStarted);
        }
        let mut next = r.clone();
        next.message = format!("{} {mark}", r.message);
        Ok(next)
    }
}

fn known(record: InstanceRecord, revision: u64) -> Option<StoredRecord> {
    Some(StoredRecord {
        record: Box::new(record),
        revision,
    })
}

fn sent(client: &AxClient) -> u64 {
    client
        .nats
        .statistics()
        .out_messages
        .load(Ordering::Relaxed)
}

async fn written(client: &AxClient, update: Updated) -> (InstanceRecord, u64) {
    let Updated::Written(record, revision) = update else {
        panic!("not written: {update:?}");
    };
    let stored = client.instance(&record.instance_id).await.unwrap().unwrap();
    assert_eq!(stored, (*record.clone(), revision));
    (*record, revision)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_from_a_known_record_save_the_read_and_never_trust_a_stale_one() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let created = queued();
    let id = &created.instance_id.clone();
    let revision = client
        .instances
        .store_of(id)
        .create(id, codec::encode(&created).unwrap())
        .await
        .unwrap();

    // Current: one request (the write), no read.
    let before = sent(&client);
    let update = client
        .update_instance_from(id, known(created.clone(), revision), mark("queued", "a"))
        .await
        .unwrap();
    assert_eq!(sent(&client) - before, 1);
    let (after_a, revision_a) = written(&client, update).await;
    assert_eq!(after_a.message, "queued a");

    // Stale (someone wrote since): the transition applies to the stored record.
    let update = client
        .update_instance_from(id, known(created.clone(), revision), mark("queued", "b"))
        .await
        .unwrap();
    let (after_b, _) = written(&client, update).await;
    assert_eq!(after_b.message, "queued a b");

    // Refused on the stale record, accepted on the stored one: decided on the stored one.
    let update = client
        .update_instance_from(id, known(created.clone(), revision), mark(" b", "c"))
        .await
        .unwrap();
    let (after_c, _) = written(&client, update).await;
    assert_eq!(after_c.message, "queued a b c");

    // Refused on the stored record too: refused.
    let update = client
        .update_instance_from(id, known(after_a, revision_a), mark("never", "d"))
        .await
        .unwrap();
    assert!(
        matches!(update, Updated::Refused(TransitionRefused::AlreadyStarted)),
        "{update:?}"
    );
    let stored = client.instance(id).await.unwrap().unwrap().0;
    assert_eq!(stored.message, "queued a b c");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_carries_the_created_record_until_the_record_changes() {
    let nats = TestNats::start();
    let client = nats.client().await;
    // No Router yet: nothing changes a record after its creation.
    let _core = AxProcess::node(&nats, "core", "scheduler,dag", &[]);
    apply_job(
        &nats,
        "solo",
        "version: v1\njob: { name: solo, exec: { type: noop } }\n",
    )
    .await;
    apply_noop_chain(&nats).await;
    let mut ready = client
        .nats
        .subscribe(client.subjects().ready_all())
        .await
        .unwrap();
    let solo = trigger(&nats, &["solo"]);
    let down = trigger(&nats, &["down", "--biz-date", "2026-03-01"]);
    let work = next_ready(&mut ready, &solo).await;
    let carried = work
        .stored
        .expect("a created first attempt carries its record");
    assert_eq!(
        client.instance(&support::id(&solo)).await.unwrap(),
        Some((*carried.record, carried.revision))
    );

    // `down` waited for `up` (its record was tagged `waiting_deps` meanwhile): released
    // without the stale copy, and it runs.
    let _workers = AxProcess::node(&nats, "w", "router,worker", &[]);
    trigger(&nats, &["up", "--biz-date", "2026-03-01"]);
    let work = next_ready(&mut ready, &down).await;
    assert_eq!(work.stored, None);
    for id in [&solo, &down] {
        let record = final_record(&client, id, std::time::Duration::from_secs(30)).await;
        assert_eq!(
            record.state,
            ax_bus::State::Success,
            "{id}: {}",
            record.message
        );
    }
}

/// The next work item handed to a Router for `instance_id`.
async fn next_ready(
    ready: &mut async_nats::Subscriber,
    instance_id: &str,
) -> ax_bus::messages::WorkItem {
    use futures::StreamExt;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let message = tokio::time::timeout_at(deadline, ready.next())
            .await
            .unwrap_or_else(|_| panic!("no hand-off of {instance_id}"))
            .expect("subscription open");
        let work: ax_bus::messages::WorkItem = codec::decode(&message.payload).unwrap();
        if work.instance_id == instance_id {
            return work;
        }
    }
}

/// The state header of the write stored under `revision`.
async fn state_header(client: &AxClient, revision: u64) -> Option<String> {
    let stream = client
        .js
        .get_stream(format!("KV_{}", client.layout.instances_bucket()))
        .await
        .unwrap();
    let message = stream.get_raw_message(revision).await.unwrap();
    let header = message
        .headers
        .get(ax_bus::client::record_writes::STATE_HEADER)
        .map(|v| v.as_str().to_string());
    header
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_write_names_its_state_and_a_deleted_record_is_created_again() {
    // The consistency sweep reads the state from the header, never the record: a write
    // without it would cost a read, a wrong one would hide a stranded instance.
    let nats = TestNats::start();
    let client = nats.client().await;
    let created = queued();
    let id = &created.instance_id.clone();
    assert!(client.create_instance(&created).await.unwrap());
    let (_, revision) = client.instance(id).await.unwrap().unwrap();
    assert_eq!(
        state_header(&client, revision).await.as_deref(),
        Some("running")
    );
    // Its own earlier write (an ack lost): still ours; another trace's: not.
    assert!(client.create_instance(&created).await.unwrap());
    let mut other = created.clone();
    other.trace_id = ax_bus::ids::TraceId::random();
    assert!(!client.create_instance(&other).await.unwrap());

    let finish = |r: &InstanceRecord| {
        let mut next = r.clone();
        next.state = ax_bus::State::Success;
        Ok(next)
    };
    let update = client.update_instance(id, finish).await.unwrap();
    let (_, revision) = written(&client, update).await;
    assert_eq!(
        state_header(&client, revision).await.as_deref(),
        Some("success")
    );

    // Deleted (or purged), the key takes a new record, with its header.
    client.instances.store_of(id).delete(id).await.unwrap();
    assert!(client.instance(id).await.unwrap().is_none());
    assert!(client.create_instance(&other).await.unwrap());
    let (stored, revision) = client.instance(id).await.unwrap().unwrap();
    assert_eq!(stored.trace_id, other.trace_id);
    assert_eq!(
        state_header(&client, revision).await.as_deref(),
        Some("running")
    );
}

/// How many revisions of instance `id` the bucket holds.
async fn revisions(client: &AxClient, id: &str) -> usize {
    use futures::StreamExt;
    let entries = client
        .instances
        .history(&id.parse().unwrap())
        .await
        .unwrap();
    entries.count().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_instance_keeps_one_revision_that_tells_its_whole_history() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let job = |name: &str, command: &str| {
        format!(
            "version: v1\njob:\n  name: {name}\n  exec: {{ type: shell, command: '{command}' }}\n"
        )
    };
    apply_job(&nats, "ok", &job("ok", "true")).await;
    apply_job(&nats, "broken", &job("broken", "exit 3")).await;
    // A first run, so that the worker is known to the Router: a trigger that beats its first
    // heartbeat waits as `no_worker` first (a write of its own, which keeps every revision).
    let first = trigger(&nats, &["ok"]);
    final_record(&client, &first, Duration::from_secs(60)).await;
    let ok = trigger(&nats, &["ok"]);
    let broken = trigger(&nats, &["broken"]);
    // Delayed: created scheduled, released when due, then run: every revision is kept.
    let delayed = trigger(&nats, &["ok", "--in", "1s"]);
    for (instance, state) in [(&ok, State::Success), (&broken, State::Failed)] {
        let record = final_record(&client, instance, Duration::from_secs(60)).await;
        assert_eq!(record.state, state);
        assert_eq!(revisions(&client, instance).await, 1, "{instance}");
        let folded = record.folded.expect("folded");
        let history = client
            .instance_history(&id(instance))
            .await
            .unwrap()
            .expect("a history");
        let steps: Vec<(ax_bus::history::StepKind, u64)> =
            history.steps.iter().map(|s| (s.step, s.revision)).collect();
        use ax_bus::history::StepKind::*;
        assert_eq!(
            steps,
            [
                (Created, folded.created),
                (Dispatched, folded.executing),
                (Claimed, folded.executing),
                (Started, folded.executing),
                (Ended, history.steps[5].revision),
                (Reported, history.steps[5].revision),
            ],
            "{history:#?}"
        );
        assert!(
            history.steps[0].detail.starts_with("manual by n1"),
            "{history:#?}"
        );
        assert!(history.steps[3].worker.is_some(), "{history:#?}");
        assert!(folded.created < folded.executing && folded.executing < history.steps[5].revision);
    }
    let record = final_record(&client, &delayed, Duration::from_secs(60)).await;
    assert_eq!((record.state, record.folded), (State::Success, None));
    let kept = revisions(&client, &delayed).await;
    assert!(kept >= 4, "created, released, executing, final: {kept}");
}
