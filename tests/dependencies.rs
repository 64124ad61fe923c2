//! Dependencies by business date: the article's example, the failure cascade, a coordinator
//! killed while instances wait, and the apply-time graph rules.

use crate::support;

use std::time::Duration;

use ax_bus::{AxClient, InstanceRecord, State, Tag};
use support::*;

const ARTICLE: &str = "version: v1
job:
  name: sync_order_daily
  exec: { type: shell, command: 'echo \"order {{biz_date}}\" >> LEDGER' }
---
version: v1
job:
  name: sync_pay_daily
  exec: { type: shell, command: 'echo \"pay {{biz_date}}\" >> LEDGER' }
---
version: v1
job:
  name: order_stat_daily
  deps:
    - { name: sync_order_daily, biz_date: current, check: success }
    - { name: sync_pay_daily, biz_date: current, check: success }
  exec: { type: shell, command: 'echo \"stat {{biz_date}}\" >> LEDGER' }
";

fn article(nats: &TestNats) -> std::path::PathBuf {
    article_with(nats, ARTICLE)
}

fn article_with(nats: &TestNats, text: &str) -> std::path::PathBuf {
    let ledger = nats.path("jobs").join("ledger");
    let yaml = text.replace("LEDGER", ledger.to_str().unwrap());
    job_file(&nats.path("jobs"), "article.yaml", &yaml);
    ledger
}

/// The instances of `job` for `date`.
async fn of_date(client: &AxClient, job: &str, date: &str) -> Vec<InstanceRecord> {
    instances(client, job)
        .await
        .into_iter()
        .filter(|r| r.biz_date == date)
        .collect()
}

async fn waiting_instance(client: &AxClient, job: &str, date: &str) -> InstanceRecord {
    wait_for(
        Duration::from_secs(15),
        &format!("{job} {date} to wait"),
        || async {
            of_date(client, job, date)
                .await
                .into_iter()
                .find(|r| r.state == State::Running && r.tag == Tag::WaitingDeps)
        },
    )
    .await
}

/// Publishes the success of `spec`'s instance expected at `at` for business date `day`, as a
/// Reporter does; returns the instance's id.
async fn publish_success(
    client: &AxClient,
    spec: &ax_bus::spec::JobSpec,
    at: chrono::DateTime<chrono::Utc>,
    day: &str,
    trigger: ax_bus::instance::Trigger,
) -> ax_bus::ids::InstanceId {
    let mut record =
        ax_actors::NewInstance::new(spec, at, day.into(), Default::default(), trigger, at).record;
    record.state = State::Success;
    let result = ax_bus::messages::ResultMessage::from_record(&record);
    ax_actors::jetstream::publish::to_stream_acked(
        client,
        client.subjects().result(&spec.name),
        &format!("result:{}", result.trace_id),
        &result,
    )
    .await
    .unwrap();
    record.instance_id
}

