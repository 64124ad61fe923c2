//! ax-bus: everything that crosses the wire between ax actors, the CLI and business services.
//!
//! - [`subjects`]: the subject names, public (`ax.control.>`, `ax.result.<job>`,
//!   `ax.event.<job>.<state>`) and internal (`ax.internal.>`).
//! - [`codec`]: MessagePack with named fields (and JSON on the control subjects).
//! - [`spec`]: the job spec v1, parsed from YAML with line numbers and validated.
//! - [`instance`]: instance records, the five states and their tags, the transition rules.
//! - [`messages`]: the payloads each actor publishes.
//! - [`provision`]: the JetStream streams, buckets and consumers ax needs.
//! - [`client`]: a connected handle with the operations the CLI and actors share.
//! - [`local_server`]: a `nats-server` child process for `ax up` and the tests.
//!
//! The crate holds no actor logic: it defines what is said, not who decides it.
#![warn(missing_docs)]
#![deny(unused_must_use)]

pub mod client;
pub mod codec;
pub mod dead_letter;
pub mod error;
pub mod ids;
pub mod instance;
pub mod messages;
pub mod msg_id;
pub mod spec;
pub mod subjects;
pub mod time;

pub use client::{AxClient, ClientError};
pub use instance::{InstanceRecord, State, Tag};
pub use spec::JobSpec;
pub use subjects::Subjects;
