//! The node config file (TOML). Every setting can also be given as a flag, which wins.
//!
//! ```toml
//! [node]
//! id = "etl-1"                     # node and worker id
//! nats = "nats://10.0.0.5:4222"
//! roles = ["worker"]
//! prefix = "ax"
//! replicas = 3
//! instance_buckets = 3            # buckets of the instance records, set by the first node (1)
//! data_dir = "/var/lib/ax"
//! max_clock_skew = 5               # seconds off the NATS server's clock before the node holds off
//! stall_after = 30                 # seconds an actor may leave the watchdog's ping unanswered
//!
//! [worker]
//! slots = 8
//! tags = ["etl", "gpu"]
//! reserved = { high = 2, normal = 1 }   # slots low (and normal) work may not take
//! dispatch_ack_wait = 30                # seconds before an unacknowledged dispatch is redelivered
//! plugin_dir = "/opt/ax/plugins"        # plugin executors, loaded at start
//! python = "python3"                    # the python executor's interpreter outside a venv
//! log_max_bytes = 8388608               # cap of an attempt's shipped log (head and tail kept)
//! cgroups = "auto"                      # each attempt in a cgroup below the worker's ("auto"),
//!                                       # below a delegated cgroup v2 directory (a path), or "off"
//! memory = "16Gi"                       # offered to attempts asking for memory (the host's)
//! cpus = 8                              # offered to attempts asking for CPU (its cores)
//! limits = { memory = "2Gi", pids = 1024 }  # limits of attempts whose job sets none of a kind
//!
//! [worker.adaptive]                     # slots follow the machine's pressure, within min..max
//! min = 2                               # (slots above is where the budget starts)
//! max = 16
//! load_high = 1.25                      # runnable tasks per core above which it shrinks
//! load_low = 0.9                        # under which it grows, while work waits for a slot
//! memory_min_mib = 256                  # available memory under which it shrinks
//! every = 2                             # seconds between decisions
//!
//! [databases]                           # for the sql executor; jobs name them, never the URL
//! warehouse = "postgres://etl@10.0.0.7/warehouse"
//! shop = "mysql://report:secret@10.0.0.8/shop"
//! local = "sqlite:///var/lib/ax/local.db"
//!
//! [router]
//! weight_running = 0.7                  # score = running/cores * 0.7 + avg_duration_s * 0.3
//! weight_duration = 0.3
//! ack_timeout = 5                       # seconds a worker has to acknowledge a dispatch
//! worker_ttl = 10                       # seconds without heartbeat before a worker is dead
//!
//! [nats]                                # credentials and TLS; a user:password may also be in the URL
//! creds = "/etc/ax/worker.creds"        # or: user + password, token, nkey_seed_file
//! tls_ca = "/etc/ax/ca.pem"             # tls_cert + tls_key for mutual TLS; tls_required = true
//! inbox_prefix = "_INBOX.worker"         # replies' prefix; `_INBOX.<user>` when a user is set
//!
//! [metrics]
//! listen = "0.0.0.0:8080"               # where /metrics (and, with role admin, the console) is served
//! hosts = ["ax.example.com"]            # names the console answers for besides localhost and IPs
//!
//! [alerts]
//! webhook = "https://hooks.example.com/ax"   # one JSON POST per alert, retried with backoff
//! timeout = 5                                # seconds one POST may take
//!
//! [console]
//! index_window = "7d"                   # finished instances the console's lists hold, by end
//! index_rows = 250000                   # and at most so many of them, the last ended
//!
//! [retention]                           # how long each is kept; unset: what the stream has
//! instances = "30d"                     # finished instances' records, after they end
//! results = "7d"                        # also: logs, audit, ticks, dead_letters, alerts,
//! audit = "400d"                        # summaries (`ax status --date`); 20s, 12h, 30d
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::time::Duration;

use anyhow::{Context, Result};
use serde::Deserialize;

