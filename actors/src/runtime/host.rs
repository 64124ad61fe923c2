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
    super::machine::meminfo_bytes(&meminfo, "MemTotal:")
}
