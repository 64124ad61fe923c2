//! NATS authorization: a node with wrong credentials fails at once with a clear message; with
//! the right ones it works; a client whose permissions allow only reading results can neither
//! trigger a job nor slip a dispatch onto an internal subject; and the per-role
//! permission table, given to the server as it stands, is all each role needs.

use crate::support;

use std::time::{Duration, Instant};

use ax_bus::{State, Tag};
use futures::StreamExt;
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

/// The users of the role test, one per row of the permission table in docs/operations.md.
const ROWS: [(&str, &[&str]); 6] = [
    ("scheduler", &["Scheduler"]),
    ("dag", &["DagCoordinator"]),
    ("router", &["Router"]),
    ("worker", &["worker + Reporter"]),
    ("operator", &["operators (`ax` CLI)"]),
    ("app", &["business services"]),
];

/// The users of the shipped cluster config (config/cluster): its core nodes run the
/// Scheduler, the DagCoordinator and the Router, its workers the worker.
pub(crate) const CLUSTER_USERS: [(&str, &[&str]); 4] = [
    ("core", &["Scheduler", "DagCoordinator", "Router"]),
    ("worker", &["worker + Reporter"]),
    ("operator", &["operators (`ax` CLI)"]),
    ("app", &["business services"]),
];

/// The subjects of one cell of the table: every backticked subject, its `<placeholder>`
/// tokens widened to `>` (a placeholder is the last token wherever the table uses one).
fn cell_subjects(cell: &str) -> Vec<String> {
    backticked(cell)
        .filter(|s| s.starts_with("ax."))
        .map(|s| match s.find(".<") {
            Some(at) => format!("{}.>", &s[..at]),
            None => s.to_string(),
        })
        .collect()
}

/// The streams of a reads or writes cell: `AX_…` names as they are, buckets `ax_b` as
/// their streams `KV_ax_b`.
fn cell_streams(cell: &str) -> Vec<String> {
    backticked(cell)
        .filter_map(|s| {
            if s.starts_with("AX_") {
                Some(s.to_string())
            } else if s.starts_with("ax_") {
                Some(format!("KV_{s}"))
            } else {
                None
            }
        })
        .collect()
}

fn backticked(cell: &str) -> impl Iterator<Item = &str> {
    cell.split('`').skip(1).step_by(2)
}

