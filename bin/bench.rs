//! `ax bench`: runs [`ax_bench::run`] and prints its report.

use anyhow::{anyhow, Result};

use crate::table;

pub(crate) async fn run(quick: bool, only: &[String], json: bool) -> Result<()> {
    let report = ax_bench::run(quick, only).await.map_err(|e| anyhow!(e))?;
    if json {
        return table::json(&report);
    }
    println!(
        "{} · nats-server {} · {}",
        report.machine, report.nats_server, report.date
    );
    let rows: Vec<Vec<String>> = report
        .figures
        .iter()
        .map(|f| {
            vec![
                f.section.to_string(),
                f.name.clone(),
                format!("{:.1} {}", f.value, f.unit),
                f.note.clone(),
            ]
        })
        .collect();
    table::print(&["SECTION", "MEASURE", "VALUE", "NOTE"], &rows);
    Ok(())
}
