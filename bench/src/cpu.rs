//! CPU time of a process, from `/proc/<pid>/stat` (user + system, every thread): what an
//! instance costs ax and nats-server, a figure that holds better than instances per second on a
//! machine that other work shares.

use std::time::Duration;

use crate::{bail, Result};

/// Clock ticks per second of `/proc`'s times: `USER_HZ`, 100 in Linux's ABI on every
/// architecture ax runs on.
const USER_HZ: u64 = 100;

/// The CPU time process `pid` has used so far.
pub(crate) fn of(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        bail!("/proc/{pid}/stat: no command name");
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime field 14, stime field 15.
    let tick = |i: usize| fields.get(i - 3).and_then(|v| v.parse::<u64>().ok());
    match (tick(14), tick(15)) {
        (Some(user), Some(system)) => Ok(Duration::from_millis((user + system) * 1000 / USER_HZ)),
        _ => bail!("/proc/{pid}/stat: no utime and stime"),
    }
}

/// The CPU time of this process (the bench, with the in-process node) and of each nats-server.
#[derive(Clone, Debug)]
pub(crate) struct Snapshot {
    pub(crate) ax: Duration,
    pub(crate) servers: Vec<Duration>,
}

impl Snapshot {
    /// Now, for this process and the nats-servers `servers` (none: zero for them).
    pub(crate) fn take(servers: &[u32]) -> Result<Self> {
        Ok(Self {
            ax: of(std::process::id())?,
            servers: servers.iter().map(|pid| of(*pid)).collect::<Result<_>>()?,
        })
    }

    /// The CPU used since `before`, in µs per one of `n` things: this process's, and the
    /// nats-servers' together.
    pub(crate) fn per(&self, before: &Snapshot, n: usize) -> (f64, f64) {
        let servers = self.per_server(before, n).iter().sum();
        (micros(self.ax, before.ax, n), servers)
    }

    /// The CPU each nats-server used since `before`, in µs per one of `n` things.
    pub(crate) fn per_server(&self, before: &Snapshot, n: usize) -> Vec<f64> {
        self.servers
            .iter()
            .zip(&before.servers)
            .map(|(now, then)| micros(*now, *then, n))
            .collect()
    }
}

/// The CPU time from `then` to `now`, in µs per one of `n` things.
fn micros(now: Duration, then: Duration, n: usize) -> f64 {
    now.saturating_sub(then).as_secs_f64() * 1e6 / n.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_used_some_cpu_and_it_grows() {
        // Work until the count grows by 20 ms of CPU (a loaded machine gives this process
        // less than its wall time): a count that never grew would spin to the deadline.
        let before = of(std::process::id()).unwrap();
        let mut x = 0u64;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut after = before;
        while after < before + Duration::from_millis(20) {
            assert!(
                std::time::Instant::now() < deadline,
                "{before:?} -> {after:?}"
            );
            for _ in 0..100_000 {
                x = x.wrapping_mul(31).wrapping_add(7);
            }
            after = of(std::process::id()).unwrap();
        }
        assert!(x != 1);
    }
}