use ax_actors::Adaptive;
use ax_actors::RouterConfig;
use ax_actors::DEFAULT_DISPATCH_ACK_WAIT;
use ax_actors::DEFAULT_MAX_CLOCK_SKEW;
use ax_actors::{CgroupSetting, Offer};
use ax_actors::{WebhookConfig, DEFAULT_WEBHOOK_TIMEOUT};
use ax_bus::client::NatsAuth;
use ax_bus::messages::Reserved;
use ax_bus::routing::RoutingPolicy;
use ax_bus::spec::resources::{Cpu, Memory, Resources};

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    #[serde(default)]
    pub node: NodeSection,
    #[serde(default)]
    pub worker: WorkerSection,
    #[serde(default)]
    pub router: RouterSection,
    #[serde(default)]
    pub alerts: AlertsSection,
    #[serde(default)]
    pub scheduler: SchedulerSection,
    #[serde(default)]
    pub metrics: MetricsSection,
    #[serde(default)]
    pub backlog: BacklogSection,
    #[serde(default)]
    pub status: StatusSection,
    #[serde(default)]
    pub auth: AuthSection,
    /// Databases of the sql executor: name → URL.
    #[serde(default)]
    pub databases: BTreeMap<String, String>,
    #[serde(default)]
    pub nats: NatsSection,
    #[serde(default)]
    pub retention: RetentionSection,
    #[serde(default)]
    pub console: ConsoleSection,
    /// Present: this node's DagCoordinator makes OpenLineage events (and, with a `url`, the
    /// node POSTs them).
    pub openlineage: Option<OpenLineageSection>,
}

/// `[openlineage]`: the attempts' OpenLineage events — made by the nodes with the dag role
/// whose config has the section, in its `namespace`, and POSTed by the nodes that name a `url`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OpenLineageSection {
    /// The endpoint, e.g. Marquez's `http://marquez:5000/api/v1/lineage`.
    pub url: Option<String>,
    /// Seconds one POST may take (5).
    pub timeout: Option<f64>,
    /// The jobs' namespace (`ax`).
    pub namespace: Option<String>,
}

/// The OpenLineage endpoint of `section`, when one is configured; an error names the bad
/// field.
pub(crate) fn lineage_endpoint(
    section: &Option<OpenLineageSection>,
) -> Result<Option<WebhookConfig>> {
    match section {
        None => Ok(None),
        Some(s) => webhook_setting(
            "[openlineage] url",
            "[openlineage] timeout",
            &s.url,
            s.timeout,
        ),
    }
}

/// The namespace the events are made in, when `section` is there (no events without it).
pub(crate) fn lineage_namespace(section: &Option<OpenLineageSection>) -> Result<Option<String>> {
    section
        .as_ref()
        .map(OpenLineageSection::namespace)
        .transpose()
}

impl OpenLineageSection {
    /// The namespace of ax's jobs in the events; an error names a blank one.
    fn namespace(&self) -> Result<String> {
        match &self.namespace {
            None => Ok(ax_bus::openlineage::DEFAULT_NAMESPACE.to_string()),
            Some(ns) if ns.trim().is_empty() => {
                anyhow::bail!("[openlineage] namespace = {ns:?}: empty")
            }
            Some(ns) => Ok(ns.clone()),
        }
    }
}

/// `[console]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConsoleSection {
    /// How long after their end finished instances stay in the console's index (`7d`).
    pub index_window: Option<String>,
    /// How many finished instances the console's index holds at most (250,000).
    pub index_rows: Option<usize>,
}

impl ConsoleSection {
    /// The index's most rows, if set; an error names the field.
    pub(crate) fn index_rows(&self) -> Result<Option<usize>> {
        match self.index_rows {
            Some(0) => anyhow::bail!("[console] index_rows = 0: must be at least 1"),
            rows => Ok(rows),
        }
    }

    /// The index window, if set; an error names the field.
    pub(crate) fn index_window(&self) -> Result<Option<Duration>> {
        duration_setting("[console] index_window", &self.index_window)
    }
}

/// A duration setting (`20s`, `12h`, `30d`; at least a second), if set; an error names it
/// (`name`, as `[section] key`) and says why.
fn duration_setting(name: &str, text: &Option<String>) -> Result<Option<Duration>> {
    let Some(text) = text else {
        return Ok(None);
    };
    match ax_bus::time::parse_delay(text) {
        Ok(age) if age >= Duration::from_secs(1) => Ok(Some(age)),
        Ok(_) => anyhow::bail!("{name} = {text:?}: at least 1s"),
        Err(e) => anyhow::bail!("{name} = {text:?}: {e}"),
    }
}

/// A setting given as a number of seconds, at most the ceiling of every duration ax reads
/// ([`ax_bus::duration::MAX`]); an error names it (`name`, as `[section] key`).
fn seconds_setting(name: &str, seconds: f64) -> Result<Duration> {
    ax_bus::duration::from_secs_f64(seconds).map_err(|e| anyhow::anyhow!("{name} = {e}"))
}

/// `[retention]`: how long each thing kept for a while is kept, as `20s`, `12h`, `30d`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetentionSection {
    pub instances: Option<String>,
    pub results: Option<String>,
    pub logs: Option<String>,
    pub audit: Option<String>,
    pub ticks: Option<String>,
    pub dead_letters: Option<String>,
    pub alerts: Option<String>,
    pub lineage: Option<String>,
    pub summaries: Option<String>,
}

