//! Identities.
//!
//! - `instance_id` = job name + expected fire time (`hello.20261129T183700123Z`): stable across
//!   retries and re-runs, the idempotency key business code de-duplicates on, and the key under
//!   which the instance record is created exactly once.
//! - `trace_id` = one attempt of one instance: 32 hex digits, carried by every dispatch, claim,
//!   report and log line of that attempt; random, except for a first attempt (derived from
//!   the instance id, see [`first_trace_id`]).

use chrono::{DateTime, NaiveDateTime, Utc};
use rand::Rng;

const INSTANCE_TIME_FORMAT: &str = "%Y%m%dT%H%M%S%3fZ";

/// The instance id of `job` expected at `expected`.
pub fn instance_id(job: &str, expected: DateTime<Utc>) -> String {
    format!("{job}.{}", expected.format(INSTANCE_TIME_FORMAT))
}

/// Splits an instance id into job name and expected time; `None` when it is not one.
pub fn parse_instance_id(id: &str) -> Option<(&str, DateTime<Utc>)> {
    let (job, stamp) = id.rsplit_once('.')?;
    let naive = NaiveDateTime::parse_from_str(stamp, INSTANCE_TIME_FORMAT).ok()?;
    if job.is_empty() {
        return None;
    }
    Some((job, naive.and_utc()))
}

/// The trace id of an instance's first attempt: derived from the instance id, so that every
/// Scheduler creating the same fire (they race for it) holds the same attempt — whichever
/// record is stored, any of them can hand it on, and the hand-off's message id (the trace)
/// makes the copies one. A creator that dies between the record and the hand-off leaves no
/// orphan while another one races with it.
pub fn first_trace_id(instance_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("ax/first-attempt/{instance_id}").as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh trace id (retries, re-runs, re-dispatches).
pub fn new_trace_id() -> String {
    let n: u128 = rand::rng().random();
    format!("{n:032x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn instance_ids_round_trip_and_sort_by_time() {
        let t = Utc.with_ymd_and_hms(2026, 11, 29, 18, 37, 0).unwrap()
            + chrono::Duration::milliseconds(123);
        let id = instance_id("order_stat-daily", t);
        assert_eq!(id, "order_stat-daily.20261129T183700123Z");
        assert_eq!(parse_instance_id(&id), Some(("order_stat-daily", t)));
        assert!(instance_id("a", t) < instance_id("a", t + chrono::Duration::milliseconds(1)));
        assert_eq!(parse_instance_id("nodot"), None);
        assert_eq!(parse_instance_id("a.notatime"), None);
    }

    #[test]
    fn trace_ids_are_unique_hex() {
        let a = new_trace_id();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, new_trace_id());
        let first = first_trace_id("hello.20261129T183700123Z");
        assert_eq!(first, first_trace_id("hello.20261129T183700123Z"));
        assert_ne!(first, first_trace_id("hello.20261129T183701123Z"));
        assert_eq!(first.len(), 32);
        assert!(first.chars().all(|c| c.is_ascii_hexdigit()));
    }
}
