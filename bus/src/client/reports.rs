//! Asynchronous reports: an attempt whose work is done elsewhere and reported later (the
//! article's Worker SDK `report(traceId, success, message)`).
//!
//! An http job whose endpoint answers `202 Accepted` has not finished: its worker keeps the
//! attempt executing (timeout, claim lease and history apply as to any attempt) and waits for
//! the business to call `report`. One key per attempt in the claims bucket, `report.<trace>`,
//! carries the whole exchange, and every change to it is a create-if-absent or a
//! compare-and-swap, so it is a fence:
//! - **waiting**: the worker is about to send the work, or got its 202 and waits (it names
//!   the instance) — written before the request, so a report sent the instant the endpoint
//!   answers is never early;
//! - **reported**: the first report won; a second one for the same trace finds it and is
//!   ignored (the article's de-duplication);
//! - **closed**: the attempt ended without a report (the endpoint answered at once, or a
//!   timeout, a cancellation) — a report arriving later finds it and is refused as stale.
//!
//! A report and the attempt's timeout race for the same key: whichever writes first decides,
//! and the loser reads what won. So an accepted report is never lost to a timeout, and a report
//! refused as late never ends an attempt.

use std::time::Duration;

use async_nats::jetstream::kv::{CreateErrorKind, Operation, UpdateErrorKind};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::client::{AxClient, ClientError};
use crate::codec;
use crate::error::{BoxError, NatsError};
use crate::ids::{InstanceId, TraceId, WorkerId};

/// What the business reports about an attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Whether the work succeeded.
    pub success: bool,
    /// A line for people.
    #[serde(default)]
    pub message: String,
    /// Structured output, published with the result and readable downstream.
    #[serde(default)]
    pub output: serde_json::Value,
    /// When it was reported.
    #[serde(with = "crate::time::wire")]
    pub at: DateTime<Utc>,
}

/// The value under `report.<trace>`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ReportState {
    /// The worker waits for the report.
    Waiting {
        /// The attempt's instance.
        instance_id: InstanceId,
        /// The worker running it.
        worker: WorkerId,
    },
    /// The first report arrived.
    Reported(Report),
    /// The attempt ended without one.
    Closed {
        /// Why (`timeout`, `cancelled`...).
        reason: String,
    },
}

/// What a report came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Delivery {
    /// Taken: the attempt ends with it.
    Accepted,
    /// A report for this trace was taken before; this one is ignored.
    AlreadyReported,
    /// The attempt ended before any report (the reason).
    Closed(String),
    /// No attempt of this trace waits for a report.
    Unknown,
}

/// What a transition of the key does with what it found.
enum Step<T> {
    /// Leave it; the outcome.
    Stay(T),
    /// Write this state; the outcome once written.
    Write(ReportState, T),
}

fn key(trace: &TraceId) -> String {
    format!("report.{trace}")
}

fn failed<E: Into<BoxError>>(what: &str, trace: &TraceId) -> impl FnOnce(E) -> ClientError {
    let operation = format!("{what} {trace}");
    move |e| NatsError::new(operation, e).into()
}

impl AxClient {
    /// The report key of `trace` and its revision.
    pub async fn report_state(
        &self,
        trace: &TraceId,
    ) -> Result<Option<(ReportState, u64)>, ClientError> {
        let entry = self
            .claims
            .entry(key(trace))
            .await
            .map_err(failed("read report", trace))?;
        match entry {
            Some(entry) if entry.operation == Operation::Put => {
                Ok(Some((codec::decode(&entry.value)?, entry.revision)))
            }
            _ => Ok(None),
        }
    }

