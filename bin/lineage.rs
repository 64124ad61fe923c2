//! `ax lineage DATASET|JOB`: where a dataset's data comes from and where it goes, as the
//! registry's definitions declare it (`produces:`, `consumes:`; see
//! [`ax_bus::spec::dataset`]), and for a dataset its last updates by business date (see
//! [`ax_bus::client::datasets`]).

use anyhow::{anyhow, bail, Result};

use ax_bus::ids::JobName;
use ax_bus::spec::dataset::{DatasetUri, Direction, Edge, Lineage, Node};
use ax_bus::AxClient;

/// How many of a dataset's updates the text shows (`--json` gives all kept).
const UPDATES_SHOWN: usize = 10;

/// Prints the lineage of `target` (a dataset URI, or a job name) in `direction` (both when
/// `None`), at most `depth` edges away.
pub(crate) async fn show(
    client: &AxClient,
    target: &str,
    direction: Option<Direction>,
    depth: Option<usize>,
    json: bool,
) -> Result<()> {
    let specs = client.job_specs().await?;
    let lineage = Lineage::of(specs.values());
    let start = if target.contains("://") {
        let uri = DatasetUri::parse(target).map_err(|e| anyhow!("DATASET: {e}"))?;
        if !lineage.knows(&uri) && client.dataset_updates(&uri).await?.is_empty() {
            bail!("no job produces or consumes `{uri}`, and no run said it updated it");
        }
        Node::Dataset(uri)
    } else {
        let job: JobName = target
            .parse()
            .map_err(|e| anyhow!("JOB: `{target}`: {e} (a dataset is scheme://name)"))?;
        if !specs.contains_key(&job) {
            bail!("no job named `{job}`");
        }
        Node::Job(job)
    };
    let ways = match direction {
        Some(direction) => vec![direction],
        None => vec![Direction::Upstream, Direction::Downstream],
    };
    let walks: Vec<(&str, Vec<Edge>)> = ways
        .into_iter()
        .map(|way| {
            let name = match way {
                Direction::Upstream => "upstream",
                Direction::Downstream => "downstream",
            };
            (name, lineage.walk(&start, way, depth))
        })
        .collect();
    let updates = match &start {
        Node::Dataset(uri) => Some(client.dataset_updates(uri).await?),
        Node::Job(_) => None,
    };
    if json {
        let mut document = serde_json::Map::new();
        document.insert("target".into(), serde_json::to_value(&start)?);
        for (name, edges) in &walks {
            document.insert((*name).into(), serde_json::to_value(edges)?);
        }
        if let Some(updates) = &updates {
            document.insert("updates".into(), serde_json::to_value(updates)?);
        }
        println!("{}", serde_json::Value::Object(document));
        return Ok(());
    }
    println!("{start}");
    if let Some(updates) = &updates {
        println!("last updates (by business date):");
        if updates.is_empty() {
            println!("  (none recorded)");
        }
        for update in updates.iter().take(UPDATES_SHOWN) {
            println!(
                "  {}  job {}, {} attempt {}, {}",
                update.biz_date,
                update.job,
                update.instance_id,
                update.attempt,
                ax_bus::time::rfc3339(update.at)
            );
        }
    }
    for (name, edges) in &walks {
        println!("{name}:");
        if edges.is_empty() {
            println!("  (nothing declared)");
        }
        for edge in edges {
            println!("{}{} → {}", "  ".repeat(edge.depth), edge.from, edge.to);
        }
    }
    Ok(())
}
