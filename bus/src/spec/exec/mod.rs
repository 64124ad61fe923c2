//! `job.exec`: which executor runs the job, with the settings that executor takes and no other.
//!
//! [`ExecSpec`] has a variant per built-in executor and one for plugins, each a struct of its
//! own settings (a shell job has a command; a python job a script or a module, never both)
//! that checks its own rules. Users write, and the wire carries, one flat map keyed by `type`
//! ([`ExecFields`]); turning it into an `ExecSpec` refuses a setting the executor does not take,
//! naming who takes it, and a setting it needs, so a typo such as `url` on a shell job is an
//! error at apply time rather than silently ignored. A `type` that is not built in names a
//! plugin: plugins live on workers, so the spec can only check the name's form; an instance is
//! routed only to workers that offer it.
//!
//! Adding an executor is compiler-guided: a [`Builtin`] variant makes every exhaustive match
//! ask for its name, its settings, its starting spec (`ax job init`) and its `ExecSpec`
//! variant, whose own matches ask for its rules and its fields on the wire.

mod fields;
mod http;
mod plugin;
mod python;
mod shell;
mod sql;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::template::{Scope, Template};
use super::{is_valid_env_name, JobSpec, SpecError};
use crate::ids::JobName;

pub use fields::{ExecFields, ExecProblems};
pub use http::{HttpExec, SuccessWhen};
pub use plugin::PluginExec;
pub use python::{PythonEntry, PythonExec};
pub use shell::ShellExec;
pub use sql::{SqlExec, SqlOutput};

/// The executor and its settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "ExecFields", into = "ExecFields")]
pub enum ExecSpec {
    /// Runs a command with `/bin/sh -c`.
    Shell(ShellExec),
    /// POSTs the instance to a URL.
    Http(HttpExec),
    /// Runs a Python script or module.
    Python(PythonExec),
    /// Runs a statement against a database of the worker's config.
    Sql(SqlExec),
    /// Succeeds at once without starting anything (a join point in a graph, a probe of the
    /// scheduler itself).
    Noop,
    /// An executor a worker's plugin directory offers.
    Plugin(PluginExec),
}

/// The executors built into every worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Builtin {
    /// `http`.
    Http,
    /// `noop`.
    Noop,
    /// `python`.
    Python,
    /// `shell`.
    Shell,
    /// `sql`.
    Sql,
}

impl Builtin {
    /// Every built-in executor, by name.
    pub const ALL: [Builtin; 5] = [
        Builtin::Http,
        Builtin::Noop,
        Builtin::Python,
        Builtin::Shell,
        Builtin::Sql,
    ];

    /// Its `type`.
    pub fn name(self) -> &'static str {
        match self {
            Builtin::Http => "http",
            Builtin::Noop => "noop",
            Builtin::Python => "python",
            Builtin::Shell => "shell",
            Builtin::Sql => "sql",
        }
    }

    /// The built-in executor of type `name`, if any.
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.name() == name)
    }

    /// The settings it takes besides `type`.
    fn settings(self) -> &'static [&'static str] {
        match self {
            Builtin::Http => HttpExec::SETTINGS,
            Builtin::Noop => &[],
            Builtin::Python => PythonExec::SETTINGS,
            Builtin::Shell => ShellExec::SETTINGS,
            Builtin::Sql => SqlExec::SETTINGS,
        }
    }

    /// The `exec:` block `ax job init` writes for it: its settings, commented.
    pub fn starting_spec(self) -> &'static str {
        match self {
            Builtin::Http => HttpExec::STARTING_SPEC,
            Builtin::Noop => {
                "  exec:\n    type: noop                         # does nothing and succeeds: for wiring and tests\n"
            }
            Builtin::Python => PythonExec::STARTING_SPEC,
            Builtin::Shell => ShellExec::STARTING_SPEC,
            Builtin::Sql => SqlExec::STARTING_SPEC,
        }
    }
}

/// The names of the built-in executors, comma-separated.
pub fn builtin_names() -> String {
    Builtin::ALL.map(Builtin::name).join(", ")
}

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
        && Builtin::named(name).is_none()
}

/// The built-in executor `name` is most likely a misspelling of (one letter off, two for a
/// name of five letters or more), if any: `shel` → `shell`.
pub fn meant_builtin(name: &str) -> Option<&'static str> {
    if Builtin::named(name).is_some() {
        return None;
    }
    Builtin::ALL
        .iter()
        .map(|builtin| (edit_distance(name, builtin.name()), builtin.name()))
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
    Builtin::named(name).is_some() || is_plugin_name(name)
}

