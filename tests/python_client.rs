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
