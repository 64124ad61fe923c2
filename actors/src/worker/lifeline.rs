//! The lifeline: nothing an attempt started outlives its worker, however the worker dies.
//!
//! A parent-death signal reaches only the direct child (and fires when the spawning *thread*
//! exits, not the process); `sh -c` forks its commands, so a worker killed by SIGKILL or the
//! OOM killer used to leave the rest of the attempt's process group running — writing its
//! output while a new attempt of the same instance ran. This module closes that gap.
//!
//! Every command starts under a **watcher**: the process the worker spawns leads the attempt's
//! process group and, before it would exec, forks once more; the new process execs the command,
//! the first stays behind as the watcher. The watcher holds the read end of a pipe whose only
//! write end is the worker's (close-on-exec, and closed in every watcher). Whatever kills the
//! worker, the kernel closes that write end; the watcher sees the pipe hang up and kills its
//! whole process group with SIGKILL, itself included. While the worker lives, the watcher waits
//! for the command and ends as it did (the same exit code, or the same signal), so the worker
//! reads the command's own end. The command in turn dies with the watcher (a parent-death
//! signal, which is exact here: the watcher has one thread).
//!
//! The watcher runs between a fork and an exec of a multi-threaded process, where only
//! async-signal-safe calls are allowed: it makes raw system calls only — no allocation, no
//! lock, no Rust I/O. It ignores the catchable signals the worker sends the group at a timeout
//! or a cancel (the stack-dump signal is for the command), so it stays to report the end; the
//! group's SIGKILL reaches it as well. It shares the worker's memory copy-on-write and writes
//! next to none of it, though `ps` and the OOM killer count the worker's resident pages in its
//! size; if it is killed on its own, the worker sees its attempt end and kills the group.
//!
//! A command that leaves its process group (`setsid`, a daemonizing double fork) escapes the
//! group kill; an attempt in a cgroup of its own ([`super::cgroup`]) does not escape its
//! watcher: the command writes itself into its cgroup here, after the watcher's fork and before
//! its exec, so the watcher stays outside what the cgroup counts and limits and the command
//! never runs outside it; and a watcher given the cgroup's `cgroup.kill` (v2) writes it when
//! the worker dies, before it kills its group, so what left the group dies too even if the
//! worker never comes back to reap it.

use std::io;
use std::io::PipeWriter;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;

use nix::libc;

/// The worker's end of an attempt's lifeline: while it is held, the watcher lets the command
/// run; dropping it (or the worker's death) kills the command's process group.
#[derive(Debug)]
pub(crate) struct Lifeline {
    _held: PipeWriter,
}

/// The descriptors of an attempt's cgroup that its command and watcher use (open, close-on-exec:
/// gone from the command once it runs).
#[derive(Debug, Default)]
pub(crate) struct CgroupFds {
    /// Each hierarchy's `cgroup.procs`, which the command writes itself into.
    pub(crate) procs: Vec<RawFd>,
    /// Its v2 `cgroup.kill`, which the watcher writes when the worker dies.
    pub(crate) kill: Option<RawFd>,
}

impl Lifeline {
    /// Makes `command` start under a watcher tied to the returned lifeline, which must be held
    /// until the command's group is gone. The watcher's end of the pipe stays open in this
    /// process until `command` is dropped (it is closed in every spawned command by
    /// close-on-exec).
    ///
    /// With `groups`, the watcher records its group there (an empty file named by the group
    /// id, see [`super::leftovers`]) before it forks the command: a worker dying between the
    /// spawn and its own, fuller record of the group still leaves the group recorded.
    ///
    /// With `cgroup`, the command writes itself into each of its `cgroup.procs` before it
    /// execs, or exits 126 saying why on its stderr; the watcher kills it whole with its
    /// `cgroup.kill` when the lifeline goes.
    pub(crate) fn arm(
        command: &mut std::process::Command,
        groups: Option<&std::path::Path>,
        cgroup: CgroupFds,
    ) -> io::Result<Self> {
        // Both ends close-on-exec.
        let (watched, held) = io::pipe()?;
        let fd = watched.as_raw_fd();
        // The folder's path with a trailing `/`, made here: the child may not allocate.
        let folder: Option<Vec<u8>> = match groups {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                let mut bytes = dir.as_os_str().as_encoded_bytes().to_vec();
                bytes.push(b'/');
                Some(bytes)
            }
            None => None,
        };
        // SAFETY: `stand_watch` makes async-signal-safe system calls only (see the module).
        unsafe {
            command.pre_exec(move || {
                // Keeps the read end alive for as long as the command (and so this closure)
                // lives: the pipe must still be open when the spawn forks.
                let _keep = &watched;
                if let Some(folder) = &folder {
                    record_group(folder);
                }
                stand_watch(fd, &cgroup)
            });
        }
        Ok(Self { _held: held })
    }
}

