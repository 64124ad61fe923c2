//! Crash points for the tests of what a crash at an exact place leaves behind: with
//! `AX_FAILPOINT=<name>` in its environment, a process kills itself with SIGKILL — no cleanup,
//! no flush — when it reaches the point of that name. Chaos by random kills finds a
//! window that narrow only by luck; a test that names the point finds it every time. Without
//! the variable a point costs one load of a cached value; built without the `test-hooks` feature
//! (every build but the tests') it is an empty function.
//!
//! The points: `redispatch.intent` (a re-dispatch recorded in flight, not yet reserved),
//! `redispatch.reserved` (reserved, not yet sent), `redispatch.sent` (sent, not yet tracked),
//! `delayed.due` (a Scheduler holding a delayed attempt at its due time, not yet released),
//! `delayed.released` (its record released, the attempt not yet handed on), `creator.held` (a
//! cron fire taken ahead of its instant: its record written, its hand-off held).

/// The variable naming the point to crash at.
#[cfg(feature = "test-hooks")]
const FAILPOINT_ENV: &str = "AX_FAILPOINT";

/// Aborts the process if `point` is the one armed.
#[cfg(feature = "test-hooks")]
pub(crate) fn hit(point: &str) {
    static ARMED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let armed = ARMED.get_or_init(|| std::env::var(FAILPOINT_ENV).ok());
    if armed.as_deref() == Some(point) {
        eprintln!("failpoint {point} reached: killing this process");
        // SIGKILL to itself: what `kill -9` does, nothing runs after it.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
        std::process::abort();
    }
}

/// Without the test hooks: nothing.
#[cfg(not(feature = "test-hooks"))]
pub(crate) fn hit(_point: &str) {}
