//! ax-console: ax's HTTP side. Every node serves `/metrics` (the Prometheus text of
//! [`ax_actors::metrics`]); the web console and its JSON API come on the same server.
//!
//! - [`server`]: the HTTP server a node starts ([`server::start`]);
//! - [`access`]: the one access check every request passes, whatever its route — the roles
//!   each route needs, and who asks;
//! - `api`: the JSON API under `/api/v1/` (the summary, an instance, its history).
//!
//! The server binds where it is told (loopback by default in the CLI); nothing is fetched from
//! elsewhere and no request changes anything yet.
#![warn(missing_docs)]
#![deny(unused_must_use)]

pub mod access;
mod api;
pub mod server;
