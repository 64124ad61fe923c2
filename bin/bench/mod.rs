//! `ax bench`: speed, measured against raw JetStream in the same run on the same machine.
//!
//! It starts its own nats-server (the pinned one, file storage, default sync settings) in a
//! temporary directory and runs each section against it; every figure is printed with the raw
//! limit beside it. Sections so far: `limit` (raw JetStream) and `dag` (the DagCoordinator on
//! 10,000-job graphs). `--quick` keeps the whole run under two minutes.

mod dag;
mod limit;

use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;

use ax_bus::local_server::{find_binary, LocalServer, ServerOptions};

use crate::table;

/// One line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    /// Section (`limit`, `dag`).
    pub section: &'static str,
    /// What was measured.
    pub name: String,
    /// The value.
    pub value: f64,
    /// Its unit.
    pub unit: &'static str,
    /// Detail (sizes, ratios).
    pub note: String,
}

/// The whole report.
#[derive(Debug, Serialize)]
struct Report {
    machine: String,
    nats_server: String,
    date: String,
    quick: bool,
    figures: Vec<Figure>,
}

pub async fn run(quick: bool, json: bool) -> Result<()> {
    let dir = tempfile::tempdir().context("temporary directory")?;
    let binary = find_binary()?;
    let version = std::process::Command::new(&binary)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let server = LocalServer::start(ServerOptions {
        binary,
        port: None,
        store_dir: dir.path().join("store"),
        log_file: None,
        extra_args: Vec::new(),
    })?;
    let nats = async_nats::ConnectOptions::new()
        .name("ax-bench")
        .connection_timeout(Duration::from_secs(5))
        .connect(&server.url)
        .await?;
    let mut figures = Vec::new();
    eprintln!("limit: raw JetStream…");
    figures.extend(limit::measure(&nats, quick).await?);
    eprintln!("dag: 10,000-job graphs…");
    figures.extend(dag::measure(&nats, quick).await?);
    let report = Report {
        machine: machine(),
        nats_server: version,
        date: ax_bus::time::rfc3339(ax_bus::time::now()),
        quick,
        figures,
    };
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

fn machine() -> String {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown cpu".into());
    format!("{cores} cores ({cpu})")
}
