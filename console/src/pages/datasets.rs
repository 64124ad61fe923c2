//! Datasets: every dataset the jobs' definitions name (`produces:`, `consumes:`), and a page
//! per dataset — the jobs that write and read it, its freshness, the last update of each
//! business date (by which instance and attempt, when) and its lineage, upstream and
//! downstream, drawn on the server as SVG with the DAG page's layout ([`crate::layout`]).
//!
//! A dataset is named by its URI in the query (`/datasets/show?uri=warehouse://orders`): URIs
//! hold slashes and colons that no path segment should.

use std::collections::{BTreeMap, BTreeSet};

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use serde::Deserialize;

use ax_bus::messages::JobRecord;
use ax_bus::spec::dataset::{DatasetUri, Direction, Lineage, Node};

use crate::layout::{self, Edge, Spot};
use crate::pages::{self, Chrome};
use crate::server::State;

/// How many edges the drawing follows each way from the dataset.
const DRAWN_DEPTH: usize = 3;

pub(crate) fn routes(config: &mut web::ServiceConfig) {
    config
        .route("/datasets", web::get().to(list))
        .route("/datasets/show", web::get().to(page));
}

/// A dataset in the list.
struct Listed {
    uri: String,
    link: String,
    writers: Vec<String>,
    readers: Vec<String>,
    freshness: String,
}

#[derive(Template)]
#[template(path = "datasets.html")]
struct ListPage {
    chrome: Chrome,
    datasets: Vec<Listed>,
}

/// The page of `uri`.
pub(crate) fn link_of(uri: &str) -> String {
    format!("/datasets/show?uri={}", pages::percent(uri))
}

/// The freshness each producer declares for `uri` (`26h`; several when producers differ).
fn freshness_of(jobs: &[JobRecord], uri: &DatasetUri) -> String {
    let windows: BTreeSet<String> = jobs
        .iter()
        .filter_map(|j| j.spec.freshness.get(uri))
        .map(|secs| pages::duration(i64::try_from(*secs).unwrap_or(i64::MAX / 1_000) * 1_000))
        .collect();
    if windows.is_empty() {
        "–".to_string()
    } else {
        windows.into_iter().collect::<Vec<_>>().join(", ")
    }
}

async fn list(state: web::Data<State>, request: HttpRequest) -> HttpResponse {
    let jobs = pages::or_return!(pages::registry_jobs(&state, &request).await);
    let lineage = Lineage::of(jobs.iter().map(|j| &j.spec));
    let datasets = lineage
        .datasets()
        .map(|uri| Listed {
            uri: uri.to_string(),
            link: link_of(uri.as_str()),
            writers: lineage.producers(uri).map(ToString::to_string).collect(),
            readers: lineage.consumers(uri).map(ToString::to_string).collect(),
            freshness: freshness_of(&jobs, uri),
        })
        .collect();
    let page = ListPage {
        chrome: Chrome::of(&pages::caller(&request), "datasets"),
        datasets,
    };
    pages::html(StatusCode::OK, &page)
}

#[derive(Debug, Default, Deserialize)]
struct DatasetQuery {
    #[serde(default)]
    uri: String,
}

/// An update of the dataset, as a row.
struct UpdateRow {
    biz_date: String,
    job: String,
    instance_id: String,
    attempt: u32,
    at: String,
}

/// A node of the drawing.
struct Drawn {
    name: String,
    /// `job`, `dataset`, or `dataset here` for the page's own.
    class: &'static str,
    link: String,
    at: Spot,
    sub: &'static str,
}

#[derive(Template)]
#[template(path = "dataset.html")]
struct DatasetPage {
    chrome: Chrome,
    uri: String,
    writers: Vec<String>,
    readers: Vec<String>,
    freshness: String,
    updates: Vec<UpdateRow>,
    nodes: Vec<Drawn>,
    edges: Vec<Edge>,
    width: f64,
    height: f64,
    node_width: f64,
    node_height: f64,
}

