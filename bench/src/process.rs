//! `ax node` processes of the bench's own (the same binary), for what only a separate process
//! shows: its resident memory, and what a SIGKILL does. Killed (-9) on drop.

use std::path::Path;

use crate::{bail, Result};

/// A running `ax node`.
pub(crate) struct NodeProcess {
    child: std::process::Child,
}

impl NodeProcess {
    /// `ax --prefix PREFIX node --roles ROLES --id ID`, its files and log under `dir/ID`.
    pub(crate) fn start(
        url: &str,
        prefix: &str,
        id: &str,
        roles: &str,
        dir: &Path,
    ) -> Result<Self> {
        let home = dir.join(id);
        std::fs::create_dir_all(&home)?;
        let log = std::fs::File::create(home.join("node.log"))?;
        let child = std::process::Command::new(std::env::current_exe()?)
            .args(["--prefix", prefix, "node", "--nats", url, "--roles", roles])
            .args(["--id", id, "--data-dir"])
            .arg(home.join("data"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()?;
        Ok(Self { child })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its resident memory (`VmRSS`).
    pub(crate) fn resident_bytes(&self) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        let kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
        match kib {
            Some(kib) => Ok(kib * 1024),
            None => bail!("no VmRSS for pid {}", self.pid()),
        }
    }

    /// SIGTERM (a graceful stop), then waits up to 30 s for the exit.
    pub(crate) async fn stop(mut self) -> Result<()> {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        while tokio::time::Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        bail!(
            "ax node (pid {}) did not stop within 30 s of SIGTERM",
            self.pid()
        )
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
