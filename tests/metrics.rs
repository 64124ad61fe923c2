//! Metrics as an operator gets them: a real Prometheus (Debian's `prometheus`, installed by
//! `.ci/run`) scrapes an `ax up`, and its query API returns the counts of what ran; `promtool
//! check metrics` accepts the text.

use crate::support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::up::up;
use support::*;

/// A `prometheus` server of the test's own, killed on drop.
struct Prometheus {
    child: Child,
    port: u16,
}

impl Prometheus {
    /// Scrapes `target` (`host:port`) every second, keeping its data in `dir`.
    fn start(dir: &Path, target: &str) -> Self {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  \
                 - job_name: ax\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus (Debian's package `prometheus`; .ci/run installs it)");
        Self { child, port }
    }

    /// The value of an instant `query` (a single number), if it has one yet.
    async fn value(&self, query: &str) -> Option<f64> {
        let url = format!("http://127.0.0.1:{}/api/v1/query", self.port);
        let answer: serde_json::Value = reqwest::Client::new()
            .get(url)
            .query(&[("query", query)])
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        answer["data"]["result"][0]["value"][1]
            .as_str()?
            .parse()
            .ok()
    }
}

/// The metric names (`ax_…`, `process_…`) an expression text uses.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for (start, _) in text
        .match_indices("ax_")
        .chain(text.match_indices("process_"))
    {
        let before = text[..start].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = text[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let name = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(&name)
            .to_string();
        names.insert(name);
    }
    names
}

/// `promtool check rules` and the rules' unit tests (`promtool test rules`) on what ships.
#[test]
fn the_shipped_alert_rules_are_valid_and_fire_when_they_should() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/prometheus");
    for args in [
        ["check", "rules", "ax-rules.yml"],
        ["test", "rules", "ax-rules.test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("promtool (Debian's package `prometheus`)");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_counts_of_what_ran() {
    let dir = tempfile::tempdir().unwrap();
    let ax_up = up(dir.path()).await;
    let up = &ax_up;
    let url = up.nats.clone();
    let http_port: &str = up.http.rsplit(':').next().unwrap();
    // `ax up` names the endpoint last, after the NATS url that `up` waits for.
    let named = format!("metrics: http://127.0.0.1:{http_port}/metrics");
    wait_for_logged(
        Duration::from_secs(30),
        "ax up to name its metrics endpoint",
        &[&up.process],
        || async { up.process.log_text().contains(&named).then_some(()) },
    )
    .await;
    let jobs = dir.path().join("jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    for (name, rest) in [
        ("fine", "  exec: { type: shell, command: 'true' }\n"),
        ("broken", "  exec: { type: shell, command: 'exit 3' }\n"),
        (
            "stuck",
            "  timeout: 1\n  on_timeout: { grace: 1 }\n  exec: { type: shell, command: 'sleep 60' }\n",
        ),
    ] {
        std::fs::write(
            jobs.join(format!("{name}.yaml")),
            format!("version: v1\njob:\n  name: {name}\n{rest}"),
        )
        .unwrap();
    }
    let out = ax(&url, &["job", "apply", "-f", jobs.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let client = ax_bus::AxClient::connect(&ax_bus::client::ConnectConfig::new(&url, "ax-test"))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for job in ["fine", "fine", "fine", "broken", "broken", "stuck"] {
        let out = ax(&url, &["job", "trigger", job]);
        assert!(out.status.success(), "{}", stderr(&out));
        ids.push(stdout(&out).split_whitespace().next().unwrap().to_string());
    }
    for id in &ids {
        final_record(&client, id, Duration::from_secs(60)).await;
    }
    // The health summary counts them, from the day's summary the coordinator keeps.
    let status = wait_for(
        Duration::from_secs(30),
        "the day's summary to hold the six",
        || async {
            let out = ax(&url, &["status", "--json"]);
            let status: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            (status["day"]["finished"] == 6).then_some(status)
        },
    )
    .await;
    let day = &status["day"];
    assert_eq!(
        (&day["succeeded"], &day["failed"], &day["cancelled"]),
        (
            &serde_json::json!(3),
            &serde_json::json!(3),
            &serde_json::json!(0)
        ),
        "{status:#}"
    );
    assert_eq!(
        day["failures_by_job"],
        serde_json::json!({"broken": 2, "stuck": 1}),
        "{status:#}"
    );
    assert_eq!(day["longest"]["job"], "stuck", "{status:#}");
    assert_eq!(day["latency_count"], 6, "{status:#}");
    assert_eq!(status["workers_live"], 1, "{status:#}");
    assert_eq!(status["nodes"], serde_json::json!(["local"]), "{status:#}");
    assert_eq!(status["alerts_last_hour"]["timeout"], 1, "{status:#}");
    // The same summary over HTTP, as the console's dashboard reads it; a bad date is a 400
    // naming the field.
    let api: serde_json::Value =
        reqwest::get(format!("http://127.0.0.1:{http_port}/api/v1/status"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    assert_eq!(api["day"], status["day"], "{api:#}");
    let bad = reqwest::get(format!(
        "http://127.0.0.1:{http_port}/api/v1/status?date=2026-13-01"
    ))
    .await
    .unwrap();
    assert_eq!(bad.status(), 400);
    let reason: serde_json::Value = bad.json().await.unwrap();
    assert!(
        reason["error"]
            .as_str()
            .unwrap()
            .starts_with("date: `2026-13-01`"),
        "{reason}"
    );
    // An instance and its history over HTTP, as `ax instance get|history --json` print them;
    // an unknown or malformed id answered with the field and the reason.
    let get = |path: String| async move {
        let response = reqwest::get(format!("http://127.0.0.1:{http_port}{path}"))
            .await
            .unwrap();
        let code = response.status().as_u16();
        (code, response.json::<serde_json::Value>().await.unwrap())
    };
    let broken = &ids[3];
    let (code, record) = get(format!("/api/v1/instances/{broken}")).await;
    assert_eq!(
        (code, record["state"].as_str()),
        (200, Some("failed")),
        "{record}"
    );
    let cli: serde_json::Value =
        serde_json::from_slice(&ax(&url, &["instance", "get", broken, "--json"]).stdout).unwrap();
    assert_eq!(record, cli);
    let (code, history) = get(format!("/api/v1/instances/{broken}/history")).await;
    assert_eq!(code, 200);
    let steps: Vec<&str> = history["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_str().unwrap())
        .collect();
    assert_eq!(
        steps,
        [
            "created",
            "dispatched",
            "claimed",
            "started",
            "ended",
            "reported"
        ],
        "{history:#}"
    );
    let (code, error) = get("/api/v1/instances/fine.20260101T000000000Z".into()).await;
    assert_eq!(code, 404);
    let missing = error["error"].as_str().unwrap_or_default();
    assert!(
        missing.starts_with("id: no instance `fine.20260101T000000000Z`: none was made"),
        "{missing}"
    );
    let (code, error) = get("/api/v1/instances/no%20such%20id".into()).await;
    assert_eq!(code, 400);
    assert!(
        error["error"].as_str().unwrap().starts_with("id: "),
        "{error}"
    );
    let out = ax(&url, &["status"]);
    assert!(
        stdout(&out).contains("top failing jobs  broken (2), stuck (1) (failed endings)"),
        "{}",
        stdout(&out)
    );
    // Durations as people read them, saying what the average counts.
    let latency = stdout(&out)
        .lines()
        .find(|l| l.starts_with("trigger latency"))
        .unwrap_or_default()
        .to_string();
    assert!(
        latency.ends_with(
            "on average (first attempts, from when each became due; backfills left out)"
        ) && (latency.contains(" ms ") || latency.contains(" s ")),
        "{latency}"
    );
    // What the node serves is valid Prometheus text.
    let text = reqwest::get(format!("http://127.0.0.1:{http_port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's package `prometheus`)");
    std::io::Write::write_all(promtool.stdin.as_mut().unwrap(), text.as_bytes()).unwrap();
    let checked = promtool.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool: {}{}\n{text}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    // The shipped alert rules and dashboard ask only for what a node serves.
    for file in ["config/prometheus/ax-rules.yml", "config/grafana/ax.json"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let shipped = std::fs::read_to_string(&path).unwrap();
        for name in metric_names(&shipped) {
            let served = ["", "_bucket", "_count", "_sum"]
                .iter()
                .any(|suffix| text.contains(&format!("\n{name}{suffix}")));
            assert!(served, "{file} uses {name}, which no node serves");
        }
    }
    // A real Prometheus scrapes it and counts what ran.
    let prometheus = Prometheus::start(dir.path(), &format!("127.0.0.1:{http_port}"));
    for (query, expected) in [
        (r#"sum(ax_attempts_finished_total{outcome="success"})"#, 3.0),
        (r#"sum(ax_attempts_finished_total{outcome="failure"})"#, 3.0),
        (r#"sum(ax_attempts_finished_total{tag="exit_code"})"#, 2.0),
        (r#"sum(ax_attempts_finished_total{tag="timeout"})"#, 1.0),
        ("ax_execution_duration_seconds_count", 6.0),
        ("ax_trigger_latency_seconds_count", 6.0),
        ("ax_dispatch_to_ack_seconds_count", 6.0),
        (r#"ax_queue_pending{queue="delayed"}"#, 0.0),
        ("ax_outbox_unreported", 0.0),
        ("ax_workers_live", 1.0),
        (r#"ax_backlog_workers{priority="normal"}"#, 1.0),
        ("ax_data_dir_bytes > bool 0", 1.0),
        (
            "ax_node_disk_total_bytes >= bool ax_node_disk_free_bytes",
            1.0,
        ),
        ("ax_node_memory_total_bytes > bool 0", 1.0),
        // The attempts ran in cgroups: what they used is counted per job.
        ("sum(ax_attempt_cpu_seconds_count) > bool 0", 1.0),
        ("sum(ax_attempt_peak_memory_bytes_count) > bool 0", 1.0),
        (r#"ax_build_info{version!=""}"#, 1.0),
        (r#"ax_actor_panics_total{actor="scheduler"}"#, 0.0),
        ("ax_partitions_owned", 128.0),
        (r#"ax_partition_handovers_total{kind="taken"}"#, 128.0),
    ] {
        wait_for(
            Duration::from_secs(60),
            &format!("Prometheus to answer {query} = {expected}"),
            || async { (prometheus.value(query).await == Some(expected)).then_some(()) },
        )
        .await;
    }
    let fires = prometheus
        .value("ax_fire_lateness_seconds_count")
        .await
        .unwrap_or(0.0);
    assert!(fires >= 6.0, "every trigger's creation counted: {fires}");
}
