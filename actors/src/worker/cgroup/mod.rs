//! Walls between the attempts on a worker: each attempt of a process-based executor runs in a
//! cgroup of its own, below the worker's, with the job's `resources` as its limits.
//!
//! Why: a process group is the only other wall, and a command that leaves it (`setsid`, a
//! daemonising double fork) escapes the timeout, the kill, the lease fence and the worker-death
//! watcher; and without limits one job can take its host's memory, and the other jobs and the
//! worker with it. A cgroup holds every process the command starts, wherever it goes in its
//! session, is killed whole ([`attempt::AttemptCgroup::kill`]), counts what its processes used
//! (CPU time, peak memory) and tells an OOM kill apart from any other SIGKILL.
//!
//! Which hierarchies: cgroup v2 (one tree; `cgroup.kill`; the controllers the worker's subtree
//! was delegated) first, and the v1 hierarchies of the controllers v2 does not give (a hybrid
//! host: v1 `memory`, `pids`, `cpu`, `cpuacct`, and a v2 tree without controllers, used for
//! membership and the kill). The attempts' cgroups go in `ax-<worker>` below the worker's own
//! cgroup in each, so they count against whatever confines the worker; the limit counts the
//! attempt's own processes only — the command enters its cgroup after the watcher forked it
//! ([`super::lifeline`]), so neither the worker nor the watcher is in it. A restarted worker
//! kills and removes what its predecessor left there ([`Cgroups::reap`]).
//!
//! Where no cgroup can be written (an unprivileged container, a read-only `/sys/fs/cgroup`),
//! the worker runs its attempts in process groups as before and says so once at start; a job
//! with `resources` is refused by such a worker, never run unlimited.

mod attempt;
pub(crate) mod layout;

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use ax_bus::room::{Isolation, Requested};
use ax_bus::spec::resources::{LimitKind, Resources};

pub(crate) use attempt::{Accounted, AttemptCgroup};

/// Where a worker makes its attempts' cgroups (`[worker] cgroups`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CgroupSetting {
    /// Below the worker's own cgroups, found from `/proc/self/cgroup`.
    #[default]
    Auto,
    /// Nowhere: process groups only.
    Off,
    /// Below this cgroup v2 directory, delegated to the worker.
    Under(PathBuf),
}

/// How a worker keeps its attempts apart: each in a cgroup of its own, or — where it cannot
/// write one — in a process group only, and why.
#[derive(Debug)]
pub enum Confinement {
    /// Each attempt in a cgroup of its own.
    Cgroups(std::sync::Arc<Cgroups>),
    /// Process groups only.
    ProcessGroups {
        /// Why not cgroups.
        why: String,
    },
}

impl Confinement {
    /// Sets up the cgroups of `setting` for `worker`, giving attempts whose job sets no limit
    /// of a kind `defaults`' (where enforced), or says why it runs without.
    pub fn set_up(setting: &CgroupSetting, worker: &str, defaults: Resources) -> Self {
        match Cgroups::set_up(setting, worker) {
            Ok(mut cgroups) => {
                cgroups.defaults = defaults;
                Self::Cgroups(std::sync::Arc::new(cgroups))
            }
            Err(why) => Self::ProcessGroups { why },
        }
    }

    /// What it is, in a few words, for the worker's start, `ax worker list` and the workers page.
    pub fn describe(&self) -> String {
        match self {
            Self::Cgroups(cgroups) => cgroups.describe(),
            Self::ProcessGroups { why } => {
                format!("process groups only, no resource limits: {why}")
            }
        }
    }

    /// How it stands for the heartbeat, offering attempts `offer` (`[worker] memory` and
    /// `cpu`; by default the host's memory — or the limit above the worker's cgroup, where
    /// lower — and its cores), nothing asked for yet.
    pub(crate) fn isolation(&self, offer: Offer) -> Isolation {
        let (cgroups, limits, ceiling) = match self {
            Self::Cgroups(cgroups) => (true, cgroups.limits(), cgroups.memory_ceiling()),
            Self::ProcessGroups { .. } => (false, Vec::new(), None),
        };
        let host = crate::runtime::host::memory().unwrap_or(0);
        Isolation {
            cgroups,
            said: self.describe(),
            limits,
            memory_bytes: offer
                .memory
                .unwrap_or_else(|| ceiling.map_or(host, |c| c.min(host))),
            cpu_millis: offer
                .cpu
                .unwrap_or_else(|| crate::runtime::host::cores().saturating_mul(1000)),
            requested: Requested::default(),
        }
    }
}

