//! A `nats-server` child process: what `ax up` runs when no `--nats URL` is given, and what
//! every integration test starts for itself (free port, its own store, stopped on drop).
//!
//! The binary is the pinned one (`scripts/install-nats-server` puts it in
//! `.tools/nats-server/bin/`); any other must be at least [`MIN_VERSION`], because ax relies on
//! per-key TTLs and fixes that older servers lack. The child gets `PR_SET_PDEATHSIG`, so it
//! dies with the thread that started it even when that process is killed with SIGKILL.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The oldest server ax accepts.
pub const MIN_VERSION: (u32, u32) = (2, 11);
/// The version the install script pins and the tests run against.
pub const PINNED_VERSION: &str = "2.15.1";
/// Environment variable naming a `nats-server` binary explicitly.
pub const BINARY_ENV: &str = "AX_NATS_SERVER";

/// Why a local server could not be found or started.
#[derive(Debug, thiserror::Error)]
pub enum LocalServerError {
    /// No usable binary.
    #[error(
        "no nats-server >= 2.11 found (set {BINARY_ENV}, or run scripts/install-nats-server): {0}"
    )]
    NotFound(String),
    /// The process could not be started or did not become ready.
    #[error("nats-server did not start: {0}")]
    Start(String),
}

impl LocalServerError {
    /// Whether the server did not start because a port it was given is taken.
    pub fn port_taken(&self) -> bool {
        self.to_string().contains("address already in use")
    }
}

/// Runs `start` — which picks free ports and starts servers on them — again, a few times,
/// while a port it picked was taken before its server bound it: a port found free is free
/// only until something binds it, and on a loaded machine (tests side by side, their outgoing
/// connections) something does. Every start of one server or of a cluster goes through here.
pub fn on_free_ports<T>(
    mut start: impl FnMut() -> Result<T, LocalServerError>,
) -> Result<T, LocalServerError> {
    let mut tries = 0;
    loop {
        match start() {
            Err(e) if tries < 5 && e.port_taken() => tries += 1,
            done => return done,
        }
    }
}

/// Options of a local server.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// The binary.
    pub binary: PathBuf,
    /// Client port (a free one when `None`).
    pub port: Option<u16>,
    /// JetStream store directory.
    pub store_dir: PathBuf,
    /// Where the server logs (inside `store_dir` when `None`).
    pub log_file: Option<PathBuf>,
    /// Extra arguments (cluster routes and the like).
    pub extra_args: Vec<String>,
}

/// A running `nats-server` child; stopped (SIGTERM, then SIGKILL) on drop.
#[derive(Debug)]
pub struct LocalServer {
    child: Option<Child>,
    /// The client port.
    pub port: u16,
    /// `nats://127.0.0.1:<port>`.
    pub url: String,
    /// Options it was started with (to restart it on the same port and store).
    pub options: ServerOptions,
}

/// A free TCP port on 127.0.0.1 (free when asked; the caller should use it quickly).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Whether something accepts connections on 127.0.0.1:`port`.
pub fn port_in_use(port: u16) -> bool {
    TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(300),
    )
    .is_ok()
}

/// Finds a usable binary: `$AX_NATS_SERVER`, next to the running executable,
/// `.tools/nats-server/bin/` in the current directory or one of its parents, then `PATH`.
pub fn find_binary() -> Result<PathBuf, LocalServerError> {
    let mut rejected = Vec::new();
    if let Ok(explicit) = std::env::var(BINARY_ENV) {
        let path = PathBuf::from(explicit);
        return check_version(&path).map(|_| path.clone()).map_err(|e| {
            LocalServerError::NotFound(format!("{BINARY_ENV}={}: {e}", path.display()))
        });
    }
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        candidates.push(dir.join("nats-server"));
    }
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            candidates.push(dir.join(".tools/nats-server/bin/nats-server"));
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("nats-server")));
    }
    for candidate in candidates {
        if !candidate.is_file() {
            continue;
        }
        match check_version(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(e) => rejected.push(format!("{}: {e}", candidate.display())),
        }
    }
    Err(LocalServerError::NotFound(if rejected.is_empty() {
        "none on PATH".to_string()
    } else {
        format!("rejected {}", rejected.join("; "))
    }))
}

