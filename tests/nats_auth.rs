//! NATS authorization: a node with wrong credentials fails at once with a clear message; with
//! the right ones it works; a client whose permissions allow only reading results can neither
//! trigger a job nor slip a dispatch onto an internal subject; and README's per-role
//! permission table, given to the server as it stands, is all each role needs.

mod support;

use std::time::{Duration, Instant};

use ax_bus::{State, Tag};
use support::*;

const SERVER_CONFIG: &str = r#"
authorization {
  users = [
    { user: ax, password: "ax-secret" }
    {
      user: reader, password: "reader-secret",
      permissions: {
        publish: { allow: ["_INBOX.>"] },
        subscribe: { allow: ["ax.result.>", "ax.event.>", "ax.alert.>", "_INBOX.>"] }
      }
    }
  ]
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_fail_at_once_and_readers_cannot_command() {
    let nats = TestNats::start_with_config(Some(SERVER_CONFIG), Some("ax:ax-secret"));
    let bare = nats.server.url.clone();

    // Wrong password, and none at all: the node stops at once, saying why.
    for url in [bare.replacen("://", "://ax:wrong@", 1), bare.clone()] {
        let started = Instant::now();
        let dir = nats.path("refused");
        let out = std::process::Command::new(ax_binary())
            .args(["node", "--roles", "worker", "--id", "refused", "--data-dir"])
            .arg(dir.join("data"))
            .env("AX_NATS_URL", &url)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("cannot connect to NATS") && err.to_lowercase().contains("authorization"),
            "{err}"
        );
        assert!(!err.contains("wrong"), "the password was printed: {err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(
        &nats,
        "hello",
        "version: v1\njob:\n  name: hello\n  exec: { type: shell, command: 'true' }\n",
    )
    .await;
    let marker = nats.path("files").join("pwned");
    apply_job(
        &nats,
        "target",
        &format!(
            "version: v1\njob:\n  name: target\n  exec: {{ type: shell, command: 'touch {}' }}\n",
            marker.display()
        ),
    )
    .await;

    // The reader: may read results, nothing else.
    let reader =
        async_nats::ConnectOptions::with_user_and_password("reader".into(), "reader-secret".into())
            .connect(bare.as_str())
            .await
            .unwrap();
    let trigger_json = br#"{"name": "target"}"#.to_vec();
    let _ = reader
        .publish("ax.control.trigger", trigger_json.clone().into())
        .await;
    let _ = reader
        .publish("ax.internal.dispatch.n1.normal", trigger_json.into())
        .await;
    let _ = reader.flush().await;
    let answer = tokio::time::timeout(
        Duration::from_secs(2),
        reader.request("ax.control.trigger", "{}".into()),
    )
    .await;
    assert!(
        !matches!(answer, Ok(Ok(_))),
        "the reader got an answer from the control subject"
    );

    // A trigger that went through the proper door after them comes back first-in-line: had
    // the reader's been accepted, it would have been handled before it.
    let id = trigger(&nats, &["hello"]);
    let record = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!((record.state, record.tag), (State::Success, Tag::Completed));
    assert!(
        instances(&client, "target").await.is_empty(),
        "the reader triggered a job"
    );
    assert!(!marker.exists(), "the reader's message ran a command");
}

/// The per-role split of README's permission table, as a server config: each kind of client
/// gets exactly its row (plus what every ax process needs for JetStream).
const ROLES_CONFIG: &str = r#"
authorization {
  users = [
    {
      user: core, password: "core-secret",
      permissions: {
        publish: { allow: [
          "ax.internal.created.>", "ax.internal.ready.>", "ax.internal.retry.>",
          "ax.internal.tick.>", "ax.internal.clock.>", "ax.internal.dispatch.>",
          "ax.internal.split.>", "ax.internal.cancel.>", "ax.internal.dead.>",
          "ax.event.>", "ax.alert.>", "ax.audit.>", "ax.result.>",
          "$JS.API.>", "$KV.>", "$JS.ACK.>", "_INBOX.>"
        ] },
        subscribe: { allow: ["ax.internal.ack.>", "_INBOX.>"] }
      }
    }
    {
      user: worker, password: "worker-secret",
      permissions: {
        publish: { allow: [
          "ax.internal.ack.>", "ax.internal.clock.>", "ax.internal.dead.>",
          "ax.result.>", "ax.event.>", "ax.alert.>",
          "$JS.API.>", "$KV.>", "$JS.ACK.>", "_INBOX.>"
        ] },
        subscribe: { allow: ["ax.internal.cancel.>", "_INBOX.>"] }
      }
    }
    {
      user: operator, password: "operator-secret",
      permissions: {
        publish: { allow: ["ax.control.>", "ax.audit.>", "$JS.API.>", "$KV.>", "$JS.ACK.>", "_INBOX.>"] },
        subscribe: { allow: ["_INBOX.>"] }
      }
    }
  ]
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_runs_with_only_its_documented_permissions() {
    // The CLI (apply, trigger) acts as the operator.
    let nats = TestNats::start_with_config(Some(ROLES_CONFIG), Some("operator:operator-secret"));
    let as_user = |user: &str| {
        nats.server
            .url
            .replacen("://", &format!("://{user}:{user}-secret@"), 1)
    };
    let core = AxProcess::node_at(&as_user("core"), &nats, "core", "scheduler,dag,router", &[]);
    let worker = AxProcess::node_at(&as_user("worker"), &nats, "w1", "worker", &[]);
    let client = nats.client().await;
    apply_job(
        &nats,
        "chain",
        "version: v1\njob:\n  name: up\n  exec: { type: shell, command: 'true' }\n---\nversion: v1\njob:\n  name: down\n  deps: [ { name: up, biz_date: current } ]\n  exec: { type: shell, command: 'true' }\n",
    )
    .await;
    let id = trigger(&nats, &["up"]);
    let up = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!((up.state, up.tag), (State::Success, Tag::Completed));
    // The downstream, created by the DagCoordinator and run by the worker.
    let down = wait_for_logged(
        Duration::from_secs(30),
        "the downstream to succeed",
        &[&core, &worker],
        || async {
            instances(&client, "down")
                .await
                .into_iter()
                .find(|r| r.state == State::Success)
        },
    )
    .await;
    assert_eq!(down.biz_date, up.biz_date);
    for process in [&core, &worker] {
        let log = process.log_text();
        assert!(
            !log.to_lowercase().contains("permissions violation"),
            "{}",
            log
        );
    }
}

/// Runs `ax nodes --json` with `env` (how the CLI reaches a secured server) and returns the
/// node names it lists, if it could connect.
fn listed_nodes(url: &str, env: &[(&str, String)]) -> Option<Vec<String>> {
    let out = std::process::Command::new(ax_binary())
        .args(["nodes", "--json"])
        .env("AX_NATS_URL", url)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .ok()?;
    let nodes: Vec<ax_bus::messages::NodeStatus> = serde_json::from_slice(&out.stdout).ok()?;
    Some(nodes.into_iter().map(|n| n.node.to_string()).collect())
}

/// A node with `env` against `nats` (URL `url`) comes up and is seen by the CLI with the same
/// settings; with `wrong` instead, it stops at once, its reason containing `reason`.
async fn connects_only_with(
    nats: &TestNats,
    url: &str,
    env: &[(&str, String)],
    wrong: &[(&str, String)],
    reason: &str,
) {
    let started = Instant::now();
    let dir = nats.path("refused");
    let out = std::process::Command::new(ax_binary())
        .args([
            "node",
            "--roles",
            "scheduler",
            "--id",
            "refused",
            "--data-dir",
        ])
        .arg(dir.join("data"))
        .env("AX_NATS_URL", url)
        .envs(wrong.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        err.contains("cannot connect to nats") && err.contains(reason),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));

    let dir = nats.path("good");
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let node = AxProcess::spawn_with_env(
        Some(url),
        &[
            "node",
            "--roles",
            "scheduler",
            "--id",
            "good",
            "--data-dir",
            dir.join("data").to_str().unwrap(),
        ],
        &dir,
        &dir.join("node.log"),
        &env_refs,
    );
    wait_for_logged(
        Duration::from_secs(30),
        "the node's heartbeat, read with the same settings",
        &[&node],
        || async { listed_nodes(url, env).filter(|nodes| nodes.iter().any(|n| n == "good")) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_nkey_and_tls_settings_connect_and_wrong_ones_stop_the_node() {
    // A token.
    let nats = TestNats::start_with_config(Some("authorization { token: \"s3cret-token\" }"), None);
    let url = nats.server.url.clone();
    connects_only_with(
        &nats,
        &url,
        &[("AX_NATS_TOKEN", "s3cret-token".to_string())],
        &[("AX_NATS_TOKEN", "guess".to_string())],
        "authorization",
    )
    .await;
    drop(nats);

    // An NKey: the server knows the public key, the node holds the seed in a file.
    let user = nkeys::KeyPair::new_user();
    let nats = TestNats::start_with_config(
        Some(&format!(
            "authorization {{ users = [ {{ nkey: \"{}\" }} ] }}",
            user.public_key()
        )),
        None,
    );
    let seed_file = nats.path("keys").join("ax.nk");
    std::fs::write(&seed_file, user.seed().unwrap()).unwrap();
    let stranger = nkeys::KeyPair::new_user();
    let stranger_file = nats.path("keys").join("stranger.nk");
    std::fs::write(&stranger_file, stranger.seed().unwrap()).unwrap();
    let url = nats.server.url.clone();
    connects_only_with(
        &nats,
        &url,
        &[("AX_NATS_NKEY_SEED_FILE", seed_file.display().to_string())],
        &[(
            "AX_NATS_NKEY_SEED_FILE",
            stranger_file.display().to_string(),
        )],
        "authorization",
    )
    .await;
    drop(nats);

    // TLS with a private CA: trusted with AX_NATS_TLS_CA, refused without it.
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let server_key = rcgen::KeyPair::generate().unwrap();
    let server_cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&server_key, &ca, &ca_key)
        .unwrap();
    let certs = tempfile::tempdir().unwrap();
    let write = |name: &str, text: String| {
        let path = certs.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let ca_file = write("ca.pem", ca.pem());
    let cert_file = write("server.pem", server_cert.pem());
    let key_file = write("server-key.pem", server_key.serialize_pem());
    let nats = TestNats::start_with_config(
        Some(&format!(
            "tls {{ cert_file: \"{}\", key_file: \"{}\" }}",
            cert_file.display(),
            key_file.display()
        )),
        None,
    );
    let url = nats.server.url.replacen("127.0.0.1", "localhost", 1);
    connects_only_with(
        &nats,
        &url,
        &[
            ("AX_NATS_TLS_CA", ca_file.display().to_string()),
            ("AX_NATS_TLS_REQUIRED", "1".to_string()),
        ],
        &[("AX_NATS_TLS_REQUIRED", "1".to_string())],
        "certificate",
    )
    .await;
}
