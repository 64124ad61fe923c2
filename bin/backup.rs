//! `ax backup` and `ax restore`: a deployment's streams and buckets copied into a folder, and
//! brought back into a NATS that has none of them (see [`ax_bus::client::backup`]).

use std::path::Path;

use anyhow::{Context, Result};

use ax_bus::client::backup;
use ax_bus::client::provision::Layout;
use ax_bus::client::{redact, AxClient, ConnectConfig};
use ax_bus::subjects::Subjects;

fn config(nats: Option<&str>, prefix: &str) -> ConnectConfig {
    let (url, _) = crate::connect::resolve_url(nats);
    let mut config = ConnectConfig::new(&url, "ax-cli");
    config.prefix = prefix.to_string();
    config
}

async fn connect(config: &ConnectConfig) -> Result<async_nats::Client> {
    AxClient::connect_bare(config)
        .await
        .with_context(|| format!("NATS URL {}", redact(&config.url)))
}

/// Copies every stream and bucket of the deployment into `out`, a new folder.
pub(crate) async fn take(nats: Option<&str>, prefix: &str, out: &Path) -> Result<()> {
    let config = config(nats, prefix);
    let client = connect(&config).await?;
    let layout = Layout::new(Subjects::new(prefix), None);
    let manifest = backup::backup(
        &client,
        &layout,
        out,
        ax_actors::test_hooks::backup_pause(),
        |step| eprintln!("{step}"),
    )
    .await
    .context("backup")?;
    let bytes: u64 = manifest.streams.iter().map(|s| s.snapshot.bytes).sum();
    eprintln!(
        "backup complete: {} streams, {bytes} bytes in {}",
        manifest.streams.len(),
        out.display()
    );
    Ok(())
}

/// Checks the backup in `from`, then restores it into the NATS (which must have none of it).
pub(crate) async fn restore(nats: Option<&str>, prefix: &str, from: &Path) -> Result<()> {
    let manifest = backup::verify(from).context("restore refused")?;
    if manifest.prefix != prefix {
        anyhow::bail!(
            "restore refused: the backup is of prefix `{}`, not `{prefix}` (--prefix)",
            manifest.prefix
        );
    }
    eprintln!(
        "{}: {} streams, taken {}; checksums verified",
        from.display(),
        manifest.streams.len(),
        ax_bus::time::rfc3339(manifest.taken_at)
    );
    let client = connect(&config(nats, prefix)).await?;
    backup::restore(&client, from, &manifest, |step| eprintln!("{step}"))
        .await
        .context("restore")?;
    eprintln!("restore complete: start the nodes against this NATS");
    Ok(())
}
