//! The command line, as DESIGN.md §3 fixes it.

use std::path::PathBuf;

use ax_bus::auth::Role;
use ax_bus::ids::{ApprovalId, InstanceId, JobName, Namespace, TokenName, TriggerKey};
use clap::{Args, Parser, Subcommand};

/// ax: a distributed task scheduler on NATS JetStream.
#[derive(Parser, Debug)]
#[command(name = "ax", version, about)]
pub(crate) struct Cli {
    /// NATS server URL (default: the URL `ax up` recorded in ./.ax, else nats://127.0.0.1:4222).
    #[arg(long, global = true, env = "AX_NATS_URL")]
    pub nats: Option<String>,
    /// Print one JSON document on stdout instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// Subject prefix.
    #[arg(long, global = true, default_value = "ax", env = "AX_PREFIX")]
    pub prefix: String,
    /// A file holding the API token commands carry when auth is on (`AX_TOKEN` holds the token
    /// itself).
    #[arg(long, global = true, env = "AX_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The namespace of the job names given without one (`settle` is `payments/settle` with
    /// `-n payments`), and the only one `ax job list`, `ax instance list` and `ax audit list`
    /// list.
    #[arg(short = 'n', long, global = true, env = "AX_NAMESPACE")]
    pub namespace: Option<Namespace>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Run a local cluster: a nats-server child (or --nats URL), every actor and a worker.
    Up(UpArgs),
    /// Run the actors of some roles against a NATS server.
    Node(NodeArgs),
    /// Manage jobs.
    #[command(subcommand)]
    Job(JobCommand),
    /// Inspect instances.
    #[command(subcommand)]
    Instance(InstanceCommand),
    /// Run ended instances again: one, or a business date's chain.
    Rerun(RerunArgs),
    /// Create a job's instances for past dates, in date order.
    Backfill(BackfillArgs),
    /// Where a dataset's data comes from and where it goes (or a job's), as the jobs'
    /// `produces:` and `consumes:` declare it.
    Lineage {
        /// A dataset URI (`warehouse://orders`) or a job name.
        target: String,
        /// Only towards where the data comes from.
        #[arg(long, conflicts_with = "downstream")]
        upstream: bool,
        /// Only towards what reads it.
        #[arg(long)]
        downstream: bool,
        /// At most this many steps away.
        #[arg(long)]
        depth: Option<usize>,
    },
    /// Every node: its roles and its actors' restarts, panics and stalls.
    Nodes,
    /// Which NATS server leads each of ax's written streams, weighed by the writes an
    /// instance makes to it.
    Leaders {
        /// Move leaders so that no server leads more than it must (a step-down each: the
        /// stream's writes pause a moment).
        #[arg(long)]
        spread: bool,
    },
    /// The health summary: the day's instances, failures, average trigger latency, longest
    /// execution, top failing jobs; backlog per queue; live workers and nodes; recent alerts.
    Status {
        /// The day (YYYY-MM-DD, in the DagCoordinator's `[status] timezone`); the latest
        /// summarized day when absent.
        #[arg(long)]
        date: Option<String>,
    },
    /// Inspect the workers.
    #[command(subcommand)]
    Worker(WorkerCommand),
    /// What each live worker can run: its executors, built in and plugins.
    Executors,
    /// Pause or resume the queue of one priority (nothing in it is lost).
    #[command(subcommand)]
    Queue(QueueCommand),
    /// Read the dead letters, or submit one again.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// API tokens: the first admin's, then one per person or service.
    #[command(subcommand)]
    Auth(AuthCommand),
    /// Re-runs waiting for a second person: list, approve, reject.
    #[command(subcommand)]
    Approvals(ApprovalsCommand),
    /// The audit trail: who did what, when, through which door.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Finished instances, kept elsewhere before their retention removes them.
    #[command(subcommand)]
    History(HistoryCommand),
    /// Copy every stream and bucket of the deployment (jobs, instances and their history,
    /// tokens, pending delayed work, results, logs, audit) into a new folder.
    Backup {
        /// The folder to write (it must not exist).
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Bring a backup into a NATS that has none of ax's streams; then start the nodes.
    Restore {
        /// The backup folder.
        #[arg(long)]
        from: std::path::PathBuf,
    },
    /// Measure speed against raw JetStream (its own nats-server).
    Bench {
        /// Small sizes: shows that each section works (the test suite runs it); not figures to compare.
        #[arg(long)]
        quick: bool,
        /// Run only these sections (limit is always measured).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
    },
    /// Follow a public subject.
    #[command(subcommand)]
    Tail(TailCommand),
    /// Teams' parts of ax: each job is in one (`default` when its spec names none).
    #[command(subcommand)]
    Namespace(NamespaceCommand),
}

impl Cli {
    /// Places the job names given without a namespace in `--namespace`'s.
    pub(crate) fn place_job_names(&mut self) -> Result<(), ax_bus::ids::IdError> {
        let Some(namespace) = &self.namespace else {
            return Ok(());
        };
        for name in self.command.job_names() {
            if name.in_default() {
                *name = JobName::in_namespace(namespace, name)?;
            }
        }
        Ok(())
    }
}

impl Command {
    /// Every job name given on the command line, for `--namespace` to place.
    fn job_names(&mut self) -> Vec<&mut JobName> {
        match self {
            Command::Job(command) => match command {
                JobCommand::Get { name }
                | JobCommand::Delete { name }
                | JobCommand::Pause { name }
                | JobCommand::Resume { name }
                | JobCommand::History { name, .. }
                | JobCommand::Trigger { name, .. }
                | JobCommand::Init { name, .. } => vec![name],
                JobCommand::Run(args) => args.job.iter_mut().collect(),
                JobCommand::Apply { .. } | JobCommand::List => Vec::new(),
            },
            Command::Rerun(args) => args.root.iter_mut().collect(),
            Command::Backfill(args) => vec![&mut args.job],
            Command::History(HistoryCommand::Export { job, .. })
            | Command::Tail(TailCommand::Results { job }) => job.iter_mut().collect(),
            _ => Vec::new(),
        }
    }
}

#[derive(Subcommand, Debug)]
pub(crate) enum NamespaceCommand {
    /// Each namespace that holds jobs or has settings: its jobs, weight and quota.
    List,
    /// Stores a namespace's settings (an admin's of every namespace) and prints the NATS user
    /// its business services connect as (see `ax namespace user`). Again: changes them.
    #[command(visible_alias = "set")]
    Create {
        /// The namespace.
        namespace: Namespace,
        /// Its weight in the fair share of the workers' free slots among namespaces with work
        /// waiting (1 to 1000).
        #[arg(long, default_value_t = 1)]
        weight: u32,
        /// The most jobs it may hold (an apply beyond is refused).
        #[arg(long)]
        max_jobs: Option<u32>,
        /// The most of its attempts dispatched and running at once (the rest wait for one to
        /// end, tagged `queued` with the reason).
        #[arg(long)]
        max_running: Option<u32>,
        /// The most of its instances waiting to run (in its ready queues): a trigger beyond
        /// is refused with the reason until some have run (cron fires never are).
        #[arg(long)]
        max_waiting: Option<u32>,
    },
    /// Removes a namespace's settings (weight 1, no quota again); its jobs stay.
    Delete {
        /// The namespace.
        namespace: Namespace,
    },
    /// The NATS user a namespace's business services connect as: an entry for the server's
    /// `authorization { users = [ … ] }`, allowing them to trigger and read the namespace's
    /// work and nothing else (their connections take the inbox prefix `_INBOX.<namespace>`).
    /// Nothing is read from NATS: a server's config can be written before it runs.
    User {
        /// The namespace.
        namespace: Namespace,
        /// The user's name (the namespace's by default).
        #[arg(long)]
        user: Option<String>,
        /// The password as the config writes it (default: `$<NAMESPACE>_NATS_PASSWORD`, a
        /// variable of the server's environment).
        #[arg(long)]
        password: Option<String>,
    },
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["instance", "biz_date"])))]
pub(crate) struct RerunArgs {
    /// One instance (a new attempt with its original params).
    #[arg(long)]
    pub instance: Option<InstanceId>,
    /// Every instance of a business date (YYYY-MM-DD)…
    #[arg(long)]
    pub biz_date: Option<String>,
    /// …from this job and its downstream only.
    #[arg(long, requires = "biz_date")]
    pub root: Option<JobName>,
    /// Re-run only failed and cancelled instances.
    #[arg(long)]
    pub failed_only: bool,
    /// Also re-run downstream instances that succeeded.
    #[arg(long)]
    pub force_downstream: bool,
    /// Print the plan and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// A date-wide re-run (no `--root`) without asking: without it the plan is shown and, on a
    /// terminal, confirmed; elsewhere it is refused.
    #[arg(long, conflicts_with = "dry_run")]
    pub yes: bool,
}

