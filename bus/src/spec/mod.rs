//! The job spec v1: what a user writes (YAML, one job per document) and what travels on
//! `ax.control.apply` (MessagePack or JSON).
//!
//! - [`JobSpec`] and its parts, with unknown fields refused at every level;
//! - [`validate`]: every rule a spec must meet, returning all problems at once, each naming the
//!   field (`job.cron`, `job.exec.command`, ...);
//! - [`yaml`]: parsing files with line numbers, so each problem reads `file:line: field: reason`;
//! - [`cron_expr`]: 5- and 6-field cron expressions with classic semantics;
//! - [`template`]: `{{biz_date}}`-style placeholders and their safe substitution;
//! - [`graph`]: rules that need every job in view: unknown dependencies and cycles.
//!
//! Validation lives here, next to the type, so the CLI (before publishing) and the Scheduler
//! (on receipt, for clients that skip the CLI) apply exactly the same rules.

pub mod cron_expr;
pub mod dataset;
mod exec;
pub mod files;
pub mod graph;
pub mod redact;
pub mod resources;
pub mod seconds;
mod shell_context;
pub mod template;
pub mod yaml;

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::JobName;

use exec::validate_exec;
pub use exec::{
    builtin_names, is_executor_name, is_plugin_name, meant_builtin, readable_upstream, Builtin,
    ExecFields, ExecProblems, ExecSpec, HttpExec, PluginExec, PythonEntry, PythonExec, ShellExec,
    SqlExec, SqlOutput, SuccessWhen,
};

/// The only spec version so far.
pub const VERSION: &str = "v1";
/// Seconds an attempt may run when the spec sets no `timeout`.
pub const DEFAULT_TIMEOUT_SECS: u64 = 60;
/// How far back missed fires are caught up when the spec sets no `catchup_window`.
pub const DEFAULT_CATCHUP_WINDOW_SECS: u64 = 3600;
/// The furthest a dependency may look back (the DagCoordinator keeps 40 days of history).
pub const MAX_DEP_OFFSET_DAYS: i64 = 31;
const MAX_RETRY_TIMES: u32 = 100;
/// The longest `timeout` (seconds): a week.
pub const MAX_TIMEOUT_SECS: u64 = 7 * 86_400;
/// The longest `retry.interval` and `retry.max_interval`, and the longest wait between two
/// attempts however many doublings (seconds): a day.
pub const MAX_RETRY_WAIT_SECS: u64 = 86_400;
/// The longest `deps_timeout` (seconds): a week.
pub const MAX_DEPS_TIMEOUT_SECS: u64 = 7 * 86_400;
/// The shortest `lease` (seconds): the Routers' default worker TTL, which a lease lengthens.
pub const MIN_LEASE_SECS: u64 = 10;
/// The longest `lease` (seconds): a day.
pub const MAX_LEASE_SECS: u64 = 86_400;
/// How long before its lease ends a worker cut off from NATS stops an attempt (seconds): the
/// margin between a worker's self-fencing and the earliest moment a Router may hand the
/// attempt to another worker.
pub const LEASE_FENCE_MARGIN_SECS: u64 = 5;
/// The longest `freshness` (seconds): 31 days.
pub const MAX_FRESHNESS_SECS: u64 = 31 * 86_400;
/// The shortest `retention` (seconds).
pub const MIN_RETENTION_SECS: u64 = 1;
/// The longest `retention` (seconds): ten years.
pub const MAX_RETENTION_SECS: u64 = 3660 * 86_400;
/// The longest `catchup_window` (seconds): 31 days.
pub const MAX_CATCHUP_WINDOW_SECS: u64 = 31 * 86_400;
/// The most bytes of params, as JSON: a job's own, and a trigger's merged with them. (Params
/// travel in every hand-off of an attempt, whose messages NATS caps at 1 MiB.)
pub const MAX_PARAMS_BYTES: usize = 64 * 1024;
/// The most bytes of one job's spec, as JSON (its params included).
pub const MAX_SPEC_BYTES: usize = 256 * 1024;

/// One YAML document: `version` and `job`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobDocument {
    /// Always `v1`.
    pub version: String,
    /// The job.
    pub job: JobSpec,
}

