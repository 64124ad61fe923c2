//! A node's machine, as its heartbeat reads it each beat: how busy its cores were since the
//! beat before (`/proc/stat`), its memory (`/proc/meminfo`) and the disk of its data directory
//! (`statvfs`). The article's fourth class of figures: an operator sees in `ax nodes` that a
//! node's disk is filling before the outbox cannot be written, and Prometheus alerts on it.

use std::path::Path;

use ax_bus::messages::Machine;

/// The CPU's counters at one instant: jiffies busy and in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CpuTimes {
    busy: u64,
    total: u64,
}

/// Reads the machine, each time against the CPU's counters of the time before.
#[derive(Debug, Default)]
pub(crate) struct Sampler {
    last: Option<CpuTimes>,
}

impl Sampler {
    /// The machine now, its disk that of `data_dir` (or of its nearest existing parent, for a
    /// node that has not made it yet); `None` where `/proc` cannot be read.
    pub(crate) fn sample(&mut self, data_dir: &Path) -> Option<Machine> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let now = cpu_times(&stat)?;
        let cpu_busy = self.last.and_then(|before| busy_between(before, now));
        self.last = Some(now);
        let (disk_total_bytes, disk_free_bytes) = disk(data_dir).unwrap_or((0, 0));
        Some(Machine {
            cpu_busy,
            memory_total_bytes: meminfo_bytes(&meminfo, "MemTotal:")?,
            memory_available_bytes: meminfo_bytes(&meminfo, "MemAvailable:")?,
            disk_total_bytes,
            disk_free_bytes,
        })
    }
}

/// The first line of `/proc/stat` (`cpu  user nice system idle iowait irq softirq steal ...`):
/// idle and iowait are not busy; guest time is already in user.
fn cpu_times(stat: &str) -> Option<CpuTimes> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let total: u64 = fields.iter().sum();
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    Some(CpuTimes {
        busy: total.saturating_sub(idle),
        total,
    })
}

/// The share of the time between two readings the cores were busy.
fn busy_between(before: CpuTimes, now: CpuTimes) -> Option<f64> {
    let total = now.total.checked_sub(before.total)?;
    let busy = now.busy.checked_sub(before.busy)?;
    (total > 0).then(|| (busy as f64 / total as f64).clamp(0.0, 1.0))
}

/// A `/proc/meminfo` line's value in bytes (`MemTotal:  24576000 kB`).
pub(crate) fn meminfo_bytes(meminfo: &str, key: &str) -> Option<u64> {
    let kib: u64 = meminfo
        .lines()
        .find_map(|line| line.strip_prefix(key))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib.saturating_mul(1024))
}

/// The size of `dir`'s file system and what is free on it for an unprivileged writer.
fn disk(dir: &Path) -> Option<(u64, u64)> {
    let existing = dir.ancestors().find(|d| d.exists())?;
    let fs = nix::sys::statvfs::statvfs(existing).ok()?;
    let block = fs.fragment_size();
    Some((
        fs.blocks().saturating_mul(block),
        fs.blocks_available().saturating_mul(block),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_is_the_share_of_the_jiffies_between_two_readings_not_idle() {
        let before = cpu_times("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3\n").unwrap();
        assert_eq!(
            before,
            CpuTimes {
                busy: 200,
                total: 1000
            }
        );
        let after = cpu_times("cpu  400 0 100 1300 200 0 0 0 0 0\n").unwrap();
        assert_eq!(busy_between(before, after), Some(0.3));
        assert_eq!(busy_between(after, after), None, "no time passed");
        assert_eq!(busy_between(after, before), None, "counters went back");
        assert_eq!(cpu_times("intr 1 2\n"), None);
    }

    #[test]
    fn meminfo_values_are_read_in_bytes() {
        let meminfo = "MemTotal:       24576000 kB\nMemAvailable:  100 kB\n";
        assert_eq!(meminfo_bytes(meminfo, "MemTotal:"), Some(24_576_000 * 1024));
        assert_eq!(meminfo_bytes(meminfo, "MemAvailable:"), Some(100 * 1024));
        assert_eq!(meminfo_bytes(meminfo, "MemFree:"), None);
    }

    #[test]
    fn the_machine_is_read_with_a_data_directory_not_made_yet() {
        let dir = tempfile::tempdir().unwrap();
        let mut sampler = Sampler::default();
        let first = sampler
            .sample(&dir.path().join("not/made/yet"))
            .expect("this machine has /proc");
        assert_eq!(first.cpu_busy, None, "nothing to compare with yet");
        assert!(first.memory_total_bytes >= first.memory_available_bytes);
        assert!(first.disk_total_bytes >= first.disk_free_bytes && first.disk_free_bytes > 0);
        let busy = std::time::Instant::now();
        while busy.elapsed() < std::time::Duration::from_millis(50) {
            std::hint::black_box(0u64);
        }
        let second = sampler.sample(dir.path()).unwrap();
        assert!(second.cpu_busy.is_some_and(|b| (0.0..=1.0).contains(&b)));
    }
}