/// Stores in the registry, as a Scheduler's apply does, a job that depends on `upstream`
/// (which need not be applied): the coordinator then keeps an entry per instance of
/// `upstream`, where a job nothing depends on has only a note of each day. It has a cron (once
/// a year, and no Scheduler runs here), so the coordinator creates none of its instances.
async fn depended_on(client: &AxClient, upstream: &str) {
    let spec: ax_bus::spec::JobSpec = serde_json::from_value(serde_json::json!({
        "name": format!("after_{upstream}"),
        "cron": "0 0 0 1 1 *",
        "deps": [{"name": upstream, "biz_date": "current"}],
        "exec": {"type": "noop"},
    }))
    .unwrap();
    let now = ax_bus::time::now();
    let record = ax_bus::messages::JobRecord {
        spec: spec.clone(),
        paused: false,
        updated_at: now,
        defined_at: Some(now),
    };
    client
        .jobs
        .create(spec.name.as_str(), ax_bus::codec::encode(&record).unwrap())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stat_job_runs_only_after_both_syncs_of_the_same_date() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let ledger = article(&nats);
    let file = nats.path("jobs").join("article.yaml");
    let out = ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));

    let order = trigger(&nats, &["sync_order_daily", "--biz-date", "2026-01-01"]);
    final_record(&client, &order, Duration::from_secs(15)).await;
    // The stat job has no cron: its instance for the date appears with the first upstream and
    // waits for the other one.
    let stat = waiting_instance(&client, "order_stat_daily", "2026-01-01").await;
    // Its record names only what is still missing: sync_order_daily came.
    let said = wait_for(
        Duration::from_secs(15),
        "the missing upstream named",
        || async {
            let (record, _) = client.instance(&stat.instance_id).await.ok()??;
            (!record.message.contains("sync_order_daily")).then_some(record.message)
        },
    )
    .await;
    assert_eq!(said, "waiting for `sync_pay_daily` for 2026-01-01");

    // Another date's success does not count.
    let other = trigger(&nats, &["sync_pay_daily", "--biz-date", "2026-01-02"]);
    final_record(&client, &other, Duration::from_secs(15)).await;
    waiting_instance(&client, "order_stat_daily", "2026-01-02").await;
    let still = client.instance(&stat.instance_id).await.unwrap().unwrap().0;
    assert_eq!((still.state, still.tag), (State::Running, Tag::WaitingDeps));

    let pay = trigger(&nats, &["sync_pay_daily", "--biz-date", "2026-01-01"]);
    let pay = final_record(&client, &pay, Duration::from_secs(15)).await;
    let stat = final_record(&client, &stat.instance_id, Duration::from_secs(15)).await;
    assert_eq!(stat.state, State::Success, "{}", stat.message);
    assert!(stat.started_at.unwrap() >= pay.finished_at.unwrap());
    assert_eq!(
        lines_of(&ledger),
        [
            "order 2026-01-01",
            "pay 2026-01-02",
            "pay 2026-01-01",
            "stat 2026-01-01"
        ]
    );
    let later = of_date(&client, "order_stat_daily", "2026-01-02").await;
    assert_eq!(
        (later[0].state, later[0].tag),
        (State::Running, Tag::WaitingDeps)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_upstream_cancels_the_downstream_chain() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(
        &nats,
        "chain",
        "version: v1
job: { name: extract, exec: { type: shell, command: 'exit 2' } }
---
version: v1
job:
  name: transform
  deps: [ { name: extract } ]
  exec: { type: shell, command: 'true' }
---
version: v1
job:
  name: report
  cron: '0 7 * * *'
  deps: [ { name: transform } ]
  exec: { type: shell, command: 'true' }
",
    )
    .await;
    // The report job has a cron: a manual run of it waits like a fire would.
    let report = trigger(&nats, &["report", "--biz-date", "2026-02-01"]);
    let extract = trigger(&nats, &["extract", "--biz-date", "2026-02-01"]);
    let extract = final_record(&client, &extract, Duration::from_secs(15)).await;
    assert_eq!(extract.state, State::Failed);
    let transform = wait_for(Duration::from_secs(15), "transform cancelled", || async {
        of_date(&client, "transform", "2026-02-01")
            .await
            .into_iter()
            .find(|r| r.state.is_final())
    })
    .await;
    assert_eq!(
        (transform.state, transform.tag),
        (State::Cancelled, Tag::UpstreamFailed)
    );
    assert!(
        transform
            .message
            .contains("`extract` for 2026-02-01 failed"),
        "{}",
        transform.message
    );
    let report = final_record(&client, &report, Duration::from_secs(15)).await;
    assert_eq!(
        (report.state, report.tag),
        (State::Cancelled, Tag::UpstreamFailed)
    );
    assert!(report.message.contains("`transform`"), "{}", report.message);
}

