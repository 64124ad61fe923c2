//! Bad input: every broken job file is refused locally with `file:line: field: reason` and
//! nothing is published; a malformed message sent straight to the control subject is answered
//! with an alert and never takes a Scheduler down.

use crate::support;

use std::time::Duration;

use ax_bus::messages::Alert;
use ax_bus::{codec, codec::JSON};
use futures::StreamExt;
use support::*;

const GOOD: &str = "version: v1
job:
  name: good
  cron: \"0 2 * * *\"
  timezone: Asia/Shanghai
  exec:
    type: shell
    command: echo ok
";

/// (file contents, the line, the field and a word the reason must hold)
fn cases() -> Vec<(&'static str, String, u32, &'static str, &'static str)> {
    vec![
        (
            "malformed yaml",
            "version: v1\njob:\n  name: [unclosed\n".to_string(),
            3,
            "",
            "",
        ),
        (
            "unknown field",
            GOOD.replace(
                "    command: echo ok\n",
                "    command: echo ok\n  colour: red\n",
            ),
            9,
            "",
            "colour",
        ),
        (
            "bad cron",
            GOOD.replace("0 2 * * *", "61 2 * * *"),
            4,
            "job.cron",
            "61",
        ),
        (
            "cron that never fires",
            GOOD.replace("0 2 * * *", "0 0 30 2 *"),
            4,
            "job.cron",
            "never fires",
        ),
        (
            "cron second out of range, on one line",
            GOOD.replace("0 2 * * *", "61 * * * * *"),
            4,
            "job.cron",
            "61 is out of 0–59",
        ),
        (
            "unknown time zone",
            GOOD.replace("Asia/Shanghai", "Mars/Olympus"),
            5,
            "job.timezone",
            "Mars/Olympus",
        ),
        (
            "unknown executor",
            GOOD.replace("type: shell", "type: Cobol"),
            7,
            "job.exec.type",
            "Cobol",
        ),
        (
            "http without url",
            GOOD.replace("type: shell\n    command: echo ok", "type: http"),
            7,
            "job.exec.url",
            "needs `url`",
        ),
        (
            "sql without statement",
            GOOD.replace(
                "type: shell\n    command: echo ok",
                "type: sql\n    database: main",
            ),
            7,
            "job.exec.statement",
            "needs `statement`",
        ),
        (
            "a setting of another executor",
            GOOD.replace("command: echo ok", "command: echo ok\n    url: http://x"),
            9,
            "job.exec.url",
            "takes no `url`",
        ),
        (
            "bad name",
            GOOD.replace("name: good", "name: Bad_Name"),
            3,
            "job.name",
            "[a-z0-9_-]",
        ),
        (
            "long name",
            GOOD.replace("name: good", &format!("name: {}", "a".repeat(65))),
            3,
            "job.name",
            "[a-z0-9_-]",
        ),
        (
            "zero timeout",
            GOOD.replace(
                "    command: echo ok\n",
                "    command: echo ok\n  timeout: 0\n",
            ),
            9,
            "job.timeout",
            "at least",
        ),
        (
            "negative timeout",
            GOOD.replace(
                "    command: echo ok\n",
                "    command: echo ok\n  timeout: -5\n",
            ),
            9,
            "",
            "",
        ),
        (
            "unknown placeholder",
            GOOD.replace("echo ok", "echo {{nope}}"),
            8,
            "job.exec.command",
            "nope",
        ),
        (
            "zero retry interval",
            GOOD.replace(
                "    command: echo ok\n",
                "    command: echo ok\n  retry: { times: 2, interval: 0 }\n",
            ),
            9,
            "job.retry.interval",
            "at least 1 second",
        ),
        (
            "negative retry interval",
            GOOD.replace(
                "    command: echo ok\n",
                "    command: echo ok\n  retry: { times: 2, interval: -30 }\n",
            ),
            9,
            "",
            "",
        ),
        (
            "too many retries",
            GOOD.replace(
                "    command: echo ok\n",
                "    command: echo ok\n  retry: { times: 101, interval: 30 }\n",
            ),
            9,
            "job.retry.times",
            "101 is more than 100",
        ),
        (
            "max_interval below the interval",
            GOOD.replace(
                "    command: echo ok\n",
                "    command: echo ok\n  retry: { times: 2, interval: 30, max_interval: 10 }\n",
            ),
            9,
            "job.retry.max_interval",
            "at least the interval",
        ),
        (
            "jitter over 1",
            GOOD.replace(
                "    command: echo ok\n",
                "    command: echo ok\n  retry: { times: 2, interval: 30, jitter: 1.5 }\n",
            ),
            9,
            "job.retry.jitter",
            "between 0 and 1",
        ),
        (
            "unknown dump signal",
            GOOD.replace(
                "    command: echo ok\n",
                "    command: echo ok\n  on_timeout: { signal: SIGKILL }\n",
            ),
            9,
            "",
            "SIGKILL",
        ),
        (
            "grace without a signal",
            GOOD.replace(
                "    command: echo ok\n",
                "    command: echo ok\n  on_timeout: { signal: none, grace: 10 }\n",
            ),
            9,
            "job.on_timeout.grace",
            "needs a signal",
        ),
        (
            "grace over the limit",
            GOOD.replace(
                "    command: echo ok\n",
                "    command: echo ok\n  on_timeout:\n    grace: 3600\n",
            ),
            10,
            "job.on_timeout.grace",
            "more than 600",
        ),
        (
            "tag with a space",
            GOOD.replace(
                "    command: echo ok\n",
                "    command: echo ok\n  tags: [gpu, 'no spaces']\n",
            ),
            9,
            "job.tags",
            "no spaces",
        ),
        (
            "zero shards",
            GOOD.replace(
                "    command: echo ok\n",
                "    command: echo ok\n  shards: 0\n",
            ),
            9,
            "job.shards",
            "at least 1",
        ),
        (
            "sharded and broadcast",
            GOOD.replace(
                "    command: echo ok\n",
                "    command: echo ok\n  broadcast: true\n  shards: 4\n",
            ),
            10,
            "job.shards",
            "not both",
        ),
        (
            "unknown priority",
            GOOD.replace(
                "    command: echo ok\n",
                "    command: echo ok\n  priority: urgent\n",
            ),
            9,
            "",
            "urgent",
        ),
        (
            "retry interval past a day (the Reporter's crash loop)",
            GOOD.replace(
                "    command: echo ok\n",
                "    command: echo ok\n  retry: { times: 3, interval: 1000000000000000000 }\n",
            ),
            9,
            "job.retry.interval",
            "more than 86400 s (1 day)",
        ),
        (
            "timeout of 10^12 s",
            GOOD.replace(
                "    command: echo ok\n",
                "    command: echo ok\n  timeout: 1000000000000\n",
            ),
            9,
            "job.timeout",
            "more than 604800 s (7 days)",
        ),
        (
            "catch-up window past 31 days",
            GOOD.replace(
                "    command: echo ok\n",
                "    command: echo ok\n  catchup_window: 99999999\n",
            ),
            9,
            "job.catchup_window",
            "more than 2678400 s (31 days)",
        ),
        (
            "params past 64 KiB",
            GOOD.replace(
                "    command: echo ok\n",
                &format!(
                    "    command: echo ok\n  params: {{ blob: {} }}\n",
                    "x".repeat(70_000)
                ),
            ),
            9,
            "job.params",
            "more than 65536",
        ),
        (
            "a command Linux cannot pass to the shell",
            GOOD.replace("echo ok", &format!("echo {}", "x".repeat(140_000))),
            8,
            "job.exec.command",
            "more than 131071",
        ),
        (
            "wrong version",
            GOOD.replace("version: v1", "version: v2"),
            1,
            "version",
            "v2",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_broken_file_is_refused_with_its_place_and_nothing_is_published() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let dir = nats.path("jobs");
    for (what, text, line, field, word) in cases() {
        let file = job_file(&dir, "job.yaml", &text);
        let out = ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()]);
        assert!(!out.status.success(), "{what}: apply succeeded");
        let err = stderr(&out);
        // One problem, one line: the error itself.
        let first = err.lines().next().unwrap_or_default();
        let first = match err.trim_end().lines().count() {
            1 => first.strip_prefix("error: ").unwrap_or(first),
            _ => first,
        };
        let place = format!("{}:{line}: ", file.display());
        assert!(
            first.starts_with(&place),
            "{what}: `{first}` does not start with `{place}`"
        );
        assert!(
            first.contains(field),
            "{what}: `{first}` does not name {field}"
        );
        assert!(
            first.contains(word),
            "{what}: `{first}` does not say `{word}`"
        );
        assert!(
            err.lines().last().unwrap().contains("nothing applied"),
            "{what}: {err}"
        );
    }

    // The same job twice in one apply (two files), and twice in one file.
    let a = job_file(&dir, "a.yaml", GOOD);
    let b = job_file(&dir, "b.yaml", &GOOD.replace("echo ok", "echo other"));
    let out = ax(
        &nats.url(),
        &[
            "job",
            "apply",
            "-f",
            a.to_str().unwrap(),
            "-f",
            b.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.trim_start_matches("error: ").starts_with(&format!(
            "{}:3: job.name: `good` is defined twice",
            b.display()
        )),
        "{err}"
    );
    let twice = job_file(&dir, "twice.yaml", &format!("{GOOD}---\n{GOOD}"));
    let out = ax(
        &nats.url(),
        &["job", "apply", "-f", twice.to_str().unwrap()],
    );
    assert!(
        stderr(&out).contains(&format!("{}:12: job.name", twice.display())),
        "{}",
        stderr(&out)
    );

    // A directory with one good and one broken file applies nothing.
    let mixed = nats.path("mixed");
    job_file(&mixed, "1-good.yaml", GOOD);
    job_file(
        &mixed,
        "2-bad.yaml",
        &GOOD
            .replace("name: good", "name: other")
            .replace("0 2", "99 2"),
    );
    let out = ax(
        &nats.url(),
        &["job", "apply", "-f", mixed.to_str().unwrap()],
    );
    assert!(!out.status.success());

    // A spec of 5 MB is refused at its line.
    let huge = job_file(
        &dir,
        "huge.yaml",
        &GOOD.replace("echo ok", &format!("echo {}", "x".repeat(5_000_000))),
    );
    let out = ax(&nats.url(), &["job", "apply", "-f", huge.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(
        !out.status.success()
            && err
                .trim_start_matches("error: ")
                .starts_with(&format!("{}:3: job: ", huge.display())),
        "{}",
        err.chars().take(300).collect::<String>()
    );
    // Nothing reached the control stream or the registry.
    let mut control = client.js.get_stream("AX_CONTROL").await.unwrap();
    assert_eq!(control.info().await.unwrap().state.messages, 0);
    assert!(client.jobs().await.unwrap().is_empty());

    // A file that does not exist is one clear line too.
    let out = ax(
        &nats.url(),
        &["job", "apply", "-f", "/nonexistent/jobs.yaml"],
    );
    assert!(
        stderr(&out).starts_with("error: /nonexistent/jobs.yaml: cannot read"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stderr(&out).trim_end().lines().count(), 1);
}

/// A set of jobs larger together than one NATS message is applied in several commands that
/// each fit, upstream jobs first (each command's dependencies are registered by then), and
/// the CLI says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_larger_than_a_message_is_applied_in_commands_that_fit() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "scheduler", &[]);
    set_up(&nats.url()).await;
    let many = nats.path("many");
    // Ten jobs of 120 KB, each depending on the one before; the files list them downstream
    // first (9.yaml sorts last, 0.yaml first, but big-9 depends on big-8 ...).
    for i in 0..10 {
        let deps = if i > 0 {
            format!("  deps: [{{ name: big-{} }}]\n", i - 1)
        } else {
            String::new()
        };
        job_file(
            &many,
            &format!("{}.yaml", 9 - i),
            &format!(
                "{}{deps}",
                GOOD.replace("name: good", &format!("name: big-{i}"))
                    .replace("echo ok", &format!("echo {}", "x".repeat(120_000)))
            ),
        );
    }
    let out = ax(&nats.url(), &["job", "apply", "-f", many.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("sent as 2 commands, upstream jobs first"),
        "{err}"
    );
    assert_eq!(
        stdout(&out).matches("created").count(),
        10,
        "{}",
        stdout(&out)
    );
    let mut names: Vec<String> = client
        .jobs()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.spec.name.to_string())
        .collect();
    names.sort();
    assert_eq!(names.len(), 10, "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_control_messages_raise_alerts_and_change_nothing() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let mut alerts = client.nats.subscribe("ax.alert.control").await.unwrap();
    let node = AxProcess::node(&nats, "n1", "scheduler", &[]);

    let mut json_headers = async_nats::HeaderMap::new();
    json_headers.insert(codec::CONTENT_TYPE, JSON);
    let sends: Vec<(&str, async_nats::HeaderMap, &[u8])> = vec![
        ("ax.control.apply", codec::msgpack_headers(), b"\xc1 not msgpack"),
        ("ax.control.apply", json_headers.clone(), br#"{"jobs": [{"version": "v1"}]}"#),
        (
            "ax.control.apply",
            json_headers.clone(),
            br#"{"jobs": [{"version": "v1", "job": {"name": "x y", "exec": {"type": "shell", "command": "true"}}}]}"#,
        ),
        ("ax.control.launch", json_headers.clone(), b"{}"),
        ("ax.control.trigger", json_headers.clone(), br#"{"name": "nope"}"#),
    ];
    for (subject, headers, payload) in sends {
        client
            .js
            .publish_with_headers(subject, headers, payload.to_vec().into())
            .await
            .unwrap()
            .await
            .unwrap();
        let message = tokio::time::timeout(Duration::from_secs(10), alerts.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no alert for a bad message on {subject}\n{}",
                    node.log_text()
                )
            })
            .unwrap();
        let alert: Alert = codec::decode(&message.payload).unwrap();
        assert_eq!(alert.subject.as_deref(), Some(subject));
    }
    assert!(client.jobs().await.unwrap().is_empty());

    // The Scheduler is still there and applies a good job. JSON is accepted on control subjects.
    let good = br#"{"jobs": [{"version": "v1", "job": {"name": "fine", "exec": {"type": "shell", "command": "true"}}}]}"#;
    client
        .js
        .publish_with_headers("ax.control.apply", json_headers, good.to_vec().into())
        .await
        .unwrap()
        .await
        .unwrap();
    wait_for(
        Duration::from_secs(10),
        "the good job after bad ones",
        || async { client.job(&support::job("fine")).await.unwrap().map(|_| ()) },
    )
    .await;
    assert!(!node.log_text().contains("panicked"), "{}", node.log_text());
}

/// Every malformed command sent as a plain request is answered, refused with a reason that
/// says what is wrong (the field, when one is): none is left without an answer. An `op` that
/// is no operation once made an audit subject no stream takes (`ax.audit.token.`): the
/// command was never recorded, so never answered, and went to the dead letters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_malformed_request_is_answered_with_its_reason() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "scheduler", &[]);
    let bodies: [&[u8]; 11] = [
        b"",
        b"[]",
        b"5",
        b"null",
        b"{",
        b"{}",
        br#"{"op": ""}"#,
        br#"{"op": "a.>"}"#,
        br#"{"name": 5}"#,
        br#"{"instance": ["x"]}"#,
        br#"{"x": 1} {}"#,
    ];
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(codec::CONTENT_TYPE, JSON);
    for command in ax_bus::messages::commands::ALL {
        for body in bodies {
            let subject = format!("ax.request.{command}");
            let shown = String::from_utf8_lossy(body);
            let answer = wait_for_logged(
                Duration::from_secs(30),
                &format!("an answer to {command} {shown}"),
                &[&node],
                || async {
                    match client
                        .nats
                        .request_with_headers(
                            subject.clone(),
                            headers.clone(),
                            body.to_vec().into(),
                        )
                        .await
                    {
                        Ok(answer) => Some(answer),
                        Err(e)
                            if e.kind() == async_nats::client::RequestErrorKind::NoResponders =>
                        {
                            None
                        }
                        Err(e) => panic!("{command} {shown}: no answer: {e}"),
                    }
                },
            )
            .await;
            let reply: ax_bus::messages::ControlReply =
                serde_json::from_slice(&answer.payload).unwrap();
            assert!(!reply.ok, "{command} {shown} was taken: {reply:?}");
            assert!(
                !reply.errors.is_empty() && reply.errors.iter().all(|e| e.len() > 10),
                "{command} {shown}: {reply:?}"
            );
        }
    }
    // A field's problem names the field.
    let answer = client
        .nats
        .request_with_headers(
            "ax.request.delete",
            headers.clone(),
            br#"{"name": 5}"#.to_vec().into(),
        )
        .await
        .unwrap();
    let reply: ax_bus::messages::ControlReply = serde_json::from_slice(&answer.payload).unwrap();
    assert!(
        reply.errors[0].contains("`name`: invalid type: integer `5`"),
        "{reply:?}"
    );
    assert!(client.dead_letters().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_work_becomes_a_dead_letter_and_nothing_crashes() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "scheduler,dag,router,worker", &[]);
    wait_for(
        Duration::from_secs(15),
        "the worker to register",
        || async { (client.workers().await.unwrap().len() == 1).then_some(()) },
    )
    .await;
    let garbage: &[(&str, &[u8])] = &[
        ("ax.internal.dispatch.n1.normal", b"\xc1 not a dispatch"),
        ("ax.internal.ready.high", b"\x92\x01"),
    ];
    for (subject, payload) in garbage {
        client
            .js
            .publish_with_headers(*subject, codec::msgpack_headers(), payload.to_vec().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    wait_for_logged(
        Duration::from_secs(15),
        "two dead letters",
        &[&node],
        || async {
            let mut dead = client.js.get_stream("AX_DEAD").await.ok()?;
            (dead.info().await.ok()?.state.messages == 2).then_some(())
        },
    )
    .await;
    let dead = client.js.get_stream("AX_DEAD").await.unwrap();
    let mut kept = Vec::new();
    for sequence in 1..=2 {
        let letter = dead.get_raw_message(sequence).await.unwrap();
        assert_eq!(letter.subject.as_str(), "ax.internal.dead.undecodable");
        let header = |name: &str| {
            letter
                .headers
                .get(name)
                .map(|v| v.to_string())
                .unwrap_or_default()
        };
        assert!(
            header(ax_bus::dead_letter::REASON).contains("malformed msgpack"),
            "{}",
            header(ax_bus::dead_letter::REASON)
        );
        assert_eq!(header(ax_bus::dead_letter::NODE), "n1");
        kept.push((
            header(ax_bus::dead_letter::SUBJECT),
            letter.payload.to_vec(),
        ));
    }
    kept.sort();
    let mut sent: Vec<_> = garbage
        .iter()
        .map(|(s, p)| (s.to_string(), p.to_vec()))
        .collect();
    sent.sort();
    assert_eq!(kept, sent, "each dead letter keeps its subject and payload");

    // Listed, and refused for replay: it would die the same way.
    let out = ax(&nats.url(), &["dlq", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let listed: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let kinds: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["undecodable", "undecodable"]);
    let out = ax(&nats.url(), &["dlq", "replay", "1"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("dead letter 1: undecodable"),
        "{}",
        stderr(&out)
    );
    let out = ax(&nats.url(), &["dlq", "replay", "99"]);
    assert!(
        stderr(&out).contains("dead letter 99: no such dead letter"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        client.dead_letters().await.unwrap().len(),
        2,
        "a refused replay keeps the letter"
    );

    // Router and worker are unharmed: a real job still runs.
    apply_job(
        &nats,
        "after",
        "version: v1\njob:\n  name: after\n  exec: { type: shell, command: 'true' }\n",
    )
    .await;
    let id = trigger(&nats, &["after"]);
    let record = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(record.state, ax_bus::State::Success, "{}", record.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_than_three_retries_is_a_warning_and_the_job_is_applied() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "scheduler", &[]);
    let file = job_file(
        &nats.path("jobs"),
        "stubborn.yaml",
        &GOOD.replace(
            "    command: echo ok\n",
            "    command: echo ok\n  retry: { times: 5, interval: 30, max_interval: 600, jitter: 0.2 }\n",
        ),
    );
    let out = ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with(&format!(
            "warning: {}:9: job.retry.times: 5 retries",
            file.display()
        )),
        "{}",
        stderr(&out)
    );
    let jobs = client.jobs().await.unwrap();
    let retry = jobs[0].spec.retry.clone().unwrap();
    assert_eq!(
        (retry.times, retry.max_interval, retry.jitter),
        (5, Some(600), 0.2)
    );
}

#[test]
fn a_worker_with_a_bad_executor_config_refuses_to_start_saying_why() {
    let nats = TestNats::start();
    let dir = nats.path("bad-node");
    for (config, expected) in [
        (
            "[worker]\nplugin_dir = \"/nonexistent/plugins\"\n",
            "cannot read the plugin directory /nonexistent/plugins",
        ),
        (
            "[databases]\nlegacy = \"oracle://db.example.com/x\"\n",
            "database `legacy`: the URL must start with postgres://",
        ),
        (
            "[scheduler]\nmax_delay_days = 0\n",
            "[scheduler] max_delay_days = 0: must be from 1 to 3660",
        ),
        (
            "[metrics]\nlisten = \"127.0.0.1:not-a-port\"\n",
            "--http (or [metrics] listen): cannot listen on 127.0.0.1:not-a-port",
        ),
    ] {
        let file = dir.join("node.toml");
        std::fs::write(&file, config).unwrap();
        let out = ax(
            &nats.url(),
            &[
                "node",
                "--roles",
                "worker",
                "--id",
                "bad",
                "--config",
                file.to_str().unwrap(),
                "--data-dir",
                dir.join("data").to_str().unwrap(),
            ],
        );
        assert!(!out.status.success());
        assert!(stderr(&out).contains(expected), "{}", stderr(&out));
    }
}

#[test]
fn ids_on_the_command_line_are_checked_before_any_nats_call() {
    // Nothing listens there: an answer about the id proves nothing was sent.
    let nowhere = "nats://127.0.0.1:1";
    let long = "a".repeat(10_000);
    for (args, reason) in [
        (
            vec!["instance", "get", long.as_str()],
            "not a valid instance id",
        ),
        (vec!["instance", "logs", "x>"], "not a valid instance id"),
        (vec!["job", "get", "a b*"], "not a valid job name"),
        (vec!["job", "trigger", "UPPER"], "not a valid job name"),
        (
            vec!["rerun", "--instance", "a*b"],
            "not a valid instance id",
        ),
        (
            vec![
                "backfill",
                "x y",
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
            ],
            "not a valid job name",
        ),
    ] {
        let started = std::time::Instant::now();
        let out = ax(nowhere, &args);
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(reason), "{args:?}: {err}");
        assert!(!err.contains("NATS"), "{args:?} reached for NATS: {err}");
        assert!(started.elapsed() < Duration::from_secs(5), "{args:?}");
    }
}