/// A job definition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// `[a-z0-9_-]{1,64}`, unique in its namespace; after its namespace (`payments.settle`)
    /// outside `default` once [`JobSpec::settle_namespace`] has taken in `namespace`. Checked by
    /// [`validate`] with every other rule (so that all of a spec's problems are told at once),
    /// not when decoded.
    #[serde(deserialize_with = "unchecked_name")]
    pub name: JobName,
    /// The namespace as the spec's author wrote it (`default` when absent), taken into `name`
    /// and the dependencies' names by [`JobSpec::settle_namespace`]: a stored spec holds none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// 5 fields (from minutes) or 6 (from seconds); a job without cron runs when triggered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// An instant (RFC 3339): the job fires once then (its business date in `timezone`), and
    /// stays defined without firing again. Not together with `cron`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// IANA time zone of the cron expression and of the business date.
    #[serde(default = "default_timezone")]
    pub timezone: String,
    /// Upstream jobs that must have succeeded for the same business date.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deps: Vec<DepSpec>,
    /// How the work is executed.
    pub exec: ExecSpec,
    /// Parameters, visible to templates (`{{params.x}}`) and as `AX_PARAM_<x>`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, serde_json::Value>,
    /// Retries after a failed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    /// Seconds an attempt may run (60 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    /// What a timeout does before it kills: the stack-dump signal and its grace period.
    #[serde(default, skip_serializing_if = "is_default")]
    pub on_timeout: OnTimeoutSpec,
    /// How long a running attempt may go without its worker being heard before another
    /// attempt may start (`60s`, `5m`; at least 10 s): its worker cut off from NATS keeps the
    /// command running until 5 s before the lease ends, and no Router hands the attempt to
    /// another worker before it has. Absent: the Routers' worker TTL (10 s), the worker
    /// stopping the command after 5 s without NATS.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "seconds::optional"
    )]
    pub lease: Option<u64>,
    /// Only workers having all these tags run the job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Queue the job's instances go through.
    #[serde(default)]
    pub priority: Priority,
    /// Seconds an instance may wait for its dependencies before it fails (`deps_timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deps_timeout: Option<u64>,
    /// What happens to fires missed while no Scheduler ran.
    #[serde(default, skip_serializing_if = "is_default")]
    pub misfire: Misfire,
    /// Seconds back from now within which missed fires are caught up (3600 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catchup_window: Option<u64>,
    /// What happens when a fire comes while the previous instance still runs.
    #[serde(default, skip_serializing_if = "is_default")]
    pub overlap: Overlap,
    /// Split each instance into this many shards, routed independently (`AX_SHARD_INDEX`,
    /// `AX_SHARD_TOTAL`); the instance succeeds when every shard has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<u32>,
    /// Run each instance once on every eligible worker.
    #[serde(default, skip_serializing_if = "is_default")]
    pub broadcast: bool,
    /// How long its finished instances' records are kept after they end (`90d`; from
    /// [`MIN_RETENTION_SECS`] to [`MAX_RETENTION_SECS`]). Absent: the Schedulers' `[retention]
    /// instances` (30 days by default).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "seconds::optional"
    )]
    pub retention: Option<u64>,
    /// The datasets its runs write (`scheme://name[/path]`, see [`dataset`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub produces: Vec<dataset::DatasetUri>,
    /// The datasets its runs read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumes: Vec<dataset::DatasetUri>,
    /// Run by its data: an instance for a business date is created once every one of these
    /// (each also under `consumes`) has been updated for that date, besides its cron fires if
    /// it has a cron (the same instance when the cron fires at the date's midnight).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub on_datasets: Vec<dataset::DatasetUri>,
    /// What a later update of an input does to a date already run (with `on_datasets`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub rerun: DataRerun,
    /// How long after the start of a business date each of these produced datasets must have
    /// been updated for that date (seconds; `26h` written): later, a `freshness` alert.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "seconds::map"
    )]
    pub freshness: BTreeMap<dataset::DatasetUri, u64>,
    /// What one attempt may use on its worker (memory, CPU, processes), enforced in a cgroup of
    /// its own: see [`resources`].
    #[serde(default, skip_serializing_if = "resources::Resources::is_empty")]
    pub resources: resources::Resources,
}

/// What a job run by its data does when one of its inputs is updated again for a business
/// date it has run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataRerun {
    /// Nothing (`ax rerun` can).
    #[default]
    Never,
    /// A new attempt of that date's instance, whatever its first run came to.
    Always,
    /// A new attempt only if that date's instance succeeded.
    IfSucceeded,
}

/// The most shards an instance may have.
pub const MAX_SHARDS: u32 = 1000;
/// The farthest ahead a job's `at` may ever be (ten years). The Schedulers hold both a job's
/// `at` and a delayed trigger to their own, shorter limit (`[scheduler] max_delay_days`, a
/// year by default).
pub const MAX_AT_DAYS: i64 = 3660;

impl JobSpec {
    /// Takes `namespace:` into the names: the job's own becomes `<namespace>.<name>`, and so
    /// does each dependency named without a namespace (a dependency on a `default` job is
    /// written `default/<name>`); every name is then written as ax writes it
    /// (`payments/settle` as `payments.settle`). Idempotent; what breaks a rule is left as it
    /// is, for [`validate`] to name.
    pub fn settle_namespace(&mut self) {
        let namespace = match self.namespace.as_deref() {
            Some(ns) if crate::ids::Namespace::parse(ns).is_err() => return,
            Some(crate::ids::DEFAULT_NAMESPACE) | None => None,
            Some(ns) => Some(ns.to_string()),
        };
        let settle = |name: &JobName| -> JobName {
            let raw = name.as_str();
            let written = match &namespace {
                Some(ns) if !raw.contains(['.', '/']) => format!("{ns}.{raw}"),
                _ => raw.to_string(),
            };
            JobName::parse(&written).unwrap_or_else(|_| JobName::unchecked(written))
        };
        if namespace.is_some() && self.name.contains(['.', '/']) {
            return; // named twice: validate says so
        }
        self.name = settle(&self.name);
        for dep in &mut self.deps {
            dep.name = settle(&dep.name);
        }
        self.namespace = None;
    }

    /// Whether instances of this job split into sub-instances (shards or a broadcast).
    pub fn splits(&self) -> bool {
        self.broadcast || self.shards.is_some_and(|n| n > 1)
    }
}

fn unchecked_name<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<JobName, D::Error> {
    String::deserialize(deserializer).map(JobName::unchecked)
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// What happens to cron fires missed while no Scheduler ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Misfire {
    /// Record them as skipped.
    Skip,
    /// Run the latest one inside the catch-up window, skip the others.
    #[default]
    FireOnce,
    /// Run every one inside the catch-up window, in order.
    FireAll,
}

/// What happens when a fire comes while the job's previous instance still runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Run both.
    #[default]
    Allow,
    /// Do not create the new instance; record the tick as skipped.
    Skip,
    /// Create it, and run it once the previous one has ended.
    Queue,
    /// Cancel the previous one (killing it if it runs), then run the new one.
    CancelPrevious,
}

