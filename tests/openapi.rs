//! The API's OpenAPI document against the running server: schemathesis (from PyPI, installed
//! by the test command) generates requests from `/api/v1/openapi.json`, valid and invalid, and
//! checks every answer — no server error, every status, content type, header and body as the
//! document says, and invalid input refused. Its positive-data check is left out: the document
//! cannot say every rule (a YAML text that is a job, a re-run that names what to run), and
//! those refusals are 400s naming the field, as the API promises.

use crate::support;

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
        // Its cache of found crashes goes to the test's folder, not the repository.
        .current_dir(dir.path())
        .output()
        .expect("schemathesis (PyPI; the test command installs it)");
    assert!(
        out.status.success(),
        "schemathesis found the API and its document apart:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The API's bad input, each answered with its status and a reason naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_their_status_and_a_reason_that_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let up = up(dir.path()).await;
    let jobs = dir.path().join("jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    std::fs::write(
        jobs.join("done.yaml"),
        "version: v1\njob:\n  name: done\n  exec: { type: shell, command: 'true' }\n",
    )
    .unwrap();
    let out = ax(&up.nats, &["job", "apply", "-f", jobs.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&ax(&up.nats, &["job", "trigger", "done"]))
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    final_record(&up.client, &id, std::time::Duration::from_secs(30)).await;
    let http = reqwest::Client::new();
    let post = |path: &str, body: Vec<u8>| {
        http.post(format!("{}{path}", up.http))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let answer = |response: reqwest::Response| async move {
        let status = response.status().as_u16();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        (
            status,
            body["error"].as_str().unwrap_or_default().to_string(),
        )
    };
    let (cancel, mark) = (
        format!("/api/v1/instances/{id}/cancel"),
        format!("/api/v1/instances/{id}/mark"),
    );
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("/api/v1/jobs/done/trigger", b"{\"params\": {\"a\": 1".to_vec(),
            400,
            "body: EOF while parsing an object at line 1 column 18"),
        ("/api/v1/jobs/done/trigger", b"{\"in\": 5}".to_vec(), 400, "body: invalid type: integer `5`"),
        // An object, as the document says; serde alone would read `[]` as `{}`.
        ("/api/v1/jobs/done/trigger", b"[]".to_vec(), 400, "body: a JSON object is expected, not an array"),
        ("/api/v1/rerun", b"[\"done.k.none\"]".to_vec(), 400, "body: a JSON object is expected, not an array"),
        ("/api/v1/jobs/nope/trigger", Vec::new(), 404, "name: no job `nope`"),
        ("/api/v1/jobs/Bad%20Name/trigger", Vec::new(), 400, "name: `Bad Name` is not a valid job name"),
        (&cancel, Vec::new(), 409, "has ended (success); there is nothing to cancel"),
        ("/api/v1/instances/done.k.none/kill", Vec::new(), 404, "instance: no instance `done.k.none`"),
        (&mark, b"{\"state\": \"running\", \"reason\": \"x\"}".to_vec(), 400, "state: `running` is no verdict"),
        ("/api/v1/rerun", b"{}".to_vec(), 400, "instance: name an instance, or a biz_date"),
        ("/api/v1/jobs", b"{\"yaml\": \"version: v1\\njob:\\n  name: x\\n  cron: nope\\n  exec: {type: shell, command: 'true'}\\n\"}".to_vec(), 400, "yaml:4: job.cron:"),
        ("/api/v1/dead-letters/0/replay", Vec::new(), 404, "id: dead letter 0: no such dead letter"),
        ("/api/v1/queues/urgent/pause", Vec::new(), 400, "priority: unknown priority `urgent`"),
        ("/api/v1/jobs/done/trigger", vec![b' '; 600 * 1024], 413, ""),
    ];
    for (path, body, status, reason) in cases {
        let (got, error) = answer(post(path, body).await.unwrap()).await;
        assert_eq!(got, status, "{path}: {error}");
        assert!(
            error.starts_with(reason) || error.contains(reason),
            "{path}: {error}"
        );
    }
    let (got, error) = answer(
        http.get(format!("{}/api/v1/instances?per_page=0", up.http))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (got, error.as_str()),
        (400, "per_page: 0 is not within 1..=500")
    );
    // Nothing above changed anything: one instance, the job there and not paused.
    let (job, _) = up
        .client
        .job(&"done".parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(!job.paused);
    assert_eq!(up.client.instances(None).await.unwrap().len(), 1);
}
