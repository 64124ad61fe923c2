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
//! Input is never trusted: a payload that does not decode, an unknown command or an invalid job
//! is answered with the reasons, published as an alert on `ax.alert.control`, and acknowledged —
//! it changes nothing and never takes the Scheduler down. A NATS failure while carrying out a
//! valid command is not the sender's fault: the message is redelivered a second later.

pub(crate) mod approvals;
mod audit;
pub(crate) mod backfill;
mod caller;
pub(crate) mod front_door;
mod operator;
mod replay;
mod report;
pub(crate) mod rerun;
mod tokens;

use std::collections::BTreeMap;

use async_nats::jetstream::{self, kv::CreateErrorKind, kv::UpdateErrorKind};
use futures::StreamExt;
use serde::de::DeserializeOwned;

use ax_bus::error::During;
use ax_bus::error::NatsError;
use ax_bus::ids::{JobName, NodeId};
use ax_bus::instance::Trigger;
use ax_bus::messages::{
    commands::{self, Command},
    AlertKind, ApplyRequest, ApprovalRequest, AuthRequest, BackfillRequest, Change, ControlReply,
    InstanceRequest, JobChange, JobNameRequest, JobRecord, MarkRequest, PlanStep, QueueRequest,
    QueueState, ReplayRequest, ReportRequest, RerunRequest, TriggerRequest, REPLY_TO_HEADER,
};
use ax_bus::{codec, reply_to, spec, AxClient};

use crate::jetstream::consume::{self, ConsumerSpec};
use crate::scheduler::creator::{Created, Creator};
use crate::scheduler::graph::Graph;
use crate::scheduler::new_instance::NewInstance;
use crate::scheduler::one_off;
use crate::ActorError;
use ax_bus::time::biz_date_in;

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
            let message = message.during(|| "control consumer")?;
            if command_of(&message) == commands::TRIGGER {
                triggers.push(message);
                continue;
            }
            // Any other command waits for the triggers sent before it, and holds back those
            // sent after it.
            handle_all(&desk, &mut triggers).await;
            Box::pin(handle(&desk, &message)).await;
        }
        handle_all(&desk, &mut triggers).await;
    }
    Ok(())
}

/// How many triggers that arrived together are carried out at once: each waits for a registry
/// read and its creation, which the creator pipelines with the others' (a client that sends
/// thousands gets them created at the pace of cron fires, not one round trip after another).
/// The consumer's `max_ack_pending` bounds it too.
const TRIGGERS_AT_ONCE: usize = 256;

/// The command a control message names (the last token of its subject).
fn command_of(message: &jetstream::Message) -> &str {
    message.subject.rsplit('.').next().unwrap_or_default()
}

