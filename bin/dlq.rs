//! `ax dlq list` and `ax dlq replay ID`: reading the dead letters and submitting one again
//! (a replay is `ax.control.replay`, carried out and audited by a Scheduler).

use anyhow::Result;

use ax_bus::AxClient;

use crate::jobs::{print_plan, requested_by, Planned};
use crate::table;

pub(crate) async fn list(client: &AxClient, json: bool) -> Result<()> {
    let letters = client.dead_letters().await?;
    if json {
        return table::json(&letters);
    }
    let mut standings = Vec::with_capacity(letters.len());
    for letter in &letters {
        standings.push(ax_console::actions::standing(client, letter).await);
    }
    let rows: Vec<Vec<String>> = letters
        .iter()
        .zip(&standings)
        .map(|(l, standing)| {
            vec![
                l.id.to_string(),
                standing.to_string(),
                l.at.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
                    .unwrap_or_default(),
                l.kind.clone(),
                l.job.clone().unwrap_or_else(|| "-".into()),
                l.instance.clone().unwrap_or_else(|| l.subject.clone()),
                l.reason.clone(),
            ]
        })
        .collect();
    table::print(
        &[
            "ID",
            "NOW",
            "AT",
            "KIND",
            "JOB",
            "INSTANCE / SUBJECT",
            "REASON",
        ],
        &rows,
    );
    Ok(())
}

pub(crate) async fn replay(client: &AxClient, id: u64, json: bool) -> Result<()> {
    let replayed = ax_console::actions::replay(client, id, &requested_by()).await?;
    if json {
        return table::json(&replayed.detail);
    }
    let action = replayed.detail["action"].as_str().unwrap_or_default();
    if action == "rerun" {
        print_plan(&replayed.plan, false, Planned::Done)?;
    } else {
        println!("{}", replayed.message);
    }
    println!("dead letter {id} replayed ({action}) and removed");
    Ok(())
}
