//! `ax up`: a whole cluster on this machine — a nats-server child (unless `--nats URL`), every
//! actor, and a worker (with a SQLite database `demo` for the sql executor and, with
//! `--plugin-dir`, plugin executors) — with the given job files applied. Ctrl-C or SIGTERM
//! stops everything; the nats-server child also dies with this process if it is killed
//! outright.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};

use ax_actors::ExecutorsConfig;
use ax_actors::SystemClock;
use ax_actors::WorkerConfig;
use ax_actors::{parse_roles, Node, NodeConfig};
use ax_bus::client::local_server::{self, LocalServer, ServerOptions};
use ax_bus::client::{AxClient, ConnectConfig};
use ax_bus::ids::NodeId;

use crate::args::UpArgs;
use crate::connect::URL_FILE;
use crate::{jobs, shutdown};

/// The log of `ax up`, in its data directory.
const LOG_FILE: &str = "ax.log";
const DEFAULT_PORT: u16 = 4222;
/// The HTTP server's port, unless taken.
const DEFAULT_HTTP_PORT: u16 = 8080;

pub(crate) async fn run(args: UpArgs, nats_flag: Option<&str>, prefix: &str) -> Result<()> {
    // Job files are checked before anything starts.
    let job_files = if args.jobs.is_empty() {
        Vec::new()
    } else {
        jobs::load_or_report(&args.jobs)?
    };
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create {}", args.data_dir.display()))?;
    let data_dir = args.data_dir.canonicalize()?;
    let (url, server) = nats_of(nats_flag, args.nats_port, &data_dir)?;
    let mut config = ConnectConfig::new(&url, "ax-up");
    config.prefix = prefix.to_string();
    let client = AxClient::connect_node(&config).await?;
    // Recorded once JetStream is set up: a command that finds the URL finds ax's streams.
    // Readable by its owner only: the URL may carry a password.
    let url_file = data_dir.join(URL_FILE);
    record_url(&url_file, &url)
        .with_context(|| format!("cannot record the URL in {}", url_file.display()))?;
    let local: NodeId = "local".parse()?;
    let node = Node::start(
        client.clone(),
        NodeConfig {
            worker: WorkerConfig {
                slots: args.slots,
                executors: local_executors(&data_dir, args.plugin_dir.clone()),
                ..WorkerConfig::new(local.clone(), data_dir.join("worker"))
            },
            auth: ax_actors::AuthSettings {
                enabled: args.auth,
                ..ax_actors::AuthSettings::default()
            },
            ..NodeConfig::new(local.clone(), parse_roles("all")?, data_dir.join("worker"))
        },
        Arc::new(SystemClock),
    )?;
    let http = console(&client, &data_dir, &local, &args)?;
    eprintln!(
        "ax is up: NATS {} (recorded in {})",
        ax_bus::client::redact(&url),
        url_file.display()
    );
    let client = if args.auth {
        let file = data_dir.join(ADMIN_TOKEN_FILE);
        let token = admin_token(&client, &file).await?;
        eprintln!(
            "auth is on: the admin token is in {0} (AX_TOKEN_FILE={0} ax …; sign in to the console with it)",
            file.display()
        );
        client.acting_as(Some(token), ax_bus::auth::Via::Cli)
    } else {
        client
    };
    if !job_files.is_empty() {
        jobs::apply(&client, job_files, false).await?;
    }
    // Last on screen: where to go next.
    eprintln!("console: http://{}/", http.addr);
    eprintln!("metrics: http://{}/metrics", http.addr);
    eprintln!("log: {}", data_dir.join(LOG_FILE).display());
    eprintln!("Ctrl-C stops everything");
    shutdown::wait().await;
    node.hand_over().await;
    http.stop().await;
    node.stop();
    drop(server);
    let _ = std::fs::remove_file(&url_file);
    Ok(())
}

