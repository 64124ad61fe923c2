//! `job.exec`: which executor runs the job and its settings, and the rules they must meet.
//!
//! One struct holds the settings of every executor (the wire format stays one flat map, as
//! users write it); [`validate_exec`] refuses a setting that the chosen executor does not take,
//! so a typo such as `url` on a shell job is an error at apply time rather than silently
//! ignored. A `type` that is not built in names a plugin: plugins live on workers, so the
//! spec can only check the name's form; an instance is routed only to workers that offer it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::template::{Scope, Template};
use super::{is_valid_env_name, JobSpec, SpecError};
use crate::ids::JobName;

/// Executor types built into every worker: `shell` runs a command; `noop` succeeds at once
/// without starting anything (a join point in a graph, a probe of the scheduler itself);
/// `http` POSTs the instance to a URL; `python` runs a script or module; `sql` runs a
/// statement against a database named in the worker's config.
pub const BUILTIN_EXECUTORS: &[&str] = &["http", "noop", "python", "shell", "sql"];

/// Whether `name` can name an HTTP header: `[A-Za-z0-9-]+`.
fn is_header_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Whether `name` can name a plugin executor: `[a-z][a-z0-9_-]{0,63}`, not a built-in.
pub fn is_plugin_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        && name.len() <= 64
        && !BUILTIN_EXECUTORS.contains(&name)
}

/// The built-in executor `name` is most likely a misspelling of (one letter off, two for a
/// name of five letters or more), if any: `shel` → `shell`.
pub fn meant_builtin(name: &str) -> Option<&'static str> {
    if BUILTIN_EXECUTORS.contains(&name) {
        return None;
    }
    BUILTIN_EXECUTORS
        .iter()
        .map(|builtin| (edit_distance(name, builtin), *builtin))
        .filter(|(distance, builtin)| *distance <= if builtin.len() < 5 { 1 } else { 2 })
        .min()
        .map(|(_, builtin)| builtin)
}

/// The Levenshtein distance between `a` and `b` (short names: the plain table).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(above + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Whether `name` can name an executor at all: a built-in's or a possible plugin's.
pub fn is_executor_name(name: &str) -> bool {
    BUILTIN_EXECUTORS.contains(&name) || is_plugin_name(name)
}

/// The executor and its settings. Which fields apply depends on `type`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecSpec {
    /// `shell`, `http`, `python`, `sql`, `noop` or a plugin's name.
    #[serde(rename = "type")]
    pub kind: String,
    /// shell: the command, run by `/bin/sh -c`, with placeholders substituted safely.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// shell, python, plugins: the working directory (the worker's own when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// shell, python, plugins: extra environment variables (literal values, never templates).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// http: the URL the instance is POSTed to (`http://` or `https://`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// http: request headers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// http: request headers whose values the worker takes from its own environment (header
    /// name → variable name), so that a secret never sits in the spec.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub header_env: BTreeMap<String, String>,
    /// http: a condition on the JSON response that must hold, besides a 2xx status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_when: Option<SuccessWhen>,
    /// python: the script to run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// python: the module to run (`python -m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// python: arguments; placeholders are substituted, each argument stays one argument.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// python: the virtualenv to run in, created on the worker when it does not exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub venv: Option<String>,
    /// python: packages pip installs into `venv` when it is created.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<String>,
    /// sql: the database, by its name in the worker's `[databases]` config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
    /// sql: the statement; placeholders become bound parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statement: Option<String>,
    /// sql: what becomes the output.
    #[serde(default, skip_serializing_if = "super::is_default")]
    pub output: SqlOutput,
    /// plugins: settings handed to the plugin as they are (a JSON object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub with: Option<serde_json::Map<String, serde_json::Value>>,
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

/// What a `sql` attempt outputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SqlOutput {
    /// `{"rows_affected": n}`.
    #[default]
    RowsAffected,
    /// The first row returned, as an object of its columns (`null` when there is none).
    FirstRow,
}