impl RetentionSection {
    /// The settings; an error names the field and the reason (at least a second).
    pub(crate) fn retention(&self) -> Result<ax_bus::client::provision::Retention> {
        let age = |field: &str, text: &Option<String>| {
            duration_setting(&format!("[retention] {field}"), text)
        };
        Ok(ax_bus::client::provision::Retention {
            instances: age("instances", &self.instances)?,
            results: age("results", &self.results)?,
            logs: age("logs", &self.logs)?,
            audit: age("audit", &self.audit)?,
            ticks: age("ticks", &self.ticks)?,
            dead_letters: age("dead_letters", &self.dead_letters)?,
            alerts: age("alerts", &self.alerts)?,
            lineage: age("lineage", &self.lineage)?,
            summaries: age("summaries", &self.summaries)?,
        })
    }
}

/// `[nats]`: credentials and TLS (each overrides its `AX_NATS_*` variable).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NatsSection {
    pub user: Option<String>,
    pub password: Option<String>,
    pub token: Option<String>,
    pub nkey_seed_file: Option<PathBuf>,
    pub creds: Option<PathBuf>,
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_required: Option<bool>,
    pub inbox_prefix: Option<String>,
}

impl NatsSection {
    /// `base` (from the environment) with this section's settings on top.
    pub(crate) fn over(&self, base: NatsAuth) -> NatsAuth {
        NatsAuth {
            user: self.user.clone().or(base.user),
            password: self.password.clone().or(base.password),
            token: self.token.clone().or(base.token),
            nkey_seed_file: self.nkey_seed_file.clone().or(base.nkey_seed_file),
            creds_file: self.creds.clone().or(base.creds_file),
            tls_ca: self.tls_ca.clone().or(base.tls_ca),
            tls_cert: self.tls_cert.clone().or(base.tls_cert),
            tls_key: self.tls_key.clone().or(base.tls_key),
            tls_required: self.tls_required.unwrap_or(base.tls_required),
            inbox_prefix: self.inbox_prefix.clone().or(base.inbox_prefix),
        }
    }
}

/// `[alerts]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AlertsSection {
    /// URL that receives one JSON POST per alert.
    pub webhook: Option<String>,
    /// Seconds one POST may take (5).
    pub timeout: Option<f64>,
}

impl AlertsSection {
    /// The webhook, when one is configured; an error names the bad field.
    pub(crate) fn webhook(&self) -> Result<Option<WebhookConfig>> {
        webhook_setting(
            "[alerts] webhook",
            "[alerts] timeout",
            &self.webhook,
            self.timeout,
        )
    }
}

/// An endpoint ax POSTs to, when `url` is set: an http(s) URL and a positive timeout in
/// seconds (5 by default); an error names the setting (`url_name`, `timeout_name`).
fn webhook_setting(
    url_name: &str,
    timeout_name: &str,
    url: &Option<String>,
    timeout: Option<f64>,
) -> Result<Option<WebhookConfig>> {
    let Some(url) = url else {
        return Ok(None);
    };
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        anyhow::bail!("{url_name} = {url:?}: must be an http:// or https:// URL");
    }
    let timeout = match timeout {
        None => DEFAULT_WEBHOOK_TIMEOUT,
        Some(v) if v.is_finite() && v > 0.0 => seconds_setting(timeout_name, v)?,
        Some(v) => anyhow::bail!("{timeout_name} = {v}: must be a positive number of seconds"),
    };
    Ok(Some(WebhookConfig {
        url: url.clone(),
        timeout,
    }))
}

/// `[backlog]`: the Routers' backlog control.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BacklogSection {
    /// Work waiting per worker above which a priority is backlogged (100).
    pub factor: Option<u64>,
    /// Seconds it must stay above before the alert (120).
    #[serde(rename = "for")]
    pub hold: Option<f64>,
    /// Whether the low-priority queue is paused then (false).
    pub auto_pause_low: Option<bool>,
    /// Seconds every priority must stay below half before the queue is resumed (600).
    pub resume_after: Option<f64>,
}

