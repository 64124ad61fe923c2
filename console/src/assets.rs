//! The console's static files, vendored and compiled in: htmx (0BSD, from npm's `htmx.org`,
//! `static/htmx.min.js`), the console's own small script and its stylesheet. Nothing is
//! fetched from elsewhere, so the console works offline and under a strict CSP.

use actix_web::http::header::{self, HeaderValue};
use actix_web::{web, HttpResponse};

/// Each file: its name under `/static/`, content type and bytes.
const FILES: [(&str, &str, &[u8]); 3] = [
    (
        "htmx.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../static/htmx.min.js"),
    ),
    (
        "console.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../static/console.js"),
    ),
    (
        "console.css",
        "text/css; charset=utf-8",
        include_bytes!("../static/console.css"),
    ),
];

/// `GET /static/{name}`.
pub(crate) fn routes(config: &mut web::ServiceConfig) {
    config.route("/static/{name}", web::get().to(file));
}

async fn file(name: web::Path<String>) -> HttpResponse {
    match FILES.iter().find(|(file, _, _)| *file == name.as_str()) {
        Some((_, content_type, bytes)) => HttpResponse::Ok()
            .content_type(*content_type)
            .insert_header((
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=3600"),
            ))
            .body(*bytes),
        None => HttpResponse::NotFound().finish(),
    }
}
