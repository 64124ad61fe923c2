//! `ax up`: a local cluster from one command. It finds a free port when 4222 is taken, records
//! the URL for the commands run in the same folder, runs jobs, and stops everything on SIGTERM —
//! and its nats-server dies with it even when it is killed outright.

use crate::support;

use std::path::Path;
use std::time::Duration;

use ax_bus::client::local_server::{find_binary, BINARY_ENV};
use support::*;

/// `ax up` in `dir`, told where the pinned nats-server is (the test's folder has no .tools/),
/// its terminal as a user's (warnings only: `RUST_LOG` is `warn`, the default).
fn spawn_up(dir: &Path) -> AxProcess {
    let binary = find_binary().expect("pinned nats-server");
    AxProcess::spawn_with_env(
        None,
        &["up", "--slots", "4"],
        dir,
        &dir.join("up.log"),
        &[
            (BINARY_ENV, binary.to_str().expect("utf-8 path")),
            ("RUST_LOG", "warn"),
        ],
    )
}

async fn wait_for_url(dir: &Path) -> String {
    wait_for(
        Duration::from_secs(30),
        "ax up to record its URL",
        || async {
            let text = std::fs::read_to_string(dir.join(".ax/nats.url")).ok()?;
            let url = text.trim().to_string();
            (!url.is_empty()).then_some(url)
        },
    )
    .await
}

/// Runs `ax` in `dir` without any NATS flag or variable: the recorded URL must be found.
fn ax_here(dir: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(ax_binary())
        .args(args)
        .current_dir(dir)
        .env_remove("AX_NATS_URL")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_runs_jobs_and_stops_leaving_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut up = spawn_up(dir.path());
    let url = wait_for_url(dir.path()).await;
    let store = dir.path().join(".ax").canonicalize().unwrap().join("nats");
    assert_eq!(
        pids_with(store.to_str().unwrap()).len(),
        1,
        "one nats-server for this store"
    );

    let hello = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/jobs/hello.yaml");
    let out = ax_here(dir.path(), &["job", "apply", "-f", hello.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "apply via the recorded URL {url}: {}",
        stderr(&out)
    );
    wait_for(
        Duration::from_secs(20),
        "3 successful hello instances",
        || async {
            let out = ax_here(
                dir.path(),
                &[
                    "instance", "list", "--job", "hello", "--state", "success", "--json",
                ],
            );
            let list: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            (list.as_array()?.len() >= 3).then_some(())
        },
    )
    .await;
    // The terminal shows the banner, not the log: that is in .ax/ax.log.
    let terminal = up.log_text();
    assert!(terminal.contains("console: http://"), "{terminal}");
    assert!(!terminal.contains(" INFO "), "{terminal}");
    let log = std::fs::read_to_string(dir.path().join(".ax/ax.log")).unwrap();
    assert!(log.contains(" INFO "), "{log}");

    let status = up
        .terminate(Duration::from_secs(30))
        .expect("ax up stops on SIGTERM");
    assert!(
        status.success(),
        "ax up exited with {status}: {}",
        up.log_text()
    );
    assert!(
        pids_with(store.to_str().unwrap()).is_empty(),
        "nats-server left behind"
    );
    assert!(
        !dir.path().join(".ax/nats.url").exists(),
        "stale URL file left behind"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_up_takes_its_nats_server_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut up = spawn_up(dir.path());
    wait_for_url(dir.path()).await;
    let store = dir.path().join(".ax").canonicalize().unwrap().join("nats");
    assert_eq!(pids_with(store.to_str().unwrap()).len(), 1);
    up.kill9();
    wait_for(
        Duration::from_secs(10),
        "the orphaned nats-server to exit",
        || async { pids_with(store.to_str().unwrap()).is_empty().then_some(()) },
    )
    .await;
}

/// `ax up --nats` with a password in the URL: the password is printed nowhere, and the recorded
/// URL (which the commands in the folder need whole) is readable by its owner only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_the_nats_url_stays_secret() {
    use std::os::unix::fs::PermissionsExt;
    let nats = TestNats::start_with_config(
        Some("authorization { users = [ { user: ax, password: \"pa55-secret\" } ] }\n"),
        Some("ax:pa55-secret"),
    );
    let dir = nats.path("up");
    let url = nats.url();
    assert!(url.contains("pa55-secret"), "{url}");
    let up = AxProcess::spawn(
        None,
        &["up", "--nats", &url, "--slots", "1"],
        &dir,
        &dir.join("up.log"),
    );
    let recorded = wait_for_url(&dir).await;
    assert_eq!(recorded, url, "the commands need the whole URL");
    let mode = std::fs::metadata(dir.join(".ax/nats.url"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    let said = wait_for(Duration::from_secs(30), "ax up to say it is up", || async {
        let log = up.log_text();
        log.contains("ax is up").then_some(log)
    })
    .await;
    assert!(!said.contains("pa55-secret"), "{said}");
    assert!(said.contains("ax:***@"), "{said}");
    let log = std::fs::read_to_string(dir.join(".ax/ax.log")).unwrap();
    assert!(log.contains(" INFO "), "{log}");
    assert!(!log.contains("pa55-secret"), "{log}");
}
