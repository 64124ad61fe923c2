//! The `http` executor: POSTs the attempt as JSON to `exec.url` and reads the answer.
//!
//! The body is `{"instanceId", "traceId", "job", "bizDate", "params", "attempt",
//! "expectedTime"}` (the instance id is the receiver's idempotency key: a retry or a re-run
//! carries the same one), with the spec's `exec.headers` and `Ax-Instance-Id` /
//! `Ax-Trace-Id`. A 2xx answer is a success unless `exec.success_when` says otherwise; a JSON
//! answer becomes the output. The job's `timeout` bounds the whole exchange, so an endpoint
//! that hangs ends the attempt with tag `timeout`; a status outside 2xx or a failed condition
//! ends it `rejected`, with the start of the body in the message.
//!
//! An endpoint that answers `202 Accepted` takes the work on and reports its end later
//! (`ax.control.report`, the clients' `report`): the attempt stays executing — its timeout,
//! claim lease and history apply — until the report, which ends it as reported (a failure with
//! tag `rejected`), or the timeout, which ends it `timeout`. The wait is opened before the
//! request goes out, so a report sent the instant the endpoint answers is never early (see
//! [`ax_bus::client::reports`]).
//!
//! Secrets stay where they belong: `exec.header_env` takes a header's value from the worker's
//! environment (never from the spec); a redirect is followed only within the URL's own origin
//! (scheme, host and port), so the headers never reach another host — a redirect elsewhere ends
//! the attempt `rejected`, naming where it pointed; and a URL's password is shown as `***` in
//! every message.

use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;

use ax_bus::client::reports::Report;
use ax_bus::instance::Tag;
use ax_bus::messages::ExecutorInfo;
use ax_bus::spec::{redact, Builtin, ExecSpec, SuccessWhen};

use super::{
    attempt_json, builtin, mismatched, AttemptContext, ExecResult, Executor, ExecutorError,
    ExecutorsConfig,
};

/// Most bytes of a response body read.
const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Bytes of the body quoted in a message.
const QUOTED_BYTES: usize = 300;
/// Redirects followed within one origin.
const MAX_REDIRECTS: usize = 10;

/// See the module.
#[derive(Default)]
pub(crate) struct Http {
    client: Option<reqwest::Client>,
}

fn quote(body: &str) -> String {
    let mut end = body.len().min(QUOTED_BYTES);
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    let cut = if end < body.len() { "…" } else { "" };
    format!("{}{cut}", body[..end].trim())
}

/// Whether the answer meets `when`; `Err` says why not.
fn check(when: &SuccessWhen, json: Option<&serde_json::Value>) -> Result<(), String> {
    let Some(json) = json else {
        return Err(format!(
            "success_when: the answer is not JSON, so {} cannot equal {}",
            when.path, when.equals
        ));
    };
    match json.pointer(&when.path) {
        Some(value) if *value == when.equals => Ok(()),
        Some(value) => Err(format!(
            "success_when: {} is {value}, expected {}",
            when.path, when.equals
        )),
        None => Err(format!(
            "success_when: the answer has no {} (expected {})",
            when.path, when.equals
        )),
    }
}

/// Follows a redirect only within the origin of the first URL, up to [`MAX_REDIRECTS`].
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let same = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if !same {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    })
}

