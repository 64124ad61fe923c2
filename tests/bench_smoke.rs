//! `ax bench --quick` runs on its own nats-server and prints sane, non-zero figures (the
//! figures themselves are for docs/benchmarks.md, measured on a release build, not for a test).

use crate::support;

use support::*;

/// `ax bench --quick --only SECTIONS`: its figures, each section present and every figure sane.
fn quick_bench(sections: &[&str]) -> Vec<serde_json::Value> {
    let out = std::process::Command::new(ax_binary())
        .args(["bench", "--quick", "--json", "--only", &sections.join(",")])
        .env_remove("AX_NATS_URL")
        // Its progress goes to the test's own output: a slow section shows as it runs.
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run ax bench");
    assert!(
        out.status.success(),
        "ax bench failed (its output is above)"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert!(report["nats_server"].as_str().unwrap().contains("2.15.1"));
    assert_eq!(report["quick"], true);
    let figures = report["figures"].as_array().unwrap().clone();
    for section in sections.iter().chain(&["limit"]) {
        assert!(
            figures.iter().any(|f| f["section"] == *section),
            "no {section} figure"
        );
    }
    for figure in &figures {
        let value = figure["value"].as_f64().unwrap();
        // Pending delayed instances may cost the Scheduler nothing at all; what metrics cost
        // is a difference of two rates, within the noise of either sign.
        let any_sign = figure["name"] == "cost of metrics";
        let may_be_zero = figure["name"] == "memory per pending delayed instance";
        assert!(
            value.is_finite() && (value > 0.0 || any_sign || may_be_zero && value == 0.0),
            "{figure}"
        );
    }
    figures
}

#[test]
fn quick_bench_prints_sane_figures() {
    // Every section in one process: two at once load a 2-core machine running the suite more
    // than the time it saves.
    let figures = quick_bench(&[
        "memory",
        "wire",
        "throughput",
        "triggers",
        "routing",
        "concurrency",
        "cgroups",
        "lateness",
        "dag",
        "recovery",
        "scale",
        "cluster",
        "console",
        "history",
    ]);
    // The cluster section names the busiest of its three servers and the leader of each
    // written stream.
    let cluster: Vec<&serde_json::Value> = figures
        .iter()
        .filter(|f| f["section"] == "cluster")
        .collect();
    assert!(
        cluster.iter().any(|f| f["name"]
            .as_str()
            .unwrap()
            .starts_with("three servers: the busiest, c")),
        "{cluster:?}"
    );
    assert!(
        cluster.iter().any(|f| {
            f["name"]
                .as_str()
                .unwrap()
                .contains("writes per instance to KV_clthree_instances")
                && f["note"].as_str().unwrap().contains("led by c")
        }),
        "{cluster:?}"
    );
    // The messages of an instance, by kind, add up to their total, for a job's first fire and
    // for a later one; a later one reads no definition, and no no-op attempt writes a claim
    // (its start is fenced by its record; a claim is written by the first lease renewal). The
    // consistency sweep reads the record writes by their headers once they are 15 s old — after
    // a quick run's windows, so it is not counted here (`router::aged_writes`'s test holds that
    // it reads headers only, once each); a delivery of the instances bucket seen (one of its
    // snapshot) carries no record (about 700 bytes when it did). A later fire's writes made
    // together are answered as batches.
    for which in ["first", "later"] {
        let wire: Vec<&serde_json::Value> =
            figures.iter().filter(|f| f["section"] == "wire").collect();
        let start = wire
            .iter()
            .position(|f| f["name"].as_str().unwrap().starts_with(which))
            .unwrap();
        let kinds: Vec<&serde_json::Value> = wire[start..]
            .iter()
            .take_while(|f| f["name"].as_str().unwrap().starts_with(which))
            .filter(|f| f["unit"] == "msg")
            .copied()
            .collect();
        let by_kind: f64 = kinds.iter().map(|f| f["value"].as_f64().unwrap()).sum();
        let total = wire[start - 1]["value"].as_f64().unwrap();
        assert!((by_kind - total).abs() < 0.01, "{which}: {kinds:?}");
        assert!(
            !kinds
                .iter()
                .any(|f| f["name"].as_str().unwrap().ends_with("kv write claims")),
            "{kinds:?}"
        );
        let sweep = kinds
            .iter()
            .find(|f| f["name"] == format!("{which} fire: delivery (KV_wire_instances)"));
        if let Some(sweep) = sweep {
            let bytes: f64 = sweep["note"]
                .as_str()
                .and_then(|note| note.split(", ").nth(1))
                .and_then(|b| b.strip_suffix(" B per instance"))
                .and_then(|b| b.parse().ok())
                .unwrap_or_else(|| panic!("{sweep}"));
            // Per delivery, not per instance: each about 200 bytes of headers; one carrying a
            // record would be about 700 bytes more.
            let deliveries = sweep["value"].as_f64().unwrap_or(0.0).max(1.0);
            assert!(bytes / deliveries < 250.0, "{sweep}");
        }
        if which == "later" {
            assert!(
                !kinds
                    .iter()
                    .any(|f| f["name"] == "later fire: kv read jobs"),
                "{kinds:?}"
            );
            // Six writes would be answered one by one without bursts (the acknowledgements to
            // the Router gathered); the hand-offs and the results go in fast-ingest batches,
            // answered every so many messages, and the notes of the records' ends for their
            // retention share a message among the ends reported together (4.7–4.8), and a
            // job nothing depends on has no deps entry per instance.
            let answers = kinds
                .iter()
                .find(|f| f["name"] == "later fire: answer (publish ack, kv result, reply)")
                .unwrap_or_else(|| panic!("{kinds:?}"));
            assert!(answers["value"].as_f64().unwrap() < 5.6, "{answers}");
            assert!(
                !kinds
                    .iter()
                    .any(|f| f["name"] == "later fire: kv write deps"),
                "{kinds:?}"
            );
        }
    }
}
