//! A worker's room for attempts that ask for `resources`: what it can limit, how much memory and
//! CPU it offers its attempts together, and how much of that its running attempts asked for.
//!
//! Why: a job's `resources` are limits its cgroup enforces, and a request the Router honours —
//! a 16 GiB job must not land on a worker with 2 GiB left, nor on one that cannot limit it at
//! all (it would refuse it). The worker says all of it in its heartbeat ([`Isolation`]); the
//! Router adds what it sent since and routes to a worker only when [`Isolation::lacks`] finds
//! nothing missing. Nothing is taken from the machine's instant free memory: like Kubernetes'
//! requests, the room is what the attempts asked for, so it does not move with a page cache.

use serde::{Deserialize, Serialize};

use crate::spec::resources::{Cpu, LimitKind, Memory, Resources};

/// How a worker keeps its attempts apart and the room it offers them (in its heartbeat;
/// absent from workers of versions before it, which limit nothing).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Isolation {
    /// Each attempt runs in a cgroup of its own; otherwise in a process group only.
    pub cgroups: bool,
    /// What the worker says of it (`cgroup v1 and v2: each attempt in its own cgroup, limits on
    /// memory, cpu, pids`, or why it runs without).
    pub said: String,
    /// The limits it enforces, of `memory`, `cpu` and `pids`.
    #[serde(default)]
    pub limits: Vec<String>,
    /// The memory its attempts may ask for together (bytes): `[worker] memory`, else the
    /// host's, or the worker's own cgroup limit where that is lower.
    pub memory_bytes: u64,
    /// The CPU its attempts may ask for together (millicores): `[worker] cpu`, else its cores.
    pub cpu_millis: u32,
    /// What its running attempts asked for.
    #[serde(default)]
    pub requested: Requested,
}

/// Memory and CPU asked for by attempts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requested {
    /// Bytes.
    pub memory_bytes: u64,
    /// Millicores.
    pub cpu_millis: u32,
}

impl Requested {
    /// What `resources` ask for (no memory or CPU asked: nothing).
    pub fn of(resources: &Resources) -> Self {
        Self {
            memory_bytes: resources.memory.map_or(0, |m| m.0),
            cpu_millis: resources.cpu.map_or(0, |c| c.0),
        }
    }

    /// Both added.
    pub fn plus(self, other: Self) -> Self {
        Self {
            memory_bytes: self.memory_bytes.saturating_add(other.memory_bytes),
            cpu_millis: self.cpu_millis.saturating_add(other.cpu_millis),
        }
    }
}

/// Why an attempt cannot go to a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lack {
    /// It cannot enforce this kind of limit.
    Limit(LimitKind),
    /// Not this much memory free (bytes free).
    Memory(u64),
    /// Not this much CPU free (millicores free).
    Cpu(u32),
}

impl Isolation {
    /// The room left with `also` asked for on top of what its heartbeat says runs.
    pub fn free(&self, also: Requested) -> Requested {
        let taken = self.requested.plus(also);
        Requested {
            memory_bytes: self.memory_bytes.saturating_sub(taken.memory_bytes),
            cpu_millis: self.cpu_millis.saturating_sub(taken.cpu_millis),
        }
    }

    /// What stops an attempt asking for `resources` from going to this worker, `also` being
    /// asked for there since its heartbeat; `None`: it fits.
    pub fn lacks(&self, resources: &Resources, also: Requested) -> Option<Lack> {
        self.lacks_within(resources, self.free(also))
    }

    /// What stops an attempt asking for `resources` from ever running on this worker, whatever
    /// runs there: a limit it cannot enforce, or more than it offers in all (`None`: it fits
    /// once its running attempts end). A broadcast's run waits at its worker for the room.
    pub fn never_fits(&self, resources: &Resources) -> Option<Lack> {
        let all = Requested {
            memory_bytes: self.memory_bytes,
            cpu_millis: self.cpu_millis,
        };
        self.lacks_within(resources, all)
    }

    /// What stops `resources` with `free` left.
    fn lacks_within(&self, resources: &Resources, free: Requested) -> Option<Lack> {
        if let Some(kind) = resources
            .kinds()
            .find(|kind| !self.limits.iter().any(|l| l == kind.name()))
        {
            return Some(Lack::Limit(kind));
        }
        let asked = Requested::of(resources);
        if asked.memory_bytes > free.memory_bytes {
            return Some(Lack::Memory(free.memory_bytes));
        }
        if asked.cpu_millis > free.cpu_millis {
            return Some(Lack::Cpu(free.cpu_millis));
        }
        None
    }
}

impl Isolation {
    /// Its walls in a few words, for a table: `cgroups: memory, cpu, pids`, `cgroups, no
    /// limits`, or `process groups only`.
    pub fn walls(&self) -> String {
        match (self.cgroups, self.limits.is_empty()) {
            (false, _) => "process groups only".into(),
            (true, true) => "cgroups, no limits".into(),
            (true, false) => format!("cgroups: {}", self.limits.join(", ")),
        }
    }

    /// Its room now, for a table: `6.0Gi of 8Gi, 3 of 4 CPU free`.
    pub fn room(&self) -> String {
        let free = self.free(Requested::default());
        format!(
            "{} of {}, {} of {} CPU free",
            about(free.memory_bytes),
            about(self.memory_bytes),
            Cpu(free.cpu_millis),
            Cpu(self.cpu_millis)
        )
    }
}

