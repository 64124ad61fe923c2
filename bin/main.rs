//! The `ax` command: node runner, local cluster and CLI. Thin by design: it parses arguments,
//! wires actors from ax-actors and prints what ax-bus returns.

mod args;
mod auth;
mod backup;
mod bench;
mod connect;
mod dlq;
mod fleet;
mod history;
mod instances;
mod jobs;
mod lineage;
mod local;
mod node_cmd;
mod node_config;
mod screen;
mod shutdown;
mod table;
mod up;

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use tracing_subscriber::EnvFilter;

use args::{
    AuditCommand, Cli, Command, DlqCommand, HistoryCommand, InstanceCommand, JobCommand,
    NamespaceCommand, QueueCommand, TailCommand, WorkerCommand,
};
use ax_bus::messages::typed::{Cancel, Delete, Kill, Pause, Resume};
use ax_bus::messages::JobNameRequest;

/// Every attempt allocates and frees many small buffers on several threads (messages, records,
/// futures); glibc's allocator spent about a quarter of ax's CPU on them in the throughput
/// benchmark.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The stack of the thread the command runs on.
const STACK_BYTES: usize = 64 * 1024 * 1024;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    if !matches!(cli.command, Command::Up(_) | Command::Node(_)) {
        // A command whose output is cut short (`ax instance list | head`) ends quietly, as
        // Unix tools do, instead of panicking on the broken pipe. (Sockets are written with
        // MSG_NOSIGNAL and are not concerned; `up` and `node` keep ignoring the signal.)
        // SAFETY: one call, before any other thread exists.
        unsafe {
            nix::libc::signal(nix::libc::SIGPIPE, nix::libc::SIG_DFL);
        }
    }
    logging(&cli.command);
    // On a thread of its own with a large stack: a debug build polls the deeply nested futures
    // of a node or a benchmark in frames that overflowed the main thread's 8 MiB.
    let outcome = std::thread::Builder::new()
        .name("ax".into())
        .stack_size(STACK_BYTES)
        .spawn(move || actix::System::new().block_on(run(cli)))
        .map_err(anyhow::Error::from)
        .and_then(|thread| {
            thread
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the ax thread panicked")))
        });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let reason = format!("{e:#}").replace('\n', " ");
            eprintln!("error: {reason}");
            ExitCode::FAILURE
        }
    }
}

async fn run(mut cli: Cli) -> Result<()> {
    cli.place_job_names()?;
    let namespace = cli.namespace.clone();
    let nats = cli.nats.as_deref();
    let json = cli.json;
    let prefix = cli.prefix.as_str();
    let to = Connect {
        nats,
        prefix,
        token_file: cli.token_file.clone(),
    };
    let client = || to.client();
    // The long-running commands' futures are boxed: inline beside every other command's, they
    // made this future's poll frame large enough to overflow the main thread's stack (debug).
    match cli.command {
        Command::Job(command) => Box::pin(job(command, &to, namespace.as_ref(), json)).await,
        Command::Instance(command) => {
            Box::pin(instance(command, &to, namespace.as_ref(), json)).await
        }
        Command::Up(args) => Box::pin(up::run(args, nats, prefix)).await,
        Command::Node(args) => Box::pin(node_cmd::run(args, nats, prefix)).await,
        Command::Bench { quick, only } => Box::pin(bench::run(quick, &only, json)).await,
        Command::Nodes => fleet::nodes(&client().await?, json).await,
        Command::Leaders { spread } => fleet::leaders(&client().await?, spread, json).await,
        Command::Status { date } => {
            let client = client().await?;
            fleet::status(&client, date.as_deref(), namespace.as_ref(), json).await
        }
        Command::Worker(WorkerCommand::List) => fleet::workers(&client().await?, json).await,
        Command::Executors => fleet::executors(&client().await?, json).await,
        Command::Queue(QueueCommand::Pause { priority }) => {
            fleet::queue(&client().await?, &priority, true, json).await
        }
        Command::Queue(QueueCommand::Resume { priority }) => {
            fleet::queue(&client().await?, &priority, false, json).await
        }
        Command::Queue(QueueCommand::List) => fleet::queues(&client().await?, json).await,
        Command::Dlq(DlqCommand::List) => dlq::list(&client().await?, json).await,
        Command::Dlq(DlqCommand::Replay { id }) => dlq::replay(&client().await?, id, json).await,
        Command::Auth(command) => {
            auth::run(&client().await?, command, namespace.as_ref(), json).await
        }
        Command::Approvals(command) => auth::approvals(&client().await?, command, json).await,
        Command::Audit(AuditCommand::List {
            since,
            actor,
            action,
        }) => {
            let filter = auth::AuditFilter {
                since,
                actor,
                action,
                namespace: namespace.clone(),
            };
            auth::audit(&client().await?, &filter, json).await
        }
        Command::Rerun(args) => jobs::rerun(&client().await?, args, json).await,
        Command::Backfill(args) => jobs::backfill(&client().await?, args, json).await,
        Command::Lineage {
            target,
            upstream,
            downstream,
            depth,
        } => {
            use ax_bus::spec::dataset::Direction;
            let direction = match (upstream, downstream) {
                (true, _) => Some(Direction::Upstream),
                (_, true) => Some(Direction::Downstream),
                _ => None,
            };
            lineage::show(&client().await?, &target, direction, depth, json).await
        }
        Command::Backup { out } => backup::take(nats, prefix, &out).await,
        Command::Restore { from } => backup::restore(nats, prefix, &from).await,
        Command::History(HistoryCommand::Export { from, to, job }) => {
            let span = history::Span::parse(&from, &to)?;
            history::export(&client().await?, &span, job.as_ref()).await
        }
        Command::Tail(TailCommand::Results { job }) => {
            instances::tail_results(&client().await?, job.as_ref()).await
        }
        Command::Namespace(command) => namespaces(command, &to, json).await,
    }
}

