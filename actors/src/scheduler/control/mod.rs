//! The control subjects (`ax.control.<command>`), served by the Schedulers.
//!
//! Commands arrive through a work-queue stream with one durable consumer shared by all
//! Scheduler copies, so each is carried out once even with many Schedulers, and a command sent
//! while none runs waits for the first to start. The answer goes to the core subject named by
//! the `Ax-Reply-To` header, which must be an inbox ([`ax_bus::reply_to`]): a command asking
//! for its answer anywhere else is refused before it is carried out. Plain NATS requests come
//! in through the [`front_door`], which queues them here.
//!
//! Every command is checked for who sent it ([`caller`]) before anything else, and recorded on
//! the audit stream once decided ([`audit`]) — carried out, refused, or denied.
//!
//! A command is decoded once into its [`Request`] variant (one per command, in `ax-bus`) and
//! carried out by one match, each arm calling the command's own module: [`jobs`] (apply,
//! delete, pause, resume), [`trigger`], [`rerun`] through [`approvals`] (a re-run that needs a
//! second person waits there), [`backfill`], [`queue`], [`operator`] (cancel, kill, mark),
//! [`replay`], [`report`] and [`tokens`] (auth). The role a command needs
//! ([`ax_bus::auth::role_of`]), the audit and the console's routes match the same kinds, so a
//! new command is a new variant and then each place the compiler names. Each handler answers
//! its command's own reply type ([`ax_bus::messages::typed`]), written as the wire's one reply
//! document only at the end.
//!
//! Input is never trusted: a payload that does not decode, an unknown command or an invalid job
//! is answered with the reasons, published as an alert on `ax.alert.control`, and acknowledged —
//! it changes nothing and never takes the Scheduler down. A NATS failure while carrying out a
//! valid command is not the sender's fault: the message is redelivered a second later.

mod admission;
pub(crate) mod approvals;
mod audit;
pub(crate) mod backfill;
mod caller;
pub(crate) mod front_door;
mod jobs;
mod namespace;
mod operator;
mod queue;
mod read;
mod replay;
mod report;
pub(crate) mod rerun;
mod scope;
mod tokens;
mod trigger;

use async_nats::jetstream;
use futures::StreamExt;

use ax_bus::error::During;
use ax_bus::ids::{JobName, Namespace, NodeId};
use ax_bus::messages::typed::{self, ControlRequest, Planned};
use ax_bus::messages::{
    commands::{self, Command, Request},
    AlertKind, ApplyRequest, ApprovalRequest, AuthRequest, BackfillRequest, ControlReply,
    MarkRequest, NamespaceRequest, QueueRequest, ReadRequest, ReplayRequest, ReportRequest,
    RerunRequest, TriggerRequest, REPLY_TO_HEADER,
};
use ax_bus::subjects::Subjects;
use ax_bus::{codec, reply_to, AxClient};

use crate::jetstream::consume::{self, ConsumerSpec};
use crate::scheduler::creator::Creator;
use crate::scheduler::graph::Graph;
use crate::scheduler::one_off::Follower;
use crate::scheduler::store::AuditLog;
use crate::ActorError;
use scope::Scope;

use crate::jetstream::publish;

/// What serving the control subjects needs: the connection, the creator of instances, the
/// node, and how far ahead a delayed trigger or a one-off job may be due.
#[derive(Clone, Debug)]
pub(crate) struct Desk {
    pub(crate) client: AxClient,
    pub(crate) creator: Creator,
    /// Whether the dependency graph concerns a triggered job (else its instance skips the
    /// DagCoordinator).
    pub(crate) graph: Graph,
    pub(crate) node: NodeId,
    pub(crate) max_delay: std::time::Duration,
    pub(crate) auth: AuthSettings,
    /// The namespaces' quotas of waiting instances, read for the triggers.
    pub(crate) admission: admission::Admission,
}

/// The node's `[auth]`: whether commands must carry a token, and how risky re-runs are
/// approved.
#[derive(Clone, Copy, Debug)]
pub struct AuthSettings {
    /// Commands must carry a valid token of a role high enough.
    pub enabled: bool,
    /// An admin's own forced re-run waits for a second admin too.
    pub require_second_admin: bool,
    /// How long an approval waits for a decision.
    pub approval_ttl: std::time::Duration,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            require_second_admin: false,
            approval_ttl: approvals::DEFAULT_TTL,
        }
    }
}