impl BacklogSection {
    /// The control's settings, defaults filled in; an error names the bad field.
    pub(crate) fn config(&self) -> Result<ax_actors::BacklogConfig> {
        let mut config = ax_actors::BacklogConfig::default();
        match self.factor {
            Some(0) => anyhow::bail!("[backlog] factor = 0: must be at least 1"),
            Some(factor) => config.factor = factor,
            None => {}
        }
        for (name, value, slot) in [
            ("for", self.hold, &mut config.hold),
            ("resume_after", self.resume_after, &mut config.resume_after),
        ] {
            match value {
                Some(v) if v.is_finite() && v >= 0.0 => {
                    *slot = seconds_setting(&format!("[backlog] {name}"), v)?
                }
                Some(v) => {
                    anyhow::bail!("[backlog] {name} = {v}: must be a number of seconds >= 0")
                }
                None => {}
            }
        }
        config.auto_pause_low = self.auto_pause_low.unwrap_or(false);
        Ok(config)
    }
}

/// `[status]`: the health summary.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StatusSection {
    /// The time zone the day summaries' dates are in (UTC).
    pub timezone: Option<String>,
}

impl StatusSection {
    /// The time zone; an error names the field.
    pub(crate) fn timezone(&self) -> Result<chrono_tz::Tz> {
        match &self.timezone {
            None => Ok(chrono_tz::UTC),
            Some(name) => name.parse().map_err(|_| {
                anyhow::anyhow!("[status] timezone = {name:?}: not an IANA time zone name")
            }),
        }
    }
}

/// `[metrics]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MetricsSection {
    /// Where the node serves HTTP (`/metrics`), `HOST:PORT`.
    pub listen: Option<String>,
    /// DNS names the console answers for besides `localhost` and IP addresses (DNS rebinding:
    /// a request sent to any other name is refused).
    #[serde(default)]
    pub hosts: Vec<String>,
}

/// `[scheduler]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SchedulerSection {
    /// Days ahead a delayed trigger or a job's `at` may be due (366).
    pub max_delay_days: Option<u32>,
    /// Partitions of the cron jobs, read when the deployment's first Scheduler starts (128).
    pub partitions: Option<u16>,
}

impl SchedulerSection {
    /// The number of partitions a first Scheduler sets. An error names the field.
    pub(crate) fn partitions(&self) -> Result<u16> {
        match self.partitions {
            None => Ok(ax_bus::partition::DEFAULT_COUNT),
            Some(n) if (1..=4096).contains(&n) => Ok(n),
            Some(n) => anyhow::bail!("[scheduler] partitions = {n}: must be from 1 to 4096"),
        }
    }

    /// The Scheduler's limit on delays. An error names the field.
    pub(crate) fn max_delay(&self) -> Result<Duration> {
        match self.max_delay_days {
            None => Ok(ax_actors::DEFAULT_MAX_DELAY),
            Some(days) if days >= 1 && i64::from(days) <= ax_bus::spec::MAX_AT_DAYS => {
                Ok(Duration::from_secs(u64::from(days) * 24 * 3600))
            }
            Some(days) => anyhow::bail!(
                "[scheduler] max_delay_days = {days}: must be from 1 to {}",
                ax_bus::spec::MAX_AT_DAYS
            ),
        }
    }
}

/// `[auth]`: who may send which command.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuthSection {
    /// Every command must carry a valid token of a role high enough.
    pub enabled: Option<bool>,
    /// An admin's own forced re-run waits for a second admin too.
    pub require_second_admin: Option<bool>,
    /// How long an approval waits for a decision (`30m`, `1h`, `1d`; 1h).
    pub approval_ttl: Option<String>,
}

impl AuthSection {
    /// The settings, with `--auth` turning it on. An error names the field.
    pub(crate) fn settings(&self, forced_on: bool) -> Result<ax_actors::AuthSettings> {
        let defaults = ax_actors::AuthSettings::default();
        let approval_ttl = match &self.approval_ttl {
            None => defaults.approval_ttl,
            Some(text) => ax_bus::time::parse_delay(text)
                .map_err(|e| anyhow::anyhow!("[auth] approval_ttl = {text:?}: {e}"))?,
        };
        Ok(ax_actors::AuthSettings {
            enabled: forced_on || self.enabled.unwrap_or(false),
            require_second_admin: self.require_second_admin.unwrap_or(false),
            approval_ttl,
        })
    }
}

/// `[node]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NodeSection {
    pub id: Option<String>,
    pub nats: Option<String>,
    pub roles: Option<Vec<String>>,
    pub prefix: Option<String>,
    pub replicas: Option<usize>,
    /// Buckets of the instance records, read when the deployment's first node starts (1).
    pub instance_buckets: Option<u16>,
    pub data_dir: Option<PathBuf>,
    /// Seconds the node's clock may be off the NATS server's (5); 0 turns the guard off.
    pub max_clock_skew: Option<f64>,
    /// Seconds an actor may leave the watchdog's ping unanswered before it counts as stalled (30).
    pub stall_after: Option<f64>,
}

