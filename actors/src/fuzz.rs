//! Entry points for the fuzz targets (feature `fuzz`, `fuzz/`): readers of bytes from outside
//! the process that are not public — the worker's outbox file — reached without making them
//! part of the crate's public surface.

use crate::reporter::outbox::Outbox;

/// Opens an outbox file holding `bytes` (damaged, torn, hostile) and reads what is pending,
/// as a worker does at start.
pub fn outbox(bytes: &[u8]) {
    let path = std::env::temp_dir().join(format!("ax-fuzz-outbox-{}", std::process::id()));
    if std::fs::write(&path, bytes).is_ok() {
        if let Ok((outbox, _damage)) = Outbox::open(&path) {
            let _ = outbox.pending();
        }
    }
    let _ = std::fs::remove_file(&path);
}
