//! Process groups a previous process of this worker may have left running.
//!
//! The watcher of each command (see [`super::lifeline`]) kills the command's group when the
//! worker dies. Should the watcher die with the worker (both chosen by the OOM killer, a kill
//! sent to each), the group could outlive them. So each running group is also recorded in the
//! worker's data directory — a file named by the group id, created empty by the watcher itself
//! before it forks the command (so no command runs unrecorded), then given its leader's start
//! time by the worker — and removed once the group is killed; a worker starting kills every group still recorded before
//! it takes a dispatch, so it never declares an attempt lost, letting a new attempt start,
//! while processes of the old one may still run.
//!
//! The start time tells a group of ours from an unrelated one that took a reused id: while any
//! member of a group lives its id is not given to another process, so a group whose leader is
//! gone is still ours; a live leader must have the recorded start time (or, on a record still
//! empty, have started before the record was written).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// How long a starting worker waits for the groups it killed to be gone.
const REAP_WAIT: Duration = Duration::from_secs(5);

/// Where the groups of the attempts run with `scratch` as their scratch directory are recorded.
pub(crate) fn dir(scratch: &Path) -> PathBuf {
    scratch.join("groups")
}

/// The record of one running group; removed when dropped.
#[derive(Debug)]
pub(crate) struct GroupRecord {
    path: PathBuf,
}

impl GroupRecord {
    /// Records `group` (led by the process of the same id) in `dir`, which its watcher made
    /// (see [`super::lifeline::Lifeline::arm`]) and recorded it in first.
    pub(crate) fn write(dir: &Path, group: Pid) -> std::io::Result<Self> {
        let started = start_time(group)
            .ok_or_else(|| std::io::Error::other(format!("process {group} is gone")))?;
        let path = dir.join(group.to_string());
        std::fs::write(&path, started.to_string())?;
        Ok(Self { path })
    }
}

impl Drop for GroupRecord {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Kills every group recorded in `dir` that still runs, waits (a few seconds at most) until
/// they are gone and clears the records. Returns the groups killed.
pub(crate) fn reap(dir: &Path) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut killed = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let group = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<i32>().ok())
            .filter(|&id| id > 1)
            .map(Pid::from_raw);
        let started = std::fs::read_to_string(&path)
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok());
        let written = entry.metadata().and_then(|m| m.modified()).ok();
        if let Some(group) = group {
            let ours = match (started, written) {
                (Some(started), _) => ours(group, started),
                // Recorded by its watcher, its start time not added yet by the worker.
                (None, Some(written)) => ours_unstamped(group, written),
                (None, None) => false,
            };
            if ours && killpg(group, Signal::SIGKILL).is_ok() {
                tracing::warn!(group = %group, "killed a process group a previous process of this worker left running");
                killed.push(group);
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    let deadline = Instant::now() + REAP_WAIT;
    while killed.iter().any(|&group| lives(group)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    killed
}

/// Removes the records of groups no longer running (a spawn that failed leaves its watcher's).
pub(crate) fn clear_ended(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let group = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<i32>().ok())
            .map(Pid::from_raw);
        if group.is_some_and(|group| !lives(group)) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Whether `group`, recorded with its leader's start time `started`, is still that group.
fn ours(group: Pid, started: u64) -> bool {
    if !lives(group) {
        return false;
    }
    match start_time(group) {
        // Leader gone, group alive: the id cannot have been reused.
        None => true,
        Some(now) => now == started,
    }
}

/// Whether `group`, recorded by its leader (the watcher) at `written` without a start time, is
/// still that group: a live leader must have started before the record was written (a later
/// one took a reused id).
fn ours_unstamped(group: Pid, written: std::time::SystemTime) -> bool {
    if !lives(group) {
        return false;
    }
    match start_time(group) {
        None => true,
        Some(ticks) => {
            started_at(ticks).is_some_and(|started| started <= written + Duration::from_secs(1))
        }
    }
}

/// The wall-clock time of a process start given in clock ticks after boot.
fn started_at(ticks: u64) -> Option<std::time::SystemTime> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let boot: u64 = stat
        .lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|t| u64::try_from(t).ok())
        .filter(|t| *t > 0)?;
    let since_boot = Duration::from_millis(ticks.saturating_mul(1000) / per_second);
    Some(std::time::UNIX_EPOCH + Duration::from_secs(boot) + since_boot)
}

