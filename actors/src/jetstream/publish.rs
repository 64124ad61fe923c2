//! Publishing the way every actor does: MessagePack with its Content-Type, a message id for
//! JetStream's de-duplication, and the ack awaited by the caller (in windows, never one by one on
//! a hot path). Events and alerts are core NATS publishes: best effort, for listeners.

use std::future::{Future, IntoFuture};

use async_nats::jetstream::context::{PublishAckFuture, PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::publish::PublishAck;
use serde::Serialize;

use async_nats::HeaderMap;
use ax_bus::error::During;
use ax_bus::ids::{NodeId, TraceId};
use ax_bus::messages::{Alert, AlertKind, WorkItem};
use ax_bus::msg_id;
use ax_bus::{codec, dead_letter};
use ax_bus::{AxClient, InstanceRecord, Tag};

use crate::ActorError;

/// Publishes `value` to JetStream on `subject` with `msg_id`; returns the pending ack.
pub async fn to_stream<T: Serialize>(
    client: &AxClient,
    subject: String,
    msg_id: &str,
    value: &T,
) -> Result<PublishAckFuture, ActorError> {
    to_stream_with(client, subject, msg_id, codec::msgpack_headers(), value).await
}

/// [`to_stream`] with headers of the caller's (which must say MessagePack, as
/// [`codec::msgpack_headers`] do).
pub async fn to_stream_with<T: Serialize>(
    client: &AxClient,
    subject: String,
    msg_id: &str,
    headers: HeaderMap,
    value: &T,
) -> Result<PublishAckFuture, ActorError> {
    let publish = PublishMessage::build()
        .headers(headers)
        .message_id(msg_id)
        .payload(codec::encode(value)?);
    client
        .js
        .send_publish(subject.clone(), publish)
        .await
        .during(|| format!("publish {subject}"))
        .map_err(ActorError::from)
}

/// Publishes and waits for the stream's ack.
pub async fn to_stream_acked<T: Serialize>(
    client: &AxClient,
    subject: String,
    msg_id: &str,
    value: &T,
) -> Result<(), ActorError> {
    let subject_for_error = subject.clone();
    to_stream(client, subject, msg_id, value)
        .await?
        .await
        .map(|_| ())
        .during(|| format!("publish {subject_for_error}"))
        .map_err(ActorError::from)
}

/// Keeps `message` as a dead letter of `kind` with `reason`: its payload and headers as they
/// came, the reason, subject, node and time added as headers. De-duplicated by the source
/// message's stream sequence, so a redelivery that dies again is kept once.
pub async fn dead_letter(
    client: &AxClient,
    node: &NodeId,
    kind: &str,
    reason: &str,
    message: &async_nats::jetstream::Message,
) -> Result<(), ActorError> {
    let mut headers = message.headers.clone().unwrap_or_default();
    mark_dead(&mut headers, reason, message.subject.as_str(), node);
    let source = message
        .info()
        .map(|i| format!("{}:{}", i.stream, i.stream_sequence))
        .unwrap_or_else(|_| TraceId::random().to_string());
    store_dead(
        client,
        kind,
        &msg_id::dead(&source),
        headers,
        message.payload.clone(),
    )
    .await
}

/// Keeps an instance that ended `failed` for good (no retry left) as a dead letter of kind
/// `exhausted`: its last work item (job spec, params, attempt) with the final tag and message.
/// De-duplicated by the attempt, so a repeated report keeps it once.
pub async fn failed_for_good(
    client: &AxClient,
    node: &NodeId,
    work: &WorkItem,
    tag: Tag,
    message: &str,
) -> Result<(), ActorError> {
    let mut headers = codec::msgpack_headers();
    let reason = format!(
        "failed for good after attempt {}: {}: {message}",
        work.attempt,
        tag.as_str(),
    );
    mark_dead(
        &mut headers,
        &reason,
        &client.subjects().result(work.job()),
        node,
    );
    mark_owner(&mut headers, work);
    store_dead(
        client,
        dead_letter::EXHAUSTED,
        &msg_id::dead_exhausted(&work.trace_id),
        headers,
        codec::encode(work)?,
    )
    .await?;
    instance_alert(
        client,
        node,
        AlertKind::DeadLetter,
        format!(
            "instance {} moved to the dead letters: {reason}",
            work.instance_id
        ),
        work,
    )
    .await;
    Ok(())
}

/// Adds why, where, who and when a message died to its headers.
pub fn mark_dead(headers: &mut HeaderMap, reason: &str, subject: &str, node: &NodeId) {
    headers.insert(dead_letter::REASON, one_line(reason).as_str());
    headers.insert(dead_letter::SUBJECT, subject);
    headers.insert(dead_letter::NODE, node.as_str());
    headers.insert(
        dead_letter::AT,
        ax_bus::time::rfc3339(ax_bus::time::now()).as_str(),
    );
}

/// Adds the instance, attempt and job a dead message belongs to.
pub fn mark_owner(headers: &mut HeaderMap, work: &WorkItem) {
    headers.insert(dead_letter::INSTANCE, work.instance_id.as_str());
    headers.insert(dead_letter::TRACE, work.trace_id.as_str());
    headers.insert(dead_letter::JOB, work.job().as_str());
}

/// Publishes `payload` with `headers` to JetStream on `subject` under `msg_id`, and waits for
/// the stream's ack.
pub async fn raw_acked(
    client: &AxClient,
    subject: String,
    msg_id: &str,
    headers: HeaderMap,
    payload: bytes::Bytes,
) -> Result<(), ActorError> {
    let publish = PublishMessage::build()
        .headers(headers)
        .message_id(msg_id)
        .payload(payload);
    client
        .js
        .send_publish(subject.clone(), publish)
        .await
        .during(|| format!("publish {subject}"))?
        .await
        .during(|| format!("publish {subject}"))?;
    Ok(())
}

/// Stores a dead letter and waits for JetStream's ack.
pub async fn store_dead(
    client: &AxClient,
    kind: &str,
    msg_id: &str,
    headers: HeaderMap,
    payload: bytes::Bytes,
) -> Result<(), ActorError> {
    let subject = client.subjects().dead(kind);
    // A dead control command keeps everything but its caller's token.
    let mut kept = HeaderMap::new();
    for (name, values) in headers.iter() {
        if name
            .to_string()
            .eq_ignore_ascii_case(ax_bus::auth::TOKEN_HEADER)
        {
            continue;
        }
        for value in values {
            kept.append(name.to_string().as_str(), value.as_str());
        }
    }
    raw_acked(client, subject, msg_id, kept, payload).await?;
    crate::metrics::metrics()
        .dead_letters
        .get_or_create(&crate::metrics::Kind {
            kind: kind.to_string(),
        })
        .inc();
    Ok(())
}

/// A header value on one line (NATS headers cannot hold line breaks).
fn one_line(text: &str) -> String {
    text.split(['\r', '\n']).collect::<Vec<_>>().join(" ")
}

/// Tells that `record` ended outside its worker (cancelled, killed, marked, superseded): its
/// result on `ax.result.<job>` under `msg_id` (the DagCoordinator acts on it), then its event.
pub async fn ended(
    client: &AxClient,
    record: &InstanceRecord,
    msg_id: &str,
) -> Result<(), ActorError> {
    to_stream_acked(
        client,
        client.subjects().result(&record.job),
        msg_id,
        &ax_bus::messages::ResultMessage::from_record(record),
    )
    .await?;
    event(client, record).await;
    Ok(())
}

/// Asks `worker` to stop the attempt `trace` (core NATS, best effort: a process not stopped
/// runs to its end, and its report is refused by the record, which has ended).
pub async fn stop_attempt(client: &AxClient, worker: &str, trace: &TraceId) {
    let payload = bytes::Bytes::from(trace.to_string());
    if let Err(e) = client
        .nats
        .publish(client.subjects().cancel(worker), payload)
        .await
    {
        tracing::warn!(%trace, %worker, error = %e, "stop not sent; the attempt runs to its end unreported");
    }
}

/// `ax.event.<job>.<state>` with the record (best effort).
pub async fn event(client: &AxClient, record: &InstanceRecord) {
    let subject = client.subjects().event(&record.job, record.state.as_str());
    if let Ok(payload) = codec::encode(record) {
        // Events are for listeners; the record itself is what counts.
        if let Err(e) = client
            .nats
            .publish_with_headers(subject, codec::msgpack_headers(), payload)
            .await
        {
            tracing::debug!(instance = %record.instance_id, error = %e, "event not published");
        }
    }
}

/// `ax.alert.<kind>` (best effort), also logged.
pub async fn alert(
    client: &AxClient,
    node: &NodeId,
    kind: AlertKind,
    message: String,
    subject: Option<String>,
) {
    raise(client, Alert::new(kind, message, node.clone(), subject)).await;
}

/// `ax.alert.<kind>` about an attempt of an instance (best effort), also logged.
pub async fn instance_alert(
    client: &AxClient,
    node: &NodeId,
    kind: AlertKind,
    message: String,
    work: &WorkItem,
) {
    alert_about(client, node, kind, message, &work.instance_id, work.job()).await;
}

/// `ax.alert.<kind>` about instance `instance` of `job` (best effort), also logged.
pub async fn alert_about(
    client: &AxClient,
    node: &NodeId,
    kind: AlertKind,
    message: String,
    instance: &ax_bus::ids::InstanceId,
    job: &ax_bus::ids::JobName,
) {
    let subject = Some(client.subjects().result(job));
    raise(
        client,
        Alert {
            instance: Some(instance.clone()),
            job: Some(job.clone()),
            ..Alert::new(kind, message, node.clone(), subject)
        },
    )
    .await;
}

async fn raise(client: &AxClient, alert: Alert) {
    tracing::warn!(
        kind = %alert.kind,
        subject = alert.subject.as_deref().unwrap_or(""),
        "{}",
        alert.message
    );
    if let Ok(payload) = codec::encode(&alert) {
        // Logged above whatever happens here.
        if let Err(e) = client
            .nats
            .publish_with_headers(
                client.subjects().alert(alert.kind.as_str()),
                codec::msgpack_headers(),
                payload,
            )
            .await
        {
            tracing::debug!(kind = %alert.kind, error = %e, "alert not published");
        }
    }
}

/// Publish acks awaited in windows: a publish holds one of the client's in-flight permits
/// until its ack is awaited, so holding an unbounded number of them would stall publishing.
pub struct AckWindow {
    pending: Vec<AckDue>,
    size: usize,
}

impl std::fmt::Debug for AckWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AckWindow")
            .field("pending", &self.pending.len())
            .field("size", &self.size)
            .finish()
    }
}

