//! The JetStream plumbing every actor uses: durable pull consumers ([`consume`]), publishes
//! with message ids, acks awaited in windows, events and alerts ([`publish`]), and the bursts a
//! hot path publishes together as one fast-ingest batch ([`burst`]).

pub mod burst;
pub mod consume;
pub(crate) mod gathered;
pub mod publish;
