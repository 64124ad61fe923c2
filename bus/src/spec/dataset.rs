//! Datasets: what a job writes (`produces:`) and reads (`consumes:`), named by URIs such as
//! `warehouse://orders` or `s3://lake/events/clicks`, and the lineage they give — which jobs a
//! dataset comes from and which read it, as far as the registry's definitions say.
//!
//! Why in the spec: ax knows which job waits for which (`deps`), not which tables a re-run
//! rewrites or which reports read a table that failed to load. Declared beside the command,
//! the datasets are checked with the job and change with it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::ids::JobName;

use super::JobSpec;

/// The most datasets one job may list under `produces` or under `consumes`.
pub const MAX_DATASETS: usize = 64;
/// The longest dataset URI.
pub const MAX_URI_CHARS: usize = 512;

/// A dataset's URI, `scheme://name[/path]`. Decoded as written, checked by [`DatasetUri::check`]
/// with the rest of the job (so that every problem of a spec is told at once).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DatasetUri(String);

impl DatasetUri {
    /// A URI that passes [`DatasetUri::check`].
    pub fn parse(text: &str) -> Result<Self, String> {
        let uri = Self(text.to_string());
        uri.check()?;
        Ok(uri)
    }

    /// The URI as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Why it is not a dataset URI, if it is not: `scheme://name[/path]`, the scheme
    /// `[a-z][a-z0-9+.-]*`, the name and each path segment non-empty, of letters, digits and
    /// `._~-@%=+,:`, no longer than [`MAX_URI_CHARS`].
    pub fn check(&self) -> Result<(), String> {
        let text = &self.0;
        let form = "a dataset is `scheme://name[/path]`, e.g. warehouse://orders";
        if text.chars().count() > MAX_URI_CHARS {
            return Err(format!("longer than {MAX_URI_CHARS} characters"));
        }
        let Some((scheme, rest)) = text.split_once("://") else {
            return Err(format!("`{text}`: {form}"));
        };
        let scheme_ok = scheme
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase())
            && scheme.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '+' | '.' | '-')
            });
        if !scheme_ok {
            return Err(format!(
                "`{text}`: the scheme `{scheme}` must match [a-z][a-z0-9+.-]*"
            ));
        }
        let allowed = |c: char| {
            c.is_ascii_alphanumeric()
                || matches!(c, '.' | '_' | '~' | '-' | '@' | '%' | '=' | '+' | ',' | ':')
        };
        for segment in rest.split('/') {
            if segment.is_empty() {
                return Err(format!("`{text}`: an empty name or path segment ({form})"));
            }
            if let Some(bad) = segment.chars().find(|c| !allowed(*c)) {
                return Err(format!("`{text}`: `{bad}` is not allowed in a dataset URI"));
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for DatasetUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The datasets an attempt's structured output says it updated: its `datasets` field, a list
/// of URIs or of `{uri, biz_date}` (the instance's business date when absent). `None` when the
/// output names none (its job's `produces` stand then); entries that are not a valid URI and
/// date are left out.
pub fn named_in(output: &serde_json::Value, biz_date: &str) -> Option<Vec<(DatasetUri, String)>> {
    let listed = output.get("datasets")?.as_array()?;
    Some(
        listed
            .iter()
            .filter_map(|entry| {
                let (uri, date) = match entry {
                    serde_json::Value::String(uri) => (uri.as_str(), biz_date),
                    serde_json::Value::Object(fields) => (
                        fields.get("uri")?.as_str()?,
                        match fields.get("biz_date") {
                            Some(date) => date.as_str()?,
                            None => biz_date,
                        },
                    ),
                    _ => return None,
                };
                crate::time::parse_biz_date(date)?;
                Some((DatasetUri::parse(uri).ok()?, date.to_string()))
            })
            .collect(),
    )
}

/// A node of the lineage graph.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "kind", content = "name", rename_all = "snake_case")]
pub enum Node {
    /// A job.
    Job(JobName),
    /// A dataset.
    Dataset(DatasetUri),
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Node::Job(job) => write!(f, "job {job}"),
            Node::Dataset(uri) => write!(f, "{uri}"),
        }
    }
}

/// One edge found walking from the start: `from` feeds `to` (a job writes a dataset, or a
/// dataset is read by a job), `depth` edges away from the start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Edge {
    /// Where the data comes from.
    pub from: Node,
    /// Where it goes.
    pub to: Node,
    /// How many edges from the start (1: next to it).
    pub depth: usize,
}

