//! Backup and restore: every stream and bucket of a deployment copied with JetStream's own
//! snapshots, and brought back into a NATS that has none of them.
//!
//! Why snapshots and not a copy of the messages: a snapshot keeps what a republish cannot —
//! each message's sequence (a record's revision, which compare-and-swap goes by), its time
//! (the steps of an instance's history), its headers (message schedules: a delayed instance
//! fires at its time on the new server), and the consumers with their positions.
//!
//! A backup is a folder: one file per stream (`<stream>.snapshot`, the server's archive as it
//! sent it), `<stream>.json` (its configuration and state as the server answered) and
//! `manifest.json` (each file's length and SHA-256), written last: a folder without it is a
//! partial copy. It is written under `<out>.partial` and renamed to `<out>` once complete.
//! Each stream is copied as it stood when its snapshot began; the streams are copied one after
//! another, so what moved between two of them (an attempt handed on meanwhile) is what a
//! crash would leave too, and the deployment heals it the same way (the Schedulers' replay,
//! the consistency sweep). A snapshot cut off (NATS restarting, say) is taken again.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::client::provision::Layout;

/// The manifest's name in a backup folder.
pub const MANIFEST: &str = "manifest.json";
/// The format of the folder this version writes.
pub const FORMAT: u32 = 1;
/// Bytes per chunk, both ways.
const CHUNK: usize = 128 * 1024;
/// How long a snapshot may go without a chunk before it is taken again.
const SILENCE: Duration = Duration::from_secs(10);
/// How many times one stream's snapshot is tried.
const TRIES: u32 = 8;
/// How long the server may take to put a restored stream in place.
const FINISH_TIMEOUT: Duration = Duration::from_secs(120);

/// What a backup holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: u32,
    /// When the backup began.
    pub taken_at: DateTime<Utc>,
    /// The subject prefix of the deployment.
    pub prefix: String,
    /// Every stream copied.
    pub streams: Vec<StreamCopy>,
}

/// One stream's copy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StreamCopy {
    /// The stream (`AX_RESULTS`, `KV_ax_instances`, …).
    pub name: String,
    /// Messages it held.
    pub messages: u64,
    /// Bytes of its snapshot file.
    pub bytes: u64,
    /// SHA-256 of its snapshot file, in hex.
    pub sha256: String,
}

