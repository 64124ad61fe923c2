//! The API's OpenAPI document against the running server: schemathesis (from PyPI, installed
//! by the test command) generates requests from `/api/v1/openapi.json`, valid and invalid, and
//! checks every answer — no server error, every status, content type, header and body as the
//! document says, and invalid input refused. Its positive-data check is left out: the document
//! cannot say every rule (a YAML text that is a job, a re-run that names what to run), and
//! those refusals are 400s naming the field, as the API promises.

mod support;

use std::process::Command;

use support::up::up;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_describes_the_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let up = up(dir.path()).await;
    let jobs = dir.path().join("jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    std::fs::write(
        jobs.join("greet.yaml"),
        "version: v1\njob:\n  name: greet\n  exec: { type: shell, command: 'true' }\n",
    )
    .unwrap();
    let out = ax(&up.nats, &["job", "apply", "-f", jobs.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Through python3 rather than the `schemathesis` script, which a pyenv may not have on
    // PATH until it rehashes.
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys; from schemathesis.cli import schemathesis; sys.argv[0] = 'schemathesis'; schemathesis()",
            "run",
            &format!("{}/api/v1/openapi.json", up.http),
            "--checks",
            "all",
            "--exclude-checks",
            "ignored_auth,unsupported_method,positive_data_acceptance",
            "--max-examples",
            "25",
            "--seed",
            "1",
            "--workers",
            "1",
        ])
        .env("NO_COLOR", "1")
        .output()
        .expect("schemathesis (PyPI; the test command installs it)");
    assert!(
        out.status.success(),
        "schemathesis found the API and its document apart:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
