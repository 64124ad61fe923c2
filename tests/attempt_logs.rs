//! Attempt logs (`ax.log.<instance>.<attempt>`): shipped while the command runs, followed live
//! with `ax instance logs --follow`, complete for a long output, capped with head and tail, kept
//! through a kill and a NATS restart, one per attempt.

use crate::support;

use std::time::{Duration, Instant};

use ax_bus::ids::InstanceId;
use ax_bus::log::{AttemptLog, LogStream};
use ax_bus::AxClient;
use support::*;

/// Waits until attempt `attempt` of `id` has shipped a log that satisfies `done`.
async fn wait_log(
    client: &AxClient,
    id: &str,
    attempt: u32,
    what: &str,
    done: impl Fn(&AttemptLog) -> bool,
) -> AttemptLog {
    let id: InstanceId = id.parse().unwrap();
    wait_for(Duration::from_secs(60), what, || {
        let (client, id) = (client.clone(), id.clone());
        let done = &done;
        async move {
            let log = client.attempt_log(&id, attempt).await.ok()?;
            done(&log).then_some(log)
        }
    })
    .await
}

fn text(log: &AttemptLog, stream: LogStream) -> String {
    String::from_utf8_lossy(&log.bytes_of(stream)).into_owned()
}

/// The lines of a job that prints one a second are printed by `ax instance logs --follow` as
/// they are written — the first while the instance still runs — and the follow ends with the
/// attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_attempts_lines_are_followed_as_they_are_written() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let command = "for i in 1 2 3 4 5 6; do echo line $i; echo warn $i >&2; sleep 1; done";
    apply_job(&nats, "ticker", &shell_job("ticker", "", command)).await;
    let id = trigger(&nats, &["ticker"]);
    let dir = nats.path("follow");
    let mut follow = AxProcess::spawn(
        Some(&nats.url()),
        &["instance", "logs", &id, "--follow"],
        &dir,
        &dir.join("follow.log"),
    );
    let lines = follow.stdout_lines();
    let first = lines
        .recv_timeout(Duration::from_secs(60))
        .expect("a first line");
    assert!(first == "line 1" || first == "warn 1", "{first}");
    let (record, _) = client
        .instance(&id.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(
        !record.state.is_final(),
        "the first line came only after the end: {record:?}"
    );
    let mut seen = vec![first];
    let started = Instant::now();
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(30)) {
        seen.push(line);
    }
    assert!(started.elapsed() >= Duration::from_secs(3), "not live");
    let stdout: Vec<&String> = seen.iter().filter(|l| l.starts_with("line")).collect();
    let stderr: Vec<&String> = seen.iter().filter(|l| l.starts_with("warn")).collect();
    let want = |word: &str| (1..=6).map(|i| format!("{word} {i}")).collect::<Vec<_>>();
    assert_eq!(stdout, want("line").iter().collect::<Vec<_>>());
    assert_eq!(stderr, want("warn").iter().collect::<Vec<_>>());
    let status = follow.child.wait().unwrap();
    assert!(status.success(), "{}", follow.log_text());

    // Read afterwards: the same lines, the end said, the record's tails still there.
    let out = ax(&nats.url(), &["instance", "logs", &id, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["complete"], true, "{json}");
    assert_eq!(json["stdout"], want("line").join("\n") + "\n");
    assert_eq!(json["stderr"], want("warn").join("\n") + "\n");
}

/// A 200,000-line output is shipped whole; past a node's cap, the head and the last bytes are
/// kept with a note of what was left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_log_is_complete_and_one_past_the_cap_keeps_its_head_and_tail() {
    let nats = TestNats::start();
    let client = nats.client().await;
    // One worker capped at 64 KiB, one with the default cap; the jobs' tags pick them.
    let _capped = AxProcess::configured(
        &nats,
        "n1",
        "all",
        "[worker]\nlog_max_bytes = 65536\ntags = [\"capped\"]\n",
    );
    let _wide = AxProcess::configured(&nats, "n2", "worker", "[worker]\ntags = [\"wide\"]\n");
    let job =
        |name: &str, tag: &str| shell_job(name, &format!("  tags: [{tag}]\n"), "seq 1 200000");
    apply_job(&nats, "many", &job("many", "wide")).await;
    apply_job(&nats, "capped", &job("capped", "capped")).await;
    let many = trigger(&nats, &["many"]);
    let capped = trigger(&nats, &["capped"]);
    let log = wait_log(&client, &many, 1, "the whole log", |l| l.end().is_some()).await;
    let want: String = (1..=200_000).map(|i| format!("{i}\n")).collect();
    assert_eq!(text(&log, LogStream::Stdout), want);
    assert_eq!(log.end().unwrap().left_out, 0);

    let record = final_record(&client, &capped, Duration::from_secs(60)).await;
    let log = wait_log(&client, &capped, 1, "the capped log", |l| l.end().is_some()).await;
    let end = log.end().unwrap();
    assert_eq!(end.bytes, want.len() as u64);
    let stdout = text(&log, LogStream::Stdout);
    assert_eq!(stdout.len() as u64, 65536, "{record:?}");
    assert!(want.starts_with(&stdout[..49152]));
    assert!(want.ends_with(&stdout[49152..]));
    assert_eq!(end.left_out, want.len() as u64 - 65536);
    let note = text(&log, LogStream::Note);
    assert!(note.contains("bytes left out"), "{note}");
}

