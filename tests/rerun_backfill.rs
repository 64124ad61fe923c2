//! Manual re-runs in every mode, and backfills: each does exactly what its plan says.

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use ax_bus::{AxClient, State};
use support::*;

/// a -> b -> c and a -> d, none with a cron; each job appends its name to the ledger and fails
/// while its flag file exists.
fn chain(dir: &Path) -> String {
    let job = |name: &str, deps: &str| {
        format!(
            "version: v1\njob:\n  name: {name}\n{deps}  exec: {{ type: shell, command: 'echo {name} >> {l}; test ! -e {f}' }}\n",
            l = dir.join("ledger").display(),
            f = dir.join(format!("fail-{name}")).display(),
        )
    };
    [
        job("a", ""),
        job("b", "  deps: [ { name: a } ]\n"),
        job("c", "  deps: [ { name: b } ]\n"),
        job("d", "  deps: [ { name: a } ]\n"),
    ]
    .join("---\n")
}

const DATE: &str = "2026-04-01";

/// (state, attempt) of each job's instance for DATE.
async fn snapshot(client: &AxClient) -> BTreeMap<String, (State, u32)> {
    let mut out = BTreeMap::new();
    for job in ["a", "b", "c", "d"] {
        for r in instances(client, job).await {
            if r.biz_date == DATE {
                out.insert(job.to_string(), (r.state, r.attempt));
            }
        }
    }
    out
}

/// Waits until every one of the four has an instance in a final state.
async fn settled(client: &AxClient) -> BTreeMap<String, (State, u32)> {
    wait_for(Duration::from_secs(30), "the chain to settle", || async {
        let now = snapshot(client).await;
        (now.len() == 4 && now.values().all(|(s, _)| s.is_final())).then_some(now)
    })
    .await
}

fn plan(nats: &TestNats, args: &[&str]) -> Vec<(String, bool)> {
    let mut full = vec!["rerun", "--json"];
    full.extend_from_slice(args);
    let out = ax(&nats.url(), &full);
    assert!(out.status.success(), "rerun {args:?}: {}", stderr(&out));
    let steps: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    steps
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["job"].as_str().unwrap().to_string(),
                s["will_run"].as_bool().unwrap(),
            )
        })
        .collect()
}