/// What reading stream `s` takes, by the rule above the table.
fn reads(s: &str) -> Vec<String> {
    [
        format!("$JS.API.STREAM.INFO.{s}"),
        format!("$JS.API.STREAM.MSG.GET.{s}"),
        format!("$JS.API.DIRECT.GET.{s}"),
        format!("$JS.API.DIRECT.GET.{s}.>"),
        format!("$JS.API.CONSUMER.CREATE.{s}"),
        format!("$JS.API.CONSUMER.CREATE.{s}.>"),
        format!("$JS.API.CONSUMER.DURABLE.CREATE.{s}.>"),
        format!("$JS.API.CONSUMER.INFO.{s}.>"),
        format!("$JS.API.CONSUMER.NAMES.{s}"),
        format!("$JS.API.CONSUMER.DELETE.{s}.>"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{s}.>"),
        format!("$JS.ACK.{s}.>"),
        format!("$JS.FC.{s}.>"),
    ]
    .into()
}

/// What a business service's looking up stream `s` takes: reads by key or sequence, no
/// consumer.
fn looks_up(s: &str) -> Vec<String> {
    [
        format!("$JS.API.STREAM.INFO.{s}"),
        format!("$JS.API.STREAM.MSG.GET.{s}"),
        format!("$JS.API.DIRECT.GET.{s}"),
        format!("$JS.API.DIRECT.GET.{s}.>"),
    ]
    .into()
}

/// The names of business service `user`'s own consumers, by the rule above the table.
fn own_consumers(user: &str) -> Vec<String> {
    (1..=8).map(|n| format!("{user}-{n}")).collect()
}

/// What a business service's following stream `s` takes: it looks it up and keeps consumers
/// of its own, each named in the subject.
fn follows(s: &str, user: &str) -> Vec<String> {
    let mut subjects = looks_up(s);
    for n in own_consumers(user) {
        subjects.extend([
            format!("$JS.API.CONSUMER.CREATE.{s}.{n}"),
            format!("$JS.API.CONSUMER.CREATE.{s}.{n}.>"),
            format!("$JS.API.CONSUMER.DURABLE.CREATE.{s}.{n}"),
            format!("$JS.API.CONSUMER.INFO.{s}.{n}"),
            format!("$JS.API.CONSUMER.DELETE.{s}.{n}"),
            format!("$JS.API.CONSUMER.MSG.NEXT.{s}.{n}"),
            format!("$JS.ACK.{s}.{n}.>"),
            format!("$JS.FC.{s}.{n}.>"),
        ]);
    }
    subjects
}

/// The permission table of docs/operations.md as a server config: each user of the role test
/// gets exactly its row, expanded into subjects by the rules the docs give above it.
fn roles_config() -> String {
    authorization(&ROWS, |user| format!("\"{user}-secret\""))
}

/// An `authorization` block giving each of `users` the union of its rows of the table, and
/// the password `password(user)` (as it stands in the config: quoted text or `$VARIABLE`).
pub(crate) fn authorization(
    users: &[(&str, &[&str])],
    password: impl Fn(&str) -> String,
) -> String {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md"),
    )
    .expect("docs/operations.md");
    let streams =
        ax_bus::client::provision::Layout::new(ax_bus::subjects::Subjects::new("ax"), None)
            .stream_names();
    let mut blocks = Vec::new();
    for (user, rows) in users {
        let (mut publish, mut subscribe, mut read, mut write) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        // A business service's reads: what it looks up (buckets) and follows (streams).
        let (mut looked_up, mut followed) = (Vec::new(), Vec::new());
        let (mut ax_process, mut sets_up, mut everything) = (false, false, false);
        for row in *rows {
            let line = doc
                .lines()
                .find(|l| l.starts_with(&format!("| {row} |")))
                .unwrap_or_else(|| panic!("docs/operations.md has no row `{row}`"));
            let cells: Vec<&str> = line.split(" | ").collect();
            assert_eq!(cells.len(), 5, "row `{row}` has five columns");
            publish.extend(cell_subjects(cells[1]));
            subscribe.extend(cell_subjects(cells[2]));
            if *row == "business services" {
                // Each name is followed or looked up as the last verb before it says.
                for s in cell_streams(cells[3]) {
                    let written = format!("`{}`", s.trim_start_matches("KV_"));
                    let before = &cells[3][..cells[3].find(&written).unwrap_or(0)];
                    if before.rfind("follows") > before.rfind("looks up") {
                        followed.push(s);
                    } else {
                        looked_up.push(s);
                    }
                }
            } else {
                read.extend(cell_streams(cells[3]));
            }
            write.extend(cell_streams(cells[4].trim_end_matches(" |")));
            ax_process |= *row != "business services";
            sets_up |= cells[3].contains("sets up");
            everything |= cells[3].contains("`$JS.API.>`");
        }
        subscribe.push(format!("_INBOX.{user}.>"));
        if ax_process {
            publish.push("_INBOX.>".into());
            publish.push("$JS.API.INFO".into());
            publish.push("$KV.ax_nodes.>".into());
            publish.push("$JS.API.STREAM.MSG.GET.KV_ax_partitions".into());
            publish.extend(streams.iter().map(|s| format!("$JS.API.STREAM.INFO.{s}")));
            read.push("AX_ALERTS".into());
            read.push("AX_LINEAGE".into());
        }
        if everything {
            publish.extend(["$JS.API.>".into(), "$JS.ACK.>".into(), "$JS.FC.>".into()]);
        }
        if sets_up {
            for s in &streams {
                publish.push(format!("$JS.API.STREAM.CREATE.{s}"));
                publish.push(format!("$JS.API.STREAM.UPDATE.{s}"));
            }
            publish.push("$JS.API.STREAM.DELETE.AX_CLOCK".into());
        }
        publish.extend(read.iter().flat_map(|s| reads(s)));
        publish.extend(looked_up.iter().flat_map(|s| looks_up(s)));
        publish.extend(followed.iter().flat_map(|s| follows(s, user)));
        publish.extend(
            write
                .iter()
                .map(|s| format!("${}.>", s.replacen("KV_", "KV.", 1))),
        );
        let quote = |subjects: &mut Vec<String>| {
            let mut seen = std::collections::BTreeSet::new();
            subjects.retain(|s| seen.insert(s.clone()));
            subjects
                .iter()
                .map(|s| format!("        \"{s}\""))
                .collect::<Vec<_>>()
                .join("\n")
        };
        blocks.push(format!(
            "    # {}\n    {{\n      user: {user}, password: {},\n      permissions: {{\n        \
             publish: {{ allow: [\n{}\n        ] }}\n        subscribe: {{ allow: [\n{}\n        ] }}\n      \
             }}\n    }}",
            rows.join(", "),
            password(user),
            quote(&mut publish).replace("        \"", "          \""),
            quote(&mut subscribe).replace("        \"", "          \""),
        ));
    }
    format!(
        "authorization {{\n  users = [\n{}\n  ]\n}}\n",
        blocks.join("\n")
    )
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
  exec: { type: shell, command: 'echo up' }
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
  name: slow
  retry: { times: 1, interval: 1 }
  exec: { type: shell, command: 'test -f \"$AX_PARAM_mark\" || { touch \"$AX_PARAM_mark\"; sleep 120; }' }
---
version: v1
job:
  name: later
  exec: { type: noop }
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
    // The operator sets the streams up (nodes of the other roles may only wait for them).
    let client = nats.client().await;
    let nodes: [AxProcess; 4] = [
        AxProcess::node_at(&as_user("scheduler"), &nats, "sched", "scheduler", &[]),
        AxProcess::node_at(&as_user("dag"), &nats, "dag", "dag", &[]),
        AxProcess::node_at(&as_user("router"), &nats, "router", "router", &[]),
        AxProcess::node_at(&as_user("worker"), &nats, "w1", "worker", &[]),
    ];
    let logs: Vec<&AxProcess> = nodes.iter().collect();
    apply_job(&nats, "flow", FLOW_JOBS).await;
    let mark = nats.path("marks").join("flaky");
    let flaky = trigger(
        &nats,
        &["flaky", "--param", &format!("mark={}", mark.display())],
    );
    let up = trigger(&nats, &["up"]);
    let doomed = trigger(&nats, &["doomed"]);
    let patient = trigger(&nats, &["patient"]);
    let later = trigger(&nats, &["later", "--in", "1500ms", "--key", "once"]);
    let flaky = final_record(&client, &flaky, Duration::from_secs(60)).await;
    assert_eq!(
        (flaky.state, flaky.attempt),
        (State::Success, 2),
        "retried once"
    );
    let later = final_record(&client, &later, Duration::from_secs(30)).await;
    assert_eq!(
        later.state,
        State::Success,
        "a delayed trigger, under the Scheduler's row"
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
    // A worker killed mid-attempt: the Router's janitor hands its attempt on (claims revoked,
    // the record marked, the queue drained, the entry removed) and the retry runs elsewhere.
    let mark = nats.path("marks").join("slow");
    let slow = trigger(
        &nats,
        &["slow", "--param", &format!("mark={}", mark.display())],
    );
    wait_for_logged(
        Duration::from_secs(30),
        "the slow attempt to start",
        &logs,
        || async { mark.exists().then_some(()) },
    )
    .await;
    drop(logs);
    let [scheduler, dag, router, mut w1] = nodes;
    w1.kill9();
    let w2 = AxProcess::node_at(&as_user("worker"), &nats, "w2", "worker", &[]);
    let nodes = [scheduler, dag, router, w2];
    let logs: Vec<&AxProcess> = nodes.iter().collect();
    let slow = wait_for_logged(
        Duration::from_secs(90),
        "the retry on w2",
        &logs,
        || async {
            client
                .instance(&ax_bus::ids::InstanceId::parse(&slow).unwrap())
                .await
                .ok()
                .flatten()
                .filter(|(r, _)| r.state == State::Success)
                .map(|(r, _)| r)
        },
    )
    .await;
    assert_eq!(slow.attempt, 2, "{slow:?}");
    // A business service with the app's row, through the Python client as its README shows:
    // a trigger, the instance it made, and its end.
    python_app_triggers_up(&nats, &as_user("app"));
    for process in nodes.iter().chain([&w1]) {
        let log = process.log_text();
        assert!(
            !log.to_lowercase().contains("permissions violation"),
            "{}",
            log
        );
    }
}

/// The shipped cluster config's password of `user`: a variable of the server's environment.
fn cluster_password(user: &str) -> String {
    format!("${}_NATS_PASSWORD", user.to_uppercase())
}

/// config/cluster/nats-*.conf grant exactly the table: each file's `authorization` block is
/// what the table gives the cluster's users (`AX_WRITE_CLUSTER_CONFIG=1` writes it there).
#[test]
fn the_shipped_cluster_config_is_the_permission_table() {
    let block = authorization(&CLUSTER_USERS, cluster_password);
    let write = std::env::var("AX_WRITE_CLUSTER_CONFIG").is_ok_and(|v| v == "1");
    for n in 1..=3 {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("config/cluster/nats-{n}.conf"));
        let text = std::fs::read_to_string(&path).expect("a shipped server config");
        let at = text
            .find("authorization {")
            .unwrap_or_else(|| panic!("{} has no authorization block", path.display()));
        if write {
            std::fs::write(&path, format!("{}{block}", &text[..at])).expect("write it");
        } else {
            assert!(
                text[at..] == block,
                "{} is not the table of docs/operations.md; write it with \
                 AX_WRITE_CLUSTER_CONFIG=1 cargo nextest run -E \
                 'test(/the_shipped_cluster_config_is/)'",
                path.display()
            );
        }
    }
}