#[derive(Args, Debug)]
pub(crate) struct BackfillArgs {
    /// The job.
    pub job: JobName,
    /// First business date (YYYY-MM-DD).
    #[arg(long)]
    pub from: String,
    /// Last business date, included.
    #[arg(long)]
    pub to: String,
    /// Also create the instances of downstream jobs that run on a cron.
    #[arg(long)]
    pub with_downstream: bool,
    /// Most instances running at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub parallel: u32,
}

#[derive(Subcommand, Debug)]
pub(crate) enum WorkerCommand {
    /// Every worker with its heartbeat, load and score.
    List,
}

#[derive(Subcommand, Debug)]
pub(crate) enum AuthCommand {
    /// Make the first admin token (once; works without a token).
    Bootstrap {
        /// Its name.
        #[arg(long, default_value = "admin")]
        name: TokenName,
        /// Write it to this file (mode 0600) instead of printing it.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Make, list or revoke tokens (admin).
    #[command(subcommand)]
    Token(TokenCommand),
}

#[derive(Subcommand, Debug)]
pub(crate) enum TokenCommand {
    /// Make a token; its secret is printed once.
    Create {
        /// Its name (`[a-z0-9][a-z0-9-]*`).
        #[arg(long)]
        name: TokenName,
        /// viewer, operator or admin: in every namespace, or with `-n/--namespace` in that
        /// one only.
        #[arg(long)]
        role: Role,
        /// It stops working after this long (`30d`, `12h`).
        #[arg(long)]
        expires: Option<String>,
        /// Write it to this file (mode 0600) instead of printing it.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Every token (never their secrets).
    List,
    /// Stop a token working, on every node.
    Revoke {
        /// Its name.
        name: TokenName,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum ApprovalsCommand {
    /// Every approval kept, pending first.
    List,
    /// Approve a re-run (another admin than who asked): planned again, run if unchanged.
    Approve {
        /// Its id.
        id: ApprovalId,
    },
    /// Refuse a re-run.
    Reject {
        /// Its id.
        id: ApprovalId,
        /// Why.
        #[arg(long)]
        reason: String,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum HistoryCommand {
    /// Every finished instance that ended within a span, as JSON Lines on stdout: its record
    /// (output included) and its history (every step of every attempt).
    Export {
        /// From this date (YYYY-MM-DD, UTC) or instant (RFC 3339).
        #[arg(long)]
        from: String,
        /// To this date, included, or this instant, excluded.
        #[arg(long)]
        to: String,
        /// Only this job's.
        #[arg(long)]
        job: Option<JobName>,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum AuditCommand {
    /// Records, oldest first.
    List {
        /// Since this long ago (`24h`, `7d`) or this instant (RFC 3339); 24h by default.
        #[arg(long, default_value = "24h")]
        since: String,
        /// Only this actor's.
        #[arg(long)]
        actor: Option<String>,
        /// Only this action (`trigger`, `rerun`, `token.create`, …).
        #[arg(long)]
        action: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum DlqCommand {
    /// Every dead letter kept, oldest first.
    List,
    /// Submit one again: a new attempt of its instance, or its message back on its subject.
    Replay {
        /// The dead letter's id (from `ax dlq list`).
        id: u64,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum QueueCommand {
    /// Stop dispatching from a priority's queue.
    Pause {
        /// high, normal or low.
        priority: String,
    },
    /// Dispatch from it again.
    Resume {
        /// high, normal or low.
        priority: String,
    },
    /// Which queues are paused.
    List,
}

#[derive(Args, Debug)]
pub(crate) struct UpArgs {
    /// Where the NATS store, the worker's outbox and the recorded URL live.
    #[arg(long, default_value = ".ax")]
    pub data_dir: PathBuf,
    /// Port of the embedded nats-server (4222, or a free port when 4222 is taken).
    #[arg(long, conflicts_with = "nats")]
    pub nats_port: Option<u16>,
    /// Job files or directories to apply once the cluster is up.
    #[arg(long = "jobs", value_name = "FILE|DIR")]
    pub jobs: Vec<PathBuf>,
    /// Concurrent attempts of the local worker (1 to 1024).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub slots: u32,
    /// Plugin executors of the local worker.
    #[arg(long, value_name = "DIR")]
    pub plugin_dir: Option<PathBuf>,
    /// Port of the HTTP server on 127.0.0.1 (/metrics): 8080, or a free port when 8080 is
    /// taken.
    #[arg(long)]
    pub http_port: Option<u16>,
    /// Require tokens (`[auth] enabled`): the first admin token is made and written to
    /// `<data-dir>/admin.token`.
    #[arg(long)]
    pub auth: bool,
}

#[derive(Args, Debug)]
pub(crate) struct NodeArgs {
    /// Comma-separated roles: scheduler, dag, router, worker, reporter (all: the five), admin
    /// (the console, on --http or 127.0.0.1:8080).
    #[arg(long)]
    pub roles: Option<String>,
    /// Node config (TOML); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Worker tags.
    #[arg(long, value_delimiter = ',')]
    pub tags: Option<Vec<String>>,
    /// Worker slots (concurrent attempts, 1 to 1024).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub slots: Option<u32>,
    /// Node and worker id.
    #[arg(long)]
    pub id: Option<String>,
    /// Where the worker keeps its outbox.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Replicas of streams and buckets (3 on a NATS cluster; 1 to 5).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=5))]
    pub replicas: Option<usize>,
    /// Buckets of the instance records, set by a deployment's first node (1; one per server
    /// of a NATS cluster spreads their writes; `ax instance buckets --set` changes it later).
    #[arg(long)]
    pub instance_buckets: Option<u16>,
    /// Serve HTTP (/metrics) on HOST:PORT (`[metrics] listen` in the config); none without it.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<String>,
    /// Require a valid token on every command and console request (`[auth] enabled`).
    #[arg(long)]
    pub auth: bool,
}

#[derive(Subcommand, Debug)]
pub(crate) enum JobCommand {
    /// Validate job files and apply them.
    Apply {
        /// A YAML file or a directory of them (repeatable).
        #[arg(short = 'f', long = "file", required = true, value_name = "FILE|DIR")]
        files: Vec<PathBuf>,
    },
    /// List jobs.
    List,
    /// Print a job's definition (YAML; JSON with --json).
    Get { name: JobName },
    /// Delete a job.
    Delete { name: JobName },
    /// Stop firing a job on its cron.
    Pause { name: JobName },
    /// Fire a paused job again.
    Resume { name: JobName },
    /// Every recorded tick of a job: fired, caught_up, skipped or deduplicated.
    History {
        name: JobName,
        /// How many of the latest ticks.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Run one instance now.
    Trigger {
        name: JobName,
        /// Business date, YYYY-MM-DD (today in the job's zone by default).
        #[arg(long)]
        biz_date: Option<String>,
        /// An idempotency key: the same key makes one instance, however often it is sent.
        #[arg(long)]
        key: Option<TriggerKey>,
        /// Run at this instant (RFC 3339, e.g. 2026-12-01T14:03:05.250Z) instead of now.
        #[arg(long, value_parser = checked_instant, conflicts_with = "delay")]
        at: Option<String>,
        /// Run after this long (250ms, 30s, 5m, 2h, 1d) instead of now.
        #[arg(long = "in", value_name = "DURATION", value_parser = checked_delay, allow_hyphen_values = true)]
        delay: Option<String>,
        /// A param, `key=value` (repeatable; overrides the job's).
        #[arg(long = "param", value_name = "KEY=VALUE")]
        params: Vec<String>,
    },
    /// Run one job's attempt here, without a cluster, through the executors a worker uses
    /// (templates, environment, timeout, output file); prints its result and output and
    /// exits non-zero when it failed.
    Run(RunArgs),
    /// Write a commented job spec to start from (`NAME.yaml`, or --out).
    Init {
        name: JobName,
        /// shell, http, python, sql, noop or a plugin's name.
        #[arg(long = "type", value_name = "TYPE", default_value = "shell")]
        kind: String,
        /// Where to write it (`-` for stdout).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// The job file.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: PathBuf,
    /// Which job of the file (needed when it holds several).
    #[arg(long)]
    pub job: Option<JobName>,
    /// Business date, YYYY-MM-DD (today in the job's zone by default).
    #[arg(long)]
    pub biz_date: Option<String>,
    /// A param, `key=value` (repeatable; overrides the job's).
    #[arg(long = "param", value_name = "KEY=VALUE")]
    pub params: Vec<String>,
    /// An upstream output field its templates read, `job.field=value` (repeatable; a JSON value
    /// or text).
    #[arg(long = "dep", value_name = "JOB.FIELD=VALUE")]
    pub deps: Vec<String>,
    /// Node config whose `[databases]` and `[worker] plugin_dir` / `python` to use.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Plugin executors (as `ax up --plugin-dir`).
    #[arg(long, value_name = "DIR")]
    pub plugin_dir: Option<PathBuf>,
    /// Where `ax up`'s demo database lives (the sql demo jobs' `demo`).
    #[arg(long, default_value = ".ax")]
    pub data_dir: PathBuf,
}

#[derive(Subcommand, Debug)]
pub(crate) enum InstanceCommand {
    /// List instances, newest (latest expected time) first.
    List {
        /// Of the jobs whose name holds this, as the console's search box does (`sync` lists
        /// `sync_order_daily` and `sync_pay_daily`), or that match it whole as a glob when it
        /// has `*` or `?` (`sync_*_daily`).
        #[arg(long, value_name = "PART|GLOB")]
        job: Option<String>,
        #[arg(long)]
        biz_date: Option<String>,
        /// Expected at or after this: `24h` (that long ago) or an RFC 3339 instant.
        #[arg(long, value_parser = parse_window_start)]
        since: Option<chrono::DateTime<chrono::Utc>>,
        /// Expected at or before this: `1h` (that long ago) or an RFC 3339 instant.
        #[arg(long, value_parser = parse_window_start)]
        until: Option<chrono::DateTime<chrono::Utc>>,
        /// running, success, failed, waiting_retry or cancelled.
        #[arg(long)]
        state: Option<ax_bus::State>,
        /// Any tag (`scheduled`, `waiting_deps`, `killed`, ...). `--tag scheduled` lists the
        /// instances due later too, which the list leaves out otherwise.
        #[arg(long)]
        tag: Option<ax_bus::Tag>,
        /// At most this many (the newest); a note on stderr says how many more there are.
        #[arg(long, default_value_t = 100, conflicts_with = "all")]
        limit: usize,
        /// Every one that matches.
        #[arg(long)]
        all: bool,
        /// Only their ids, one per line (for `id=$(ax instance list … --limit 1 --ids)`).
        #[arg(long)]
        ids: bool,
    },
    /// Print one instance.
    Get { id: InstanceId },
    /// Print an attempt's stdout and stderr as the worker shipped them (the last attempt by
    /// default); `--follow` prints them as they are written, attempt after attempt, until the
    /// instance ends (exit status 0 only if it succeeded). On a terminal, control characters
    /// are written visibly (`\x1b`); `--raw` writes them as they are.
    Logs {
        id: InstanceId,
        /// Which attempt (1, 2, …); with `--follow`, that attempt only.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        attempt: Option<u32>,
        /// Keep printing as the instance's attempts write, until it ends.
        #[arg(long, short = 'f')]
        follow: bool,
        /// Write the job's bytes as they are, escape sequences included.
        #[arg(long)]
        raw: bool,
    },
    /// Every step of every attempt, in order, each with its time and node: created,
    /// released, dispatched (to which worker, which delivery), claimed, started, ended,
    /// reported, retried, lost, cancelled, killed, marked.
    History { id: InstanceId },
    /// End a waiting instance (scheduled, waiting_deps, queued, no_worker, waiting_retry)
    /// `cancelled`; its waiting downstream of the same date is cancelled too.
    Cancel {
        id: InstanceId,
        /// Why (kept in the record and the audit).
        #[arg(long)]
        reason: Option<String>,
    },
    /// An operator's verdict on an ended or waiting instance: it ends success or failed (tag
    /// marked); a marked success releases the downstream waiting on it.
    #[command(group(clap::ArgGroup::new("verdict").required(true).args(["success", "failed"])))]
    Mark {
        id: InstanceId,
        /// Mark it succeeded.
        #[arg(long)]
        success: bool,
        /// Mark it failed.
        #[arg(long)]
        failed: bool,
        /// Why (required; kept in the record and the audit).
        #[arg(long)]
        reason: String,
    },
    /// Report how the work of an executing attempt ended whose http endpoint answered `202
    /// Accepted`, as the business would with `report` (its current attempt's trace id): the
    /// attempt ends with it.
    #[command(group(clap::ArgGroup::new("verdict").required(true).args(["success", "failed"])))]
    Report {
        id: InstanceId,
        /// The work succeeded.
        #[arg(long)]
        success: bool,
        /// The work failed (tag rejected).
        #[arg(long)]
        failed: bool,
        /// A line for people.
        #[arg(long, default_value = "")]
        message: String,
        /// Structured output, as JSON.
        #[arg(long, value_parser = json_value)]
        output: Option<serde_json::Value>,
    },
    /// Stop an executing attempt (dump signal, grace, SIGKILL to its process group); the
    /// instance ends `failed`, tag `killed`, without a retry.
    Kill {
        id: InstanceId,
        /// Why (kept in the record and the audit).
        #[arg(long)]
        reason: Option<String>,
    },
    /// The buckets the instance records are kept in: each one's keys, bytes and leader.
    Buckets {
        /// Move the records into this many buckets (1 to 64), with every node stopped; run
        /// again to finish a move that was cut short.
        #[arg(long)]
        set: Option<u16>,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum TailCommand {
    /// Results as they arrive, one JSON line each.
    Results {
        #[arg(long)]
        job: Option<JobName>,
    },
}

/// Parses an identity given on the command line: a one-line error names the argument, the
/// value and the rule it breaks, before anything is sent.
/// A window's end as `--since`/`--until` take it: a duration ago (`24h`) or an RFC 3339
/// instant.
fn parse_window_start(text: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    ax_bus::time::parse_since(text)
}

pub(crate) fn parse_id<T>(argument: &str, text: &str) -> anyhow::Result<T>
where
    T: std::str::FromStr<Err = ax_bus::ids::IdError>,
{
    text.parse()
        .map_err(|e: ax_bus::ids::IdError| anyhow::anyhow!("{argument}: {e}"))
}

/// `--at` as given, once it reads as an instant (the Scheduler reads it again).
fn checked_instant(text: &str) -> Result<String, String> {
    ax_bus::time::parse_instant(text).map(|_| text.to_string())
}

/// `--in` as given, once it reads as a delay.
fn checked_delay(text: &str) -> Result<String, String> {
    ax_bus::time::parse_delay(text).map(|_| text.to_string())
}

/// A JSON value given on the command line.
fn json_value(text: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// README's layout names every subcommand (what `bin/` holds is read there first).
    #[test]
    fn the_readme_layout_names_every_subcommand() {
        let readme = include_str!("../README.md");
        let start = readme.find("bin/ ").expect("README's layout has bin/");
        let end = start + readme[start..].find(")\n").expect("the list ends with `)`");
        let named: Vec<&str> = readme[start..end]
            .split(['(', ',', ' ', '\n'])
            .filter(|w| !w.is_empty())
            .collect();
        for sub in super::Cli::command().get_subcommands() {
            let name = sub.get_name();
            assert!(named.contains(&name), "README's layout misses `{name}`");
        }
    }
}
