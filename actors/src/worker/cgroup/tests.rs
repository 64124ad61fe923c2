//! Attempts in cgroups, with real processes on this kind of machine (root, hybrid cgroups): what
//! left its process group is killed at every end, the OOM killer's kill is told as one, the
//! CPU limit holds, and what is counted agrees with what ran.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ax_bus::spec::resources::{Cpu, Memory, Resources};
use tokio::sync::Notify;

use super::*;
use crate::worker::process::tests::sh;
use crate::worker::process::{self, Confine, Exit};

/// Cgroups of a worker of its own (a fresh name per test: tests run side by side).
fn cgroups() -> Arc<Cgroups> {
    let name = format!("test-{}", ax_bus::ids::TraceId::random());
    match Cgroups::set_up(&CgroupSetting::Auto, &name) {
        Ok(cgroups) => Arc::new(cgroups),
        Err(why) => panic!("this kind of machine makes cgroups as root: {why}"),
    }
}

fn confined(script: &str, timeout_ms: u64, resources: Resources) -> process::ProcessSpec {
    process::ProcessSpec {
        confine: Some(Confine {
            cgroups: cgroups(),
            name: ax_bus::ids::TraceId::random().to_string(),
            resources,
        }),
        ..sh(script, timeout_ms)
    }
}

/// Whether process `pid` is gone (a zombie counts: the reaper here is late, NOTES.md).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Waits up to 5 s for `pid` to be gone.
async fn until_gone(pid: i32) -> bool {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if gone(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// A command that starts a `sleep` in a session of its own (its pid written to `pid_file`,
/// its output nowhere), then `rest`s.
fn escaping(pid_file: &std::path::Path, rest: &str) -> String {
    format!(
        "setsid sh -c 'echo $$ > {}; exec sleep 600' </dev/null >/dev/null 2>&1 & sleep 0.3; {rest}",
        pid_file.display()
    )
}

fn escaped_pid(pid_file: &std::path::Path) -> i32 {
    std::fs::read_to_string(pid_file)
        .ok()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in {}", pid_file.display()))
}

#[tokio::test]
async fn what_left_its_process_group_is_killed_at_a_timeout_a_cancel_and_a_normal_end() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let timed_out = process::run(
        &confined(
            &escaping(&pid_file, "sleep 30"),
            1_500,
            Resources::default(),
        ),
        None,
    )
    .await;
    assert_eq!(timed_out.exit, Exit::TimedOut);
    assert!(
        until_gone(escaped_pid(&pid_file)).await,
        "escaped a timeout"
    );

    let cancel = Arc::new(Notify::new());
    let spec = confined(
        &escaping(&pid_file, "sleep 30"),
        60_000,
        Resources::default(),
    );
    let stop = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            cancel.notify_one();
        })
    };
    let cancelled = process::run(&spec, Some(&cancel)).await;
    stop.await.unwrap();
    assert_eq!(cancelled.exit, Exit::Cancelled);
    assert!(until_gone(escaped_pid(&pid_file)).await, "escaped a kill");

    let ended = process::run(
        &confined(&escaping(&pid_file, "exit 0"), 60_000, Resources::default()),
        None,
    )
    .await;
    assert_eq!(ended.exit, Exit::Code(0));
    assert!(
        until_gone(escaped_pid(&pid_file)).await,
        "outlived its attempt"
    );

    // Without a cgroup it escapes: the wall the cgroup adds.
    let plain = process::run(&sh(&escaping(&pid_file, "exit 0"), 60_000), None).await;
    assert_eq!(plain.exit, Exit::Code(0));
    let pid = escaped_pid(&pid_file);
    assert!(!gone(pid), "a process group alone should not reach it");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

