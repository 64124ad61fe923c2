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
//! `manifest.json` (every other file's length and SHA-256), written last: a folder without it
//! is a partial copy. It is written under `<out>.partial` (marked as ax's by a file of its
//! own, [`PARTIAL_MARK`]) and renamed to `<out>` once complete.
//!
//! A backup holds the registry (an http job's literal headers among it), the audit and the
//! tokens' hashes: its folder is made `0700` and its files `0600`, whatever the umask. A
//! restore believes nothing it has not checked: the manifest's every name must be one of the
//! deployment's streams, named once, every file in the folder must be listed and every listed
//! file must match its checksum — the stream descriptions too, since a restored stream takes
//! its configuration (its `max_age`, say) from them — before the first byte is sent.
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
/// The file that marks an unfinished backup folder (`<out>.partial`) as ax's: only such a
/// folder is removed when a backup starts again.
pub const PARTIAL_MARK: &str = ".ax-backup-partial";
/// The format of the folder this version writes: 2 checksums the stream descriptions too.
pub const FORMAT: u32 = 2;
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
    /// Its snapshot, `<name>.snapshot`.
    pub snapshot: FileSum,
    /// Its configuration and state, `<name>.json`.
    pub description: FileSum,
}

/// A file's length and checksum.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileSum {
    /// Its length in bytes.
    pub bytes: u64,
    /// Its SHA-256, in hex.
    pub sha256: String,
}

impl FileSum {
    fn of(bytes: &[u8]) -> Self {
        Self {
            bytes: bytes.len() as u64,
            sha256: hex::encode(Sha256::digest(bytes)),
        }
    }
}

/// Why a backup or a restore stopped.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The target folder is there already.
    #[error("{0} exists: a backup goes into a new folder")]
    Exists(PathBuf),
    /// An unfinished backup's folder is there and is not ax's to remove.
    #[error(
        "{path} exists and is not an unfinished backup of ax's ({reason}): remove it yourself, \
         or back up into another folder"
    )]
    NotOurs {
        /// The folder.
        path: PathBuf,
        /// What in it is not ax's.
        reason: String,
    },
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
    let names = stream_names(layout);
    if partial.symlink_metadata().is_ok() {
        remove_unfinished(&partial, &names)?;
    }
    private_folder(&partial)?;
    private_file(&partial.join(PARTIAL_MARK), b"an unfinished ax backup\n")?;
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
            copy.messages, copy.snapshot.bytes
        ));
        manifest.streams.push(copy);
    }
    let path = partial.join(MANIFEST);
    let text = serde_json::to_vec_pretty(&manifest).map_err(|e| BackupError::Corrupt {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    private_file(&path, &text)?;
    let mark = partial.join(PARTIAL_MARK);
    std::fs::remove_file(&mark).map_err(io(&mark))?;
    std::fs::rename(&partial, out).map_err(io(out))?;
    Ok(manifest)
}

/// Every stream a deployment of `layout` may have, its instance buckets' included: the only
/// names a backup's files may carry.
fn stream_names(layout: &Layout) -> Vec<String> {
    let mut names = layout.stream_names();
    names.extend(layout.instance_bucket_streams(crate::client::instance_buckets::MAX_BUCKETS));
    names
}

/// Whether `file` is one a backup of streams `names` writes (its manifest, a stream's two
/// files, the unfinished mark).
fn ours(file: &str, names: &[String]) -> bool {
    file == MANIFEST
        || file == PARTIAL_MARK
        || [".snapshot", ".json"].iter().any(|ending| {
            file.strip_suffix(ending)
                .is_some_and(|stream| names.iter().any(|n| n == stream))
        })
}

/// Removes the unfinished backup at `partial`, file by file, when it is ax's: a folder marked
/// with [`PARTIAL_MARK`] that holds nothing but plain files a backup writes. Anything else is
/// refused, naming what is not ax's: a backup never deletes what it did not write.
fn remove_unfinished(partial: &Path, names: &[String]) -> Result<(), BackupError> {
    let not_ours = |reason: String| BackupError::NotOurs {
        path: partial.to_path_buf(),
        reason,
    };
    let meta = partial.symlink_metadata().map_err(io(partial))?;
    if !meta.is_dir() {
        return Err(not_ours("not a folder".into()));
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(partial).map_err(io(partial))? {
        let entry = entry.map_err(io(partial))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let plain = entry.file_type().map_err(io(partial))?.is_file();
        if !plain || !ours(&name, names) {
            return Err(not_ours(format!(
                "it holds `{name}`, which a backup does not write"
            )));
        }
        files.push(entry.path());
    }
    if !partial.join(PARTIAL_MARK).is_file() {
        return Err(not_ours(format!("it has no {PARTIAL_MARK}")));
    }
    for file in files {
        std::fs::remove_file(&file).map_err(io(&file))?;
    }
    std::fs::remove_dir(partial).map_err(io(partial))
}

/// Makes `dir` (its parents as the user's umask says) readable by its owner only.
fn private_folder(dir: &Path) -> Result<(), BackupError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(io(dir))?;
    // The mode given to mkdir passes through the umask; this one does not.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))
}

/// A new file at `path`, readable by its owner only, whatever the umask.
fn private_file_handle(path: &Path) -> Result<std::fs::File, BackupError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io(path))?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(io(path))?;
    Ok(file)
}