impl NodeSection {
    /// The replicas of streams and buckets, if set: 1 to 5 (JetStream's most). An error names
    /// the field.
    pub(crate) fn replicas(&self) -> Result<Option<usize>> {
        match self.replicas {
            Some(n) if !(1..=5).contains(&n) => {
                anyhow::bail!("[node] replicas = {n}: must be from 1 to 5")
            }
            n => Ok(n),
        }
    }

    /// The instance buckets a first node sets: `flag`'s, else this section's. An error names
    /// the field.
    pub(crate) fn instance_buckets(&self, flag: Option<u16>) -> Result<Option<u16>> {
        let most = ax_bus::client::instance_buckets::MAX_BUCKETS;
        match flag.or(self.instance_buckets) {
            Some(n) if !(1..=most).contains(&n) => {
                anyhow::bail!("[node] instance_buckets = {n}: must be from 1 to {most}")
            }
            n => Ok(n),
        }
    }

    /// The clock guard's limit; `None` when turned off. An error names the field.
    pub(crate) fn max_clock_skew(&self) -> Result<Option<Duration>> {
        match self.max_clock_skew {
            None => Ok(Some(DEFAULT_MAX_CLOCK_SKEW)),
            Some(0.0) => Ok(None),
            Some(v) if v.is_finite() && v > 0.0 => {
                seconds_setting("[node] max_clock_skew", v).map(Some)
            }
            Some(v) => {
                anyhow::bail!("[node] max_clock_skew = {v}: must be a number of seconds >= 0")
            }
        }
    }

    /// The watchdog's stall limit. An error names the field.
    pub(crate) fn stall_after(&self) -> Result<Duration> {
        match self.stall_after {
            None => Ok(ax_actors::DEFAULT_STALL_AFTER),
            Some(v) if v.is_finite() && v >= 1.0 => seconds_setting("[node] stall_after", v),
            Some(v) => anyhow::bail!("[node] stall_after = {v}: must be a number of seconds >= 1"),
        }
    }
}

/// The most slots a worker may have (fixed or adaptive).
const MAX_SLOTS: u32 = 1024;

/// `[worker]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WorkerSection {
    pub slots: Option<u32>,
    pub tags: Option<Vec<String>>,
    /// Slots kept for higher priorities.
    pub reserved: Option<Reserved>,
    /// Seconds JetStream waits for a dispatch's ack before redelivering it (30).
    pub dispatch_ack_wait: Option<f64>,
    /// Directory of plugin executables, loaded at start.
    pub plugin_dir: Option<PathBuf>,
    /// Python interpreter of the python executor outside a virtualenv (`python3`).
    pub python: Option<String>,
    /// The cap of an attempt's shipped log, in bytes (8 MiB).
    pub log_max_bytes: Option<u64>,
    /// Where attempts' cgroups are made: `auto`, `off`, or a cgroup v2 directory.
    pub cgroups: Option<String>,
    /// The memory offered to attempts that ask for some (`16Gi`; the host's by default).
    pub memory: Option<Memory>,
    /// The CPU offered to attempts that ask for some (`cpus`, DESIGN's key: cores, `8` or
    /// `7500m`; its cores); `cpu`, as `resources` writes it, is read as the same.
    #[serde(rename = "cpus", alias = "cpu")]
    pub cpu: Option<Cpu>,
    /// The limits of attempts whose job sets none of a kind (`[worker.limits]`).
    pub limits: Option<Resources>,
    /// Slots that follow the machine's pressure.
    pub adaptive: Option<AdaptiveSection>,
}

/// `[worker.adaptive]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AdaptiveSection {
    pub min: Option<u32>,
    pub max: Option<u32>,
    pub load_high: Option<f64>,
    pub load_low: Option<f64>,
    pub memory_min_mib: Option<u64>,
    pub every: Option<f64>,
}

