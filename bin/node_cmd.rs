//! `ax node`: the actors of some roles, against an existing NATS server.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};

use ax_actors::ExecutorsConfig;
use ax_actors::WorkerConfig;
use ax_actors::{parse_roles, Node, NodeConfig, Role};
use ax_bus::client::{redact, AxClient, ConnectConfig};
use ax_bus::ids::NodeId;

use crate::args::{parse_id, NodeArgs};
use crate::{connect, node_config, shutdown};

/// Where a node with the admin role serves the console when not told (loopback only).
const DEFAULT_CONSOLE: &str = "127.0.0.1:8080";

fn default_id() -> String {
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "node".into());
    let cleaned: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    if cleaned.is_empty() {
        "node".into()
    } else {
        cleaned
    }
}

/// The worker's settings from the flags and the config file, checked before anything connects;
/// an error names the setting.
fn worker_config(
    args: &NodeArgs,
    file: &node_config::FileConfig,
    id: &NodeId,
    data_dir: PathBuf,
) -> Result<WorkerConfig> {
    let cores = std::thread::available_parallelism()
        .map(|n| u32::try_from(n.get()).unwrap_or(u32::MAX))
        .unwrap_or(1);
    let adaptive = match &file.worker.adaptive {
        Some(section) => Some(section.adaptive(cores)?),
        None => None,
    };
    let worker = WorkerConfig {
        id: id.clone(),
        slots: args.slots.map_or_else(|| file.worker.slots(), Ok)?,
        adaptive,
        tags: args
            .tags
            .clone()
            .or(file.worker.tags.clone())
            .unwrap_or_default(),
        reserved: file.worker.reserved.unwrap_or_default(),
        data_dir,
        dispatch_ack_wait: file.worker.dispatch_ack_wait()?,
        log_max_bytes: file.worker.log_max_bytes()?,
        cgroups: file.worker.cgroups()?,
        offer: file.worker.offer(),
        default_limits: node_config::worker_limits(file.worker.limits)?,
        executors: ExecutorsConfig {
            databases: file.databases.clone(),
            plugin_dir: file.worker.plugin_dir.clone(),
            python: file
                .worker
                .python
                .clone()
                .unwrap_or_else(|| "python3".to_string()),
        },
    };
    // The fewest slots it may have: low work must keep one of them.
    let (fewest, of) = match &worker.adaptive {
        Some(adaptive) => (adaptive.min, "the budget's minimum"),
        None => (worker.slots, "the slots"),
    };
    if fewest <= worker.reserved.high + worker.reserved.normal {
        bail!(
            "[worker] reserved = {{ high = {}, normal = {} }} leaves no slot of {fewest} ({of}) for low-priority work",
            worker.reserved.high,
            worker.reserved.normal,
        );
    }
    Ok(worker)
}

/// How the node connects: the URL (`--nats`, the config's, `AX_NATS_URL`, or the default) and
/// where it came from, the subject prefix, replicas, instance buckets, retention and the NATS
/// credentials.
fn connect_config(
    args: &NodeArgs,
    file: &node_config::FileConfig,
    id: &NodeId,
    nats_flag: Option<&str>,
    prefix_flag: &str,
) -> Result<(ConnectConfig, String, String)> {
    let url_flag = nats_flag.map(str::to_string).or(file.node.nats.clone());
    let (url, origin) = connect::resolve_url(url_flag.as_deref());
    let mut config = ConnectConfig::new(&url, format!("ax-node-{id}"));
    config.prefix = file
        .node
        .prefix
        .clone()
        .unwrap_or_else(|| prefix_flag.to_string());
    config.replicas = args
        .replicas
        .map_or_else(|| file.node.replicas(), |n| Ok(Some(n)))?;
    config.instance_buckets = file.node.instance_buckets(args.instance_buckets)?;
    config.retention = file.retention.retention()?;
    config.auth = file.nats.over(config.auth);
    Ok((config, url, origin))
}

