//! The Python package (`clients/python`) installed with pip into a virtualenv and its pytest
//! suite run against real `ax up` clusters of its own (its conftest starts a nats-server on a
//! free port and `ax --nats URL up` on it, with this build's binaries).

use std::process::Command;

use crate::support::python::{root, run, venv};

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

/// The package ships `py.typed`: its annotations are checked as a user's `mypy --strict` would
/// check them (the installed package, with the stubs of its dependencies).
#[test]
fn the_python_package_is_clean_under_mypy_strict() {
    let python = venv();
    let out = run(
        Command::new(&python)
            .args([
                "-m",
                "mypy",
                "--strict",
                "--no-incremental",
                "-p",
                "ax_client",
            ])
            .current_dir(std::env::temp_dir()),
        "mypy --strict -p ax_client",
    );
    assert!(out.contains("Success: no issues found"), "{out}");
}