impl AdaptiveSection {
    /// The budget's settings, defaulted (min 1, max twice the cores); an error names the field
    /// and says why.
    pub(crate) fn adaptive(&self, cores: u32) -> Result<Adaptive> {
        let min = self.min.unwrap_or(1);
        let max = self.max.unwrap_or(cores.saturating_mul(2).max(min));
        if min == 0 || min > max || max > MAX_SLOTS {
            anyhow::bail!(
                "[worker.adaptive] min = {min}, max = {max}: need 1 <= min <= max <= {MAX_SLOTS}"
            );
        }
        let mut adaptive = Adaptive::new(min, max);
        adaptive.load_high = self.load_high.unwrap_or(adaptive.load_high);
        adaptive.load_low = self.load_low.unwrap_or(adaptive.load_low);
        let (low, high) = (adaptive.load_low, adaptive.load_high);
        if !(low.is_finite() && high.is_finite() && low > 0.0 && low < high) {
            anyhow::bail!(
                "[worker.adaptive] load_low = {low}, load_high = {high}: need 0 < load_low < load_high (runnable tasks per core)"
            );
        }
        if let Some(mib) = self.memory_min_mib {
            adaptive.memory_min = mib.checked_mul(1 << 20).ok_or_else(|| {
                anyhow::anyhow!("[worker.adaptive] memory_min_mib = {mib}: more than any memory")
            })?;
        }
        match self.every {
            None => {}
            Some(v) if v.is_finite() && (0.5..=3600.0).contains(&v) => {
                adaptive.every = Duration::from_secs_f64(v)
            }
            Some(v) => {
                anyhow::bail!("[worker.adaptive] every = {v}: must be between 0.5 and 3600 seconds")
            }
        }
        Ok(adaptive)
    }
}

/// `[worker] limits`, checked as a job's `resources` are; an error names the field.
pub(crate) fn worker_limits(limits: Option<Resources>) -> Result<Resources> {
    let limits = limits.unwrap_or_default();
    if let Some((field, why)) = ax_bus::spec::resources::problems(&limits, true).first() {
        let field = field.trim_start_matches("job.resources.");
        anyhow::bail!("[worker] limits.{field}: {why}");
    }
    Ok(limits)
}

impl WorkerSection {
    /// The slots, 4 when unset; an error names the field.
    pub(crate) fn slots(&self) -> Result<u32> {
        match self.slots {
            None => Ok(4),
            Some(n) if (1..=MAX_SLOTS).contains(&n) => Ok(n),
            Some(n) => anyhow::bail!("[worker] slots = {n}: must be from 1 to {MAX_SLOTS}"),
        }
    }

    /// Where attempts' cgroups are made; an error names the field.
    pub(crate) fn cgroups(&self) -> Result<CgroupSetting> {
        Ok(match self.cgroups.as_deref() {
            None | Some("auto") => CgroupSetting::Auto,
            Some("off") => CgroupSetting::Off,
            Some(path) if path.starts_with('/') => CgroupSetting::Under(PathBuf::from(path)),
            Some(other) => anyhow::bail!(
                "[worker] cgroups = {other:?}: must be \"auto\", \"off\" or the absolute path of a cgroup v2 directory delegated to the worker"
            ),
        })
    }

    /// What the worker offers attempts that ask for resources.
    pub(crate) fn offer(&self) -> Offer {
        Offer {
            memory: self.memory.map(|m| m.0),
            cpu: self.cpu.map(|c| c.0),
        }
    }

    /// The cap of an attempt's log, defaulted; an error names the field.
    pub(crate) fn log_max_bytes(&self) -> Result<usize> {
        const RANGE: std::ops::RangeInclusive<u64> = 4096..=(1 << 30);
        match self.log_max_bytes {
            None => Ok(ax_actors::DEFAULT_LOG_MAX_BYTES),
            Some(v) if RANGE.contains(&v) => Ok(usize::try_from(v)?),
            Some(v) => anyhow::bail!(
                "[worker] log_max_bytes = {v}: must be between 4096 and 1073741824 (1 GiB)"
            ),
        }
    }

    /// The dispatch ack wait, defaulted; an error names the field.
    pub(crate) fn dispatch_ack_wait(&self) -> Result<Duration> {
        match self.dispatch_ack_wait {
            None => Ok(DEFAULT_DISPATCH_ACK_WAIT),
            Some(v) if v.is_finite() && v >= 1.0 => {
                seconds_setting("[worker] dispatch_ack_wait", v)
            }
            Some(v) => anyhow::bail!("[worker] dispatch_ack_wait = {v}: must be at least 1 second"),
        }
    }
}

/// `[router]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RouterSection {
    /// Weight of running attempts per core in a worker's score (0.7).
    pub weight_running: Option<f64>,
    /// Weight of the average duration in seconds (0.3).
    pub weight_duration: Option<f64>,
    /// Seconds a worker has to acknowledge a dispatch (5).
    pub ack_timeout: Option<f64>,
    /// Seconds without a heartbeat after which a worker is dead (10).
    pub worker_ttl: Option<f64>,
}