/// ax runs on the shipped cluster config's users, each with only its rights: a core node
/// (Scheduler, DagCoordinator, Router) and a worker run a chain, a failure for good and a
/// delayed trigger that the operator's CLI sent; the business user triggers through the Python
/// client; nobody's log has a permissions violation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ax_runs_on_the_shipped_cluster_configs_users() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/cluster/nats-1.conf");
    let text = std::fs::read_to_string(path).expect("config/cluster/nats-1.conf");
    let mut block = text[text.find("authorization {").expect("a block")..].to_string();
    for (user, _) in CLUSTER_USERS {
        block = block.replace(&cluster_password(user), &format!("\"{user}-secret\""));
    }
    let nats = TestNats::start_with_config(Some(&block), Some("operator:operator-secret"));
    let as_user = |user: &str| {
        nats.server
            .url
            .replacen("://", &format!("://{user}:{user}-secret@"), 1)
    };
    let client = nats.client().await;
    let nodes = [
        AxProcess::node_at(
            &as_user("core"),
            &nats,
            "core-1",
            "scheduler,dag,router",
            &[],
        ),
        AxProcess::node_at(&as_user("worker"), &nats, "worker-1", "worker", &[]),
    ];
    let logs: Vec<&AxProcess> = nodes.iter().collect();
    apply_job(&nats, "flow", FLOW_JOBS).await;
    let up = trigger(&nats, &["up"]);
    let doomed = trigger(&nats, &["doomed"]);
    let later = trigger(&nats, &["later", "--in", "1500ms"]);
    for (id, state) in [
        (&up, State::Success),
        (&doomed, State::Failed),
        (&later, State::Success),
    ] {
        let record = final_record(&client, id, Duration::from_secs(60)).await;
        assert_eq!(record.state, state, "{record:?}");
    }
    wait_for_logged(Duration::from_secs(30), "the downstream", &logs, || async {
        instances(&client, "down")
            .await
            .into_iter()
            .find(|r| r.state == State::Success)
    })
    .await;
    python_app_triggers_up(&nats, &as_user("app"));
    for process in &nodes {
        let log = process.log_text();
        assert!(
            !log.to_lowercase().contains("permissions violation"),
            "{log}"
        );
    }
}

