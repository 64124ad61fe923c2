//! An attempt's log on the instance page: a tab per attempt, the shipped stdout and stderr in
//! the order they were written, and — while the attempt runs — a poller that appends what was
//! shipped since, every second, from the stream position it last read (never the whole log
//! again), until the attempt is over and its log's end has arrived (or is a few seconds
//! overdue): then the page reloads, showing the ended attempt.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use serde::Deserialize;

use ax_bus::ids::InstanceId;
use ax_bus::log::{AttemptLog, LogEnd, LogStream};
use ax_bus::{AxClient, InstanceRecord};

use crate::pages;
use crate::server::State;

/// Polls of an attempt that is over while its log has no end yet (its last chunk may still be
/// on the way) before the page stops following.
const OVER_POLLS: u32 = 5;

pub(crate) fn routes(config: &mut web::ServiceConfig) {
    config.route("/ui/instances/{id}/log", web::get().to(more));
}

/// One piece of log as shown: its stream (a CSS class) and its text.
pub(crate) struct Shown {
    pub(crate) class: &'static str,
    pub(crate) text: String,
}

/// The log section of the instance page.
pub(crate) struct LogView {
    /// Every attempt, for the tabs.
    pub(crate) attempts: Vec<u32>,
    /// The attempt shown.
    pub(crate) shown: u32,
    pub(crate) pieces: Vec<Shown>,
    /// Still following: the poller asks for what comes after stream sequence `after`.
    pub(crate) live: bool,
    pub(crate) after: u64,
    /// What there is to say under the log.
    pub(crate) note: String,
}

/// The pieces of `log`, decoded as text (stdout and stderr each decoded whole where a piece
/// split a character).
fn shown(log: &AttemptLog) -> Vec<Shown> {
    let mut out: Vec<(LogStream, Vec<u8>)> = Vec::new();
    for piece in log.pieces() {
        match out.last_mut() {
            Some((stream, data)) if *stream == piece.stream => data.extend_from_slice(&piece.data),
            _ => out.push((piece.stream, piece.data.clone())),
        }
    }
    out.into_iter()
        .map(|(stream, data)| Shown {
            class: stream.as_str(),
            text: String::from_utf8_lossy(&data).into_owned(),
        })
        .collect()
}

/// Whether attempt `attempt` of `record` is over.
fn over(record: &InstanceRecord, attempt: u32) -> bool {
    record.attempt > attempt || record.state.is_final()
}

/// What is said under a log whose end arrived.
fn end_note(end: LogEnd) -> String {
    if end.left_out > 0 {
        format!(
            "{} bytes written; {} left out (the log is capped), the last {} kept",
            end.bytes, end.left_out, end.tail
        )
    } else {
        format!("{} bytes written, all shown", end.bytes)
    }
}

/// What is said under an attempt's log, read whole, that is no longer followed.
fn note_for(log: &AttemptLog, record: &InstanceRecord, attempt: u32) -> String {
    match log.end() {
        Some(end) => end_note(end),
        None if log.is_empty() && attempt == record.attempt => {
            "no log was shipped for this attempt (it wrote nothing, its executor writes none, or its log is past the retention): the record's tails are below".into()
        }
        None if log.is_empty() => {
            "no log was shipped for this attempt (it wrote nothing, or its log is past the retention)".into()
        }
        None => OVER_WITHOUT_END.into(),
    }
}

/// Said when an attempt is over and the end of its log has not arrived.
const OVER_WITHOUT_END: &str =
    "the attempt is over; the end of its log has not arrived (reload to look again)";

/// The log section for attempt `wanted` (the last one when `None` or out of range).
pub(crate) async fn view(
    client: &AxClient,
    record: &InstanceRecord,
    wanted: Option<u32>,
) -> Result<LogView, ax_bus::ClientError> {
    let shown_attempt = wanted
        .filter(|a| (1..=record.attempt).contains(a))
        .unwrap_or(record.attempt);
    let (log, after) = client
        .attempt_log_after(&record.instance_id, shown_attempt, 0)
        .await?;
    let live = log.end().is_none() && !over(record, shown_attempt);
    Ok(LogView {
        attempts: (1..=record.attempt).collect(),
        shown: shown_attempt,
        pieces: shown(&log),
        live,
        after,
        note: if live {
            String::new()
        } else {
            note_for(&log, record, shown_attempt)
        },
    })
}

#[derive(Deserialize)]
struct MoreQuery {
    attempt: u32,
    #[serde(default)]
    after: u64,
    /// Polls made since the attempt was seen over.
    #[serde(default)]
    waited: u32,
}

/// What a poll answers: the pieces shipped since (appended to the log out of band) and the
/// next poller. Once the attempt is over and its log has ended (or its end is overdue), the
/// page is reloaded instead (`HX-Refresh`), so that its state, actions and history are those
/// of the ended attempt.
#[derive(Template)]
#[template(path = "log_more.html")]
struct More {
    id: String,
    attempt: u32,
    pieces: Vec<Shown>,
    after: u64,
    waited: u32,
}

async fn more(
    state: web::Data<State>,
    request: HttpRequest,
    id: web::Path<String>,
    query: web::Query<MoreQuery>,
) -> HttpResponse {
    let client = pages::or_return!(pages::client(&state, &request));
    let Ok(id) = id.parse::<InstanceId>() else {
        return failed(
            StatusCode::BAD_REQUEST,
            "instance: not an instance id".into(),
        );
    };
    let query = query.into_inner();
    let read = tokio::try_join!(
        client.instance(&id),
        client.attempt_log_after(&id, query.attempt, query.after)
    );
    let (record, (log, after)) = match read {
        Ok((Some((record, _)), log)) => (record, log),
        Ok((None, _)) => {
            return failed(
                StatusCode::NOT_FOUND,
                format!("instance: {}", ax_bus::client::retention::missing(id)),
            )
        }
        Err(e) => {
            // Not swapped in (htmx leaves an error status alone): the poller asks again.
            return failed(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the log could not be read: {e}"),
            );
        }
    };
    let over = over(&record, query.attempt);
    let waited = if over { query.waited + 1 } else { 0 };
    let page = More {
        id: id.to_string(),
        attempt: query.attempt,
        pieces: shown(&log),
        after,
        waited,
    };
    let mut response = pages::html(StatusCode::OK, &page);
    if over && (log.end().is_some() || waited > OVER_POLLS) {
        response.headers_mut().insert(
            actix_web::http::header::HeaderName::from_static("hx-refresh"),
            actix_web::http::header::HeaderValue::from_static("true"),
        );
    }
    response
}

fn failed(status: StatusCode, reason: String) -> HttpResponse {
    pages::html(status, &pages::Outcome::failed(reason))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ax_bus::log::{LogChunk, LogPiece};

    #[test]
    fn a_character_split_between_chunks_is_shown_whole() {
        let mut log = AttemptLog::default();
        let bytes = "é\n".as_bytes();
        for (seq, data) in [(1, &bytes[..1]), (2, &bytes[1..])] {
            log.add(LogChunk {
                seq,
                at: ax_bus::time::now(),
                pieces: vec![LogPiece {
                    stream: LogStream::Stdout,
                    data: data.to_vec(),
                }],
                end: None,
            });
        }
        let pieces = shown(&log);
        assert_eq!(pieces.len(), 1);
        assert_eq!(
            (pieces[0].class, pieces[0].text.as_str()),
            ("stdout", "é\n")
        );
    }
}