impl RouterSection {
    /// The Router's settings, defaults filled in; an error names the bad field.
    pub(crate) fn config(&self) -> Result<RouterConfig> {
        let mut config = RouterConfig::default();
        let seconds = |name: &str, value: Option<f64>, default: Duration| -> Result<Duration> {
            match value {
                None => Ok(default),
                Some(v) if v.is_finite() && v > 0.0 => {
                    seconds_setting(&format!("[router] {name}"), v)
                }
                Some(v) => {
                    anyhow::bail!("[router] {name} = {v}: must be a positive number of seconds")
                }
            }
        };
        config.ack_timeout = seconds("ack_timeout", self.ack_timeout, config.ack_timeout)?;
        let worker_ttl = seconds("worker_ttl", self.worker_ttl, config.policy.worker_ttl())?;
        config.policy = RoutingPolicy::new(config.policy.weights.clone(), worker_ttl);
        for (name, value, slot) in [
            (
                "weight_running",
                self.weight_running,
                &mut config.policy.weights.running,
            ),
            (
                "weight_duration",
                self.weight_duration,
                &mut config.policy.weights.duration,
            ),
        ] {
            if let Some(v) = value {
                if !v.is_finite() || v < 0.0 {
                    anyhow::bail!("[router] {name} = {v}: must be a number >= 0");
                }
                *slot = v;
            }
        }
        Ok(config)
    }
}

