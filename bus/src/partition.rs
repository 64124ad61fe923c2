//! Partitions of the cron jobs: how Schedulers share the jobs instead of all racing for every
//! fire.
//!
//! A job belongs to partition `fnv1a32(name) mod count` — a hash any client in any language can
//! compute, and one that never changes for a name. The number of partitions is fixed when the
//! first Scheduler of a deployment starts (stored under [`COUNT_KEY`] in the partitions bucket);
//! each partition is owned by one live Scheduler at a time, recorded under [`key`] as a
//! [`PartitionOwner`]. A Scheduler is live while its member key ([`member_key`], in the leases
//! bucket, whose age limit drops it a few seconds after its node stops renewing it) exists.
//!
//! Ownership decides who fires; it never decides *whether* a fire happens once: that is the
//! create-if-absent of the instance record, which holds while two Schedulers briefly overlap.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::NodeId;

/// Partitions of a deployment unless its first Scheduler is told otherwise: enough to spread
/// over dozens of Schedulers (the most useful is one per partition).
pub const DEFAULT_COUNT: u16 = 128;

/// The key, in the partitions bucket, of the number of partitions.
pub const COUNT_KEY: &str = "count";

/// A partition's number, from 0 to the count − 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PartitionId(pub u16);

impl std::fmt::Display for PartitionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The partition of job `name` among `count` (a count of 0 is taken as 1).
pub fn of(name: &str, count: u16) -> PartitionId {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in name.as_bytes() {
        hash ^= u32::from(*byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    PartitionId((hash % u32::from(count.max(1))) as u16)
}

/// The key, in the partitions bucket, of partition `p`'s owner.
pub fn key(p: PartitionId) -> String {
    format!("p.{}", p.0)
}

/// The partition a key of the partitions bucket names (`None` for other keys).
pub fn from_key(key: &str) -> Option<PartitionId> {
    key.strip_prefix("p.")?.parse().ok().map(PartitionId)
}

/// The key, in the leases bucket, that says Scheduler `node` is alive.
pub fn member_key(node: &NodeId) -> String {
    format!("{MEMBER_PREFIX}{node}")
}

/// The Scheduler a member key names (`None` for other keys).
pub fn member_of(key: &str) -> Option<NodeId> {
    NodeId::parse(key.strip_prefix(MEMBER_PREFIX)?).ok()
}

/// What every member key starts with.
pub const MEMBER_PREFIX: &str = "schedulers.";

/// The key, in the partitions bucket, of how far Scheduler `node` has settled its fires
/// ([`FiredThrough`]): it outlives the node's member key, so whoever takes its partitions after
/// it died knows where its fires ended.
pub fn fired_key(node: &NodeId) -> String {
    format!("{FIRED_PREFIX}{node}")
}

/// What every [`fired_key`] starts with.
pub const FIRED_PREFIX: &str = "fired.";

/// How far a Scheduler's fires are settled, written by it every half second under
/// [`fired_key`]: every cron tick up to `through` of every job of `partitions` is created (or
/// recorded in the tick ledger as skipped). The tick ledger records no `fired` tick (the
/// instance record says it), so this is what the next owner of a partition whose Scheduler died
/// counts the missed ticks from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FiredThrough {
    /// Every tick up to this instant is settled.
    #[serde(with = "crate::time::wire")]
    pub through: DateTime<Utc>,
    /// The partitions it holds for (those whose jobs are loaded and whose missed ticks are
    /// looked at).
    pub partitions: Vec<PartitionId>,
}

/// Who owns a partition, as stored under [`key`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionOwner {
    /// The owning Scheduler; `None` once its owner handed it over (a graceful stop or a
    /// rebalance), until another takes it.
    pub node: Option<NodeId>,
    /// Set by a handover: every tick up to this instant was fired by the one who handed it
    /// over; the next owner fires the ticks after it.
    #[serde(default, with = "crate::time::wire_opt")]
    pub fired_through: Option<DateTime<Utc>>,
    /// Every tick up to this instant was settled by an earlier owner (what the owner before
    /// said it had fired through, when this one took it): where missed ticks are counted from
    /// should this owner die before saying more ([`FiredThrough`]).
    #[serde(default, with = "crate::time::wire_opt")]
    pub covered_through: Option<DateTime<Utc>>,
    /// When this owner took it (or handed it over).
    #[serde(with = "crate::time::wire")]
    pub since: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_fnv1a_and_stable() {
        // FNV-1a 32 of "" is the offset basis, of "a" 0xe40c292c (published test vectors).
        assert_eq!(
            of("", u16::MAX),
            PartitionId((0x811c_9dc5u32 % 65535) as u16)
        );
        assert_eq!(
            of("a", u16::MAX),
            PartitionId((0xe40c_292cu32 % 65535) as u16)
        );
        assert_eq!(of("nightly-etl", 128), of("nightly-etl", 128));
        assert_eq!(of("anything", 1), PartitionId(0));
        assert_eq!(of("anything", 0), PartitionId(0));
    }

    #[test]
    fn names_spread_over_the_partitions() {
        let mut counts = [0u32; 128];
        for i in 0..12_800 {
            counts[usize::from(of(&format!("job-{i}"), 128).0)] += 1;
        }
        let (min, max) = (counts.iter().min(), counts.iter().max());
        assert!(min >= Some(&60) && max <= Some(&140), "{min:?}..{max:?}");
    }

    #[test]
    fn keys_round_trip() {
        assert_eq!(from_key(&key(PartitionId(17))), Some(PartitionId(17)));
        assert_eq!(from_key(COUNT_KEY), None);
        assert_eq!(from_key("p.x"), None);
        let node = NodeId::parse("core-1").unwrap();
        assert_eq!(member_key(&node), "schedulers.core-1");
        assert_eq!(member_of(&member_key(&node)), Some(node.clone()));
        assert_eq!(member_of("schedulers.bad.name"), None);
        assert_eq!(fired_key(&node), "fired.core-1");
        assert_eq!(from_key(&fired_key(&node)), None);
    }
}
