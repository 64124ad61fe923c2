//! Where the leaders of ax's written streams are, and spreading them over a cluster's servers
//! (`ax leaders [--spread]`).
//!
//! Why: every write to a stream goes through its leader, which orders it, sends it to the
//! other replicas and answers it, so the server leading the most of an instance's writes is
//! the first to saturate. JetStream places leaders by its own lights: in one bench run on three
//! servers it put four of an instance's seven writes on one (docs/benchmarks.md), where spread
//! evenly no server leads more than three. Each written stream is weighed by the writes an
//! instance makes to it (the message table of docs/benchmarks.md); the heaviest first, each
//! goes to the server among its replicas that leads the least weight so far (its current
//! leader when that is as good: no move that gains nothing), and a leader is moved by asking
//! it to step down in favour of that server. A step-down pauses the stream's writes for a
//! moment (writers retry), so this is an operator's command, not something a node does on its
//! own.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::client::{AxClient, ClientError};
use crate::error::{During, NatsError, Reason};

/// How long one stream may take to be led by the server asked for.
const MOVE_WITHIN: Duration = Duration::from_secs(10);

/// One written stream: its weight, leader and the servers that may lead it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Led {
    /// The stream (`KV_<bucket>` for a bucket).
    pub stream: String,
    /// The writes an instance makes to it.
    pub writes: f64,
    /// The server leading it (`None`: no leader now).
    pub leader: Option<String>,
    /// The servers holding a replica, its leader included.
    pub peers: Vec<String>,
}

/// A leader to move: `stream` to `to`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Move {
    /// The stream.
    pub stream: String,
    /// The server that leads it now.
    pub from: Option<String>,
    /// The server that is to lead it.
    pub to: String,
}

/// ax's written streams and the writes an instance makes to each.
fn weights(client: &AxClient) -> Vec<(String, f64)> {
    let layout = &client.layout;
    let buckets = client.instances.count();
    let per_bucket = 3.0 / f64::from(buckets.max(1));
    let mut all: Vec<(String, f64)> = (0..buckets)
        .map(|i| (format!("KV_{}", layout.instance_bucket(i)), per_bucket))
        .collect();
    all.extend([
        (layout.flow_stream(), 1.0),
        (layout.dispatch_stream(), 1.0),
        (layout.results_stream(), 1.0),
        (format!("KV_{}", layout.deps_bucket()), 1.0),
        (layout.expiry_stream(), 0.1),
    ]);
    all
}

/// Each written stream of `client`'s deployment, with its leader and peers.
pub async fn written_streams(client: &AxClient) -> Result<Vec<Led>, ClientError> {
    let mut all = Vec::new();
    for (stream, writes) in weights(client) {
        let cluster = client.stream_info(&stream).await?.cluster;
        let leader = cluster.as_ref().and_then(|c| c.leader.clone());
        let mut peers: Vec<String> = leader.iter().cloned().collect();
        peers.extend(
            cluster
                .iter()
                .flat_map(|c| c.replicas.iter().map(|r| r.name.clone())),
        );
        all.push(Led {
            stream,
            writes,
            leader,
            peers,
        });
    }
    Ok(all)
}

/// The writes an instance each server leads.
pub fn load(streams: &[Led]) -> BTreeMap<String, f64> {
    let mut load: BTreeMap<String, f64> = streams
        .iter()
        .flat_map(|s| s.peers.iter().map(|p| (p.clone(), 0.0)))
        .collect();
    for led in streams {
        if let Some(leader) = &led.leader {
            *load.entry(leader.clone()).or_default() += led.writes;
        }
    }
    load
}

/// The most writes an instance one server leads.
fn most(load: &BTreeMap<String, f64>) -> f64 {
    load.values().copied().fold(0.0, f64::max)
}

/// The moves that spread the leaders: the heaviest stream first, each to the peer leading the
/// least so far (its current leader when that is as good); none unless they lower the most
/// writes one server leads.
pub fn plan(streams: &[Led]) -> Vec<Move> {
    let servers: BTreeSet<&String> = streams.iter().flat_map(|s| &s.peers).collect();
    let mut load: BTreeMap<&String, f64> = servers.into_iter().map(|s| (s, 0.0)).collect();
    let mut order: Vec<&Led> = streams.iter().collect();
    order.sort_by(|a, b| b.writes.total_cmp(&a.writes).then(a.stream.cmp(&b.stream)));
    let mut moves = Vec::new();
    for led in order {
        let least = led
            .peers
            .iter()
            .map(|p| load.get(p).copied().unwrap_or_default())
            .fold(f64::INFINITY, f64::min);
        let stays = led
            .leader
            .as_ref()
            .filter(|l| load.get(l).is_some_and(|w| *w <= least));
        let to = match stays {
            Some(leader) => leader,
            None => match led
                .peers
                .iter()
                .find(|p| load.get(p).is_some_and(|w| *w <= least))
            {
                Some(peer) => peer,
                None => continue,
            },
        };
        if let Some(w) = load.get_mut(to) {
            *w += led.writes;
        }
        if led.leader.as_ref() != Some(to) {
            moves.push(Move {
                stream: led.stream.clone(),
                from: led.leader.clone(),
                to: to.clone(),
            });
        }
    }
    let planned = most(&load.into_iter().map(|(s, w)| (s.clone(), w)).collect());
    // Sums of fractions (3/n for n buckets) are not exact: a gain smaller than this is none.
    if planned + 1e-9 < most(&self::load(streams)) {
        moves
    } else {
        Vec::new()
    }
}

