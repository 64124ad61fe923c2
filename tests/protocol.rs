//! The wire protocol as a client in another language meets it: a plain NATS request gets the
//! command's answer in the request's encoding, and instants keep their milliseconds.

use crate::support;

use std::time::Duration;

use support::*;

/// How many instances of `ping` triggers made: its cron may fire before the pause sent right
/// after its apply is carried out, on a loaded machine.
async fn triggered(client: &ax_bus::AxClient) -> usize {
    instances(client, "ping")
        .await
        .iter()
        .filter(|r| r.trigger != ax_bus::instance::Trigger::Cron)
        .count()
}

const PING: &str = "version: v1
job:
  name: ping
  cron: '* * * * * *'
  exec: { type: noop }
";

/// A plain NATS request on `subject` with `content_type`, as `nc.request()` sends it, once a
/// Scheduler serves the subject.
async fn request(
    client: &ax_bus::AxClient,
    subject: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> async_nats::Message {
    let mut headers = async_nats::HeaderMap::new();
    if let Some(content_type) = content_type {
        headers.insert("Content-Type", content_type);
    }
    wait_for(Duration::from_secs(30), "an answer", || async {
        match client
            .nats
            .request_with_headers(subject.to_string(), headers.clone(), body.clone().into())
            .await
        {
            Ok(answer) => Some(answer),
            Err(e) if e.kind() == async_nats::client::RequestErrorKind::NoResponders => None,
            Err(e) => panic!("request on {subject}: {e}"),
        }
    })
    .await
}

fn content_type(message: &async_nats::Message) -> Option<String> {
    message
        .headers
        .as_ref()
        .and_then(|h| h.get("Content-Type"))
        .map(|v| v.as_str().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_request_gets_the_commands_answer_in_its_own_encoding() {
    let nats = TestNats::start();
    let client = nats.client().await;
    // With no Scheduler running, nobody answers a plain request (the durable way waits).
    let nobody = client
        .nats
        .request("ax.request.trigger".to_string(), "{}".into())
        .await
        .expect_err("no Scheduler, no answer");
    assert_eq!(
        nobody.kind(),
        async_nats::client::RequestErrorKind::NoResponders
    );
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(&nats, "ping", PING).await;

    // On the control subject, a plain request's answer is the stream's ack (the durable way
    // answers on Ax-Reply-To instead): what a client meets if it picks the wrong subject.
    let ack = request(
        &client,
        "ax.control.pause",
        Some("application/json"),
        br#"{"name": "ping"}"#.to_vec(),
    )
    .await;
    let ack: serde_json::Value = serde_json::from_slice(&ack.payload).unwrap();
    assert_eq!(ack["stream"], "AX_CONTROL", "{ack}");

    // On the request subject: the command's answer, in JSON for JSON (a charset is fine).
    let answer = request(
        &client,
        "ax.request.trigger",
        Some("application/json; charset=utf-8"),
        br#"{"name": "ping", "key": "order-1"}"#.to_vec(),
    )
    .await;
    assert_eq!(content_type(&answer).as_deref(), Some("application/json"));
    let reply: serde_json::Value = serde_json::from_slice(&answer.payload).unwrap();
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(reply["instance_id"], "ping.key-order-1", "{reply}");
    assert_eq!(reply["message"], "triggered", "{reply}");

    // In MessagePack for MessagePack (or no Content-Type), the same instance, once.
    let again = ax_bus::codec::encode(&serde_json::json!({"name": "ping", "key": "order-1"}))
        .unwrap()
        .to_vec();
    let answer = request(&client, "ax.request.trigger", None, again).await;
    assert_eq!(
        content_type(&answer).as_deref(),
        Some("application/msgpack")
    );
    let reply: ax_bus::messages::ControlReply = ax_bus::codec::decode(&answer.payload).unwrap();
    assert!(reply.ok, "{:?}", reply.errors);
    assert_eq!(reply.message, "already triggered");
    assert_eq!(triggered(&client).await, 1);

    // Two requests with one `Nats-Msg-Id`: JetStream keeps one command, and the repeat gets
    // that command's answer — the same instance — instead of none.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Content-Type", "application/json");
    headers.insert("Nats-Msg-Id", "order-7");
    let mut replies = Vec::new();
    for _ in 0..2 {
        let answer = client
            .nats
            .request_with_headers(
                "ax.request.trigger".to_string(),
                headers.clone(),
                br#"{"name": "ping"}"#.to_vec().into(),
            )
            .await
            .expect("an answer to each request");
        let reply: serde_json::Value = serde_json::from_slice(&answer.payload).unwrap();
        assert_eq!(reply["ok"], true, "{reply}");
        replies.push(reply["instance_id"].as_str().unwrap().to_string());
    }
    assert_eq!(replies[0], replies[1]);
    assert_eq!(triggered(&client).await, 2);

    // A refusal is an answer too, naming the reason; nothing is created.
    let answer = request(
        &client,
        "ax.request.trigger",
        Some("application/json"),
        br#"{"name": "nope"}"#.to_vec(),
    )
    .await;
    let reply: serde_json::Value = serde_json::from_slice(&answer.payload).unwrap();
    assert_eq!(reply["ok"], false, "{reply}");
    assert!(
        reply["errors"][0].as_str().unwrap().contains("nope"),
        "{reply}"
    );
    let answer = request(
        &client,
        "ax.request.trigger",
        Some("text/plain"),
        b"ping".to_vec(),
    )
    .await;
    let reply: ax_bus::messages::ControlReply = ax_bus::codec::decode(&answer.payload).unwrap();
    assert!(
        reply.errors.iter().any(|e| e.contains("text/plain")),
        "{reply:?}"
    );
    assert_eq!(triggered(&client).await, 2);

    // A request the control stream does not take (here its headers expect another stream) is
    // answered at once with the reason, and nothing is carried out.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Content-Type", "application/json");
    headers.insert("Nats-Expected-Stream", "ELSEWHERE");
    let answer = client
        .nats
        .request_with_headers(
            "ax.request.trigger".to_string(),
            headers,
            br#"{"name": "ping", "key": "order-2"}"#.to_vec().into(),
        )
        .await
        .expect("an answer");
    let reply: serde_json::Value = serde_json::from_slice(&answer.payload).unwrap();
    assert_eq!(reply["ok"], false, "{reply}");
    let why = reply["errors"][0].as_str().unwrap();
    assert!(why.contains("not queued"), "{reply}");
    assert_eq!(triggered(&client).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instants_keep_their_milliseconds_on_a_whole_second() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    apply_job(&nats, "ping", PING).await;
    // A cron tick is a whole second: its record's expected time, read as any client reads it
    // (the raw MessagePack of the instances bucket), and the result message.
    let record = wait_for(Duration::from_secs(30), "a fired record", || async {
        instances(&client, "ping")
            .await
            .into_iter()
            .find(|r| r.state.is_final())
    })
    .await;
    let js = &client.js;
    let bucket = js.get_key_value("ax_instances").await.unwrap();
    let raw = bucket
        .get(record.instance_id.as_str())
        .await
        .unwrap()
        .unwrap();
    let raw: serde_json::Value = rmp_serde::from_slice(&raw).unwrap();
    let expected = raw["expected_time"].as_str().unwrap();
    assert!(expected.ends_with(".000Z"), "{raw}");
    for field in ["created_at", "started_at", "finished_at"] {
        let at = raw[field].as_str().unwrap_or_default();
        assert!(
            at.len() == "2026-12-01T14:03:05.250Z".len() && at.ends_with('Z'),
            "{field}: {raw}"
        );
    }
    let out = ax(
        &nats.url(),
        &["instance", "get", record.instance_id.as_str(), "--json"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let shown: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(shown["expected_time"], expected, "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_files_text_is_applied_as_sent_and_its_problems_name_the_line() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let apply = |yaml: &str| serde_json::to_vec(&serde_json::json!({ "yaml": yaml })).unwrap();
    let bad = "version: v1\njob:\n  name: nightly\n  cron: '0 61 * * *'\n  exec: { type: noop }\n";
    let answer = request(
        &client,
        "ax.request.apply",
        Some("application/json"),
        apply(bad),
    )
    .await;
    let reply: serde_json::Value = serde_json::from_slice(&answer.payload).unwrap();
    assert_eq!(reply["ok"], false, "{reply}");
    let why = reply["errors"][0].as_str().unwrap();
    assert!(why.contains("job.cron"), "{reply}");
    let broken = "version: v1\njob:\n  name: nightly\n  cron: [\n";
    let answer = request(
        &client,
        "ax.request.apply",
        Some("application/json"),
        apply(broken),
    )
    .await;
    let reply: serde_json::Value = serde_json::from_slice(&answer.payload).unwrap();
    assert!(
        reply["errors"][0].as_str().unwrap().starts_with("yaml:"),
        "{reply}"
    );
    assert!(client.jobs().await.unwrap().is_empty());
    let good = format!("{}---\n{}", PING, bad.replace("61", "5"));
    let answer = request(
        &client,
        "ax.request.apply",
        Some("application/json"),
        apply(&good),
    )
    .await;
    let reply: serde_json::Value = serde_json::from_slice(&answer.payload).unwrap();
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(
        reply["changes"],
        serde_json::json!([
            {"name": "ping", "change": "created"},
            {"name": "nightly", "change": "created"}
        ])
    );
}

/// The validator of `docs/schemas/<name>`, or of one of its `$defs`.
fn schema(name: &str, def: Option<&str>) -> jsonschema::Validator {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/schemas")
        .join(name);
    let mut schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    if let Some(def) = def {
        schema = serde_json::json!({
            "$schema": schema["$schema"],
            "$defs": schema["$defs"],
            "$ref": format!("#/$defs/{def}"),
        });
    }
    jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Every problem of `value` against `validator`, as lines.
fn problems(validator: &jsonschema::Validator, value: &serde_json::Value) -> Vec<String> {
    validator
        .iter_errors(value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

fn valid(name: &str, validator: &jsonschema::Validator, values: &[serde_json::Value]) {
    assert!(!values.is_empty(), "no {name} to check");
    for value in values {
        let found = problems(validator, value);
        assert!(found.is_empty(), "{name}: {found:?}\n{value:#}");
    }
}

/// Every message of `stream`, decoded as a client in another language decodes it.
async fn stream_values(client: &ax_bus::AxClient, stream: &str) -> Vec<serde_json::Value> {
    let mut stream = client.js.get_stream(stream).await.unwrap();
    let last = stream.info().await.unwrap().state.last_sequence;
    let mut all = Vec::new();
    for seq in 1..=last {
        if let Ok(message) = stream.get_raw_message(seq).await {
            all.push(rmp_serde::from_slice(&message.payload).unwrap());
        }
    }
    all
}

const TRAFFIC: &str = "version: v1
job:
  name: works
  retention: 90d
  exec: { type: shell, command: 'echo hi && printf \"{\\\"rows\\\": 3}\" > \"$AX_OUTPUT_FILE\"' }
---
version: v1
job:
  name: fails
  retry: { times: 1, interval: 1 }
  exec: { type: shell, command: 'echo nope >&2; exit 3' }
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_ax_sends_matches_the_documented_schemas() {
    use futures::StreamExt;
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &[]);
    let mut events = client.nats.subscribe("ax.event.>").await.unwrap();
    let json = |value: serde_json::Value| serde_json::to_vec(&value).unwrap();
    let mut answers = Vec::new();
    for (command, body) in [
        ("apply", json(serde_json::json!({ "yaml": TRAFFIC }))),
        (
            "trigger",
            json(serde_json::json!({"name": "works", "key": "a"})),
        ),
        ("trigger", json(serde_json::json!({"name": "fails"}))),
        (
            "trigger",
            json(serde_json::json!({"name": "works", "in": "1h"})),
        ),
        ("trigger", json(serde_json::json!({"name": "nope"}))),
        (
            "queue",
            json(serde_json::json!({"priority": "low", "paused": true})),
        ),
        (
            "rerun",
            json(serde_json::json!({"root": "works", "biz_date": "2026-11-01", "dry_run": true})),
        ),
    ] {
        let answer = request(
            &client,
            &format!("ax.request.{command}"),
            Some("application/json"),
            body,
        )
        .await;
        answers.push(serde_json::from_slice::<serde_json::Value>(&answer.payload).unwrap());
    }
    // Through the failure's retry to its end, then one more success: every kind of result.
    wait_for(
        Duration::from_secs(60),
        "the failure's second attempt",
        || async {
            let fails = instances(&client, "fails").await;
            fails
                .iter()
                .any(|r| r.state == ax_bus::State::Failed)
                .then_some(())
        },
    )
    .await;
    final_record(&client, "works.key-a", Duration::from_secs(30)).await;
    let mut seen = Vec::new();
    while let Ok(Some(event)) =
        tokio::time::timeout(Duration::from_millis(500), events.next()).await
    {
        seen.push(rmp_serde::from_slice::<serde_json::Value>(&event.payload).unwrap());
    }
    let bucket = client.js.get_key_value("ax_instances").await.unwrap();
    let mut records = Vec::new();
    let mut keys = bucket.keys().await.unwrap();
    while let Some(Ok(key)) = keys.next().await {
        let value = bucket.get(&key).await.unwrap().unwrap();
        records.push(rmp_serde::from_slice::<serde_json::Value>(&value).unwrap());
    }

    valid(
        "answer",
        &schema("control-reply.schema.json", None),
        &answers,
    );
    valid("event", &schema("instance.schema.json", None), &seen);
    valid(
        "instance record",
        &schema("instance.schema.json", None),
        &records,
    );
    let results = stream_values(&client, "AX_RESULTS").await;
    assert!(
        results.iter().any(|r| r["state"] == "waiting_retry"),
        "{results:?}"
    );
    valid("result", &schema("result.schema.json", None), &results);
    valid(
        "audit record",
        &schema("audit.schema.json", None),
        &stream_values(&client, "AX_AUDIT").await,
    );
    valid(
        "alert",
        &schema("alert.schema.json", None),
        &stream_values(&client, "AX_ALERTS").await,
    );

    // What the Rust types send as commands is what the schema says.
    let commands = "commands.schema.json";
    for (def, value) in [
        (
            "trigger",
            serde_json::json!(ax_bus::messages::TriggerRequest {
                name: job("works"),
                biz_date: Some("2026-11-01".into()),
                params: [("x".to_string(), serde_json::json!(1))].into(),
                key: Some("k-1".parse().unwrap()),
                at: None,
                delay: Some("30s".into()),
            }),
        ),
        (
            "report",
            serde_json::json!(ax_bus::messages::ReportRequest {
                trace_id: ax_bus::ids::TraceId::random(),
                success: true,
                message: "done".into(),
                output: serde_json::json!({"rows": 3}),
            }),
        ),
        (
            "queue",
            serde_json::json!(ax_bus::messages::QueueRequest {
                priority: ax_bus::spec::Priority::Low,
                paused: true,
            }),
        ),
        (
            "job_name",
            serde_json::json!(ax_bus::messages::JobNameRequest { name: job("works") }),
        ),
        (
            "instance",
            serde_json::json!(ax_bus::messages::InstanceRequest {
                instance: id("works.key-a"),
                reason: Some("not needed".into()),
                requested_by: "me@host".into(),
            }),
        ),
        (
            "apply",
            serde_json::json!(ax_bus::messages::ApplyRequest {
                jobs: Vec::new(),
                yaml: Some(TRAFFIC.into()),
            }),
        ),
    ] {
        valid(def, &schema(commands, Some(def)), &[value]);
    }

    // The schemas can fail: a whole second without its milliseconds, a field they do not know.
    let result = schema("result.schema.json", None);
    let mut bad = results[0].clone();
    bad["finished_at"] = serde_json::json!("2026-12-01T14:03:05Z");
    assert!(!problems(&result, &bad).is_empty());
    let mut extra = results[0].clone();
    extra["surprise"] = serde_json::json!(1);
    assert!(!problems(&result, &extra).is_empty());
}