/// A business service as the README shows it: the Python client, connected with `url`'s user,
/// triggers `up`, waits for it to succeed, finds its result through the consumer `app-1` and
/// reads its log.
fn python_app_triggers_up(nats: &TestNats, url: &str) {
    let script = r#"
import asyncio, sys
import ax_client

async def main():
    client = await ax_client.connect(sys.argv[1])
    instance = await client.trigger("up")
    done = await client.wait(instance.instance_id, timeout=60)
    # Its result through a consumer of the app's own, and its log without one.
    async for result in client.results("up", durable="app-1", from_start=True):
        if result.instance_id == done.instance_id:
            break
    # The log's end is shipped after the result: read until it is there.
    log = await client.logs(done.instance_id)
    for _ in range(300):
        if log.complete:
            break
        await asyncio.sleep(0.1)
        log = await client.logs(done.instance_id)
    assert log.complete and log.stdout == "up\n", log
    print(done.instance_id, done.state)
    await client.close()

asyncio.run(main())
"#;
    let out = support::python::run(
        std::process::Command::new(support::python::venv())
            .args(["-c", script, url])
            .current_dir(nats.path("python")),
        "the Python client as the app",
    );
    assert!(out.trim_end().ends_with(" success"), "{out}");
}

/// A connection as `user` of the roles config, and the server's errors to it (lower case).
pub(crate) async fn connect_as(
    nats: &TestNats,
    user: &str,
) -> (
    async_nats::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let client =
        async_nats::ConnectOptions::with_user_and_password(user.into(), format!("{user}-secret"))
            .custom_inbox_prefix(format!("_INBOX.{user}"))
            .event_callback(move |event| {
                let tx = tx.clone();
                async move {
                    if let async_nats::Event::ServerError(e) = event {
                        let _ = tx.send(e.to_string().to_lowercase());
                    }
                }
            })
            .connect(nats.server.url.as_str())
            .await
            .expect("connect with a role's credentials");
    (client, rx)
}

