//! The machine's pressure, as the adaptive budget reads it: runnable tasks per core (the
//! kernel's count of tasks running or ready to run, `/proc/loadavg`'s fourth field, at this
//! instant rather than the load average's minute) and available memory (`/proc/meminfo`'s
//! `MemAvailable`). Machine-wide, as the attempts' processes compete with everything else on it.

use super::budget::Pressure;

/// One sample, or `None` where `/proc` does not say (then the budget holds).
pub(crate) fn sample(cores: u32) -> Option<Pressure> {
    let loadavg = std::fs::read_to_string("/proc/loadavg").ok()?;
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse(&loadavg, &meminfo, cores)
}

fn parse(loadavg: &str, meminfo: &str, cores: u32) -> Option<Pressure> {
    // "0.52 0.61 0.70 3/412 12345": running/total tasks in the fourth field.
    let running: u32 = loadavg
        .split_whitespace()
        .nth(3)?
        .split('/')
        .next()?
        .parse()
        .ok()?;
    let memory_available = crate::runtime::machine::meminfo_bytes(meminfo, "MemAvailable:")?;
    // The thread reading this file is one of them.
    let others = running.saturating_sub(1);
    Some(Pressure {
        load_per_core: f64::from(others) / f64::from(cores.max(1)),
        memory_available,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_reads_the_runnable_tasks_and_the_available_memory() {
        let meminfo = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n";
        let p = parse("2.08 0.80 0.30 5/181 5808\n", meminfo, 2).expect("parsed");
        assert_eq!(p.load_per_core, 2.0);
        assert_eq!(p.memory_available, 2048 * 1024);
        assert_eq!(parse("garbage", meminfo, 2), None);
        assert_eq!(parse("1 1 1 1/10 3", "MemTotal: 1 kB\n", 2), None);
    }

    #[test]
    fn this_machine_answers() {
        let p = sample(1).expect("/proc/loadavg and /proc/meminfo are read on Linux");
        assert!(p.memory_available > 0);
        assert!(p.load_per_core >= 0.0);
    }
}
