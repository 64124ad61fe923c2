//! One attempt's cgroup: made with its limits before the command starts, entered by the command
//! itself between its fork and its exec (so it never runs outside), killed whole at the end —
//! whatever left its process group with it — then read for what the attempt used and removed.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ax_bus::spec::resources::Resources;
use ax_bus::Usage;

use super::{Controller, Place};
use crate::worker::lifeline::CgroupFds;

/// The cgroup period the CPU limit is a share of (100 ms, the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;
/// How long a removal waits for the killed processes to leave the cgroup.
const REMOVAL_PATIENCE: Duration = Duration::from_secs(10);

/// An attempt's cgroup, in each hierarchy the worker uses.
#[derive(Debug)]
pub(crate) struct AttemptCgroup {
    /// Each directory made, and what it is for.
    dirs: Vec<(PathBuf, Place)>,
    /// Each `cgroup.procs`, open for the command to write itself into.
    procs: Vec<File>,
    /// Its v2 `cgroup.kill`, open for the watcher to write when the worker dies.
    killer: Option<File>,
    /// The memory limit it was given.
    memory_limit: Option<u64>,
}

/// What reading an attempt's cgroup at its end found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Accounted {
    /// CPU time and peak memory, as far as the host counts them.
    pub(crate) usage: Usage,
    /// The kernel's OOM killer killed a process of it.
    pub(crate) oom_killed: bool,
    /// Its memory limit (bytes).
    pub(crate) memory_limit: Option<u64>,
}

impl AttemptCgroup {
    /// Makes cgroup `name` under each of `places` with `resources`' limits.
    pub(crate) fn make(places: &[Place], name: &str, resources: &Resources) -> io::Result<Self> {
        let mut made = Self {
            dirs: Vec::new(),
            procs: Vec::new(),
            killer: None,
            memory_limit: resources.memory.map(|m| m.0),
        };
        for place in places {
            let dir = place.dir.join(name);
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                // A try of the same attempt before a crash: used again, emptied first.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => kill_all(&dir, place),
                Err(e) => return Err(named(e, &dir)),
            }
            made.dirs.push((dir.clone(), place.clone()));
            limit(&dir, place, resources).map_err(|e| named(e, &dir))?;
            let procs = dir.join("cgroup.procs");
            made.procs.push(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&procs)
                    .map_err(|e| named(e, &procs))?,
            );
            if place.unified && made.killer.is_none() {
                // Kernels before 5.14 have none: the restarted worker's reap is left then.
                made.killer = std::fs::OpenOptions::new()
                    .write(true)
                    .open(dir.join("cgroup.kill"))
                    .ok();
            }
        }
        Ok(made)
    }

    /// Its directories, one a hierarchy.
    #[cfg(test)]
    pub(crate) fn dirs(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|(dir, _)| dir.clone()).collect()
    }

    /// The descriptors the command writes itself into and its watcher kills it with.
    pub(crate) fn fds(&self) -> CgroupFds {
        CgroupFds {
            procs: self.procs.iter().map(AsRawFd::as_raw_fd).collect(),
            kill: self.killer.as_ref().map(AsRawFd::as_raw_fd),
        }
    }

    /// Kills every process in it, wherever it went in its session or group.
    pub(crate) fn kill(&self) {
        // One hierarchy holds them all: the first with a kill of its own, else the first.
        let place = self
            .dirs
            .iter()
            .find(|(_, p)| p.unified)
            .or_else(|| self.dirs.first());
        if let Some((dir, place)) = place {
            kill_all(dir, place);
        }
    }

    /// What it used, and whether the OOM killer ended a process of it: read once its
    /// processes are gone.
    pub(crate) fn accounted(&self) -> Accounted {
        let mut usage = Usage::default();
        let mut oom_killed = false;
        for (dir, place) in &self.dirs {
            if place.serves(Controller::CpuUsage) {
                if let Some(ms) = cpu_ms(dir, place.unified) {
                    usage.cpu_ms = Some(ms);
                }
            }
            if place.serves(Controller::Memory) {
                usage.peak_memory_bytes = peak_memory(dir, place.unified);
                oom_killed = oom_kills(dir, place.unified) > 0;
            }
        }
        Accounted {
            usage,
            oom_killed,
            memory_limit: self.memory_limit,
        }
    }
}