/// Serves control commands until the subscription ends.
pub(crate) async fn serve(desk: Desk) -> Result<(), ActorError> {
    let client = &desk.client;
    let spec = ConsumerSpec {
        max_ack_pending: TRIGGERS_AT_ONCE as i64,
        max_deliver: consume::POISON_DELIVERIES,
        ..ConsumerSpec::new(
            client.layout.control_stream(),
            "scheduler-control",
            client.subjects().control_all(),
        )
    };
    let mut batches = consume::watched(crate::scheduler::ACTOR, "control", client, &spec, 64)
        .await?
        .ready_chunks(TRIGGERS_AT_ONCE);
    let mut triggers = Vec::with_capacity(TRIGGERS_AT_ONCE);
    while let Some(batch) = batches.next().await {
        for message in batch {
            let received = Received::of(message.during(|| "control consumer")?, client.subjects());
            if received.kind == Some(Command::Trigger) {
                triggers.push(received);
                continue;
            }
            // Any other command waits for the triggers sent before it, and holds back those
            // sent after it.
            handle_all(&desk, &mut triggers).await;
            Box::pin(handle(&desk, &received)).await;
        }
        handle_all(&desk, &mut triggers).await;
    }
    Ok(())
}

/// A control message with its command and its request, each decoded once, before anything
/// else looks at it: the caller check, the carrying out and the audit take them from here.
pub(crate) struct Received {
    message: jetstream::Message,
    /// The command its subject names, if it names one.
    kind: Option<Command>,
    /// Its request, or why it is none.
    request: Result<Request, String>,
    /// The namespace its subject confines it to (`ax.control.trigger.payments`), if any.
    namespace: Option<Namespace>,
}

impl Received {
    fn of(message: jetstream::Message, subjects: &Subjects) -> Self {
        let (name, namespace) = subjects.command_of(&message.subject);
        let kind = Command::parse(name);
        let namespace = namespace.map(Namespace::parse).transpose();
        let request = match (kind, &namespace) {
            (_, Err(e)) => Err(format!("`{}` names no namespace: {e}", message.subject)),
            (Some(kind), Ok(namespace)) => {
                Request::decode(kind, message.headers.as_ref(), &message.payload)
                    .map_err(|e| e.to_string())
                    .and_then(|request| match namespace {
                        Some(namespace) => confine(request, namespace, &message.subject),
                        None => Ok(request),
                    })
            }
            (None, Ok(_)) => Err(format!(
                "unknown control command `{name}` ({})",
                commands::ALL.join(", ")
            )),
        };
        Self {
            message,
            kind,
            request,
            namespace: namespace.ok().flatten(),
        }
    }

    /// The command's name as its subject gives it (a name no command has, for an unknown one).
    fn name(&self) -> &str {
        match self.kind {
            Some(kind) => kind.name(),
            None => command_of(&self.message),
        }
    }
}

/// A request sent on a subject confined to `namespace` (`ax.control.trigger.payments`), kept
/// within it: what a namespace's business services send, whose NATS permissions allow no other
/// control subject. A trigger names a job of the namespace (a name without one is taken as
/// one of it); a report is checked against its attempt's job when carried out; no other
/// command travels on such a subject.
fn confine(request: Request, namespace: &Namespace, subject: &str) -> Result<Request, String> {
    match request {
        Request::Trigger(mut trigger) => {
            if trigger.name.in_default() {
                trigger.name =
                    JobName::in_namespace(namespace, &trigger.name).map_err(|e| e.to_string())?;
            }
            if trigger.name.namespace() != namespace.as_str() {
                return Err(format!(
                    "job `{}` is not in namespace `{namespace}`, to which `{subject}` confines \
                     its triggers",
                    trigger.name
                ));
            }
            Ok(Request::Trigger(trigger))
        }
        Request::Report(report) => Ok(Request::Report(report)),
        Request::Instance(read) => Ok(Request::Instance(read)),
        other => Err(format!(
            "`{subject}` carries only `trigger`, `report` and `instance` (a namespace's \
             services send no other command), not `{}`",
            other.kind().name()
        )),
    }
}

/// How many triggers that arrived together are carried out at once: each waits for a registry
/// read and its creation, which the creator pipelines with the others' (a client that sends
/// thousands gets them created at the pace of cron fires, not one round trip after another).
/// The consumer's `max_ack_pending` bounds it too.
const TRIGGERS_AT_ONCE: usize = 256;

/// The command a control message names (the token after `control`, for an unknown one).
fn command_of(message: &jetstream::Message) -> &str {
    let tail = message
        .subject
        .split_once(".control.")
        .map_or("", |(_, t)| t);
    tail.split('.').next().unwrap_or_default()
}