fn default_timezone() -> String {
    "UTC".to_string()
}

impl JobSpec {
    /// The timeout in seconds, defaulted.
    pub fn timeout_secs(&self) -> u64 {
        self.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS)
    }

    /// How long a worker cut off from NATS keeps an attempt of this job running: 5 s short of
    /// its lease (5 s without a lease).
    pub fn fence_after(&self) -> std::time::Duration {
        let lease = self.lease.unwrap_or(MIN_LEASE_SECS);
        std::time::Duration::from_secs(lease.saturating_sub(LEASE_FENCE_MARGIN_SECS))
    }

    /// The catch-up window in seconds, defaulted.
    pub fn catchup_window_secs(&self) -> u64 {
        self.catchup_window.unwrap_or(DEFAULT_CATCHUP_WINDOW_SECS)
    }
}

/// A dependency on another job's instance for a business date.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DepSpec {
    /// The upstream job (checked by [`validate`], like the job's own name).
    #[serde(deserialize_with = "unchecked_name")]
    pub name: JobName,
    /// `current`, or `-Nd` calendar days earlier.
    #[serde(default = "default_dep_date")]
    pub biz_date: String,
    /// Only `success`.
    #[serde(default = "default_dep_check")]
    pub check: String,
}

impl DepSpec {
    /// The offset in days of `biz_date`: 0 for `current`, -N for `-Nd`.
    pub fn offset_days(&self) -> Result<i64, String> {
        parse_offset(&self.biz_date)
    }
}

/// Parses `current` or `-Nd` (1 <= N <= 366).
pub fn parse_offset(text: &str) -> Result<i64, String> {
    if text == "current" {
        return Ok(0);
    }
    let bad = || {
        format!(
            "`{text}` is not a date offset (use `current` or `-Nd`, N from 1 to {MAX_DEP_OFFSET_DAYS})"
        )
    };
    let days: i64 = text
        .strip_prefix('-')
        .and_then(|t| t.strip_suffix('d'))
        .and_then(|n| n.parse().ok())
        .ok_or_else(bad)?;
    if (1..=MAX_DEP_OFFSET_DAYS).contains(&days) {
        Ok(-days)
    } else {
        Err(bad())
    }
}

fn default_dep_date() -> String {
    "current".to_string()
}
fn default_dep_check() -> String {
    "success".to_string()
}

/// What a timeout does before it kills the attempt's process group: it sends a signal that
/// makes runtimes dump their stacks (Python's faulthandler answers SIGABRT, a JVM SIGQUIT) and
/// gives the dump `grace` seconds to be written. The dump ends up in the result's stderr tail.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnTimeoutSpec {
    /// The signal sent first (`SIGABRT` when absent); `none` kills at once.
    #[serde(default, skip_serializing_if = "is_default")]
    pub signal: DumpSignal,
    /// Seconds between the signal and the kill (5 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace: Option<u64>,
}

/// Seconds a stack dump may take when the spec sets no `on_timeout.grace`.
pub const DEFAULT_TIMEOUT_GRACE_SECS: u64 = 5;

/// The longest grace period a spec may ask for.
pub const MAX_TIMEOUT_GRACE_SECS: u64 = 600;

impl OnTimeoutSpec {
    /// The grace period in seconds, defaulted.
    pub fn grace_secs(&self) -> u64 {
        self.grace.unwrap_or(DEFAULT_TIMEOUT_GRACE_SECS)
    }
}

/// The signals a timeout may send to ask for a stack dump.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DumpSignal {
    /// Python's faulthandler, core dumps.
    #[default]
    #[serde(rename = "SIGABRT")]
    Abrt,
    /// The JVM's thread dump.
    #[serde(rename = "SIGQUIT")]
    Quit,
    /// A polite stop, for programs that clean up on it.
    #[serde(rename = "SIGTERM")]
    Term,
    /// What Ctrl-C sends.
    #[serde(rename = "SIGINT")]
    Int,
    /// Free for the program's own use.
    #[serde(rename = "SIGUSR1")]
    Usr1,
    /// Free for the program's own use.
    #[serde(rename = "SIGUSR2")]
    Usr2,
    /// Hang-up.
    #[serde(rename = "SIGHUP")]
    Hup,
    /// No signal: the group is killed at once.
    #[serde(rename = "none")]
    None,
}

impl fmt::Display for DumpSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Self::Abrt => "SIGABRT",
            Self::Quit => "SIGQUIT",
            Self::Term => "SIGTERM",
            Self::Int => "SIGINT",
            Self::Usr1 => "SIGUSR1",
            Self::Usr2 => "SIGUSR2",
            Self::Hup => "SIGHUP",
            Self::None => "none",
        };
        f.write_str(name)
    }
}

/// Retries after a failed attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// How many more attempts after the first (0..=100).
    pub times: u32,
    /// Seconds before the first retry; doubled for each following one.
    pub interval: u64,
    /// No wait longer than this many seconds, however many doublings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_interval: Option<u64>,
    /// Up to this fraction (0 to 1) of each wait is taken off, by an amount drawn from the
    /// attempt's trace id, so that instances failing together do not retry together.
    #[serde(default, skip_serializing_if = "is_default")]
    pub jitter: f64,
}

