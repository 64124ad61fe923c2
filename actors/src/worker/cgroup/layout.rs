//! Where this process's cgroups are: for each mounted cgroup hierarchy (v1, one per controller
//! or group of controllers; v2, the one unified tree), the directory of the cgroup this process
//! is in, read from `/proc/self/cgroup` and `/proc/self/mountinfo`. A worker makes its
//! attempts' cgroups below these, so that they count against whatever confines the worker and
//! never reach outside the subtree it was given.

use std::path::{Path, PathBuf};

/// One hierarchy, and this process's cgroup in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hierarchy {
    /// v2's unified tree, or a v1 hierarchy.
    pub(crate) unified: bool,
    /// Its v1 controllers (`memory`, `pids`, `cpu`, `cpuacct`, `freezer`, …); none for v2.
    pub(crate) controllers: Vec<String>,
    /// The directory of this process's cgroup in it.
    pub(crate) dir: PathBuf,
}

impl Hierarchy {
    /// Whether it is the v1 hierarchy of `controller`.
    pub(crate) fn has(&self, controller: &str) -> bool {
        self.controllers.iter().any(|c| c == controller)
    }
}

/// The hierarchies of `/proc/self/cgroup` (`id:controllers:path` lines) that `mountinfo` shows
/// mounted, each with the directory of the path under its mount.
pub(crate) fn parse(proc_cgroup: &str, mountinfo: &str) -> Vec<Hierarchy> {
    let mounts: Vec<Mount> = mountinfo.lines().filter_map(Mount::parse).collect();
    let mut found = Vec::new();
    for line in proc_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let unified = controllers.is_empty();
        let controllers: Vec<String> = controllers
            .split(',')
            .filter(|c| !c.is_empty() && !c.starts_with("name="))
            .map(str::to_string)
            .collect();
        if !unified && controllers.is_empty() {
            // A named hierarchy (`name=systemd`) with no controller: nothing to limit with.
            continue;
        }
        let mount = mounts.iter().find(|m| {
            if unified {
                m.fstype == "cgroup2"
            } else {
                m.fstype == "cgroup" && controllers.iter().all(|c| m.options.contains(c))
            }
        });
        let Some(mount) = mount else {
            continue;
        };
        // The path is relative to the hierarchy's root; the mount may show a part of it.
        let Ok(below) = Path::new(path).strip_prefix(&mount.root) else {
            continue;
        };
        found.push(Hierarchy {
            unified,
            controllers,
            dir: mount.point.join(below),
        });
    }
    found
}

/// A cgroup filesystem mount of `mountinfo`.
struct Mount {
    /// The part of the hierarchy mounted (`/` for all of it).
    root: PathBuf,
    point: PathBuf,
    fstype: String,
    /// Its superblock options (`rw,memory`).
    options: Vec<String>,
}

impl Mount {
    /// A `mountinfo` line: `id parent major:minor root point options [optional…] - fstype
    /// source superoptions`.
    fn parse(line: &str) -> Option<Self> {
        let (before, after) = line.split_once(" - ")?;
        let mut before = before.split(' ');
        let root = unescape(before.nth(3)?);
        let point = unescape(before.next()?);
        let mut after = after.split(' ');
        let fstype = after.next()?.to_string();
        if fstype != "cgroup" && fstype != "cgroup2" {
            return None;
        }
        let options = after.nth(1)?.split(',').map(str::to_string).collect();
        Some(Self {
            root: PathBuf::from(root),
            point: PathBuf::from(point),
            fstype,
            options,
        })
    }
}

/// `mountinfo` writes a space, a tab, a newline and a backslash as octal escapes.
fn unescape(field: &str) -> String {
    field
        .replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// This process's hierarchies, read now (none where `/proc` cannot be read).
pub(crate) fn of_this_process() -> Vec<Hierarchy> {
    let read = |path| std::fs::read_to_string(path).unwrap_or_default();
    parse(&read("/proc/self/cgroup"), &read("/proc/self/mountinfo"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This kind of machine: v1 hierarchies per controller, the unified tree with none, the
    /// memory cgroup a path of its own.
    const HYBRID_CGROUP: &str = "9:name=systemd:/\n8:pids:/\n6:freezer:/\n4:memory:/process_api/abc\n2:cpuacct:/\n1:cpu:/\n0::/\n";
    const HYBRID_MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
";

    #[test]
    fn a_hybrid_host_has_a_cgroup_per_controller_and_the_unified_tree() {
        let found = parse(HYBRID_CGROUP, HYBRID_MOUNTS);
        let dirs: Vec<(&str, &str)> = found
            .iter()
            .map(|h| {
                (
                    h.controllers.first().map_or("", String::as_str),
                    h.dir.to_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            dirs,
            [
                ("pids", "/sys/fs/cgroup/pids/"),
                ("freezer", "/sys/fs/cgroup/freezer/"),
                ("memory", "/sys/fs/cgroup/memory/process_api/abc"),
                ("cpuacct", "/sys/fs/cgroup/cpuacct/"),
                ("cpu", "/sys/fs/cgroup/cpu/"),
                ("", "/sys/fs/cgroup/unified/"),
            ]
        );
        assert!(found[5].unified);
        assert!(found[2].has("memory"));
    }

    /// A pure v2 host under systemd, the worker's service delegated its subtree; a container
    /// whose namespace shows its own cgroup as the root.
    #[test]
    fn a_v2_host_has_one_tree_and_a_container_sees_its_own_root() {
        let mounts = "25 20 0:23 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let found = parse("0::/system.slice/ax-worker.service\n", mounts);
        assert_eq!(
            found,
            [Hierarchy {
                unified: true,
                controllers: Vec::new(),
                dir: "/sys/fs/cgroup/system.slice/ax-worker.service".into(),
            }]
        );
        let bind = "25 20 0:23 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n";
        let found = parse("0::/docker/abc/inner\n", bind);
        assert_eq!(found[0].dir, PathBuf::from("/sys/fs/cgroup/inner"));
        // A hierarchy that is not mounted, or a path outside what is: nothing.
        assert!(parse("0::/elsewhere\n", bind).is_empty());
        assert!(parse("4:memory:/x\n", mounts).is_empty());
    }
}
