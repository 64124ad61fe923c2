//! Instance records and their retention: a final record leaves the instances bucket once its
//! retention has passed, never before; an open one (a delayed trigger due later) stays; a job's
//! own `retention` outlasts the node's; the sweep goes on after its node is killed; a record an
//! earlier version left without a note goes too; a re-run of a removed instance is refused,
//! naming the retention. The ends of instances that finish together are noted in one message.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::support;
use ax_bus::{State, Tag};
use support::*;

const KEPT_SECS: i64 = 10;
const CONFIG: &str = "[retention]\ninstances = \"10s\"\n";

/// The jobs that fire every second, all at the same instant.
const TICKS: [&str; 6] = ["tick", "tick2", "tick3", "tick4", "tick5", "tick6"];

/// Every record of the `TICKS` jobs, by id: when it ended (`None` while open).
async fn ticks(client: &ax_bus::AxClient) -> BTreeMap<String, Option<DateTime<Utc>>> {
    let mut all = BTreeMap::new();
    for name in TICKS {
        let job = name.parse().expect("a job name");
        all.extend(
            client
                .instances(Some(&job))
                .await
                .expect("list the instances")
                .into_iter()
                .map(|r| (r.instance_id.to_string(), r.finished_at)),
        );
    }
    all
}

/// The most instances one message of `AX_EXPIRY` names, of those it holds now (the janitor
/// holds each until it falls due).
async fn most_per_note(client: &ax_bus::AxClient) -> usize {
    let mut stream = client
        .js
        .get_stream(client.layout.expiry_stream())
        .await
        .expect("the expiry stream");
    let state = stream.info().await.expect("its info").state.clone();
    let mut most = 0;
    for sequence in state.first_sequence..=state.last_sequence {
        if let Ok(message) = stream.get_raw_message(sequence).await {
            most = most.max(ax_bus::client::expiry_notes::ids(&message.payload).len());
        }
    }
    most
}