fn runs(plan: &[(String, bool)]) -> Vec<&str> {
    plan.iter()
        .filter(|(_, run)| *run)
        .map(|(job, _)| job.as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_rerun_mode_does_what_its_plan_says() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &["--slots", "8"]);
    let dir = nats.path("jobs");
    apply_job(&nats, "chain", &chain(&dir)).await;

    // a fails: the whole chain below it is cancelled.
    std::fs::write(dir.join("fail-a"), "").unwrap();
    trigger(&nats, &["a", "--biz-date", DATE]);
    let first = settled(&client).await;
    assert_eq!(first["a"].0, State::Failed);
    assert!(
        ["b", "c", "d"]
            .iter()
            .all(|j| first[*j].0 == State::Cancelled),
        "{first:?}"
    );

    // A dry run plans the root and everything that failed below it, and changes nothing.
    let dry = plan(&nats, &["--biz-date", DATE, "--root", "a", "--dry-run"]);
    assert_eq!(runs(&dry), ["a", "b", "d", "c"]);
    assert_eq!(snapshot(&client).await, first);

    // The real run: the chain runs again in order, each a new attempt.
    std::fs::remove_file(dir.join("fail-a")).unwrap();
    let real = plan(&nats, &["--biz-date", DATE, "--root", "a"]);
    assert_eq!(real, dry);
    let second = wait_for(Duration::from_secs(30), "the chain to succeed", || async {
        let now = snapshot(&client).await;
        now.values()
            .all(|(s, a)| *s == State::Success && *a == 2)
            .then_some(now)
    })
    .await;
    assert_eq!(second.len(), 4);

    // By default succeeded downstream instances stay; --force-downstream runs them too.
    let default = plan(&nats, &["--biz-date", DATE, "--root", "a"]);
    assert_eq!(runs(&default), ["a"]);
    let after_default = wait_for(Duration::from_secs(30), "a's third attempt", || async {
        let now = snapshot(&client).await;
        (now["a"] == (State::Success, 3)).then_some(now)
    })
    .await;
    assert_eq!(
        (
            after_default["b"].1,
            after_default["c"].1,
            after_default["d"].1
        ),
        (2, 2, 2)
    );
    let forced = plan(
        &nats,
        &["--biz-date", DATE, "--root", "a", "--force-downstream"],
    );
    assert_eq!(runs(&forced), ["a", "b", "d", "c"]);
    wait_for(Duration::from_secs(30), "everything re-run", || async {
        let now = snapshot(&client).await;
        (now["a"].1 == 4
            && ["b", "c", "d"]
                .iter()
                .all(|j| now[*j] == (State::Success, 3)))
        .then_some(())
    })
    .await;

    // One instance: c fails on its own; --failed-only over the date re-runs c and nothing else.
    std::fs::write(dir.join("fail-c"), "").unwrap();
    let c = instances(&client, "c")
        .await
        .into_iter()
        .find(|r| r.biz_date == DATE)
        .unwrap();
    let one = plan(&nats, &["--instance", &c.instance_id]);
    assert_eq!(runs(&one), ["c"]);
    wait_for(Duration::from_secs(30), "c to fail", || async {
        (snapshot(&client).await["c"] == (State::Failed, 4)).then_some(())
    })
    .await;
    std::fs::remove_file(dir.join("fail-c")).unwrap();
    // Date-wide (no root): refused without --yes off a terminal, naming how many would run.
    let unasked = ax(&nats.url(), &["rerun", "--biz-date", DATE, "--failed-only"]);
    assert!(!unasked.status.success());
    assert!(
        stderr(&unasked).contains(&format!(
            "a re-run of every root job of {DATE} (1 to run) needs --yes"
        )),
        "{}",
        stderr(&unasked)
    );
    assert_eq!(stderr(&unasked).trim_end().lines().count(), 1);
    assert_eq!(
        snapshot(&client).await["c"],
        (State::Failed, 4),
        "nothing re-run"
    );
    let failed_only = plan(&nats, &["--biz-date", DATE, "--failed-only", "--yes"]);
    assert_eq!(runs(&failed_only), ["c"]);
    let last = wait_for(Duration::from_secs(30), "c to succeed", || async {
        let now = snapshot(&client).await;
        (now["c"] == (State::Success, 5)).then_some(now)
    })
    .await;
    assert_eq!((last["a"].1, last["b"].1, last["d"].1), (4, 3, 3));

    // Every re-run was recorded, with who asked.
    let audit = client
        .audit_since(chrono::DateTime::UNIX_EPOCH)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.action == "rerun" && r.outcome == ax_bus::auth::audit::Outcome::Done)
        .inspect(|r| assert!(r.actor.contains('@'), "{r:?}"))
        .count();
    // Six, and the plan the date-wide re-run without --yes made before it was refused.
    assert_eq!(audit, 7);

    // Bad input: one clear line, nothing changed.
    for (args, expected) in [
        (
            vec!["--instance", "a.20990101T000000000Z"],
            "no instance `a.20990101T000000000Z`",
        ),
        (
            vec!["--biz-date", "2020-01-01"],
            "no instance for 2020-01-01",
        ),
        (
            vec!["--biz-date", DATE, "--root", "ghost"],
            "no job named `ghost`",
        ),
        (vec!["--biz-date", "01/04/2026"], "is not a date"),
    ] {
        let mut full = vec!["rerun"];
        full.extend(args);
        let out = ax(&nats.url(), &full);
        assert!(!out.status.success());
        assert!(stderr(&out).contains(expected), "{}", stderr(&out));
        assert_eq!(
            stderr(&out).trim_end().lines().count(),
            1,
            "{}",
            stderr(&out)
        );
    }
    // On a terminal a date-wide re-run shows its plan and asks; anything but `y` re-runs
    // nothing.
    let command = format!("{} rerun --biz-date {DATE}", ax_binary());
    let mut asked = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("AX_NATS_URL", nats.url())
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("script(1)");
    {
        use std::io::Write;
        asked.stdin.take().unwrap().write_all(b"n\n").unwrap();
    }
    let asked = asked.wait_with_output().unwrap();
    let shown = String::from_utf8_lossy(&asked.stdout);
    assert!(!asked.status.success(), "{shown}");
    assert!(
        shown.contains(&format!("instance(s) of {DATE}? [y/N]"))
            && shown.contains("nothing re-run"),
        "{shown}"
    );
    assert_eq!(snapshot(&client).await, last);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_runs_dates_in_order_never_more_than_parallel_at_once() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &["--slots", "8"]);
    apply_job(
        &nats,
        "daily",
        "version: v1
job:
  name: daily
  cron: '0 3 * * *'
  timezone: Asia/Shanghai
  exec: { type: shell, command: 'sleep 0.5' }
---
version: v1
job:
  name: report
  cron: '0 5 * * *'
  timezone: Asia/Shanghai
  deps: [ { name: daily } ]
  exec: { type: shell, command: 'true' }
",
    )
    .await;
    let out = ax(
        &nats.url(),
        &[
            "backfill",
            "daily",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-05",
            "--parallel",
            "2",
            "--with-downstream",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan.as_array().unwrap().len(), 10);

    let daily = wait_for(
        Duration::from_secs(40),
        "the five dates to finish",
        || async {
            let done: Vec<_> = instances(&client, "daily")
                .await
                .into_iter()
                .filter(|r| r.state == State::Success)
                .collect();
            (done.len() == 5).then_some(done)
        },
    )
    .await;
    let dates: Vec<&str> = daily.iter().map(|r| r.biz_date.as_str()).collect();
    assert_eq!(
        dates,
        [
            "2026-01-01",
            "2026-01-02",
            "2026-01-03",
            "2026-01-04",
            "2026-01-05"
        ]
    );
    assert!(daily
        .iter()
        .all(|r| r.expected_time.format("%H:%M").to_string() == "19:00"));
    for i in 2..daily.len() {
        assert!(
            daily[i].started_at.unwrap() >= daily[i - 2].finished_at.unwrap(),
            "date {} started before date {} ended",
            daily[i].biz_date,
            daily[i - 2].biz_date
        );
    }
    let reports = wait_for(Duration::from_secs(30), "the reports", || async {
        let done: Vec<_> = instances(&client, "report")
            .await
            .into_iter()
            .filter(|r| r.state == State::Success)
            .collect();
        (done.len() == 5).then_some(done)
    })
    .await;
    for (report, day) in reports.iter().zip(&daily) {
        assert_eq!(report.biz_date, day.biz_date);
        assert!(report.started_at.unwrap() >= day.finished_at.unwrap());
    }

    // The same range again creates nothing; bad ranges are refused.
    let again = ax(
        &nats.url(),
        &[
            "backfill",
            "daily",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
            "--json",
        ],
    );
    let plan: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert!(plan
        .as_array()
        .unwrap()
        .iter()
        .all(|s| !s["will_run"].as_bool().unwrap()));
    let backwards = ax(
        &nats.url(),
        &[
            "backfill",
            "daily",
            "--from",
            "2026-02-01",
            "--to",
            "2026-01-01",
        ],
    );
    assert!(
        stderr(&backwards).contains("--from 2026-02-01 is after --to 2026-01-01"),
        "{}",
        stderr(&backwards)
    );
    let unknown = ax(
        &nats.url(),
        &[
            "backfill",
            "ghost",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-01",
        ],
    );
    assert!(stderr(&unknown).contains("no job named `ghost`"));
    assert_eq!(instances(&client, "daily").await.len(), 5);
}
