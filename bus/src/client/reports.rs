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

    /// A worker opens the wait for `trace`'s report before it sends the work (so a report sent
    /// the instant the endpoint answers finds it). A report already there — a previous process
    /// of this worker sent the work and got it — is returned: the work is not sent again.
    pub async fn open_report(
        &self,
        trace: &TraceId,
        instance_id: &InstanceId,
        worker: &WorkerId,
    ) -> Result<Option<Report>, ClientError> {
        let waiting = codec::encode(&ReportState::Waiting {
            instance_id: instance_id.clone(),
            worker: worker.clone(),
        })?;
        loop {
            match self.report_state(trace).await? {
                None => match self.claims.create(key(trace), waiting.clone()).await {
                    Ok(_) => return Ok(None),
                    Err(e) if e.kind() == CreateErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(failed("open report", trace)(e)),
                },
                Some((ReportState::Waiting { .. }, _)) => return Ok(None),
                Some((ReportState::Reported(report), _)) => return Ok(Some(report)),
                // Closed by a previous process of the worker that then died: open again.
                Some((ReportState::Closed { .. }, revision)) => {
                    match self
                        .claims
                        .update(key(trace), waiting.clone(), revision)
                        .await
                    {
                        Ok(_) => return Ok(None),
                        Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => continue,
                        Err(e) => return Err(failed("open report", trace)(e)),
                    }
                }
            }
        }
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
        let closed = codec::encode(&ReportState::Closed {
            reason: reason.to_string(),
        })?;
        loop {
            match self.report_state(trace).await? {
                None => match self.claims.create(key(trace), closed.clone()).await {
                    Ok(_) => return Ok(None),
                    Err(e) if e.kind() == CreateErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(failed("close report", trace)(e)),
                },
                Some((ReportState::Waiting { .. }, revision)) => {
                    match self
                        .claims
                        .update(key(trace), closed.clone(), revision)
                        .await
                    {
                        Ok(_) => return Ok(None),
                        Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => continue,
                        Err(e) => return Err(failed("close report", trace)(e)),
                    }
                }
                Some((ReportState::Reported(report), _)) => return Ok(Some(report)),
                Some((ReportState::Closed { .. }, _)) => return Ok(None),
            }
        }
    }

    /// Hands `report` to the attempt waiting for it, once: the first report of a trace is
    /// taken, a later one is ignored, one after the attempt ended is refused.
    pub async fn deliver_report(
        &self,
        trace: &TraceId,
        report: &Report,
    ) -> Result<Delivery, ClientError> {
        let reported = codec::encode(&ReportState::Reported(report.clone()))?;
        loop {
            match self.report_state(trace).await? {
                None => return Ok(Delivery::Unknown),
                Some((ReportState::Waiting { .. }, revision)) => {
                    match self
                        .claims
                        .update(key(trace), reported.clone(), revision)
                        .await
                    {
                        Ok(_) => return Ok(Delivery::Accepted),
                        Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => continue,
                        Err(e) => return Err(failed("report", trace)(e)),
                    }
                }
                Some((ReportState::Reported(_), _)) => return Ok(Delivery::AlreadyReported),
                Some((ReportState::Closed { reason }, _)) => return Ok(Delivery::Closed(reason)),
            }
        }
    }

    /// Reports how the work of attempt `trace` ended (its endpoint answered `202 Accepted`),
    /// through the control command, so the report is checked and audited like any command:
    /// the answer's `message` is `reported`, or `already reported: …` for a second report of the
    /// same trace (ignored); a stale or unknown trace is refused with the reason.
    pub async fn report(
        &self,
        request: &crate::messages::ReportRequest,
        timeout: Duration,
    ) -> Result<crate::messages::ControlReply, ClientError> {
        self.control(crate::messages::commands::REPORT, request, timeout)
            .await
    }
}