/// The node's HTTP server, where one is asked for (`--http`, `[metrics] listen`) or the node
/// serves the console (role admin: 127.0.0.1:8080 unless told where).
fn serve(
    args: &NodeArgs,
    file: &node_config::FileConfig,
    console: bool,
    id: &NodeId,
    client: AxClient,
    data_dir: PathBuf,
    auth: bool,
) -> Result<Option<ax_console::server::Running>> {
    let listen = args
        .http
        .clone()
        .or(file.metrics.listen.clone())
        .or_else(|| console.then(|| DEFAULT_CONSOLE.to_string()));
    Ok(match listen {
        Some(listen) => Some(
            ax_console::server::start(
                &listen,
                ax_console::server::Options {
                    client: Some(client),
                    data_dir: Some(data_dir),
                    console,
                    auth,
                    node: Some(id.clone()),
                    hosts: file.metrics.hosts.clone(),
                    index_window: file.console.index_window()?,
                    index_rows: file.console.index_rows()?,
                },
            )
            .with_context(|| "--http (or [metrics] listen)")?,
        ),
        None => None,
    })
}

pub(crate) async fn run(args: NodeArgs, nats_flag: Option<&str>, prefix_flag: &str) -> Result<()> {
    let file = match &args.config {
        Some(path) => node_config::read(path)?,
        None => node_config::FileConfig::default(),
    };
    let roles_text = match (&args.roles, &file.node.roles) {
        (Some(flag), _) => flag.clone(),
        (None, Some(list)) => list.join(","),
        (None, None) => bail!("--roles is required (or `roles` in the [node] section of --config)"),
    };
    let roles = parse_roles(&roles_text).map_err(|e| anyhow!("--roles: {e}"))?;
    let id_text = args
        .id
        .clone()
        .or(file.node.id.clone())
        .unwrap_or_else(default_id);
    let id: NodeId = parse_id("--id", &id_text)?;
    let (config, url, origin) = connect_config(&args, &file, &id, nats_flag, prefix_flag)?;
    let data_dir = args
        .data_dir
        .clone()
        .or(file.node.data_dir.clone())
        .unwrap_or_else(|| PathBuf::from(".ax").join(id.as_str()));
    let node_dir = data_dir.clone();
    let worker = worker_config(&args, &file, &id, data_dir)?;
    let client = AxClient::connect_node(&config)
        .await
        .with_context(|| format!("NATS URL {} ({origin})", redact(&url)))?;
    let auth = file.auth.settings(args.auth)?;
    let node_client = client.clone();
    let node = Node::start(
        client,
        NodeConfig {
            name: id.clone(),
            roles: roles.clone(),
            worker,
            scheduler_loaded: None,
            dag_leading: None,
            max_clock_skew: file.node.max_clock_skew()?,
            alert_webhook: file.alerts.webhook()?,
            lineage_endpoint: node_config::lineage_endpoint(&file.openlineage)?,
            lineage_namespace: node_config::lineage_namespace(&file.openlineage)?,
            stall_after: file.node.stall_after()?,
            router: ax_actors::RouterConfig {
                backlog: file.backlog.config()?,
                ..file.router.config()?
            },
            max_delay: file.scheduler.max_delay()?,
            partitions: file.scheduler.partitions()?,
            summary_timezone: file.status.timezone()?,
            auth,
        },
        ax_actors::test_hooks::node_clock(),
    )?;
    let console = roles.contains(&Role::Admin);
    let http = serve(
        &args,
        &file,
        console,
        &id,
        node_client,
        node_dir,
        auth.enabled,
    )?;
    let names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
    eprintln!(
        "ax node {id} running {} on {}",
        names.join(","),
        redact(&url)
    );
    if let Some(http) = &http {
        if console {
            eprintln!("console: http://{}/", http.addr);
        }
        eprintln!("metrics: http://{}/metrics", http.addr);
    }
    shutdown::wait().await;
    node.hand_over().await;
    if let Some(http) = &http {
        http.stop().await;
    }
    node.stop();
    Ok(())
}
