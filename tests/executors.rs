//! The executors against real counterparts: a local HTTP server started by the test, a real
//! `python3`, plugins from a plugin directory (the shipped example among them), and a
//! downstream job reading its upstream's structured output. (SQL has its own file.)

use crate::support;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use ax_bus::{State, Tag};
use support::*;

async fn run_job(nats: &TestNats, name: &str, yaml: &str) -> ax_bus::InstanceRecord {
    apply_job(nats, name, yaml).await;
    let id = trigger(nats, &[name]);
    final_record(&nats.client().await, &id, Duration::from_secs(60)).await
}

/// An HTTP server: `/ok` answers a JSON status "ok", `/nope` status "failed", `/error` 500,
/// `/hang` never answers. It keeps (path, headers, body) of every request.
struct Endpoint {
    base: String,
    seen: Arc<Mutex<Vec<(String, String, serde_json::Value)>>>,
}

impl Endpoint {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let seen: Arc<Mutex<Vec<(String, String, serde_json::Value)>>> = Arc::default();
        let kept = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let kept = kept.clone();
                tokio::spawn(async move {
                    let Some((head, body)) = read_request(&mut socket).await else {
                        return;
                    };
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                    let json = serde_json::from_slice(&body).unwrap_or_default();
                    kept.lock().unwrap().push((path.clone(), head, json));
                    if let Some(to) = path.strip_prefix("/to/") {
                        // `/to/<host:port>/<path>`: a 307 (the POST is repeated) to there.
                        let answer = format!(
                            "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://{to}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        );
                        let _ = socket.write_all(answer.as_bytes()).await;
                        return;
                    }
                    let (status, reply) = match path.as_str() {
                        "/ok" => ("200 OK", r#"{"status": "ok", "rows": 3}"#),
                        "/nope" => ("200 OK", r#"{"status": "failed"}"#),
                        "/error" => ("500 Internal Server Error", "boom: the disk is full"),
                        _ => {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                            return;
                        }
                    };
                    let answer = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}",
                        reply.len()
                    );
                    let _ = socket.write_all(answer.as_bytes()).await;
                });
            }
        });
        Self { base, seen }
    }

    fn requests(&self, path: &str) -> Vec<(String, serde_json::Value)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _, _)| p == path)
            .map(|(_, head, body)| (head.clone(), body.clone()))
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_secrets_stay_with_their_origin_and_out_of_messages() {
    let nats = TestNats::start();
    let _node = AxProcess::node_with_env(
        &nats.url(),
        &nats,
        "n1",
        "all",
        &[],
        &[("AX_TEST_API_KEY", "k-123")],
    );
    let (home, elsewhere) = (Endpoint::start().await, Endpoint::start().await);
    let host = |e: &Endpoint| e.base.trim_start_matches("http://").to_string();
    let keyed = "    header_env: { X-Api-Key: AX_TEST_API_KEY }\n";

    // Within the origin a redirect is followed, with the headers; the key comes from the
    // worker's environment.
    let same = format!("{}/to/{}/ok", home.base, host(&home));
    let followed = run_job(&nats, "h-same", &http_job("h-same", &same, keyed)).await;
    assert_eq!(followed.state, State::Success, "{}", followed.message);
    let (head, _) = home
        .requests("/ok")
        .pop()
        .expect("the redirect was followed");
    assert!(head.to_lowercase().contains("x-api-key: k-123"), "{head}");

    // To another origin it is not followed: nothing (no header, no key) reaches it.
    let away = format!("{}/to/{}/ok", home.base, host(&elsewhere));
    let stopped = run_job(&nats, "h-away", &http_job("h-away", &away, keyed)).await;
    assert_eq!(
        (stopped.state, stopped.tag),
        (State::Failed, Tag::Rejected),
        "{}",
        stopped.message
    );
    assert!(
        stopped.message.contains("another origin: not followed"),
        "{}",
        stopped.message
    );
    assert!(elsewhere.requests("/ok").is_empty());

    // A password in the URL is never shown: not in the failure, not by `ax job get`.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let secret_url = format!("http://etl:s3cret@127.0.0.1:{port}/x");
    let failed = run_job(
        &nats,
        "h-secret",
        &http_job(
            "h-secret",
            &secret_url,
            "    header_env: { Authorization: AX_TEST_API_KEY }\n",
        ),
    )
    .await;
    assert_eq!(failed.state, State::Failed);
    assert!(
        failed.message.contains("etl:***@") && !failed.message.contains("s3cret"),
        "{}",
        failed.message
    );
    let shown = ax(&nats.url(), &["job", "get", "h-secret"]);
    let shown = String::from_utf8_lossy(&shown.stdout).to_string();
    assert!(
        shown.contains("etl:***@") && !shown.contains("s3cret"),
        "{shown}"
    );

    // A variable the worker does not have: a clear failure naming it.
    let missing = run_job(
        &nats,
        "h-nokey",
        &http_job(
            "h-nokey",
            &format!("{}/ok", home.base),
            "    header_env: { X-Api-Key: AX_NOT_SET_ANYWHERE }\n",
        ),
    )
    .await;
    assert_eq!(
        (missing.state, missing.tag),
        (State::Failed, Tag::ExecutorError)
    );
    assert!(
        missing.message.contains("AX_NOT_SET_ANYWHERE"),
        "{}",
        missing.message
    );
}