fn check_version(binary: &Path) -> Result<(), String> {
    let output = Command::new(binary)
        .arg("--version")
        .output()
        .map_err(|e| format!("cannot run it: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix('v'))
        .ok_or_else(|| format!("unexpected --version output `{}`", text.trim()))?;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if found >= MIN_VERSION {
        Ok(())
    } else {
        Err(format!("version {version} is too old"))
    }
}

impl LocalServer {
    /// Starts the server and waits until it accepts connections with JetStream enabled. Without
    /// a port it takes a free one, again on another when that one was taken meanwhile
    /// ([`on_free_ports`]).
    pub fn start(options: ServerOptions) -> Result<Self, LocalServerError> {
        if options.port.is_some() {
            return Self::start_on(options);
        }
        on_free_ports(|| Self::start_on(options.clone()))
    }

    fn start_on(mut options: ServerOptions) -> Result<Self, LocalServerError> {
        let port = match options.port {
            Some(p) => p,
            None => free_port().map_err(|e| LocalServerError::Start(e.to_string()))?,
        };
        options.port = Some(port);
        std::fs::create_dir_all(&options.store_dir).map_err(|e| {
            LocalServerError::Start(format!("{}: {e}", options.store_dir.display()))
        })?;
        let log_file = options
            .log_file
            .clone()
            .unwrap_or_else(|| options.store_dir.join("nats-server.log"));
        let mut command = Command::new(&options.binary);
        command
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(&options.store_dir)
            .arg("-l")
            .arg(&log_file)
            .args(&options.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: set_pdeathsig is async-signal-safe (a single prctl call).
        unsafe {
            command.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)
            });
        }
        let child = command.spawn().map_err(|e| {
            LocalServerError::Start(format!("cannot run {}: {e}", options.binary.display()))
        })?;
        let mut server = Self {
            child: Some(child),
            port,
            url: format!("nats://127.0.0.1:{port}"),
            options,
        };
        server.wait_ready(&log_file)?;
        Ok(server)
    }

    fn wait_ready(&mut self, log_file: &Path) -> Result<(), LocalServerError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    let mut stderr = String::new();
                    if let Some(mut pipe) = child.stderr.take() {
                        let _ = pipe.read_to_string(&mut stderr);
                    }
                    let log = std::fs::read_to_string(log_file).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(5).collect();
                    self.child = None;
                    return Err(LocalServerError::Start(format!(
                        "exited with {status}: {} {}",
                        stderr.trim(),
                        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                    )));
                }
            }
            if self.jetstream_ready() && self.says_ready(log_file) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(LocalServerError::Start(format!(
                    "port {} not ready after 30 s (log: {})",
                    self.port,
                    log_file.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether this server's own log says it is ready: its file logger starts each line with
    /// the process id (`[pid] … Server is ready`). The port answering is not enough: a server
    /// another process started there between the look for a free port and this one's bind
    /// answers too, while this one exits, `address already in use`.
    fn says_ready(&self, log_file: &Path) -> bool {
        let Some(pid) = self.pid() else {
            return false;
        };
        let mine = format!("[{pid}] ");
        std::fs::read_to_string(log_file).is_ok_and(|log| {
            log.lines()
                .any(|line| line.starts_with(&mine) && line.ends_with("Server is ready"))
        })
    }

    /// The health endpoint is not enabled, so the port must answer with an INFO line that
    /// announces JetStream.
    fn jetstream_ready(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([127, 0, 0, 1], self.port)),
            Duration::from_millis(200),
        ) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = [0u8; 4096];
        match stream.read(&mut buf) {
            Ok(n) => {
                let info = String::from_utf8_lossy(&buf[..n]);
                info.starts_with("INFO") && info.contains("\"jetstream\":true")
            }
            Err(_) => false,
        }
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the server: SIGTERM, then SIGKILL after 10 s. Idempotent.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = Pid::from_raw(child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Kills the server abruptly (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and store (after `stop` or `kill`).
    pub fn restart(&mut self) -> Result<(), LocalServerError> {
        self.stop();
        let again = Self::start(self.options.clone())?;
        *self = again;
        Ok(())
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken() -> LocalServerError {
        LocalServerError::Start(
            "exited with exit status: 1: [FTL] Error listening on router port: 45885 - listen \
             tcp 127.0.0.1:45885: bind: address already in use"
                .into(),
        )
    }

    #[test]
    fn a_start_whose_port_was_taken_is_tried_again_and_any_other_failure_is_not() {
        let mut runs = 0;
        let started = on_free_ports(|| {
            runs += 1;
            if runs < 3 {
                Err(taken())
            } else {
                Ok(runs)
            }
        });
        assert_eq!(started.unwrap(), 3);
        let mut runs = 0;
        let failed = on_free_ports(|| -> Result<(), _> {
            runs += 1;
            Err(LocalServerError::Start("no such binary".into()))
        });
        assert!(failed.is_err());
        assert_eq!(runs, 1, "another failure is not tried again");
        let mut runs = 0;
        let given_up = on_free_ports(|| -> Result<(), _> {
            runs += 1;
            Err(taken())
        });
        assert!(given_up.unwrap_err().port_taken());
        assert_eq!(runs, 6, "a few tries, then the failure");
    }
}
