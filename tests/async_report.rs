//! Asynchronous reports: an http endpoint answers `202 Accepted` and the business reports the
//! end later; a second report is ignored, a stale or unknown one refused, and no report ends
//! the attempt at its timeout.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ax_bus::messages::{ControlReply, ReportRequest};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use support::*;

/// An endpoint that accepts every POST with a 202 and keeps the trace ids it was sent.
struct Accepting {
    url: String,
    traces: Arc<Mutex<Vec<String>>>,
}

impl Accepting {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/work", listener.local_addr().unwrap());
        let traces: Arc<Mutex<Vec<String>>> = Arc::default();
        let kept = traces.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let kept = kept.clone();
                tokio::spawn(async move {
                    let Some((_, body)) = read_request(&mut socket).await else {
                        return;
                    };
                    let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                    if let Some(trace) = body["traceId"].as_str() {
                        kept.lock().unwrap().push(trace.to_string());
                    }
                    let reply = r#"{"accepted": true}"#;
                    let answer = format!(
                        "HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}",
                        reply.len()
                    );
                    let _ = socket.write_all(answer.as_bytes()).await;
                });
            }
        });
        Self { url, traces }
    }

    /// The trace of the `n`th request (from 1) once it came.
    async fn trace(&self, n: usize) -> ax_bus::ids::TraceId {
        let trace = wait_for(
            Duration::from_secs(60),
            "the endpoint's request",
            || async { self.traces.lock().unwrap().get(n - 1).cloned() },
        )
        .await;
        trace.parse().unwrap()
    }
}

fn job(name: &str, url: &str, timeout: u32) -> String {
    format!(
        "version: v1\njob:\n  name: {name}\n  timeout: {timeout}\n  exec: {{ type: http, url: '{url}' }}\n"
    )
}