/// What an attempt wrote before it was killed stays, and a re-run's attempt has a log of its
/// own beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_attempts_log_is_kept_and_each_attempt_has_its_own() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let command = "echo attempt $AX_ATTEMPT; echo still going >&2; sleep 120";
    apply_job(&nats, "stuck", &shell_job("stuck", "", command)).await;
    let id = trigger(&nats, &["stuck"]);
    wait_log(&client, &id, 1, "the first lines", |l| {
        text(l, LogStream::Stderr).contains("still going")
    })
    .await;
    let killed = ax(&nats.url(), &["instance", "kill", &id]);
    assert!(killed.status.success(), "{}", stderr(&killed));
    final_record(&client, &id, Duration::from_secs(60)).await;
    let log = wait_log(&client, &id, 1, "the end of the killed attempt", |l| {
        l.end().is_some()
    })
    .await;
    assert_eq!(text(&log, LogStream::Stdout), "attempt 1\n");
    assert_eq!(text(&log, LogStream::Stderr), "still going\n");

    let rerun = ax(&nats.url(), &["rerun", "--instance", &id]);
    assert!(rerun.status.success(), "{}", stderr(&rerun));
    wait_log(&client, &id, 2, "the re-run's lines", |l| {
        text(l, LogStream::Stdout) == "attempt 2\n"
    })
    .await;
    let first = ax(&nats.url(), &["instance", "logs", &id, "--attempt", "1"]);
    assert_eq!(
        stdout(&first),
        "attempt 1\nstill going\n",
        "{}",
        stderr(&first)
    );
    let none = ax(&nats.url(), &["instance", "logs", &id, "--attempt", "3"]);
    assert!(!none.status.success());
    assert!(
        stderr(&none).contains("there is no attempt 3"),
        "{}",
        stderr(&none)
    );
    let killed = ax(&nats.url(), &["instance", "kill", &id]);
    assert!(killed.status.success(), "{}", stderr(&killed));
}

/// NATS restarted while a command writes: the lines written while it was away are kept on the
/// worker and shipped when it is back; nothing is lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_written_while_nats_is_away_are_shipped_when_it_returns() {
    let mut nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    let command = "for i in $(seq 1 20); do echo line $i; sleep 0.5; done";
    // A lease longer than the outage can last on a loaded machine: without one the worker
    // fences itself after 5 s out of contact, and the attempt's log ends where it stopped.
    apply_job(
        &nats,
        "steady",
        &shell_job("steady", "  lease: 60s\n", command),
    )
    .await;
    let id = trigger(&nats, &["steady"]);
    wait_log(&client, &id, 1, "a few lines", |l| {
        text(l, LogStream::Stdout).contains("line 3\n")
    })
    .await;
    nats.outage(Duration::from_secs(3)).await;
    let client = nats.client().await;
    let record = final_record(&client, &id, Duration::from_secs(90)).await;
    assert_eq!(
        (record.state, record.attempt),
        (ax_bus::State::Success, 1),
        "{}",
        node.log_text()
    );
    let log = wait_log(&client, &id, 1, "the whole log", |l| l.end().is_some()).await;
    let want: String = (1..=20).map(|i| format!("line {i}\n")).collect();
    assert_eq!(text(&log, LogStream::Stdout), want, "{}", node.log_text());
}