/// How a command reaches NATS, when it needs to.
struct Connect<'a> {
    nats: Option<&'a str>,
    prefix: &'a str,
    token_file: Option<std::path::PathBuf>,
}

impl Connect<'_> {
    async fn client(&self) -> Result<ax_bus::AxClient> {
        connect::connect(self.nats, self.prefix, self.token_file.as_deref()).await
    }
}

/// `ax namespace …`.
async fn namespaces(command: NamespaceCommand, to: &Connect<'_>, json: bool) -> Result<()> {
    match command {
        NamespaceCommand::List => jobs::namespaces(&to.client().await?, json).await,
        NamespaceCommand::Create {
            namespace,
            weight,
            max_jobs,
            max_running,
            max_waiting,
        } => {
            let settings = ax_bus::messages::NamespaceSettings {
                weight,
                max_jobs,
                max_running,
                max_waiting,
            };
            let client = to.client().await?;
            jobs::set_namespace(&client, &namespace, Some(settings), json).await?;
            if !json {
                println!("# the NATS user its business services connect as:");
                jobs::namespace_user(&client.layout, &namespace, None, None);
            }
            Ok(())
        }
        NamespaceCommand::Delete { namespace } => {
            jobs::set_namespace(&to.client().await?, &namespace, None, json).await
        }
        NamespaceCommand::User {
            namespace,
            user,
            password,
        } => {
            let subjects = ax_bus::subjects::Subjects::new(to.prefix);
            let layout = ax_bus::client::provision::Layout::new(subjects, None);
            jobs::namespace_user(&layout, &namespace, user, password);
            Ok(())
        }
    }
}

/// `ax job …`.
async fn job(
    command: JobCommand,
    to: &Connect<'_>,
    namespace: Option<&ax_bus::ids::Namespace>,
    json: bool,
) -> Result<()> {
    let client = || to.client();
    match command {
        JobCommand::Apply { files } => {
            let found = jobs::load_or_report(&files)?;
            jobs::apply(&client().await?, found, json).await
        }
        JobCommand::List => jobs::list(&client().await?, namespace, json).await,
        JobCommand::Get { name } => jobs::get(&client().await?, &name, json).await,
        JobCommand::Delete { name } => {
            let request = Delete(JobNameRequest { name: name.clone() });
            jobs::command(&client().await?, request, &name, json).await
        }
        JobCommand::Pause { name } => {
            let request = Pause(JobNameRequest { name: name.clone() });
            jobs::command(&client().await?, request, &name, json).await
        }
        JobCommand::Resume { name } => {
            let request = Resume(JobNameRequest { name: name.clone() });
            jobs::command(&client().await?, request, &name, json).await
        }
        JobCommand::Run(args) => {
            if local::run(args, json).await? {
                Ok(())
            } else {
                anyhow::bail!("the attempt failed")
            }
        }
        JobCommand::Init { name, kind, out } => local::init(&name, &kind, out),
        JobCommand::History { name, limit } => {
            jobs::history(&client().await?, &name, limit, json).await
        }
        JobCommand::Trigger {
            name,
            biz_date,
            key,
            at,
            delay,
            params,
        } => {
            let when = jobs::When { at, delay };
            jobs::trigger(
                &client().await?,
                &name,
                biz_date,
                key.as_ref(),
                when,
                &params,
                json,
            )
            .await
        }
    }
}