/// The headers of `exec.header_env`, read from the worker's environment; `Err` names the one
/// missing.
fn headers_from_env(
    header_env: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<(&str, String)>, String> {
    header_env
        .iter()
        .map(|(name, variable)| match std::env::var(variable) {
            Ok(value) => Ok((name.as_str(), value)),
            Err(_) => Err(format!(
                "exec.header_env.{name}: the worker has no {variable} in its environment"
            )),
        })
        .collect()
}

async fn read_body(response: reqwest::Response) -> Result<String, String> {
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| format!("reading the answer: {e}"))?;
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(format!("the answer is larger than {MAX_BODY_BYTES} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// How an exchange ended: done, or accepted for a report later.
enum Answer {
    /// The attempt's end.
    Done(ExecResult),
    /// `202 Accepted`, with the body: the business reports the end later.
    Accepted(String),
}

impl From<ExecResult> for Answer {
    fn from(result: ExecResult) -> Self {
        Self::Done(result)
    }
}

/// The attempt's end as the business reported it.
fn from_report(report: Report, accepted: &str) -> ExecResult {
    let mut result = if report.success {
        let message = if report.message.is_empty() {
            "reported success".to_string()
        } else {
            report.message
        };
        ExecResult::completed(message, report.output)
    } else {
        let mut failed = ExecResult::failed(
            Tag::Rejected,
            format!("reported failed: {}", report.message),
        );
        failed.output = report.output;
        failed
    };
    result.stdout_tail = quote(accepted);
    result
}

/// Opens the wait for the attempt's report before the request goes out (retried while NATS
/// is away: bounded by the job's timeout around it). A report already taken is returned.
async fn open(ctx: &AttemptContext<'_>) -> Option<Report> {
    let cluster = ctx.cluster?;
    let (work, trace) = (ctx.work, &ctx.work.trace_id);
    loop {
        match cluster
            .open_report(trace, &work.instance_id, ctx.worker)
            .await
        {
            Ok(taken) => return taken,
            Err(e) => {
                tracing::warn!(%trace, error = %e, "cannot open the wait for a report; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Waits for the report of an attempt whose endpoint answered 202 (bounded by the job's
/// timeout around it).
async fn awaited(ctx: &AttemptContext<'_>, accepted: &str) -> ExecResult {
    match ctx.cluster {
        Some(cluster) => from_report(cluster.next_report(&ctx.work.trace_id).await, accepted),
        None => ExecResult::failed(
            Tag::Rejected,
            "HTTP 202 Accepted: the work is reported later, which needs a cluster (a local run \
             ends here)",
        ),
    }
}

/// Closes the wait for a report for `reason`; a report that won the race is returned.
async fn close(ctx: &AttemptContext<'_>, reason: &str) -> Option<Report> {
    let cluster = ctx.cluster?;
    let trace = &ctx.work.trace_id;
    for _ in 0..CLOSE_TRIES {
        match cluster.close_report(trace, reason).await {
            Ok(report) => return report,
            Err(e) => {
                tracing::warn!(%trace, error = %e, "cannot close the wait for a report; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    // Left waiting: a late report is still refused, by the instance record's end.
    None
}

/// Tries to close a report's wait before the attempt ends anyway.
const CLOSE_TRIES: usize = 5;

impl Http {
    async fn exchange(&self, ctx: &AttemptContext<'_>) -> Answer {
        let work = ctx.work;
        let ExecSpec::Http(exec) = &work.spec.exec else {
            return mismatched(work, Builtin::Http).into();
        };
        let url = &exec.url;
        let Some(client) = &self.client else {
            return ExecResult::failed(Tag::ExecutorError, "the http executor is not initialised")
                .into();
        };
        let shown = redact::url(url);
        let from_env = match headers_from_env(&exec.header_env) {
            Ok(headers) => headers,
            Err(reason) => return ExecResult::failed(Tag::ExecutorError, reason).into(),
        };
        let body = attempt_json(work);
        let mut request = client
            .post(url)
            .json(&body)
            .header("Ax-Instance-Id", work.instance_id.as_str())
            .header("Ax-Trace-Id", work.trace_id.as_str());
        for (name, value) in &exec.headers {
            request = request.header(name, value);
        }
        for (name, value) in from_env {
            request = request.header(name, value);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => {
                let e = e.without_url();
                return ExecResult::failed(Tag::SpawnFailed, format!("POST {shown}: {e}")).into();
            }
        };
        let status = response.status();
        if status.is_redirection() {
            let to = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .map(redact::url)
                .unwrap_or_else(|| "nowhere".to_string());
            return ExecResult::failed(
                Tag::Rejected,
                format!(
                    "POST {shown}: HTTP {status} to {to}, another origin: not followed (the \
                     job's headers go only to its own origin)"
                ),
            )
            .into();
        }
        let text = match read_body(response).await {
            Ok(text) => text,
            Err(reason) => {
                return ExecResult::failed(
                    Tag::Rejected,
                    format!("POST {shown}: HTTP {status}, {reason}"),
                )
                .into()
            }
        };
        if status == reqwest::StatusCode::ACCEPTED {
            return Answer::Accepted(text);
        }
        let json: Option<serde_json::Value> = serde_json::from_str(&text).ok();
        let mut result = if !status.is_success() {
            ExecResult::failed(
                Tag::Rejected,
                format!("POST {shown}: HTTP {status}: {}", quote(&text)),
            )
        } else {
            match exec.success_when.as_ref().map(|w| check(w, json.as_ref())) {
                Some(Err(reason)) => ExecResult::failed(Tag::Rejected, reason),
                _ => ExecResult::completed(format!("HTTP {status}"), serde_json::Value::Null),
            }
        };
        result.output = json.unwrap_or(serde_json::Value::Null);
        result.stdout_tail = quote(&text);
        result.into()
    }
}

impl Executor for Http {
    fn init(&mut self, _config: &ExecutorsConfig) -> Result<(), ExecutorError> {
        let client = reqwest::Client::builder()
            .user_agent(concat!("ax/", env!("CARGO_PKG_VERSION")))
            .redirect(same_origin_redirects())
            .build()
            .map_err(|e| ExecutorError {
                executor: "http".into(),
                reason: e.to_string(),
            })?;
        self.client = Some(client);
        Ok(())
    }

    fn describe(&self) -> ExecutorInfo {
        builtin(
            Builtin::Http,
            "POSTs the instance as JSON to exec.url; 2xx (and exec.success_when) is success",
        )
    }

    fn run<'a>(&'a self, ctx: &'a AttemptContext<'a>) -> BoxFuture<'a, ExecResult> {
        Box::pin(async move {
            let limit = Duration::from_secs(ctx.work.spec.timeout_secs());
            let accepted = std::sync::atomic::AtomicBool::new(false);
            let work = async {
                if let Some(report) = open(ctx).await {
                    return from_report(report, "");
                }
                match self.exchange(ctx).await {
                    Answer::Accepted(text) => {
                        accepted.store(true, std::sync::atomic::Ordering::SeqCst);
                        awaited(ctx, &text).await
                    }
                    // Answered at once: a report that won the race decides, else the answer.
                    Answer::Done(result) => match close(ctx, "answered at once").await {
                        Some(report) => from_report(report, ""),
                        None => result,
                    },
                }
            };
            let (tag, message) = tokio::select! {
                ended = tokio::time::timeout(limit, work) => match ended {
                    Ok(result) => return result,
                    Err(_) => (Tag::Timeout, format!("no complete answer within {}s", limit.as_secs())),
                },
                _ = ctx.cancel.notified() => (
                    Tag::Killed,
                    "stopped: the instance was cancelled; request abandoned".to_string(),
                ),
            };
            // Ended meanwhile: unless a report won the race, it is too late for one.
            let report = close(ctx, tag.as_str()).await;
            let accepted = accepted.load(std::sync::atomic::Ordering::SeqCst);
            match report {
                Some(report) => from_report(report, ""),
                None if !accepted => ExecResult::failed(tag, message),
                None if tag == Tag::Timeout => ExecResult::failed(
                    tag,
                    format!(
                        "HTTP 202 Accepted, and no report within {}s",
                        limit.as_secs()
                    ),
                ),
                None => ExecResult::failed(
                    tag,
                    "stopped: the instance was cancelled while its report was awaited",
                ),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_read_json_pointers() {
        let when = SuccessWhen {
            path: "/result/status".into(),
            equals: serde_json::json!("ok"),
        };
        let ok = serde_json::json!({"result": {"status": "ok"}});
        let bad = serde_json::json!({"result": {"status": "failed"}});
        assert_eq!(check(&when, Some(&ok)), Ok(()));
        assert!(check(&when, Some(&bad))
            .unwrap_err()
            .contains("\"failed\", expected \"ok\""));
        assert!(check(&when, Some(&serde_json::json!({})))
            .unwrap_err()
            .contains("has no"));
        assert!(check(&when, None).unwrap_err().contains("not JSON"));
    }

    #[test]
    fn quotes_are_short_and_cut_on_characters() {
        let long = "é".repeat(400);
        let q = quote(&long);
        assert!(q.ends_with('…') && q.len() <= QUOTED_BYTES + 3);
    }
}