/// A log NATS will not take (its stream gone) neither holds the attempt up nor is lost: the
/// chunks are kept and sent again every second, and arrive once the stream is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_nats_refuses_holds_nothing_up_and_arrives_once_it_is_taken() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(
        &nats,
        "refused",
        &shell_job("refused", "", "for i in 1 2 3; do echo line $i; done"),
    )
    .await;
    client.js.delete_stream("AX_LOGS").await.unwrap();
    let id = trigger(&nats, &["refused"]);
    let record = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(record.state, ax_bus::State::Success, "{}", node.log_text());
    let ran = record.finished_at.unwrap() - record.started_at.unwrap();
    assert!(ran < chrono::Duration::seconds(5), "held up: ran {ran}");
    wait_for_logged(
        Duration::from_secs(30),
        "the refused chunk",
        &[&node],
        || async {
            node.log_text()
                .contains("log chunk not shipped")
                .then_some(())
        },
    )
    .await;
    // Another node starting sets the stream up again; the kept chunks arrive, once each.
    let _again = AxProcess::node(&nats, "n2", "worker", &[]);
    let log = wait_log(&client, &id, 1, "the kept log", |l| l.end().is_some()).await;
    assert_eq!(text(&log, LogStream::Stdout), "line 1\nline 2\nline 3\n");
    assert_eq!(
        log.chunks.len(),
        log.chunks.iter().map(|c| c.seq).max().unwrap() as usize
    );
}

/// Each attempt's record is its own: while a retry runs, nothing of the failed attempt before
/// it is shown as its; killed, it shows what it wrote itself (from its drained output), not
/// the attempt before; the history and the results tell each attempt apart, and the retry's
/// claim names the revision its `executing` write was really made from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_retry_shows_its_own_attempt_not_the_one_before() {
    use futures::StreamExt;
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let command = "if [ \"$AX_ATTEMPT\" = 1 ]; then echo attempt 1 says hi; echo a1 fails >&2; \
                   exit 3; fi; echo attempt 2 says hi; sleep 120";
    apply_job(
        &nats,
        "twice",
        &shell_job("twice", "  retry: { times: 1, interval: 1 }\n", command),
    )
    .await;
    let mut results = client.nats.subscribe("ax.result.twice").await.unwrap();
    let id = trigger(&nats, &["twice"]);
    let instance: InstanceId = id.parse().unwrap();
    wait_log(&client, &id, 2, "attempt 2's line", |l| {
        text(l, LogStream::Stdout) == "attempt 2 says hi\n"
    })
    .await;
    let get = ax(&nats.url(), &["instance", "get", &id, "--json"]);
    let running: serde_json::Value = serde_json::from_slice(&get.stdout).unwrap();
    assert_eq!(running["attempt"], 2, "{running}");
    for (field, empty) in [
        ("exit_code", serde_json::Value::Null),
        ("stdout_tail", "".into()),
        ("stderr_tail", "".into()),
    ] {
        assert_eq!(
            running[field], empty,
            "attempt 1's {field} shown as 2's: {running}"
        );
    }

    let killed = ax(&nats.url(), &["instance", "kill", &id, "--reason", "test"]);
    assert!(killed.status.success(), "{}", stderr(&killed));
    // The kill ends it at once; the worker then adds what the attempt wrote as it stopped.
    let record = wait_for(
        Duration::from_secs(60),
        "the killed attempt's own tails",
        || {
            let (client, instance) = (client.clone(), instance.clone());
            async move {
                let (record, _) = client.instance(&instance).await.ok()??;
                (record.stdout_tail == "attempt 2 says hi\n").then_some(record)
            }
        },
    )
    .await;
    assert_eq!(
        (record.attempt, record.state, record.tag),
        (2, ax_bus::State::Failed, ax_bus::Tag::Killed)
    );
    assert_eq!(record.exit_code, None, "killed by a signal: {record:?}");
    assert_eq!(record.stderr_tail, "", "{record:?}");
    assert!(record.message.contains(": test"), "{}", record.message);

    // One result per attempt, each with its own outcome.
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let message = tokio::time::timeout(Duration::from_secs(30), results.next())
            .await
            .expect("a result per attempt")
            .unwrap();
        let result: ax_bus::messages::ResultMessage =
            ax_bus::codec::decode(&message.payload).unwrap();
        seen.push((
            result.attempt,
            result.tag,
            result.exit_code,
            result.stderr_tail,
        ));
    }
    seen.sort_by_key(|s| s.0);
    assert_eq!(
        seen,
        [
            (1, ax_bus::Tag::ExitCode, Some(3), "a1 fails\n".to_string()),
            (2, ax_bus::Tag::Killed, None, String::new()),
        ]
    );

    // The history: attempt 1 failed with its exit code, attempt 2 killed without it; each
    // claim names a real revision.
    let history = ax(&nats.url(), &["instance", "history", &id]);
    let text = stdout(&history);
    let second = text.find("attempt 2").expect("attempt 2 in the history");
    assert!(text[..second].contains("exit code 3"), "{text}");
    assert!(!text[second..].contains("exit code 3"), "{text}");
    assert!(!text.contains("fence 0"), "{text}");
    // `ax instance get` lists each attempt with its own outcome.
    let get = stdout(&ax(&nats.url(), &["instance", "get", &id]));
    let row = |n: &str| {
        get.lines()
            .find(|l| l.split_whitespace().next() == Some(n))
            .unwrap_or_else(|| panic!("no attempt {n}: {get}"))
            .to_string()
    };
    assert!(
        row("1").contains("waiting_retry exit_code") && row("1").contains(" 3 "),
        "{get}"
    );
    assert!(
        row("2").contains("failed killed") && !row("2").contains(" 3 "),
        "{get}"
    );
}