#[tokio::test]
async fn an_attempt_over_its_memory_limit_is_told_oom_killed_with_its_limit_and_peak() {
    let limit = Memory(64 << 20);
    let resources = Resources {
        memory: Some(limit),
        ..Resources::default()
    };
    let script = "python3 -c 'x = bytearray(256 * 1024 * 1024); print(len(x))'";
    let end = process::run(&confined(script, 60_000, resources), None).await;
    let accounted = end.accounted.expect("counted in its cgroup");
    assert!(accounted.oom_killed, "{end:?}");
    assert_eq!(accounted.memory_limit, Some(limit.0));
    let peak = accounted.usage.peak_memory_bytes.expect("a peak");
    assert!(peak > 32 << 20 && peak <= limit.0, "peak {peak}");
    let result = crate::worker::executor::child::result_of(
        &end,
        Duration::from_secs(60),
        &Default::default(),
    );
    assert_eq!(result.tag, ax_bus::Tag::OomKilled);
    assert!(
        result
            .message
            .starts_with("killed by the OOM killer: over its memory limit of 64Mi (peak "),
        "{}",
        result.message
    );
    // Within its limit the same program succeeds, its peak counted.
    let fits = Resources {
        memory: Some(Memory(512 << 20)),
        ..Resources::default()
    };
    let counted = "python3 -c 'import resource; x = bytearray(256 * 1024 * 1024); print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)'";
    let end = process::run(&confined(counted, 60_000, fits), None).await;
    assert_eq!(end.exit, Exit::Code(0), "{end:?}");
    let accounted = end.accounted.unwrap();
    assert!(!accounted.oom_killed);
    let peak = accounted.usage.peak_memory_bytes.unwrap() as f64;
    // Within 10 % of the kernel's count of the process's largest resident set (KiB).
    let own = end.stdout_tail.trim().parse::<f64>().expect("its max RSS") * 1024.0;
    assert!(
        (peak - own).abs() <= own * 0.1,
        "cgroup peak {peak}, the process's max RSS {own}"
    );
}

#[tokio::test]
async fn cpu_time_is_counted_as_the_process_used_it_and_held_to_its_limit() {
    // One second of CPU, counted by the process itself.
    // A second of CPU, then the kernel's count of the shell and all it waited for (`times`:
    // the shell's user and system time, then its children's).
    let spin = "python3 -c '\nimport time\nwhile time.process_time() < 1.0: pass\n'; times";
    let end = process::run(&confined(spin, 60_000, Resources::default()), None).await;
    assert_eq!(end.exit, Exit::Code(0), "{end:?}");
    let cpu_ms = end.accounted.unwrap().usage.cpu_ms.expect("cpu time") as f64;
    let counted_ms: f64 = end
        .stdout_tail
        .split_whitespace()
        .map(|t| {
            let (minutes, seconds) = t.trim_end_matches('s').split_once('m').expect("XmY.Ys");
            minutes.parse::<f64>().unwrap() * 60_000.0 + seconds.parse::<f64>().unwrap() * 1000.0
        })
        .sum();
    assert!(counted_ms >= 1000.0, "{}", end.stdout_tail);
    // Within 10 % (and the 10 ms ticks `times` counts in) of the kernel's count of the tree.
    assert!(
        (cpu_ms - counted_ms).abs() <= counted_ms * 0.1 + 20.0,
        "cgroup {cpu_ms} ms, the kernel's count of the processes {counted_ms} ms"
    );

    let half = Resources {
        cpu: Some(Cpu(500)),
        ..Resources::default()
    };
    let busy = "timeout 2 sh -c 'while :; do :; done'; true";
    let started = Instant::now();
    let end = process::run(&confined(busy, 60_000, half), None).await;
    let wall = started.elapsed().as_millis() as f64;
    let used = end.accounted.unwrap().usage.cpu_ms.unwrap() as f64;
    // Held to half a core; on a loaded box it may get less, never more.
    let share = used / wall;
    assert!(
        share <= 0.6,
        "a busy loop limited to 0.5 used {share:.2} of a core"
    );
    assert!(
        share >= 0.2,
        "a busy loop limited to 0.5 used only {share:.2} of a core"
    );
}

