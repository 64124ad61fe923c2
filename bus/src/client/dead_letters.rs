//! Reading and removing dead letters (`ax dlq list`, `ax dlq replay`); what a dead letter is
//! and the headers it carries are in [`crate::dead_letter`].

use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{DeleteMessageErrorKind, LastRawMessageErrorKind};
use async_nats::jetstream::ErrorCode;
use futures::{StreamExt, TryStreamExt};

use std::time::Duration;

use async_nats::jetstream::message::PublishMessage;

use crate::client::{AxClient, ClientError};
use crate::codec;
use crate::dead_letter::{self, DeadLetter};
use crate::error::{BoxError, During, NatsError};
use crate::ids::InstanceId;
use crate::instance::State;
use crate::messages::{commands, DlqReplayAudit, PlanStep, RerunRequest};
use crate::msg_id;

/// Dead letters fetched at once when listing.
const FETCH_AHEAD: usize = 64;

impl AxClient {
    /// Every dead letter kept, oldest first.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>, ClientError> {
        let stream_name = self.layout.dead_stream();
        let err = |what: &str, e: BoxError| {
            ClientError::from(NatsError::new(format!("{what} {stream_name}"), e))
        };
        let mut stream = self
            .js
            .get_stream(&stream_name)
            .await
            .map_err(|e| err("open", e.into()))?;
        let state = stream
            .info()
            .await
            .map_err(|e| err("read", e.into()))?
            .state
            .clone();
        if state.messages == 0 {
            return Ok(Vec::new());
        }
        let kept: Vec<Option<DeadLetter>> =
            futures::stream::iter(state.first_sequence..=state.last_sequence)
                .map(|seq| {
                    let stream = stream.clone();
                    async move {
                        match stream.get_raw_message(seq).await {
                            Ok(message) => Ok(Some(DeadLetter::from_stored(&message))),
                            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {
                                Ok(None)
                            }
                            Err(e) => Err(BoxError::from(e)),
                        }
                    }
                })
                .buffered(FETCH_AHEAD)
                .try_collect()
                .await
                .map_err(|e| err("read", e))?;
        Ok(kept.into_iter().flatten().collect())
    }

    /// One dead letter with its payload and headers; `None` when there is no such id.
    pub async fn dead_letter(&self, id: u64) -> Result<Option<StreamMessage>, ClientError> {
        let stream_name = self.layout.dead_stream();
        let err = |e: BoxError| {
            ClientError::from(NatsError::new(
                format!("read dead letter {id} of {stream_name}"),
                e,
            ))
        };
        let stream = self
            .js
            .get_stream(&stream_name)
            .await
            .map_err(|e| err(e.into()))?;
        match stream.get_raw_message(id).await {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(err(e.into())),
        }
    }

    /// Removes a dead letter (once it was replayed); false when it was gone already.
    pub async fn remove_dead_letter(&self, id: u64) -> Result<bool, ClientError> {
        let stream_name = self.layout.dead_stream();
        let err = |e: BoxError| {
            ClientError::from(NatsError::new(
                format!("remove dead letter {id} of {stream_name}"),
                e,
            ))
        };
        let stream = self
            .js
            .get_stream(&stream_name)
            .await
            .map_err(|e| err(e.into()))?;
        match stream.delete_message(id).await {
            Ok(deleted) => Ok(deleted),
            Err(e)
                if matches!(e.kind(), DeleteMessageErrorKind::JetStream(ref js)
                    if js.error_code() == ErrorCode::NO_MESSAGE_FOUND) =>
            {
                Ok(false)
            }
            Err(e) => Err(err(e.into())),
        }
    }
}

/// Why a dead letter was not replayed (nothing changed, the letter is kept).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// There is no dead letter with this id.
    #[error("dead letter {0}: no such dead letter (ax dlq list shows them)")]
    NotFound(u64),
    /// It does not decode: replayed, it would fail the same way.
    #[error(
        "dead letter {id}: undecodable ({reason}); replaying it would fail the same way — fix \
         what published it on {subject} and publish it again"
    )]
    Undecodable {
        /// The letter.
        id: u64,
        /// Why it died.
        reason: String,
        /// Where it was published.
        subject: String,
    },
    /// Its instance is gone.
    #[error("dead letter {id}: instance {instance} no longer exists")]
    InstanceGone {
        /// The letter.
        id: u64,
        /// Its instance.
        instance: InstanceId,
    },
    /// Its instance has a newer attempt, or has not ended.
    #[error(
        "dead letter {id}: instance {instance} has moved on since (attempt {attempt}, {state}); \
         nothing replayed"
    )]
    MovedOn {
        /// The letter.
        id: u64,
        /// Its instance.
        instance: InstanceId,
        /// The instance's attempt now.
        attempt: u32,
        /// The instance's state now.
        state: State,
    },
    /// The Scheduler refused the re-run.
    #[error("dead letter {id}: the Scheduler refused the re-run: {}", reasons.join("; "))]
    Refused {
        /// The letter.
        id: u64,
        /// The Scheduler's reasons.
        reasons: Vec<String>,
    },
    /// The re-run started nothing.
    #[error("dead letter {0}: the Scheduler started nothing again; it is kept")]
    NothingStarted(u64),
    /// It does not say where it came from.
    #[error("dead letter {0}: it does not say which subject it came from")]
    NoSubject(u64),
    /// NATS failed.
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// What a replay did.
#[derive(Debug)]
pub struct Replayed {
    /// What was recorded on the audit stream.
    pub audit: DlqReplayAudit,
    /// For a re-run: the plan the Scheduler carried out.
    pub plan: Vec<PlanStep>,
}