/// Why a backup or a restore stopped.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The target folder is there already.
    #[error("{0} exists: a backup goes into a new folder")]
    Exists(PathBuf),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The folder is not a complete, intact backup.
    #[error("{path}: {reason}")]
    Corrupt {
        /// The file or folder.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The target NATS has streams of ax already.
    #[error(
        "the target NATS already has {0}: a restore goes only into a NATS without ax's \
         streams and buckets (nothing was restored)"
    )]
    TargetNotEmpty(String),
    /// NATS refused or failed.
    #[error("{stream}: {reason}")]
    Nats {
        /// The stream.
        stream: String,
        /// Why.
        reason: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BackupError + '_ {
    move |source| BackupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn nats(stream: &str, reason: impl std::fmt::Display) -> BackupError {
    BackupError::Nats {
        stream: stream.to_string(),
        reason: reason.to_string(),
    }
}

/// Takes a backup of every ax stream of `layout` that exists into `out` (a new folder);
/// `progress` is told each step. `pause`: a wait before the second stream (the tests restart
/// NATS in it).
pub async fn backup(
    nats_client: &async_nats::Client,
    layout: &Layout,
    out: &Path,
    pause: Option<Duration>,
    mut progress: impl FnMut(&str),
) -> Result<Manifest, BackupError> {
    if out.exists() {
        return Err(BackupError::Exists(out.to_path_buf()));
    }
    let partial = partial_of(out);
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(io(&partial))?;
    }
    std::fs::create_dir_all(&partial).map_err(io(&partial))?;
    let js = async_nats::jetstream::new(nats_client.clone());
    let mut manifest = Manifest {
        format: FORMAT,
        taken_at: crate::time::now(),
        prefix: layout.subjects.prefix().to_string(),
        streams: Vec::new(),
    };
    let buckets = retried("the instance buckets", &mut progress, || {
        instance_buckets(&js, layout)
    })
    .await?;
    let names = layout
        .stream_names()
        .into_iter()
        .chain(layout.instance_bucket_streams(buckets));
    for name in names {
        if manifest.streams.len() == 1 {
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
            }
        }
        let present = retried(&name, &mut progress, || exists(&js, &name)).await?;
        if !present {
            progress(&format!("{name}: not there, skipped"));
            continue;
        }
        let copy = retried(&name, &mut progress, || {
            snapshot(nats_client, &js, &name, &partial)
        })
        .await?;
        progress(&format!(
            "{name}: {} messages, {} bytes",
            copy.messages, copy.bytes
        ));
        manifest.streams.push(copy);
    }
    let path = partial.join(MANIFEST);
    let text = serde_json::to_vec_pretty(&manifest).map_err(|e| BackupError::Corrupt {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    std::fs::write(&path, text).map_err(io(&path))?;
    std::fs::rename(&partial, out).map_err(io(out))?;
    Ok(manifest)
}

/// `step` for stream `name`, tried again with a growing wait while it fails (NATS restarting,
/// a leader moving), up to [`TRIES`] times.
async fn retried<T, F, Fut>(
    name: &str,
    progress: &mut impl FnMut(&str),
    mut step: F,
) -> Result<T, BackupError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, BackupError>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match step().await {
            Ok(done) => return Ok(done),
            Err(e) if tries < TRIES => {
                progress(&format!("{name}: {e}; trying again"));
                tokio::time::sleep(Duration::from_secs(u64::from(tries))).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Where a backup is written until it is complete.
fn partial_of(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    out.with_file_name(name)
}

/// The deployment's number of instance buckets (one when it has no partitions bucket or no
/// count stored).
async fn instance_buckets(
    js: &async_nats::jetstream::Context,
    layout: &Layout,
) -> Result<u16, BackupError> {
    let bucket = layout.partitions_bucket();
    if !exists(js, &format!("KV_{bucket}")).await? {
        return Ok(1);
    }
    let partitions = js
        .get_key_value(&bucket)
        .await
        .map_err(|e| nats(&bucket, e))?;
    Ok(crate::client::instance_buckets::stored_count(&partitions)
        .await
        .map_err(|e| nats(&bucket, e))?
        .unwrap_or(1))
}

async fn exists(js: &async_nats::jetstream::Context, name: &str) -> Result<bool, BackupError> {
    use async_nats::jetstream::context::GetStreamErrorKind;
    match js.get_stream(name).await {
        Ok(_) => Ok(true),
        Err(e) => match e.kind() {
            GetStreamErrorKind::JetStream(j)
                if j.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND =>
            {
                Ok(false)
            }
            _ => Err(nats(name, e)),
        },
    }
}

/// The server's answer to an API request, or its error.
async fn api(
    js: &async_nats::jetstream::Context,
    stream: &str,
    subject: String,
    body: &serde_json::Value,
) -> Result<serde_json::Value, BackupError> {
    let answer: serde_json::Value = js
        .request(subject, body)
        .await
        .map_err(|e| nats(stream, e))?;
    match answer.get("error") {
        Some(error) => Err(nats(
            stream,
            error
                .get("description")
                .and_then(|d| d.as_str())
                .unwrap_or("refused"),
        )),
        None => Ok(answer),
    }
}

/// One stream's snapshot into `<dir>/<name>.snapshot` and `<name>.json`.
async fn snapshot(
    client: &async_nats::Client,
    js: &async_nats::jetstream::Context,
    name: &str,
    dir: &Path,
) -> Result<StreamCopy, BackupError> {
    let inbox = client.new_inbox();
    let mut chunks = client
        .subscribe(inbox.clone())
        .await
        .map_err(|e| nats(name, e))?;
    let answer = api(
        js,
        name,
        format!("STREAM.SNAPSHOT.{name}"),
        &serde_json::json!({ "deliver_subject": inbox, "chunk_size": CHUNK }),
    )
    .await?;
    let path = dir.join(format!("{name}.snapshot"));
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).map_err(io(&path))?);
    let (mut hasher, mut bytes) = (Sha256::new(), 0u64);
    loop {
        let chunk = tokio::time::timeout(SILENCE, chunks.next())
            .await
            .map_err(|_| nats(name, format!("no chunk for {SILENCE:?}")))?
            .ok_or_else(|| nats(name, "the connection closed"))?;
        if chunk.payload.is_empty() {
            if let Some(status) = chunk.status.filter(|s| !s.is_success()) {
                return Err(nats(
                    name,
                    format!("the server ended the snapshot: {status}"),
                ));
            }
            break;
        }
        file.write_all(&chunk.payload).map_err(io(&path))?;
        hasher.update(&chunk.payload);
        bytes += chunk.payload.len() as u64;
        if let Some(reply) = chunk.reply {
            client
                .publish(reply, bytes::Bytes::new())
                .await
                .map_err(|e| nats(name, e))?;
        }
    }
    file.flush().map_err(io(&path))?;
    let described = dir.join(format!("{name}.json"));
    let text = serde_json::to_vec_pretty(&serde_json::json!({
        "config": answer.get("config"),
        "state": answer.get("state"),
    }))
    .map_err(|e| nats(name, e))?;
    std::fs::write(&described, text).map_err(io(&described))?;
    let messages = answer
        .pointer("/state/messages")
        .and_then(|m| m.as_u64())
        .unwrap_or_default();
    Ok(StreamCopy {
        name: name.to_string(),
        messages,
        bytes,
        sha256: hex::encode(hasher.finalize()),
    })
}

/// Reads and checks a backup folder: its manifest, every file there with its length and
/// checksum. Nothing is sent anywhere before this has passed.
pub fn verify(from: &Path) -> Result<Manifest, BackupError> {
    let path = from.join(MANIFEST);
    let text = std::fs::read(&path).map_err(|e| BackupError::Corrupt {
        path: path.clone(),
        reason: format!("{e} (a partial copy, or not a backup)"),
    })?;
    let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| BackupError::Corrupt {
        path: path.clone(),
        reason: format!("not a manifest: {e}"),
    })?;
    if manifest.format != FORMAT {
        return Err(BackupError::Corrupt {
            path,
            reason: format!(
                "format {} (this version reads format {FORMAT})",
                manifest.format
            ),
        });
    }
    for copy in &manifest.streams {
        let path = from.join(format!("{}.snapshot", copy.name));
        let corrupt = |reason: String| BackupError::Corrupt {
            path: path.clone(),
            reason,
        };
        let mut file = std::fs::File::open(&path).map_err(|e| corrupt(e.to_string()))?;
        let (mut hasher, mut bytes, mut buffer) = (Sha256::new(), 0u64, vec![0; CHUNK]);
        loop {
            let n = file.read(&mut buffer).map_err(|e| corrupt(e.to_string()))?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
            bytes += n as u64;
        }
        if bytes != copy.bytes {
            return Err(corrupt(format!(
                "{bytes} bytes where the manifest says {}",
                copy.bytes
            )));
        }
        if hex::encode(hasher.finalize()) != copy.sha256 {
            return Err(corrupt("its checksum is not the manifest's".into()));
        }
        let described = from.join(format!("{}.json", copy.name));
        described_stream(&described)?;
    }
    Ok(manifest)
}

