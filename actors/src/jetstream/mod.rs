//! The JetStream plumbing every actor uses: durable pull consumers ([`consume`]) and publishes
//! with message ids, acks awaited in windows, events and alerts ([`publish`]).

pub mod consume;
pub mod publish;
