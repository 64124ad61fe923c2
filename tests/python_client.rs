//! The Python package (`clients/python`) installed with pip into a virtualenv and its pytest
//! suite run against real `ax up` clusters of its own (its conftest starts a nats-server on a
//! free port and `ax --nats URL up` on it, with this build's binaries).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `command` to its end; panics with its output when it fails.
fn run(command: &mut Command, what: &str) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} failed:\n{text}");
    text
}

/// `target/py-venv` with the package installed as a user would (`pip install
/// clients/python`), its test extras and nothing else.
fn venv() -> PathBuf {
    let venv = root().join("target").join("py-venv");
    let python = venv.join("bin").join("python");
    if !python.exists() {
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            "python3 -m venv",
        );
    }
    let package = root().join("clients").join("python");
    let pip = |args: &[&str]| {
        run(
            Command::new(&python)
                .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
                .args(args)
                .current_dir(root()),
            "pip install",
        )
    };
    pip(&[&format!("{}[test]", package.display())]);
    // The package itself again, whatever pip thinks of its version: this checkout's code.
    pip(&[
        "--no-deps",
        "--force-reinstall",
        package.to_str().expect("utf-8 path"),
    ]);
    python
}

#[test]
fn the_python_package_works_against_a_real_cluster() {
    let python = venv();
    let nats_server = ax_bus::client::local_server::find_binary()
        .expect("nats-server (run scripts/install-nats-server)");
    let tests = root().join("clients").join("python").join("tests");
    let out = run(
        Command::new(&python)
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .arg(&tests)
            .env("AX_BIN", env!("CARGO_BIN_EXE_ax"))
            .env("NATS_SERVER", nats_server)
            // From the tests' folder, so that `ax_client` is the installed package, not the
            // source tree next to it.
            .current_dir(&tests),
        "pytest clients/python/tests",
    );
    assert!(out.contains(" passed"), "{out}");
    assert!(!out.contains("skipped"), "{out}");
}
