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

pub mod alert_webhook;
pub mod backfill;
pub mod clock;
pub mod clock_guard;
pub mod consume;
pub mod control;
pub mod creator;
pub mod dag;
pub mod dag_state;
pub mod day_store;
pub mod dead_letters;
pub mod executor;
pub mod fire_schedule;
pub mod lease;
pub mod misfire;
pub mod node;
pub mod node_status;
pub mod orphans;
pub mod outbox;
pub mod overlap;
pub mod planner;
pub mod process;
pub mod publish;
pub mod reporter;
pub mod rerun;
pub mod router;
pub mod scheduler;
pub mod supervision;
pub mod ticks;
pub mod time_wheel;
pub mod watchdog;
pub mod worker;

use ax_bus::client::ClientError;
use ax_bus::codec::CodecError;
use ax_bus::kv_view::FeedError;

/// Why an actor's pump or operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ActorError {
    /// A client operation failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A NATS or JetStream call failed.
    #[error("{0}")]
    Nats(String),
    /// A bucket feed failed.
    #[error(transparent)]
    Feed(#[from] FeedError),
    /// A value did not encode or decode.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// Local storage failed.
    #[error("local storage: {0}")]
    Io(#[from] std::io::Error),
    /// A component this one relies on has stopped.
    #[error("{0} has stopped")]
    Stopped(&'static str),
    /// Another node holds the lease now.
    #[error("lease `{0}` lost")]
    LeaseLost(String),
    /// An executor could not be set up.
    #[error(transparent)]
    Executor(#[from] crate::executor::ExecutorError),
}
