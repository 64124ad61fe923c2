//! Waiting for Ctrl-C or SIGTERM.

use tokio::signal::unix::{signal, SignalKind};

/// Returns on SIGINT or SIGTERM.
pub(crate) async fn wait() {
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("stopping");
}
