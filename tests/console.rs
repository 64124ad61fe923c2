//! The console in a real headless Chromium (Debian's `chromium` and `chromium-driver`, installed
//! by `.ci/run`) against a real `ax up`: what an operator sees and does from the browser, with
//! the CLI as the witness of what really happened.

use crate::support;

use std::time::Duration;

use support::browser::Browser;
use support::up::{apply, up, Up};
use support::*;

fn trigger(up: &Up, job: &str) -> String {
    let out = ax(&up.nats, &["job", "trigger", job]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out).split_whitespace().next().unwrap().to_string()
}

/// `ax instance list --json`, by state, for the test's witness.
fn listed(up: &Up) -> Vec<serde_json::Value> {
    let out = ax(&up.nats, &["instance", "list", "--all", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_runs_ax_from_the_browser() {
    let dir = tempfile::tempdir().unwrap();
    let up = up(dir.path()).await;
    let pid_file = dir.path().join("sleeper.pid");
    apply(
        &up,
        dir.path(),
        &[
            (
                "greet",
                "  exec:\n    type: shell\n    command: >-\n      echo \"hello $AX_PARAM_who\" &&\n      \
                 printf '{\"who\": \"%s\"}' \"$AX_PARAM_who\" > \"$AX_OUTPUT_FILE\"\n  params: { who: nobody }\n",
            ),
            ("broken", "  exec: { type: shell, command: 'echo doomed >&2; exit 3' }\n"),
            ("extract", "  exec: { type: shell, command: 'exit 1' }\n"),
            (
                "load",
                "  deps: [ { name: extract } ]\n  exec: { type: shell, command: 'true' }\n",
            ),
            (
                "sleeper",
                &format!(
                    "  exec: {{ type: shell, command: 'echo before the kill; echo $$ > {}; exec sleep 300' }}\n",
                    pid_file.display()
                ),
            ),
        ],
    );
    let browser = Browser::start().await;
    let base = &up.http;

    // The scripts load under the CSP (htmx is there to answer the buttons).
    browser.open(&format!("{base}/jobs")).await;
    let htmx = browser
        .client
        .execute("return typeof htmx;", vec![])
        .await
        .unwrap();
    assert_eq!(htmx, "object", "htmx did not load under the CSP");
    assert!(browser.text("#jobs").await.contains("greet"));
    browser.screenshot("jobs").await;

    // Trigger with a parameter from the job's page; its instance page shows success and logs.
    browser.open(&format!("{base}/jobs/greet")).await;
    browser.fill("textarea[name=params]", "who=console").await;
    browser.click("#trigger").await;
    let created = browser
        .until("the trigger's answer", "#trigger-result a", |t| {
            t.starts_with("greet.")
        })
        .await;
    browser.screenshot("job").await;
    browser.click("#trigger-result a").await;
    browser
        .reload_until("the instance to succeed", "#state", |t| t == "success")
        .await;
    assert!(browser.text("#log").await.contains("hello console"));
    assert!(browser
        .text("#output")
        .await
        .contains("\"who\": \"console\""));
    assert!(browser.text("#history").await.contains("ended"));
    browser.screenshot("instance").await;
    // The jobs list shows each job's last runs at a glance, each a link to its instance; every
    // page links the API's document.
    browser.open(&format!("{base}/jobs")).await;
    let api = browser.element("#api-doc").await;
    assert_eq!(
        api.attr("href").await.unwrap().as_deref(),
        Some("/api/v1/openapi.json")
    );
    let cell = browser
        .element(&format!(
            "td.runs[data-job=greet] a.run.success[href='/instances/{created}']"
        ))
        .await;
    let title = cell.attr("title").await.unwrap().unwrap_or_default();
    assert!(
        title.starts_with(&format!("{created} · success (completed), ran ")),
        "{title}"
    );
    let record = final_record(&up.client, &created, Duration::from_secs(30)).await;
    assert_eq!(record.params["who"], "console");
    // The job's page shows its last runs too, and how long each ran.
    browser.open(&format!("{base}/jobs/greet")).await;
    browser
        .element(&format!(
            "#last-runs a.run.success[href='/instances/{created}']"
        ))
        .await;
    let ran = browser.text("#recent tbody tr td:nth-child(6)").await;
    assert!(ran != "–" && !ran.is_empty(), "{ran}");
    // And what each used (its worker runs it in a cgroup), usually and at most.
    let used = browser.text("#recent tbody tr td:last-child").await;
    assert!(
        used.starts_with("cpu ") && used.contains("peak memory"),
        "{used}"
    );
    let usage = browser.text("#usage").await;
    assert!(
        usage.starts_with("Used by the last 1 counted: usually cpu ")
            && usage.contains("at most cpu"),
        "{usage}"
    );

    // Bad values are shown beside the control, every one at once, and nothing is created.
    browser.open(&format!("{base}/jobs/greet")).await;
    browser.fill("input[name=key]", "not a key!").await;
    browser.fill("textarea[name=params]", "who=x\noops").await;
    browser.fill("input[name=biz_date]", "yesterday").await;
    browser.click("#trigger").await;
    let refused = browser
        .until("the refusal", "#trigger-result .error", |t| !t.is_empty())
        .await;
    let lines: Vec<&str> = refused.lines().collect();
    assert!(
        lines.len() == 3
            && lines[0].starts_with("params, line 2:")
            && lines[1].starts_with("key:")
            && lines[2].starts_with("biz_date: `yesterday`"),
        "{refused}"
    );
    assert_eq!(
        listed(&up).iter().filter(|r| r["job"] == "greet").count(),
        1
    );

    // Two failures; the dashboard's numbers are those of `ax instance list`.
    let broken = trigger(&up, "broken");
    trigger(&up, "broken");
    for record in listed(&up) {
        let id = record["instance_id"].as_str().unwrap().to_string();
        final_record(&up.client, &id, Duration::from_secs(30)).await;
    }
    let records = listed(&up);
    let count = |state: &str| records.iter().filter(|r| r["state"] == state).count();
    assert_eq!((count("success"), count("failed")), (1, 2));
    browser.open(&format!("{base}/")).await;
    browser
        .reload_until("the summary to count the failures", "#failures", |t| {
            t == "2"
        })
        .await;
    assert_eq!(
        browser.text("#instances-today").await,
        records.len().to_string()
    );
    for state in ["success", "failed", "running"] {
        let shown = browser
            .text(&format!("#by-state td[data-state={state}]"))
            .await;
        assert_eq!(shown, count(state).to_string(), "{state}");
    }
    assert!(browser.text("#top-failing").await.contains("broken"));
    // The failures are listed with the last line they wrote to stderr, each a link.
    let failed = browser.text("#failed-list").await;
    assert!(failed.contains("doomed"), "{failed}");
    browser
        .element(&format!("#failed-list a[href='/instances/{broken}']"))
        .await;
    // What ended on the date is `ax status`'s count, and the page says which rule is which.
    let status = ax(&up.nats, &["status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(
        browser.text("#ended").await,
        status["day"]["finished"].to_string()
    );
    assert!(browser
        .text("#counting-rule")
        .await
        .contains("each once in its current state"));
    browser.screenshot("dashboard").await;
    // Another date, from the page's date control: its own (empty) figures, and back.
    browser
        .script(
            "document.getElementById('date-input').value = '2026-01-05'; \
             document.getElementById('date-form').submit(); return null;",
        )
        .await;
    browser
        .until("the other date", "#date", |t| t == "2026-01-05")
        .await;
    assert_eq!(browser.text("#instances-today").await, "0");
    browser.click("#latest").await;
    browser
        .until("the latest date again", "#date", |t| t != "2026-01-05")
        .await;

    // The instance list filters on the server.
    browser
        .open(&format!("{base}/instances?state=failed"))
        .await;
    let table = browser.text("#instances").await;
    assert!(
        table.contains(&broken) && !table.contains(&created),
        "{table}"
    );
    browser.screenshot("instances").await;
    // A busy job can be hidden from the list.
    browser
        .open(&format!("{base}/instances?hide=greet,+extract"))
        .await;
    let table = browser.text("#instances").await;
    assert!(
        table.contains(&broken) && !table.contains(&created),
        "{table}"
    );
    // A part of a job's name finds its instances; a tag is chosen from every tag.
    browser.open(&format!("{base}/instances?job=roke")).await;
    let table = browser.text("#instances").await;
    assert!(
        table.contains(&broken) && !table.contains(&created),
        "{table}"
    );
    browser
        .open(&format!("{base}/instances?tag=exit_code"))
        .await;
    let table = browser.text("#instances").await;
    assert!(
        table.contains(&broken) && !table.contains(&created),
        "{table}"
    );
    let tags = browser.text("select[name=tag]").await;
    assert!(
        tags.contains("waiting_deps") && tags.contains("scheduled"),
        "{tags}"
    );

    // A re-run shows its plan first: nothing runs until it is confirmed.
    browser.open(&format!("{base}/instances/{broken}")).await;
    browser.click("#rerun").await;
    let plan = browser
        .until("the plan", "#plan-summary", |t| t.contains("would run"))
        .await;
    assert!(plan.starts_with("1 instance"), "{plan}");
    browser.screenshot("rerun-plan").await;
    let (record, _) = up
        .client
        .instance(&broken.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.attempt, 1, "the dry run ran nothing");
    browser.click("#run-plan").await;
    browser
        .until("the re-run", "#plan-summary", |t| {
            t.contains("started again")
        })
        .await;
    wait_for(Duration::from_secs(30), "the second attempt", || async {
        let (record, _) = up.client.instance(&broken.parse().ok()?).await.ok()??;
        (record.attempt == 2 && record.state.is_final()).then_some(())
    })
    .await;

    // With a re-run and a backfill of two past dates, the day's numbers are still those of
    // `ax instance list` for the date: each instance once, the backfill on its own dates.
    let today = chrono::Utc::now().date_naive();
    let days_ago = |n: i64| (today - chrono::Duration::days(n)).to_string();
    let out = ax(
        &up.nats,
        &[
            "backfill",
            "greet",
            "--from",
            &days_ago(2),
            "--to",
            &days_ago(1),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    browser.open(&format!("{base}/")).await;
    let date = browser.text("#date").await;
    let of_date = wait_for(Duration::from_secs(60), "the backfill to end", || async {
        let records = listed(&up);
        let backfilled = records
            .iter()
            .filter(|r| r["trigger"] == "backfill" && r["state"] == "success")
            .count();
        (backfilled == 2).then(|| {
            records
                .into_iter()
                .filter(|r| r["biz_date"] == date.as_str())
                .collect::<Vec<_>>()
        })
    })
    .await;
    let count = |state: &str| of_date.iter().filter(|r| r["state"] == state).count();
    let total = of_date.len().to_string();
    browser
        .reload_until("the day's instances", "#instances-today", |t| t == total)
        .await;
    assert_eq!(browser.text("#failures").await, count("failed").to_string());

    // Kill ends a running `sleep`: its process is gone.
    let sleeper = trigger(&up, "sleeper");
    let pid: i32 = wait_for(Duration::from_secs(30), "the sleeper to start", || async {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    })
    .await;
    // A kill needs a reason, as the CLI's: without one it is refused, saying so.
    browser.open(&format!("{base}/instances/{sleeper}")).await;
    browser.click("#kill").await;
    browser.accept().await;
    browser
        .until("the refusal", "#act-result", |t| {
            t.contains("reason: say why")
        })
        .await;
    browser.fill("#stop-reason", "hung on a lock").await;
    browser.click("#kill").await;
    browser.accept().await;
    // The answer, or (the attempt over, its page reloaded by its log's poller) the new state.
    browser
        .until("the kill's answer", "body", |t| {
            t.contains("killed by") || t.contains("(killed)")
        })
        .await;
    let record = final_record(&up.client, &sleeper, Duration::from_secs(30)).await;
    assert_eq!(record.tag, ax_bus::Tag::Killed);
    assert!(
        record.message.ends_with(": hung on a lock"),
        "{}",
        record.message
    );
    // Ended, it is offered neither cancel nor kill (only what applies to its state), and what
    // it wrote before the kill is kept on its page.
    browser.open(&format!("{base}/instances/{sleeper}")).await;
    browser
        .reload_until("the log kept after the kill", "#log", |t| {
            t.contains("before the kill")
        })
        .await;
    browser.element("#rerun").await;
    assert!(!browser.has("#cancel").await && !browser.has("#kill").await);
    wait_for(Duration::from_secs(30), "the sleep to end", || async {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            .is_err()
            .then_some(())
    })
    .await;

    // The DAG of the day: a failed upstream and its cancelled downstream, in their colours.
    let extract = trigger(&up, "extract");
    final_record(&up.client, &extract, Duration::from_secs(30)).await;
    let load = wait_for(Duration::from_secs(30), "load to be cancelled", || async {
        let records = listed(&up);
        let load = records.iter().find(|r| r["job"] == "load")?;
        (load["state"] == "cancelled").then(|| load["instance_id"].as_str().map(String::from))?
    })
    .await;
    browser.open(&format!("{base}/dag?root=load")).await;
    let state_of = |job: &'static str| {
        let browser = &browser;
        async move {
            browser
                .client
                .find(fantoccini::Locator::Css(&format!("#dag g[data-job={job}]")))
                .await
                .unwrap()
                .attr("class")
                .await
                .unwrap()
                .unwrap_or_default()
        }
    };
    assert_eq!(state_of("extract").await, "node failed");
    assert_eq!(state_of("load").await, "node cancelled");
    let link = browser
        .client
        .find(fantoccini::Locator::Css("#dag a:has(g[data-job=load])"))
        .await
        .unwrap()
        .attr("href")
        .await
        .unwrap();
    assert_eq!(link, Some(format!("/instances/{load}")));
    assert!(
        !browser.text("#dag").await.contains("broken"),
        "only the chain of the root"
    );
    // Under it, the Gantt of the date: the upstream ran (a bar, in its colour, a link), the
    // downstream cancelled before running has none.
    let bar = browser.element("#gantt a g[data-job=extract]").await;
    assert_eq!(
        bar.attr("class").await.unwrap().as_deref(),
        Some("bar failed")
    );
    assert!(!browser.has("#gantt g[data-job=load]").await);
    browser.screenshot("dag").await;

    // A dead letter replayed from its page's list: the failed upstream runs again.
    let letters = up.client.dead_letters().await.unwrap();
    let letter = letters
        .iter()
        .find(|l| l.instance.as_deref() == Some(extract.as_str()))
        .expect("extract's dead letter");
    browser.open(&format!("{base}/dlq/{}", letter.id)).await;
    assert!(browser.text("#payload").await.contains(&extract));
    browser.screenshot("dead-letter").await;
    browser.open(&format!("{base}/dlq")).await;
    let row = format!("#dlq tr:has(a[href='/instances/{extract}']) input[name=id]");
    browser.click(&row).await;
    browser.screenshot("dead-letters").await;
    browser.click("#replay").await;
    browser.accept().await;
    let replayed = browser
        .until("the replay", "#results", |t| !t.is_empty())
        .await;
    assert!(
        replayed.contains("replayed (rerun) and removed"),
        "{replayed}"
    );
    wait_for(
        Duration::from_secs(30),
        "extract's second attempt",
        || async {
            let (record, _) = up.client.instance(&extract.parse().ok()?).await.ok()??;
            (record.attempt == 2 && record.state.is_final()).then_some(())
        },
    )
    .await;

    // The chain of a date, forced downstream: planned first, and run only once the date is
    // typed.
    let today = chrono::Utc::now().date_naive().to_string();
    browser.open(&format!("{base}/rerun")).await;
    browser
        .fill("#rerun-form input[name=biz_date]", &today)
        .await;
    browser
        .client
        .find(fantoccini::Locator::Css("#rerun-form select[name=root]"))
        .await
        .unwrap()
        .select_by_value("extract")
        .await
        .unwrap();
    browser
        .click("#rerun-form input[name=force_downstream]")
        .await;
    browser.click("#plan").await;
    let plan = browser
        .until("the chain's plan", "#plan-summary", |t| {
            t.contains("would run")
        })
        .await;
    assert!(plan.starts_with("2 instance"), "{plan}");
    browser.screenshot("rerun").await;
    // The backfill form reports every bad field at once (the browser's own checks set aside).
    browser
        .client
        .execute(
            "document.querySelectorAll('#backfill-form input').forEach(i => { i.removeAttribute('required'); i.removeAttribute('min'); i.type = 'text'; });",
            vec![],
        )
        .await
        .unwrap();
    browser
        .fill("#backfill-form input[name=from]", "someday")
        .await;
    browser
        .fill("#backfill-form input[name=to]", "2026-13-01")
        .await;
    browser
        .fill("#backfill-form input[name=parallel]", "0")
        .await;
    browser.click("#backfill").await;
    browser.accept().await;
    let refused = browser
        .until("the backfill's refusal", "#backfill-result .error", |t| {
            !t.is_empty()
        })
        .await;
    let lines: Vec<&str> = refused.lines().collect();
    assert!(
        lines.len() == 3
            && lines[0].starts_with("parallel:")
            && lines[1].starts_with("from: `someday`")
            && lines[2].starts_with("to: `2026-13-01`"),
        "{refused}"
    );
    browser.click("#run-plan").await;
    let refused = browser
        .until("the refusal", "#run-problem", |t| !t.is_empty())
        .await;
    assert!(refused.starts_with("confirm_date:"), "{refused}");
    let (record, _) = up
        .client
        .instance(&extract.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.attempt, 2, "nothing ran without the date");
    browser.fill("input[name=confirm_date]", &today).await;
    browser.click("#run-plan").await;
    browser
        .until("the forced re-run", "#plan-summary", |t| {
            t.contains("started again")
        })
        .await;
    wait_for(
        Duration::from_secs(30),
        "extract's third attempt",
        || async {
            let (record, _) = up.client.instance(&extract.parse().ok()?).await.ok()??;
            (record.attempt == 3 && record.state.is_final()).then_some(())
        },
    )
    .await;

    // Bulk: the failed instances selected at once, their re-runs planned together.
    browser
        .open(&format!("{base}/instances?state=failed"))
        .await;
    let failed = browser
        .client
        .find_all(fantoccini::Locator::Css("#instances tbody tr"))
        .await
        .unwrap()
        .len();
    browser.click("input[data-check-all=id]").await;
    browser.click("#bulk-plan").await;
    let summary = browser
        .until("the bulk plan", "#bulk-summary", |t| {
            t.contains("would run")
        })
        .await;
    // Each failed one runs again, and what depends on it with it.
    let runs: usize = summary.split_whitespace().next().unwrap().parse().unwrap();
    assert!(failed >= 3 && runs >= failed, "{failed} failed; {summary}");
    browser.screenshot("instances-bulk").await;

    // The fleet: the worker, the node, and a queue paused and resumed from its page.
    browser.open(&format!("{base}/workers")).await;
    let workers = browser.text("#workers").await;
    assert!(workers.contains("local"), "{workers}");
    // How the worker keeps its attempts apart, and the room it offers them.
    assert!(
        workers.contains("cgroups: memory") && workers.contains(" CPU free"),
        "{workers}"
    );
    // Scored as the Routers score: their policy, read from the node's heartbeat.
    let policy = browser.text("#routing-policy").await;
    assert!(
        policy.contains("× 0.7") && policy.contains("10 s"),
        "{policy}"
    );
    browser.screenshot("workers").await;
    browser.open(&format!("{base}/nodes")).await;
    let nodes = browser.text("#nodes").await;
    assert!(nodes.contains("scheduler"), "{nodes}");
    assert!(
        nodes.contains("cpu ") && nodes.contains(", disk "),
        "each node's machine: {nodes}"
    );
    browser.screenshot("nodes").await;
    browser.open(&format!("{base}/queues")).await;
    browser.click("#pause-low").await;
    browser.accept().await;
    browser
        .until("the pause's answer", "#queue-result", |t| !t.is_empty())
        .await;
    let queues = ax(&up.nats, &["queue", "list", "--json"]);
    let queues: serde_json::Value = serde_json::from_slice(&queues.stdout).unwrap();
    let low = queues
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["priority"] == "low")
        .cloned()
        .unwrap();
    assert_eq!(low["paused"], true, "{queues}");
    browser.open(&format!("{base}/queues")).await;
    browser.screenshot("queues").await;
    browser.click("#resume-low").await;
    browser
        .until("the resume's answer", "#queue-result", |t| !t.is_empty())
        .await;

    // The editor checks as it is typed, placing a problem at its line, and applies nothing
    // until the text is valid.
    browser.open(&format!("{base}/jobs/new")).await;
    browser.screenshot("editor").await;
    let bad = "version: v1\njob:\n  name: nightly\n  cron: \"not a cron\"\n  exec: { type: shell, command: 'true' }\n";
    browser.fill("#yaml", bad).await;
    let problem = browser
        .until("the problem", "#problems li", |t| t.contains("job.cron"))
        .await;
    assert!(problem.starts_with("line 4:"), "{problem}");
    browser.click("#apply").await;
    browser
        .until("the refusal", "#apply-result li", |t| {
            t.contains("job.cron")
        })
        .await;
    assert!(up
        .client
        .job(&"nightly".parse().unwrap())
        .await
        .unwrap()
        .is_none());
    // A misspelt executor is named; a dependency on a job that does not exist is a problem
    // of the text, as an apply would say; an executor no worker offers is pointed out.
    let good = bad.replace("not a cron", "0 3 * * *");
    for (text, shown_in, said) in [
        (
            good.replace("type: shell", "type: shel"),
            "#problems li",
            "did you mean `type: shell`?",
        ),
        (
            good.replace("  exec:", "  deps: [ { name: no_such_job } ]\n  exec:"),
            "#problems li",
            "unknown job `no_such_job`",
        ),
        (
            good.replace("{ type: shell, command: 'true' }", "{ type: sparkle }"),
            "#warnings",
            "no worker offers `sparkle`",
        ),
    ] {
        browser.fill("#yaml", &text).await;
        browser.until(said, shown_in, |t| t.contains(said)).await;
    }
    browser
        .fill("#yaml", &bad.replace("not a cron", "0 3 * * *"))
        .await;
    browser
        .until("the text to be valid", "#valid", |t| t == "valid: nightly")
        .await;
    browser.click("#apply").await;
    browser
        .until("the apply's answer", "#applied", |t| {
            t.contains("nightly: created")
        })
        .await;
    assert!(up
        .client
        .job(&"nightly".parse().unwrap())
        .await
        .unwrap()
        .is_some());

    // A state change without the page's token is refused, even from the console's own origin.
    let forged = browser
        .client
        .execute(
            "return fetch('/ui/jobs/greet/pause', {method: 'POST'}).then(r => r.status);",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(forged, 403);
    let (job, _) = up
        .client
        .job(&"greet".parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(!job.paused, "a forged request changed the job");
    // With the token (as the page's own script sends it), the same request works.
    browser.open(&format!("{base}/jobs/greet")).await;
    browser.click("#pause").await;
    browser
        .until("the pause's answer", "#job-result", |t| !t.is_empty())
        .await;
    let (job, _) = up
        .client
        .job(&"greet".parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(job.paused);
    browser.client.clone().close().await.unwrap();
}

/// A node serves the console only with the `admin` role; any node given an address serves
/// `/metrics`.
/// A running attempt's lines appear on its page as they are written (no reload), the state
/// follows when it ends, and after a re-run each attempt has a tab with its own log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_attempts_log_is_followed_on_its_page_with_a_tab_per_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let up = up(dir.path()).await;
    apply(
        &up,
        dir.path(),
        &[(
            "ticker",
            "  exec: { type: shell, command: 'for i in 1 2 3 4 5 6 7 8; do echo line $i; for j in 1 2 3 4 5; do echo fill $i.$j; done; sleep 1; done; echo done >&2' }\n",
        )],
    );
    let browser = Browser::start().await;
    let id = trigger(&up, "ticker");
    // Opened while it runs (opened while it waits, the page has no running time to tick: a
    // loaded machine may take seconds to start it).
    executing(&up.client, &id, Duration::from_secs(60)).await;
    let page = format!("{}/instances/{id}", up.http);
    browser.open(&page).await;
    let first = browser.text("#log").await;
    assert!(!first.contains("line 6"), "opened too late: {first}");
    // Without a reload: the poller appends what was shipped since, and the pane, taller than
    // its box by now, shows the newest line (as a tail does); the running time ticks.
    let ran = browser.text("#running-1").await;
    browser
        .until("the lines written since the page opened", "#log", |t| {
            t.contains("line 6")
        })
        .await;
    let at_end = "var l = document.getElementById('log'); \
                  return [l.scrollHeight > l.clientHeight, \
                          l.scrollTop + l.clientHeight >= l.scrollHeight - 4];";
    assert_eq!(
        browser.script(at_end).await,
        serde_json::json!([true, true])
    );
    let ticked = browser.text("#running-1").await;
    assert_ne!(ticked, ran, "the running time did not tick");
    // A reader who scrolled up is left where they are while lines arrive.
    browser
        .script("document.getElementById('log').scrollTop = 0; return null;")
        .await;
    browser
        .until("a line after the reader scrolled up", "#log", |t| {
            t.contains("line 8")
        })
        .await;
    let top = "return document.getElementById('log').scrollTop;";
    assert_eq!(browser.script(top).await, serde_json::json!(0));
    browser
        .until("the end of the log", "#log-more", |t| {
            t.contains("bytes written")
        })
        .await;
    browser
        .until("the state brought up to date", "#state", |t| t == "success")
        .await;
    let log = browser.text("#log").await;
    let want: Vec<String> = (1..=8).map(|i| format!("line {i}")).collect();
    assert_eq!(
        log.lines()
            .filter(|l| l.starts_with("line"))
            .collect::<Vec<_>>(),
        want
    );
    assert!(browser.has("#log .stderr").await, "stderr is shown apart");
    browser.screenshot("instance-log").await;

    let rerun = ax(&up.nats, &["rerun", "--instance", &id]);
    assert!(rerun.status.success(), "{}", stderr(&rerun));
    browser
        .reload_until("the re-run's tab", "#logs", |t| t.contains("attempt 2"))
        .await;
    // The history is grouped by attempt, each saying how long it ran, how it ended and what
    // it used (its worker runs it in a cgroup).
    let first = browser.text("#history-1").await;
    assert!(
        first.starts_with("Attempt 1 — ran ")
            && first.contains(" on local: success completed, exit code 0; used cpu ")
            && first.contains(" s, peak memory "),
        "{first}"
    );
    browser.element("#history-2").await;
    browser.click("#attempt-1").await;
    let first = browser
        .until("the first attempt's log", "#log", |t| t.contains("line 8"))
        .await;
    assert!(first.contains("line 1"), "{first}");
    let current = browser.element("#attempt-1").await;
    assert_eq!(
        current.attr("aria-current").await.unwrap().as_deref(),
        Some("page")
    );
}

/// At a phone's width (390 px) every page fits: the navigation wraps with every link in view,
/// nothing makes the page scroll sideways. With the system set to dark, the console is dark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_fits_a_phone_and_follows_the_dark_setting() {
    let dir = tempfile::tempdir().unwrap();
    let up = up(dir.path()).await;
    apply(
        &up,
        dir.path(),
        &[(
            "a_job_with_a_rather_long_name_for_a_small_screen",
            "  exec: { type: shell, command: 'echo a line long enough to need wrapping on a phone screen, and then some more' }\n",
        )],
    );
    let id = trigger(&up, "a_job_with_a_rather_long_name_for_a_small_screen");
    final_record(&up.client, &id, Duration::from_secs(60)).await;
    let phone = Browser::start_with((390, 844), false).await;
    let fits = "const w = window.innerWidth; \
        const links = [...document.querySelectorAll('nav a')]; \
        const out = links.filter(a => { const r = a.getBoundingClientRect(); \
            return r.width === 0 || r.right > w + 0.5 || r.left < 0; }).map(a => a.textContent); \
        const wide = [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > 391).slice(0, 4).map(e => e.outerHTML.slice(0, 80) + ':' + Math.round(e.getBoundingClientRect().left) + '-' + Math.round(e.getBoundingClientRect().right)); \
        const lines = el => { const tops = new Set(); \
            const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT); \
            while (walk.nextNode()) { const r = document.createRange(); r.selectNodeContents(walk.currentNode); \
                for (const q of r.getClientRects()) { tops.add(Math.round(q.top)); } } \
            return tops.size; }; \
        const broken = [...document.querySelectorAll('td')].filter(td => { const t = td.textContent.trim(); \
            return t.length > 0 && !/\\s/.test(t) && lines(td) > 1; }).slice(0, 4).map(td => td.textContent.trim()); \
        return { page: document.documentElement.scrollWidth, window: w, out: out, links: links.length, wide: wide, broken: broken };";
    for path in [
        "/".to_string(),
        "/jobs".into(),
        "/instances".into(),
        format!("/instances/{id}"),
        "/jobs/a_job_with_a_rather_long_name_for_a_small_screen".into(),
        "/dag".into(),
        "/datasets".into(),
        "/rerun".into(),
        "/workers".into(),
        "/nodes".into(),
        "/queues".into(),
        "/dlq".into(),
        "/approvals".into(),
        "/audit".into(),
    ] {
        phone.open(&format!("{}{path}", up.http)).await;
        let seen = phone.client.execute(fits, vec![]).await.unwrap();
        assert!(
            seen["page"].as_u64() <= Some(390)
                && seen["window"].as_u64() == Some(390)
                && seen["out"].as_array().is_some_and(|o| o.is_empty())
                && seen["links"].as_u64() >= Some(11)
                && seen["broken"].as_array().is_some_and(|b| b.is_empty()),
            "{path} at 390 px: {seen}"
        );
        if path == "/" {
            phone.screenshot("phone-dashboard").await;
        }
    }
    drop(phone);

    let dark = Browser::start_with((1280, 900), true).await;
    dark.open(&format!("{}/instances/{id}", up.http)).await;
    let colours = dark
        .client
        .execute(
            "return [getComputedStyle(document.body).backgroundColor, \
                     getComputedStyle(document.querySelector('pre#log')).backgroundColor];",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        colours,
        serde_json::json!(["rgb(20, 24, 29)", "rgb(28, 33, 40)"]),
        "the page and its log in the dark colours"
    );
    dark.screenshot("dark-instance").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_comes_with_the_admin_role() {
    let nats = TestNats::start();
    let (admin_port, worker_port) = (free_port(), free_port());
    let admin_addr = format!("127.0.0.1:{admin_port}");
    let worker_addr = format!("127.0.0.1:{worker_port}");
    let admin = AxProcess::node(&nats, "a1", "admin", &["--http", &admin_addr]);
    let _worker = AxProcess::node(&nats, "w1", "scheduler,worker", &["--http", &worker_addr]);
    let get = |url: String| async move {
        let response = reqwest::get(url).await.ok()?;
        Some(response.status().as_u16())
    };
    let console = wait_for_logged(Duration::from_secs(60), "the console", &[&admin], || {
        get(format!("http://{admin_addr}/"))
    })
    .await;
    assert_eq!(console, 200);
    assert!(admin
        .log_text()
        .contains(&format!("console: http://{admin_addr}/")));
    let metrics = wait_for(Duration::from_secs(60), "the worker's metrics", || {
        get(format!("http://{worker_addr}/metrics"))
    })
    .await;
    assert_eq!(metrics, 200);
    assert_eq!(get(format!("http://{worker_addr}/")).await, Some(404));
    assert_eq!(
        get(format!("http://{worker_addr}/api/v1/status")).await,
        Some(404)
    );
}

/// The console's instance index survives a NATS restart: it reopens its feed and lists what was
/// created before and after, complete again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_instance_list_follows_through_a_nats_restart() {
    let mut nats = TestNats::start();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let node = AxProcess::node(&nats, "n1", "all,admin", &["--http", &addr]);
    apply_job(
        &nats,
        "quick",
        "version: v1\njob:\n  name: quick\n  exec: { type: shell, command: 'true' }\n",
    )
    .await;
    let listed = |addr: String| async move {
        let page: serde_json::Value = reqwest::get(format!(
            "http://{addr}/api/v1/instances?job=quick&state=success"
        ))
        .await
        .ok()?
        .json()
        .await
        .ok()?;
        let ids: Vec<String> = page["instances"]
            .as_array()?
            .iter()
            .filter_map(|r| r["instance_id"].as_str().map(String::from))
            .collect();
        (page["complete"] == true).then_some(ids)
    };
    let out = ax(&nats.url(), &["job", "trigger", "quick"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let before = stdout(&out).split_whitespace().next().unwrap().to_string();
    wait_for_logged(
        Duration::from_secs(60),
        "the first run listed",
        &[&node],
        || {
            let (addr, before) = (addr.clone(), before.clone());
            async move { listed(addr).await.filter(|ids| ids.contains(&before)) }
        },
    )
    .await;
    nats.server.restart().expect("nats-server restarts");
    let after = wait_for(
        Duration::from_secs(60),
        "a trigger after the restart",
        || {
            let out = ax(&nats.url(), &["job", "trigger", "quick"]);
            let id = stdout(&out).split_whitespace().next().map(String::from);
            async move { id.filter(|_| out.status.success()) }
        },
    )
    .await;
    let ids = wait_for_logged(
        Duration::from_secs(60),
        "both runs listed",
        &[&node],
        || {
            let (addr, after) = (addr.clone(), after.clone());
            async move { listed(addr).await.filter(|ids| ids.contains(&after)) }
        },
    )
    .await;
    assert!(ids.contains(&before), "{ids:?}");
}

/// DNS rebinding: a page on a name its attacker points at the console is same-origin to itself
/// (its `Origin` and `Host` agree), so only the name tells it apart. The console answers only
/// for localhost, IP addresses and the names it is given (`[metrics] hosts`); a forwarding
/// header the page sets itself does not help it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_a_rebound_name_is_refused() {
    let nats = TestNats::start();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let node = AxProcess::configured(
        &nats,
        "a1",
        "admin",
        &format!("[metrics]\nlisten = \"{addr}\"\nhosts = [\"ax.example.com\"]\n"),
    );
    let http = reqwest::Client::new();
    let create = |host: &'static str| {
        let (http, addr) = (http.clone(), addr.clone());
        async move {
            let origin = format!("http://{host}:{}", addr.rsplit_once(':').unwrap().1);
            http.post(format!("http://{addr}/api/v1/jobs"))
                .header("Host", format!("{host}:{}", addr.rsplit_once(':').unwrap().1))
                .header("Origin", origin)
                .header("X-Forwarded-Host", addr.clone())
                .header("Content-Type", "application/yaml")
                .body("version: v1\njob:\n  name: rebound\n  exec: { type: shell, command: 'touch /tmp/rebound' }\n")
                .send()
                .await
                .ok()
        }
    };
    let refused = wait_for_logged(Duration::from_secs(60), "the console", &[&node], || {
        create("rebind.example")
    })
    .await;
    assert_eq!(refused.status().as_u16(), 403);
    let body = refused.text().await.unwrap();
    assert!(body.contains("rebind.example"), "{body}");
    let client = nats.client().await;
    assert!(client
        .job(&support::job("rebound"))
        .await
        .unwrap()
        .is_none());
    // The same request sent to a served name gets past the host check (to the API's own
    // answer about the job).
    for host in ["127.0.0.1", "localhost", "ax.example.com"] {
        let answered = create(host).await.expect("an answer");
        assert_ne!(answered.status().as_u16(), 403, "{host}");
    }
    // Requests no client library sends, written on the socket: a Host whose userinfo hides
    // the name, and an absolute-form target, whose authority wins over Host (RFC 9112
    // §3.2.2). Each is refused; the same shapes with a served name are answered.
    for (target, host, status) in [
        ("/api/v1/jobs", "[::1]@evil.com".to_string(), 403),
        ("/api/v1/jobs", format!("127.0.0.1@evil.com:{port}"), 403),
        ("http://evil.example/api/v1/jobs", addr.clone(), 403),
        ("/api/v1/jobs", format!("[::1]:{port}"), 200),
        (
            &format!("http://{addr}/api/v1/jobs"),
            "evil.example".to_string(),
            200,
        ),
    ] {
        let answer = raw_get(&addr, target, &host).await;
        let first = answer.lines().next().unwrap_or_default();
        assert!(
            first.starts_with(&format!("HTTP/1.1 {status}")),
            "GET {target} with Host {host}: {first}"
        );
    }
}

/// The status line and the rest of a `GET target` sent with `Host: host` on a socket of its
/// own (the connection closed after it).
async fn raw_get(addr: &str, target: &str, host: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), socket.read_to_end(&mut answer))
        .await
        .expect("an answer in 30 s")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// The datasets the jobs name, listed; a dataset's page: who writes and reads it, its
/// freshness, the update a producer's success recorded (linked to its instance) and its
/// lineage drawn both ways, each node a link; an unknown dataset is a 404, a malformed URI a
/// 400, each saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datasets_page_shows_its_writers_readers_updates_and_lineage() {
    let dir = tempfile::tempdir().unwrap();
    let up = up(dir.path()).await;
    apply(
        &up,
        dir.path(),
        &[
            (
                "load",
                "  consumes: [ 's3://raw/orders' ]\n  produces: [ 'warehouse://orders' ]\n  freshness: { 'warehouse://orders': 26h }\n  exec: { type: noop }\n",
            ),
            (
                "report",
                "  consumes: [ 'warehouse://orders' ]\n  produces: [ 'warehouse://report' ]\n  exec: { type: noop }\n",
            ),
            (
                "mail",
                "  consumes: [ 'warehouse://report' ]\n  exec: { type: noop }\n",
            ),
        ],
    );
    let load = trigger(&up, "load");
    let record = final_record(&up.client, &load, Duration::from_secs(60)).await;
    assert_eq!(record.state, ax_bus::State::Success);
    let base = &up.http;
    let browser = Browser::start().await;

    browser.open(&format!("{base}/datasets")).await;
    let listed = browser.text("#datasets").await;
    for uri in [
        "s3://raw/orders",
        "warehouse://orders",
        "warehouse://report",
    ] {
        assert!(listed.contains(uri), "{uri} not in {listed}");
    }
    browser.screenshot("datasets").await;
    browser
        .click("tr[data-uri='warehouse://orders'] td:first-child a")
        .await;
    browser
        .until("the dataset's page", "#uri", |t| t == "warehouse://orders")
        .await;
    assert_eq!(browser.text("#writers").await, "load");
    assert_eq!(browser.text("#readers").await, "report");
    assert_eq!(browser.text("#freshness").await, "26h 00m");
    // The producer's success is the update of its business date, linked to its instance.
    let row = browser
        .reload_until("the load's update", "#updates", |t| {
            t.contains(load.as_str())
        })
        .await;
    assert!(row.contains(&record.biz_date), "{row}");
    let link = browser
        .element(&format!("#updates a[href='/instances/{load}']"))
        .await;
    assert_eq!(link.text().await.unwrap(), load);
    // The lineage, three steps each way: every dataset and job of the chain, the page's own
    // marked, each edge from a writer to what it writes or from a dataset to its reader.
    let drawn = browser
        .client
        .execute(
            "return { nodes: [...document.querySelectorAll('#lineage g.node')].map(g => g.dataset.name + '|' + g.getAttribute('class')), \
                      edges: [...document.querySelectorAll('#lineage path.edge')].map(p => p.dataset.from + '>' + p.dataset.to).sort(), \
                      links: [...document.querySelectorAll('#lineage a')].map(a => a.getAttribute('href')) };",
            vec![],
        )
        .await
        .unwrap();
    let mut nodes: Vec<String> = serde_json::from_value(drawn["nodes"].clone()).unwrap();
    nodes.sort();
    assert_eq!(
        nodes,
        [
            "load|node job",
            "mail|node job",
            "report|node job",
            "s3://raw/orders|node dataset",
            "warehouse://orders|node dataset here",
            "warehouse://report|node dataset",
        ]
    );
    assert_eq!(
        drawn["edges"],
        serde_json::json!([
            "load>warehouse://orders",
            "report>warehouse://report",
            "s3://raw/orders>load",
            "warehouse://orders>report",
            "warehouse://report>mail"
        ])
    );
    let links = drawn["links"].to_string();
    assert!(
        links.contains("/jobs/mail")
            && links.contains("/datasets/show?uri=s3%3A%2F%2Fraw%2Forders"),
        "{links}"
    );
    browser.screenshot("dataset").await;
    browser
        .click("#lineage a[href='/datasets/show?uri=s3%3A%2F%2Fraw%2Forders']")
        .await;
    browser
        .until("the upstream dataset's page", "#uri", |t| {
            t == "s3://raw/orders"
        })
        .await;
    assert_eq!(browser.text("#readers").await, "load");
    assert!(browser.text("#writers").await.contains("nobody"));
    assert!(browser.has("#no-updates").await);
    // A job's page names what it reads and writes, each a link to the dataset's page.
    browser.open(&format!("{base}/jobs/report")).await;
    assert_eq!(
        browser.text("#job-datasets").await,
        "Reads warehouse://orders · writes warehouse://report"
    );

    // Asked for what is not there, or not a URI: the answer says which.
    for (uri, status, says) in [
        (
            "nowhere://nothing",
            404,
            "no job writes or reads nowhere://nothing",
        ),
        ("orders", 400, "scheme://name"),
    ] {
        let response = reqwest::get(format!("{base}/datasets/show?uri={uri}"))
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status, "{uri}");
        let body = response.text().await.unwrap();
        assert!(body.contains(says), "{uri}: {body}");
    }

    // The DAG page draws a job run by a dataset apart from a dependency: dashed, from the
    // dataset's writer.
    apply(
        &up,
        dir.path(),
        &[(
            "digest",
            "  consumes: [ 'warehouse://report' ]\n  on_datasets: [ 'warehouse://report' ]\n  exec: { type: noop }\n",
        )],
    );
    browser.open(&format!("{base}/dag")).await;
    let edges = browser
        .script(
            "return [...document.querySelectorAll('#dag path.edge')] \
             .map(p => p.dataset.from + '>' + p.dataset.to + '|' + p.getAttribute('class'));",
        )
        .await;
    assert_eq!(edges, serde_json::json!(["report>digest|edge data"]));
    assert!(browser.text("#dag-legend").await.contains("dashed"));
}

/// The job and instance lists filter by namespace, in the pages (a select of the namespaces
/// that hold jobs) and in the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_list_shows_one_namespace_when_asked() {
    let nats = TestNats::start();
    let addr = format!("127.0.0.1:{}", free_port());
    let node = AxProcess::node(&nats, "n1", "scheduler,admin", &["--http", &addr]);
    apply_job(
        &nats,
        "teams",
        "version: v1\njob: { namespace: a, name: hello, exec: { type: noop } }\n---\n\
         version: v1\njob: { namespace: b, name: report, exec: { type: noop } }\n---\n\
         version: v1\njob: { name: plain, exec: { type: noop } }\n",
    )
    .await;
    let base = format!("http://{addr}");
    let names = |body: serde_json::Value| -> Vec<String> {
        body.as_array()
            .expect("a list")
            .iter()
            .filter_map(|j| j["name"].as_str().map(str::to_string))
            .collect()
    };
    let listed = wait_for_logged(Duration::from_secs(60), "the API", &[&node], || async {
        let response = reqwest::get(format!("{base}/api/v1/jobs?namespace=b"))
            .await
            .ok()?;
        let body: serde_json::Value = response.json().await.ok()?;
        Some(names(body)).filter(|n| !n.is_empty())
    })
    .await;
    assert_eq!(listed, ["b.report"]);
    let every: serde_json::Value = reqwest::get(format!("{base}/api/v1/jobs"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(names(every), ["a.hello", "b.report", "plain"]);
    // The instance list too.
    let ours = support::trigger(&nats, &["a/hello"]);
    let theirs = support::trigger(&nats, &["b/report"]);
    let listed = wait_for(Duration::from_secs(30), "the instances listed", || async {
        let body: serde_json::Value = reqwest::get(format!("{base}/api/v1/instances?namespace=a"))
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        let ids: Vec<String> = body["instances"]
            .as_array()?
            .iter()
            .filter_map(|r| r["instance_id"].as_str().map(str::to_string))
            .collect();
        ids.contains(&ours).then_some(ids)
    })
    .await;
    assert!(!listed.contains(&theirs), "{listed:?}");
    let bad = reqwest::get(format!("{base}/api/v1/instances?namespace=Not%20One"))
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);

    let browser = Browser::start().await;
    browser.open(&format!("{base}/jobs?namespace=a")).await;
    let table = browser.text("#jobs").await;
    assert!(
        table.contains("a.hello") && !table.contains("b.report") && !table.contains("plain"),
        "{table}"
    );
    let choices = browser.text("#namespace").await;
    for namespace in ["a", "b", "default"] {
        assert!(choices.contains(namespace), "{choices}");
    }
    browser.screenshot("jobs-namespace").await;

    // The dashboard of one namespace: its instances only, without the figures of every
    // namespace; the switcher offers each namespace.
    browser.open(&format!("{base}/?namespace=b")).await;
    browser
        .until("b's instance counted", "#instances-today", |t| t == "1")
        .await;
    assert_eq!(browser.text("#shown-namespaces").await, "b");
    assert!(browser.has("#namespace-rule").await);
    assert!(
        !browser.has("#latency").await,
        "a figure of every namespace shown"
    );
    let choices = browser.text("#namespace").await;
    assert!(
        choices.contains("every namespace") && choices.contains("a"),
        "{choices}"
    );
    browser.screenshot("dashboard-namespace").await;
    browser.open(&format!("{base}/")).await;
    browser
        .until(
            "every namespace's instances counted",
            "#instances-today",
            |t| t == "2",
        )
        .await;
    assert!(browser.has("#latency").await);
    let bad = reqwest::get(format!("{base}/?namespace=Not%20One"))
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}