/// Samples the `tick` records once a second for `seconds`: none that ended less than the
/// retention ago may be missing (never removed early). Returns the ids seen final.
async fn watch_ticks(
    client: &ax_bus::AxClient,
    seen: &mut BTreeMap<String, DateTime<Utc>>,
    seconds: u64,
) {
    for _ in 0..seconds {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = ticks(client).await;
        // A record missing from a listing was removed before the listing ended: early only if
        // the listing ended before its retention had passed.
        let asked = ax_bus::time::now();
        for (id, ended) in seen.iter() {
            let age = asked - *ended;
            assert!(
                now.contains_key(id) || age >= chrono::Duration::seconds(KEPT_SECS),
                "{id} removed {} ms after it ended, before its {KEPT_SECS} s",
                age.num_milliseconds()
            );
        }
        seen.extend(now.into_iter().filter_map(|(id, ended)| Some((id, ended?))));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_records_leave_after_their_retention_and_open_ones_stay() {
    let nats = TestNats::start();
    let client = nats.client().await;
    // A record that ended before its deployment noted ends (an earlier version wrote it).
    let earlier = earlier_record(&client).await;
    let mut core = AxProcess::configured(&nats, "core", "all", CONFIG);
    for name in TICKS {
        apply_job(
            &nats,
            name,
            &format!("version: v1\njob:\n  name: {name}\n  cron: '* * * * * *'\n  exec: {{ type: noop }}\n"),
        )
        .await;
    }
    apply_job(
        &nats,
        "kept",
        "version: v1\njob:\n  name: kept\n  retention: 1h\n  exec: { type: noop }\n",
    )
    .await;
    apply_job(
        &nats,
        "later",
        "version: v1\njob:\n  name: later\n  exec: { type: noop }\n",
    )
    .await;
    let kept = trigger(&nats, &["kept"]);
    final_record(&client, &kept, Duration::from_secs(30)).await;
    let later = trigger(&nats, &["later", "--in", "10m"]);

    let mut seen = BTreeMap::new();
    watch_ticks(&client, &mut seen, 20).await;
    let first = seen.keys().next().cloned().expect("a tick ran");
    // The ends of the instances that finished together were noted in shared messages.
    let mut most = most_per_note(&client).await;

    // The node holding the sweep dies; another takes it over and goes on.
    core.kill9();
    let _core2 = AxProcess::configured(&nats, "core2", "all", CONFIG);
    watch_ticks(&client, &mut seen, 15).await;
    most = most.max(most_per_note(&client).await);
    assert!(most > 1, "each end noted in a message of its own");

    // No record that ended more than the retention (and the sweep's delays) ago is left.
    let slack = chrono::Duration::seconds(KEPT_SECS + 3);
    let left = wait_for(
        Duration::from_secs(90),
        "the records past their retention to go",
        || async {
            let now = ax_bus::time::now();
            let left = ticks(&client).await;
            let stale = left
                .values()
                .flatten()
                .filter(|ended| now - **ended > slack)
                .count();
            (stale == 0 && !left.contains_key(&first)).then_some(left)
        },
    )
    .await;
    assert!(
        left.len() <= 2 * KEPT_SECS as usize * TICKS.len(),
        "{} tick records kept: {left:?}",
        left.len()
    );
    assert!(seen.len() > left.len(), "nothing was removed");

    // The earlier record went too: noted once by the first janitor, as ending then.
    wait_for(
        Duration::from_secs(60),
        "the earlier record to go",
        || async {
            client
                .instance(&earlier)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;

    // The job that keeps its own for an hour, and the delayed instance still waiting.
    let (kept_record, _) = client.instance(&id(&kept)).await.unwrap().expect("kept");
    assert_eq!(kept_record.state, State::Success);
    assert_eq!(kept_record.retention, Some(3600));
    let (waiting, _) = client.instance(&id(&later)).await.unwrap().expect("later");
    assert_eq!(
        (waiting.state, waiting.tag),
        (State::Running, Tag::Scheduled)
    );

    // A removed instance: the CLI and a re-run say why it is not there.
    let shown = ax(&nats.url(), &["instance", "get", &first]);
    assert!(!shown.status.success());
    assert!(
        stderr(&shown).contains("longer ago than its retention"),
        "{}",
        stderr(&shown)
    );
    let rerun = ax(&nats.url(), &["rerun", "--instance", &first]);
    assert!(!rerun.status.success());
    assert!(
        stderr(&rerun).contains("longer ago than its retention"),
        "{}",
        stderr(&rerun)
    );
    // By date: the dependency history still lists the removed instances; the plan is refused.
    let date = format!("{}-{}-{}", &first[5..9], &first[9..11], &first[11..13]);
    let by_date = ax(
        &nats.url(),
        &["rerun", "--biz-date", &date, "--root", "tick"],
    );
    assert!(!by_date.status.success());
    assert!(
        stderr(&by_date).contains("ended longer ago than their retention")
            && stderr(&by_date).contains("nothing was re-run"),
        "{}",
        stderr(&by_date)
    );
}

/// `ax history export` writes each finished instance of the span (of a job) as one JSON line:
/// its record and its history; a malformed bound is refused naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_instances_export_as_json_lines() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(
        &nats,
        "ok",
        "version: v1\njob:\n  name: ok\n  exec: { type: shell, command: 'printf \"{\\\"rows\\\": 7}\" > \"$AX_OUTPUT_FILE\"' }\n",
    )
    .await;
    apply_job(
        &nats,
        "bad",
        "version: v1\njob:\n  name: bad\n  exec: { type: shell, command: 'exit 3' }\n",
    )
    .await;
    let ids = [
        trigger(&nats, &["ok"]),
        trigger(&nats, &["ok"]),
        trigger(&nats, &["bad"]),
    ];
    for id in &ids {
        final_record(&client, id, Duration::from_secs(30)).await;
    }
    let open = trigger(&nats, &["ok", "--in", "10m"]);
    let today = ax_bus::time::now().date_naive();
    let export = |args: &[&str]| {
        let mut full = vec!["history", "export"];
        full.extend_from_slice(args);
        let out = ax(&nats.url(), &full);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
            .collect::<Vec<_>>()
    };
    let (from, to) = (
        (today - chrono::Duration::days(1)).to_string(),
        (today + chrono::Duration::days(1)).to_string(),
    );
    let all = export(&["--from", &from, "--to", &to]);
    let mut exported: Vec<&str> = all
        .iter()
        .map(|l| l["record"]["instance_id"].as_str().unwrap())
        .collect();
    exported.sort();
    let mut want: Vec<&str> = ids.iter().map(String::as_str).collect();
    want.sort();
    assert_eq!(exported, want, "the open {open} is not exported");
    for line in &all {
        let steps = line["history"].as_array().expect("a history");
        assert_eq!(steps[0]["step"], "created", "{line}");
        assert_eq!(steps.last().unwrap()["step"], "reported", "{line}");
        match line["record"]["job"].as_str() {
            Some("ok") => {
                assert_eq!(line["record"]["state"], "success");
                assert_eq!(line["record"]["output"]["rows"], 7);
            }
            _ => {
                assert_eq!(line["record"]["state"], "failed");
                assert_eq!(line["record"]["exit_code"], 3);
            }
        }
    }
    assert_eq!(
        export(&["--from", &from, "--to", &to, "--job", "ok"]).len(),
        2
    );
    let tomorrow = (today + chrono::Duration::days(1)).to_string();
    assert!(export(&["--from", &tomorrow, "--to", &tomorrow]).is_empty());
    let bad = ax(
        &nats.url(),
        &["history", "export", "--from", "last week", "--to", &to],
    );
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("--from \"last week\": "),
        "{}",
        stderr(&bad)
    );
}

/// Writes a final record as an earlier version did: its state in a header, no note of its end.
async fn earlier_record(client: &ax_bus::AxClient) -> ax_bus::ids::InstanceId {
    let spec: ax_bus::spec::JobSpec = serde_json::from_value(serde_json::json!({
        "name": "gone",
        "exec": {"type": "noop"},
    }))
    .unwrap();
    let long_ago = ax_bus::time::now() - chrono::Duration::days(400);
    let mut record = ax_bus::InstanceRecord::first(
        &spec,
        long_ago,
        long_ago.date_naive().to_string(),
        Default::default(),
        ax_bus::instance::Trigger::Manual,
        long_ago,
    );
    record.state = State::Success;
    record.finished_at = Some(long_ago);
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(ax_bus::client::record_writes::STATE_HEADER, "success");
    client
        .js
        .publish_with_headers(
            format!(
                "$KV.{}.{}",
                client.layout.instances_bucket(),
                record.instance_id
            ),
            headers,
            ax_bus::codec::encode(&record).unwrap(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    record.instance_id
}