impl RetrySpec {
    /// When the next attempt is due after the `attempt`-th attempt of a run (1-based), whose
    /// trace id is `trace`, failed at `finished` — if one is left: `interval * 2^(attempt-1)`
    /// seconds later, at most `max_interval` and at most [`MAX_RETRY_WAIT_SECS`], less the
    /// jitter share drawn from `trace` (the same every time the outcome is reported again).
    pub fn next_attempt_at(
        &self,
        attempt: u32,
        trace: &str,
        finished: chrono::DateTime<chrono::Utc>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        if attempt > self.times {
            return None;
        }
        let factor = 1u64 << attempt.saturating_sub(1).min(20);
        // Bounded whatever the spec says (a record written before the bounds, or by hand):
        // the arithmetic below can then never overflow.
        let seconds = self
            .interval
            .saturating_mul(factor)
            .min(self.max_interval.unwrap_or(u64::MAX))
            .min(MAX_RETRY_WAIT_SECS);
        let taken_off = self.jitter.clamp(0.0, 1.0) * share_of(trace);
        let millis = (seconds as f64 * 1000.0 * (1.0 - taken_off)).round() as i64;
        let due = finished
            .checked_add_signed(chrono::Duration::milliseconds(millis))
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC);
        Some(due)
    }
}

/// A number in [0, 1) drawn from `text` (FNV-1a), the same on every node.
fn share_of(text: &str) -> f64 {
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash >> 11) as f64 / (1u64 << 53) as f64
}

/// More retries than this draws a warning at apply time.
pub const RETRIES_WORTH_A_WARNING: u32 = 3;

/// The queue an instance goes through.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Served first.
    High,
    /// The default.
    #[default]
    Normal,
    /// Served last.
    Low,
}

impl Priority {
    /// All priorities, highest first.
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    /// `high`, `normal` or `low`.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }
}

impl std::str::FromStr for Priority {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Priority::ALL
            .into_iter()
            .find(|p| p.as_str() == text)
            .ok_or_else(|| format!("unknown priority `{text}` (high, normal, low)"))
    }
}

/// One problem in a spec: the field (`job.cron`) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecError {
    /// Dotted path of the field, e.g. `job.exec.command`.
    pub field: String,
    /// What is wrong, e.g. `unknown time zone `Mars/Base``.
    pub reason: String,
}

impl SpecError {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

/// Whether `name` is a valid job name as ax writes it (see [`JobName`]).
pub fn is_valid_job_name(name: &str) -> bool {
    JobName::parse(name).is_ok_and(|parsed| parsed == name)
}

/// What a job name that breaks the rule is told.
fn name_rule(name: &str) -> String {
    format!(
        "`{name}` must match [a-z0-9_-]{{1,64}}, after its namespace and `.` or `/` outside \
         `default` (`payments/settle`)"
    )
}

/// Whether `name` can be a param name (it becomes the variable `AX_PARAM_<name>`).
pub fn is_valid_param_name(name: &str) -> bool {
    is_valid_env_name(name)
}

fn is_valid_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 64
}

fn is_valid_tag(tag: &str) -> bool {
    (1..=64).contains(&tag.len())
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Every rule an apply's documents must meet without the registry: at least one job, each
/// valid ([`validate`]), no name twice. The CLI (before publishing, with file and line) and
/// the Scheduler (on receipt) both run it. Returns each problem with the index of its document;
/// `first` describes where a name defined twice was first defined.
pub fn check_documents(
    docs: &[&JobDocument],
    first: impl Fn(usize) -> String,
) -> Vec<(usize, SpecError)> {
    let mut problems = Vec::new();
    let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, doc) in docs.iter().enumerate() {
        problems.extend(validate(doc).into_iter().map(|e| (i, e)));
        let name = doc.job.name.as_str();
        match seen.get(name) {
            Some(&at) => problems.push((
                i,
                SpecError::new(
                    "job.name",
                    format!("`{name}` is defined twice in this apply ({})", first(at)),
                ),
            )),
            None => {
                seen.insert(name, i);
            }
        }
    }
    problems
}

/// What is allowed but probably a mistake: said at apply time, applied anyway.
pub fn warnings(doc: &JobDocument) -> Vec<SpecError> {
    let mut warnings = Vec::new();
    let at = doc.job.at.as_deref();
    if let Some(instant) = at.and_then(|at| crate::time::parse_instant(at).ok()) {
        if instant <= crate::time::now() {
            warnings.push(SpecError::new(
                "job.at",
                format!(
                    "`{}` has passed: the job fires only if it was applied before then",
                    at.unwrap_or_default()
                ),
            ));
        }
    }
    if let Some(retry) = &doc.job.retry {
        if retry.times > RETRIES_WORTH_A_WARNING {
            warnings.push(SpecError::new(
                "job.retry.times",
                format!(
                    "{} retries: more than {RETRIES_WORTH_A_WARNING} mostly delays a failure that needs a person",
                    retry.times
                ),
            ));
        }
    }
    warnings
}

/// Checks every rule of the spec and returns all problems (empty when valid).
pub fn validate(doc: &JobDocument) -> Vec<SpecError> {
    let mut errors = Vec::new();
    if doc.version != VERSION {
        errors.push(SpecError::new(
            "version",
            format!(
                "unsupported version `{}` (expected `{VERSION}`)",
                doc.version
            ),
        ));
    }
    validate_job(&doc.job, &mut errors);
    errors
}

/// Every rule of a job's spec (those of [`validate`] but the document's version).
pub fn validate_spec(job: &JobSpec) -> Vec<SpecError> {
    let mut errors = Vec::new();
    validate_job(job, &mut errors);
    errors
}

