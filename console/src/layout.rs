//! A layered layout of a job graph for the DAG page: each job in the column of its longest
//! path from a source, rows ordered by the mean row of their upstreams (a few sweeps of the
//! barycenter heuristic) so that edges cross little. Drawn on the server as SVG: no script, no
//! layout library, the same picture in every browser.

use std::collections::{BTreeMap, BTreeSet};

/// Width of a column, height of a row, and a node's box, in SVG units.
pub const COLUMN: f64 = 240.0;
/// The height of a row.
pub const ROW: f64 = 64.0;
/// A node's width.
pub const NODE_WIDTH: f64 = 190.0;
/// A node's height.
pub const NODE_HEIGHT: f64 = 44.0;
/// The margin around the drawing.
pub const MARGIN: f64 = 12.0;

/// Where a node is drawn.
#[derive(Clone, Debug, PartialEq)]
pub struct Placed {
    /// The node.
    pub name: String,
    /// Its column (0 = a source).
    pub column: usize,
    /// Its row within the column.
    pub row: usize,
    /// Its box's top-left corner.
    pub x: f64,
    /// Its box's top-left corner.
    pub y: f64,
}

/// Where a placed node's box and its two lines of text (a name, a word under it) are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spot {
    /// The box's top-left corner.
    pub x: f64,
    /// The box's top-left corner.
    pub y: f64,
    /// Where both lines start.
    pub text_x: f64,
    /// The first line's baseline.
    pub text_y: f64,
    /// The second line's baseline.
    pub sub_y: f64,
}

impl Placed {
    /// Where its box and text go.
    pub fn spot(&self) -> Spot {
        Spot {
            x: self.x,
            y: self.y,
            text_x: self.x + 10.0,
            text_y: self.y + 19.0,
            sub_y: self.y + 35.0,
        }
    }
}

/// An edge from an upstream's right side to a downstream's left side, as an SVG path.
#[derive(Clone, Debug, PartialEq)]
pub struct Edge {
    /// The upstream.
    pub from: String,
    /// The downstream.
    pub to: String,
    /// The path's `d`.
    pub path: String,
}

/// A laid-out graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    /// Every node.
    pub nodes: Vec<Placed>,
    /// Every edge between two of them.
    pub edges: Vec<Edge>,
    /// The drawing's width.
    pub width: f64,
    /// The drawing's height.
    pub height: f64,
}

/// Lays out `nodes` with `edges` (upstream, downstream); edges naming other nodes are left
/// out, and a cycle (which apply refuses) cannot loop: a node's column is bounded by the node
/// count.
pub fn layered(nodes: &BTreeSet<String>, edges: &[(String, String)]) -> Layout {
    let edges: Vec<(String, String)> = edges
        .iter()
        .filter(|(a, b)| nodes.contains(a) && nodes.contains(b) && a != b)
        .cloned()
        .collect();
    let mut ups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in &edges {
        ups.entry(b.as_str()).or_default().push(a.as_str());
    }
    // Longest path from a source, by relaxation (at most n rounds).
    let mut column: BTreeMap<&str, usize> = nodes.iter().map(|n| (n.as_str(), 0)).collect();
    for _ in 0..nodes.len() {
        let mut changed = false;
        for (a, b) in &edges {
            let candidate = column[a.as_str()] + 1;
            if candidate > column[b.as_str()] && candidate < nodes.len() {
                column.insert(b.as_str(), candidate);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let columns = column.values().copied().max().map_or(0, |m| m + 1);
    let mut rows: Vec<Vec<&str>> = vec![Vec::new(); columns];
    for (name, c) in &column {
        rows[*c].push(name);
    }
    // Barycenter sweeps: each column ordered by the mean row of its upstreams.
    for _ in 0..4 {
        for c in 1..columns {
            let position: BTreeMap<&str, usize> = rows[c - 1]
                .iter()
                .enumerate()
                .map(|(i, n)| (*n, i))
                .collect();
            let mut keyed: Vec<(f64, &str)> = rows[c]
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    let placed: Vec<usize> = ups
                        .get(n)
                        .map(|u| u.iter().filter_map(|u| position.get(u).copied()).collect())
                        .unwrap_or_default();
                    let key = if placed.is_empty() {
                        i as f64
                    } else {
                        placed.iter().sum::<usize>() as f64 / placed.len() as f64
                    };
                    (key, *n)
                })
                .collect();
            keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1)));
            rows[c] = keyed.into_iter().map(|(_, n)| n).collect();
        }
    }
    let mut placed = Vec::new();
    for (c, names) in rows.iter().enumerate() {
        for (r, name) in names.iter().enumerate() {
            placed.push(Placed {
                name: name.to_string(),
                column: c,
                row: r,
                x: MARGIN + c as f64 * COLUMN,
                y: MARGIN + r as f64 * ROW,
            });
        }
    }
    let at: BTreeMap<&str, &Placed> = placed.iter().map(|p| (p.name.as_str(), p)).collect();
    let drawn = edges
        .iter()
        .map(|(a, b)| {
            let (from, to) = (at[a.as_str()], at[b.as_str()]);
            let (x1, y1) = (from.x + NODE_WIDTH, from.y + NODE_HEIGHT / 2.0);
            let (x2, y2) = (to.x, to.y + NODE_HEIGHT / 2.0);
            let bend = (x2 - x1) / 2.0;
            Edge {
                from: a.clone(),
                to: b.clone(),
                path: format!(
                    "M{x1:.0},{y1:.0} C{:.0},{y1:.0} {:.0},{y2:.0} {x2:.0},{y2:.0}",
                    x1 + bend,
                    x2 - bend
                ),
            }
        })
        .collect();
    let tallest = rows.iter().map(Vec::len).max().unwrap_or(0);
    Layout {
        nodes: placed,
        edges: drawn,
        width: 2.0 * MARGIN + columns.saturating_sub(1) as f64 * COLUMN + NODE_WIDTH,
        height: 2.0 * MARGIN + tallest.saturating_sub(1) as f64 * ROW + NODE_HEIGHT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn edge(a: &str, b: &str) -> (String, String) {
        (a.into(), b.into())
    }

    #[test]
    fn columns_follow_the_longest_path_and_rows_follow_the_upstreams() {
        // a → b → d, a → d, c → e: d is two steps from a, however short the direct edge.
        let layout = layered(
            &set(&["a", "b", "c", "d", "e"]),
            &[
                edge("a", "b"),
                edge("b", "d"),
                edge("a", "d"),
                edge("c", "e"),
                edge("x", "a"),
            ],
        );
        let column = |n: &str| layout.nodes.iter().find(|p| p.name == n).unwrap().column;
        assert_eq!(
            ["a", "b", "c", "d", "e"].map(column),
            [0, 1, 0, 2, 1],
            "{layout:?}"
        );
        // The edge to a node outside the set is left out.
        assert_eq!(layout.edges.len(), 4);
        // e sits level with its upstream c (row 1), b with a (row 0).
        let row = |n: &str| layout.nodes.iter().find(|p| p.name == n).unwrap().row;
        assert_eq!((row("b"), row("e")), (0, 1));
        assert!(layout.width > 2.0 * COLUMN && layout.height > ROW);
    }

    #[test]
    fn a_cycle_ends_and_an_empty_graph_is_empty() {
        let layout = layered(&set(&["a", "b"]), &[edge("a", "b"), edge("b", "a")]);
        assert_eq!(layout.nodes.len(), 2);
        let empty = layered(&BTreeSet::new(), &[]);
        assert!(empty.nodes.is_empty() && empty.edges.is_empty());
    }
}