/// The NATS ax up uses: the one `--nats` names, or an embedded nats-server on 4222 (another
/// port when it is taken, or `--nats-port`), storing in the data dir; with the server to stop.
fn nats_of(
    nats_flag: Option<&str>,
    nats_port: Option<u16>,
    data_dir: &std::path::Path,
) -> Result<(String, Option<LocalServer>)> {
    let mut server = None;
    let url = match nats_flag {
        Some(url) => url.to_string(),
        None => {
            let binary = local_server::find_binary()?;
            let start = |port: Option<u16>| {
                LocalServer::start(ServerOptions {
                    binary: binary.clone(),
                    port,
                    store_dir: data_dir.join("nats"),
                    log_file: None,
                    extra_args: Vec::new(),
                })
            };
            let started = match nats_port {
                Some(port) => start(Some(port))?,
                // Any free port (picked again if another process takes it before the server
                // binds).
                None if local_server::port_in_use(DEFAULT_PORT) => {
                    let started = start(None)?;
                    eprintln!(
                        "port {DEFAULT_PORT} is taken; the embedded nats-server uses port {}",
                        started.port
                    );
                    started
                }
                None => start(Some(DEFAULT_PORT))?,
            };
            let url = started.url.clone();
            server = Some(started);
            url
        }
    };
    Ok((url, server))
}

/// The console, the API and `/metrics` on 127.0.0.1: on `--http-port`, else 8080, else any
/// free port.
fn console(
    client: &AxClient,
    data_dir: &std::path::Path,
    local: &NodeId,
    args: &UpArgs,
) -> Result<ax_console::server::Running> {
    let serve = |port: u16| {
        ax_console::server::start(
            &format!("127.0.0.1:{port}"),
            ax_console::server::Options {
                client: Some(client.clone()),
                data_dir: Some(data_dir.to_path_buf()),
                console: true,
                auth: args.auth,
                node: Some(local.clone()),
                hosts: Vec::new(),
                index_window: None,
                index_rows: None,
            },
        )
    };
    Ok(match args.http_port {
        Some(port) => serve(port).context("--http-port")?,
        // 8080 may be taken, or taken between a look and the bind: then any free port.
        None => match serve(DEFAULT_HTTP_PORT) {
            Ok(http) => http,
            Err(_) => serve(0).context("HTTP server")?,
        },
    })
}

/// Where `ax up --auth` keeps the first admin token, in its data dir.
const ADMIN_TOKEN_FILE: &str = "admin.token";

/// The first admin token: made now (and written to `file`, mode 0600), or the one an earlier
/// `ax up --auth` on this data dir wrote there.
async fn admin_token(
    client: &AxClient,
    file: &std::path::Path,
) -> Result<ax_bus::auth::token::Token> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Ok(text) = std::fs::read_to_string(file) {
        return ax_bus::auth::token::Token::parse(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()));
    }
    let name: ax_bus::ids::TokenName = "admin".parse()?;
    let (token, hash) = ax_bus::auth::token::Token::generate(&name);
    let bootstrap = ax_bus::messages::AuthRequest::Bootstrap { name, hash };
    if let Err(e) = client.send(&bootstrap, jobs::CONTROL_TIMEOUT).await {
        anyhow::bail!(
            "cannot make the first admin token: {e} (its file {} is gone; make one with an admin's token)",
            file.display()
        );
    }
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)
        .with_context(|| format!("cannot write {}", file.display()))?;
    writeln!(out, "{}", token.expose())
        .with_context(|| format!("cannot write {}", file.display()))?;
    Ok(token)
}

/// Writes `url` to `file`, mode 0600 (a file left by an earlier run is replaced, not reused with
/// its mode).
fn record_url(file: &Path, url: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)?;
    writeln!(out, "{url}")
}

/// The executors of `ax up`'s worker (and of `ax job run`): a SQLite database `demo` in
/// `data_dir` for the sql executor's demo jobs, the plugins of `plugin_dir`.
pub(crate) fn local_executors(data_dir: &Path, plugin_dir: Option<PathBuf>) -> ExecutorsConfig {
    ExecutorsConfig {
        databases: [(
            "demo".to_string(),
            format!("sqlite://{}?mode=rwc", data_dir.join("demo.db").display()),
        )]
        .into(),
        plugin_dir,
        python: "python3".into(),
    }
}

/// The log of `ax up` in its data directory (made afresh at each start), or none when it
/// cannot be made — the terminal still shows the warnings.
pub(crate) fn log_file(data_dir: &std::path::Path) -> Option<std::fs::File> {
    std::fs::create_dir_all(data_dir).ok()?;
    std::fs::File::create(data_dir.join(LOG_FILE)).ok()
}
