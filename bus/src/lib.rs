//! ax-bus: everything that crosses the wire between ax actors, the CLI and business services.
//!
//! The wire types, pure data:
//! - [`ids`]: job names, instance, trace, dispatch and node ids, each checked where it enters;
//! - [`spec`]: the job spec v1, parsed from YAML with line numbers and validated;
//! - [`instance`]: instance records, the five states and their tags, the transition rules;
//! - [`messages`]: the payloads each actor publishes; [`dead_letter`]: the dead letters' kinds
//!   and headers;
//! - [`subjects`]: the subject names, public (`ax.control.>`, `ax.result.<job>`,
//!   `ax.event.<job>.<state>`) and internal (`ax.internal.>`); [`msg_id`]: the message ids;
//! - [`partition`]: which Scheduler fires which cron jobs; [`routing`]: how the Routers score
//!   workers and judge them alive;
//! - [`history`]: an instance's history, told from the revisions of its record; [`log`]: the
//!   attempts' logs, shipped while they run;
//! - [`codec`]: MessagePack with named fields (and JSON on the control subjects); [`time`];
//!   [`duration`], the one reader of durations people write.
//!
//! Who may do what, in [`auth`]: roles, API tokens, approvals and the audit record.
//!
//! The client's I/O, under [`client`]: the connected [`AxClient`] with the operations the CLI
//! and the actors share, claims, KV views, the deps bucket, dead letters, provisioning
//! ([`client::provision`]) and a local `nats-server` child ([`client::local_server`]);
//! [`error`]: NATS errors with their source.
//!
//! The crate holds no actor logic: it defines what is said, not who decides it.
#![warn(missing_docs)]
#![deny(unused_must_use)]

pub mod auth;
pub mod client;
pub mod codec;
pub mod dead_letter;
pub mod duration;
pub mod error;
pub mod figures;
pub mod history;
pub mod ids;
pub mod instance;
pub mod log;
pub mod messages;
pub mod msg_id;
pub mod openlineage;
pub mod partition;
pub mod reply_to;
pub mod room;
pub mod routing;
pub mod spec;
pub mod subjects;
pub mod time;

pub use client::{AxClient, ClientError};
pub use instance::{InstanceRecord, State, Tag, Usage};
pub use spec::JobSpec;
pub use subjects::Subjects;