    /// The one way the key changes: read it, let `decide` say what to do with what is there,
    /// and write by create (nothing there) or compare-and-swap (on the revision read); a write
    /// that lost a race reads again and decides again.
    async fn transition<T>(
        &self,
        trace: &TraceId,
        what: &str,
        mut decide: impl FnMut(Option<ReportState>) -> Step<T>,
    ) -> Result<T, ClientError> {
        loop {
            let current = self.report_state(trace).await?;
            let revision = current.as_ref().map(|(_, revision)| *revision);
            let (next, outcome) = match decide(current.map(|(state, _)| state)) {
                Step::Stay(outcome) => return Ok(outcome),
                Step::Write(next, outcome) => (codec::encode(&next)?, outcome),
            };
            let lost = match revision {
                None => match self.claims.create(key(trace), next).await {
                    Ok(_) => false,
                    Err(e) if e.kind() == CreateErrorKind::AlreadyExists => true,
                    Err(e) => return Err(failed(what, trace)(e)),
                },
                Some(revision) => match self.claims.update(key(trace), next, revision).await {
                    Ok(_) => false,
                    Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => true,
                    Err(e) => return Err(failed(what, trace)(e)),
                },
            };
            if !lost {
                return Ok(outcome);
            }
        }
    }

    /// A worker opens the wait for `trace`'s report before it sends the work (so a report sent
    /// the instant the endpoint answers finds it). A report already there — a previous process
    /// of this worker sent the work and got it — is returned: the work is not sent again.
    pub async fn open_report(
        &self,
        trace: &TraceId,
        instance_id: &InstanceId,
        worker: &WorkerId,
    ) -> Result<Option<Report>, ClientError> {
        let waiting = ReportState::Waiting {
            instance_id: instance_id.clone(),
            worker: worker.clone(),
        };
        self.transition(trace, "open report", |current| match current {
            Some(ReportState::Waiting { .. }) => Step::Stay(None),
            Some(ReportState::Reported(report)) => Step::Stay(Some(report)),
            // Nothing yet, or closed by a previous process of the worker that then died.
            None | Some(ReportState::Closed { .. }) => Step::Write(waiting.clone(), None),
        })
        .await
    }

    /// The report of `trace` once one is taken. Follows the key through disconnections (a
    /// watch that ends is opened again); bound it with a timeout.
    pub async fn next_report(&self, trace: &TraceId) -> Report {
        loop {
            if let Ok(mut watch) = self.claims.watch_with_history(key(trace)).await {
                while let Some(Ok(entry)) = watch.next().await {
                    if entry.operation != Operation::Put {
                        continue;
                    }
                    if let Ok(ReportState::Reported(report)) = codec::decode(&entry.value) {
                        return report;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Ends the wait for `trace`'s report for `reason`, unless a report won the race: then it
    /// is returned and the attempt ends with it.
    pub async fn close_report(
        &self,
        trace: &TraceId,
        reason: &str,
    ) -> Result<Option<Report>, ClientError> {
        let closed = ReportState::Closed {
            reason: reason.to_string(),
        };
        self.transition(trace, "close report", |current| match current {
            None | Some(ReportState::Waiting { .. }) => Step::Write(closed.clone(), None),
            Some(ReportState::Reported(report)) => Step::Stay(Some(report)),
            Some(ReportState::Closed { .. }) => Step::Stay(None),
        })
        .await
    }

    /// Hands `report` to the attempt waiting for it, once: the first report of a trace is
    /// taken, a later one is ignored, one after the attempt ended is refused.
    pub async fn deliver_report(
        &self,
        trace: &TraceId,
        report: &Report,
    ) -> Result<Delivery, ClientError> {
        let reported = ReportState::Reported(report.clone());
        self.transition(trace, "report", |current| match current {
            None => Step::Stay(Delivery::Unknown),
            Some(ReportState::Waiting { .. }) => Step::Write(reported.clone(), Delivery::Accepted),
            Some(ReportState::Reported(_)) => Step::Stay(Delivery::AlreadyReported),
            Some(ReportState::Closed { reason }) => Step::Stay(Delivery::Closed(reason)),
        })
        .await
    }

    /// Reports how the work of attempt `trace` ended (its endpoint answered `202 Accepted`),
    /// through the control command, so the report is checked and audited like any command:
    /// the answer's `message` is `reported`, or `already reported: …` for a second report of the
    /// same trace (ignored); a stale or unknown trace is refused with the reason.
    pub async fn report(
        &self,
        request: &crate::messages::ReportRequest,
        timeout: Duration,
    ) -> Result<crate::messages::typed::Done, ClientError> {
        self.send(request, timeout).await
    }
}