/// What a worker offers the attempts that ask for resources, where its config says
/// (`[worker] memory`, `cpu`); the host's otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offer {
    /// Bytes.
    pub memory: Option<u64>,
    /// Millicores.
    pub cpu: Option<u32>,
}

/// What a place's cgroups are used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Controller {
    /// The memory limit, the peak and the OOM kills.
    Memory,
    /// The process limit.
    Pids,
    /// The CPU limit.
    Cpu,
    /// The CPU time used.
    CpuUsage,
}

impl Controller {
    /// Its name in a v1 hierarchy's list and in v2's `cgroup.controllers` (none for the CPU
    /// time, which every v2 cgroup counts).
    fn names(self) -> (&'static str, Option<&'static str>) {
        match self {
            Self::Memory => ("memory", Some("memory")),
            Self::Pids => ("pids", Some("pids")),
            Self::Cpu => ("cpu", Some("cpu")),
            Self::CpuUsage => ("cpuacct", None),
        }
    }

    const ALL: [Self; 4] = [Self::Memory, Self::Pids, Self::Cpu, Self::CpuUsage];
}

impl From<LimitKind> for Controller {
    fn from(kind: LimitKind) -> Self {
        match kind {
            LimitKind::Memory => Self::Memory,
            LimitKind::Cpu => Self::Cpu,
            LimitKind::Pids => Self::Pids,
        }
    }
}

/// One hierarchy the worker makes attempts' cgroups in: the directory they go in, and what they
/// are used for there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    /// `ax-<worker>` below the worker's cgroup.
    pub(crate) dir: PathBuf,
    /// The v2 tree (membership and the kill).
    pub(crate) unified: bool,
    /// What it limits or counts.
    pub(crate) serves: Vec<Controller>,
}

impl Place {
    pub(crate) fn serves(&self, controller: Controller) -> bool {
        self.serves.contains(&controller)
    }

    /// Whether an attempt with `resources` goes in this place: the v2 tree always (its kill),
    /// a v1 hierarchy only for what it counts (memory, CPU time) or a limit asked for. Each
    /// entry costs the command about 400 µs of the kernel's (a cgroup move waits for an RCU
    /// grace period), so a pids hierarchy is left out where no `pids` limit is asked.
    pub(crate) fn needed_for(&self, resources: &Resources) -> bool {
        self.unified
            || self.serves.iter().any(|c| match c {
                Controller::Memory | Controller::CpuUsage => true,
                Controller::Cpu => resources.cpu.is_some(),
                Controller::Pids => resources.pids.is_some(),
            })
    }
}

/// The cgroups a worker confines its attempts in.
#[derive(Debug)]
pub struct Cgroups {
    places: Vec<Place>,
    /// The limits of an attempt whose job sets none of that kind (`[worker.limits]`).
    defaults: Resources,
}

impl Cgroups {
    /// Finds where this worker may make cgroups and checks that it can (a probe cgroup made and
    /// removed in each place); why not, when it cannot anywhere.
    pub fn set_up(setting: &CgroupSetting, worker: &str) -> Result<Self, String> {
        let hierarchies = match setting {
            CgroupSetting::Off => return Err("cgroups are off ([worker] cgroups = \"off\")".into()),
            CgroupSetting::Auto => layout::of_this_process(),
            CgroupSetting::Under(dir) => vec![layout::Hierarchy {
                unified: true,
                controllers: Vec::new(),
                dir: dir.clone(),
            }],
        };
        let name = format!("ax-{worker}");
        let mut places: Vec<Place> = Vec::new();
        let mut problems = Vec::new();
        // The v2 tree first: what it gives, no v1 hierarchy is needed for.
        let mut ordered = hierarchies;
        ordered.sort_by_key(|h| !h.unified);
        for hierarchy in ordered {
            match place_in(&hierarchy, &name, &places) {
                Ok(Some(place)) => places.push(place),
                Ok(None) => {}
                Err(e) => problems.push(format!("{}: {e}", hierarchy.dir.display())),
            }
        }
        if places.is_empty() {
            return Err(if problems.is_empty() {
                "no cgroup hierarchy is mounted".to_string()
            } else {
                problems.join("; ")
            });
        }
        let cgroups = Self {
            places,
            defaults: Resources::default(),
        };
        cgroups
            .probe()
            .map_err(|e| format!("cannot make an attempt's cgroup: {e}"))?;
        Ok(cgroups)
    }

