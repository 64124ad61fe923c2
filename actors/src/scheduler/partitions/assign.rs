//! Which partitions a Scheduler takes or hands over, decided from what it sees: the live
//! Schedulers and each partition's owner.
//!
//! Pure, so that the rules can be tested without NATS:
//! - every live Scheduler's fair share is `count / n`, the first `count % n` of them (by name)
//!   one more, so shares differ by at most one and every node computes the same ones;
//! - a Scheduler takes only partitions nobody owns (never written, handed over, or owned by a
//!   Scheduler that is no longer live), up to its share; it hands over only what it holds above
//!   its share. Nothing else moves, so a join or a departure moves about `count / n` partitions;
//! - among the candidates each Scheduler prefers its own order (a hash of its name and the
//!   partition — rendezvous hashing), so Schedulers taking at the same moment seldom reach for
//!   the same partition, and hands over the ones it prefers least.

use std::collections::{BTreeMap, BTreeSet};

use ax_bus::ids::NodeId;
use ax_bus::partition::PartitionId;

/// A partition's owner as last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    /// Nobody: handed over (the stored value says so).
    Nobody,
    /// A Scheduler.
    Node(NodeId),
}

/// What a Scheduler sees.
#[derive(Debug)]
pub(crate) struct View<'a> {
    /// The number of partitions.
    pub count: u16,
    /// Each partition's stored owner; a partition absent here was never owned.
    pub owners: &'a BTreeMap<PartitionId, Owner>,
    /// The live Schedulers (this one is counted live whatever the view says).
    pub members: &'a BTreeSet<NodeId>,
}

/// What to do this round.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Moves {
    /// Partitions to try to take, most preferred first.
    pub take: Vec<PartitionId>,
    /// Partitions to hand over.
    pub release: Vec<PartitionId>,
}

/// The fair share of `me` among `members` (plus `me`).
pub(crate) fn share(count: u16, members: &BTreeSet<NodeId>, me: &NodeId) -> usize {
    let mut all: BTreeSet<&NodeId> = members.iter().collect();
    all.insert(me);
    let n = all.len();
    let index = all.iter().position(|m| *m == me).unwrap_or(0);
    let count = usize::from(count);
    count / n + usize::from(index < count % n)
}

/// How much `node` wants partition `p` (rendezvous hashing: FNV-1a over both).
fn preference(node: &NodeId, p: PartitionId) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in node.as_str().as_bytes().iter().chain(&p.0.to_be_bytes()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The moves of `me`, which holds `held`.
pub(crate) fn moves(view: &View<'_>, me: &NodeId, held: &BTreeSet<PartitionId>) -> Moves {
    let share = share(view.count, view.members, me);
    let mut moves = Moves::default();
    if held.len() > share {
        let mut surplus: Vec<PartitionId> = held.iter().copied().collect();
        surplus.sort_by_key(|p| preference(me, *p));
        surplus.truncate(held.len() - share);
        moves.release = surplus;
        return moves;
    }
    let mut free: Vec<PartitionId> = (0..view.count)
        .map(PartitionId)
        .filter(|p| !held.contains(p))
        .filter(|p| match view.owners.get(p) {
            None | Some(Owner::Nobody) => true,
            // Left by this node's previous process, or by one that is gone.
            Some(Owner::Node(node)) => node == me || !view.members.contains(node),
        })
        .collect();
    free.sort_by_key(|p| std::cmp::Reverse(preference(me, *p)));
    free.truncate(share - held.len());
    moves.take = free;
    moves
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> NodeId {
        NodeId::parse(name).unwrap()
    }

    /// Runs rounds of every member against one shared table until nothing moves; takes succeed
    /// in turn order (as compare-and-swap would let one of two win).
    fn settle(
        count: u16,
        members: &BTreeSet<NodeId>,
        owners: &mut BTreeMap<PartitionId, Owner>,
    ) -> usize {
        let mut moved = 0;
        for _ in 0..10 {
            let mut changed = false;
            for me in members {
                let held: BTreeSet<PartitionId> = owners
                    .iter()
                    .filter(|(_, o)| **o == Owner::Node(me.clone()))
                    .map(|(p, _)| *p)
                    .collect();
                let view = View {
                    count,
                    owners,
                    members,
                };
                let m = moves(&view, me, &held);
                for p in &m.release {
                    owners.insert(*p, Owner::Nobody);
                    changed = true;
                }
                for p in &m.take {
                    owners.insert(*p, Owner::Node(me.clone()));
                    moved += 1;
                    changed = true;
                }
            }
            if !changed {
                return moved;
            }
        }
        panic!("did not settle: {owners:?}");
    }

    fn held_by(owners: &BTreeMap<PartitionId, Owner>, name: &str) -> usize {
        owners
            .values()
            .filter(|o| **o == Owner::Node(node(name)))
            .count()
    }

    #[test]
    fn shares_differ_by_at_most_one_and_add_up() {
        let members: BTreeSet<NodeId> = ["a", "b", "c"].into_iter().map(node).collect();
        let shares: Vec<usize> = members.iter().map(|m| share(128, &members, m)).collect();
        assert_eq!(shares, vec![43, 43, 42]);
        // A node not yet in its own view counts itself.
        assert_eq!(share(128, &BTreeSet::new(), &node("z")), 128);
    }

    #[test]
    fn a_join_and_a_departure_move_only_a_share() {
        let mut owners = BTreeMap::new();
        let mut members: BTreeSet<NodeId> = ["a", "b", "c"].into_iter().map(node).collect();
        assert_eq!(settle(128, &members, &mut owners), 128);
        assert_eq!(["a", "b", "c"].map(|m| held_by(&owners, m)), [43, 43, 42]);
        // d joins: it takes its 32, exactly what the others hand over.
        members.insert(node("d"));
        assert_eq!(settle(128, &members, &mut owners), 32);
        assert_eq!(
            ["a", "b", "c", "d"].map(|m| held_by(&owners, m)),
            [32, 32, 32, 32]
        );
        // b dies: its 32 go to the three others, nothing else moves.
        members.remove(&node("b"));
        assert_eq!(settle(128, &members, &mut owners), 32);
        assert_eq!(["a", "c", "d"].map(|m| held_by(&owners, m)), [43, 43, 42]);
    }

    #[test]
    fn a_restarted_node_takes_back_what_it_left_and_nothing_is_stolen() {
        let me = node("a");
        let mut owners = BTreeMap::new();
        owners.insert(PartitionId(0), Owner::Node(me.clone()));
        owners.insert(PartitionId(1), Owner::Node(node("b")));
        owners.insert(PartitionId(2), Owner::Node(node("gone")));
        let members: BTreeSet<NodeId> = [node("a"), node("b")].into_iter().collect();
        let view = View {
            count: 3,
            owners: &owners,
            members: &members,
        };
        let m = moves(&view, &me, &BTreeSet::new());
        let mut take = m.take.clone();
        take.sort();
        assert_eq!(take, vec![PartitionId(0), PartitionId(2)]);
        assert!(m.release.is_empty());
    }
}