/// Creates the empty file `<folder><this process's id>`: this process leads the attempt's group
/// (its process group is set before the pre-exec hooks run). Best effort: a path too long or a
/// failed open leaves the record to the worker.
///
/// # Safety
/// Only between fork and exec of a `Command` spawn: raw system calls on a stack buffer.
unsafe fn record_group(folder: &[u8]) {
    let mut path = [0u8; 4096];
    let mut digits = [0u8; 12];
    let mut pid = libc::getpid() as u32;
    let mut count = 0;
    loop {
        digits[count] = b'0' + (pid % 10) as u8;
        count += 1;
        pid /= 10;
        if pid == 0 {
            break;
        }
    }
    // The folder, the digits (reversed back), and the closing NUL.
    if folder.len() + count + 1 > path.len() {
        return;
    }
    path[..folder.len()].copy_from_slice(folder);
    for i in 0..count {
        path[folder.len() + i] = digits[count - 1 - i];
    }
    let fd = libc::open(
        path.as_ptr().cast(),
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
        0o600,
    );
    if fd >= 0 {
        libc::close(fd);
    }
}

/// In the spawned child, before its exec: forks the command, which returns to the exec, while
/// this process becomes its watcher and never returns.
///
/// # Safety
/// Only between fork and exec of a `Command` spawn.
unsafe fn stand_watch(lifeline: RawFd, cgroup: &CgroupFds) -> io::Result<()> {
    let watcher = libc::getpid();
    let command = libc::fork();
    if command < 0 {
        return Err(io::Error::last_os_error());
    }
    if command == 0 {
        // The command: dies with its single-threaded watcher, even one killed before it
        // could kill the group.
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
        if libc::getppid() != watcher {
            libc::_exit(127);
        }
        for &entry in &cgroup.procs {
            if libc::write(entry, b"0".as_ptr().cast(), 1) != 1 {
                const SAID: &[u8] = b"ax: cannot enter the attempt's cgroup\n";
                libc::write(2, SAID.as_ptr().cast(), SAID.len());
                libc::_exit(126);
            }
        }
        return Ok(());
    }
    watch(lifeline, cgroup.kill.unwrap_or(-1), command)
}

/// The watcher's life: see the module.
///
/// # Safety
/// Only in the watcher (see [`stand_watch`]).
unsafe fn watch(lifeline: RawFd, cgroup_kill: RawFd, command: libc::pid_t) -> ! {
    for signal in 1..32 {
        if !matches!(
            signal,
            libc::SIGKILL
                | libc::SIGSTOP
                | libc::SIGCHLD
                | libc::SIGSEGV
                | libc::SIGBUS
                | libc::SIGFPE
                | libc::SIGILL
                | libc::SIGTRAP
                | libc::SIGSYS
        ) {
            libc::signal(signal, libc::SIG_IGN);
        }
    }
    libc::signal(libc::SIGCHLD, libc::SIG_DFL);
    close_all_but(&[lifeline, cgroup_kill]);
    // Where the kernel has no process descriptors, the end is polled for instead.
    let pidfd = libc::syscall(libc::SYS_pidfd_open, command, 0) as libc::c_int;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: lifeline,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: pidfd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let (watched, timeout_ms) = if pidfd >= 0 { (2, -1) } else { (1, 50) };
        let ready = libc::poll(fds.as_mut_ptr(), watched, timeout_ms);
        if ready > 0 && fds[0].revents != 0 {
            // Nobody ever writes to the lifeline: any event is its hang-up, the worker's end.
            // The cgroup first (this process is outside it), then the group, this one with it.
            if cgroup_kill >= 0 {
                libc::write(cgroup_kill, b"1".as_ptr().cast(), 1);
            }
            libc::kill(0, libc::SIGKILL);
        }
        let mut status = 0;
        if libc::waitpid(command, &mut status, libc::WNOHANG) == command {
            end_as(status);
        }
    }
}