    /// Makes and removes one cgroup with every limit this worker enforces.
    fn probe(&self) -> io::Result<()> {
        let resources = Resources {
            memory: self
                .enforces(Controller::Memory)
                .then_some(ax_bus::spec::resources::Memory(64 << 20)),
            cpu: self
                .enforces(Controller::Cpu)
                .then_some(ax_bus::spec::resources::Cpu(1000)),
            pids: self.enforces(Controller::Pids).then_some(64),
        };
        let probe = AttemptCgroup::make(
            &self.places,
            &format!("probe-{}", std::process::id()),
            &resources,
        )?;
        drop(probe);
        Ok(())
    }

    fn enforces(&self, controller: Controller) -> bool {
        self.places.iter().any(|p| p.serves(controller))
    }

    /// The limits it enforces (`memory`, `cpu`, `pids`), as the heartbeat names them.
    pub(crate) fn limits(&self) -> Vec<String> {
        LimitKind::ALL
            .into_iter()
            .filter(|kind| self.enforces((*kind).into()))
            .map(|kind| kind.name().to_string())
            .collect()
    }

    /// The lowest memory limit of the worker's own cgroup and those above it (bytes), which
    /// its attempts' cgroups count against; none where nothing above limits memory.
    pub(crate) fn memory_ceiling(&self) -> Option<u64> {
        let place = self.places.iter().find(|p| p.serves(Controller::Memory))?;
        let file = if place.unified {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        place
            .dir
            .ancestors()
            .skip(1)
            .take(64)
            .map_while(|dir| std::fs::read_to_string(dir.join(file)).ok())
            .filter_map(|text| text.trim().parse::<u64>().ok())
            // v1 writes "no limit" as a page-rounded i64::MAX.
            .filter(|&limit| limit < 1 << 62)
            .min()
    }

    /// What this worker enforces, in a few words (`memory, pids, cpu; cgroup v1 and v2`).
    pub fn describe(&self) -> String {
        let limits = self.limits();
        let versions = match (
            self.places.iter().any(|p| p.unified),
            self.places.iter().any(|p| !p.unified),
        ) {
            (true, true) => "cgroup v1 and v2",
            (true, false) => "cgroup v2",
            _ => "cgroup v1",
        };
        if limits.is_empty() {
            format!("{versions}: each attempt in its own cgroup, no limits")
        } else {
            format!(
                "{versions}: each attempt in its own cgroup, limits on {}",
                limits.join(", ")
            )
        }
    }

    /// Whether this worker can enforce every limit of `resources`; which it cannot, if not.
    pub(crate) fn refusal(&self, resources: &Resources) -> Option<String> {
        let missing: Vec<&str> = resources
            .kinds()
            .filter(|kind| !self.enforces((*kind).into()))
            .map(LimitKind::name)
            .collect();
        (!missing.is_empty()).then(|| {
            format!(
                "this worker cannot limit {} ({})",
                missing.join(", "),
                self.describe()
            )
        })
    }

    /// The limits of an attempt whose job asks for `resources`: those, and the worker's
    /// default of each kind the job leaves unset, where this worker enforces it.
    pub(crate) fn limits_for(&self, resources: &Resources) -> Resources {
        let default = |controller| {
            if self.enforces(controller) {
                self.defaults
            } else {
                Resources::default()
            }
        };
        Resources {
            memory: resources.memory.or(default(Controller::Memory).memory),
            cpu: resources.cpu.or(default(Controller::Cpu).cpu),
            pids: resources.pids.or(default(Controller::Pids).pids),
        }
    }

    /// Makes the cgroup of the attempt `name` (its trace id) with `resources`' limits.
    pub(crate) fn attempt(&self, name: &str, resources: &Resources) -> io::Result<AttemptCgroup> {
        let places: Vec<Place> = self
            .places
            .iter()
            .filter(|p| p.needed_for(resources))
            .cloned()
            .collect();
        AttemptCgroup::make(&places, name, resources)
    }

    /// Kills and removes every attempt's cgroup a predecessor of this worker left (it died
    /// with attempts running, their watchers with it or not).
    pub fn reap(&self) -> usize {
        let mut names = std::collections::BTreeSet::new();
        for place in &self.places {
            for entry in std::fs::read_dir(&place.dir)
                .into_iter()
                .flatten()
                .flatten()
            {
                if entry.path().is_dir() {
                    names.insert(entry.file_name().to_string_lossy().into_owned());
                }
            }
        }
        let reaped = names.len();
        for name in names {
            // Made again in every place (emptied on the way) and dropped: killed and removed.
            match AttemptCgroup::make(&self.places, &name, &Resources::default()) {
                Ok(left) => drop(left),
                Err(e) => {
                    tracing::warn!(cgroup = %name, error = %e, "a cgroup left by an earlier run of this worker was not removed")
                }
            }
        }
        reaped
    }
}

impl Drop for Cgroups {
    /// Removes the worker's own directories once it stops, where no attempt's is left in them.
    fn drop(&mut self) {
        for place in &self.places {
            let _ = std::fs::remove_dir(&place.dir);
        }
    }
}

/// The place of `hierarchy` for this worker's attempts (`name` below its cgroup), serving what
/// no place in `taken` serves already; none when it would serve nothing.
fn place_in(
    hierarchy: &layout::Hierarchy,
    name: &str,
    taken: &[Place],
) -> io::Result<Option<Place>> {
    let free = |c: Controller| !taken.iter().any(|p| p.serves(c));
    let dir = hierarchy.dir.join(name);
    let serves: Vec<Controller> = if hierarchy.unified {
        let available = v2_controllers(&hierarchy.dir, &dir)?;
        Controller::ALL
            .into_iter()
            .filter(|c| match c.names().1 {
                Some(v2) => available.iter().any(|a| a == v2),
                None => true,
            })
            .collect()
    } else {
        Controller::ALL
            .into_iter()
            .filter(|c| free(*c) && hierarchy.has(c.names().0))
            .collect()
    };
    // The v2 tree holds every attempt, limits or not (its kill); a v1 hierarchy only for what
    // it adds.
    if !hierarchy.unified && serves.is_empty() {
        return Ok(None);
    }
    if !hierarchy.unified {
        std::fs::create_dir_all(&dir)?;
    }
    Ok(Some(Place {
        dir,
        unified: hierarchy.unified,
        serves,
    }))
}

/// Makes `dir` below the v2 cgroup `own` and hands its children every controller `own` can
/// give: the controllers `dir`'s attempts may use. A cgroup with processes of its own cannot
/// hand controllers down (v2's rule), so this process first moves into a leaf of its own
/// (`own/worker`), as a service with a delegated subtree does.
fn v2_controllers(own: &Path, dir: &Path) -> io::Result<Vec<String>> {
    let read = |path: PathBuf| std::fs::read_to_string(path).unwrap_or_default();
    let wanted: Vec<String> = read(own.join("cgroup.controllers"))
        .split_whitespace()
        .filter(|c| matches!(*c, "memory" | "pids" | "cpu"))
        .map(str::to_string)
        .collect();
    let enable = |at: &Path| -> io::Result<()> {
        if wanted.is_empty() {
            return Ok(());
        }
        let line: Vec<String> = wanted.iter().map(|c| format!("+{c}")).collect();
        std::fs::OpenOptions::new()
            .write(true)
            .open(at.join("cgroup.subtree_control"))?
            .write_all(line.join(" ").as_bytes())
    };
    if let Err(e) = enable(own) {
        if e.raw_os_error() != Some(nix::libc::EBUSY) {
            return Err(e);
        }
        let leaf = own.join("worker");
        std::fs::create_dir_all(&leaf)?;
        std::fs::OpenOptions::new()
            .write(true)
            .open(leaf.join("cgroup.procs"))?
            .write_all(b"0")?;
        enable(own)?;
    }
    std::fs::create_dir_all(dir)?;
    enable(dir)?;
    Ok(read(dir.join("cgroup.subtree_control"))
        .split_whitespace()
        .map(str::to_string)
        .collect())
}

#[cfg(test)]
mod tests;