impl ExecSpec {
    /// A shell job running `command`, nothing else set.
    pub fn shell(command: impl Into<String>) -> Self {
        ExecSpec::Shell(ShellExec {
            command: command.into(),
            workdir: None,
            env: BTreeMap::new(),
        })
    }

    /// Its `type`: a built-in's name or the plugin's.
    pub fn name(&self) -> &str {
        match self {
            ExecSpec::Plugin(plugin) => &plugin.name,
            _ => self.builtin().map_or("", Builtin::name),
        }
    }

    /// The built-in executor it runs on (`None`: a plugin).
    pub fn builtin(&self) -> Option<Builtin> {
        match self {
            ExecSpec::Shell(_) => Some(Builtin::Shell),
            ExecSpec::Http(_) => Some(Builtin::Http),
            ExecSpec::Python(_) => Some(Builtin::Python),
            ExecSpec::Sql(_) => Some(Builtin::Sql),
            ExecSpec::Noop => Some(Builtin::Noop),
            ExecSpec::Plugin(_) => None,
        }
    }

    /// The working directory of a process it starts (the worker's own when `None`).
    pub fn workdir(&self) -> Option<&str> {
        match self {
            ExecSpec::Shell(shell) => shell.workdir.as_deref(),
            ExecSpec::Python(python) => python.workdir.as_deref(),
            ExecSpec::Plugin(plugin) => plugin.workdir.as_deref(),
            ExecSpec::Http(_) | ExecSpec::Sql(_) | ExecSpec::Noop => None,
        }
    }

    /// The extra environment variables of a process it starts (none for an executor that
    /// starts no process).
    pub fn env(&self) -> &BTreeMap<String, String> {
        static NONE: BTreeMap<String, String> = BTreeMap::new();
        match self {
            ExecSpec::Shell(shell) => &shell.env,
            ExecSpec::Python(python) => &python.env,
            ExecSpec::Plugin(plugin) => &plugin.env,
            ExecSpec::Http(_) | ExecSpec::Sql(_) | ExecSpec::Noop => &NONE,
        }
    }

    /// The texts whose placeholders an attempt fills in (the command, the arguments, the
    /// statement).
    pub fn templates(&self) -> Vec<&str> {
        match self {
            ExecSpec::Shell(shell) => vec![shell.command.as_str()],
            ExecSpec::Python(python) => python.args.iter().map(String::as_str).collect(),
            ExecSpec::Sql(sql) => vec![sql.statement.as_str()],
            ExecSpec::Http(_) | ExecSpec::Noop | ExecSpec::Plugin(_) => Vec::new(),
        }
    }

    /// Checks the rules of its executor, each problem naming its field.
    fn validate(&self, job: &JobSpec, errors: &mut Vec<SpecError>) {
        match self {
            ExecSpec::Shell(shell) => shell.validate(job, errors),
            ExecSpec::Http(http) => http.validate(errors),
            ExecSpec::Python(python) => python.validate(job, errors),
            ExecSpec::Sql(sql) => sql.validate(job, errors),
            ExecSpec::Noop => {}
            ExecSpec::Plugin(plugin) => plugin.validate(errors),
        }
        for name in self.env().keys() {
            if !is_valid_env_name(name) || name.starts_with("AX_") {
                errors.push(SpecError::new(
                    format!("job.exec.env.{name}"),
                    "an env name must match [A-Za-z_][A-Za-z0-9_]* and not start with AX_",
                ));
            }
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

/// Checks that `text`, a template of `field`, parses against the job's params and readable
/// upstream jobs (a statement's placeholders must each stand where a bound value can).
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

/// A setting that may not be blank: `` `field` is empty`` when it is.
fn not_blank(value: &str, field: &str, errors: &mut Vec<SpecError>) -> bool {
    if value.trim().is_empty() {
        errors.push(SpecError::new(
            format!("job.exec.{field}"),
            format!("`{field}` is empty"),
        ));
        return false;
    }
    true
}

/// The longest shell command: Linux refuses a single argument of 128 KiB or more
/// (`MAX_ARG_STRLEN`, the terminating NUL included), so a longer one could never start.
pub(super) const MAX_COMMAND_BYTES: usize = 128 * 1024 - 1;

/// Checks `job.exec`: the rules of its executor, and valid templates.
pub(super) fn validate_exec(job: &JobSpec, errors: &mut Vec<SpecError>) {
    job.exec.validate(job, errors);
}
