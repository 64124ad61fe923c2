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
    let spawn = |name: &str, roles: &str, user: &str| {
        let dir = nats.path(name);
        let data = dir.join("data");
        AxProcess::spawn(
            Some(&as_user(user)),
            &[
                "node",
                "--roles",
                roles,
                "--id",
                name,
                "--data-dir",
                data.to_str().unwrap(),
            ],
            &dir,
            &dir.join("node.log"),
        )
    };
    let core = spawn("core", "scheduler,dag,router", "core");
    let worker = spawn("w1", "worker", "worker");
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
