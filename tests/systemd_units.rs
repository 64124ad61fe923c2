//! The systemd units shipped in `config/systemd/` are what `systemd-analyze verify` accepts
//! without a word, and the worker's keeps the two settings its attempts' cgroups depend on.

use crate::support;

use std::process::Command;

use support::*;

/// Each unit of `config/systemd/`, by file name, with its text.
fn units() -> Vec<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/systemd");
    let mut units: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("config/systemd")
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read_to_string(e.path()).expect("a unit's text"),
            )
        })
        .collect();
    units.sort();
    units
}

#[test]
fn the_shipped_units_verify_without_a_warning() {
    let units = units();
    assert_eq!(
        units.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["ax-node.service", "ax-worker.service"]
    );
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for (name, text) in &units {
        // The binary where this build has it (verify checks that it is executable).
        assert!(text.contains("ExecStart=/usr/local/bin/ax node "), "{name}");
        let path = dir.path().join(name);
        std::fs::write(&path, text.replace("/usr/local/bin/ax", ax_binary())).unwrap();
        paths.push(path);
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&paths)
        .output()
        .expect("systemd-analyze (Debian's systemd)");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A unit with a misspelt key is not silently accepted by this check.
    let bad = dir.path().join("bad.service");
    std::fs::write(
        &bad,
        units[1]
            .1
            .replace("Delegate=yes", "Delegates=yes")
            .replace("/usr/local/bin/ax", ax_binary()),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("Unknown key 'Delegates'"));
}

#[test]
fn the_worker_unit_delegates_its_cgroup_and_survives_a_jobs_oom_kill() {
    let (_, worker) = &units()[1];
    let lines: Vec<&str> = worker.lines().map(str::trim).collect();
    for needed in [
        "Delegate=yes",
        "OOMPolicy=continue",
        "Restart=always",
        "StateDirectory=ax",
    ] {
        assert!(lines.contains(&needed), "{needed} missing:\n{worker}");
    }
}
