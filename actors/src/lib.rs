//! ax-actors: the five actors and the node that runs them.
//!
//! The actors, each a supervised actix actor that owns its state, changes it only in its
//! message handlers and talks to the others through JetStream (a worker hands its outcomes to
//! its own node's Reporter through the Reporter's mailbox):
//! - [`Scheduler`]: job registry, time wheel, instance creation, retries, control commands;
//! - [`DagCoordinator`]: dependencies by business date;
//! - [`Router`]: live workers, load, dispatch, the janitor of dead workers;
//! - [`WorkerSupervisor`]: slots, claims, child processes, timeouts;
//! - [`Reporter`]: the durable outbox and results.
//!
//! [`Node`] starts the actors of the roles a node runs, each on a thread of its own, under a
//! supervisor and the watchdog; [`jetstream`] is the plumbing they share (durable consumers,
//! publishes with message ids and acks in windows); [`metrics`] is what they count for
//! Prometheus. Everything else — the time wheel, the
//! fleet, the DAG view, the outbox — is the actors' own and not part of this crate's surface.
#![warn(missing_docs)]
#![deny(unused_must_use)]

#[cfg(feature = "bench")]
pub mod bench;
mod dag;
#[cfg(feature = "fuzz")]
pub mod fuzz;
pub mod jetstream;
pub mod metrics;
mod node;
mod outcome;
mod reporter;
mod router;
mod runtime;
mod scheduler;
#[cfg(test)]
mod test_fixtures;
pub mod test_hooks;
mod worker;

pub use dag::DagCoordinator;
pub use node::webhook::{WebhookConfig, DEFAULT_WEBHOOK_TIMEOUT};
pub use node::{parse_roles, Node, NodeConfig, Role, RoleError};
pub use reporter::Reporter;
pub use router::backlog::BacklogConfig;
pub use router::{Router, RouterConfig, WRITES_READ_WITHIN};
pub use runtime::clock::{Clock, ManualClock, SystemClock};
pub use runtime::clock_guard::DEFAULT_MAX_CLOCK_SKEW;
pub use runtime::watchdog::DEFAULT_STALL_AFTER;
pub use scheduler::control::AuthSettings;
pub use scheduler::delayed::DEFAULT_MAX_DELAY;
pub use scheduler::fire_schedule::FireSchedule;
pub use scheduler::new_instance::NewInstance;
pub use scheduler::partitions::Partitions;
pub use scheduler::Scheduler;
pub use worker::cgroup::{CgroupSetting, Cgroups, Confinement, Offer};
pub use worker::executor::{ExecResult, ExecutorError, ExecutorsConfig};
pub use worker::local_run::{run_locally, LocalRun, LocalRunEnd};
pub use worker::{
    Adaptive, WorkerConfig, WorkerSupervisor, DEFAULT_DISPATCH_ACK_WAIT, DEFAULT_LOG_MAX_BYTES,
};

use ax_bus::client::kv_view::FeedError;
use ax_bus::client::ClientError;
use ax_bus::codec::CodecError;
use ax_bus::error::NatsError;

/// Why an actor's pump or operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ActorError {
    /// A client operation failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A NATS or JetStream call failed.
    #[error(transparent)]
    Nats(#[from] NatsError),
    /// A bucket feed failed.
    #[error(transparent)]
    Feed(#[from] FeedError),
    /// A value did not encode or decode.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// A value is not a valid identity.
    #[error(transparent)]
    Id(#[from] ax_bus::ids::IdError),
    /// Local storage failed.
    #[error("local storage: {0}")]
    Io(#[from] std::io::Error),
    /// An actor's mailbox is closed (it stopped for good).
    #[error("actor mailbox: {0}")]
    Mailbox(#[from] actix::MailboxError),
    /// A component this one relies on has stopped.
    #[error("{0} has stopped")]
    Stopped(&'static str),
    /// Another node holds the lease now.
    #[error("lease `{0}` lost")]
    LeaseLost(String),
    /// An executor could not be set up.
    #[error(transparent)]
    Executor(#[from] crate::worker::executor::ExecutorError),
}
