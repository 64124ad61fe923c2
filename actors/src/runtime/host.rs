//! What the machine a node runs on is, as the node's heartbeat and a worker's describe it.

/// This machine's host name (empty when it cannot be read).
pub(crate) fn host() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The cores this process may use (at least one).
pub(crate) fn cores() -> u32 {
    std::thread::available_parallelism()
        .map(|n| u32::try_from(n.get()).unwrap_or(u32::MAX))
        .unwrap_or(1)
}

/// This machine's memory (`MemTotal`, bytes), where `/proc/meminfo` says.
pub(crate) fn memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo_total(&meminfo)
}

fn meminfo_total(meminfo: &str) -> Option<u64> {
    let kib: u64 = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib.saturating_mul(1024))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_total_is_read_in_bytes() {
        let meminfo = "MemTotal:       24576000 kB\nMemFree:  100 kB\n";
        assert_eq!(super::meminfo_total(meminfo), Some(24_576_000 * 1024));
        assert_eq!(super::meminfo_total("MemFree: 1 kB\n"), None);
    }
}
