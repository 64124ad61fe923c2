//! Crash points for the tests of what a crash at an exact place leaves behind: with
//! `AX_FAILPOINT=<name>` in its environment, a process kills itself with SIGKILL — no cleanup,
//! no flush — when it reaches the point of that name. Chaos by random kills finds a
//! window that narrow only by luck; a test that names the point finds it every time. Without
//! the variable (always, outside tests) a point costs one load of a cached value.
//!
//! The points: `redispatch.intent` (a re-dispatch recorded in flight, not yet reserved),
//! `redispatch.reserved` (reserved, not yet sent), `redispatch.sent` (sent, not yet tracked),
//! `delayed.due` (a Scheduler holding a delayed attempt at its due time, not yet released),
//! `delayed.released` (its record released, the attempt not yet handed on).

use std::sync::OnceLock;

/// The variable naming the point to crash at.
pub(crate) const FAILPOINT_ENV: &str = "AX_FAILPOINT";

static ARMED: OnceLock<Option<String>> = OnceLock::new();

/// Aborts the process if `point` is the one armed.
pub(crate) fn hit(point: &str) {
    let armed = ARMED.get_or_init(|| std::env::var(FAILPOINT_ENV).ok());
    if armed.as_deref() == Some(point) {
        eprintln!("failpoint {point} reached: killing this process");
        // SIGKILL to itself: what `kill -9` does, nothing runs after it.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
        std::process::abort();
    }
}