/// A coordinator whose view takes longer to read back than its lease lives (a large history on
/// a loaded machine) renews the lease while it reads, and leads: seen once in the benchmark, a
/// lead that outlasted the lease lost it, began again, outlasted it again, for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_slower_to_lead_than_its_lease_lives_still_leads() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _core = AxProcess::node(&nats, "core", "scheduler,router,worker", &[]);
    let url = nats.url();
    let coordinator = AxProcess::node_with_env(
        &url,
        &nats,
        "d1",
        "dag",
        &[],
        &[("AX_TEST_LEAD_DELAY_SECS", "9")],
    );
    apply_noop_chain(&nats).await;
    let up = trigger(&nats, &["up", "--biz-date", "2026-03-02"]);
    final_record(&client, &up, Duration::from_secs(30)).await;
    let down = trigger(&nats, &["down", "--biz-date", "2026-03-02"]);
    let down = final_record(&client, &down, Duration::from_secs(60)).await;
    assert_eq!(down.state, State::Success, "{}", coordinator.log_text());
    // Renewed on: three renewals after leading (4.5 s), none of them lost (a lease that lapsed
    // while the view was read is lost at the first renewal after it, and the lead begins again).
    let since = client.leases.entry("dag").await.unwrap().unwrap().revision;
    wait_for(Duration::from_secs(30), "three renewals", || async {
        let entry = client.leases.entry("dag").await.ok()??;
        (entry.value.as_ref() == b"d1" && entry.revision >= since + 3).then_some(())
    })
    .await;
    assert!(
        !coordinator.log_text().contains("lease `dag` lost"),
        "{}",
        coordinator.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_killed_while_instances_wait_loses_nothing() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _core = AxProcess::node(&nats, "core", "scheduler,router,worker", &[]);
    let mut coordinator = AxProcess::node(&nats, "d1", "dag", &[]);
    // The payment sync takes a while, so that it can end while no coordinator runs.
    let slow = ARTICLE.replace("'echo \"pay", "'sleep 3; echo \"pay");
    assert_ne!(slow, ARTICLE);
    let ledger = article_with(&nats, &slow);
    let file = nats.path("jobs").join("article.yaml");
    let out = ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));

    let order = trigger(&nats, &["sync_order_daily", "--biz-date", "2026-03-01"]);
    final_record(&client, &order, Duration::from_secs(15)).await;
    let stat = waiting_instance(&client, "order_stat_daily", "2026-03-01").await;
    let pay = trigger(&nats, &["sync_pay_daily", "--biz-date", "2026-03-01"]);
    executing(&client, &pay, Duration::from_secs(15)).await;
    coordinator.kill9();

    // The last upstream ends while no coordinator runs; the stat job keeps waiting.
    let pay = final_record(&client, &pay, Duration::from_secs(15)).await;
    assert_eq!(pay.state, State::Success);
    let waiting = client.instance(&stat.instance_id).await.unwrap().unwrap().0;
    assert_eq!(waiting.tag, Tag::WaitingDeps);

    // Another node takes the lead once the dead one's lease has expired.
    let _successor = AxProcess::node(&nats, "d2", "dag", &[]);
    let stat = final_record(&client, &stat.instance_id, Duration::from_secs(30)).await;
    assert_eq!(stat.state, State::Success, "{}", stat.message);
    let stats = lines_of(&ledger)
        .into_iter()
        .filter(|l| l.starts_with("stat"))
        .count();
    assert_eq!(stats, 1, "the stat job ran {stats} times");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graph_errors_are_refused_at_apply_time() {
    let nats = TestNats::start();
    let _node = AxProcess::node(&nats, "n1", "scheduler", &[]);
    set_up(&nats.url()).await;
    let dir = nats.path("jobs");
    let cases = [
        (
            "cycle",
            "version: v1\njob:\n  name: a\n  deps: [ { name: c } ]\n  exec: { type: shell, command: 'true' }\n---\nversion: v1\njob:\n  name: b\n  deps: [ { name: a } ]\n  exec: { type: shell, command: 'true' }\n---\nversion: v1\njob:\n  name: c\n  deps: [ { name: b } ]\n  exec: { type: shell, command: 'true' }\n",
            ":4: job.deps: cycle: a -> c -> b -> a",
        ),
        (
            "self",
            "version: v1\njob:\n  name: a\n  deps: [ { name: a } ]\n  exec: { type: shell, command: 'true' }\n",
            ":4: job.deps[0].name: `a` cannot depend on itself",
        ),
        (
            "unknown",
            "version: v1\njob:\n  name: a\n  deps: [ { name: ghost } ]\n  exec: { type: shell, command: 'true' }\n",
            ":4: job.deps[0].name: unknown job `ghost`",
        ),
        (
            "offset",
            "version: v1\njob:\n  name: a\n  deps:\n    - name: b\n      biz_date: -1x\n  exec: { type: shell, command: 'true' }\n",
            ":5: job.deps[0].biz_date: `-1x` is not a date offset",
        ),
    ];
    for (what, yaml, expected) in cases {
        let file = job_file(&dir, &format!("{what}.yaml"), yaml);
        let out = ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()]);
        assert!(!out.status.success(), "{what} was applied");
        let err = stderr(&out);
        assert!(err.contains(expected), "{what}: {err}");
    }
    let client = nats.client().await;
    assert!(client.jobs().await.unwrap().is_empty());

    // A job others depend on cannot be deleted.
    apply_job(
        &nats,
        "pair",
        "version: v1\njob: { name: up, exec: { type: shell, command: 'true' } }\n---\nversion: v1\njob:\n  name: down\n  deps: [ { name: up } ]\n  exec: { type: shell, command: 'true' }\n",
    )
    .await;
    let out = ax(&nats.url(), &["job", "delete", "up"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("`up` is a dependency of down"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_longer_than_deps_timeout_fails() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(
        &nats,
        "timeout",
        "version: v1
job: { name: never, exec: { type: shell, command: 'true' } }
---
version: v1
job:
  name: impatient
  cron: '0 9 * * *'
  deps: [ { name: never } ]
  deps_timeout: 1
  exec: { type: shell, command: 'true' }
",
    )
    .await;
    let id = trigger(&nats, &["impatient", "--biz-date", "2026-05-01"]);
    let record = final_record(&client, &id, Duration::from_secs(15)).await;
    assert_eq!(
        (record.state, record.tag),
        (State::Failed, Tag::DepsTimeout)
    );
    assert!(
        record.message.contains("`never` for 2026-05-01"),
        "{}",
        record.message
    );
}

/// A job firing every second has 86,400 instances a day. Stored as one value per (job, date),
/// the day outgrew NATS's 1 MiB payload limit after some 30,000 and the coordinator could store
/// nothing more; each instance is now an entry of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_of_a_job_firing_every_second_is_stored_in_full() {
    use ax_actors::jetstream::publish::{to_stream, AckWindow};
    use ax_actors::NewInstance;
    use ax_bus::instance::Trigger;

    const INSTANCES: usize = 40_000;
    let nats = TestNats::start();
    let client = nats.client().await;
    depended_on(&client, "every_second").await;
    let mut coordinator = AxProcess::node(&nats, "d1", "dag", &[]);
    let spec: ax_bus::spec::JobSpec = serde_json::from_value(serde_json::json!({
        "name": "every_second",
        "cron": "* * * * * *",
        "exec": {"type": "noop"},
    }))
    .unwrap();
    let date = chrono::NaiveDate::from_ymd_opt(2026, 3, 1).unwrap();
    let midnight = date.and_hms_opt(0, 0, 0).unwrap().and_utc();
    // Hand the coordinator the creations as the Scheduler does.
    let mut acks = AckWindow::new(256);
    for second in 0..INSTANCES {
        let expected = midnight + chrono::Duration::seconds(second as i64);
        let work = NewInstance::new(
            &spec,
            expected,
            "2026-03-01".into(),
            Default::default(),
            Trigger::Cron,
            expected,
        )
        .work;
        let subject = client.subjects().created(&spec.name);
        let msg_id = format!("created:{}", work.trace_id);
        acks.push(to_stream(&client, subject, &msg_id, &work).await.unwrap())
            .await
            .unwrap();
    }
    acks.flush().await.unwrap();

    let deps_stream = format!("KV_{}", client.layout.deps_bucket());
    wait_for(
        Duration::from_secs(180),
        "every instance of the day stored",
        || async {
            let mut stream = client.js.get_stream(&deps_stream).await.ok()?;
            let stored = stream.info().await.ok()?.state.messages;
            (stored as usize >= INSTANCES).then_some(())
        },
    )
    .await;
    let day = client.deps_of_day(&spec.name, date).await.unwrap();
    assert_eq!(day.instances.len(), INSTANCES);
    assert!(day.instances.values().all(|e| *e == (1, State::Running)));

    // A successor restores the day and goes on with it.
    coordinator.kill9();
    let _successor = AxProcess::node(&nats, "d2", "dag", &[]);
    let last_second = midnight + chrono::Duration::seconds(INSTANCES as i64 - 1);
    let last = publish_success(&client, &spec, last_second, "2026-03-01", Trigger::Cron).await;
    wait_for(Duration::from_secs(60), "the result noted", || async {
        let day = client.deps_of_day(&spec.name, date).await.ok()?;
        (day.instances.get(&last) == Some(&(1, State::Success)) && day.instances.len() == INSTANCES)
            .then_some(())
    })
    .await;
}

/// The deps bucket as versions before per-instance entries left it (one value per (job, date))
/// is rewritten when the coordinator reads that day (a wait names it), and what it says still
/// counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deps_day_stored_by_an_earlier_version_still_counts() {
    use ax_bus::messages::DateInstances;

    let nats = TestNats::start();
    let client = nats.client().await;
    let date = chrono::NaiveDate::from_ymd_opt(2026, 3, 1).unwrap();
    let legacy = DateInstances {
        instances: [(support::id("up.20260301T000000000Z"), (1, State::Success))].into(),
        ..Default::default()
    };
    client
        .deps
        .put("20260301.up", ax_bus::codec::encode(&legacy).unwrap())
        .await
        .unwrap();
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_noop_chain(&nats).await;
    let down = trigger(&nats, &["down", "--biz-date", "2026-03-01"]);
    let record = final_record(&client, &down, Duration::from_secs(30)).await;
    assert_eq!(record.state, State::Success, "{}", record.message);
    wait_for(
        Duration::from_secs(30),
        "the legacy day rewritten",
        || async {
            let legacy_gone = client.deps.get("20260301.up").await.ok()?.is_none();
            let day = client.deps_of_day(&support::job("up"), date).await.ok()?;
            (legacy_gone && day.instances == legacy.instances).then_some(())
        },
    )
    .await;
}