/// Carries out `triggers` side by side and empties the list. Triggers do not depend on each
/// other, except two with the same job and key: the second must find the first's instance
/// (and answer `already triggered`), so it waits for a later round.
async fn handle_all(desk: &Desk, triggers: &mut Vec<jetstream::Message>) {
    while !triggers.is_empty() {
        let mut keys = std::collections::HashSet::new();
        let (round, later): (Vec<_>, Vec<_>) =
            triggers
                .drain(..)
                .partition(|message| match decode::<TriggerRequest>(message) {
                    Ok(TriggerRequest {
                        name,
                        key: Some(key),
                        ..
                    }) => keys.insert((name, key)),
                    _ => true,
                });
        futures::future::join_all(round.iter().map(|message| Box::pin(handle(desk, message))))
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

async fn handle(desk: &Desk, message: &jetstream::Message) {
    let (client, node) = (&desk.client, &desk.node);
    let command = command_of(message);
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
    let request = audit::decoded(message);
    let mut caller = caller::claimed(message, &request);
    let (reply_to, outcome) = match reply_to {
        Ok(reply_to) => {
            // Boxed: each step's state lives on the heap, not in the pump's poll frame (a debug
            // build's actor thread has a small stack).
            let outcome =
                match Box::pin(caller::authorize(desk, message, command, &mut caller)).await {
                    Ok(()) => {
                        Box::pin(carry_out(
                            desk,
                            message,
                            command,
                            &caller,
                            (published, sequence),
                        ))
                        .await
                    }
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
    let request = audit::request_of(command, request);
    if let Some(action) = audit::action_of(command, &request) {
        let record = audit::record(desk, &caller, action, request, &reply);
        if let Err(e) = Box::pin(audit::publish(desk, sequence, &record)).await {
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

/// Carries out `command`, decoded from `message`.
async fn carry_out(
    desk: &Desk,
    message: &jetstream::Message,
    command: &str,
    caller: &caller::Caller,
    published: (chrono::DateTime<chrono::Utc>, u64),
) -> Result<ControlReply, CommandError> {
    let Desk {
        client,
        creator,
        max_delay,
        ..
    } = desk;
    let Some(kind) = Command::parse(command) else {
        return Err(CommandError::refused(format!(
            "unknown control command `{command}` ({})",
            commands::ALL.join(", ")
        )));
    };
    // Each command's future is boxed, so the control pump's future (and its poll frame) holds
    // a pointer per command rather than every command's state side by side.
    match kind {
        Command::Apply => match decode::<ApplyRequest>(message) {
            Ok(request) => Box::pin(apply(client, creator, request, *max_delay)).await,
            Err(refusal) => Err(refusal),
        },
        Command::Delete => match decode::<JobNameRequest>(message) {
            Ok(request) => Box::pin(delete(client, &request.name)).await,
            Err(refusal) => Err(refusal),
        },
        Command::Pause | Command::Resume => match decode::<JobNameRequest>(message) {
            Ok(request) => {
                Box::pin(set_paused(client, &request.name, kind == Command::Pause)).await
            }
            Err(refusal) => Err(refusal),
        },
        Command::Trigger => match decode::<TriggerRequest>(message) {
            Ok(request) => Box::pin(trigger(desk, request, published)).await,
            Err(refusal) => Err(refusal),
        },
        Command::Rerun => match decode::<RerunRequest>(message) {
            Ok(request) => Box::pin(approvals::rerun(desk, caller, request)).await,
            Err(refusal) => Err(refusal),
        },
        Command::Approval => match decode::<ApprovalRequest>(message) {
            Ok(request) => Box::pin(approvals::decide(desk, caller, request, published.1)).await,
            Err(refusal) => Err(refusal),
        },
        Command::Auth => match decode::<AuthRequest>(message) {
            Ok(request) => Box::pin(tokens::handle(client, caller, request)).await,
            Err(refusal) => Err(refusal),
        },
        Command::Replay => match decode::<ReplayRequest>(message) {
            Ok(request) => Box::pin(replay::replay(client, &request)).await,
            Err(refusal) => Err(refusal),
        },
        Command::Queue => match decode::<QueueRequest>(message) {
            Ok(request) => Box::pin(set_queue(client, &request)).await,
            Err(refusal) => Err(refusal),
        },
        Command::Backfill => match decode::<BackfillRequest>(message) {
            Ok(request) => planned(Box::pin(backfill::backfill(client, creator, &request)).await),
            Err(refusal) => Err(refusal),
        },
        Command::Cancel => match decode::<InstanceRequest>(message) {
            Ok(request) => {
                Box::pin(operator::act(
                    client,
                    &caller.principal.name,
                    request,
                    command,
                ))
                .await
            }
            Err(refusal) => Err(refusal),
        },
        Command::Kill => match decode::<InstanceRequest>(message) {
            Ok(request) => {
                Box::pin(operator::act(
                    client,
                    &caller.principal.name,
                    request,
                    command,
                ))
                .await
            }
            Err(refusal) => Err(refusal),
        },
        Command::Mark => match decode::<MarkRequest>(message) {
            Ok(request) => Box::pin(operator::mark(client, &caller.principal.name, request)).await,
            Err(refusal) => Err(refusal),
        },
        Command::Report => match decode::<ReportRequest>(message) {
            Ok(request) => Box::pin(report::report(client, request)).await,
            Err(refusal) => Err(refusal),
        },
    }
}

/// Pauses or resumes a priority's queue: the Routers stop (or start again) pulling from it;
/// nothing in it is lost.
async fn set_queue(
    client: &AxClient,
    request: &QueueRequest,
) -> Result<ControlReply, CommandError> {
    let state = QueueState {
        paused: request.paused,
        by: String::new(),
    };
    client
        .queues
        .put(request.priority.as_str(), codec::encode(&state)?)
        .await
        .during(|| format!("set queue {}", request.priority.as_str()))?;
    Ok(ControlReply {
        ok: true,
        message: format!(
            "queue {} {}",
            request.priority.as_str(),
            if request.paused { "paused" } else { "resumed" }
        ),
        ..ControlReply::default()
    })
}

/// The answer to a planned command (re-run, backfill).
fn planned(plan: Result<Vec<PlanStep>, CommandError>) -> Result<ControlReply, CommandError> {
    Ok(ControlReply {
        ok: true,
        plan: plan?,
        ..ControlReply::default()
    })
}

fn decode<T: DeserializeOwned>(message: &jetstream::Message) -> Result<T, CommandError> {
    codec::decode_request(message.headers.as_ref(), &message.payload)
        .map_err(|e| CommandError::refused(e.to_string()))
}

/// What a problem in an apply's `yaml` names as its file.
pub(crate) const YAML_SOURCE: &str = "yaml";

async fn apply(
    client: &AxClient,
    creator: &Creator,
    mut request: ApplyRequest,
    max_delay: std::time::Duration,
) -> Result<ControlReply, CommandError> {
    if let Some(text) = request.yaml.take() {
        let parsed = spec::yaml::parse_str(YAML_SOURCE, &text)
            .map_err(|e| CommandError::refused(e.to_string()))?;
        request.jobs.extend(parsed.into_iter().map(|job| job.doc));
    }
    let docs: Vec<&spec::JobDocument> = request.jobs.iter().collect();
    let mut errors: Vec<String> =
        spec::check_documents(&docs, |i| format!("first as document {}", i + 1))
            .into_iter()
            .map(|(i, e)| format!("{}: {e}", docs[i].job.name))
            .collect();
    let now = ax_bus::time::now();
    for doc in &request.jobs {
        let at = doc.job.at.as_deref().map(ax_bus::time::parse_instant);
        if let Some(Ok(at)) = at {
            if let Err(e) = within(at, now, max_delay) {
                errors.push(format!("{}: job.at: {e}", doc.job.name));
            }
        }
    }
    if request.jobs.is_empty() {
        errors.push("the apply holds no job".to_string());
    }
    if !errors.is_empty() {
        return Err(CommandError::Refused(errors));
    }
    // A job whose every fire would be too big to hand on is refused now, not fire by fire.
    let max_payload = client.nats.server_info().max_payload;
    for doc in &request.jobs {
        let now = ax_bus::time::now();
        let fire = NewInstance::new(
            &doc.job,
            now,
            now.format("%Y-%m-%d").to_string(),
            doc.job.params.clone(),
            Trigger::Cron,
            now,
        );
        if let Err(e) = fire.too_big_for(max_payload) {
            errors.push(format!("{}: {e}", doc.job.name));
        }
    }
    if !errors.is_empty() {
        return Err(CommandError::Refused(errors));
    }
    let registered: Vec<spec::JobSpec> = client.jobs().await?.into_iter().map(|r| r.spec).collect();
    let applied: Vec<&spec::JobSpec> = request.jobs.iter().map(|d| &d.job).collect();
    for (job, e) in spec::graph::validate_graph(&applied, &registered) {
        errors.push(format!("{job}: {e}"));
    }
    if !errors.is_empty() {
        return Err(CommandError::Refused(errors));
    }
    let mut changes = Vec::new();
    for doc in request.jobs {
        let previous_at = match client.job(&doc.job.name).await? {
            Some((record, _)) => record.spec.at,
            None => None,
        };
        let (change, defined_at) = store_job(client, doc.job.clone()).await?;
        let stored = one_off::Stored {
            spec: &doc.job,
            change: change.change,
            defined_at,
            previous_at: previous_at.as_deref(),
        };
        one_off::on_apply(client, creator, stored).await?;
        changes.push(change);
    }
    Ok(ControlReply {
        ok: true,
        changes,
        ..ControlReply::default()
    })
}

/// Stores `spec` (created, or changed if it differs from what is stored): how, and when a job
/// of its name was created.
async fn store_job(
    client: &AxClient,
    spec: spec::JobSpec,
) -> Result<(JobChange, Option<chrono::DateTime<chrono::Utc>>), CommandError> {
    let name = spec.name.clone();
    loop {
        let existing = client.job(&name).await?;
        let change = match &existing {
            None => Change::Created,
            Some((record, _)) if record.spec == spec => {
                let change = JobChange {
                    name,
                    change: Change::Unchanged,
                };
                return Ok((change, record.defined_at));
            }
            Some(_) => Change::Updated,
        };
        let now = ax_bus::time::now();
        let record = JobRecord {
            spec: spec.clone(),
            paused: existing.as_ref().is_some_and(|(r, _)| r.paused),
            updated_at: now,
            // Created now, or kept: an edit is the same job.
            defined_at: match &existing {
                None => Some(now),
                Some((r, _)) => r.defined_at,
            },
        };
        let payload = codec::encode(&record)?;
        let written = match existing {
            None => match client.jobs.create(&name, payload).await {
                Err(e) if e.kind() == CreateErrorKind::AlreadyExists => false,
                Err(e) => {
                    return Err(
                        ActorError::from(NatsError::new(format!("store job {name}"), e)).into(),
                    )
                }
                Ok(_) => true,
            },
            Some((_, revision)) => match client.jobs.update(&name, payload, revision).await {
                Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => false,
                Err(e) => {
                    return Err(
                        ActorError::from(NatsError::new(format!("store job {name}"), e)).into(),
                    )
                }
                Ok(_) => true,
            },
        };
        if written {
            return Ok((JobChange { name, change }, record.defined_at));
        }
        // A concurrent apply changed the job meanwhile: compare again.
    }
}

fn no_such_job(name: &JobName) -> CommandError {
    CommandError::refused(format!("no job named `{name}`"))
}

async fn delete(client: &AxClient, name: &JobName) -> Result<ControlReply, CommandError> {
    // Existence of the entry, not of a valid job: an entry written past the Schedulers' checks
    // is deleted like any other.
    if !client.job_exists(name).await? {
        return Err(no_such_job(name));
    }
    // An entry that does not decode has no `at` to withdraw.
    let at = match client.job(name).await {
        Ok(found) => found.and_then(|(record, _)| record.spec.at),
        Err(ax_bus::ClientError::Codec(_)) => None,
        Err(e) => return Err(e.into()),
    };
    let registered: Vec<spec::JobSpec> = client.jobs().await?.into_iter().map(|r| r.spec).collect();
    let dependents = spec::graph::dependents_of(name, &registered);
    if !dependents.is_empty() {
        let dependents: Vec<&str> = dependents.iter().map(|d| d.as_str()).collect();
        return Err(CommandError::refused(format!(
            "`{name}` is a dependency of {}; change or delete them first",
            dependents.join(", ")
        )));
    }
    client
        .jobs
        .delete(name)
        .await
        .during(|| format!("delete job {name}"))?;
    one_off::on_delete(client, name, at.as_deref()).await?;
    Ok(ControlReply {
        ok: true,
        message: format!("deleted {name}"),
        ..ControlReply::default()
    })
}

async fn set_paused(
    client: &AxClient,
    name: &JobName,
    paused: bool,
) -> Result<ControlReply, CommandError> {
    loop {
        let Some((mut record, revision)) = client.job(name).await? else {
            return Err(no_such_job(name));
        };
        let verb = if paused { "paused" } else { "resumed" };
        if record.paused == paused {
            return Ok(ControlReply {
                ok: true,
                message: format!("{name} was already {verb}"),
                ..ControlReply::default()
            });
        }
        record.paused = paused;
        record.updated_at = ax_bus::time::now();
        match client
            .jobs
            .update(name, codec::encode(&record)?, revision)
            .await
        {
            Ok(_) => {
                return Ok(ControlReply {
                    ok: true,
                    message: format!("{name} {verb}"),
                    ..ControlReply::default()
                })
            }
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => continue,
            Err(e) => {
                return Err(
                    ActorError::from(NatsError::new(format!("update job {name}"), e)).into(),
                )
            }
        }
    }
}

/// A manual run. Its expected time is when the command reached the server (the JetStream
/// timestamp, identical on every redelivery) and its id adds the command's stream sequence, so
/// a redelivered trigger never runs twice and two triggers within a millisecond both run.
async fn trigger(
    desk: &Desk,
    request: TriggerRequest,
    (published, sequence): (chrono::DateTime<chrono::Utc>, u64),
) -> Result<ControlReply, CommandError> {
    let (client, creator, max_delay) = (&desk.client, &desk.creator, desk.max_delay);
    let Some((job, _)) = client.job(&request.name).await? else {
        return Err(no_such_job(&request.name));
    };
    let invalid = spec::validate_spec(&job.spec);
    if !invalid.is_empty() {
        // Written past the Schedulers' checks: never run.
        return Err(CommandError::Refused(
            invalid
                .iter()
                .map(|e| format!("the registry's `{}` is not a valid job: {e}", request.name))
                .collect(),
        ));
    }
    let mut errors = Vec::new();
    if let Some(date) = &request.biz_date {
        if ax_bus::time::parse_biz_date(date).is_none() {
            errors.push(format!("biz_date: `{date}` is not a date (YYYY-MM-DD)"));
        }
    }
    for name in request.params.keys() {
        if !spec::is_valid_param_name(name) {
            errors.push(format!(
                "params.{name}: a param name must match [A-Za-z_][A-Za-z0-9_]{{0,63}}"
            ));
        }
    }
    let due = due_of(&request, published, max_delay).unwrap_or_else(|e| {
        errors.push(e);
        None
    });
    if !errors.is_empty() {
        return Err(CommandError::Refused(errors));
    }
    let tz: chrono_tz::Tz = job.spec.timezone.parse().unwrap_or(chrono_tz::UTC);
    let biz_date = request
        .biz_date
        .unwrap_or_else(|| biz_date_in(tz, due.unwrap_or(published)));
    let mut params: BTreeMap<String, serde_json::Value> = job.spec.params.clone();
    params.extend(request.params);
    if let Err(size) = spec::params_fit(&params) {
        // Refused here, before a record exists: every hand-off of the attempt carries them.
        return Err(CommandError::refused(format!(
            "params: {size} bytes as JSON (the job's merged with the trigger's) is more than {}",
            spec::MAX_PARAMS_BYTES
        )));
    }
    let mut instance = NewInstance::new(
        &job.spec,
        published,
        biz_date,
        params,
        Trigger::Manual,
        ax_bus::time::now(),
    );
    instance = match &request.key {
        Some(key) => instance.under_key(key),
        None => instance.under_command(published, sequence),
    };
    if let Some(due) = due {
        instance = instance.delayed_until(due);
        instance.defined_at = job.defined_at;
    }
    instance.skip_coordinator = !desk.graph.needs_coordinator(&job.spec);
    instance
        .too_big_for(client.nats.server_info().max_payload)
        .map_err(CommandError::refused)?;
    let id = instance.record.instance_id.clone();
    let created = creator.create(instance).await?;
    if created == Created::SetAside {
        return Err(CommandError::refused(format!(
            "instance {id} was set aside: it cannot be handed on (see its record and \
             ax.alert.flow)"
        )));
    }
    Ok(ControlReply {
        ok: true,
        instance_id: Some(id),
        message: match created {
            Created::Fired => match due {
                Some(due) => format!("scheduled for {}", ax_bus::time::rfc3339(due)),
                None => "triggered".into(),
            },
            Created::Deduplicated => "already triggered".into(),
            Created::Skipped => "skipped".into(),
            Created::SetAside => "set aside".into(),
        },
        ..ControlReply::default()
    })
}

/// When a delayed trigger is due (`at` or `in`, counted from the command's publication so a
/// redelivered command means the same instant); `None` for one that runs now.
fn due_of(
    request: &TriggerRequest,
    published: chrono::DateTime<chrono::Utc>,
    max_delay: std::time::Duration,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, String> {
    let due = match (&request.at, &request.delay) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => return Err("at and in: give one of them, not both".into()),
        (Some(at), None) => ax_bus::time::parse_instant(at).map_err(|e| format!("at: {e}"))?,
        (None, Some(delay)) => {
            let delay = ax_bus::time::parse_delay(delay).map_err(|e| format!("in: {e}"))?;
            chrono::Duration::from_std(delay)
                .ok()
                .and_then(|d| published.checked_add_signed(d))
                .ok_or_else(|| {
                    format!(
                        "in: `{}` is too far ahead",
                        request.delay.as_deref().unwrap_or_default()
                    )
                })?
        }
    };
    within(due, published, max_delay)
        .map_err(|e| format!("{}: {e}", if request.at.is_some() { "at" } else { "in" }))?;
    Ok(Some(due))
}

/// Whether `due` is at most `max_delay` after `from` (the node's `[scheduler] max_delay_days`).
fn within(
    due: chrono::DateTime<chrono::Utc>,
    from: chrono::DateTime<chrono::Utc>,
    max_delay: std::time::Duration,
) -> Result<(), String> {
    let limit = chrono::Duration::from_std(max_delay).unwrap_or(chrono::Duration::MAX);
    match from.checked_add_signed(limit) {
        Some(last) if due > last => Err(format!(
            "{} is more than {} days ahead (the Schedulers' max_delay_days)",
            ax_bus::time::rfc3339(due),
            limit.num_days()
        )),
        _ => Ok(()),
    }
}