/// Spreads the leaders of `client`'s written streams; `progress` is told each move. Returns
/// the moves made.
pub async fn spread(
    client: &AxClient,
    mut progress: impl FnMut(&Move),
) -> Result<Vec<Move>, ClientError> {
    let moves = plan(&written_streams(client).await?);
    for step in &moves {
        lead(client, &step.stream, &step.to).await?;
        progress(step);
    }
    Ok(moves)
}

/// Makes `server` the leader of `stream`: asks its leader to step down in `server`'s favour
/// until it is, for up to 10 s.
pub async fn lead(client: &AxClient, stream: &str, server: &str) -> Result<(), ClientError> {
    let what = || format!("move the leader of {stream} to {server}");
    let deadline = tokio::time::Instant::now() + MOVE_WITHIN;
    loop {
        let info = client.stream_info(stream).await?;
        let leader = info.cluster.and_then(|c| c.leader);
        if leader.as_deref() == Some(server) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(NatsError::new(
                what(),
                Reason(format!(
                    "still led by {} after {MOVE_WITHIN:?}",
                    leader.as_deref().unwrap_or("nobody")
                )),
            )
            .into());
        }
        // Asked only of a stream with a leader (one electing a leader is waited for).
        if leader.is_some() {
            let request = serde_json::json!({ "placement": { "preferred": server } });
            let answer: serde_json::Value = client
                .js
                .request(format!("STREAM.LEADER.STEPDOWN.{stream}"), &request)
                .await
                .during(what)?;
            if let Some(error) = answer.get("error") {
                return Err(NatsError::new(what(), Reason(error.to_string())).into());
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn led(stream: &str, writes: f64, leader: &str) -> Led {
        Led {
            stream: stream.into(),
            writes,
            leader: Some(leader.into()),
            peers: vec!["c0".into(), "c1".into(), "c2".into()],
        }
    }

    fn after(streams: &[Led], moves: &[Move]) -> BTreeMap<String, f64> {
        let moved: Vec<Led> = streams
            .iter()
            .map(|s| match moves.iter().find(|m| m.stream == s.stream) {
                Some(m) => led(&s.stream, s.writes, &m.to),
                None => s.clone(),
            })
            .collect();
        load(&moved)
    }

    #[test]
    fn everything_on_one_server_spreads_to_three_two_two() {
        let streams = [
            led("KV_ax_instances", 3.0, "c0"),
            led("AX_FLOW", 1.0, "c0"),
            led("AX_DISPATCH", 1.0, "c0"),
            led("AX_RESULTS", 1.0, "c0"),
            led("KV_ax_deps", 1.0, "c0"),
        ];
        let moves = plan(&streams);
        let load = after(&streams, &moves);
        let mut weights: Vec<f64> = load.values().copied().collect();
        weights.sort_by(f64::total_cmp);
        assert_eq!(weights, [2.0, 2.0, 3.0]);
        assert_eq!(moves.len(), 4, "the instances bucket stays: {moves:?}");
    }

    #[test]
    fn a_spread_layout_is_left_alone() {
        let streams = [
            led("KV_ax_instances", 1.0, "c0"),
            led("KV_ax_instances_1", 1.0, "c1"),
            led("KV_ax_instances_2", 1.0, "c2"),
            led("AX_FLOW", 1.0, "c0"),
            led("AX_DISPATCH", 1.0, "c1"),
            led("AX_RESULTS", 1.0, "c2"),
            led("KV_ax_deps", 1.0, "c0"),
        ];
        assert_eq!(plan(&streams), []);
    }

    #[test]
    fn a_stream_goes_only_to_its_own_replicas() {
        let mut one = led("AX_FLOW", 1.0, "c0");
        one.peers = vec!["c0".into()];
        let streams = [led("KV_ax_instances", 3.0, "c0"), one];
        assert_eq!(
            plan(&streams),
            [],
            "a single replica cannot move, and the bucket's leader stays where it is"
        );
    }
}
