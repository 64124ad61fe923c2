//! The front door: control commands sent as plain NATS requests (`ax.request.<command>`).
//!
//! A request published on `ax.control.<command>` is answered by JetStream itself — the stream
//! that keeps the command acknowledges it on the request's reply subject — so `nc.request()`
//! there returns `{"stream":"AX_CONTROL","seq":13}`, never the command's answer. On
//! `ax.request.<command>` the Schedulers (one queue group, so each request is taken by one)
//! queue the request on the control subject with its reply subject as `Ax-Reply-To`, and the
//! command is carried out exactly as a durable one: checked, audited, answered on the
//! requester's inbox in the request's encoding. Nothing is carried out here, so there is one
//! path for every command and its rules (who may, inboxes only, once per stream sequence).
//!
//! A request that cannot be queued (JetStream away) is answered at once with the reason, when
//! its reply subject is an inbox; a request is never queued twice, so a requester that times
//! out reads the outcome or asks again (keyed triggers make that safe). A request that repeats
//! the message id (`Nats-Msg-Id`) of one queued within the stream's duplicate window is not
//! queued again — JetStream says it is a duplicate of that command — and is answered with that
//! command's answer, which the Scheduler carrying it out keeps in `ax_answers`.

use std::time::Duration;

use async_nats::jetstream::context::PublishAckFuture;
use futures::stream::FuturesUnordered;
use futures::StreamExt;

use ax_bus::error::During;
use ax_bus::messages::{ControlReply, REPLY_TO_HEADER};
use ax_bus::{codec, reply_to};

use crate::runtime::progress::{self, Progressed};
use crate::ActorError;

use super::Desk;

/// The queue group every Scheduler's front door joins.
const QUEUE_GROUP: &str = "ax-schedulers";

/// How many queued requests wait for their stream's ack at once.
const IN_FLIGHT: usize = 256;

/// How long a request waits for the control stream's ack before it is answered with a failure.
const ACK_WAIT: Duration = Duration::from_secs(10);

/// How long a repeated request waits for the first one's answer.
const REPEAT_WAIT: Duration = Duration::from_secs(30);
/// How often it looks.
const REPEAT_POLL: Duration = Duration::from_millis(100);

/// A request handed to the control stream, waiting for its ack.
struct Queued {
    ack: PublishAckFuture,
    reply: Option<String>,
    headers: Option<async_nats::HeaderMap>,
}

/// Serves `ax.request.>` until the subscription ends.
pub(crate) async fn serve(desk: Desk) -> Result<(), ActorError> {
    let client = &desk.client;
    let subject = client.subjects().request_all();
    let subscriber = client
        .nats
        .queue_subscribe(subject.clone(), QUEUE_GROUP.to_string())
        .await
        .during(|| format!("subscribe to {subject}"))?;
    let pump = progress::register(crate::scheduler::ACTOR, "requests", None);
    let mut requests = Progressed::new(subscriber, pump);
    let mut waiting = FuturesUnordered::new();
    loop {
        tokio::select! {
            request = requests.next(), if waiting.len() < IN_FLIGHT => match request {
                Some(request) => {
                    if let Some(queued) = queue(&desk, request).await {
                        waiting.push(settle(&desk, queued));
                    }
                }
                None => break,
            },
            Some(()) = waiting.next(), if !waiting.is_empty() => {}
        }
    }
    while waiting.next().await.is_some() {}
    Ok(())
}

/// Publishes `request` on the control subject it names, answering to its reply subject.
async fn queue(desk: &Desk, request: async_nats::Message) -> Option<Queued> {
    let client = &desk.client;
    let subject = client
        .subjects()
        .control_for_request(&request.subject)
        .unwrap_or_else(|| client.subjects().control("unknown"));
    let mut headers = request.headers.clone().unwrap_or_default();
    let reply = request.reply.as_ref().map(|r| r.to_string());
    // The requester's reply subject is where the answer goes, whatever the headers say (a
    // request without one is a command like any other): the control handler checks it is an
    // inbox as it checks any Ax-Reply-To.
    if let Some(reply) = &reply {
        headers.insert(REPLY_TO_HEADER, reply.as_str());
    }
    let answer_headers = request.headers.clone();
    match client
        .js
        .publish_with_headers(subject, headers, request.payload)
        .await
    {
        Ok(ack) => Some(Queued {
            ack,
            reply,
            headers: answer_headers,
        }),
        Err(e) => {
            failed(desk, reply, answer_headers.as_ref(), e.to_string()).await;
            None
        }
    }
}

/// Waits for `queued`'s ack; a request the stream did not take is answered with the reason.
async fn settle(desk: &Desk, queued: Queued) {
    let why = match tokio::time::timeout(ACK_WAIT, queued.ack).await {
        Ok(Ok(ack)) if ack.duplicate => {
            return repeated(desk, queued.reply, queued.headers, ack.sequence).await
        }
        Ok(Ok(_)) => return,
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no ack from the control stream within {ACK_WAIT:?}"),
    };
    failed(desk, queued.reply, queued.headers.as_ref(), why).await;
}

/// Answers a request that was not queued, if its reply subject is an inbox.
async fn failed(
    desk: &Desk,
    reply: Option<String>,
    headers: Option<&async_nats::HeaderMap>,
    why: String,
) {
    tracing::warn!(error = %why, "a request was not queued on the control stream");
    let Some(reply) = reply.filter(|r| reply_to::reply_subject(r).is_ok()) else {
        return;
    };
    let answer = ControlReply::refused(vec![format!(
        "the command was not queued, nothing was carried out; try again: {why}"
    )]);
    super::answer(&desk.client, reply, headers, &answer).await;
}

/// Answers a request that repeats the message id of command `sequence` with that command's
/// answer, once kept; after [`REPEAT_WAIT`] without it, says that the command runs once.
async fn repeated(
    desk: &Desk,
    reply: Option<String>,
    headers: Option<async_nats::HeaderMap>,
    sequence: u64,
) {
    let Some(reply) = reply.filter(|r| reply_to::reply_subject(r).is_ok()) else {
        return;
    };
    let key = sequence.to_string();
    let deadline = tokio::time::Instant::now() + REPEAT_WAIT;
    let answer = loop {
        match desk.client.answers.get(&key).await {
            Ok(Some(kept)) => match codec::decode::<ControlReply>(&kept) {
                Ok(answer) => break answer,
                Err(e) => tracing::warn!(sequence, error = %e, "a kept answer does not decode"),
            },
            Ok(None) => {}
            Err(e) => tracing::debug!(sequence, error = %e, "cannot read a kept answer yet"),
        }
        if tokio::time::Instant::now() >= deadline {
            break ControlReply::refused(vec![format!(
                "this request repeats the message id of command {sequence} of the control \
                 stream, which is carried out once; its answer was not kept within \
                 {REPEAT_WAIT:?} (see ax audit list)"
            )]);
        }
        tokio::time::sleep(REPEAT_POLL).await;
    };
    super::answer(&desk.client, reply, headers.as_ref(), &answer).await;
}
