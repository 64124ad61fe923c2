//! The payloads of ax's subjects, one module per family of subjects:
//!
//! - [`control`] (`ax.control.<command>`): each command's request ([`commands`] names them and
//!   decodes them into one [`commands::Request`]), answered with a [`ControlReply`] on the
//!   subject named by the `Ax-Reply-To` header;
//! - [`registry`]: the job registry's values, [`JobRecord`];
//! - [`work`]: the hand-offs created → ready → dispatch, [`WorkItem`], and what the actors keep
//!   of work on its way;
//! - [`results`]: results (`ax.result.<job>`, [`ResultMessage`]), events
//!   (`ax.event.<job>.<state>`, the [`InstanceRecord`](crate::InstanceRecord) itself) and
//!   alerts ([`Alert`]);
//! - [`fleet`]: queues, workers, nodes.
//!
//! Every type is re-exported here: `ax_bus::messages::WorkItem` names it wherever it lives.

pub mod commands;
pub mod control;
pub mod fleet;
pub mod registry;
pub mod results;
pub mod typed;
pub mod work;

pub use crate::instance::ShardRef;
pub use control::*;
pub use fleet::*;
pub use registry::*;
pub use results::*;
pub use work::*;