/// The coordinator reads results through a consumer acknowledged cumulatively, one per term
/// of leadership. On the first start after an upgrade it takes over from the explicit-ack
/// consumer of earlier versions at that one's ack floor (what it settled is not read again,
/// what it left is) and removes it; a later leader takes over at once what an earlier one had
/// in hand unsettled (a stalled leader's messages, which a cumulative ack would otherwise
/// settle unseen) and removes that one's consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_leader_reads_results_from_where_the_earlier_consumers_settled() {
    use async_nats::jetstream::consumer::{pull, AckPolicy};
    use futures::{StreamExt, TryStreamExt};

    let nats = TestNats::start();
    let client = nats.client().await;
    let stream = client
        .js
        .get_stream(client.layout.results_stream())
        .await
        .unwrap();
    // The coordinator's own consumers of the results (the OpenLineage events have theirs).
    let consumers = || async {
        let names: Vec<String> = stream.consumer_names().try_collect().await.unwrap();
        names
            .into_iter()
            .filter(|name| name.starts_with("dag-results"))
            .collect::<Vec<_>>()
    };
    let old: pull::Config = pull::Config {
        durable_name: Some("dag-results".into()),
        filter_subject: client.subjects().result_all(),
        ack_policy: AckPolicy::Explicit,
        ..Default::default()
    };
    let old = stream.create_consumer(old).await.unwrap();
    let spec: ax_bus::spec::JobSpec = serde_json::from_value(serde_json::json!({
        "name": "up", "exec": {"type": "noop"},
    }))
    .unwrap();
    depended_on(&client, "up").await;
    let date = |d: &str| chrono::NaiveDate::parse_from_str(d, "%Y-%m-%d").unwrap();
    let succeed = |day: &'static str| {
        let client = client.clone();
        let spec = spec.clone();
        async move {
            let at = date(day).and_hms_opt(1, 0, 0).unwrap().and_utc();
            let trigger = ax_bus::instance::Trigger::Manual;
            publish_success(&client, &spec, at, day, trigger).await;
        }
    };
    let noted = |day: &'static str| {
        let client = client.clone();
        let job = spec.name.clone();
        async move {
            let entry = client.deps_of_day(&job, date(day)).await.ok()?;
            (!entry.instances.is_empty()).then_some(())
        }
    };

    // An earlier version handled (and acknowledged) the first result, not the second.
    succeed("2026-03-01").await;
    let mut handled = one_message(&old).await;
    handled
        .next()
        .await
        .unwrap()
        .unwrap()
        .double_ack()
        .await
        .unwrap();
    succeed("2026-03-02").await;
    let mut first = AxProcess::node(&nats, "d1", "dag", &[]);
    wait_for(Duration::from_secs(30), "the left result noted", || {
        noted("2026-03-02")
    })
    .await;
    // Results are handled in order: had the new consumer started from the beginning, the
    // first day would be noted by now.
    assert!(
        noted("2026-03-01").await.is_none(),
        "a settled result was read again"
    );
    let term = wait_for(
        Duration::from_secs(10),
        "one consumer of the term",
        || async {
            match consumers().await.as_slice() {
                [only] if only.starts_with("dag-results-") => Some(only.clone()),
                _ => None,
            }
        },
    )
    .await;
    let info = wait_for(Duration::from_secs(10), "the batch settled", || async {
        let info = stream.consumer_info(&term).await.ok()?;
        (info.ack_floor.stream_sequence == 2).then_some(info)
    })
    .await;
    assert_eq!(info.config.ack_policy, AckPolicy::All);

    // A leader stalled with a result in hand, then gone: the next leader reads it at once
    // (not after its ack wait of a minute), and the stalled one's consumer is removed.
    first.kill9();
    // Its pull requests die with its connection; a result published while the server still
    // held one would be in the dead leader's hands, not in the stalled one's.
    wait_for(
        Duration::from_secs(10),
        "the killed leader's pulls gone",
        || async {
            let info = stream.consumer_info(&term).await.ok()?;
            (info.num_waiting == 0).then_some(())
        },
    )
    .await;
    succeed("2026-03-03").await;
    let stalled: async_nats::jetstream::consumer::PullConsumer =
        stream.get_consumer(&term).await.unwrap();
    let mut in_hand = one_message(&stalled).await;
    let _in_hand = in_hand.next().await.unwrap().unwrap();
    let _second = AxProcess::node(&nats, "d2", "dag", &[]);
    wait_for(Duration::from_secs(30), "the result in hand noted", || {
        noted("2026-03-03")
    })
    .await;
    let names = consumers().await;
    assert!(
        names.len() == 1 && names[0] != term && names[0].starts_with("dag-results-"),
        "{names:?}"
    );
}

