//! ax-console: ax's HTTP side. Every node that serves HTTP answers `/metrics` (the Prometheus
//! text of [`ax_actors::metrics`]); a node with the `admin` role serves the web console and its
//! JSON API on the same server.
//!
//! - [`server`]: the HTTP server a node starts ([`server::start`]) and the headers every answer
//!   carries (CSP, no framing, no sniffing);
//! - [`access`]: the one access check every request passes, whatever its route — the roles
//!   each route needs, who asks (a bearer token, or a login's [`session`]), and [`csrf`] for
//!   every state change;
//! - [`actions`]: what the console and the API change, one call each, shared by both;
//! - [`index`]: the instances the lists page through, kept current from the bucket;
//! - [`job_view`]: a job as readers see it (next fire, redacted summary), for the CLI too;
//! - [`layout`]: the layered layout the DAG page draws;
//! - `pages`: the server-rendered pages; `api`: the JSON API under `/api/v1/`; `assets`: the
//!   vendored script and stylesheet;
//! - [`problem`]: what goes wrong, as kinds with their HTTP status.
//!
//! The server binds where it is told (loopback by default in the CLI); nothing is fetched from
//! elsewhere.
#![warn(missing_docs)]
#![deny(unused_must_use)]

pub mod access;
pub mod actions;
mod api;
mod assets;
pub mod attention;
pub(crate) mod changes;
pub mod csrf;
pub mod gantt;
pub mod index;
pub mod job_view;
pub mod layout;
mod pages;
pub mod problem;
mod scoped;
pub mod server;
pub mod session;
pub mod throttle;
