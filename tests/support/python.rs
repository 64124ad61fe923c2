//! The Python package (`clients/python`) installed as a user would, for the tests that drive
//! ax from Python: one virtualenv in `target/py-venv`, made or refreshed under a file lock so
//! that tests in parallel processes do not install into it at once.

use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `command` to its end; panics with its output when it fails.
pub(crate) fn run(command: &mut Command, what: &str) -> String {
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
/// clients/python`), its test extras and nothing else; its python.
pub(crate) fn venv() -> PathBuf {
    let target = root().join("target");
    std::fs::create_dir_all(&target).expect("target/");
    let lock = std::fs::File::create(target.join("py-venv.lock")).expect("the venv's lock");
    lock.lock().expect("lock the venv");
    let venv = target.join("py-venv");
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