/// `--follow` follows the instance, not one attempt: a failed attempt's lines, a word that the
/// retry starts and when, the retry's lines; it exits 0 only if the instance succeeded, and
/// otherwise says how it ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_goes_on_across_a_retry_and_exits_by_the_instances_end() {
    let nats = TestNats::start();
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let retry = "  retry: { times: 1, interval: 2 }\n";
    let second_wins = "echo try $AX_ATTEMPT; [ \"$AX_ATTEMPT\" = 2 ]";
    apply_job(&nats, "flaky", &shell_job("flaky", retry, second_wins)).await;
    apply_job(
        &nats,
        "broken",
        &shell_job("broken", retry, "echo try $AX_ATTEMPT; exit 4"),
    )
    .await;
    for (job, succeeds) in [("flaky", true), ("broken", false)] {
        let id = trigger(&nats, &[job]);
        let out = ax(&nats.url(), &["instance", "logs", &id, "--follow"]);
        assert_eq!(stdout(&out), "try 1\ntry 2\n", "{job}: {}", stderr(&out));
        let said = stderr(&out);
        assert!(
            said.contains("(attempt 1 failed: exit_code") && said.contains("attempt 2 starts at"),
            "{job}: {said}"
        );
        assert_eq!(out.status.success(), succeeds, "{job}: {said}");
        if !succeeds {
            assert!(
                said.contains(&format!(
                    "instance {id} ended failed (exit_code) after attempt 2"
                )),
                "{said}"
            );
        }
    }
}

/// A job's escape sequences (an OSC 52 clipboard write, a window title, a clear screen) reach
/// the operator's terminal written visibly, not as they are — unless `--raw` asks for them, or
/// the output is no terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escapes_in_a_log_are_neutralised_on_a_terminal() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let hostile = r#"printf "\033]52;c;ZXZpbA==\007\033]0;owned\007\033[2Jvisible\n""#;
    apply_job(&nats, "hostile", &shell_job("hostile", "", hostile)).await;
    let id = trigger(&nats, &["hostile"]);
    final_record(&client, &id, Duration::from_secs(30)).await;
    wait_log(&client, &id, 1, "the whole log", |l| l.end().is_some()).await;
    // On a pseudo-terminal (script(1) gives the command one).
    let on_terminal = |extra: &str| {
        let command = format!("{} instance logs {id} {extra}", ax_binary());
        let out = std::process::Command::new("script")
            .args(["-qec", &command, "/dev/null"])
            .env("AX_NATS_URL", nats.url())
            .env_remove("RUST_LOG")
            .output()
            .expect("script(1)");
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let shown = on_terminal("");
    assert!(
        !shown.contains('\x1b') && !shown.contains('\x07'),
        "{shown:?}"
    );
    assert!(
        shown.contains(r"\x1b]52;c;ZXZpbA==\x07\x1b]0;owned\x07\x1b[2Jvisible"),
        "{shown:?}"
    );
    assert!(on_terminal("--raw").contains("\x1b]52;c;ZXZpbA==\x07"));
    // Into a pipe, as written.
    let piped = ax(&nats.url(), &["instance", "logs", &id]);
    assert_eq!(
        stdout(&piped),
        "\x1b]52;c;ZXZpbA==\x07\x1b]0;owned\x07\x1b[2Jvisible\n"
    );
}
