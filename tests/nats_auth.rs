//! NATS authorization: a node with wrong credentials fails at once with a clear message; with
//! the right ones it works; a client whose permissions allow only reading results can neither
//! trigger a job nor slip a dispatch onto an internal subject; and the per-role
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

/// The users of the permission table in docs/operations.md: (table row, NATS user).
const ROWS: [(&str, &str); 5] = [
    ("Scheduler", "scheduler"),
    ("DagCoordinator", "dag"),
    ("Router", "router"),
    ("worker + Reporter", "worker"),
    ("operators (`ax` CLI)", "operator"),
];

/// The subjects of one cell of the table: every backticked subject, its `<placeholder>`
/// tokens widened to `>` (a placeholder is the last token wherever the table uses one).
fn cell_subjects(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.starts_with("ax."))
        .map(|s| match s.find(".<") {
            Some(at) => format!("{}.>", &s[..at]),
            None => s.to_string(),
        })
        .collect()
}

/// The permission table of docs/operations.md as a server config: each user gets exactly its
/// row, plus what every ax process needs for JetStream (the table says so above it).
fn roles_config() -> String {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md"),
    )
    .expect("docs/operations.md");
    let mut users = Vec::new();
    for (row, user) in ROWS {
        let line = doc
            .lines()
            .find(|l| l.starts_with(&format!("| {row} |")))
            .unwrap_or_else(|| panic!("docs/operations.md has no row `{row}`"));
        let cells: Vec<&str> = line.split(" | ").collect();
        let quote = |subjects: Vec<String>, always: &[&str]| {
            subjects
                .iter()
                .map(String::as_str)
                .chain(always.iter().copied())
                .map(|s| format!("\"{s}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let publish = quote(
            cell_subjects(cells[1]),
            &["$JS.API.>", "$KV.>", "$JS.ACK.>", "_INBOX.>"],
        );
        let subscribe = quote(cell_subjects(cells[2]), &["_INBOX.>"]);
        users.push(format!(
            "{{ user: {user}, password: \"{user}-secret\", permissions: {{ \
             publish: {{ allow: [{publish}] }}, subscribe: {{ allow: [{subscribe}] }} }} }}"
        ));
    }
    format!("authorization {{ users = [ {} ] }}", users.join("\n"))
}

const FLOW_JOBS: &str = "version: v1
job:
  name: ticking
  cron: '* * * * * *'
  exec: { type: noop }
---
version: v1
job:
  name: up
  exec: { type: shell, command: 'true' }
---
version: v1
job:
  name: down
  deps: [ { name: up, biz_date: current } ]
  exec: { type: shell, command: 'true' }
---
version: v1
job:
  name: flaky
  retry: { times: 1, interval: 1 }
  exec: { type: shell, command: 'test -f \"$AX_PARAM_mark\" || { touch \"$AX_PARAM_mark\"; exit 3; }' }
---
version: v1
job:
  name: doomed
  exec: { type: shell, command: 'exit 4' }
---
version: v1
job:
  name: patient
  deps: [ { name: never, biz_date: current } ]
  deps_timeout: 2
  exec: { type: shell, command: 'true' }
---
version: v1
job:
  name: never
  exec: { type: shell, command: 'true' }
---
version: v1
job:
  name: newest
  cron: '*/3 * * * * *'
  overlap: cancel_previous
  exec: { type: shell, command: 'sleep 30' }
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_runs_with_only_its_row_of_the_permission_table() {
    // The CLI (apply, trigger, rerun) acts as the operator.
    let config = roles_config();
    let nats = TestNats::start_with_config(Some(&config), Some("operator:operator-secret"));
    let as_user = |user: &str| {
        nats.server
            .url
            .replacen("://", &format!("://{user}:{user}-secret@"), 1)
    };
    let nodes = [
        AxProcess::node_at(&as_user("scheduler"), &nats, "sched", "scheduler", &[]),
        AxProcess::node_at(&as_user("dag"), &nats, "dag", "dag", &[]),
        AxProcess::node_at(&as_user("router"), &nats, "router", "router", &[]),
        AxProcess::node_at(&as_user("worker"), &nats, "w1", "worker", &[]),
    ];
    let logs: Vec<&AxProcess> = nodes.iter().collect();
    let client = nats.client().await;
    apply_job(&nats, "flow", FLOW_JOBS).await;
    let mark = nats.path("marks").join("flaky");
    let flaky = trigger(
        &nats,
        &["flaky", "--param", &format!("mark={}", mark.display())],
    );
    let up = trigger(&nats, &["up"]);
    let doomed = trigger(&nats, &["doomed"]);
    let patient = trigger(&nats, &["patient"]);
    let flaky = final_record(&client, &flaky, Duration::from_secs(60)).await;
    assert_eq!(
        (flaky.state, flaky.attempt),
        (State::Success, 2),
        "retried once"
    );
    let up = final_record(&client, &up, Duration::from_secs(30)).await;
    assert_eq!(up.state, State::Success);
    let doomed = final_record(&client, &doomed, Duration::from_secs(30)).await;
    assert_eq!(doomed.state, State::Failed);
    let patient = final_record(&client, &patient, Duration::from_secs(30)).await;
    assert_eq!(
        (patient.state, patient.tag),
        (State::Failed, Tag::DepsTimeout)
    );
    wait_for_logged(
        Duration::from_secs(30),
        "the downstream to succeed",
        &logs,
        || async {
            instances(&client, "down")
                .await
                .into_iter()
                .find(|r| r.state == State::Success && r.biz_date == up.biz_date)
        },
    )
    .await;
    // A re-run of the chain's root, through the Scheduler and the DagCoordinator.
    let out = ax(
        &nats.url(),
        &["rerun", "--instance", up.instance_id.as_str()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for_logged(
        Duration::from_secs(30),
        "the re-run to succeed",
        &logs,
        || async {
            client
                .instance(&up.instance_id)
                .await
                .ok()
                .flatten()
                .filter(|(r, _)| r.attempt == 2 && r.state == State::Success)
        },
    )
    .await;
    // A cron job firing every second, and one cancelling its previous run.
    wait_for_logged(
        Duration::from_secs(30),
        "ticks and a superseded run",
        &logs,
        || async {
            let ticked = instances(&client, "ticking")
                .await
                .iter()
                .filter(|r| r.state == State::Success)
                .count();
            let superseded = instances(&client, "newest")
                .await
                .iter()
                .any(|r| r.tag == Tag::Superseded);
            (ticked >= 3 && superseded).then_some(())
        },
    )
    .await;
    let letters = client.dead_letters().await.unwrap();
    assert!(
        letters
            .iter()
            .any(|l| l.instance.as_deref() == Some(doomed.instance_id.as_str())),
        "the failure for good is a dead letter: {letters:?}"
    );
    for process in &nodes {
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