/// Every rule of `job`, each naming its field: one independent rule after another, a function
/// a section of the spec, in the order of its fields (docs/job-spec.md), so that a reader
/// checks the documentation against them line by line.
fn validate_job(job: &JobSpec, errors: &mut Vec<SpecError>) {
    validate_name_and_time(job, errors);
    validate_deps(job, errors);
    validate_exec(job, errors);
    validate_param_names(job, errors);
    validate_retry(job, errors);
    validate_lifetimes(job, errors);
    validate_datasets(job, errors);
    validate_shape(job, errors);
    validate_waits(job, errors);
    validate_resources(job, errors);
}

/// What one attempt may use: each limit large enough to start in, on an executor that runs a
/// process the worker can confine.
fn validate_resources(job: &JobSpec, errors: &mut Vec<SpecError>) {
    let runs_a_process = matches!(
        job.exec,
        ExecSpec::Shell(_) | ExecSpec::Python(_) | ExecSpec::Plugin(_)
    );
    for (field, reason) in resources::problems(&job.resources, runs_a_process) {
        errors.push(SpecError::new(field, reason));
    }
}

/// The document's size, the name, when it fires (`at` or `cron`) and in which time zone.
fn validate_name_and_time(job: &JobSpec, errors: &mut Vec<SpecError>) {
    let size = serde_json::to_vec(job).map_or(usize::MAX, |v| v.len());
    if size > MAX_SPEC_BYTES {
        errors.push(SpecError::new(
            "job",
            format!("{size} bytes as JSON is more than {MAX_SPEC_BYTES}"),
        ));
    }
    match job.namespace.as_deref() {
        Some(ns) if crate::ids::Namespace::parse(ns).is_err() => errors.push(SpecError::new(
            "job.namespace",
            format!("`{ns}` must match [a-z0-9_-]{{1,64}}"),
        )),
        Some(ns) if job.name.contains(['.', '/']) => errors.push(SpecError::new(
            "job.name",
            format!(
                "`{}` names a namespace and `namespace: {ns}` names one too: give it once",
                job.name
            ),
        )),
        _ => {}
    }
    if !is_valid_job_name(&job.name) {
        errors.push(SpecError::new("job.name", name_rule(&job.name)));
    }
    if let Some(at) = &job.at {
        match crate::time::parse_instant(at) {
            Err(reason) => errors.push(SpecError::new("job.at", reason)),
            Ok(_) if job.cron.is_some() => errors.push(SpecError::new(
                "job.at",
                "a job fires on its cron or once at `at`, not both",
            )),
            Ok(instant) if instant > crate::time::now() + chrono::Duration::days(MAX_AT_DAYS) => {
                errors.push(SpecError::new(
                    "job.at",
                    format!("`{at}` is more than {MAX_AT_DAYS} days ahead"),
                ))
            }
            Ok(_) => {}
        }
    }
    if let Some(cron) = &job.cron {
        match cron_expr::CronExpr::parse(cron) {
            Err(reason) => errors.push(SpecError::new("job.cron", reason)),
            // Every expression that fires at all fires within a leap-year cycle.
            Ok(expr) if expr.next_after(cron_expr::never_fires_probe()).is_none() => {
                errors.push(SpecError::new(
                    "job.cron",
                    format!("`{cron}` never fires: no date has that day (such as 30 February)"),
                ));
            }
            Ok(_) => {}
        }
    }
    if job.timezone.parse::<chrono_tz::Tz>().is_err() {
        errors.push(SpecError::new(
            "job.timezone",
            format!(
                "unknown time zone `{}` (use an IANA name such as Asia/Shanghai)",
                job.timezone
            ),
        ));
    }
}

/// The params' names.
fn validate_param_names(job: &JobSpec, errors: &mut Vec<SpecError>) {
    for name in job.params.keys() {
        if !is_valid_param_name(name) {
            errors.push(SpecError::new(
                format!("job.params.{name}"),
                "a param name must match [A-Za-z_][A-Za-z0-9_]{0,63} (it becomes AX_PARAM_<name>)",
            ));
        }
    }
}

/// `retry`: how often, how long between, how much jitter.
fn validate_retry(job: &JobSpec, errors: &mut Vec<SpecError>) {
    if let Some(retry) = &job.retry {
        if retry.times > MAX_RETRY_TIMES {
            errors.push(SpecError::new(
                "job.retry.times",
                format!("{} is more than {MAX_RETRY_TIMES}", retry.times),
            ));
        }
        if retry.interval == 0 {
            errors.push(SpecError::new(
                "job.retry.interval",
                "must be at least 1 second",
            ));
        }
        at_most(
            errors,
            "job.retry.interval",
            Some(retry.interval),
            MAX_RETRY_WAIT_SECS,
        );
        at_most(
            errors,
            "job.retry.max_interval",
            retry.max_interval,
            MAX_RETRY_WAIT_SECS,
        );
        if retry.max_interval.is_some_and(|max| max < retry.interval) {
            errors.push(SpecError::new(
                "job.retry.max_interval",
                format!("must be at least the interval ({} s)", retry.interval),
            ));
        }
        if !(0.0..=1.0).contains(&retry.jitter) {
            errors.push(SpecError::new(
                "job.retry.jitter",
                format!("{} is not a fraction between 0 and 1", retry.jitter),
            ));
        }
    }
}

