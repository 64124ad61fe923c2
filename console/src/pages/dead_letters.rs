//! Dead letters: the list (with bulk replay), one letter's headers and payload, and the replay
//! — through [`crate::actions::replay`], the call `ax dlq replay` makes.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;

use ax_bus::dead_letter::DeadLetter;
use ax_bus::messages::commands::Command;

use crate::actions;
use crate::changes::{changes, Does};
use crate::pages::{self, Chrome, Done, Results};
use crate::server::State;

/// The most letters one bulk replay takes.
const MAX_REPLAY: usize = 500;

pub(crate) fn routes(config: &mut web::ServiceConfig) {
    config
        .route("/dlq", web::get().to(list))
        .route("/dlq/{id}", web::get().to(letter));
}

changes! {
    POST "/ui/dlq/replay" => replay, Does::Command(Command::Replay);
}

struct LetterRow {
    id: u64,
    /// What became of its instance since (`open`, `resolved: …`).
    now: String,
    at: String,
    kind: String,
    job: String,
    instance: Option<String>,
    subject: String,
    reason: String,
}

impl LetterRow {
    fn of(letter: DeadLetter, now: String) -> LetterRow {
        LetterRow {
            id: letter.id,
            now,
            at: pages::time(letter.at),
            kind: letter.kind,
            job: letter.job.unwrap_or_else(|| "–".into()),
            instance: letter.instance,
            subject: letter.subject,
            reason: letter.reason,
        }
    }
}

#[derive(Template)]
#[template(path = "dlq.html")]
struct ListPage {
    chrome: Chrome,
    letters: Vec<LetterRow>,
}

async fn list(state: web::Data<State>, request: HttpRequest) -> HttpResponse {
    let client = pages::or_return!(pages::client(&state, &request));
    match client.dead_letters().await {
        Ok(letters) => {
            let mut rows = Vec::with_capacity(letters.len());
            for letter in letters.into_iter().rev() {
                let now = crate::actions::standing(client, &letter).await.to_string();
                rows.push(LetterRow::of(letter, now));
            }
            pages::html(
                StatusCode::OK,
                &ListPage {
                    chrome: Chrome::of(&pages::caller(&request), "dlq"),
                    letters: rows,
                },
            )
        }
        Err(e) => pages::error_page(&request, StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

#[derive(Template)]
#[template(path = "dead_letter.html")]
struct LetterPage {
    chrome: Chrome,
    id: u64,
    subject: String,
    bytes: usize,
    headers: Vec<(String, String)>,
    payload: String,
}

async fn letter(
    state: web::Data<State>,
    request: HttpRequest,
    id: web::Path<String>,
) -> HttpResponse {
    let client = pages::or_return!(pages::client(&state, &request));
    let Some(id) = id.parse::<u64>().ok().filter(|id| *id > 0) else {
        return pages::error_page(
            &request,
            StatusCode::BAD_REQUEST,
            format!("id: `{id}` is not a dead letter's number"),
        );
    };
    let message = match client.dead_letter(id).await {
        Ok(Some(message)) => message,
        Ok(None) => {
            return pages::error_page(
                &request,
                StatusCode::NOT_FOUND,
                format!("id: no dead letter {id}"),
            )
        }
        Err(e) => {
            return pages::error_page(&request, StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
    };
    let mut headers: Vec<(String, String)> = message
        .headers
        .iter()
        .flat_map(|(name, values)| {
            values
                .iter()
                .map(move |v| (name.to_string(), v.as_str().to_string()))
        })
        .collect();
    headers.sort();
    // Shown decoded when it is MessagePack or JSON, as text otherwise.
    let payload = match ax_bus::codec::decode::<serde_json::Value>(&message.payload) {
        Ok(value) => serde_json::to_string_pretty(&value).unwrap_or_default(),
        Err(_) => String::from_utf8_lossy(&message.payload).into_owned(),
    };
    let page = LetterPage {
        chrome: Chrome::of(&pages::caller(&request), "dlq"),
        id,
        subject: message.subject.to_string(),
        bytes: message.payload.len(),
        headers,
        payload,
    };
    pages::html(StatusCode::OK, &page)
}

/// `POST /ui/dlq/replay` with one `id` per letter: each replayed, or why not.
async fn replay(state: web::Data<State>, request: HttpRequest, body: web::Bytes) -> HttpResponse {
    let client = pages::or_return!(pages::client(&state, &request));
    let ids = pages::repeated(&body, "id");
    if ids.is_empty() || ids.len() > MAX_REPLAY {
        return pages::action_failed(&crate::problem::Problem::Malformed(format!(
            "id: select between 1 and {MAX_REPLAY} dead letters"
        )));
    }
    let by = pages::caller(&request).principal.name;
    let mut results = Vec::new();
    for text in ids {
        let Ok(id) = text.parse::<u64>() else {
            results.push(Done {
                ok: false,
                text: format!("id: `{text}` is not a dead letter's number"),
            });
            continue;
        };
        results.push(match actions::replay(client, id, &by).await {
            Ok(replayed) => Done {
                ok: true,
                text: format!(
                    "dead letter {id} replayed ({}) and removed",
                    replayed.detail["action"].as_str().unwrap_or("?")
                ),
            },
            Err(e) => Done {
                ok: false,
                text: format!("dead letter {id}: {e}"),
            },
        });
    }
    pages::html(StatusCode::OK, &Results { results })
}
