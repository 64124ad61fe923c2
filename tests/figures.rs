//! The day's figures have one meaning wherever they are shown: `ax status`, the dashboard (in
//! a real Chromium) and `/metrics` give the same trigger latency, longest run and failure
//! counts, and each agrees with what the records say happened — on a day with a cron job, a
//! retry, a killed retry, a backfill, a dependency chain for a past date and a dataset run.

use crate::support;

use std::time::Duration;

use ax_bus::instance::Trigger;
use ax_bus::{InstanceRecord, State};
use support::browser::Browser;
use support::up::{apply, up, Up};
use support::*;

fn run(up: &Up, args: &[&str]) -> String {
    let out = ax(&up.nats, args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    stdout(&out)
}

fn trigger(up: &Up, args: &[&str]) -> String {
    let mut all = vec!["job", "trigger"];
    all.extend_from_slice(args);
    run(up, &all).split_whitespace().next().unwrap().to_string()
}

async fn records(up: &Up) -> Vec<InstanceRecord> {
    up.client.instances(None).await.unwrap()
}

/// The value of the one sample of `name` in Prometheus text (with its labels, if any).
fn sample(text: &str, name: &str, having: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .find(|l| l.contains(having))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_place_gives_the_days_figures_one_meaning_as_the_records_do() {
    let dir = tempfile::tempdir().unwrap();
    let up = up(dir.path()).await;
    let quick = "  exec: { type: shell, command: 'true' }\n";
    apply(
        &up,
        dir.path(),
        &[
            ("tick", &format!("  cron: '*/2 * * * * *'\n{quick}")),
            // A first attempt of 4 s that fails, then a quick success: the longest run.
            (
                "flaky",
                "  retry: { times: 1, interval: 1 }\n  exec: { type: shell, command: \
                 'if [ \"$AX_ATTEMPT\" = 1 ]; then sleep 4; exit 3; fi' }\n",
            ),
            // Attempt 1 fails saying so; attempt 2 runs until it is killed.
            (
                "twice",
                "  retry: { times: 1, interval: 1 }\n  exec: { type: shell, command: \
                 'if [ \"$AX_ATTEMPT\" = 1 ]; then echo a1 fails >&2; exit 3; fi; \
                 echo a2 runs; sleep 120' }\n",
            ),
            ("report", quick),
            ("up", quick),
            ("down", &format!("  deps: [ {{ name: up }} ]\n{quick}")),
            ("writer", &format!("  produces: [ 'w://fig' ]\n{quick}")),
            (
                "reader",
                &format!("  consumes: [ 'w://fig' ]\n  on_datasets: [ 'w://fig' ]\n{quick}"),
            ),
        ],
    );
    // One tick of the cron job is enough.
    wait_for(Duration::from_secs(30), "a tick", || async {
        let ticked = records(&up).await.iter().any(|r| r.job == "tick");
        ticked.then_some(())
    })
    .await;
    run(&up, &["job", "pause", "tick"]);
    trigger(&up, &["flaky"]);
    let twice = trigger(&up, &["twice"]);
    let today = chrono::Utc::now().date_naive();
    let past = (today - chrono::Duration::days(3)).to_string();
    let backfill_from = (today - chrono::Duration::days(2)).to_string();
    run(
        &up,
        &[
            "backfill",
            "report",
            "--from",
            &backfill_from,
            "--to",
            &backfill_from,
        ],
    );
    trigger(&up, &["up", "--biz-date", &past]);
    trigger(&up, &["writer"]);
    // The retry of `twice` runs; killed, it ends the instance.
    let twice_id = twice.parse().unwrap();
    wait_for(
        Duration::from_secs(60),
        "twice's second attempt",
        || async {
            let (record, _) = up.client.instance(&twice_id).await.ok()??;
            (record.attempt == 2 && record.tag == ax_bus::Tag::Executing).then_some(())
        },
    )
    .await;
    run(
        &up,
        &["instance", "kill", &twice, "--reason", "figures test"],
    );

    // Everything ends: tick's fires, flaky, twice, the backfill, up and down for the past
    // date, writer and the reader its data started.
    let ended = wait_for(Duration::from_secs(90), "every instance to end", || async {
        let all = records(&up).await;
        let jobs = [
            "tick", "flaky", "twice", "report", "up", "down", "writer", "reader",
        ];
        let all_there = jobs.iter().all(|j| all.iter().any(|r| r.job == *j));
        (all_there && all.iter().all(|r| r.state.is_final())).then_some(all)
    })
    .await;
    let of = |job: &str| ended.iter().find(|r| r.job == job).unwrap().clone();
    assert_eq!(of("down").trigger, Trigger::Deps);
    assert_eq!(of("down").biz_date, past);
    assert_eq!(of("reader").trigger, Trigger::Deps);
    assert_eq!(of("report").trigger, Trigger::Backfill);
    assert_eq!(
        (of("flaky").attempt, of("flaky").state),
        (2, State::Success)
    );
    assert_eq!((of("twice").attempt, of("twice").state), (2, State::Failed));
    // Released by their dependencies or their data: due then, not at their date's midnight.
    for job in ["down", "reader"] {
        let record = of(job);
        let due = record.due_at.expect("a release time");
        assert!(
            due > record.expected_time + chrono::Duration::minutes(1),
            "{job}: {record:?}"
        );
    }

    // What the records say: each first attempt's latency from when it became due, every
    // attempt's run, the endings.
    let mut latencies = Vec::new();
    let mut longest: Option<(String, u32, i64)> = None;
    for record in &ended {
        let history = up
            .client
            .instance_history(&record.instance_id)
            .await
            .unwrap()
            .unwrap();
        for attempt in &history.attempts {
            let (Some(start), Some(end)) = (attempt.started_at, attempt.finished_at) else {
                continue;
            };
            let ran = (end - start).num_milliseconds();
            if longest.as_ref().is_none_or(|l| ran > l.2) {
                longest = Some((record.job.to_string(), attempt.attempt, ran));
            }
            if attempt.attempt == 1 && record.trigger != Trigger::Backfill {
                // Only the released ones carry a due time, and they ran once.
                let due = match record.attempt {
                    1 => record.due_at.unwrap_or(record.expected_time),
                    _ => record.expected_time,
                };
                latencies.push((start - due).num_milliseconds().max(0));
            }
        }
    }
    let (longest_job, longest_attempt, longest_ms) = longest.unwrap();
    assert_eq!((longest_job.as_str(), longest_attempt), ("flaky", 1));
    let finals = ended.len() as u64;
    let failed = ended.iter().filter(|r| r.state == State::Failed).count() as u64;

    // `ax status`, once the summary holds every ending.
    let status = wait_for(Duration::from_secs(30), "the summary", || async {
        let out = ax(&up.nats, &["status", "--json"]);
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        (status["day"]["finished"] == finals).then_some(status)
    })
    .await;
    let day: ax_bus::figures::DaySummary = serde_json::from_value(status["day"].clone()).unwrap();
    assert_eq!((day.finished, day.failed), (finals, failed), "{day:?}");
    assert_eq!(day.latency_count, latencies.len() as u64, "{day:?}");
    let average = latencies.iter().sum::<i64>() as f64 / latencies.len() as f64;
    let summarized = day.average_latency_ms().unwrap();
    // A dependency chain for a past date, or a dataset run, would count days from midnight.
    assert!(summarized < 60_000.0, "{day:?}");
    assert!(
        (summarized - average).abs() < 5.0,
        "summary {summarized} ms, records {average} ms: {latencies:?}"
    );
    let run_longest = day.longest.clone().unwrap();
    assert_eq!(
        (run_longest.job.as_str(), run_longest.attempt),
        ("flaky", Some(1))
    );
    assert!((run_longest.duration_ms - longest_ms).abs() < 5, "{day:?}");
    let text = run(&up, &["status"]);
    let latency_text = day.average_latency_text().unwrap();
    assert!(
        text.contains(&format!("trigger latency   {latency_text} on average")),
        "{text}"
    );
    assert!(
        text.contains(&format!("ended on the day  {finals}: "))
            && text.contains(&format!("{failed} failed")),
        "{text}"
    );

    // `/metrics`: the same day.
    let metrics = reqwest::get(format!("{}/metrics", up.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let of_day = format!("date=\"{}\"", day.date);
    let ended_failed = sample(&metrics, "ax_day_ended", "state=\"failed\"");
    assert_eq!(ended_failed, Some(failed as f64), "{metrics}");
    let ended_all: f64 = ["success", "failed", "cancelled"]
        .iter()
        .filter_map(|s| sample(&metrics, "ax_day_ended", &format!("state=\"{s}\"")))
        .sum();
    assert_eq!(ended_all, finals as f64);
    let latency = sample(&metrics, "ax_day_trigger_latency_average_seconds", &of_day).unwrap();
    assert!((latency * 1000.0 - summarized).abs() < 0.5, "{latency}");
    let ran = sample(&metrics, "ax_day_longest_run_seconds", &of_day).unwrap();
    assert_eq!((ran * 1000.0).round() as i64, run_longest.duration_ms);

    // The dashboard: the same figures, each under its label; the failed list gives the reason
    // of the attempt that ended the instance (the kill), not the attempt before.
    let browser = Browser::start().await;
    browser.open(&format!("{}/", up.http)).await;
    assert_eq!(browser.text("#date").await, day.date);
    assert_eq!(browser.text("#ended").await, finals.to_string());
    assert_eq!(browser.text("#ended-failed").await, failed.to_string());
    assert_eq!(browser.text("#latency").await, latency_text);
    let shown = browser.text("#longest").await;
    assert!(
        shown.starts_with(&format!(
            "flaky {}",
            ax_bus::time::human_ms(run_longest.duration_ms)
        )) && shown.contains("(attempt 1)"),
        "{shown}"
    );
    let today_failed = ended
        .iter()
        .filter(|r| r.biz_date == day.date && r.state == State::Failed)
        .count();
    assert_eq!(browser.text("#failures").await, today_failed.to_string());
    let reason = browser.text("#failed-list").await;
    assert!(
        reason.contains("twice") && reason.contains("figures test") && !reason.contains("a1 fails"),
        "{reason}"
    );
    assert!(browser
        .text("#counting-rule")
        .await
        .contains("each ending of an instance by its end time"));
}