/// `timeout`, `lease` and `retention`: each within its bounds.
fn validate_lifetimes(job: &JobSpec, errors: &mut Vec<SpecError>) {
    if job.timeout == Some(0) {
        errors.push(SpecError::new("job.timeout", "must be at least 1 second"));
    }
    at_most(errors, "job.timeout", job.timeout, MAX_TIMEOUT_SECS);
    if job.lease.is_some_and(|lease| lease < MIN_LEASE_SECS) {
        errors.push(SpecError::new(
            "job.lease",
            format!("must be at least {MIN_LEASE_SECS} seconds (the Routers' worker TTL)"),
        ));
    }
    at_most(errors, "job.lease", job.lease, MAX_LEASE_SECS);
    if job.retention.is_some_and(|r| r < MIN_RETENTION_SECS) {
        errors.push(SpecError::new(
            "job.retention",
            format!("must be at least {MIN_RETENTION_SECS} second"),
        ));
    }
    at_most(errors, "job.retention", job.retention, MAX_RETENTION_SECS);
}

/// What the job produces and consumes, what runs it (`on_datasets`, `rerun`) and how fresh its outputs must be.
fn validate_datasets(job: &JobSpec, errors: &mut Vec<SpecError>) {
    for (uri, secs) in &job.freshness {
        let field = format!("job.freshness.{uri}");
        if !job.produces.contains(uri) {
            errors.push(SpecError::new(
                field.clone(),
                format!("`{uri}` is not one of the datasets the job produces"),
            ));
        }
        if *secs == 0 {
            errors.push(SpecError::new(field.clone(), "must be at least 1 second"));
        }
        at_most(errors, &field, Some(*secs), MAX_FRESHNESS_SECS);
    }
    for (i, uri) in job.on_datasets.iter().enumerate() {
        if !job.consumes.contains(uri) {
            errors.push(SpecError::new(
                format!("job.on_datasets[{i}]"),
                format!("`{uri}` is not one of the datasets the job consumes"),
            ));
        }
    }
    if job.on_datasets.is_empty() && job.rerun != DataRerun::Never {
        errors.push(SpecError::new(
            "job.rerun",
            "is for a job run by its data: list its inputs under on_datasets",
        ));
    }
    for (field, uris) in [
        ("produces", &job.produces),
        ("consumes", &job.consumes),
        ("on_datasets", &job.on_datasets),
    ] {
        if uris.len() > dataset::MAX_DATASETS {
            errors.push(SpecError::new(
                format!("job.{field}"),
                format!(
                    "{} datasets is more than {}",
                    uris.len(),
                    dataset::MAX_DATASETS
                ),
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, uri) in uris.iter().enumerate() {
            if let Err(reason) = uri.check() {
                errors.push(SpecError::new(format!("job.{field}[{i}]"), reason));
            } else if !seen.insert(uri) {
                errors.push(SpecError::new(
                    format!("job.{field}[{i}]"),
                    format!("`{uri}` is listed twice"),
                ));
            }
        }
    }
}

/// How an attempt ends on its timeout, and how it spreads (`shards`, `broadcast`).
fn validate_shape(job: &JobSpec, errors: &mut Vec<SpecError>) {
    if let Some(grace) = job.on_timeout.grace {
        if grace > MAX_TIMEOUT_GRACE_SECS {
            errors.push(SpecError::new(
                "job.on_timeout.grace",
                format!("{grace} s is more than {MAX_TIMEOUT_GRACE_SECS} s"),
            ));
        }
        if job.on_timeout.signal == DumpSignal::None {
            errors.push(SpecError::new(
                "job.on_timeout.grace",
                "a grace period needs a signal to wait on (signal is `none`)",
            ));
        }
    }
    match job.shards {
        Some(0) => errors.push(SpecError::new("job.shards", "must be at least 1")),
        Some(n) if n > MAX_SHARDS => errors.push(SpecError::new(
            "job.shards",
            format!("{n} is more than {MAX_SHARDS}"),
        )),
        Some(_) if job.broadcast => errors.push(SpecError::new(
            "job.shards",
            "a job is either sharded or broadcast, not both",
        )),
        _ => {}
    }
}

/// How long it waits for its dependencies, how far back it catches up, its params' size and its tags.
fn validate_waits(job: &JobSpec, errors: &mut Vec<SpecError>) {
    if job.deps_timeout == Some(0) {
        errors.push(SpecError::new(
            "job.deps_timeout",
            "must be at least 1 second",
        ));
    }
    at_most(
        errors,
        "job.deps_timeout",
        job.deps_timeout,
        MAX_DEPS_TIMEOUT_SECS,
    );
    at_most(
        errors,
        "job.catchup_window",
        job.catchup_window,
        MAX_CATCHUP_WINDOW_SECS,
    );
    if let Err(size) = params_fit(&job.params) {
        errors.push(SpecError::new(
            "job.params",
            format!("{size} bytes as JSON is more than {MAX_PARAMS_BYTES}"),
        ));
    }
    if job.catchup_window.is_some() && job.cron.is_none() {
        errors.push(SpecError::new(
            "job.catchup_window",
            "only a job with a cron has fires to catch up",
        ));
    }
    for tag in &job.tags {
        if !is_valid_tag(tag) {
            errors.push(SpecError::new(
                "job.tags",
                format!("`{tag}` must match [A-Za-z0-9_-]{{1,64}}"),
            ));
        }
    }
}

/// An error on `field` when `value` is more than `max` seconds.
fn at_most(errors: &mut Vec<SpecError>, field: &str, value: Option<u64>, max: u64) {
    if let Some(value) = value.filter(|v| *v > max) {
        errors.push(SpecError::new(
            field,
            format!("{value} s is more than {max} s ({})", readable_secs(max)),
        ));
    }
}

/// `86400` → `1 day`, `604800` → `7 days`.
fn readable_secs(secs: u64) -> String {
    match secs / 86_400 {
        1 => "1 day".to_string(),
        days => format!("{days} days"),
    }
}

/// `Err(size)` when `params`, as JSON, are more than [`MAX_PARAMS_BYTES`].
pub fn params_fit(params: &BTreeMap<String, serde_json::Value>) -> Result<(), usize> {
    let size = serde_json::to_vec(params)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if size > MAX_PARAMS_BYTES {
        Err(size)
    } else {
        Ok(())
    }
}

fn validate_deps(job: &JobSpec, errors: &mut Vec<SpecError>) {
    if job.deps_timeout.is_some() && job.deps.is_empty() {
        errors.push(SpecError::new(
            "job.deps_timeout",
            "a job without deps never waits for them",
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, dep) in job.deps.iter().enumerate() {
        let field = |name: &str| format!("job.deps[{i}].{name}");
        if !is_valid_job_name(&dep.name) {
            errors.push(SpecError::new(field("name"), name_rule(&dep.name)));
        }
        let offset = match dep.offset_days() {
            Ok(offset) => offset,
            Err(reason) => {
                errors.push(SpecError::new(field("biz_date"), reason));
                continue;
            }
        };
        if dep.check != "success" {
            errors.push(SpecError::new(
                field("check"),
                format!("`{}` is not a check (only `success`)", dep.check),
            ));
        }
        if dep.name == job.name && offset == 0 {
            errors.push(SpecError::new(
                field("name"),
                format!(
                    "`{}` cannot depend on itself for the same date (-1d and earlier may)",
                    dep.name
                ),
            ));
        }
        if !seen.insert((dep.name.as_str(), offset)) {
            errors.push(SpecError::new(
                field("name"),
                format!(
                    "`{}` with biz_date `{}` is listed twice",
                    dep.name, dep.biz_date
                ),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(job: JobSpec) -> JobDocument {
        JobDocument {
            version: VERSION.into(),
            job,
        }
    }

    pub(crate) fn shell_job(name: &str, command: &str) -> JobSpec {
        JobSpec {
            name: JobName::unchecked(name.to_string()),
            namespace: None,
            cron: Some("*/5 * * * *".into()),
            at: None,
            timezone: "UTC".into(),
            deps: vec![],
            exec: ExecSpec::shell(command),
            params: BTreeMap::new(),
            retry: None,
            timeout: None,
            on_timeout: OnTimeoutSpec::default(),
            lease: None,
            tags: vec![],
            priority: Priority::Normal,
            deps_timeout: None,
            misfire: Misfire::default(),
            catchup_window: None,
            overlap: Overlap::default(),
            shards: None,
            broadcast: false,
            retention: None,
            produces: vec![],
            consumes: vec![],
            on_datasets: vec![],
            rerun: DataRerun::Never,
            freshness: BTreeMap::new(),
            resources: Default::default(),
        }
    }

    #[test]
    fn dependency_rules() {
        let dep = |name: &str, biz_date: &str| DepSpec {
            name: JobName::unchecked(name.to_string()),
            biz_date: biz_date.into(),
            check: "success".into(),
        };
        let mut job = shell_job("stat", "true");
        job.deps = vec![
            dep("sync", "current"),
            dep("stat", "-1d"),
            dep("pay", "-7d"),
        ];
        job.deps_timeout = Some(600);
        assert_eq!(validate(&doc(job.clone())), vec![]);
        job.deps = vec![
            dep("stat", "current"),
            dep("sync", "-1x"),
            dep("a", "-0d"),
            dep("b", "-40d"),
        ];
        let fields: Vec<String> = validate(&doc(job.clone()))
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(
            fields,
            [
                "job.deps[0].name",
                "job.deps[1].biz_date",
                "job.deps[2].biz_date",
                "job.deps[3].biz_date"
            ]
        );
        job.deps = vec![dep("sync", "current"), dep("sync", "current")];
        assert_eq!(validate(&doc(job.clone()))[0].field, "job.deps[1].name");
        job.deps = vec![];
        assert_eq!(validate(&doc(job))[0].field, "job.deps_timeout");
        assert_eq!(parse_offset("-7d"), Ok(-7));
    }

    #[test]
    fn a_good_job_has_no_errors() {
        assert_eq!(
            validate(&doc(shell_job("hello", "echo {{biz_date}}"))),
            vec![]
        );
    }

    #[test]
    fn each_rule_names_its_field() {
        let mut job = shell_job("Bad Name", "echo {{params.nope}}");
        job.cron = Some("61 * * * *".into());
        job.timezone = "Mars/Base".into();
        job.timeout = Some(0);
        job.retry = Some(RetrySpec {
            times: 101,
            interval: 0,
            max_interval: None,
            jitter: 0.0,
        });
        job.tags = vec!["no spaces".into()];
        let fields: Vec<String> = validate(&doc(job)).into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            [
                "job.name",
                "job.cron",
                "job.timezone",
                "job.exec.command",
                "job.retry.times",
                "job.retry.interval",
                "job.timeout",
                "job.tags"
            ]
        );
    }

    #[test]
    fn unknown_executor_is_refused() {
        let mut job = shell_job("x", "true");
        let plugin = |name: &str| {
            ExecSpec::Plugin(PluginExec {
                name: name.into(),
                with: Some(serde_json::Map::new()),
                workdir: None,
                env: BTreeMap::new(),
            })
        };
        job.exec = plugin("Cobol!");
        let errors = validate(&doc(job.clone()));
        assert_eq!(errors[0].field, "job.exec.type");
        assert!(errors[0].reason.contains("Cobol!"));
        // A well-formed name is a plugin's.
        job.exec = plugin("cobol");
        assert!(validate(&doc(job)).is_empty());
    }

    #[test]
    fn a_misspelt_builtin_executor_is_meant() {
        assert_eq!(meant_builtin("shel"), Some("shell"));
        assert_eq!(meant_builtin("pyhton"), Some("python"));
        assert_eq!(meant_builtin("htp"), Some("http"));
        assert_eq!(meant_builtin("shell"), None, "a builtin is meant as itself");
        assert_eq!(meant_builtin("sqlx"), Some("sql"));
        assert_eq!(meant_builtin("spark"), None);
        assert_eq!(
            meant_builtin("no"),
            None,
            "two letters off `noop` is most of it"
        );
    }

    #[test]
    fn each_executor_checks_its_own_rules() {
        let first = |job: &JobSpec| {
            validate(&doc(job.clone()))
                .into_iter()
                .map(|e| format!("{}: {}", e.field, e.reason))
                .collect::<Vec<_>>()
        };
        let mut http = shell_job("h", "true");
        let with_url = |url: &str| {
            ExecSpec::Http(HttpExec {
                url: url.into(),
                headers: BTreeMap::new(),
                header_env: BTreeMap::new(),
                success_when: None,
            })
        };
        http.exec = with_url("ftp://x");
        assert!(first(&http)[0].contains("not an http"));
        http.exec = with_url(" ");
        assert_eq!(first(&http), vec!["job.exec.url: `url` is empty"]);
        http.exec = with_url("http://127.0.0.1:9/hook");
        assert!(first(&http).is_empty());

        let mut sql = shell_job("s", "true");
        let statement = |statement: &str| {
            ExecSpec::Sql(SqlExec {
                database: "main".into(),
                statement: statement.into(),
                output: SqlOutput::default(),
            })
        };
        sql.exec = statement("select '{{biz_date}}'");
        assert!(first(&sql)[0].contains("inside quotes"));
        sql.exec = statement("select {{biz_date}}");
        assert!(first(&sql).is_empty());

        let mut python = shell_job("p", "true");
        let mut settings = PythonExec {
            entry: PythonEntry::Module("http.server".into()),
            args: vec![],
            venv: None,
            requirements: vec!["requests".into()],
            workdir: None,
            env: BTreeMap::new(),
        };
        python.exec = ExecSpec::Python(settings.clone());
        assert!(first(&python)[0].contains("set `venv` too"));
        settings.venv = Some("/tmp/v".into());
        settings.args = vec!["--date={{biz_date}}".into(), "{{deps.up.output.x}}".into()];
        python.exec = ExecSpec::Python(settings);
        assert!(first(&python)[0].contains("does not list"));
        python.deps = vec![DepSpec {
            name: JobName::unchecked("up".to_string()),
            biz_date: "current".into(),
            check: "success".into(),
        }];
        assert!(first(&python).is_empty());
    }

    #[test]
    fn unknown_fields_are_refused_in_json_too() {
        let err = serde_json::from_str::<JobDocument>(
            r#"{"version":"v1","job":{"name":"a","exec":{"type":"shell","command":"x"},"colour":1}}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");
    }

    fn waits(retry: &RetrySpec, trace: &str) -> Vec<Option<i64>> {
        let t0 = crate::time::now();
        (1..=4)
            .map(|attempt| {
                retry
                    .next_attempt_at(attempt, trace, t0)
                    .map(|t| (t - t0).num_milliseconds())
            })
            .collect()
    }

    fn retry(times: u32, interval: u64, max_interval: Option<u64>, jitter: f64) -> RetrySpec {
        RetrySpec {
            times,
            interval,
            max_interval,
            jitter,
        }
    }

    #[test]
    fn retry_waits_double_from_the_interval_and_stop_after_the_last_retry() {
        assert_eq!(
            waits(&retry(3, 30, None, 0.0), "abc"),
            [Some(30_000), Some(60_000), Some(120_000), None]
        );
    }

    #[test]
    fn no_wait_is_longer_than_a_day_and_extreme_values_never_overflow() {
        // Values the bounds refuse at apply, as a record written before them could hold.
        assert_eq!(
            waits(&retry(3, 1_000_000_000_000_000_000, None, 0.0), "abc"),
            [Some(86_400_000), Some(86_400_000), Some(86_400_000), None]
        );
        assert_eq!(
            waits(&retry(100, 40_000, None, 0.0), "abc")[2],
            Some(86_400_000)
        );
        let policy = retry(1, u64::MAX, Some(u64::MAX), 1.0);
        let end_of_time = chrono::DateTime::<chrono::Utc>::MAX_UTC;
        assert_eq!(
            policy.next_attempt_at(1, "abc", end_of_time),
            Some(end_of_time)
        );
    }

    #[test]
    fn max_interval_caps_the_doubling() {
        assert_eq!(
            waits(&retry(4, 30, Some(90), 0.0), "abc"),
            [Some(30_000), Some(60_000), Some(90_000), Some(90_000)]
        );
    }

    #[test]
    fn jitter_shortens_each_wait_by_a_share_fixed_by_the_trace() {
        let policy = retry(1, 100, None, 0.5);
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..200 {
            let trace = crate::ids::TraceId::random();
            let wait = waits(&policy, &trace)[0].expect("one retry");
            assert!((50_000..=100_000).contains(&wait), "{wait} ms for {i}");
            assert_eq!(
                waits(&policy, &trace)[0],
                Some(wait),
                "the same trace, the same wait"
            );
            seen.insert(wait / 5_000);
        }
        assert!(seen.len() >= 8, "waits spread over the range: {seen:?}");
    }
}
