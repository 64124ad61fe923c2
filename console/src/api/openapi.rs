//! The OpenAPI 3 document of the API, kept beside the code (`console/openapi.json`) and
//! checked against the running server by the tests, so it cannot drift from what is served.

use actix_web::HttpResponse;

/// The document.
const DOCUMENT: &str = include_str!("../../openapi.json");

/// `GET /api/v1/openapi.json`.
pub(super) async fn document() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(DOCUMENT)
}