#[tokio::test]
async fn the_watcher_kills_what_left_its_process_group_when_the_worker_dies() {
    use std::os::unix::process::CommandExt;
    let cgroups = cgroups();
    let cgroup = cgroups
        .attempt("worker-died", &Resources::default())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("escaped.pid");
    let mut command = std::process::Command::new("/bin/sh");
    command
        .args(["-c", &escaping(&pid_file, "sleep 600")])
        .process_group(0);
    let lifeline =
        crate::worker::lifeline::Lifeline::arm(&mut command, None, cgroup.fds()).unwrap();
    let mut child = command.spawn().unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while !pid_file.exists() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let escaped = escaped_pid(&pid_file);
    assert!(!gone(escaped));
    // The worker's end of the lifeline goes as it does when the worker dies; its cgroup is
    // kept (nothing of the worker runs to kill it).
    drop(lifeline);
    assert!(
        until_gone(escaped).await,
        "{escaped} left its group and outlived its worker"
    );
    let _ = child.wait();
    drop(cgroup);
}

#[tokio::test]
async fn a_restarted_worker_kills_and_removes_what_its_predecessor_left() {
    let name = format!("test-{}", ax_bus::ids::TraceId::random());
    let before = Cgroups::set_up(&CgroupSetting::Auto, &name).unwrap();
    // With pids and cpu limits: in every hierarchy, those entered only for a limit included.
    let every_place = Resources {
        pids: Some(64),
        cpu: Some(Cpu(500)),
        ..Resources::default()
    };
    let left = before.attempt("left-behind", &every_place).unwrap();
    assert_eq!(left.dirs().len(), before.places.len());
    let mut child = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let dirs = left.dirs();
    for dir in &dirs {
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }
    // The worker died: nothing removed it.
    std::mem::forget(left);
    let after = Cgroups::set_up(&CgroupSetting::Auto, &name).unwrap();
    assert_eq!(after.reap(), 1);
    let _ = child.wait();
    assert!(until_gone(pid).await);
    let until = Instant::now() + Duration::from_secs(5);
    while dirs.iter().any(|d| d.exists()) && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(dirs.iter().all(|d| !d.exists()), "{dirs:?}");
}

#[test]
fn a_worker_that_cannot_write_cgroups_says_so_and_refuses_limits() {
    let setting = CgroupSetting::Under("/proc/ax-no-cgroup-here".into());
    let confinement = Confinement::set_up(&setting, "w1", Resources::default());
    let said = confinement.describe();
    assert!(
        said.starts_with("process groups only, no resource limits: ")
            && said.contains("/proc/ax-no-cgroup-here"),
        "{said}"
    );
    let Confinement::ProcessGroups { .. } = confinement else {
        panic!("{said}");
    };
    let off = Confinement::set_up(&CgroupSetting::Off, "w1", Resources::default()).describe();
    assert!(off.contains("cgroups are off"), "{off}");
}

#[test]
fn a_workers_default_limits_fill_what_a_job_leaves_unset_where_enforced() {
    let defaults = Resources {
        memory: Some(Memory(1 << 30)),
        cpu: Some(Cpu(2000)),
        pids: Some(512),
    };
    let name = format!("test-{}", ax_bus::ids::TraceId::random());
    let Confinement::Cgroups(cgroups) = Confinement::set_up(&CgroupSetting::Auto, &name, defaults)
    else {
        panic!("this kind of machine makes cgroups as root");
    };
    let asked = Resources {
        memory: Some(Memory(64 << 20)),
        ..Resources::default()
    };
    assert_eq!(
        cgroups.limits_for(&asked),
        Resources {
            memory: Some(Memory(64 << 20)),
            cpu: Some(Cpu(2000)),
            pids: Some(512),
        },
        "the job's own limit wins; the others come from the worker"
    );
    assert_eq!(cgroups.limits_for(&Resources::default()), defaults);
}