/// Writes `bytes` into a new private file at `path` (see [`private_file_handle`]).
fn private_file(path: &Path, bytes: &[u8]) -> Result<(), BackupError> {
    private_file_handle(path)?
        .write_all(bytes)
        .map_err(io(path))
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
    // A snapshot taken again after a cut replaces the cut one.
    if path.exists() {
        std::fs::remove_file(&path).map_err(io(&path))?;
    }
    let mut file = std::io::BufWriter::new(private_file_handle(&path)?);
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
    if described.exists() {
        std::fs::remove_file(&described).map_err(io(&described))?;
    }
    private_file(&described, &text)?;
    let messages = answer
        .pointer("/state/messages")
        .and_then(|m| m.as_u64())
        .unwrap_or_default();
    Ok(StreamCopy {
        name: name.to_string(),
        messages,
        snapshot: FileSum {
            bytes,
            sha256: hex::encode(hasher.finalize()),
        },
        description: FileSum::of(&text),
    })
}

/// Reads and checks a backup folder: its manifest (the format, every stream named once and
/// each one a stream of the deployment's prefix), every file there (listed in the manifest,
/// with its length and checksum) and every stream description. Nothing is sent anywhere
/// before this has passed.
pub fn verify(from: &Path) -> Result<Manifest, BackupError> {
    let path = from.join(MANIFEST);
    let text = std::fs::read(&path).map_err(|e| BackupError::Corrupt {
        path: path.clone(),
        reason: format!("{e} (a partial copy, or not a backup)"),
    })?;
    let corrupt_manifest = |reason: String| BackupError::Corrupt {
        path: path.clone(),
        reason,
    };
    let manifest: Manifest = match serde_json::from_slice::<serde_json::Value>(&text) {
        Ok(value) if value.get("format") == Some(&serde_json::json!(1)) => {
            return Err(corrupt_manifest(format!(
                "format 1, whose stream descriptions carry no checksum (this version reads \
                 format {FORMAT}): restore it with the ax that took it, or take a new backup"
            )))
        }
        Ok(value) => serde_json::from_value(value)
            .map_err(|e| corrupt_manifest(format!("not a manifest: {e}")))?,
        Err(e) => return Err(corrupt_manifest(format!("not a manifest: {e}"))),
    };
    if manifest.format != FORMAT {
        return Err(corrupt_manifest(format!(
            "format {} (this version reads format {FORMAT})",
            manifest.format
        )));
    }
    let known = stream_names(&Layout::new(
        crate::subjects::Subjects::new(&manifest.prefix),
        None,
    ));
    let mut listed = std::collections::BTreeMap::new();
    for copy in &manifest.streams {
        if !known.contains(&copy.name) {
            return Err(corrupt_manifest(format!(
                "lists `{}`, which is no stream of an ax deployment of prefix `{}`",
                copy.name, manifest.prefix
            )));
        }
        for (file, sum) in [
            (format!("{}.snapshot", copy.name), &copy.snapshot),
            (format!("{}.json", copy.name), &copy.description),
        ] {
            if listed.insert(file, sum).is_some() {
                return Err(corrupt_manifest(format!(
                    "lists the stream `{}` twice",
                    copy.name
                )));
            }
        }
    }
    for entry in std::fs::read_dir(from).map_err(io(from))? {
        let entry = entry.map_err(io(from))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != MANIFEST && !listed.contains_key(&name) {
            return Err(BackupError::Corrupt {
                path: entry.path(),
                reason: "not listed in the manifest".into(),
            });
        }
    }
    for (file, sum) in &listed {
        checked_file(&from.join(file), sum)?;
    }
    for copy in &manifest.streams {
        described_stream(&from.join(format!("{}.json", copy.name)))?;
    }
    Ok(manifest)
}