/// The name a node is laid out by: a job's name, a dataset's URI (never a job name: it holds
/// `://`).
fn drawn_name(node: &Node) -> String {
    match node {
        Node::Job(job) => job.to_string(),
        Node::Dataset(uri) => uri.to_string(),
    }
}

async fn page(
    state: web::Data<State>,
    request: HttpRequest,
    query: web::Query<DatasetQuery>,
) -> HttpResponse {
    let uri = match DatasetUri::parse(query.uri.trim()) {
        Ok(uri) => uri,
        Err(reason) => {
            return pages::error_page(&request, StatusCode::BAD_REQUEST, format!("uri: {reason}"))
        }
    };
    let jobs = pages::or_return!(pages::registry_jobs(&state, &request).await);
    let Ok(client) = pages::client(&state, &request) else {
        return pages::error_page(
            &request,
            StatusCode::SERVICE_UNAVAILABLE,
            "this node has no NATS connection".into(),
        );
    };
    let updates = match client.dataset_updates(&uri).await {
        Ok(updates) => updates,
        Err(e) => {
            return pages::error_page(
                &request,
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the dataset's updates could not be read: {e}"),
            )
        }
    };
    let lineage = Lineage::of(jobs.iter().map(|j| &j.spec));
    if !lineage.knows(&uri) && updates.is_empty() {
        return pages::error_page(
            &request,
            StatusCode::NOT_FOUND,
            format!("no job writes or reads {uri}, and no update of it is kept"),
        );
    }
    let start = Node::Dataset(uri.clone());
    let mut edges: Vec<(String, String)> = Vec::new();
    let mut members = BTreeSet::from([drawn_name(&start)]);
    let mut kinds: BTreeMap<String, Node> = BTreeMap::from([(drawn_name(&start), start.clone())]);
    for direction in [Direction::Upstream, Direction::Downstream] {
        for edge in lineage.walk(&start, direction, Some(DRAWN_DEPTH)) {
            for node in [&edge.from, &edge.to] {
                members.insert(drawn_name(node));
                kinds.insert(drawn_name(node), node.clone());
            }
            edges.push((drawn_name(&edge.from), drawn_name(&edge.to)));
        }
    }
    let drawn = layout::layered(&members, &edges);
    let nodes = drawn
        .nodes
        .iter()
        .map(|p| {
            let (class, link, sub) = match kinds.get(&p.name) {
                Some(Node::Job(job)) => ("job", format!("/jobs/{job}"), "job"),
                Some(Node::Dataset(d)) if *d == uri => {
                    ("dataset here", link_of(d.as_str()), "dataset")
                }
                _ => ("dataset", link_of(&p.name), "dataset"),
            };
            Drawn {
                name: p.name.clone(),
                class,
                link,
                at: p.spot(),
                sub,
            }
        })
        .collect();
    let page = DatasetPage {
        chrome: Chrome::of(&pages::caller(&request), "datasets"),
        writers: lineage.producers(&uri).map(ToString::to_string).collect(),
        readers: lineage.consumers(&uri).map(ToString::to_string).collect(),
        freshness: freshness_of(&jobs, &uri),
        uri: uri.to_string(),
        updates: updates
            .into_iter()
            .map(|u| UpdateRow {
                biz_date: u.biz_date,
                job: u.job.to_string(),
                instance_id: u.instance_id.to_string(),
                attempt: u.attempt,
                at: pages::time(Some(u.at)),
            })
            .collect(),
        nodes,
        edges: drawn.edges,
        width: drawn.width,
        height: drawn.height,
        node_width: layout::NODE_WIDTH,
        node_height: layout::NODE_HEIGHT,
    };
    pages::html(StatusCode::OK, &page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dataset_link_escapes_what_a_query_would_misread() {
        assert_eq!(
            link_of("s3://lake/events?x=1&y"),
            "/datasets/show?uri=s3%3A%2F%2Flake%2Fevents%3Fx%3D1%26y"
        );
    }
}