/// Carries out `triggers` side by side and empties the list. Triggers do not depend on each
/// other, except two with the same job and key: the second must find the first's instance
/// (and answer `already triggered`), so it waits for a later round.
async fn handle_all(desk: &Desk, triggers: &mut Vec<Received>) {
    while !triggers.is_empty() {
        let mut keys = std::collections::HashSet::new();
        let (round, later): (Vec<_>, Vec<_>) =
            triggers
                .drain(..)
                .partition(|received| match &received.request {
                    Ok(Request::Trigger(TriggerRequest {
                        name,
                        key: Some(key),
                        ..
                    })) => keys.insert((name.clone(), key.clone())),
                    _ => true,
                });
        futures::future::join_all(
            round
                .iter()
                .map(|received| Box::pin(handle(desk, received))),
        )
        .await;
        *triggers = later;
    }
}

/// Why a command was not carried out.
#[derive(Debug)]
pub(crate) enum CommandError {
    /// The sender's fault (a bad request, an unknown job): answered with the reasons and
    /// acknowledged, never retried.
    Refused(Vec<String>),
    /// The sender may not do this (no token, a bad one, a role too low): answered, audited,
    /// acknowledged.
    Denied(String),
    /// A valid command that could not be carried out for now (NATS away): redelivered later.
    Transient(ActorError),
}

impl CommandError {
    /// A refusal for one reason.
    pub(crate) fn refused(reason: impl Into<String>) -> Self {
        Self::Refused(vec![reason.into()])
    }
}

impl<E: Into<ActorError>> From<E> for CommandError {
    fn from(e: E) -> Self {
        Self::Transient(e.into())
    }
}

async fn handle(desk: &Desk, received: &Received) {
    let (client, node) = (&desk.client, &desk.node);
    let message = &received.message;
    let command = received.name();
    let reply_to = message
        .headers
        .as_ref()
        .and_then(|h| h.get(REPLY_TO_HEADER))
        .map(|v| reply_to::reply_subject(v.as_str()).map(str::to_string))
        .transpose();
    let (published, sequence) = message.info().map_or_else(
        |_| (ax_bus::time::now(), 0),
        |i| (ax_bus::time::from_server(i.published), i.stream_sequence),
    );
    // As JSON for the caller's claim and the audit: the decoded request's fields, or what
    // was sent when it does not decode.
    let request = match &received.request {
        Ok(request) => request.to_json(),
        Err(_) => audit::decoded(message),
    };
    let mut caller = caller::claimed(message, &request);
    // Where it acts: what the caller's roles must cover, and what the audit records.
    let Some(scope) = Box::pin(scope_of(client, received)).await else {
        return;
    };
    let (reply_to, outcome) = match reply_to {
        Ok(reply_to) => {
            // Boxed: each step's state lives on the heap, not in the pump's poll frame (a debug
            // build's actor thread has a small stack).
            let asked = caller::Asked::of(received);
            let enabled = desk.auth.enabled;
            let check = caller::authorize((client, enabled), (&asked, &scope), &mut caller);
            let outcome = match Box::pin(check).await {
                Ok(()) => match &received.request {
                    Ok(request) => {
                        Box::pin(carry_out(
                            desk,
                            request.clone(),
                            received.namespace.as_ref(),
                            &caller,
                            (published, sequence),
                        ))
                        .await
                    }
                    Err(why) => Err(CommandError::refused(why.clone())),
                },
                Err(denied) => Err(denied),
            };
            (reply_to, outcome)
        }
        // Refused before anything is carried out: whoever sent it meant the answer to land
        // where answers do not belong.
        Err(refusal) => (None, Err(CommandError::refused(refusal.to_string()))),
    };
    let reply = match outcome {
        Ok(reply) => reply,
        Err(CommandError::Refused(errors)) => ControlReply::refused(errors),
        Err(CommandError::Denied(why)) => ControlReply {
            denied: true,
            ..ControlReply::refused(vec![format!("denied: {why}")])
        },
        Err(CommandError::Transient(e)) => {
            tracing::warn!(command, error = %e, "control command failed; retrying later");
            consume::nak(message, consume::backoff(message)).await;
            return;
        }
    };
    let request = audit::request_of(received.kind, request);
    let decoded = received.request.as_ref().ok();
    if let Some(action) = audit::action_of(received.kind, decoded, received.name()) {
        let by = (&caller, scope.namespaces());
        let record = audit::record(&desk.node, by, action, request, &reply);
        if let Err(e) = Box::pin(client.audit(sequence, &record)).await {
            // Not acknowledged: carried out again on redelivery (commands are idempotent by
            // their ids and compare-and-swaps) and recorded then, once.
            tracing::warn!(command, error = %e, "cannot record the command on the audit stream; retrying later");
            consume::nak(message, consume::backoff(message)).await;
            return;
        }
    }
    if !reply.ok {
        publish::alert(
            client,
            node,
            AlertKind::Control,
            format!("refused control message: {}", reply.errors.join("; ")),
            Some(message.subject.to_string()),
        )
        .await;
    }
    keep_answer(client, message, sequence, &reply).await;
    if let Some(reply_to) = reply_to {
        answer(client, reply_to, message.headers.as_ref(), &reply).await;
    }
    if let Err(e) = message.ack().await {
        tracing::warn!(error = %e, "cannot ack control message");
    }
}

