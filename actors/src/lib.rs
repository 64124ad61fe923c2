//! ax-actors: the five actors and the mechanisms they are built from.
//!
//! The actors, each a supervised actix actor that talks to the others only through JetStream:
//! - [`scheduler::Scheduler`]: job registry, time wheel, instance creation, retries;
//! - [`dag::DagCoordinator`]: dependencies by business date;
//! - [`router::Router`]: live workers, load, dispatch;
//! - [`worker::WorkerSupervisor`]: slots, claims, child processes, timeouts;
//! - [`reporter::Reporter`]: the durable outbox and results.
//!
//! The mechanisms: [`time_wheel`], [`fire_schedule`] (cron + time zone + DST rule),
//! [`planner`] (the Scheduler's pure view), [`creator`], [`control`], [`process`], [`shell`],
//! [`outbox`], [`consume`], [`publish`], [`supervision`] and [`watchdog`] (panics, ended pumps
//! and stalls), [`clock`]; [`node`] starts the actors of the roles a node runs, and
//! [`node_status`] is its heartbeat.
#![warn(missing_docs)]
#![deny(unused_must_use)]

#[cfg(feature = "bench")]
pub mod bench;
pub mod dag;
pub mod jetstream;
pub mod node;
pub mod outcome;
pub mod reporter;
pub mod router;
pub mod scheduler;
pub mod worker;

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