async fn report(
    client: &ax_bus::AxClient,
    trace: &ax_bus::ids::TraceId,
    success: bool,
    message: &str,
) -> ControlReply {
    // The reply as the wire has it, refusals too.
    client
        .send_raw(
            ax_bus::messages::commands::Command::Report,
            &ReportRequest {
                trace_id: trace.clone(),
                success,
                message: message.into(),
                output: serde_json::json!({"rows": 3}),
            },
            Duration::from_secs(30),
        )
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_attempt_ends_with_its_first_report_or_its_timeout() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    let endpoint = Accepting::start().await;
    apply_job(&nats, "accepts", &job("accepts", &endpoint.url, 300)).await;
    apply_job(&nats, "forgets", &job("forgets", &endpoint.url, 2)).await;

    // Accepted: the attempt stays executing until the report, which ends it; a second report
    // of the same trace is ignored, saying so.
    let id = trigger(&nats, &["accepts"]);
    let trace = endpoint.trace(1).await;
    let waiting = executing(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(waiting.trace_id, trace);
    let first = report(&client, &trace, true, "loaded 3 rows").await;
    assert!(first.ok, "{:?}", first.errors);
    assert_eq!(first.message, "reported");
    let done = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(
        (done.state, done.tag, done.message.as_str()),
        (
            ax_bus::State::Success,
            ax_bus::Tag::Completed,
            "loaded 3 rows"
        )
    );
    assert_eq!(done.output, serde_json::json!({"rows": 3}));
    let second = report(&client, &trace, false, "again").await;
    assert!(second.ok, "{:?}", second.errors);
    assert!(second.message.starts_with("already reported"), "{second:?}");
    let after = final_record(&client, &id, Duration::from_secs(5)).await;
    assert_eq!((after.state, after.attempt), (ax_bus::State::Success, 1));
    let result = results_of(&client, "accepts").await;
    assert_eq!(result.len(), 1);
    assert_eq!(result[0].message, "loaded 3 rows");

    // A reported failure ends the attempt failed, tag rejected: here an operator's, by
    // instance id from the CLI (its current attempt's trace).
    let id = trigger(&nats, &["accepts", "--key", "fails"]);
    endpoint.trace(2).await;
    let out = ax(
        &nats.url(),
        &[
            "instance",
            "report",
            &id,
            "--failed",
            "--message",
            "the file was empty",
            "--output",
            r#"{"rows": 0}"#,
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), format!("{id} (reported)"));
    let failed = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(failed.output, serde_json::json!({"rows": 0}));
    assert_eq!(
        (failed.state, failed.tag),
        (ax_bus::State::Failed, ax_bus::Tag::Rejected)
    );
    assert_eq!(failed.message, "reported failed: the file was empty");

    // The same trace reported again, now from the CLI: ignored, and the record stays.
    let again = ax(&nats.url(), &["instance", "report", &id, "--success"]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        stdout(&again).contains("already reported"),
        "{}",
        stdout(&again)
    );
    let still = final_record(&client, &id, Duration::from_secs(5)).await;
    assert_eq!(still.state, ax_bus::State::Failed);

    // No report: the attempt ends at its timeout, and a report after that is stale.
    let id = trigger(&nats, &["forgets"]);
    let trace = endpoint.trace(3).await;
    let timed_out = final_record(&client, &id, Duration::from_secs(60)).await;
    assert_eq!(
        (timed_out.state, timed_out.tag),
        (ax_bus::State::Failed, ax_bus::Tag::Timeout)
    );
    assert!(
        timed_out.message.contains("no report within 2s"),
        "{}",
        timed_out.message
    );
    let late = report(&client, &trace, true, "late").await;
    assert!(!late.ok);
    assert!(
        late.errors[0].starts_with("stale trace id") && late.errors[0].contains("timeout"),
        "{late:?}"
    );

    // A trace no attempt of ax has.
    let unknown = report(&client, &ax_bus::ids::TraceId::random(), true, "?").await;
    assert!(!unknown.ok);
    assert!(
        unknown.errors[0].starts_with("unknown trace id"),
        "{unknown:?}"
    );
    // A report that does not decode says where.
    let bad = client
        .send_raw(
            ax_bus::messages::commands::Command::Report,
            &serde_json::json!({"trace_id": "not-a-trace", "success": true}),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(!bad.ok);
    assert!(bad.errors[0].contains("trace"), "{bad:?}");
    let forgotten = final_record(&client, &id, Duration::from_secs(5)).await;
    assert_eq!(
        forgotten.state,
        ax_bus::State::Failed,
        "{}",
        node.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_awaited_across_a_nats_restart_still_ends_the_attempt() {
    let mut nats = TestNats::start();
    let client = nats.client().await;
    let node = AxProcess::node(&nats, "n1", "all", &[]);
    let endpoint = Accepting::start().await;
    apply_job(&nats, "accepts", &job("accepts", &endpoint.url, 300)).await;
    let id = trigger(&nats, &["accepts"]);
    let trace = endpoint.trace(1).await;
    nats.server.restart().unwrap();
    // The report goes through once everything has reconnected (a command sent meanwhile may
    // find no stream yet: sent again, which a report allows — the second is ignored).
    let reply = wait_for(Duration::from_secs(60), "the report taken", || async {
        client
            .report(
                &ReportRequest {
                    trace_id: trace.clone(),
                    success: true,
                    message: "after the restart".into(),
                    output: serde_json::Value::Null,
                },
                Duration::from_secs(5),
            )
            .await
            .ok()
    })
    .await;
    assert!(
        reply.message == "reported" || reply.message.starts_with("already reported"),
        "{reply:?}"
    );
    let done = final_record(&client, &id, Duration::from_secs(60)).await;
    assert_eq!(
        (done.state, done.message.as_str(), done.attempt),
        (ax_bus::State::Success, "after the restart", 1),
        "{}",
        node.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_while_awaiting_a_report_makes_its_trace_stale() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _control = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let mut worker = AxProcess::node(&nats, "w1", "worker", &[]);
    let endpoint = Accepting::start().await;
    apply_job(&nats, "accepts", &job("accepts", &endpoint.url, 300)).await;
    let id = trigger(&nats, &["accepts"]);
    let first = endpoint.trace(1).await;
    worker.kill9();
    // Back at once: it finds its own claim on an attempt that may have had its effect, so the
    // attempt is lost and a new one (a new trace) is sent to the endpoint.
    let _again = AxProcess::node(&nats, "w1", "worker", &[]);
    let second = endpoint.trace(2).await;
    assert_ne!(first, second);
    let stale = report(&client, &first, true, "from the first request").await;
    assert!(!stale.ok);
    assert!(
        stale.errors[0].starts_with("stale trace id") && stale.errors[0].contains("attempt 2"),
        "{stale:?}"
    );
    let taken = report(&client, &second, true, "from the second request").await;
    assert!(taken.ok, "{:?}", taken.errors);
    let done = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(
        (done.state, done.attempt, done.message.as_str()),
        (ax_bus::State::Success, 2, "from the second request")
    );
}
