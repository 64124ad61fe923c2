//! Datasets in the spec and `ax lineage`: what a job writes (`produces:`) and reads
//! (`consumes:`), walked up and down from a dataset or a job; a producer's success recorded as
//! the dataset's update for its business date; a malformed URI refused on its line.

use crate::support;
use support::*;

use std::time::Duration;

use ax_bus::spec::dataset::DatasetUri;

const CHAIN: &str = "version: v1
job:
  name: load
  consumes: [ 's3://raw/orders' ]
  produces: [ 'warehouse://orders' ]
  exec: { type: noop }
---
version: v1
job:
  name: report
  consumes: [ 'warehouse://orders' ]
  produces: [ 'warehouse://report' ]
  exec: { type: noop }
---
version: v1
job:
  name: mail
  consumes: [ 'warehouse://report' ]
  exec: { type: noop }
";

fn lineage(nats: &TestNats, args: &[&str]) -> std::process::Output {
    let mut full = vec!["lineage"];
    full.extend_from_slice(args);
    ax(&nats.url(), &full)
}

fn edges(value: &serde_json::Value, way: &str) -> Vec<String> {
    value[way]
        .as_array()
        .expect("edges")
        .iter()
        .map(|e| {
            format!(
                "{}>{}",
                e["from"]["name"].as_str().unwrap(),
                e["to"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lineage_follows_the_declared_datasets_both_ways() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let file = job_file(&nats.path("jobs"), "chain.yaml", CHAIN);
    let applied = ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()]);
    assert!(applied.status.success(), "{}", stderr(&applied));

    let out = lineage(&nats, &["--json", "warehouse://orders", "--downstream"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(value["target"]["kind"], "dataset");
    assert_eq!(
        edges(&value, "downstream"),
        [
            "warehouse://orders>report",
            "report>warehouse://report",
            "warehouse://report>mail"
        ]
    );
    assert!(value.get("upstream").is_none());

    let out = lineage(&nats, &["--json", "mail", "--upstream", "--depth", "2"]);
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        edges(&value, "upstream"),
        ["warehouse://report>mail", "report>warehouse://report"]
    );

    // Both ways, as text.
    let out = lineage(&nats, &["report"]);
    let text = stdout(&out);
    assert!(text.starts_with("job report\nupstream:\n"), "{text}");
    assert!(text.contains("  warehouse://orders → job report"), "{text}");
    assert!(text.contains("    job load → warehouse://orders"), "{text}");
    assert!(
        text.contains("downstream:\n  job report → warehouse://report"),
        "{text}"
    );

    // Bad input: one clear line each.
    for (args, says) in [
        (vec!["warehouse://"], "DATASET: "),
        (
            vec!["warehouse://elsewhere"],
            "no job produces or consumes `warehouse://elsewhere`",
        ),
        (vec!["nobody"], "no job named `nobody`"),
    ] {
        let out = lineage(&nats, &args);
        assert!(!out.status.success());
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
    // A success records its job's datasets as updated for its business date; a dataset
    // nothing wrote yet has no update.
    let run = trigger(&nats, &["load", "--biz-date", "2026-12-01"]);
    final_record(&client, &run, std::time::Duration::from_secs(30)).await;
    let updates = wait_for(
        std::time::Duration::from_secs(30),
        "the update of warehouse://orders",
        || async {
            let out = lineage(&nats, &["--json", "warehouse://orders"]);
            let value: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            let updates = value["updates"].as_array()?.clone();
            (!updates.is_empty()).then_some(updates)
        },
    )
    .await;
    assert_eq!(updates.len(), 1, "{updates:?}");
    assert_eq!(updates[0]["job"], "load");
    assert_eq!(updates[0]["instance_id"], run.as_str());
    assert_eq!(updates[0]["biz_date"], "2026-12-01");
    assert_eq!(updates[0]["attempt"], 1);
    let report = stdout(&lineage(&nats, &["warehouse://report"]));
    assert!(
        report.contains("last updates (by business date):\n  (none recorded)"),
        "{report}"
    );
    let orders = stdout(&lineage(&nats, &["warehouse://orders"]));
    assert!(
        orders.contains(&format!("  2026-12-01  job load, {run} attempt 1, ")),
        "{orders}"
    );

    // A re-run's plan names the datasets each step rewrites, and --force-downstream follows
    // the readers of what it rewrites (report has no `deps` on load).
    let read = trigger(&nats, &["report", "--biz-date", "2026-12-01"]);
    final_record(&client, &read, std::time::Duration::from_secs(30)).await;
    let plan = |force: bool| {
        let mut args = vec![
            "rerun",
            "--json",
            "--dry-run",
            "--biz-date",
            "2026-12-01",
            "--root",
            "load",
        ];
        if force {
            args.push("--force-downstream");
        }
        let out = ax(&nats.url(), &args);
        assert!(out.status.success(), "{}", stderr(&out));
        let steps: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
        steps
            .iter()
            .map(|s| {
                let rewrites: Vec<&str> = s["rewrites"]
                    .as_array()
                    .map(|r| r.iter().filter_map(|d| d.as_str()).collect())
                    .unwrap_or_default();
                format!(
                    "{} {} {}",
                    s["job"].as_str().unwrap(),
                    s["will_run"],
                    rewrites.join(",")
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(plan(false), ["load true warehouse://orders"]);
    assert_eq!(
        plan(true),
        [
            "load true warehouse://orders",
            "report true warehouse://report"
        ]
    );

    // A run may say what it updated, and for which date, in its output: that is recorded.
    apply_job(
        &nats,
        "emit",
        "version: v1\njob:\n  name: emit\n  exec: { type: shell, command: 'printf \"{\\\"datasets\\\": [\\\"warehouse://side\\\", {\\\"uri\\\": \\\"warehouse://orders\\\", \\\"biz_date\\\": \\\"2026-11-30\\\"}]}\" > \"$AX_OUTPUT_FILE\"' }\n",
    )
    .await;
    let emitted = trigger(&nats, &["emit", "--biz-date", "2026-12-02"]);
    let record = final_record(&client, &emitted, std::time::Duration::from_secs(30)).await;
    assert_eq!(record.state, ax_bus::State::Success, "{}", record.message);
    let side = wait_for(
        std::time::Duration::from_secs(30),
        "emit's updates",
        || async {
            let out = lineage(&nats, &["warehouse://side"]);
            let text = stdout(&out);
            text.contains("  2026-12-02  job emit, ").then_some(text)
        },
    )
    .await;
    assert!(side.contains("upstream:\n  (nothing declared)"), "{side}");
    let orders = stdout(&lineage(&nats, &["warehouse://orders"]));
    assert!(
        orders.contains(&format!("  2026-11-30  job emit, {emitted} attempt 1, ")),
        "{orders}"
    );

    let bad = job_file(
        &nats.path("jobs"),
        "bad.yaml",
        "version: v1\njob:\n  name: bad\n  exec: { type: noop }\n  produces:\n    - 'warehouse://ok'\n    - 'orders'\n",
    );
    let refused = ax(&nats.url(), &["job", "apply", "-f", bad.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("bad.yaml:7: job.produces[1]: `orders`: a dataset is"),
        "{}",
        stderr(&refused)
    );
}

/// A produced dataset with a `freshness` that gets no update in time for today raises a
/// `freshness` alert naming it and the date; the update that comes later clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_dataset_raises_a_freshness_alert_and_its_update_clears_it() {
    use chrono::Timelike;
    let nats = TestNats::start();
    let client = nats.client().await;
    let mut alerts = client.nats.subscribe("ax.alert.freshness").await.unwrap();
    // Today's deadline is set 15 s ahead: wait out the last minute of a day.
    while ax_bus::time::now().num_seconds_from_midnight() > 86_400 - 60 {
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    }
    let now = ax_bus::time::now();
    let today = now.date_naive().to_string();
    let freshness = u64::from(now.num_seconds_from_midnight()) + 15;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(
        &nats,
        "load",
        &format!(
            "version: v1\njob:\n  name: load\n  produces: [ 'warehouse://orders' ]\n  \
             freshness: {{ 'warehouse://orders': {freshness}s }}\n  exec: {{ type: noop }}\n"
        ),
    )
    .await;
    let late = next_alert(&mut alerts).await;
    assert!(
        late.message.starts_with(&format!(
            "dataset warehouse://orders has no update for {today}: "
        )),
        "{}",
        late.message
    );
    assert!(
        late.message.contains("produced by job load"),
        "{}",
        late.message
    );
    let run = trigger(&nats, &["load"]);
    final_record(&client, &run, std::time::Duration::from_secs(30)).await;
    let fresh = next_alert(&mut alerts).await;
    assert!(
        fresh.message.starts_with(&format!(
            "dataset warehouse://orders is fresh again: updated for {today} by {run} at "
        )),
        "{}",
        fresh.message
    );
}

/// The next alert on `alerts`, within a minute.
async fn next_alert(alerts: &mut async_nats::Subscriber) -> ax_bus::messages::Alert {
    use futures::StreamExt;
    let message = tokio::time::timeout(std::time::Duration::from_secs(60), alerts.next())
        .await
        .expect("an alert within a minute")
        .expect("the subscription");
    ax_bus::codec::decode::<ax_bus::messages::Alert>(&message.payload).unwrap()
}

/// The job writing `warehouse://orders`, first in each data-run test's jobs.
macro_rules! load_orders {
    () => {
        "version: v1
job:
  name: load_orders
  produces: [ 'warehouse://orders' ]
  exec: { type: noop }
---
"
    };
}

const RUN_BY_DATA: &str = concat!(
    load_orders!(),
    "version: v1
job:
  name: load_pay
  produces: [ 'warehouse://pay' ]
  exec: { type: noop }
---
version: v1
job:
  name: daily_report
  consumes: [ 'warehouse://orders', 'warehouse://pay' ]
  on_datasets: [ 'warehouse://orders', 'warehouse://pay' ]
  exec: { type: shell, command: 'echo {{biz_date}} >> LEDGER' }
"
);

/// Applies `jobs`, their `LEDGER` a file of the test's (returned), to the node running.
fn apply_with_ledger(nats: &TestNats, jobs: &str) -> std::path::PathBuf {
    let ledger = nats.path("ledger").join("runs");
    let jobs = jobs.replace("LEDGER", ledger.to_str().unwrap());
    let file = job_file(&nats.path("jobs"), "data.yaml", &jobs);
    let applied = ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()]);
    assert!(applied.status.success(), "{}", stderr(&applied));
    ledger
}

/// `daily_report`'s instances, as `ax instance list` has them.
fn reports(nats: &TestNats) -> Vec<serde_json::Value> {
    let out = ax(
        &nats.url(),
        &[
            "instance",
            "list",
            "--job",
            "daily_report",
            "--all",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A job run by its data: its instance for a date comes once both its inputs were updated for
/// that date — not after one of them, not again when one is updated again — across a kill -9
/// of the DagCoordinator between the two updates; a date with one input updated has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_run_by_its_data_runs_once_per_date_when_all_its_inputs_are_updated() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let mut node = AxProcess::node(&nats, "n1", "all", &[]);
    let ledger = apply_with_ledger(&nats, RUN_BY_DATA);
    let updated = |uri: &'static str, by: String| {
        let client = client.clone();
        async move {
            let uri = DatasetUri::parse(uri).unwrap();
            let updates = client.dataset_updates(&uri).await.ok()?;
            updates
                .iter()
                .any(|u| u.instance_id.as_str() == by)
                .then_some(())
        }
    };

    // One input of 2026-11-01: nothing yet.
    let orders = trigger(&nats, &["load_orders", "--biz-date", "2026-11-01"]);
    final_record(&client, &orders, Duration::from_secs(30)).await;
    wait_for(Duration::from_secs(30), "orders of 11-01 updated", || {
        updated("warehouse://orders", orders.clone())
    })
    .await;
    assert!(reports(&nats).is_empty(), "{:?}", reports(&nats));

    // The coordinator dies; the next one sees the other input come.
    node.kill9();
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let pay = trigger(&nats, &["load_pay", "--biz-date", "2026-11-01"]);
    final_record(&client, &pay, Duration::from_secs(30)).await;
    let report = wait_for(Duration::from_secs(30), "the report of 11-01", || async {
        reports(&nats)
            .first()
            .and_then(|r| r["instance_id"].as_str().map(String::from))
    })
    .await;
    let done = final_record(&client, &report, Duration::from_secs(30)).await;
    assert_eq!(
        (done.state, done.biz_date.as_str()),
        (ax_bus::State::Success, "2026-11-01")
    );

    // An input updated again for that date, and one input of another date: no new run.
    let again = trigger(&nats, &["load_orders", "--biz-date", "2026-11-01"]);
    let other = trigger(&nats, &["load_pay", "--biz-date", "2026-11-02"]);
    final_record(&client, &again, Duration::from_secs(30)).await;
    final_record(&client, &other, Duration::from_secs(30)).await;
    wait_for(Duration::from_secs(30), "both updates stored", || async {
        updated("warehouse://orders", again.clone()).await?;
        updated("warehouse://pay", other.clone()).await
    })
    .await;
    assert_eq!(reports(&nats).len(), 1, "{:?}", reports(&nats));
    assert_eq!(
        std::fs::read_to_string(&ledger).unwrap(),
        "2026-11-01\n",
        "the report ran once"
    );
}

const RERUN_BY_DATA: &str = concat!(
    load_orders!(),
    "version: v1
job:
  name: refresh
  consumes: [ 'warehouse://orders' ]
  on_datasets: [ 'warehouse://orders' ]
  rerun: always
  exec: { type: shell, command: 'echo {{biz_date}} >> LEDGER' }
---
version: v1
job:
  name: fragile
  consumes: [ 'warehouse://orders' ]
  on_datasets: [ 'warehouse://orders' ]
  rerun: if_succeeded
  exec: { type: shell, command: 'exit 3' }
---
version: v1
job:
  name: yearly
  cron: '0 0 0 1 1 *'
  consumes: [ 'warehouse://orders' ]
  on_datasets: [ 'warehouse://orders' ]
  exec: { type: noop }
"
);

/// `rerun:` — an input updated again for a date already run starts a new attempt of that
/// date's instance with `always`, and none with `if_succeeded` when it failed. A job with a
/// cron besides its inputs runs a date by its input's update too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_updated_again_reruns_the_date_per_policy() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let ledger = apply_with_ledger(&nats, RERUN_BY_DATA);
    let instance_of = |job: &'static str| {
        let client = client.clone();
        async move {
            let at = ax_bus::time::start_of_day(
                chrono_tz::UTC,
                chrono::NaiveDate::from_ymd_opt(2026, 11, 5).unwrap(),
            );
            let id = ax_bus::ids::InstanceId::for_fire(&job.parse().unwrap(), at);
            client.instance(&id).await.ok()?.map(|(record, _)| record)
        }
    };
    let ended = |job: &'static str, attempt: u32| async move {
        let record = instance_of(job).await?;
        (record.state.is_final() && record.attempt == attempt).then_some(record)
    };

    let first = trigger(&nats, &["load_orders", "--biz-date", "2026-11-05"]);
    final_record(&client, &first, Duration::from_secs(30)).await;
    let refreshed = wait_for(Duration::from_secs(30), "refresh's first run", || {
        ended("refresh", 1)
    })
    .await;
    assert_eq!(refreshed.state, ax_bus::State::Success);
    let failed = wait_for(Duration::from_secs(30), "fragile's first run", || {
        ended("fragile", 1)
    })
    .await;
    assert_eq!(failed.state, ax_bus::State::Failed);
    let yearly = wait_for(Duration::from_secs(30), "yearly run by its data", || {
        ended("yearly", 1)
    })
    .await;
    assert_eq!(
        (yearly.state, yearly.biz_date.as_str()),
        (ax_bus::State::Success, "2026-11-05")
    );

    let again = trigger(&nats, &["load_orders", "--biz-date", "2026-11-05"]);
    final_record(&client, &again, Duration::from_secs(30)).await;
    let rerun = wait_for(Duration::from_secs(30), "refresh run again", || {
        ended("refresh", 2)
    })
    .await;
    assert_eq!(rerun.state, ax_bus::State::Success);
    let fragile = instance_of("fragile").await.unwrap();
    assert_eq!(
        (fragile.state, fragile.attempt),
        (ax_bus::State::Failed, 1),
        "if_succeeded leaves a failed date alone"
    );
    assert_eq!(
        std::fs::read_to_string(&ledger).unwrap(),
        "2026-11-05\n2026-11-05\n",
        "refresh ran twice"
    );
}

/// The independent test's pair: each job run by the other's output, `rerun: always`.
const LOOP: &str = "version: v1
job:
  name: ping
  consumes: [ 'w://pong' ]
  on_datasets: [ 'w://pong' ]
  produces: [ 'w://ping' ]
  rerun: always
  exec: { type: noop }
---
version: v1
job:
  name: pong
  consumes: [ 'w://ping' ]
  on_datasets: [ 'w://ping' ]
  PRODUCES
  rerun: always
  exec: { type: shell, command: 'OUTPUT' }
";

/// A loop through datasets never runs for ever: the pair whose definitions close it is
/// refused at apply, naming the cycle; one the definitions do not show (the second job's output
/// names the dataset its `produces` does not) is ended at run time, each instance started again
/// for its inputs' updates at most 100 times for its date, with a `data_runs` alert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_through_datasets_is_refused_or_bounded() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let declared = LOOP
        .replace("PRODUCES", "produces: [ 'w://pong' ]")
        .replace("OUTPUT", "true");
    let file = job_file(&nats.path("jobs"), "loop.yaml", &declared);
    let refused = ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains(
            "job.on_datasets: cycle through datasets: ping -(w://pong)-> pong -(w://ping)-> ping"
        ),
        "{}",
        stderr(&refused)
    );
    assert!(client.job_specs().await.unwrap().is_empty());

    // The same loop, closed by what pong's runs say they updated.
    let hidden = LOOP.replace("  PRODUCES\n", "").replace(
        "OUTPUT",
        r#"echo ''{"datasets": ["w://pong"]}'' > "$AX_OUTPUT_FILE""#,
    );
    let file = job_file(&nats.path("jobs"), "hidden.yaml", &hidden);
    let applied = ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()]);
    assert!(applied.status.success(), "{}", stderr(&applied));
    let mut alerts = client
        .nats
        .subscribe(
            client
                .subjects()
                .alert(ax_bus::messages::AlertKind::DataRuns.as_str()),
        )
        .await
        .unwrap();
    let date = chrono::NaiveDate::from_ymd_opt(2026, 11, 9).unwrap();
    let at = ax_bus::time::start_of_day(chrono_tz::UTC, date);
    let id = |job: &str| ax_bus::ids::InstanceId::for_fire(&job.parse().unwrap(), at);
    let seed = trigger(&nats, &["ping", "--biz-date", "2026-11-09"]);
    final_record(&client, &seed, Duration::from_secs(30)).await;
    let spent = |job: &'static str| {
        let client = client.clone();
        async move {
            let (record, _) = client.instance(&id(job)).await.ok()??;
            (record.state.is_final() && record.data_reruns == ax_bus::instance::MAX_DATA_RERUNS)
                .then_some(record)
        }
    };
    let stopped = wait_for(
        Duration::from_secs(240),
        "the loop to reach its bound",
        || {
            let (ping, pong) = (spent("ping"), spent("pong"));
            async move { ping.await.or(pong.await) }
        },
    )
    .await;
    assert_eq!(stopped.attempt, ax_bus::instance::MAX_DATA_RERUNS + 1);
    let alert = next_alert(&mut alerts).await;
    assert!(
        alert
            .message
            .contains("started again 100 times for its inputs' updates"),
        "{}",
        alert.message
    );
    // Nothing starts after it: both records stay as they are.
    let attempts = || async {
        let mut seen = Vec::new();
        for job in ["ping", "pong"] {
            let (record, _) = client.instance(&id(job)).await.unwrap().expect("a record");
            seen.push((record.attempt, record.state));
        }
        seen
    };
    let settled = wait_for(Duration::from_secs(30), "both records final", || async {
        let seen = attempts().await;
        seen.iter().all(|(_, s)| s.is_final()).then_some(seen)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(attempts().await, settled, "the loop went on");
}