/// Which executors take each optional setting.
const SETTINGS: &[(&str, &[&str])] = &[
    ("command", &["shell"]),
    ("workdir", &["shell", "python", "plugin"]),
    ("env", &["shell", "python", "plugin"]),
    ("url", &["http"]),
    ("headers", &["http"]),
    ("header_env", &["http"]),
    ("success_when", &["http"]),
    ("script", &["python"]),
    ("module", &["python"]),
    ("args", &["python"]),
    ("venv", &["python"]),
    ("requirements", &["python"]),
    ("database", &["sql"]),
    ("statement", &["sql"]),
    ("output", &["sql"]),
    ("with", &["plugin"]),
];

impl ExecSpec {
    /// Whether the optional setting `name` is set.
    fn is_set(&self, name: &str) -> bool {
        match name {
            "command" => self.command.is_some(),
            "workdir" => self.workdir.is_some(),
            "env" => !self.env.is_empty(),
            "url" => self.url.is_some(),
            "headers" => !self.headers.is_empty(),
            "header_env" => !self.header_env.is_empty(),
            "success_when" => self.success_when.is_some(),
            "script" => self.script.is_some(),
            "module" => self.module.is_some(),
            "args" => !self.args.is_empty(),
            "venv" => self.venv.is_some(),
            "requirements" => !self.requirements.is_empty(),
            "database" => self.database.is_some(),
            "statement" => self.statement.is_some(),
            "output" => self.output != SqlOutput::default(),
            "with" => self.with.is_some(),
            _ => false,
        }
    }

    /// The family of the executor: a built-in's own name, or `plugin`.
    pub fn family(&self) -> &str {
        if BUILTIN_EXECUTORS.contains(&self.kind.as_str()) {
            &self.kind
        } else {
            "plugin"
        }
    }
}

/// The upstream jobs whose output the job's templates may read: those listed once in `deps`.
pub fn readable_upstream(job: &JobSpec) -> Vec<JobName> {
    let mut names: Vec<JobName> = job.deps.iter().map(|d| d.name.clone()).collect();
    names.sort();
    let twice: Vec<JobName> = names
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0].clone())
        .collect();
    names.dedup();
    names.retain(|n| !twice.contains(n));
    names
}

fn check_template(text: &str, job: &JobSpec, field: &str, errors: &mut Vec<SpecError>) {
    let upstream = readable_upstream(job);
    let scope = Scope {
        params: &job.params,
        upstream: &upstream,
    };
    match Template::parse(text, &scope) {
        Ok(template) if field == "job.exec.statement" => {
            if let Err(reason) = template.render_bind(&|_| "?".to_string()) {
                errors.push(SpecError::new(field, reason));
            }
        }
        Ok(_) => {}
        Err(reason) => errors.push(SpecError::new(field, reason)),
    }
}

fn required(value: Option<&String>, field: &str, what: &str, errors: &mut Vec<SpecError>) {
    match value {
        None => errors.push(SpecError::new(
            format!("job.exec.{field}"),
            format!("the {what} executor needs `{field}`"),
        )),
        Some(v) if v.trim().is_empty() => errors.push(SpecError::new(
            format!("job.exec.{field}"),
            format!("`{field}` is empty"),
        )),
        Some(_) => {}
    }
}

/// Checks `job.exec`: a known executor or a plugin name, the settings it needs, none it does
/// not take, and valid templates. Long on purpose: one independent rule after another, each
/// naming its field, read top to bottom like the executors' table in docs/executors.md.
/// The longest shell command: Linux refuses a single argument of 128 KiB or more
/// (`MAX_ARG_STRLEN`, the terminating NUL included), so a longer one could never start.
pub(super) const MAX_COMMAND_BYTES: usize = 128 * 1024 - 1;