/// Which way to walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Towards where the data comes from.
    Upstream,
    /// Towards what reads it.
    Downstream,
}

/// The registry's datasets: who writes and who reads each.
#[derive(Clone, Debug, Default)]
pub struct Lineage {
    produces: BTreeMap<JobName, BTreeSet<DatasetUri>>,
    consumes: BTreeMap<JobName, BTreeSet<DatasetUri>>,
    producers: BTreeMap<DatasetUri, BTreeSet<JobName>>,
    consumers: BTreeMap<DatasetUri, BTreeSet<JobName>>,
}

impl Lineage {
    /// The lineage the definitions declare.
    pub fn of<'a>(specs: impl IntoIterator<Item = &'a JobSpec>) -> Self {
        let mut lineage = Self::default();
        for spec in specs {
            let job = &spec.name;
            let sides = [
                (
                    &spec.produces,
                    &mut lineage.produces,
                    &mut lineage.producers,
                ),
                (
                    &spec.consumes,
                    &mut lineage.consumes,
                    &mut lineage.consumers,
                ),
            ];
            for (uris, by_job, by_uri) in sides {
                for uri in uris {
                    by_job.entry(job.clone()).or_default().insert(uri.clone());
                    by_uri.entry(uri.clone()).or_default().insert(job.clone());
                }
            }
        }
        lineage
    }

    /// Every dataset a definition names, in order.
    pub fn datasets(&self) -> impl Iterator<Item = &DatasetUri> {
        let named: BTreeSet<&DatasetUri> =
            self.producers.keys().chain(self.consumers.keys()).collect();
        named.into_iter()
    }

    /// Whether any definition names `uri`.
    pub fn knows(&self, uri: &DatasetUri) -> bool {
        self.producers.contains_key(uri) || self.consumers.contains_key(uri)
    }

    /// The jobs that write `uri`.
    pub fn producers(&self, uri: &DatasetUri) -> impl Iterator<Item = &JobName> {
        self.producers.get(uri).into_iter().flatten()
    }

    /// The jobs that read `uri`.
    pub fn consumers(&self, uri: &DatasetUri) -> impl Iterator<Item = &JobName> {
        self.consumers.get(uri).into_iter().flatten()
    }

    /// The edges one step from `node` in `direction`.
    fn next(&self, node: &Node, direction: Direction) -> Vec<(Node, Node)> {
        let empty = BTreeSet::new();
        match (node, direction) {
            (Node::Job(job), Direction::Downstream) => self
                .produces
                .get(job)
                .unwrap_or(&empty)
                .iter()
                .map(|uri| (node.clone(), Node::Dataset(uri.clone())))
                .collect(),
            (Node::Job(job), Direction::Upstream) => self
                .consumes
                .get(job)
                .unwrap_or(&empty)
                .iter()
                .map(|uri| (Node::Dataset(uri.clone()), node.clone()))
                .collect(),
            (Node::Dataset(uri), Direction::Downstream) => self
                .consumers(uri)
                .map(|job| (node.clone(), Node::Job(job.clone())))
                .collect(),
            (Node::Dataset(uri), Direction::Upstream) => self
                .producers(uri)
                .map(|job| (Node::Job(job.clone()), node.clone()))
                .collect(),
        }
    }

    /// Every edge reachable from `start` in `direction`, nearest first, at most `depth` edges
    /// away (`None`: as far as it goes); each node is followed once, so a cycle ends.
    pub fn walk(&self, start: &Node, direction: Direction, depth: Option<usize>) -> Vec<Edge> {
        let mut edges = Vec::new();
        let mut seen = BTreeSet::from([start.clone()]);
        let mut queue = VecDeque::from([(start.clone(), 0)]);
        while let Some((node, at)) = queue.pop_front() {
            if depth.is_some_and(|max| at >= max) {
                continue;
            }
            for (from, to) in self.next(&node, direction) {
                let further = match direction {
                    Direction::Downstream => to.clone(),
                    Direction::Upstream => from.clone(),
                };
                edges.push(Edge {
                    from,
                    to,
                    depth: at + 1,
                });
                if seen.insert(further.clone()) {
                    queue.push_back((further, at + 1));
                }
            }
        }
        edges
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dataset_uri_is_a_scheme_a_name_and_a_path() {
        for good in [
            "warehouse://orders",
            "s3://lake/events/clicks",
            "pg+prod://sales.orders",
            "file://reports/daily_2026-12-01.csv",
        ] {
            assert!(DatasetUri::parse(good).is_ok(), "{good}");
        }
        for (bad, says) in [
            ("orders", "scheme://name"),
            ("Warehouse://orders", "the scheme"),
            ("warehouse://", "empty name"),
            ("warehouse://orders/", "empty name"),
            ("warehouse://or ders", "` ` is not allowed"),
            ("1db://x", "the scheme"),
        ] {
            let error = DatasetUri::parse(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
        let long = format!("w://{}", "a".repeat(MAX_URI_CHARS));
        assert!(DatasetUri::parse(&long)
            .unwrap_err()
            .contains("longer than"));
    }

    #[test]
    fn an_output_may_name_what_it_updated_and_for_which_date() {
        let output = serde_json::json!({
            "rows": 3,
            "datasets": [
                "warehouse://a",
                {"uri": "warehouse://b", "biz_date": "2026-11-30"},
                {"uri": "not a uri"},
                {"uri": "warehouse://c", "biz_date": "yesterday"},
                7
            ]
        });
        let named: Vec<(String, String)> = named_in(&output, "2026-12-01")
            .unwrap()
            .into_iter()
            .map(|(uri, date)| (uri.to_string(), date))
            .collect();
        assert_eq!(
            named,
            [
                ("warehouse://a".to_string(), "2026-12-01".to_string()),
                ("warehouse://b".to_string(), "2026-11-30".to_string()),
            ]
        );
        assert_eq!(
            named_in(&serde_json::json!({"rows": 3}), "2026-12-01"),
            None
        );
        assert_eq!(named_in(&serde_json::Value::Null, "2026-12-01"), None);
    }

    fn job(name: &str, consumes: &[&str], produces: &[&str]) -> JobSpec {
        let mut spec = super::super::tests::shell_job(name, "true");
        spec.consumes = consumes
            .iter()
            .map(|u| DatasetUri::parse(u).unwrap())
            .collect();
        spec.produces = produces
            .iter()
            .map(|u| DatasetUri::parse(u).unwrap())
            .collect();
        spec
    }

    #[test]
    fn the_walk_follows_datasets_both_ways_to_its_depth_and_ends_on_a_cycle() {
        let specs = [
            job("load", &["s3://raw/orders"], &["warehouse://orders"]),
            job("report", &["warehouse://orders"], &["warehouse://report"]),
            job("mail", &["warehouse://report"], &[]),
            // A job that writes back what it reads: a cycle.
            job("dedupe", &["warehouse://orders"], &["warehouse://orders"]),
        ];
        let lineage = Lineage::of(&specs);
        let orders = Node::Dataset(DatasetUri::parse("warehouse://orders").unwrap());
        let down = lineage.walk(&orders, Direction::Downstream, None);
        let names: Vec<String> = down
            .iter()
            .map(|e| format!("{}>{}@{}", e.from, e.to, e.depth))
            .collect();
        assert_eq!(
            names,
            [
                "warehouse://orders>job dedupe@1",
                "warehouse://orders>job report@1",
                "job dedupe>warehouse://orders@2",
                "job report>warehouse://report@2",
                "warehouse://report>job mail@3",
            ]
        );
        let near = lineage.walk(&orders, Direction::Downstream, Some(1));
        assert_eq!(near.len(), 2);
        let up = lineage.walk(
            &Node::Job("report".parse().unwrap()),
            Direction::Upstream,
            None,
        );
        let names: Vec<String> = up.iter().map(|e| format!("{}>{}", e.from, e.to)).collect();
        assert_eq!(
            names,
            [
                "warehouse://orders>job report",
                "job dedupe>warehouse://orders",
                "job load>warehouse://orders",
                // dedupe reads what it writes: the edge is told, the walk does not go round.
                "warehouse://orders>job dedupe",
                "s3://raw/orders>job load",
            ]
        );
        assert!(lineage.knows(&DatasetUri::parse("s3://raw/orders").unwrap()));
        assert!(!lineage.knows(&DatasetUri::parse("s3://elsewhere").unwrap()));
    }
}