/// A stream's `<name>.json`: its configuration and state.
fn described_stream(path: &Path) -> Result<serde_json::Value, BackupError> {
    let text = std::fs::read(path).map_err(|e| BackupError::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let value: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| BackupError::Corrupt {
            path: path.to_path_buf(),
            reason: format!("not a stream description: {e}"),
        })?;
    if !value.get("config").is_some_and(|c| c.is_object()) {
        return Err(BackupError::Corrupt {
            path: path.to_path_buf(),
            reason: "no stream configuration".into(),
        });
    }
    Ok(value)
}

/// Restores a verified backup into a NATS that has none of its streams; `progress` is told
/// each step.
pub async fn restore(
    client: &async_nats::Client,
    from: &Path,
    manifest: &Manifest,
    mut progress: impl FnMut(&str),
) -> Result<(), BackupError> {
    let js = async_nats::jetstream::new(client.clone());
    let mut present = Vec::new();
    for copy in &manifest.streams {
        if exists(&js, &copy.name).await? {
            present.push(copy.name.clone());
        }
    }
    if !present.is_empty() {
        return Err(BackupError::TargetNotEmpty(present.join(", ")));
    }
    for copy in &manifest.streams {
        let name = copy.name.as_str();
        let described = described_stream(&from.join(format!("{name}.json")))?;
        let answer = api(
            &js,
            name,
            format!("STREAM.RESTORE.{name}"),
            &serde_json::json!({ "config": described["config"], "state": described["state"] }),
        )
        .await?;
        let deliver = answer
            .get("deliver_subject")
            .and_then(|d| d.as_str())
            .ok_or_else(|| nats(name, "no deliver subject in the server's answer"))?
            .to_string();
        let path = from.join(format!("{name}.snapshot"));
        let mut file = std::fs::File::open(&path).map_err(io(&path))?;
        let mut buffer = vec![0; CHUNK];
        loop {
            let n = file.read(&mut buffer).map_err(io(&path))?;
            if n == 0 {
                break;
            }
            let reply = client
                .request(deliver.clone(), bytes::Bytes::copy_from_slice(&buffer[..n]))
                .await
                .map_err(|e| nats(name, e))?;
            if reply.payload.starts_with(b"-ERR") {
                return Err(nats(name, String::from_utf8_lossy(&reply.payload)));
            }
        }
        let done = client
            .send_request(
                deliver,
                async_nats::Request::new()
                    .payload(bytes::Bytes::new())
                    .timeout(Some(FINISH_TIMEOUT)),
            )
            .await
            .map_err(|e| nats(name, e))?;
        let finished: serde_json::Value =
            serde_json::from_slice(&done.payload).map_err(|e| nats(name, e))?;
        if let Some(error) = finished.get("error") {
            return Err(nats(name, error));
        }
        progress(&format!(
            "{name}: {} messages, {} bytes",
            copy.messages, copy.bytes
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_is_written_beside_its_folder_until_complete() {
        assert_eq!(
            partial_of(Path::new("/tmp/backups/monday")),
            PathBuf::from("/tmp/backups/monday.partial")
        );
    }
}
