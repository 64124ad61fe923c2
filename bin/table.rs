//! Human tables and JSON output.

use anyhow::Result;
use serde::Serialize;

/// Prints rows under a header, columns padded to their widest cell.
pub(crate) fn print(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i + 1 == cells.len() {
                    c.clone()
                } else {
                    format!("{c:<width$}", width = widths[i])
                }
            })
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
}

/// Prints one JSON document.
pub(crate) fn json<T: Serialize>(value: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// A cell for an optional time.
pub(crate) fn time(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map(ax_bus::time::rfc3339).unwrap_or_else(|| "-".into())
}

/// A cell shortened to `max` characters.
pub(crate) fn short(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() <= max {
        line.to_string()
    } else {
        format!("{}…", line.chars().take(max - 1).collect::<String>())
    }
}