impl AxClient {
    /// Submits a dead letter again and removes it. One that belongs to an instance (retries
    /// exhausted, or a dispatch delivered too often) is replayed as a re-run of that instance:
    /// a new attempt with its original params, through the Schedulers like `ax rerun
    /// --instance`, so its cancelled downstream runs again too. Any other message is put back
    /// on its subject as it came. An undecodable message is not replayed: it would die the same
    /// way. Every replay is recorded on `ax.audit.dlq` (`requested_by` says who), and the dead
    /// letter is removed once its replay is stored.
    pub async fn replay_dead_letter(
        &self,
        id: u64,
        requested_by: &str,
        timeout: Duration,
    ) -> Result<Replayed, ReplayError> {
        let stored = self
            .dead_letter(id)
            .await?
            .ok_or(ReplayError::NotFound(id))?;
        let letter = DeadLetter::from_stored(&stored);
        if letter.kind == dead_letter::UNDECODABLE {
            return Err(ReplayError::Undecodable {
                id,
                reason: letter.reason,
                subject: letter.subject,
            });
        }
        let (action, plan) = match (&letter.instance, &letter.trace) {
            (Some(instance), Some(trace)) => {
                let plan = self
                    .rerun_dead(id, instance, trace, requested_by, timeout)
                    .await?;
                ("rerun", plan)
            }
            _ => {
                self.republish_dead(id, &letter.subject, &stored).await?;
                ("republished", Vec::new())
            }
        };
        let audit = DlqReplayAudit {
            letter,
            action: action.to_string(),
            requested_by: requested_by.to_string(),
            at: crate::time::now(),
        };
        self.js
            .send_publish(
                self.subjects().audit("dlq"),
                PublishMessage::build()
                    .headers(codec::msgpack_headers())
                    .message_id(format!("dlq-replay:{id}"))
                    .payload(codec::encode(&audit).map_err(ClientError::from)?),
            )
            .await
            .during(|| "record the replay on the audit stream")
            .map_err(ClientError::from)?
            .await
            .during(|| "record the replay on the audit stream")
            .map_err(ClientError::from)?;
        self.remove_dead_letter(id).await?;
        Ok(Replayed { audit, plan })
    }

    async fn rerun_dead(
        &self,
        id: u64,
        instance: &str,
        trace: &str,
        requested_by: &str,
        timeout: Duration,
    ) -> Result<Vec<PlanStep>, ReplayError> {
        let instance = InstanceId::parse(instance).map_err(ClientError::from)?;
        let (record, _) =
            self.instance(&instance)
                .await?
                .ok_or_else(|| ReplayError::InstanceGone {
                    id,
                    instance: instance.clone(),
                })?;
        if record.trace_id != trace || !record.state.is_final() {
            return Err(ReplayError::MovedOn {
                id,
                instance,
                attempt: record.attempt,
                state: record.state,
            });
        }
        let request = RerunRequest {
            instance: Some(instance),
            biz_date: None,
            root: None,
            failed_only: true,
            force_downstream: false,
            dry_run: false,
            requested_by: format!("{requested_by} (ax dlq replay {id})"),
        };
        let reply = self.control(commands::RERUN, &request, timeout).await?;
        if !reply.ok {
            return Err(ReplayError::Refused {
                id,
                reasons: reply.errors,
            });
        }
        if !reply.plan.iter().any(|s| s.will_run) {
            return Err(ReplayError::NothingStarted(id));
        }
        Ok(reply.plan)
    }

    async fn republish_dead(
        &self,
        id: u64,
        subject: &str,
        stored: &StreamMessage,
    ) -> Result<(), ReplayError> {
        if subject.is_empty() {
            return Err(ReplayError::NoSubject(id));
        }
        let publish = PublishMessage::build()
            .headers(dead_letter::original_headers(&stored.headers))
            .message_id(msg_id::replay(&self.layout.dead_stream(), id))
            .payload(stored.payload.clone());
        self.js
            .send_publish(subject.to_string(), publish)
            .await
            .during(|| format!("publish on {subject}"))
            .map_err(ClientError::from)?
            .await
            .during(|| format!("publish on {subject}"))
            .map_err(ClientError::from)?;
        Ok(())
    }
}