/// Ends the watcher as the command ended.
unsafe fn end_as(status: libc::c_int) -> ! {
    if libc::WIFEXITED(status) {
        libc::_exit(libc::WEXITSTATUS(status));
    }
    if libc::WIFSIGNALED(status) {
        let signal = libc::WTERMSIG(status);
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::signal(signal, libc::SIG_DFL);
        let mut unblocked: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut unblocked);
        libc::sigaddset(&mut unblocked, signal);
        libc::sigprocmask(libc::SIG_UNBLOCK, &unblocked, std::ptr::null_mut());
        libc::kill(libc::getpid(), signal);
        libc::_exit(128 + signal);
    }
    libc::_exit(1)
}

/// Closes every descriptor but those of `keep` (negative ones stand for none): the watcher
/// must hold no write end of another attempt's lifeline (two watchers holding each other's
/// would never see the worker die), nor the worker's sockets and pipes.
unsafe fn close_all_but(keep: &[RawFd]) {
    let mut kept = [-1 as RawFd; 2];
    let count = keep.len().min(kept.len());
    kept[..count].copy_from_slice(&keep[..count]);
    kept.sort_unstable();
    let ranged = |low: RawFd, high: RawFd| {
        high < low
            || libc::syscall(
                libc::SYS_close_range,
                low as libc::c_uint,
                high as libc::c_uint,
                0,
            ) == 0
    };
    // The ranges between the kept ones, then everything above the last.
    let mut low = 0;
    let mut closed = true;
    for &fd in kept.iter().filter(|&&fd| fd >= 0) {
        closed &= ranged(low, fd - 1);
        low = fd + 1;
    }
    closed &= libc::syscall(
        libc::SYS_close_range,
        low as libc::c_uint,
        libc::c_uint::MAX,
        0,
    ) == 0;
    if closed {
        return;
    }
    let limit = match libc::sysconf(libc::_SC_OPEN_MAX) {
        n if n > 0 => n.min(1 << 20) as RawFd,
        _ => 1 << 16,
    };
    for fd in (0..limit).filter(|fd| !kept.contains(fd)) {
        libc::close(fd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::process::tests::alive;
    use std::time::{Duration, Instant};

    fn started(script: &str) -> (std::process::Child, Lifeline) {
        let mut command = std::process::Command::new("/bin/sh");
        command.args(["-c", script]).process_group(0);
        let lifeline = Lifeline::arm(&mut command, None, CgroupFds::default()).unwrap();
        (command.spawn().unwrap(), lifeline)
    }

    fn wait_for_pid(file: &std::path::Path) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(pid) = std::fs::read_to_string(file)
                .ok()
                .and_then(|text| text.trim().parse().ok())
            {
                return pid;
            }
            assert!(Instant::now() < deadline, "the script did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn the_watcher_ends_as_the_command_did() {
        let (mut child, lifeline) = started("exit 7");
        assert_eq!(child.wait().unwrap().code(), Some(7));
        let (mut child, _lifeline2) = started("kill -TERM $$");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGTERM));
        drop(lifeline);
    }

    #[test]
    fn dropping_the_lifeline_kills_the_whole_group_however_deaf() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("grandchild.pid");
        let script = format!(
            "sh -c 'trap \"\" TERM INT HUP; sleep 300' & echo $! > {}; wait",
            file.display()
        );
        let (mut child, lifeline) = started(&script);
        let grandchild = wait_for_pid(&file);
        assert!(alive(grandchild));
        drop(lifeline);
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(grandchild) {
            assert!(
                Instant::now() < deadline,
                "grandchild {grandchild} survived"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn a_watcher_holds_no_other_lifeline() {
        // Two commands started one after the other: the second's watcher must not keep the
        // first's lifeline open, or the first would survive the loss of its lifeline.
        let dir = tempfile::tempdir().unwrap();
        let first_pid = dir.path().join("first.pid");
        let (mut first, first_line) = started(&format!(
            "sleep 300 & echo $! > {}; wait",
            first_pid.display()
        ));
        let (mut second, second_line) = started("sleep 300");
        let sleeper = wait_for_pid(&first_pid);
        drop(first_line);
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(sleeper) {
            assert!(
                Instant::now() < deadline,
                "the first group survived its lifeline"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        first.wait().unwrap();
        drop(second_line);
        second.wait().unwrap();
    }
}