/// Reads a config file; errors name the file, the line and the field.
pub(crate) fn read(path: &Path) -> Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config {}", path.display()))?;
    toml::from_str(&text).map_err(|e| {
        let line = e
            .span()
            .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
        let place = match line {
            Some(line) => format!("{}:{line}", path.display()),
            None => path.display().to_string(),
        };
        anyhow::anyhow!("{place}: {}", e.message())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/node.example.toml");
        let config = read(&path).unwrap();
        assert!(config.node.roles.is_some());
        let cluster = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/cluster");
        let mut tomls = 0;
        for entry in std::fs::read_dir(cluster).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let config = read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                assert_eq!(config.node.replicas, Some(3), "{}", path.display());
                tomls += 1;
            }
        }
        assert_eq!(tomls, 4);
    }

    #[test]
    fn instance_buckets_out_of_range_are_refused_naming_the_field() {
        let parse = |text: &str| -> FileConfig { toml::from_str(text).unwrap() };
        let file = parse("[node]\ninstance_buckets = 3\n");
        assert_eq!(file.node.instance_buckets(None).unwrap(), Some(3));
        assert_eq!(
            file.node.instance_buckets(Some(5)).unwrap(),
            Some(5),
            "the flag wins"
        );
        assert_eq!(parse("").node.instance_buckets(None).unwrap(), None);
        for bad in ["0", "65"] {
            let file = parse(&format!("[node]\ninstance_buckets = {bad}\n"));
            let error = file.node.instance_buckets(None).unwrap_err().to_string();
            assert_eq!(
                error,
                format!("[node] instance_buckets = {bad}: must be from 1 to 64")
            );
        }
    }

    #[test]
    fn openlineage_events_are_made_only_with_the_section() {
        let parse = |text: &str| -> FileConfig { toml::from_str(text).unwrap() };
        let none = parse("");
        assert_eq!(lineage_namespace(&none.openlineage).unwrap(), None);
        assert_eq!(lineage_endpoint(&none.openlineage).unwrap(), None);
        let bare = parse("[openlineage]\n");
        assert_eq!(
            lineage_namespace(&bare.openlineage).unwrap().as_deref(),
            Some("ax")
        );
        assert_eq!(lineage_endpoint(&bare.openlineage).unwrap(), None);
        let posted =
            parse("[openlineage]\nurl = \"http://m:5000/api/v1/lineage\"\nnamespace = \"etl\"\n");
        assert_eq!(
            lineage_namespace(&posted.openlineage).unwrap().as_deref(),
            Some("etl")
        );
        assert_eq!(
            lineage_endpoint(&posted.openlineage)
                .unwrap()
                .map(|e| e.url),
            Some("http://m:5000/api/v1/lineage".to_string())
        );
        for (bad, says) in [
            ("url = \"ftp://m\"", "[openlineage] url"),
            ("url = \"http://m\"\ntimeout = -1", "[openlineage] timeout"),
            ("namespace = \" \"", "[openlineage] namespace"),
        ] {
            let config = parse(&format!("[openlineage]\n{bad}\n"));
            let error = lineage_endpoint(&config.openlineage)
                .and_then(|_| lineage_namespace(&config.openlineage))
                .unwrap_err()
                .to_string();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn settings_past_their_bounds_are_refused_naming_them_never_corrected() {
        let parse = |text: &str| -> FileConfig { toml::from_str(text).unwrap() };
        let refusal = |text: &str, read: fn(&FileConfig) -> Result<()>| -> String {
            read(&parse(text)).unwrap_err().to_string()
        };
        type Read = fn(&FileConfig) -> Result<()>;
        let cases: [(&str, Read, &str); 9] = [
            (
                "[worker]\nslots = 0\n",
                |f| f.worker.slots().map(drop),
                "[worker] slots = 0: must be from 1 to 1024",
            ),
            (
                "[worker]\nslots = 5000\n",
                |f| f.worker.slots().map(drop),
                "[worker] slots = 5000: must be from 1 to 1024",
            ),
            (
                "[node]\nreplicas = 0\n",
                |f| f.node.replicas().map(drop),
                "[node] replicas = 0: must be from 1 to 5",
            ),
            (
                "[console]\nindex_rows = 0\n",
                |f| f.console.index_rows().map(drop),
                "[console] index_rows = 0: must be at least 1",
            ),
            (
                "[retention]\nresults = \"213504d\"\n",
                |f| f.retention.retention().map(drop),
                "[retention] results = \"213504d\": `213504d` is longer than 36500d, the longest duration ax reads",
            ),
            (
                "[retention]\nlogs = \"100000000d\"\n",
                |f| f.retention.retention().map(drop),
                "[retention] logs = \"100000000d\": `100000000d` is longer than 36500d",
            ),
            (
                "[router]\nworker_ttl = 1e30\n",
                |f| f.router.config().map(drop),
                "[router] worker_ttl = 1000000000000000000000000000000 is not a number of seconds from 0 to 3153600000",
            ),
            (
                "[worker]\ndispatch_ack_wait = 1e19\n",
                |f| f.worker.dispatch_ack_wait().map(drop),
                "[worker] dispatch_ack_wait = 10000000000000000000 is not a number of seconds",
            ),
            (
                "[worker.adaptive]\nmemory_min_mib = 18446744073709551615\n",
                |f| f.worker.adaptive.as_ref().unwrap().adaptive(2).map(drop),
                "[worker.adaptive] memory_min_mib = 18446744073709551615: more than any memory",
            ),
        ];
        for (text, read, says) in cases {
            let error = refusal(text, read);
            assert!(error.starts_with(says), "{text}: {error}");
        }
        assert_eq!(parse("").worker.slots().unwrap(), 4);
        assert_eq!(parse("[worker]\nslots = 1\n").worker.slots().unwrap(), 1);
        let kept = parse("[retention]\nresults = \"36500d\"\n");
        assert_eq!(
            kept.retention.retention().unwrap().results,
            Some(ax_bus::duration::MAX)
        );
    }

    #[test]
    fn what_a_worker_offers_is_read_in_kubernetes_units_and_a_bad_one_names_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n.toml");
        std::fs::write(&path, "[worker]\nmemory = \"16Gi\"\ncpus = \"7500m\"\n").unwrap();
        let offer = read(&path).unwrap().worker.offer();
        assert_eq!(offer.memory, Some(16 << 30));
        assert_eq!(offer.cpu, Some(7500));
        std::fs::write(&path, "[worker]\ncpu = 8\n").unwrap();
        assert_eq!(read(&path).unwrap().worker.offer().cpu, Some(8000));
        std::fs::write(
            &path,
            "[worker]\nlimits = { memory = \"2Gi\", pids = 1024 }\n",
        )
        .unwrap();
        let limits = read(&path).unwrap().worker.limits.unwrap();
        assert_eq!(limits.memory.map(|m| m.0), Some(2 << 30));
        assert_eq!((limits.cpu, limits.pids), (None, Some(1024)));
        std::fs::write(&path, "[worker]\nlimits = { memory = \"1Mi\" }\n").unwrap();
        let limits = read(&path).unwrap().worker.limits.unwrap();
        assert_eq!(
            worker_limits(Some(limits)).unwrap_err().to_string(),
            "[worker] limits.memory: 1Mi is less than 4Mi: no process starts in it"
        );
        std::fs::write(&path, "[worker]\nslots = 2\nmemory = \"lots\"\n").unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains("n.toml:3"), "{err}");
        assert!(err.contains("lots"), "{err}");
    }

    #[test]
    fn unknown_keys_name_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n.toml");
        std::fs::write(&path, "[node]\nid = \"a\"\ncolour = 3\n").unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains("n.toml:3"), "{err}");
        assert!(err.contains("colour"), "{err}");
    }
}