/// Publishes `payload` on `subject` as whoever `client` is, and waits for the server to refuse
/// it by name (a publish the server accepts draws no error, so the wait ends at its deadline
/// and fails the test).
pub(crate) async fn refused(
    client: &async_nats::Client,
    errors: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    subject: &str,
    payload: &[u8],
) {
    client
        .publish_with_reply(
            subject.to_string(),
            client.new_inbox(),
            payload.to_vec().into(),
        )
        .await
        .expect("publish");
    client.flush().await.expect("flush");
    let wanted = format!(
        "permissions violation for publish to \"{}\"",
        subject.to_lowercase()
    );
    violation(errors, &wanted, &format!("a refused publish to {subject}")).await;
}

/// Subscribes to `subject` as whoever `client` is and waits for the server to refuse it.
pub(crate) async fn refused_subscription(
    client: &async_nats::Client,
    errors: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    subject: &str,
) {
    let _ignored = client.subscribe(subject.to_string()).await.unwrap();
    client.flush().await.unwrap();
    let wanted = format!(
        "permissions violation for subscription to \"{}\"",
        subject.to_lowercase()
    );
    violation(
        errors,
        &wanted,
        &format!("a refused subscription to {subject}"),
    )
    .await;
}

/// Waits up to 10 s for the server's error that contains `wanted` (`what`, when it never
/// comes); other errors are passed over.
async fn violation(
    errors: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    wanted: &str,
    what: &str,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(deadline, errors.recv()).await {
            Ok(Some(error)) if error.contains(wanted) => return,
            Ok(Some(_)) => continue,
            _ => panic!("timed out waiting for {what}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_worker_or_app_credential_cannot_define_start_or_destroy_work() {
    let nats = TestNats::start_with_config(Some(&roles_config()), Some("operator:operator-secret"));
    let client = nats.client().await;
    let scheduler_url = nats
        .server
        .url
        .replacen("://", "://scheduler:scheduler-secret@", 1);
    let _scheduler = AxProcess::node_at(&scheduler_url, &nats, "sched", "scheduler", &[]);
    let marker = nats.path("files").join("pwned");
    let evil = format!(
        r#"{{"spec": {{"version": "v1", "job": {{"name": "evil", "exec": {{"type": "shell", "command": "touch {}"}}}}}}}}"#,
        marker.display()
    );
    apply_job(
        &nats,
        "kept",
        "version: v1\njob:\n  name: kept\n  exec: { type: shell, command: 'true' }\n",
    )
    .await;

    let (worker, mut errors) = connect_as(&nats, "worker").await;
    // Its row: a heartbeat in ax_workers is allowed (no error comes back for it below).
    for (subject, payload) in [
        // Define a job, in the registry or through the control subject.
        ("$KV.ax_jobs.evil", evil.as_bytes()),
        ("ax.control.apply", evil.as_bytes()),
        ("ax.control.trigger", br#"{"name": "kept"}"#.as_slice()),
        // Run a command on another worker, or stop one there.
        ("ax.internal.dispatch.w2.normal", evil.as_bytes()),
        ("ax.internal.cancel.w2", b"{}".as_slice()),
        // Destroy or steal: purge the registry, delete a stream, read the commands.
        ("$JS.API.STREAM.PURGE.KV_ax_jobs", b"{}".as_slice()),
        ("$JS.API.STREAM.DELETE.AX_CONTROL", b"".as_slice()),
        ("$JS.API.STREAM.UPDATE.KV_ax_jobs", b"{}".as_slice()),
        (
            "$JS.API.CONSUMER.CREATE.AX_CONTROL",
            br#"{"stream_name": "AX_CONTROL", "config": {"ack_policy": "explicit"}}"#.as_slice(),
        ),
        ("$KV.ax_queues.low", b"{}".as_slice()),
        ("$KV.ax_leases.dag", b"{}".as_slice()),
    ] {
        refused(&worker, &mut errors, subject, payload).await;
    }

    let (app, mut errors) = connect_as(&nats, "app").await;
    for (subject, payload) in [
        ("ax.control.apply", evil.as_bytes()),
        ("ax.control.delete", br#"{"name": "kept"}"#.as_slice()),
        ("$KV.ax_jobs.evil", evil.as_bytes()),
        ("$KV.ax_instances.x", b"{}".as_slice()),
        ("$JS.API.STREAM.PURGE.AX_RESULTS", b"{}".as_slice()),
        // ax's own consumers of the results: listed, deleted, read from, acknowledged for,
        // or changed — by name, or by the unnamed create whose body names it.
        ("$JS.API.CONSUMER.NAMES.AX_RESULTS", b"{}".as_slice()),
        ("$JS.API.CONSUMER.LIST.AX_RESULTS", b"{}".as_slice()),
        ("$JS.API.CONSUMER.DELETE.AX_RESULTS.dag-results-1", b"".as_slice()),
        ("$JS.API.CONSUMER.INFO.AX_RESULTS.openlineage", b"".as_slice()),
        ("$JS.API.CONSUMER.MSG.NEXT.AX_RESULTS.dag-results-1", b"{}".as_slice()),
        ("$JS.ACK.AX_RESULTS.dag-results-1.1.1.1.1.1", b"".as_slice()),
        (
            "$JS.API.CONSUMER.CREATE.AX_RESULTS",
            br#"{"stream_name": "AX_RESULTS", "config": {"name": "dag-results-1", "filter_subject": "ax.none", "ack_policy": "explicit"}}"#.as_slice(),
        ),
        (
            "$JS.API.CONSUMER.CREATE.AX_RESULTS.dag-results-1",
            br#"{"stream_name": "AX_RESULTS", "config": {"name": "dag-results-1", "filter_subject": "ax.none", "ack_policy": "explicit"}}"#.as_slice(),
        ),
        ("$JS.API.CONSUMER.DURABLE.CREATE.AX_LOGS.worker-1", b"{}".as_slice()),
    ] {
        refused(&app, &mut errors, subject, payload).await;
    }
    // Other clients' replies: the app may not listen under anyone's inbox prefix but its own.
    for subject in ["_INBOX.>", "_INBOX.operator.>", "_INBOX.*.*", ">"] {
        refused_subscription(&app, &mut errors, subject).await;
    }
    // What the app's row is for still works: a trigger, answered on its inbox.
    let inbox = app.new_inbox();
    let mut answers = app.subscribe(inbox.clone()).await.unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(ax_bus::messages::REPLY_TO_HEADER, inbox.as_str());
    app.publish_with_headers(
        "ax.control.trigger",
        headers,
        ax_bus::codec::encode(&ax_bus::messages::TriggerRequest {
            name: ax_bus::ids::JobName::parse("kept").unwrap(),
            biz_date: None,
            params: Default::default(),
            key: None,
            at: None,
            delay: None,
        })
        .unwrap(),
    )
    .await
    .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(30), answers.next())
        .await
        .expect("the app's trigger is answered")
        .unwrap();
    let reply: ax_bus::messages::ControlReply = ax_bus::codec::decode(&answer.payload).unwrap();
    assert!(reply.ok, "{reply:?}");

    // Nothing of it landed: the registry holds only the operator's job, the streams are whole.
    let jobs: Vec<String> = client
        .jobs()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.spec.name.to_string())
        .collect();
    assert_eq!(jobs, ["kept"]);
    let (operator, _) = connect_as(&nats, "operator").await;
    let js = async_nats::jetstream::new(operator);
    js.get_stream("AX_CONTROL")
        .await
        .expect("AX_CONTROL is still there");
    js.get_stream("KV_ax_jobs")
        .await
        .expect("the registry is still there");
    assert!(!marker.exists());
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
