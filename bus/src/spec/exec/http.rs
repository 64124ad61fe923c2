//! `type: http`: the instance POSTed to a URL.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{is_header_name, not_blank};
use crate::spec::SpecError;

/// The settings of an http job.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpExec {
    /// The URL the instance is POSTed to (`http://` or `https://`).
    pub url: String,
    /// Request headers.
    pub headers: BTreeMap<String, String>,
    /// Request headers whose values the worker takes from its own environment (header name →
    /// variable name), so that a secret never sits in the spec.
    pub header_env: BTreeMap<String, String>,
    /// A condition on the JSON response that must hold, besides a 2xx status.
    pub success_when: Option<SuccessWhen>,
}

/// `success_when`: the value at a JSON pointer of the response must equal `equals`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuccessWhen {
    /// A JSON pointer (`/status`, `/result/ok`).
    pub path: String,
    /// The value it must have.
    pub equals: serde_json::Value,
}

impl HttpExec {
    /// The settings it takes besides `type`.
    pub(super) const SETTINGS: &'static [&'static str] =
        &["url", "headers", "header_env", "success_when"];

    /// `ax job init`'s block for it.
    pub(super) const STARTING_SPEC: &'static str = "  exec:
    type: http
    # POSTs {instanceId, traceId, job, bizDate, params, attempt, expectedTime} as JSON. A 2xx
    # answer is a success; 202 Accepted means the work is reported later with
    # `report(traceId, success, message)` (docs/integration.md). Use instanceId as the request
    # id your service de-duplicates on.
    url: http://127.0.0.1:8000/jobs/run
    # headers: { X-Team: billing }
    # header_env: { Authorization: BILLING_API_TOKEN }   # the value comes from the worker's env
    # success_when: { path: /status, equals: ok }
";

    pub(super) fn validate(&self, errors: &mut Vec<SpecError>) {
        let url = &self.url;
        if not_blank(url, "url", errors)
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            errors.push(SpecError::new(
                "job.exec.url",
                format!("`{url}` is not an http:// or https:// URL"),
            ));
        }
        if let Some(when) = &self.success_when {
            if !when.path.is_empty() && !when.path.starts_with('/') {
                errors.push(SpecError::new(
                    "job.exec.success_when.path",
                    format!(
                        "`{}` is not a JSON pointer (write `/field/inner`)",
                        when.path
                    ),
                ));
            }
        }
        for name in self.headers.keys() {
            if !is_header_name(name) {
                errors.push(SpecError::new(
                    format!("job.exec.headers.{name}"),
                    "a header name must match [A-Za-z0-9-]+",
                ));
            }
        }
        for (name, variable) in &self.header_env {
            let field = format!("job.exec.header_env.{name}");
            if !is_header_name(name) {
                errors.push(SpecError::new(
                    field.clone(),
                    "a header name must match [A-Za-z0-9-]+",
                ));
            }
            if self.headers.keys().any(|h| h.eq_ignore_ascii_case(name)) {
                errors.push(SpecError::new(
                    field.clone(),
                    "the header is also in `headers`: give it one way",
                ));
            }
            if !crate::spec::is_valid_param_name(variable) {
                errors.push(SpecError::new(
                    field,
                    format!("`{variable}` is not an environment variable name ([A-Za-z_][A-Za-z0-9_]{{0,63}})"),
                ));
            }
        }
    }
}