/// `ax instance …`.
async fn instance(
    command: InstanceCommand,
    to: &Connect<'_>,
    namespace: Option<&ax_bus::ids::Namespace>,
    json: bool,
) -> Result<()> {
    let client = || to.client();
    match command {
        InstanceCommand::List {
            job,
            biz_date,
            since,
            until,
            state,
            tag,
            limit,
            all,
            ids,
        } => {
            let filter = instances::Filter {
                job,
                biz_date,
                since,
                until,
                state,
                tag,
                limit: (!all).then_some(limit),
                namespace: namespace.cloned(),
            };
            instances::list(&client().await?, &filter, json, ids).await
        }
        InstanceCommand::Get { id } => instances::get(&client().await?, &id, json).await,
        InstanceCommand::Logs {
            id,
            attempt,
            follow,
            raw,
        } => {
            let how = instances::LogsHow { follow, raw, json };
            instances::logs(&client().await?, &id, attempt, how).await
        }
        InstanceCommand::History { id } => instances::history(&client().await?, &id, json).await,
        InstanceCommand::Cancel { id, reason } => {
            instances::act(&client().await?, Cancel, id, reason, json).await
        }
        InstanceCommand::Mark {
            id,
            success,
            failed: _,
            reason,
        } => instances::mark(&client().await?, id, success, reason, json).await,
        InstanceCommand::Report {
            id,
            success,
            failed: _,
            message,
            output,
        } => instances::report(&client().await?, id, success, message, output, json).await,
        InstanceCommand::Kill { id, reason } => {
            instances::act(&client().await?, Kill, id, reason, json).await
        }
        InstanceCommand::Buckets { set } => instances::buckets(&client().await?, set, json).await,
    }
}

/// Where the log goes. A node logs at `info` on stderr (its supervisor keeps it). Every other
/// command shows warnings only, `RUST_LOG` choosing otherwise; `ax up` also writes the whole
/// log (`info`) to `<data-dir>/ax.log`, so that its terminal shows the build's progress, then
/// its banner — console, metrics, NATS — and only warnings after it.
fn logging(command: &Command) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{fmt, Layer};
    let level = match command {
        Command::Node(_) => "info",
        _ => "warn",
    };
    let stderr = fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level)));
    let file = match command {
        Command::Up(args) => up::log_file(&args.data_dir).map(|file| {
            fmt::layer()
                .with_writer(std::sync::Mutex::new(file))
                .with_ansi(false)
                .with_filter(EnvFilter::new("info"))
        }),
        _ => None,
    };
    tracing_subscriber::registry()
        .with(stderr)
        .with(file)
        .init();
}

/// Help and version as clap prints them; any other argument error as one line on stderr, as
/// every other error of the CLI is (`error: <what>`, the usage in brackets when clap gives
/// one), without clap's closing "For more information" line. Exit code 2, clap's.
fn usage_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    eprintln!("{}", one_line(&e.render().to_string()));
    ExitCode::from(2)
}

/// clap's rendering of an argument error folded into one line.
fn one_line(rendered: &str) -> String {
    let mut text = String::new();
    let mut usage = None;
    for line in rendered.lines().map(str::trim) {
        if line.is_empty() || line.starts_with("For more information") {
            continue;
        }
        if let Some(u) = line.strip_prefix("Usage: ") {
            usage = Some(u.to_string());
            continue;
        }
        // A line that announces a list runs into it; separate remarks are set apart.
        if !text.is_empty() {
            text.push_str(if text.ends_with(':') { " " } else { "; " });
        }
        text.push_str(line);
    }
    if let Some(usage) = usage {
        text.push_str(&format!(" (usage: {usage})"));
    }
    text
}