/// Checks the file at `path` against its length and checksum.
fn checked_file(path: &Path, sum: &FileSum) -> Result<(), BackupError> {
    let corrupt = |reason: String| BackupError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let mut file = std::fs::File::open(path).map_err(|e| corrupt(e.to_string()))?;
    let (mut hasher, mut bytes, mut buffer) = (Sha256::new(), 0u64, vec![0; CHUNK]);
    loop {
        let n = file.read(&mut buffer).map_err(|e| corrupt(e.to_string()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        bytes += n as u64;
    }
    if bytes != sum.bytes {
        return Err(corrupt(format!(
            "{bytes} bytes where the manifest says {}",
            sum.bytes
        )));
    }
    if hex::encode(hasher.finalize()) != sum.sha256 {
        return Err(corrupt("its checksum is not the manifest's".into()));
    }
    Ok(())
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
            copy.messages, copy.snapshot.bytes
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A backup folder with `streams` (name, description) written as a backup writes them;
    /// its manifest, to be edited by the test.
    fn folder(dir: &Path, streams: &[(&str, &str)]) -> Manifest {
        let mut manifest = Manifest {
            format: FORMAT,
            taken_at: crate::time::now(),
            prefix: "ax".into(),
            streams: Vec::new(),
        };
        for (name, description) in streams {
            let snapshot = format!("the archive of {name}");
            std::fs::write(dir.join(format!("{name}.snapshot")), &snapshot).unwrap();
            std::fs::write(dir.join(format!("{name}.json")), description).unwrap();
            manifest.streams.push(StreamCopy {
                name: name.to_string(),
                messages: 1,
                snapshot: FileSum::of(snapshot.as_bytes()),
                description: FileSum::of(description.as_bytes()),
            });
        }
        manifest
    }

    fn write_manifest(dir: &Path, manifest: &Manifest) {
        std::fs::write(dir.join(MANIFEST), serde_json::to_vec(manifest).unwrap()).unwrap();
    }

    const SEVEN_DAYS: &str = r#"{"config":{"max_age":604800000000000},"state":{}}"#;

    #[test]
    fn every_file_and_every_name_is_checked_before_a_restore() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = folder(
            dir.path(),
            &[("AX_RESULTS", SEVEN_DAYS), ("KV_ax_instances", SEVEN_DAYS)],
        );
        write_manifest(dir.path(), &manifest);
        assert_eq!(verify(dir.path()).unwrap(), manifest);
        let refusal = || verify(dir.path()).unwrap_err().to_string();

        // A description edited (7 d to 180 s): its checksum is not the manifest's.
        let edited = r#"{"config":{"max_age":180000000000},"state":{}}"#;
        std::fs::write(dir.path().join("AX_RESULTS.json"), edited).unwrap();
        assert!(
            refusal().ends_with("AX_RESULTS.json: 46 bytes where the manifest says 49"),
            "{}",
            refusal()
        );
        std::fs::write(dir.path().join("AX_RESULTS.json"), SEVEN_DAYS).unwrap();

        // A stream listed twice, a name that is no stream of the prefix (or a path).
        for (name, says) in [
            ("AX_RESULTS", "lists the stream `AX_RESULTS` twice"),
            (
                "AX_NOPE",
                "lists `AX_NOPE`, which is no stream of an ax deployment",
            ),
            ("../AX_RESULTS", "lists `../AX_RESULTS`, which is no stream"),
        ] {
            let mut twice = manifest.clone();
            let mut copy = manifest.streams[0].clone();
            copy.name = name.to_string();
            twice.streams.push(copy);
            write_manifest(dir.path(), &twice);
            assert!(refusal().contains(says), "{name}: {}", refusal());
        }
        write_manifest(dir.path(), &manifest);

        // A file the manifest does not list.
        std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
        assert!(
            refusal().ends_with("notes.txt: not listed in the manifest"),
            "{}",
            refusal()
        );
        std::fs::remove_file(dir.path().join("notes.txt")).unwrap();

        // A backup of the format before descriptions were checksummed.
        let mut old = serde_json::to_value(&manifest).unwrap();
        old["format"] = serde_json::json!(1);
        std::fs::write(dir.path().join(MANIFEST), old.to_string()).unwrap();
        assert!(refusal().contains("format 1, whose stream descriptions carry no checksum"));
        write_manifest(dir.path(), &manifest);
        assert!(verify(dir.path()).is_ok());
    }

    #[test]
    fn an_unfinished_folder_is_removed_only_when_it_is_axs() {
        let base = tempfile::tempdir().unwrap();
        let names = stream_names(&Layout::new(crate::subjects::Subjects::new("ax"), None));
        let partial = base.path().join("monday.partial");
        let fill = |files: &[&str]| {
            std::fs::create_dir_all(&partial).unwrap();
            for file in files {
                std::fs::write(partial.join(file), "x").unwrap();
            }
        };
        // Ax's own, cut off: removed.
        fill(&[PARTIAL_MARK, "AX_RESULTS.snapshot", "AX_RESULTS.json"]);
        remove_unfinished(&partial, &names).unwrap();
        assert!(!partial.exists());
        // Someone's file in it, or no mark: refused, naming it, and nothing removed.
        fill(&[PARTIAL_MARK, "AX_RESULTS.snapshot", "thesis.tex"]);
        let e = remove_unfinished(&partial, &names).unwrap_err().to_string();
        assert!(
            e.contains("it holds `thesis.tex`, which a backup does not write"),
            "{e}"
        );
        assert!(partial.join("thesis.tex").exists() && partial.join(PARTIAL_MARK).exists());
        std::fs::remove_dir_all(&partial).unwrap();
        fill(&["AX_RESULTS.snapshot"]);
        let e = remove_unfinished(&partial, &names).unwrap_err().to_string();
        assert!(e.contains("it has no .ax-backup-partial"), "{e}");
        assert!(partial.join("AX_RESULTS.snapshot").exists());
        std::fs::remove_dir_all(&partial).unwrap();
        std::fs::create_dir_all(partial.join("sub")).unwrap();
        let e = remove_unfinished(&partial, &names).unwrap_err().to_string();
        assert!(e.contains("it holds `sub`"), "{e}");
    }

    #[test]
    fn a_backups_folder_and_files_are_its_owners_whatever_the_umask() {
        // Each test is a process of its own (nextest): the umask is this test's.
        let wide = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("deep").join("monday.partial");
        private_folder(&dir).unwrap();
        private_file(&dir.join("KV_ax_tokens.json"), b"{}").unwrap();
        nix::sys::stat::umask(wide);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("KV_ax_tokens.json")), 0o600);
    }

    #[test]
    fn a_backup_is_written_beside_its_folder_until_complete() {
        assert_eq!(
            partial_of(Path::new("/tmp/backups/monday")),
            PathBuf::from("/tmp/backups/monday.partial")
        );
    }
}