/// Where `received` acts ([`scope::of`]); `None` when that cannot be read now (NATS away):
/// the message is left for redelivery.
async fn scope_of(client: &AxClient, received: &Received) -> Option<Scope> {
    let Ok(request) = &received.request else {
        return Some(Scope::In(Default::default()));
    };
    match scope::of(client, request).await {
        Ok(scope) => Some(scope),
        Err(e) => {
            let command = received.name();
            tracing::warn!(command, error = %e, "cannot tell where a command acts; retrying later");
            let message = &received.message;
            consume::nak(message, consume::backoff(message)).await;
            None
        }
    }
}

/// Keeps the answer to a command sent with a message id (`Nats-Msg-Id`) in `ax_answers` under
/// its stream sequence: a request repeating the id within the duplicate window is not queued
/// again, and the front door answers it with this. Best effort: without it, the repeat is told
/// that the command ran once and where to look.
async fn keep_answer(
    client: &AxClient,
    message: &jetstream::Message,
    sequence: u64,
    reply: &ControlReply,
) {
    let has_id = message
        .headers
        .as_ref()
        .is_some_and(|h| h.get(async_nats::header::NATS_MESSAGE_ID).is_some());
    if !has_id {
        return;
    }
    let kept = match codec::encode(reply) {
        Ok(payload) => client
            .answers
            .put(sequence.to_string(), payload)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = kept {
        tracing::warn!(sequence, error = %e, "the answer to a command with a message id is not kept");
    }
}

/// Publishes `reply` on `reply_to` in the encoding of the command it answers (JSON for JSON),
/// saying which in its Content-Type.
pub(crate) async fn answer(
    client: &AxClient,
    reply_to: String,
    request: Option<&async_nats::HeaderMap>,
    reply: &ControlReply,
) {
    match codec::Encoding::answering(request).encode(reply) {
        // The command is carried out either way; a sender that misses the answer sees a
        // timeout and can read the outcome.
        Ok((headers, payload)) => {
            if let Err(e) = client
                .nats
                .publish_with_headers(reply_to, headers, payload)
                .await
            {
                tracing::debug!(error = %e, "control answer not sent");
            }
        }
        Err(e) => tracing::warn!(error = %e, "control answer does not encode"),
    }
}

/// Carries out a decoded request: one match over it, so a new command is a new [`Request`]
/// variant and the compiler names this place. Each arm's answer is checked to be its command's
/// reply ([`ControlRequest::Reply`]) by [`answered`].
async fn carry_out(
    desk: &Desk,
    request: Request,
    namespace: Option<&Namespace>,
    caller: &caller::Caller,
    published: (chrono::DateTime<chrono::Utc>, u64),
) -> Result<ControlReply, CommandError> {
    let Desk {
        client,
        creator,
        max_delay,
        ..
    } = desk;
    let who = caller.principal.name.as_str();
    let one_offs = Follower { client, creator };
    let clerk = approvals::Clerk {
        store: client,
        auth: desk.auth,
        node: &desk.node,
    };
    // Each command's future is boxed, so the control pump's future (and its poll frame) holds
    // a pointer per command rather than every command's state side by side.
    match request {
        Request::Apply(request) => {
            let limits = jobs::Limits {
                max_delay: *max_delay,
                max_payload: client.nats.server_info().max_payload,
            };
            let apply = jobs::apply((client, &one_offs), request, limits);
            answered::<ApplyRequest>(Box::pin(apply).await)
        }
        Request::Delete(request) => {
            let delete = jobs::delete((client, &one_offs), &request.name);
            answered::<typed::Delete>(Box::pin(delete).await)
        }
        Request::Pause(request) => {
            answered::<typed::Pause>(Box::pin(jobs::set_paused(client, &request.name, true)).await)
        }
        Request::Resume(request) => answered::<typed::Resume>(
            Box::pin(jobs::set_paused(client, &request.name, false)).await,
        ),
        Request::Trigger(request) => {
            let bounds = trigger::Bounds {
                max_delay: *max_delay,
                max_payload: client.nats.server_info().max_payload,
                graph: &desk.graph,
            };
            desk.admission
                .admit(client, request.name.namespace())
                .await?;
            let trigger = trigger::trigger((client, creator), &bounds, request, published);
            answered::<TriggerRequest>(Box::pin(trigger).await)
        }
        Request::Rerun(request) => {
            answered::<RerunRequest>(Box::pin(approvals::rerun(&clerk, caller, request)).await)
        }
        Request::Approval(request) => answered::<ApprovalRequest>(
            Box::pin(approvals::decide(&clerk, caller, request, published.1)).await,
        ),
        Request::Auth(request) => {
            answered::<AuthRequest>(Box::pin(tokens::handle(client, caller, request)).await)
        }
        Request::Replay(request) => {
            answered::<ReplayRequest>(Box::pin(replay::replay(client, &request)).await)
        }
        Request::Queue(request) => {
            answered::<QueueRequest>(Box::pin(queue::set_queue(client, &request)).await)
        }
        Request::Namespace(request) => {
            let set = Box::pin(namespace::set(client, &request)).await;
            desk.admission.forget_settings();
            answered::<NamespaceRequest>(set)
        }
        Request::Instance(request) => {
            answered::<ReadRequest>(Box::pin(read::instance(client, &request, namespace)).await)
        }
        Request::Backfill(request) => answered::<BackfillRequest>(
            Box::pin(backfill::backfill(client, creator, &request))
                .await
                .map(|plan| Planned {
                    plan,
                    ..Planned::default()
                }),
        ),
        Request::Cancel(request) => answered::<typed::Cancel>(
            Box::pin(operator::act(client, who, request, Command::Cancel)).await,
        ),
        Request::Kill(request) => answered::<typed::Kill>(
            Box::pin(operator::act(client, who, request, Command::Kill)).await,
        ),
        Request::Mark(request) => {
            answered::<MarkRequest>(Box::pin(operator::mark(client, who, request)).await)
        }
        Request::Report(request) => {
            answered::<ReportRequest>(Box::pin(report::report(client, request, namespace)).await)
        }
    }
}

/// A handler's answer as the wire's one reply document, typed by the request `C` it answers:
/// a handler that answers another command's reply does not compile.
fn answered<C: ControlRequest>(
    outcome: Result<C::Reply, CommandError>,
) -> Result<ControlReply, CommandError> {
    outcome.map(Into::into)
}

#[cfg(test)]
mod tests {
    use ax_bus::messages::JobNameRequest;

    use super::*;

    fn trigger(job: &str) -> Request {
        Request::Trigger(
            serde_json::from_value::<TriggerRequest>(serde_json::json!({ "name": job })).unwrap(),
        )
    }

    #[test]
    fn a_subject_of_a_namespace_holds_its_command_to_the_namespace() {
        let payments = Namespace::parse("payments").unwrap();
        let subject = "ax.control.trigger.payments";
        // A name without a namespace is one of the subject's.
        match confine(trigger("settle"), &payments, subject) {
            Ok(Request::Trigger(t)) => assert_eq!(t.name, "payments.settle"),
            other => panic!("{other:?}"),
        }
        match confine(trigger("payments/settle"), &payments, subject) {
            Ok(Request::Trigger(t)) => assert_eq!(t.name, "payments.settle"),
            other => panic!("{other:?}"),
        }
        let why = confine(trigger("ledger/close"), &payments, subject).unwrap_err();
        assert_eq!(
            why,
            "job `ledger.close` is not in namespace `payments`, to which \
             `ax.control.trigger.payments` confines its triggers"
        );
        // `default`'s subject keeps `default`'s jobs.
        let default = Namespace::default_namespace();
        assert!(confine(trigger("etl"), &default, "ax.control.trigger.default").is_ok());
        assert!(confine(
            trigger("payments/settle"),
            &default,
            "ax.control.trigger.default"
        )
        .is_err());
        // No other command travels on such a subject.
        let pause = Request::Pause(JobNameRequest {
            name: "payments.settle".parse().unwrap(),
        });
        let why = confine(pause, &payments, "ax.control.pause.payments").unwrap_err();
        assert!(
            why.contains("carries only `trigger`, `report` and `instance`"),
            "{why}"
        );
    }
}
