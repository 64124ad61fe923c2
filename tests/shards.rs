//! Sharding and broadcast with real worker processes: a sharded instance's shards run spread
//! over the workers and join into the parent; a failed shard fails the parent with
//! `shards_failed`; a shard whose worker is killed runs again elsewhere; a broadcast runs once on
//! every eligible worker; a re-run of the parent splits again.

use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use ax_bus::{AxClient, InstanceRecord, State, Tag};
use support::*;

/// The ended children of `parent`.
async fn children(client: &AxClient, job: &str, parent: &str) -> Vec<InstanceRecord> {
    instances(client, job)
        .await
        .into_iter()
        .filter(|r| r.shard.as_ref().is_some_and(|s| s.parent == parent))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_spread_over_workers_and_join_into_the_parent() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let _workers: Vec<_> = ["w1", "w2"]
        .iter()
        .map(|id| AxProcess::node(&nats, id, "worker", &["--slots", "2"]))
        .collect();
    wait_for(Duration::from_secs(15), "two live workers", || async {
        (client.workers().await.unwrap().len() == 2).then_some(())
    })
    .await;
    let ledger = nats.path("jobs").join("ledger");
    let line = format!(
        "sleep 0.3; echo $AX_SHARD_INDEX/$AX_SHARD_TOTAL >> {}",
        ledger.display()
    );
    apply_job(&nats, "split", &shell_job("split", "  shards: 4\n", &line)).await;
    let id = trigger(&nats, &["split"]);
    let parent = final_record(&client, &id, Duration::from_secs(40)).await;
    assert_eq!(parent.state, State::Success, "{}", parent.message);
    assert_eq!(parent.tag, Tag::Completed);
    assert_eq!(sorted_lines_of(&ledger), ["0/4", "1/4", "2/4", "3/4"]);
    let shards = children(&client, "split", &id).await;
    assert_eq!(shards.len(), 4);
    assert!(shards.iter().all(|r| r.state == State::Success));
    let workers: BTreeSet<_> = shards.iter().filter_map(|r| r.worker.clone()).collect();
    assert_eq!(workers.len(), 2, "shards ran on {workers:?}");

    // A re-run of the parent splits again and runs every shard once more.
    let out = ax(&nats.url(), &["rerun", "--instance", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rerun = wait_for(Duration::from_secs(40), "the re-run to end", || async {
        let record = client.instance(&support::id(&id)).await.unwrap()?.0;
        (record.attempt == 2 && record.state.is_final()).then_some(record)
    })
    .await;
    assert_eq!(rerun.state, State::Success, "{}", rerun.message);
    assert_eq!(sorted_lines_of(&ledger).len(), 8);
    assert!(children(&client, "split", &id)
        .await
        .iter()
        .all(|r| r.state == State::Success && r.attempt == 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_shard_fails_the_parent_and_names_itself() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let _worker = AxProcess::node(&nats, "w1", "worker", &[]);
    apply_job(
        &nats,
        "partly",
        &shell_job("partly", "  shards: 3\n", "test $AX_SHARD_INDEX != 1"),
    )
    .await;
    let id = trigger(&nats, &["partly"]);
    let parent = final_record(&client, &id, Duration::from_secs(40)).await;
    assert_eq!(parent.state, State::Failed);
    assert_eq!(parent.tag, Tag::ShardsFailed);
    assert!(
        parent.message.contains(&format!("{id}.s1")),
        "{}",
        parent.message
    );
    let mut states: Vec<_> = children(&client, "partly", &id)
        .await
        .into_iter()
        .map(|r| (r.instance_id.to_string(), r.state))
        .collect();
    states.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        states,
        [
            (format!("{id}.s0"), State::Success),
            (format!("{id}.s1"), State::Failed),
            (format!("{id}.s2"), State::Success),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_whose_worker_is_killed_runs_again_elsewhere() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let mut doomed = AxProcess::node(&nats, "doomed", "worker", &[]);
    let ledger = nats.path("jobs").join("ledger");
    let line = format!(
        "sleep 3; echo $AX_SHARD_INDEX $AX_WORKER >> {}",
        ledger.display()
    );
    apply_job(
        &nats,
        "sliced",
        &shell_job("sliced", "  shards: 2\n", &line),
    )
    .await;
    let id = trigger(&nats, &["sliced"]);
    wait_for(
        Duration::from_secs(15),
        "both shards to run on the doomed worker",
        || async {
            let shards = children(&client, "sliced", &id).await;
            (shards.len() == 2 && shards.iter().all(|r| r.tag == Tag::Executing)).then_some(())
        },
    )
    .await;
    let _survivor = AxProcess::node(&nats, "survivor", "worker", &[]);
    doomed.kill9();
    let parent = final_record(&client, &id, Duration::from_secs(60)).await;
    assert_eq!(parent.state, State::Success, "{}", parent.message);
    assert_eq!(sorted_lines_of(&ledger), ["0 survivor", "1 survivor"]);
    for shard in children(&client, "sliced", &id).await {
        assert_eq!(shard.worker_losses, 1, "{}", shard.instance_id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcast_runs_once_on_every_eligible_worker() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let _a = AxProcess::node(&nats, "edge-a", "worker", &["--tags", "edge"]);
    let _b = AxProcess::node(&nats, "edge-b", "worker", &["--tags", "edge"]);
    let _other = AxProcess::node(&nats, "core-w", "worker", &[]);
    wait_for(Duration::from_secs(15), "three live workers", || async {
        (client.workers().await.unwrap().len() == 3).then_some(())
    })
    .await;
    let ledger = nats.path("jobs").join("ledger");
    let line = format!("echo $AX_WORKER >> {}", ledger.display());
    apply_job(
        &nats,
        "everywhere",
        &shell_job("everywhere", "  tags: [edge]\n  broadcast: true\n", &line),
    )
    .await;
    let id = trigger(&nats, &["everywhere"]);
    let parent = final_record(&client, &id, Duration::from_secs(40)).await;
    assert_eq!(parent.state, State::Success, "{}", parent.message);
    assert_eq!(sorted_lines_of(&ledger), ["edge-a", "edge-b"]);
    let mut runs: Vec<_> = children(&client, "everywhere", &id)
        .await
        .into_iter()
        .map(|r| (r.instance_id.to_string(), r.worker.map(|w| w.to_string())))
        .collect();
    runs.sort();
    assert_eq!(
        runs,
        [
            (format!("{id}.w-edge-a"), Some("edge-a".to_string())),
            (format!("{id}.w-edge-b"), Some("edge-b".to_string())),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcast_run_whose_worker_dies_fails_instead_of_moving() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let _steady = AxProcess::node(&nats, "steady", "worker", &[]);
    let mut doomed = AxProcess::node(&nats, "doomed", "worker", &[]);
    wait_for(Duration::from_secs(15), "two live workers", || async {
        (client.workers().await.unwrap().len() == 2).then_some(())
    })
    .await;
    let ledger = nats.path("jobs").join("ledger");
    let line = format!("sleep 3; echo $AX_WORKER >> {}", ledger.display());
    apply_job(
        &nats,
        "each",
        &shell_job("each", "  broadcast: true\n", &line),
    )
    .await;
    let id = trigger(&nats, &["each"]);
    let doomed_run = format!("{id}.w-doomed");
    executing(&client, &doomed_run, Duration::from_secs(15)).await;
    doomed.kill9();
    let parent = final_record(&client, &id, Duration::from_secs(60)).await;
    assert_eq!(parent.state, State::Failed);
    assert_eq!(parent.tag, Tag::ShardsFailed);
    let lost = final_record(&client, &doomed_run, Duration::from_secs(5)).await;
    assert_eq!(lost.state, State::Failed);
    assert_eq!(lost.tag, Tag::WorkerLost);
    assert_eq!(sorted_lines_of(&ledger), ["steady"], "it did not move");
}
