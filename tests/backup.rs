//! `ax backup` and `ax restore`: a running deployment copied (with NATS restarting in the
//! middle of the copy) and brought back into a fresh nats-server runs the same jobs, shows the
//! same history, accepts the same tokens and fires its pending delayed instance at its time; a
//! partial or corrupt copy, and a target that has ax's streams already, are refused.

use std::path::Path;
use std::time::Duration;

use crate::support;
use ax_bus::State;
use support::*;

fn noop(name: &str, extra: &str) -> String {
    format!("version: v1\njob:\n  name: {name}\n{extra}  exec: {{ type: noop }}\n")
}

/// Waits for a one-shot `ax` process to end; its exit status.
async fn ended(process: &mut AxProcess, within: Duration) -> std::process::ExitStatus {
    wait_for(within, "the command to end", || {
        let status = process.child.try_wait().ok().flatten();
        async move { status }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_backup_runs_the_same_deployment_on_a_new_nats() {
    let mut old = TestNats::start();
    let client = old.client().await;
    let node = AxProcess::node(&old, "n1", "all", &[]);
    apply_job(&old, "once", &noop("once", "")).await;
    apply_job(&old, "tick", &noop("tick", "  cron: '*/2 * * * * *'\n")).await;
    let done = trigger(&old, &["once"]);
    final_record(&client, &done, Duration::from_secs(30)).await;
    let admin = old.path("tokens").join("admin");
    wait_for(Duration::from_secs(30), "the first admin token", || async {
        let out = ax(
            &old.url(),
            &["auth", "bootstrap", "--out", admin.to_str().unwrap()],
        );
        out.status.success().then_some(())
    })
    .await;
    let later = trigger(&old, &["once", "--in", "40s"]);
    let (waiting, _) = client.instance(&id(&later)).await.unwrap().expect("later");
    let due = waiting.expected_time;
    let history = client
        .instance_history(&id(&done))
        .await
        .unwrap()
        .expect("a history")
        .steps;

    // An unfinished folder that is not ax's is refused, naming it, and left as it was.
    let out = old.path("backups").join("monday");
    let foreign = out.with_file_name("monday.partial");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("thesis.tex"), "mine").unwrap();
    let refused = ax(&old.url(), &["backup", "--out", out.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains(
            "monday.partial exists and is not an unfinished backup of ax's (it holds `thesis.tex`"
        ),
        "{}",
        stderr(&refused)
    );
    assert!(foreign.join("thesis.tex").exists());
    std::fs::remove_dir_all(&foreign).unwrap();

    // The backup, with NATS going down while it waits before its second stream and back a few
    // seconds later.
    let dir = old.path("backup-cli");
    let mut backup = AxProcess::spawn_with_env(
        Some(&old.url()),
        &["backup", "--out", out.to_str().unwrap()],
        &dir,
        &dir.join("backup.log"),
        &[("AX_TEST_BACKUP_PAUSE_SECS", "2")],
    );
    wait_for(Duration::from_secs(30), "the first stream copied", || {
        let copied = backup.log_text().contains(" messages, ");
        async move { copied.then_some(()) }
    })
    .await;
    old.outage(Duration::from_secs(4)).await;
    let status = ended(&mut backup, Duration::from_secs(120)).await;
    assert!(status.success(), "{}", backup.log_text());
    // NATS went away between the first stream and the others (the requests made meanwhile
    // wait for the connection, or are tried again), and the copy is complete.
    let log = backup.log_text();
    let lost = log
        .find("lost the NATS connection")
        .expect("NATS restarted mid-backup");
    assert!(lost > log.find("AX_CONTROL: ").unwrap(), "{log}");
    assert!(log[lost..].contains("KV_ax_instances: "), "{log}");
    assert!(log.contains("backup complete: "), "{log}");
    assert!(out.join("manifest.json").exists());
    assert!(!out.with_file_name("monday.partial").exists());
    // It holds the registry, the audit and the tokens' hashes: its owner's only.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&out), 0o700);
    for file in std::fs::read_dir(&out).unwrap() {
        let file = file.unwrap().path();
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    drop(node);

    // A copy that is not whole is refused before anything is sent.
    let broken = old.path("backups").join("broken");
    copy_dir(&out, &broken);
    let snapshot = broken.join("KV_ax_instances.snapshot");
    let bytes = std::fs::read(&snapshot).unwrap();
    std::fs::write(&snapshot, &bytes[..bytes.len() / 2]).unwrap();
    let new = TestNats::start();
    let refused = ax(&new.url(), &["restore", "--from", broken.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("KV_ax_instances.snapshot: ")
            && stderr(&refused).contains("where the manifest says"),
        "{}",
        stderr(&refused)
    );
    // A stream's description edited (its results kept 180 s, not 7 days) is refused too.
    std::fs::write(&snapshot, &bytes).unwrap();
    let described = broken.join("AX_RESULTS.json");
    let mut description: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&described).unwrap()).unwrap();
    description["config"]["max_age"] = serde_json::json!(180_000_000_000u64);
    std::fs::write(&described, description.to_string()).unwrap();
    let refused = ax(&new.url(), &["restore", "--from", broken.to_str().unwrap()]);
    assert!(
        stderr(&refused).contains("AX_RESULTS.json: "),
        "{}",
        stderr(&refused)
    );
    // A manifest that lists a stream twice is refused before anything is restored (the
    // restore below fills this NATS).
    std::fs::copy(out.join("AX_RESULTS.json"), &described).unwrap();
    let manifest_path = broken.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    let first = manifest["streams"][0].clone();
    manifest["streams"].as_array_mut().unwrap().push(first);
    std::fs::write(&manifest_path, manifest.to_string()).unwrap();
    let refused = ax(&new.url(), &["restore", "--from", broken.to_str().unwrap()]);
    assert!(stderr(&refused).contains("twice"), "{}", stderr(&refused));
    std::fs::remove_file(broken.join("manifest.json")).unwrap();
    let partial = ax(&new.url(), &["restore", "--from", broken.to_str().unwrap()]);
    assert!(
        stderr(&partial).contains("a partial copy, or not a backup"),
        "{}",
        stderr(&partial)
    );

    // The restore, then once more: the target has the streams now.
    let restored = ax(&new.url(), &["restore", "--from", out.to_str().unwrap()]);
    assert!(restored.status.success(), "{}", stderr(&restored));
    assert!(stderr(&restored).contains("checksums verified"));
    let again = ax(&new.url(), &["restore", "--from", out.to_str().unwrap()]);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("the target NATS already has AX_CONTROL"),
        "{}",
        stderr(&again)
    );

    // The new deployment: same jobs, same history, same tokens, the delayed instance at its
    // time, the cron job firing.
    let _node = AxProcess::configured(&new, "n2", "all", "[auth]\nenabled = true\n");
    let client = new.client().await;
    let jobs = client.job_specs().await.unwrap();
    assert!(jobs.contains_key("once") && jobs.contains_key("tick"));
    let again = client
        .instance_history(&id(&done))
        .await
        .unwrap()
        .expect("the history restored")
        .steps;
    assert_eq!(again, history);
    let fired = final_record(&client, &later, Duration::from_secs(90)).await;
    assert_eq!(fired.state, State::Success);
    let started = fired.started_at.expect("started");
    assert!(started >= due, "started {started} before its time {due}");
    assert!(
        started - due < chrono::Duration::seconds(5),
        "started {started}, due {due}"
    );
    // With auth on, a command carrying the token made before the backup is taken, one
    // without a token is not.
    let token = admin.to_str().unwrap();
    let taken = ax(
        &new.url(),
        &["--token-file", token, "job", "trigger", "once"],
    );
    assert!(taken.status.success(), "{}", stderr(&taken));
    let refused = ax(&new.url(), &["job", "trigger", "once"]);
    assert!(!refused.status.success(), "{}", stdout(&refused));
    let ticks_before = client
        .instances(Some(&"tick".parse().unwrap()))
        .await
        .unwrap()
        .len();
    wait_for(
        Duration::from_secs(30),
        "the cron job firing again",
        || async {
            let now = client
                .instances(Some(&"tick".parse().unwrap()))
                .await
                .ok()?
                .len();
            (now > ticks_before).then_some(())
        },
    )
    .await;
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}
