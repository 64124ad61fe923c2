//! The node config file (TOML). Every setting can also be given as a flag, which wins.
//!
//! ```toml
//! [node]
//! id = "etl-1"                     # node and worker id
//! nats = "nats://10.0.0.5:4222"
//! roles = ["worker"]
//! prefix = "ax"
//! replicas = 3
//! data_dir = "/var/lib/ax"
//!
//! [worker]
//! slots = 8
//! tags = ["etl", "gpu"]
//! ```

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub node: NodeSection,
    #[serde(default)]
    pub worker: WorkerSection,
}

/// `[node]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSection {
    pub id: Option<String>,
    pub nats: Option<String>,
    pub roles: Option<Vec<String>>,
    pub prefix: Option<String>,
    pub replicas: Option<usize>,
    pub data_dir: Option<PathBuf>,
}

/// `[worker]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSection {
    pub slots: Option<u32>,
    pub tags: Option<Vec<String>>,
}

/// Reads a config file; errors name the file, the line and the field.
pub fn read(path: &Path) -> Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config {}", path.display()))?;
    toml::from_str(&text).map_err(|e| {
        let line = e
            .span()
            .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
        let place = match line {
            Some(line) => format!("{}:{line}", path.display()),
            None => path.display().to_string(),
        };
        anyhow::anyhow!("{place}: {}", e.message())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/node.example.toml");
        let config = read(&path).unwrap();
        assert!(config.node.roles.is_some());
    }

    #[test]
    fn unknown_keys_name_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n.toml");
        std::fs::write(&path, "[node]\nid = \"a\"\ncolour = 3\n").unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains("n.toml:3"), "{err}");
        assert!(err.contains("colour"), "{err}");
    }
}
