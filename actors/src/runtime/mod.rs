//! What every actor runs on, below the actors and the node that assembles them: the clock
//! ([`clock`], and [`clock_guard`], which keeps an actor from acting on a clock that is off the
//! NATS server's), the pumps' [`progress`], the [`supervision`] that restarts an actor and
//! counts what befell it, the [`watchdog`] that finds one stalled, the [`lease`] one copy of an
//! actor holds to lead, and the [`host`] it runs on.
//!
//! Nothing here imports an actor or the node: the actors import it, and the node
//! (`crate::node`) starts them on it.

pub(crate) mod clock;
pub(crate) mod clock_guard;
pub(crate) mod host;
pub(crate) mod lease;
pub(crate) mod machine;
pub(crate) mod progress;
pub(crate) mod supervision;
pub(crate) mod watchdog;