/// Why no worker has room for `resources`, from what each eligible worker lacks (the
/// message of an attempt waiting for room): `no worker with 4Gi memory free; largest 2Gi`.
pub fn nowhere(resources: &Resources, lacks: &[Lack]) -> String {
    let largest_memory = lacks
        .iter()
        .filter_map(|l| match l {
            Lack::Memory(free) => Some(*free),
            _ => None,
        })
        .max();
    let largest_cpu = lacks
        .iter()
        .filter_map(|l| match l {
            Lack::Cpu(free) => Some(*free),
            _ => None,
        })
        .max();
    match (largest_memory, largest_cpu, resources.memory, resources.cpu) {
        (Some(largest), _, Some(asked), _) => format!(
            "no worker with {asked} memory free; largest {}",
            about(largest)
        ),
        (None, Some(largest), _, Some(asked)) => {
            format!("no worker with {asked} CPU free; largest {}", Cpu(largest))
        }
        _ => {
            let mut limits: Vec<LimitKind> = lacks
                .iter()
                .filter_map(|l| match l {
                    Lack::Limit(kind) => Some(*kind),
                    _ => None,
                })
                .collect();
            limits.sort_unstable();
            limits.dedup();
            let names: Vec<&str> = limits.into_iter().map(LimitKind::name).collect();
            format!(
                "no live worker of its tags and executor can limit its {} (cgroups)",
                names.join(", ")
            )
        }
    }
}

/// `bytes` as a person reads it: whole in a binary unit where it is one (`2Gi`), else to a
/// tenth of the largest unit it reaches (`23.4Gi`).
pub fn about(bytes: u64) -> String {
    let whole = Memory(bytes).to_string();
    if !whole.chars().all(|c| c.is_ascii_digit()) || bytes < 1024 {
        return whole;
    }
    let (unit, suffix) = [(1u64 << 40, "Ti"), (1 << 30, "Gi"), (1 << 20, "Mi")]
        .into_iter()
        .find(|(unit, _)| bytes >= *unit)
        .unwrap_or((1 << 10, "Ki"));
    format!("{:.1}{suffix}", bytes as f64 / unit as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(limits: &[&str], memory: &str, cpu: &str) -> Isolation {
        Isolation {
            cgroups: !limits.is_empty(),
            said: String::new(),
            limits: limits.iter().map(|l| l.to_string()).collect(),
            memory_bytes: Memory::parse(memory).unwrap().0,
            cpu_millis: Cpu::parse(cpu).unwrap().0,
            requested: Requested::default(),
        }
    }

    fn asking(memory: Option<&str>, cpu: Option<&str>) -> Resources {
        Resources {
            memory: memory.map(|m| Memory::parse(m).unwrap()),
            cpu: cpu.map(|c| Cpu::parse(c).unwrap()),
            pids: None,
        }
    }

    #[test]
    fn an_attempt_fits_where_what_runs_and_what_was_sent_leave_room() {
        let mut w = worker(&["memory", "cpu", "pids"], "8Gi", "4");
        assert_eq!(
            w.lacks(&asking(Some("4Gi"), Some("2")), Requested::default()),
            None
        );
        w.requested = Requested::of(&asking(Some("3Gi"), Some("1")));
        let sent = Requested::of(&asking(Some("2Gi"), None));
        assert_eq!(
            w.lacks(&asking(Some("4Gi"), None), sent),
            Some(Lack::Memory(3 * 1024 * 1024 * 1024))
        );
        assert_eq!(w.lacks(&asking(Some("3Gi"), Some("3")), sent), None);
        assert_eq!(
            w.lacks(&asking(None, Some("3500m")), sent),
            Some(Lack::Cpu(3000))
        );
        // Asking nothing fits anywhere, even a full worker.
        w.requested = Requested::of(&asking(Some("8Gi"), Some("4")));
        assert_eq!(w.lacks(&Resources::default(), sent), None);
    }

    #[test]
    fn a_limit_the_worker_cannot_enforce_is_a_lack_whatever_its_room() {
        let w = worker(&[], "64Gi", "32");
        assert_eq!(
            w.lacks(&asking(Some("1Gi"), None), Requested::default()),
            Some(Lack::Limit(LimitKind::Memory))
        );
        let pids = Resources {
            pids: Some(10),
            ..Resources::default()
        };
        assert_eq!(
            worker(&["memory", "cpu"], "1Gi", "1").lacks(&pids, Requested::default()),
            Some(Lack::Limit(LimitKind::Pids))
        );
    }

    #[test]
    fn a_table_says_the_walls_and_the_room() {
        let mut w = worker(&["memory", "cpu"], "8Gi", "4");
        w.requested = Requested::of(&asking(Some("2Gi"), Some("1500m")));
        assert_eq!(w.walls(), "cgroups: memory, cpu");
        assert_eq!(w.room(), "6Gi of 8Gi, 2500m of 4 CPU free");
        assert_eq!(worker(&[], "1Gi", "1").walls(), "process groups only");
    }

    #[test]
    fn the_reason_names_the_request_and_the_largest_room() {
        let asked = asking(Some("4Gi"), None);
        let lacks = [
            Lack::Memory(1024 * 1024 * 1024),
            Lack::Memory(2 * 1024 * 1024 * 1024),
            Lack::Limit(LimitKind::Memory),
        ];
        assert_eq!(
            nowhere(&asked, &lacks),
            "no worker with 4Gi memory free; largest 2Gi"
        );
        assert_eq!(
            nowhere(&asking(None, Some("2")), &[Lack::Cpu(1500)]),
            "no worker with 2 CPU free; largest 1500m"
        );
        assert_eq!(
            nowhere(&asked, &[Lack::Memory(2_500_000_000)]),
            "no worker with 4Gi memory free; largest 2.3Gi"
        );
        assert_eq!(about(1536), "1.5Ki");
        assert_eq!(about(1000), "1000");
        assert_eq!(
            nowhere(&asked, &[Lack::Limit(LimitKind::Memory)]),
            "no live worker of its tags and executor can limit its memory (cgroups)"
        );
    }
}
