//! An `ax up` of the test's own (its embedded nats-server on a free port, the pinned binary),
//! with its console on a free port: what the console's and the API's tests drive.

use std::path::Path;
use std::time::Duration;

use ax_bus::client::local_server::{find_binary, BINARY_ENV};

use super::{alive, ax, free_port, stderr, wait_for_logged, AxProcess};

/// An `ax up` of the test's own, with its console on a free port.
pub(crate) struct Up {
    /// The `ax up` process.
    pub(crate) process: AxProcess,
    /// Its NATS URL.
    pub(crate) nats: String,
    /// Its console's base URL.
    pub(crate) http: String,
    /// A connection to its NATS.
    pub(crate) client: ax_bus::AxClient,
}

pub(crate) async fn up(dir: &Path) -> Up {
    up_with(dir, &[]).await
}

/// [`up`] with more arguments (`--auth`). Its ports are free when picked, and another test may
/// bind one before `ax up` does: `ax up` then exits saying the address is in use, and is
/// started again on other ports.
pub(crate) async fn up_with(dir: &Path, extra: &[&str]) -> Up {
    for _ in 0..3 {
        if let Some(up) = try_up(dir, extra).await {
            return up;
        }
    }
    panic!("ax up found its ports taken three times");
}

/// One start of `ax up` on two free ports; `None` when it exited because one was taken.
async fn try_up(dir: &Path, extra: &[&str]) -> Option<Up> {
    let (nats_port, http_port) = (free_port(), free_port());
    let binary = find_binary().expect("pinned nats-server");
    let (nats_port_text, http_port_text) = (nats_port.to_string(), http_port.to_string());
    let mut args = vec![
        "up",
        "--nats-port",
        &nats_port_text,
        "--http-port",
        &http_port_text,
    ];
    args.extend_from_slice(extra);
    let process = AxProcess::spawn_with_env(
        None,
        &args,
        dir,
        &dir.join("up.log"),
        &[(BINARY_ENV, binary.to_str().expect("utf-8 path"))],
    );
    let pid = process.pid().as_raw();
    // Up once it says so: its NATS URL recorded and its console serving.
    let started = wait_for_logged(Duration::from_secs(60), "ax up", &[&process], || async {
        match (process.log_text().contains("ax is up"), alive(pid)) {
            (true, true) => Some(true),
            (_, false) => Some(false),
            (false, true) => None,
        }
    })
    .await;
    if !started {
        let log = process.log_text();
        assert!(
            log.to_lowercase().contains("address already in use"),
            "ax up exited:\n{log}"
        );
        return None;
    }
    let nats = format!("nats://127.0.0.1:{nats_port}");
    let client = ax_bus::AxClient::connect(&ax_bus::client::ConnectConfig::new(&nats, "ax-test"))
        .await
        .unwrap();
    Some(Up {
        process,
        nats,
        http: format!("http://127.0.0.1:{http_port}"),
        client,
    })
}

/// Applies jobs to `up`, each `(name, the rest of its YAML)`, from files under `dir`.
pub(crate) fn apply(up: &Up, dir: &Path, jobs: &[(&str, &str)]) {
    let folder = dir.join("jobs");
    std::fs::create_dir_all(&folder).unwrap();
    for (name, rest) in jobs {
        std::fs::write(
            folder.join(format!("{name}.yaml")),
            format!("version: v1\njob:\n  name: {name}\n{rest}"),
        )
        .unwrap();
    }
    let out = ax(&up.nats, &["job", "apply", "-f", folder.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
}
