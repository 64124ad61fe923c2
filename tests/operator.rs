//! An operator's hand on one instance: cancel a waiting one (and so its waiting downstream),
//! kill an executing one (its whole process group), each refused with the reason where it does
//! not apply, and each in the audit stream.

use crate::support;

use std::time::Duration;

use ax_bus::{State, Tag};
use futures::StreamExt;
use support::*;

const JOBS: &str = "version: v1
job:
  name: later
  exec: { type: noop }
---
version: v1
job:
  name: never
  exec: { type: noop }
---
version: v1
job:
  name: upstream
  deps: [ { name: never, biz_date: current } ]
  exec: { type: noop }
---
version: v1
job:
  name: downstream
  deps: [ { name: upstream, biz_date: current } ]
  exec: { type: noop }
---
version: v1
job:
  name: doomed
  exec: { type: shell, command: 'exit 4' }
---
version: v1
job:
  name: hang
  retry: { times: 2, interval: 1 }
  exec: { type: shell, command: 'echo $$ > \"$AX_PARAM_dir/sh\"; sleep 600 & echo $! > \"$AX_PARAM_dir/sleep\"; wait' }
";

async fn record(client: &ax_bus::AxClient, id: &str) -> ax_bus::InstanceRecord {
    client
        .instance(&id.parse().unwrap())
        .await
        .unwrap()
        .unwrap()
        .0
}

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_kill_end_what_they_apply_to_and_refuse_the_rest() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(&nats, "ops", JOBS).await;
    let mut audit = client.nats.subscribe("ax.audit.>").await.unwrap();

    // A delayed instance, cancelled before it is due: it never runs.
    let scheduled = trigger(&nats, &["later", "--in", "2s"]);
    let out = ax(
        &nats.url(),
        &["instance", "cancel", &scheduled, "--reason", "not needed"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("cancelled by"), "{}", stdout(&out));
    let cancelled = record(&client, &scheduled).await;
    assert_eq!(
        (cancelled.state, cancelled.tag),
        (State::Cancelled, Tag::Operator)
    );
    assert!(
        cancelled.message.ends_with(": not needed"),
        "{}",
        cancelled.message
    );

    // A waiting upstream, cancelled: its waiting downstream of the same date goes with it.
    let up = trigger(&nats, &["upstream", "--biz-date", "2026-11-01"]);
    let down = trigger(&nats, &["downstream", "--biz-date", "2026-11-01"]);
    for id in [&up, &down] {
        wait_for_logged(
            Duration::from_secs(30),
            "waiting for deps",
            &[&node],
            || async {
                let r = record(&client, id).await;
                (r.tag == Tag::WaitingDeps).then_some(())
            },
        )
        .await;
    }
    let out = ax(&nats.url(), &["instance", "cancel", &up]);
    assert!(out.status.success(), "{}", stderr(&out));
    let down = final_record(&client, &down, Duration::from_secs(30)).await;
    assert_eq!(
        (down.state, down.tag),
        (State::Cancelled, Tag::UpstreamFailed)
    );

    // An executing shell: cancel is refused (kill it instead); kill stops the whole group
    // and the instance fails for good, its retries left unused.
    let dir = nats.path("hang");
    let hang = trigger(
        &nats,
        &["hang", "--param", &format!("dir={}", dir.display())],
    );
    let pids = wait_for_logged(
        Duration::from_secs(30),
        "the shell to start",
        &[&node],
        || async {
            let read = |name: &str| {
                std::fs::read_to_string(dir.join(name))
                    .ok()?
                    .trim()
                    .parse::<i32>()
                    .ok()
            };
            let r = record(&client, &hang).await;
            (r.tag == Tag::Executing).then_some(())?;
            Some((read("sh")?, read("sleep")?))
        },
    )
    .await;
    let out = ax(&nats.url(), &["instance", "cancel", &hang]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("kill it instead"), "{}", stderr(&out));
    let out = ax(
        &nats.url(),
        &["instance", "kill", &hang, "--reason", "hung"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let killed = final_record(&client, &hang, Duration::from_secs(10)).await;
    assert_eq!(
        (killed.state, killed.tag, killed.attempt),
        (State::Failed, Tag::Killed, 1)
    );
    wait_for(
        Duration::from_secs(15),
        "no process of the attempt left",
        || async { (!alive(pids.0) && !alive(pids.1)).then_some(()) },
    )
    .await;
    // Still failed, not retried, once its worker has reported.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = record(&client, &hang).await;
    assert_eq!(
        (after.state, after.attempt),
        (State::Failed, 1),
        "{after:?}"
    );

    // Refusals, one line each, nothing changed.
    for (args, reason) in [
        (
            vec!["instance", "kill", hang.as_str()],
            "has ended (failed)",
        ),
        (
            vec!["instance", "cancel", scheduled.as_str()],
            "has ended (cancelled)",
        ),
        (
            vec!["instance", "cancel", "later.20200101T000000000Z"],
            "no instance",
        ),
    ] {
        let out = ax(&nats.url(), &args);
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr(&out).contains(reason), "{args:?}: {}", stderr(&out));
    }

    // Each action in the audit stream, with who and why.
    let mut actions = Vec::new();
    while actions.len() < 3 {
        let message = tokio::time::timeout(Duration::from_secs(10), audit.next())
            .await
            .expect("an audit record")
            .unwrap();
        let entry: ax_bus::auth::audit::AuditRecord =
            ax_bus::codec::decode(&message.payload).unwrap();
        if !matches!(entry.action.as_str(), "cancel" | "kill")
            || entry.outcome != ax_bus::auth::audit::Outcome::Done
        {
            continue;
        }
        assert!(entry.actor.contains('@'), "{entry:?}");
        actions.push((
            entry.action,
            entry.request["instance"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            entry.request["reason"].as_str().map(str::to_string),
        ));
    }
    assert_eq!(
        actions,
        [
            (
                "cancel".to_string(),
                scheduled.clone(),
                Some("not needed".to_string())
            ),
            ("cancel".to_string(), up.clone(), None),
            ("kill".to_string(), hang.clone(), Some("hung".to_string())),
        ]
    );
    // The delayed one stayed cancelled past its due time.
    let still = record(&client, &scheduled).await;
    assert_eq!(still.state, State::Cancelled);
    assert!(!node.log_text().contains("panicked"), "{}", node.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_success_releases_the_downstream_and_a_verdict_needs_a_reason() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(&nats, "ops", JOBS).await;
    let mut audit = client.nats.subscribe("ax.audit.mark").await.unwrap();

    // The upstream waits for a job that will never run; the operator vouches for it.
    let up = trigger(&nats, &["upstream", "--biz-date", "2026-11-02"]);
    let down = trigger(&nats, &["downstream", "--biz-date", "2026-11-02"]);
    for id in [&up, &down] {
        wait_for_logged(
            Duration::from_secs(30),
            "waiting for deps",
            &[&node],
            || async {
                let r = record(&client, id).await;
                (r.tag == Tag::WaitingDeps).then_some(())
            },
        )
        .await;
    }
    let out = ax(
        &nats.url(),
        &[
            "instance",
            "mark",
            &up,
            "--success",
            "--reason",
            "loaded by hand",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let marked = record(&client, &up).await;
    assert_eq!((marked.state, marked.tag), (State::Success, Tag::Marked));
    assert!(
        marked.message.ends_with(": loaded by hand"),
        "{}",
        marked.message
    );
    let down = final_record(&client, &down, Duration::from_secs(30)).await;
    assert_eq!(
        (down.state, down.tag),
        (State::Success, Tag::Completed),
        "{down:?}"
    );

    // A failed one marked success, then failed again; the same verdict twice is refused.
    let doomed = trigger(&nats, &["doomed"]);
    let failed = final_record(&client, &doomed, Duration::from_secs(30)).await;
    assert_eq!(failed.state, State::Failed);
    let out = ax(
        &nats.url(),
        &["instance", "mark", &doomed, "--success", "--reason", "ok"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(record(&client, &doomed).await.state, State::Success);
    let out = ax(
        &nats.url(),
        &["instance", "mark", &doomed, "--success", "--reason", "ok"],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("is success already"),
        "{}",
        stderr(&out)
    );

    // Without a reason, or without a verdict: refused before anything is sent.
    for args in [
        vec!["instance", "mark", doomed.as_str(), "--success"],
        vec!["instance", "mark", doomed.as_str(), "--reason", "x"],
        vec![
            "instance",
            "mark",
            doomed.as_str(),
            "--success",
            "--failed",
            "--reason",
            "x",
        ],
    ] {
        let out = ax(&nats.url(), &args);
        assert!(!out.status.success(), "{args:?}");
    }
    let entry = loop {
        let entry = tokio::time::timeout(Duration::from_secs(10), audit.next())
            .await
            .expect("an audit record")
            .unwrap();
        let entry: ax_bus::auth::audit::AuditRecord =
            ax_bus::codec::decode(&entry.payload).unwrap();
        if entry.outcome == ax_bus::auth::audit::Outcome::Done {
            break entry;
        }
    };
    assert_eq!(
        (
            entry.action.as_str(),
            entry.detail["before"].as_str(),
            entry.detail["after"].as_str()
        ),
        ("mark", Some("running waiting_deps"), Some("success marked"))
    );
}

/// A listing cut short (`ax instance list | head`) ends quietly, as Unix tools do: no panic on
/// the broken pipe, no error printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_cut_short_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let nats = TestNats::start();
    let _client = nats.client().await;
    let mut child = std::process::Command::new(ax_binary())
        .args(["--nats", &nats.url(), "status"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The reader is gone before anything is written.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(nix::libc::SIGPIPE),
        "{:?}",
        out.status
    );
}

/// `ax instance list` shows the newest first, at most `--limit` (100 by default) with a note
/// of how many more match, every one with `--all`; a state it does not know is refused before
/// any NATS call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_listing_is_newest_first_and_limited() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(
        &nats,
        "listed",
        "version: v1\njob: { name: listed, exec: { type: noop } }\n",
    )
    .await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let id = trigger(&nats, &["listed"]);
        final_record(&client, &id, Duration::from_secs(30)).await;
        ids.push(id);
    }
    let first_column = |out: &std::process::Output| -> Vec<String> {
        stdout(out)
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect()
    };
    let ids_in_order = ids.clone();
    let newest: Vec<String> = ids.iter().rev().cloned().collect();
    let limited = ax(
        &nats.url(),
        &["instance", "list", "--job", "listed", "--limit", "2"],
    );
    assert!(limited.status.success(), "{}", stderr(&limited));
    assert_eq!(first_column(&limited), newest[..2]);
    assert!(
        stderr(&limited).contains("the newest 2 of 3 instances; --limit N or --all for more"),
        "{}",
        stderr(&limited)
    );
    let all = ax(
        &nats.url(),
        &["instance", "list", "--job", "listed", "--all"],
    );
    assert_eq!(first_column(&all), newest);
    assert!(stderr(&all).is_empty(), "{}", stderr(&all));
    let json = ax(
        &nats.url(),
        &[
            "instance", "list", "--job", "listed", "--limit", "1", "--json",
        ],
    );
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["instance_id"], newest[0].as_str());
    let ids = ax(
        &nats.url(),
        &[
            "instance", "list", "--job", "listed", "--limit", "1", "--ids",
        ],
    );
    assert_eq!(stdout(&ids).trim(), newest[0]);
    // A part of the name, or a glob, as the console's search box; a window by expected time.
    for pattern in ["ist", "l?sted", "*ed"] {
        let found = ax(
            &nats.url(),
            &["instance", "list", "--job", pattern, "--all", "--ids"],
        );
        assert_eq!(
            stdout(&found).lines().count(),
            3,
            "{pattern}: {}",
            stderr(&found)
        );
    }
    let none = ax(&nats.url(), &["instance", "list", "--job", "l?st", "--ids"]);
    assert!(stdout(&none).is_empty(), "{}", stdout(&none));
    let (middle, _) = client
        .instance(&id(&ids_in_order[1]))
        .await
        .unwrap()
        .unwrap();
    let since = ax_bus::time::rfc3339(middle.expected_time);
    let window = ax(
        &nats.url(),
        &[
            "instance", "list", "--job", "listed", "--since", &since, "--ids",
        ],
    );
    assert_eq!(
        stdout(&window).lines().collect::<Vec<_>>(),
        newest[..2],
        "{}",
        stderr(&window)
    );
    let until = ax(
        &nats.url(),
        &[
            "instance", "list", "--job", "listed", "--until", &since, "--ids",
        ],
    );
    assert_eq!(stdout(&until).lines().collect::<Vec<_>>(), newest[1..]);
    let recent = ax(&nats.url(), &["instance", "list", "--since", "1h", "--ids"]);
    assert_eq!(stdout(&recent).lines().count(), 3);
    let bad = ax(
        "nats://127.0.0.1:1",
        &["instance", "list", "--state", "nope"],
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("unknown state `nope`"),
        "{}",
        stderr(&bad)
    );
}

/// One CLI user on one machine is one actor in the audit, whatever the command — an apply, a
/// trigger, a pause, a kill, a cancel, a mark, a re-run, a backfill — also without `USER` or
/// `LOGNAME` in its environment (the name of its user id then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_cli_user_is_one_actor_for_every_command() {
    let nats = TestNats::start();
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let run = |args: &[&str]| {
        let out = std::process::Command::new(ax_binary())
            .args(args)
            .env("AX_NATS_URL", nats.url())
            .env_remove("RUST_LOG")
            .env_remove("USER")
            .env_remove("LOGNAME")
            .output()
            .expect("run ax");
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        stdout(&out)
    };
    set_up(&nats.url()).await;
    let file = job_file(
        &nats.path("jobs"),
        "who.yaml",
        "version: v1\njob:\n  name: who\n  exec: { type: shell, command: 'sleep 60' }\n",
    );
    run(&["job", "apply", "-f", file.to_str().unwrap()]);
    let running = run(&["job", "trigger", "who", "--json"]);
    let running: serde_json::Value = serde_json::from_str(&running).unwrap();
    let running = running["instance_id"].as_str().unwrap().to_string();
    run(&["job", "pause", "who"]);
    run(&["job", "resume", "who"]);
    let client = nats.client().await;
    wait_for(Duration::from_secs(30), "the attempt to start", || async {
        let (record, _) = client.instance(&id(&running)).await.ok()??;
        record.executing().then_some(())
    })
    .await;
    run(&["instance", "kill", &running, "--reason", "test"]);
    let later = run(&["job", "trigger", "who", "--in", "1h", "--json"]);
    let later: serde_json::Value = serde_json::from_str(&later).unwrap();
    let later = later["instance_id"].as_str().unwrap().to_string();
    run(&["instance", "cancel", &later]);
    run(&[
        "instance",
        "mark",
        &running,
        "--success",
        "--reason",
        "done by hand",
    ]);
    run(&["rerun", "--instance", &running, "--dry-run"]);
    run(&[
        "backfill",
        "who",
        "--from",
        "2026-11-01",
        "--to",
        "2026-11-01",
    ]);

    let user = nix::unistd::User::from_uid(nix::unistd::getuid())
        .unwrap()
        .map(|u| u.name)
        .unwrap();
    let host = nix::unistd::gethostname().unwrap();
    let me = format!("{user}@{}", host.to_string_lossy());
    let wanted = [
        "apply", "trigger", "pause", "resume", "kill", "cancel", "mark", "rerun", "backfill",
    ];
    let entries = wait_for(Duration::from_secs(30), "every command audited", || async {
        let out = ax(&nats.url(), &["audit", "list", "--json"]);
        let entries: Vec<ax_bus::auth::audit::AuditRecord> =
            serde_json::from_slice(&out.stdout).ok()?;
        wanted
            .iter()
            .all(|a| entries.iter().any(|e| e.action == *a))
            .then_some(entries)
    })
    .await;
    for entry in entries
        .iter()
        .filter(|e| wanted.contains(&e.action.as_str()))
    {
        assert_eq!(
            entry.actor, me,
            "{} names another actor: {entry:?}",
            entry.action
        );
        assert_eq!(entry.via, ax_bus::auth::Via::Cli, "{entry:?}");
    }
}