impl Drop for AttemptCgroup {
    /// Kills what is left and removes each directory, waiting aside for the killed processes to
    /// leave it.
    fn drop(&mut self) {
        self.kill();
        self.procs.clear();
        self.killer = None;
        let dirs: Vec<(PathBuf, Place)> = std::mem::take(&mut self.dirs);
        if dirs.iter().all(|(dir, _)| std::fs::remove_dir(dir).is_ok()) {
            return;
        }
        std::thread::spawn(move || {
            let until = std::time::Instant::now() + REMOVAL_PATIENCE;
            let mut left = dirs;
            while !left.is_empty() && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
                left.retain(|(dir, place)| {
                    kill_all(dir, place);
                    std::fs::remove_dir(dir).is_err() && dir.exists()
                });
            }
            for (dir, _) in left {
                tracing::warn!(cgroup = %dir.display(), "an attempt's cgroup could not be removed");
            }
        });
    }
}

/// `e`, naming the file it was about.
fn named(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Writes the limits `place` enforces into `dir`.
fn limit(dir: &Path, place: &Place, resources: &Resources) -> io::Result<()> {
    let write = |file: &str, value: String| -> io::Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join(file))?
            .write_all(value.as_bytes())
    };
    if let (Some(memory), true) = (resources.memory, place.serves(Controller::Memory)) {
        if place.unified {
            write("memory.max", memory.0.to_string())?;
            // No swap to spill into: over the limit is over the limit.
            let _ = write("memory.swap.max", "0".into());
        } else {
            write("memory.limit_in_bytes", memory.0.to_string())?;
            if dir.join("memory.memsw.limit_in_bytes").exists() {
                write("memory.memsw.limit_in_bytes", memory.0.to_string())?;
            }
        }
    }
    if let (Some(pids), true) = (resources.pids, place.serves(Controller::Pids)) {
        write("pids.max", pids.to_string())?;
    }
    if let (Some(cpu), true) = (resources.cpu, place.serves(Controller::Cpu)) {
        let quota = u64::from(cpu.0) * CPU_PERIOD_US / 1000;
        if place.unified {
            write("cpu.max", format!("{quota} {CPU_PERIOD_US}"))?;
        } else {
            write("cpu.cfs_period_us", CPU_PERIOD_US.to_string())?;
            write("cpu.cfs_quota_us", quota.to_string())?;
        }
    }
    Ok(())
}

/// Kills every process of the cgroup `dir`: at once with `cgroup.kill` (v2), else by sending
/// each process listed SIGKILL until none is left (a fork racing the listing is caught by
/// the next round).
fn kill_all(dir: &Path, place: &Place) {
    if place.unified {
        if let Ok(mut kill) = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.kill"))
        {
            if kill.write_all(b"1").is_ok() {
                return;
            }
        }
    }
    for _ in 0..100 {
        let listed = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        let pids: Vec<i32> = listed
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The CPU time the cgroup's processes used, in milliseconds.
fn cpu_ms(dir: &Path, unified: bool) -> Option<u64> {
    if unified {
        let stat = std::fs::read_to_string(dir.join("cpu.stat")).ok()?;
        let usec = keyed(&stat, "usage_usec")?;
        Some(usec / 1000)
    } else {
        let nanos: u64 = std::fs::read_to_string(dir.join("cpuacct.usage"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        Some(nanos / 1_000_000)
    }
}

/// The most memory the cgroup held at once (where the host counts it).
fn peak_memory(dir: &Path, unified: bool) -> Option<u64> {
    let file = if unified {
        "memory.peak"
    } else {
        "memory.max_usage_in_bytes"
    };
    std::fs::read_to_string(dir.join(file))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// How many processes of the cgroup the OOM killer killed.
fn oom_kills(dir: &Path, unified: bool) -> u64 {
    let file = if unified {
        "memory.events"
    } else {
        "memory.oom_control"
    };
    std::fs::read_to_string(dir.join(file))
        .ok()
        .and_then(|text| keyed(&text, "oom_kill"))
        .unwrap_or(0)
}

/// The value of `key` in a cgroup file of `key value` lines.
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_files_are_read_by_their_key() {
        let events = "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(keyed(events, "oom_kill"), Some(1));
        assert_eq!(keyed(events, "oom"), Some(1));
        assert_eq!(keyed(events, "nope"), None);
        let stat = "usage_usec 2500000\nuser_usec 2000000\n";
        assert_eq!(keyed(stat, "usage_usec"), Some(2_500_000));
    }
}