fn http_job(name: &str, url: &str, extra: &str) -> String {
    format!(
        "version: v1\njob:\n  name: {name}\n  params: {{ region: eu }}\n  timeout: 3\n  exec:\n    type: http\n    url: {url}\n    headers: {{ X-Team: etl }}\n{extra}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_posts_the_instance_and_judges_the_answer() {
    let nats = TestNats::start();
    let _node = AxProcess::configured(&nats, "n1", "all", "");
    let endpoint = Endpoint::start().await;
    let condition = "    success_when: { path: /status, equals: ok }\n";

    let ok = run_job(
        &nats,
        "h-ok",
        &http_job("h-ok", &format!("{}/ok", endpoint.base), condition),
    )
    .await;
    assert_eq!(
        (ok.state, ok.tag),
        (State::Success, Tag::Completed),
        "{}",
        ok.message
    );
    assert_eq!(ok.output["rows"], 3);
    let (head, body) = endpoint.requests("/ok").pop().unwrap();
    assert_eq!(body["instanceId"], ok.instance_id.as_str());
    assert_eq!(body["traceId"], ok.trace_id.as_str());
    assert_eq!(body["job"], "h-ok");
    assert_eq!(body["bizDate"], ok.biz_date.as_str());
    assert_eq!(body["params"]["region"], "eu");
    assert_eq!(body["attempt"], 1);
    assert!(body["expectedTime"].is_string());
    assert!(head.to_lowercase().contains("x-team: etl"), "{head}");

    let nope = run_job(
        &nats,
        "h-nope",
        &http_job("h-nope", &format!("{}/nope", endpoint.base), condition),
    )
    .await;
    assert_eq!((nope.state, nope.tag), (State::Failed, Tag::Rejected));
    assert!(
        nope.message
            .contains("/status is \"failed\", expected \"ok\""),
        "{}",
        nope.message
    );

    let error = run_job(
        &nats,
        "h-error",
        &http_job("h-error", &format!("{}/error", endpoint.base), ""),
    )
    .await;
    assert_eq!((error.state, error.tag), (State::Failed, Tag::Rejected));
    assert!(
        error.message.contains("HTTP 500") && error.message.contains("the disk is full"),
        "{}",
        error.message
    );

    // An endpoint that never answers: the job's 3 s timeout ends the attempt.
    let hang = run_job(
        &nats,
        "h-hang",
        &http_job("h-hang", &format!("{}/hang", endpoint.base), ""),
    )
    .await;
    assert_eq!(
        (hang.state, hang.tag),
        (State::Failed, Tag::Timeout),
        "{}",
        hang.message
    );

    // Nobody listening: a clear failure, and the worker goes on.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gone = format!("http://{}/x", closed.local_addr().unwrap());
    drop(closed);
    let refused = run_job(&nats, "h-gone", &http_job("h-gone", &gone, "")).await;
    assert_eq!(
        (refused.state, refused.tag),
        (State::Failed, Tag::SpawnFailed)
    );
    assert!(refused.message.contains("POST"), "{}", refused.message);
    let again = run_job(
        &nats,
        "h-ok",
        &http_job("h-ok", &format!("{}/ok", endpoint.base), condition),
    )
    .await;
    assert_eq!(again.state, State::Success);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_runs_scripts_with_params_on_stdin_and_in_a_virtualenv() {
    let nats = TestNats::start();
    let _node = AxProcess::configured(&nats, "n1", "all", "");
    let dir = nats.path("py");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("stat.py");
    std::fs::write(
        &script,
        r#"import json, os, sys
params = json.load(sys.stdin)
out = {"argv": sys.argv[1:], "from_stdin": params["table"], "from_env": os.environ["AX_PARAM_table"],
       "prefix": sys.prefix, "biz_date": os.environ["AX_BIZ_DATE"]}
with open(os.environ["AX_OUTPUT_FILE"], "w") as f:
    json.dump(out, f)
"#,
    )
    .unwrap();
    let evil = "orders'; rm -rf / #";
    let job = |name: &str, venv: &str| {
        format!(
            "version: v1\njob:\n  name: {name}\n  params: {{ table: \"{evil}\" }}\n  exec:\n    type: python\n    script: {}\n    args: ['--table={{{{params.table}}}}', '{{{{biz_date}}}}']\n{venv}",
            script.display()
        )
    };
    let plain = run_job(&nats, "py-plain", &job("py-plain", "")).await;
    assert_eq!(
        plain.state,
        State::Success,
        "{} {}",
        plain.message,
        plain.stderr_tail
    );
    assert_eq!(
        plain.output["argv"],
        serde_json::json!([format!("--table={evil}"), plain.biz_date])
    );
    assert_eq!(plain.output["from_stdin"], evil);
    assert_eq!(plain.output["from_env"], evil);

    let venv = dir.join("venv");
    let in_venv = run_job(
        &nats,
        "py-venv",
        &job("py-venv", &format!("    venv: {}\n", venv.display())),
    )
    .await;
    assert_eq!(
        in_venv.state,
        State::Success,
        "{} {}",
        in_venv.message,
        in_venv.stderr_tail
    );
    assert_eq!(
        Path::new(in_venv.output["prefix"].as_str().unwrap()),
        venv.as_path()
    );
    assert!(venv.join(".ax-ready").exists());

    // A making that was interrupted (no ready mark) is cleared and made again: ax made it.
    std::fs::remove_file(venv.join(".ax-ready")).unwrap();
    std::fs::write(venv.join("leftover"), "half made").unwrap();
    let again = run_job(
        &nats,
        "py-venv-again",
        &job("py-venv-again", &format!("    venv: {}\n", venv.display())),
    )
    .await;
    assert_eq!(again.state, State::Success, "{}", again.message);
    assert!(!venv.join("leftover").exists() && venv.join(".ax-ready").exists());

    // A directory ax did not make is never cleared, even named as a virtualenv.
    let precious = dir.join("precious");
    std::fs::create_dir_all(&precious).unwrap();
    std::fs::write(precious.join("data.csv"), "a,b\n").unwrap();
    let taken = run_job(
        &nats,
        "py-taken",
        &job("py-taken", &format!("    venv: {}\n", precious.display())),
    )
    .await;
    assert_eq!(
        (taken.state, taken.tag),
        (State::Failed, Tag::ExecutorError),
        "{}",
        taken.message
    );
    assert!(
        taken.message.contains("not made by ax"),
        "{}",
        taken.message
    );
    assert_eq!(
        std::fs::read_to_string(precious.join("data.csv")).unwrap(),
        "a,b\n"
    );

    let missing = run_job(
        &nats,
        "py-missing",
        "version: v1\njob:\n  name: py-missing\n  exec: { type: python, script: /nonexistent/x.py }\n",
    )
    .await;
    assert_eq!(
        (missing.state, missing.tag),
        (State::Failed, Tag::ExecutorError)
    );
    assert!(
        missing.message.contains("no file /nonexistent/x.py"),
        "{}",
        missing.message
    );

    let module = run_job(
        &nats,
        "py-module",
        "version: v1\njob:\n  name: py-module\n  exec: { type: python, module: json.tool, args: ['--help'] }\n",
    )
    .await;
    assert_eq!(module.state, State::Success, "{}", module.message);
    assert!(
        module.stdout_tail.contains("usage"),
        "{}",
        module.stdout_tail
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_job_reads_its_upstreams_output() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::configured(&nats, "n1", "all", "");
    let seen = nats.path("files").join("seen");
    apply_job(
        &nats,
        "chain",
        &format!(
            r#"version: v1
job:
  name: load-orders
  exec:
    type: shell
    command: |
      printf '%s' '{{"rows": 42, "file": "a b; $(x)"}}' > "$AX_OUTPUT_FILE"
---
version: v1
job:
  name: report
  deps: [ {{ name: load-orders }} ]
  exec:
    type: shell
    command: printf '%s|%s' {{{{deps.load-orders.output.rows}}}} {{{{deps.load-orders.output.file}}}} > {}
---
version: v1
job:
  name: misread
  deps: [ {{ name: load-orders }} ]
  exec: {{ type: shell, command: 'echo {{{{deps.load-orders.output.absent}}}}' }}
"#,
            seen.display()
        ),
    )
    .await;
    let upstream = trigger(&nats, &["load-orders", "--biz-date", "2026-03-01"]);
    let upstream = final_record(&client, &upstream, Duration::from_secs(30)).await;
    assert_eq!(upstream.state, State::Success, "{}", upstream.message);
    let report = wait_for(Duration::from_secs(30), "the report to end", || async {
        instances(&client, "report")
            .await
            .into_iter()
            .find(|r| r.biz_date == "2026-03-01" && r.state.is_final())
    })
    .await;
    assert_eq!(report.state, State::Success, "{}", report.message);
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "42|a b; $(x)");
    // A field the upstream did not output: the downstream fails, saying which.
    let misread = wait_for(Duration::from_secs(30), "misread to end", || async {
        instances(&client, "misread")
            .await
            .into_iter()
            .find(|r| r.biz_date == "2026-03-01" && r.state.is_final())
    })
    .await;
    assert_eq!(
        (misread.state, misread.tag),
        (State::Failed, Tag::ExecutorError)
    );
    assert!(
        misread.message.contains("has no field `absent`"),
        "{}",
        misread.message
    );
}

/// Writes an executable plugin script.
fn plugin(dir: &Path, file: &str, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(file);
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_are_loaded_from_the_plugin_dir_and_fail_alone() {
    let nats = TestNats::start();
    let plugins = nats.path("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/plugins/line-count");
    std::fs::copy(&example, plugins.join("line-count")).unwrap();
    let describe = |name: &str| {
        format!("if [ \"$1\" = describe ]; then echo '{{\"name\": \"{name}\", \"version\": \"0.1\"}}'; exit 0; fi\n")
    };
    plugin(
        &plugins,
        "crasher",
        &format!("#!/bin/sh\n{}if [ \"$1\" = prepare ]; then echo '{{\"ok\": true}}'; exit 0; fi\necho 'about to fall over' >&2\nkill -SEGV $$\n", describe("crasher")),
    );
    plugin(
        &plugins,
        "babbler",
        &format!(
            "#!/bin/sh\n{}echo 'this is not json'\n",
            describe("babbler")
        ),
    );
    plugin(&plugins, "mute", "#!/bin/sh\nexit 1\n");
    plugin(
        &plugins,
        "impostor",
        "#!/bin/sh\necho '{\"name\": \"shell\"}'\n",
    );
    let config = format!("[worker]\nplugin_dir = \"{}\"\n", plugins.display());
    let _node = AxProcess::configured(&nats, "n1", "all", &config);
    let data = nats.path("files").join("data.txt");
    std::fs::write(&data, "a\nb\nc\n").unwrap();

    let counted = run_job(
        &nats,
        "count",
        &format!(
            "version: v1\njob:\n  name: count\n  exec:\n    type: line-count\n    with: {{ path: {} }}\n",
            data.display()
        ),
    )
    .await;
    assert_eq!(
        counted.state,
        State::Success,
        "{} {}",
        counted.message,
        counted.stderr_tail
    );
    assert_eq!(counted.output["lines"], 3);
    assert!(
        counted.stdout_tail.contains("counted 3 lines"),
        "{}",
        counted.stdout_tail
    );

    let short = run_job(
        &nats,
        "count-short",
        &format!(
            "version: v1\njob:\n  name: count-short\n  exec:\n    type: line-count\n    with: {{ path: {}, min_lines: 10 }}\n",
            data.display()
        ),
    )
    .await;
    assert_eq!((short.state, short.tag), (State::Failed, Tag::Rejected));
    assert!(short.message.contains("fewer than 10"), "{}", short.message);

    let refused = run_job(
        &nats,
        "count-nothing",
        "version: v1\njob:\n  name: count-nothing\n  exec: { type: line-count, with: {} }\n",
    )
    .await;
    assert_eq!(
        (refused.state, refused.tag),
        (State::Failed, Tag::ExecutorError)
    );
    assert!(
        refused.message.contains("exec.with.path"),
        "{}",
        refused.message
    );

    let crashed = run_job(
        &nats,
        "crash",
        "version: v1\njob:\n  name: crash\n  exec: { type: crasher }\n",
    )
    .await;
    assert_eq!(
        (crashed.state, crashed.tag),
        (State::Failed, Tag::ExecutorError)
    );
    assert!(
        crashed.message.contains("killed by signal"),
        "{}",
        crashed.message
    );
    assert!(crashed.stderr_tail.contains("about to fall over"));

    let babbled = run_job(
        &nats,
        "babble",
        "version: v1\njob:\n  name: babble\n  exec: { type: babbler }\n",
    )
    .await;
    assert_eq!(
        (babbled.state, babbled.tag),
        (State::Failed, Tag::ExecutorError)
    );
    assert!(babbled.message.contains("no valid"), "{}", babbled.message);

    // The worker is unharmed.
    let again = run_job(
        &nats,
        "count",
        &format!(
            "version: v1\njob:\n  name: count\n  exec:\n    type: line-count\n    with: {{ path: {} }}\n",
            data.display()
        ),
    )
    .await;
    assert_eq!(again.state, State::Success);

    // `ax executors` lists the plugins that described themselves, not the others.
    let listed = ax(&nats.url(), &["executors", "--json"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let docs: serde_json::Value = serde_json::from_str(&stdout(&listed)).unwrap();
    let names: Vec<(String, String)> = docs[0]["executors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for expected in ["line-count", "crasher", "babbler"] {
        assert!(
            names.contains(&(expected.to_string(), "plugin".to_string())),
            "{names:?}"
        );
    }
    for builtin in ["shell", "http", "python", "sql", "noop"] {
        assert!(
            names.contains(&(builtin.to_string(), "builtin".to_string())),
            "{names:?}"
        );
    }
    assert!(!names.iter().any(|(n, _)| n == "mute"), "{names:?}");
    assert_eq!(names.iter().filter(|(n, _)| n == "shell").count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_go_only_to_workers_offering_their_executor() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let plugins = nats.path("plugins");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/plugins/line-count");
    std::fs::copy(&example, plugins.join("line-count")).unwrap();
    let plugin_config = nats.path("files").join("plugins.toml");
    std::fs::write(
        &plugin_config,
        format!("[worker]\nplugin_dir = \"{}\"\n", plugins.display()),
    )
    .unwrap();
    let _core = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let _plain = AxProcess::node(&nats, "plain", "worker", &[]);
    let data = nats.path("files").join("data.txt");
    std::fs::write(&data, "one\n").unwrap();
    apply_job(
        &nats,
        "count",
        &format!(
            "version: v1\njob:\n  name: count\n  exec:\n    type: line-count\n    with: {{ path: {} }}\n",
            data.display()
        ),
    )
    .await;
    // Nobody offers line-count yet: the instance waits, it does not fail.
    let waiting = trigger(&nats, &["count"]);
    wait_for(Duration::from_secs(20), "the no_worker tag", || async {
        client
            .instance(&support::id(&waiting))
            .await
            .ok()
            .flatten()
            .filter(|(r, _)| r.tag == Tag::NoWorker && r.state == State::Running)
    })
    .await;
    let _plugged = AxProcess::node(
        &nats,
        "plugged",
        "worker",
        &["--config", plugin_config.to_str().unwrap()],
    );
    let ran = final_record(&client, &waiting, Duration::from_secs(30)).await;
    assert_eq!(
        (ran.state, ran.worker.as_deref()),
        (State::Success, Some("plugged")),
        "{}",
        ran.message
    );
    // With both workers alive, every line-count instance still goes to the one offering it.
    let ids: Vec<String> = (0..6).map(|_| trigger(&nats, &["count"])).collect();
    for id in ids {
        let record = final_record(&client, &id, Duration::from_secs(30)).await;
        assert_eq!(
            (record.state, record.worker.as_deref()),
            (State::Success, Some("plugged"))
        );
    }
}
