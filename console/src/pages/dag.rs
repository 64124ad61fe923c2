//! The DAG of a business date: the jobs of the chains (or of the one through a root job), each
//! coloured by the state of its latest instance that date and linked to it, laid out in layers
//! ([`crate::layout`]) and drawn as SVG on the server; under it, the Gantt chart of those
//! instances' runs ([`crate::gantt`]).

use std::collections::{BTreeMap, BTreeSet};

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use serde::Deserialize;

use ax_bus::messages::JobRecord;

use crate::gantt::{self, Gantt};
use crate::index::Row;
use crate::layout::{self, Edge, Spot};
use crate::pages::{self, Chrome};
use crate::server::State;

/// Edges between jobs, by name: (from, to).
type Edges = BTreeSet<(String, String)>;

pub(crate) fn routes(config: &mut web::ServiceConfig) {
    config.route("/dag", web::get().to(page));
}

#[derive(Debug, Default, Deserialize)]
struct DagQuery {
    #[serde(default)]
    date: String,
    #[serde(default)]
    root: String,
}

struct Node {
    name: String,
    state: String,
    label: String,
    link: String,
    at: Spot,
}

#[derive(Template)]
#[template(path = "dag.html")]
struct DagPage {
    chrome: Chrome,
    date: String,
    root: String,
    jobs: Vec<String>,
    problem: Option<String>,
    nodes: Vec<Node>,
    /// Each edge, and whether a dataset makes it (the downstream runs on a dataset the
    /// upstream writes, `on_datasets`) rather than a dependency.
    edges: Vec<(Edge, bool)>,
    width: f64,
    height: f64,
    node_width: f64,
    node_height: f64,
    /// When each job of the drawing ran.
    gantt: Gantt,
}

/// The nodes connected to `root` through the edges, whichever the direction.
fn chain_of(root: &str, edges: &[(String, String)]) -> BTreeSet<String> {
    let mut seen = BTreeSet::from([root.to_string()]);
    let mut frontier = vec![root.to_string()];
    while let Some(node) = frontier.pop() {
        for (a, b) in edges {
            let next = if *a == node {
                b
            } else if *b == node {
                a
            } else {
                continue;
            };
            if seen.insert(next.clone()) {
                frontier.push(next.clone());
            }
        }
    }
    seen
}

async fn page(
    state: web::Data<State>,
    request: HttpRequest,
    query: web::Query<DagQuery>,
) -> HttpResponse {
    let jobs = pages::or_return!(pages::registry_jobs(&state, &request).await);
    let mut problem = None;
    let date = match query.date.trim() {
        "" => chrono::Utc::now().date_naive().to_string(),
        date if ax_bus::time::parse_biz_date(date).is_some() => date.to_string(),
        date => {
            problem = Some(format!("date: `{date}` is not a date (YYYY-MM-DD)"));
            chrono::Utc::now().date_naive().to_string()
        }
    };
    let (deps, data) = edges_of(&jobs);
    let edges: Vec<(String, String)> = deps.iter().chain(&data).cloned().collect();
    let names: Vec<String> = jobs.iter().map(|j| j.spec.name.to_string()).collect();
    let root = query.root.trim().to_string();
    let members: BTreeSet<String> = if root.is_empty() {
        edges
            .iter()
            .flat_map(|(a, b)| [a.clone(), b.clone()])
            .collect()
    } else if names.contains(&root) {
        chain_of(&root, &edges)
    } else {
        problem = Some(format!("root: no job `{root}`"));
        BTreeSet::new()
    };
    let latest = state
        .index
        .as_ref()
        .map(|index| index.latest_of_date(&date))
        .unwrap_or_default();
    let latest: BTreeMap<String, _> = latest
        .into_iter()
        .map(|(j, r)| (j.to_string(), r))
        .collect();
    let ran: Vec<Row> = members
        .iter()
        .filter_map(|job| latest.get(job).cloned())
        .collect();
    let gantt = gantt::of(&ran, chrono::Utc::now());
    let drawn = layout::layered(&members, &edges);
    let nodes = nodes_of(&drawn, &latest);
    let status = if problem.is_some() {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    let page = DagPage {
        chrome: Chrome::of(&pages::caller(&request), "dag"),
        date,
        root,
        jobs: names,
        problem,
        nodes,
        edges: drawn
            .edges
            .into_iter()
            .map(|e| {
                let by_data = data.contains(&(e.from.clone(), e.to.clone()));
                (e, by_data)
            })
            .collect(),
        width: drawn.width,
        height: drawn.height,
        node_width: layout::NODE_WIDTH,
        node_height: layout::NODE_HEIGHT,
        gantt,
    };
    pages::html(status, &page)
}

/// The edges between `jobs`: their dependencies (`deps`), and apart from them a job run by
/// its data (`on_datasets`) from every job writing one of its datasets.
fn edges_of(jobs: &[JobRecord]) -> (Edges, Edges) {
    let deps: Edges = jobs
        .iter()
        .flat_map(|j| {
            j.spec
                .deps
                .iter()
                .map(|d| (d.name.to_string(), j.spec.name.to_string()))
        })
        .collect();
    // A job run by its data waits for every job writing one of its datasets.
    let data: Edges = jobs
        .iter()
        .flat_map(|reader| {
            let reader_name = reader.spec.name.to_string();
            jobs.iter()
                .filter(move |writer| {
                    reader
                        .spec
                        .on_datasets
                        .iter()
                        .any(|uri| writer.spec.produces.contains(uri))
                })
                .map(move |writer| (writer.spec.name.to_string(), reader_name.clone()))
        })
        .filter(|edge| !deps.contains(edge))
        .collect();
    (deps, data)
}

/// Each drawn job, coloured and linked by its latest instance of the date.
fn nodes_of(drawn: &layout::Layout, latest: &BTreeMap<String, Row>) -> Vec<Node> {
    drawn
        .nodes
        .iter()
        .map(|p| {
            let row = latest.get(&p.name);
            Node {
                name: p.name.clone(),
                state: row.map_or_else(|| "none".into(), |r| r.state.to_string()),
                label: row.map_or_else(
                    || "no instance".into(),
                    |r| format!("{} ({})", r.state, r.tag),
                ),
                link: row.map_or_else(
                    || format!("/jobs/{}", p.name),
                    |r| format!("/instances/{}", r.instance_id),
                ),
                at: p.spot(),
            }
        })
        .collect()
}