/// The coordinator holds the days of the jobs a decision can name, not of every job: a job
/// nothing depends on has its instances saved in the deps bucket only. A downstream applied
/// later has its upstream's stored days read then, and runs for a date its upstream succeeded
/// for before it existed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_applied_later_counts_what_its_upstream_did_before() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(
        &nats,
        "up",
        "version: v1\njob:\n  name: up\n  exec: { type: noop }\n",
    )
    .await;
    let up = trigger(&nats, &["up", "--biz-date", "2026-03-02"]);
    let record = final_record(&client, &up, Duration::from_secs(30)).await;
    assert_eq!(record.state, State::Success, "{}", record.message);
    let date = chrono::NaiveDate::from_ymd_opt(2026, 3, 2).unwrap();
    let second = trigger(&nats, &["up", "--biz-date", "2026-03-02"]);
    final_record(&client, &second, Duration::from_secs(30)).await;
    // Nothing depends on `up` yet: its day is noted once, and its instances are read from
    // their records.
    wait_for(Duration::from_secs(30), "up's day noted", || async {
        let day = client.deps_of_day(&support::job("up"), date).await.ok()?;
        (day.instances.len() == 2).then_some(())
    })
    .await;
    let keys: Vec<String> = futures::TryStreamExt::try_collect(client.deps.keys().await.unwrap())
        .await
        .unwrap();
    assert_eq!(keys, ["20260302.up"]);
    // A note made again (a coordinator that took over, a result delivered again) leaves the
    // first one as it was.
    let first = client.deps.entry("20260302.up").await.unwrap().unwrap();
    client
        .note_days(&[(support::job("up"), date)])
        .await
        .unwrap();
    let again = client.deps.entry("20260302.up").await.unwrap().unwrap();
    assert_eq!((again.revision, again.value), (first.revision, first.value));
    let plan = ax(
        &nats.url(),
        &["rerun", "--json", "--biz-date", "2026-03-02", "--dry-run"],
    );
    assert!(plan.status.success(), "{}", stderr(&plan));
    for id in [&up, &second] {
        assert!(stdout(&plan).contains(id.as_str()), "{}", stdout(&plan));
    }
    apply_job(
        &nats,
        "down",
        "version: v1\njob:\n  name: down\n  deps:\n    - { name: up, biz_date: current, check: success }\n  exec: { type: noop }\n",
    )
    .await;
    let down = trigger(&nats, &["down", "--biz-date", "2026-03-02"]);
    let record = final_record(&client, &down, Duration::from_secs(30)).await;
    assert_eq!(record.state, State::Success, "{}", record.message);
}

/// A pull of one message from `consumer` that waits for it up to 10 s (a no-wait fetch finds
/// nothing yet on a loaded machine).
async fn one_message(
    consumer: &async_nats::jetstream::consumer::PullConsumer,
) -> async_nats::jetstream::consumer::pull::Batch {
    consumer
        .batch()
        .max_messages(1)
        .expires(Duration::from_secs(10))
        .messages()
        .await
        .unwrap()
}