pub(super) fn validate_exec(job: &JobSpec, errors: &mut Vec<SpecError>) {
    let exec = &job.exec;
    if !BUILTIN_EXECUTORS.contains(&exec.kind.as_str()) && !is_plugin_name(&exec.kind) {
        errors.push(SpecError::new(
            "job.exec.type",
            format!(
                "unknown executor `{}` (built in: {}; a plugin's name matches [a-z][a-z0-9_-]*)",
                exec.kind,
                BUILTIN_EXECUTORS.join(", ")
            ),
        ));
        return;
    }
    let family = exec.family();
    for (setting, takers) in SETTINGS {
        if exec.is_set(setting) && !takers.contains(&family) {
            let who = if family == "plugin" {
                format!("a plugin executor (`{}`)", exec.kind)
            } else {
                format!("the {family} executor")
            };
            let hint = meant_builtin(&exec.kind)
                .map(|meant| format!("; did you mean `type: {meant}`?"))
                .unwrap_or_default();
            errors.push(SpecError::new(
                format!("job.exec.{setting}"),
                format!(
                    "{who} takes no `{setting}` (a setting of: {}){hint}",
                    takers.join(", ")
                ),
            ));
        }
    }
    match family {
        "shell" => {
            required(exec.command.as_ref(), "command", "shell", errors);
            if let Some(command) = exec.command.as_deref().filter(|c| !c.trim().is_empty()) {
                check_template(command, job, "job.exec.command", errors);
                if command.len() > MAX_COMMAND_BYTES {
                    errors.push(SpecError::new(
                        "job.exec.command",
                        format!(
                            "{} bytes is more than {MAX_COMMAND_BYTES}, the longest argument \
                             Linux passes to `/bin/sh -c` (put a longer script in a file)",
                            command.len()
                        ),
                    ));
                }
            }
        }
        "http" => {
            required(exec.url.as_ref(), "url", "http", errors);
            if let Some(url) = &exec.url {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    errors.push(SpecError::new(
                        "job.exec.url",
                        format!("`{url}` is not an http:// or https:// URL"),
                    ));
                }
            }
            if let Some(when) = &exec.success_when {
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
            for name in exec.headers.keys() {
                if !is_header_name(name) {
                    errors.push(SpecError::new(
                        format!("job.exec.headers.{name}"),
                        "a header name must match [A-Za-z0-9-]+",
                    ));
                }
            }
            for (name, variable) in &exec.header_env {
                let field = format!("job.exec.header_env.{name}");
                if !is_header_name(name) {
                    errors.push(SpecError::new(
                        field.clone(),
                        "a header name must match [A-Za-z0-9-]+",
                    ));
                }
                if exec.headers.keys().any(|h| h.eq_ignore_ascii_case(name)) {
                    errors.push(SpecError::new(
                        field.clone(),
                        "the header is also in `headers`: give it one way",
                    ));
                }
                if !super::is_valid_param_name(variable) {
                    errors.push(SpecError::new(
                        field,
                        format!("`{variable}` is not an environment variable name ([A-Za-z_][A-Za-z0-9_]{{0,63}})"),
                    ));
                }
            }
        }
        "python" => {
            match (&exec.script, &exec.module) {
                (None, None) => errors.push(SpecError::new(
                    "job.exec.script",
                    "the python executor needs `script` or `module`",
                )),
                (Some(_), Some(_)) => errors.push(SpecError::new(
                    "job.exec.module",
                    "give `script` or `module`, not both",
                )),
                _ => {}
            }
            for (i, arg) in exec.args.iter().enumerate() {
                check_template(arg, job, &format!("job.exec.args[{i}]"), errors);
            }
            if !exec.requirements.is_empty() && exec.venv.is_none() {
                errors.push(SpecError::new(
                    "job.exec.requirements",
                    "requirements are installed into a virtualenv: set `venv` too",
                ));
            }
        }
        "sql" => {
            required(exec.database.as_ref(), "database", "sql", errors);
            required(exec.statement.as_ref(), "statement", "sql", errors);
            if let Some(statement) = exec.statement.as_deref().filter(|s| !s.trim().is_empty()) {
                check_template(statement, job, "job.exec.statement", errors);
            }
        }
        _ => {}
    }
    for name in exec.env.keys() {
        if !is_valid_env_name(name) || name.starts_with("AX_") {
            errors.push(SpecError::new(
                format!("job.exec.env.{name}"),
                "an env name must match [A-Za-z_][A-Za-z0-9_]* and not start with AX_",
            ));
        }
    }
}