impl AckWindow {
    /// A window of `size` acks.
    pub fn new(size: usize) -> Self {
        Self {
            pending: Vec::with_capacity(size),
            size,
        }
    }

    /// Adds an ack; awaits the whole window when it is full.
    pub async fn push(&mut self, ack: PublishAckFuture) -> Result<(), ActorError> {
        self.pending.push(due(ack));
        if self.pending.len() >= self.size {
            self.flush().await?;
        }
        Ok(())
    }

    /// Awaits every pending ack.
    pub async fn flush(&mut self) -> Result<(), ActorError> {
        for ack in self.pending.drain(..) {
            ack.await.during(|| "publish not stored")?;
        }
        Ok(())
    }
}

/// How long a publish's ack may take from the moment it is sent (async-nats's default request
/// timeout).
const ACK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A publish's ack whose deadline was fixed when the publish was sent. async-nats starts an
/// ack's timeout only when the ack is first awaited: acks lost in a reconnect, awaited one
/// after another, would each wait their full timeout — a window of 1,024 about 85 minutes, its
/// publisher stalled all along (seen in tests/bursts.rs across a NATS restart). An `AckDue`
/// polled after its deadline without its answer gives up at once, so a window's lost acks all
/// give up within one timeout of being awaited. No timer of its own: while the deadline is
/// ahead, async-nats's timeout (from the first poll, so never earlier) wakes it.
pub struct AckDue {
    ack: <PublishAckFuture as IntoFuture>::IntoFuture,
    due: std::time::Instant,
}

impl std::fmt::Debug for AckDue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AckDue").field("due", &self.due).finish()
    }
}

/// `ack`, due `ACK_TIMEOUT` (5 s) from now.
pub fn due(ack: PublishAckFuture) -> AckDue {
    AckDue {
        ack: ack.into_future(),
        due: std::time::Instant::now() + ACK_TIMEOUT,
    }
}

impl Future for AckDue {
    type Output = Result<PublishAck, PublishError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.ack.as_mut().poll(cx) {
            std::task::Poll::Pending if std::time::Instant::now() >= self.due => {
                std::task::Poll::Ready(Err(PublishErrorKind::TimedOut.into()))
            }
            polled => polled,
        }
    }
}