/// Whether a process of `group` still runs (zombies waiting to be reaped do not count).
fn lives(group: Pid) -> bool {
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return killpg(group, None).is_ok();
    };
    processes
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| stat_fields(Pid::from_raw(pid)))
        .any(|fields| {
            fields
                .first()
                .is_some_and(|state| state != "Z" && state != "X")
                && fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(group.as_raw())
        })
}

/// The start time of process `pid` (clock ticks after boot, from `/proc`).
fn start_time(pid: Pid) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// The fields of `/proc/<pid>/stat` from the third (the state) on: the command name before
/// them may hold spaces.
fn stat_fields(pid: Pid) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    fn group(script: &str) -> std::process::Child {
        std::process::Command::new("/bin/sh")
            .args(["-c", script])
            .process_group(0)
            .spawn()
            .unwrap()
    }

    /// Kills `child`'s whole group (the shell may have forked its `sleep`, which would outlive
    /// a kill of the shell alone, holding the test's output) and reaps the shell.
    fn end(mut child: std::process::Child) {
        killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_recorded_group_is_killed_and_its_record_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = group("sleep 300 & sleep 300");
        let id = Pid::from_raw(child.id() as i32);
        let record = GroupRecord::write(dir.path(), id).unwrap();
        // The worker died: its record stays behind.
        std::mem::forget(record);
        assert_eq!(reap(dir.path()), vec![id]);
        assert!(!lives(id), "the group is gone");
        child.wait().unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_reused_group_id_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let child = group("sleep 300");
        let id = Pid::from_raw(child.id() as i32);
        // A record of the same id with another start time: another process had it.
        std::fs::write(dir.path().join(id.to_string()), "1").unwrap();
        assert!(reap(dir.path()).is_empty());
        assert!(killpg(id, None).is_ok(), "an unrelated group was killed");
        end(child);
    }

    #[test]
    fn a_group_its_watcher_recorded_is_killed_before_the_worker_added_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let mut command = std::process::Command::new("/bin/sh");
        command
            .args(["-c", "sleep 300 & sleep 300"])
            .process_group(0);
        let lifeline = crate::worker::lifeline::Lifeline::arm(
            &mut command,
            Some(dir.path()),
            crate::worker::lifeline::CgroupFds::default(),
        )
        .unwrap();
        let mut child = command.spawn().unwrap();
        let id = Pid::from_raw(child.id() as i32);
        // The worker died before it wrote its record: only the watcher's empty one is there.
        let recorded = std::fs::read_to_string(dir.path().join(id.to_string())).unwrap();
        assert_eq!(
            recorded, "",
            "recorded by the watcher before the command ran"
        );
        assert_eq!(reap(dir.path()), vec![id]);
        assert!(!lives(id), "the group is gone");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        drop(lifeline);
        child.wait().unwrap();
    }

    #[test]
    fn an_unstamped_record_older_than_its_groups_leader_is_not_ours() {
        let child = group("sleep 300");
        let now = std::time::SystemTime::now();
        // A record a minute older than the process that now has the id is not that group's.
        let ours = [now - Duration::from_secs(60), now]
            .map(|written| ours_unstamped(Pid::from_raw(child.id() as i32), written));
        end(child);
        assert_eq!(ours, [false, true]);
    }

    #[test]
    fn a_finished_attempt_leaves_no_record() {
        let dir = tempfile::tempdir().unwrap();
        let child = group("sleep 300");
        let id = Pid::from_raw(child.id() as i32);
        drop(GroupRecord::write(dir.path(), id).unwrap());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        end(child);
    }
}
