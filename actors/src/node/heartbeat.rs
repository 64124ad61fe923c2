//! A node's heartbeat: every few seconds each node writes what it runs and what has befallen its
//! actors (panics, restarts, ended pumps, stalls) under its name in the nodes bucket, whose
//! entries expire when a node falls silent; a Router's node adds its routing policy, so that
//! the console and `ax worker list` score workers as the Routers do, and each node its machine's
//! CPU, memory and disk ([`machine`]). `ax nodes` reads it: the way an operator sees that
//! an actor keeps restarting without reading every node's log.

use std::collections::BTreeSet;
use std::time::Duration;

use ax_bus::error::NatsError;
use ax_bus::ids::NodeId;
use ax_bus::messages::{AlertKind, Machine, NodeStatus, SchedulerShare};
use ax_bus::routing::RoutingPolicy;
use ax_bus::{codec, AxClient};

use crate::jetstream::publish;
use crate::node::roles::Role;
use crate::runtime::{machine, supervision};
use crate::scheduler::partitions::Partitions;

/// How often a node writes its heartbeat.
pub(crate) const NODE_HEARTBEAT_EVERY: Duration = Duration::from_secs(5);

/// What `node` would write now (`router`: its Router's policy, when it runs one; `machine`:
/// its machine as just read).
pub(crate) fn status(
    node: &NodeId,
    roles: &BTreeSet<Role>,
    started_at: chrono::DateTime<chrono::Utc>,
    partitions: Option<&Partitions>,
    router: Option<&RoutingPolicy>,
    machine: Option<Machine>,
) -> NodeStatus {
    NodeStatus {
        node: node.clone(),
        host: crate::runtime::host::host(),
        pid: std::process::id(),
        roles: roles.iter().map(|r| r.as_str().to_string()).collect(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        started_at,
        seen_at: ax_bus::time::now(),
        actors: supervision::counters(),
        scheduler: partitions.map(|p| {
            let (partitions, jobs) = p.share();
            SchedulerShare { partitions, jobs }
        }),
        router: router.cloned(),
        machine,
    }
}

/// Writes the heartbeat for ever; a failed write is logged and tried at the next beat. A write
/// refused for want of storage raises a `storage` alert naming the cause, once, and another
/// once a write goes through again (the first is published while nothing can be stored:
/// live subscribers see it; the second is kept).
pub(crate) async fn beat(
    client: AxClient,
    node: NodeId,
    roles: BTreeSet<Role>,
    partitions: Option<Partitions>,
    router: Option<RoutingPolicy>,
    data_dir: std::path::PathBuf,
) {
    let started_at = ax_bus::time::now();
    let mut every = tokio::time::interval(NODE_HEARTBEAT_EVERY);
    let mut full_since: Option<chrono::DateTime<chrono::Utc>> = None;
    let mut sampler = machine::Sampler::default();
    loop {
        every.tick().await;
        let machine = sampler.sample(&data_dir);
        if let (Some(machine), Some(metrics)) = (machine, crate::metrics::recording()) {
            metrics.set_machine(&machine);
        }
        let now = status(
            &node,
            &roles,
            started_at,
            partitions.as_ref(),
            router.as_ref(),
            machine,
        );
        let value = match codec::encode(&now) {
            Ok(value) => value,
            Err(e) => {
                tracing::warn!(error = %e, "node heartbeat not encoded");
                continue;
            }
        };
        match client.nodes.put(&node, value).await {
            Ok(_) => {
                if let Some(since) = full_since.take() {
                    let message = format!(
                        "JetStream's storage has room again: node {node}'s writes were refused for want of storage from {since} to {}; what the nodes retried meanwhile went through, and ticks missed went by their misfire policy",
                        ax_bus::time::now()
                    );
                    publish::alert(&client, &node, AlertKind::Storage, message, None).await;
                }
            }
            Err(e) => {
                let e = NatsError::new("store the node heartbeat", e);
                if e.storage_full() && full_since.is_none() {
                    full_since = Some(ax_bus::time::now());
                    let message = format!(
                        "JetStream's storage is full: node {node}'s writes are refused ({e}); triggers are refused and workers hold their dispatches until there is room, then everything resumes"
                    );
                    publish::alert(&client, &node, AlertKind::Storage, message, None).await;
                }
                tracing::warn!(error = %e, "node heartbeat not stored");
            }
        }
    }
}
