//! The console and its API with `ax up --auth`: nothing without a token, a login for the
//! browser, pages without the controls a role may not use, forged and out-of-role changes
//! refused, and each change sent with its caller's token so the Scheduler records who.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use ax_bus::auth::audit::{AuditRecord, Outcome};
use support::browser::Browser;
use support::up::{up_with, Up};
use support::*;

/// `ax up --auth` in `dir`, once its first admin token is written, and that token's file.
async fn signed_up(dir: &Path) -> (Up, PathBuf) {
    let up = up_with(dir, &["--auth"]).await;
    let admin = dir.join(".ax/admin.token");
    wait_for(Duration::from_secs(30), "the admin token", || async {
        admin.exists().then_some(())
    })
    .await;
    (up, admin)
}

/// `ax` with the token in file `token`.
fn as_holder(up: &Up, token: &Path, args: &[&str]) -> std::process::Output {
    let mut full = vec!["--token-file", token.to_str().unwrap()];
    full.extend_from_slice(args);
    ax(&up.nats, &full)
}

/// A token `name` of `role` made with the admin's (`more`: `-n <namespace>`), as text.
fn made(up: &Up, admin: &Path, name: &str, role: &str, more: &[&str]) -> String {
    // Beside the admin's, under `.ax/`.
    let file = admin.with_file_name(format!("{name}.token"));
    let mut args = vec!["auth", "token", "create", "--name", name, "--role", role];
    args.extend_from_slice(more);
    args.extend(["--out", file.to_str().unwrap()]);
    let out = as_holder(up, admin, &args);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::read_to_string(file).unwrap().trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_sees_no_action_and_every_change_needs_its_role() {
    let dir = tempfile::tempdir().unwrap();
    let (up, admin) = signed_up(dir.path()).await;
    let as_admin = |args: &[&str]| as_holder(&up, &admin, args);
    let jobs = job_file(
        dir.path(),
        "greet.yaml",
        "version: v1\njob: { name: greet, exec: { type: shell, command: 'echo hi' } }\n",
    );
    let out = as_admin(&["job", "apply", "-f", jobs.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let make = |name: &str, role: &str| made(&up, &admin, name, role, &[]);
    let viewer = make("watcher", "viewer");
    let operator = make("ops", "operator");

    // The API: 401 without a token (nothing said about any), 403 out of role, 200 in role.
    let http = reqwest::Client::new();
    let base = up.http.clone();
    let none = http
        .get(format!("{base}/api/v1/jobs"))
        .send()
        .await
        .unwrap();
    assert_eq!(none.status(), 401);
    assert_eq!(
        none.headers()
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap()),
        Some("Bearer")
    );
    let bad = http
        .get(format!("{base}/api/v1/jobs"))
        .bearer_auth({
            // The viewer's token with its last digit changed.
            let (head, last) = viewer.split_at(viewer.len() - 1);
            format!("{head}{}", if last == "0" { "1" } else { "0" })
        })
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 401);
    let read = http
        .get(format!("{base}/api/v1/jobs"))
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 200);
    let trigger = |token: String| {
        let http = http.clone();
        let url = format!("{base}/api/v1/jobs/greet/trigger");
        async move {
            http.post(url)
                .bearer_auth(token)
                .json(&serde_json::json!({}))
                .send()
                .await
                .unwrap()
        }
    };
    assert_eq!(trigger(viewer.clone()).await.status(), 403);
    let done = trigger(operator.clone()).await;
    assert_eq!(done.status(), 200);
    let id = done.json::<serde_json::Value>().await.unwrap()["instance_id"]
        .as_str()
        .unwrap()
        .to_string();
    final_record(&up.client, &id, Duration::from_secs(30)).await;
    // Percent-escaped admin routes are the routes they decode to: the console refuses them
    // itself, by the admin rule, before any command is sent.
    for (method, path) in [
        (reqwest::Method::POST, "/api/v1/%6Aobs"),
        (reqwest::Method::POST, "/ui/jobs/%61pply"),
        (reqwest::Method::POST, "/ui/%71ueues/low/pause"),
        (reqwest::Method::POST, "/api/v1/instances/greet-x/%6Dark"),
    ] {
        let refused = http
            .request(method, format!("{base}{path}"))
            .bearer_auth(&operator)
            .header("Content-Type", "application/yaml")
            .body("version: v1\njob: { name: sneaky, exec: { type: shell, command: 'true' } }\n")
            .send()
            .await
            .unwrap();
        let status = refused.status();
        let body = refused.text().await.unwrap();
        assert_eq!(status, 403, "{path}: {body}");
        assert!(
            body.contains("needs the admin role; ops is operator"),
            "{path}: {body}"
        );
    }
    // The Scheduler recorded the operator, through the API.
    let records = up
        .client
        .audit_since(chrono::DateTime::UNIX_EPOCH)
        .await
        .unwrap();
    let by_api: Vec<&AuditRecord> = records
        .iter()
        .filter(|r| r.action == "trigger" && r.outcome == Outcome::Done)
        .collect();
    assert_eq!(by_api.len(), 1, "{records:?}");
    assert_eq!(
        (by_api[0].actor.as_str(), by_api[0].via.as_str()),
        ("ops", "api")
    );

    // The browser: sent to the login, signed in as the viewer, shown no control.
    let browser = Browser::start().await;
    browser.open(&format!("{base}/jobs/greet")).await;
    browser.element("#token").await;
    browser.screenshot("login").await;
    browser.fill("#token", "axt_watcher_not-a-token").await;
    browser.click("#sign-in").await;
    browser
        .until("the refusal", "#login-result", |t| {
            t.contains("malformed token")
        })
        .await;
    browser.fill("#token", &viewer).await;
    browser.click("#sign-in").await;
    browser
        .until("the signed-in frame", "#who", |t| {
            t.contains("watcher (viewer)")
        })
        .await;
    browser.open(&format!("{base}/jobs/greet")).await;
    browser.element("#next-fire").await;
    for control in ["#trigger", "#pause", "#resume", "#delete", "#edit"] {
        assert!(!browser.has(control).await, "a viewer is shown {control}");
    }
    browser.open(&format!("{base}/instances/{id}")).await;
    browser.element("#state").await;
    for control in ["#cancel", "#kill", "#mark", "#rerun"] {
        assert!(!browser.has(control).await, "a viewer is shown {control}");
    }
    browser.open(&format!("{base}/audit")).await;
    assert!(browser.text("#audit").await.contains("ops"));
    browser.screenshot("audit").await;

    // A forged POST (no page token), and one with it but out of role: both refused.
    for script in [
        "return fetch('/ui/jobs/greet/pause', {method: 'POST'}).then(r => r.status);",
        "return fetch('/ui/jobs/greet/pause', {method: 'POST', headers: {'X-CSRF-Token': \
         document.querySelector('meta[name=csrf-token]').content}}).then(r => r.status);",
    ] {
        let status = browser.client.execute(script, vec![]).await.unwrap();
        assert_eq!(status, 403, "{script}");
    }
    let (job, _) = up
        .client
        .job(&"greet".parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(!job.paused, "a refused request changed the job");
    // Both refusals are on the audit trail, with who tried.
    wait_for(
        Duration::from_secs(10),
        "the refusals in the audit",
        || async {
            let records = up
                .client
                .audit_since(chrono::DateTime::UNIX_EPOCH)
                .await
                .ok()?;
            let refused = records
                .iter()
                .filter(|r| {
                    r.action == "http"
                        && r.outcome == Outcome::Denied
                        && r.request["path"] == "/ui/jobs/greet/pause"
                        && r.actor == "watcher"
                })
                .count();
            (refused == 2).then_some(())
        },
    )
    .await;

    // A revoked token ends its session on the next request.
    let out = as_admin(&["auth", "token", "revoke", "watcher"]);
    assert!(out.status.success(), "{}", stderr(&out));
    browser.open(&format!("{base}/jobs")).await;
    browser.element("#token").await;

    // The operator signs in and out.
    browser.fill("#token", &operator).await;
    browser.click("#sign-in").await;
    browser
        .until("the signed-in frame", "#who", |t| {
            t.contains("ops (operator)")
        })
        .await;
    browser.open(&format!("{base}/jobs/greet")).await;
    assert!(browser.has("#trigger").await && !browser.has("#delete").await);
    // The operator's re-run of a whole business date waits for an admin: the approvals page
    // lists it.
    let ops_token = admin.with_file_name("ops.token");
    let (record, _) = up
        .client
        .instance(&id.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    let out = ax(
        &up.nats,
        &[
            "--token-file",
            ops_token.to_str().unwrap(),
            "rerun",
            "--biz-date",
            &record.biz_date,
            "--yes",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // Said as it is: nothing started yet.
    assert!(
        stderr(&out).contains("waiting for approval")
            && stdout(&out).ends_with("would run once approved; nothing started yet\n"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    browser.open(&format!("{base}/approvals")).await;
    assert!(browser.text("#approvals").await.contains(&record.biz_date));
    browser.screenshot("approvals").await;
    browser.click("#sign-out").await;
    browser.element("#token").await;
    browser.client.clone().close().await.unwrap();

    // Wrong tokens from one address (the revoked viewer's, now): five are checked and refused
    // (401; the right ones signed in above forgot the earlier wrong ones); then it must wait
    // (429 with Retry-After), unchecked, even with a right token; after the wait a right token
    // is taken again and the count starts afresh.
    let jobs = |token: String| {
        let http = http.clone();
        let url = format!("{base}/api/v1/jobs");
        async move { http.get(url).bearer_auth(token).send().await.unwrap() }
    };
    let mut refused = 0;
    let throttled = loop {
        let response = jobs(viewer.clone()).await;
        match response.status().as_u16() {
            401 => refused += 1,
            429 => break response,
            other => panic!("{other} after {refused} refusals"),
        }
        assert!(refused <= 5, "never slowed down");
    };
    assert_eq!(refused, 5, "refused before the slow-down");
    let wait: u64 = throttled.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "Retry-After: {wait}");
    assert!(throttled
        .text()
        .await
        .unwrap()
        .contains("too many wrong tokens"));
    assert_eq!(jobs(operator.clone()).await.status(), 429);
    let taken = wait_for(
        Duration::from_secs(wait + 10),
        "the wait to end",
        || async {
            let response = jobs(operator.clone()).await;
            (response.status() != 429).then_some(response)
        },
    )
    .await;
    assert_eq!(taken.status(), 200);
    assert_eq!(jobs(viewer.clone()).await.status(), 401);
}

/// A token of one namespace through the API: it lists and reads that namespace's jobs and
/// instances and acts on them; another namespace's are refused naming the namespace, the
/// pages of every namespace naming that, and a command whose body reaches another namespace
/// is refused by the Scheduler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_of_a_namespace_reads_and_acts_there_through_the_api_and_nowhere_else() {
    let dir = tempfile::tempdir().unwrap();
    let (up, admin) = signed_up(dir.path()).await;
    let as_admin = |args: &[&str]| as_holder(&up, &admin, args);
    let jobs = job_file(
        dir.path(),
        "teams.yaml",
        "version: v1\njob: { namespace: a, name: own, exec: { type: noop } }\n---\n\
         version: v1\njob: { namespace: b, name: other, exec: { type: noop } }\n",
    );
    let out = as_admin(&["job", "apply", "-f", jobs.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let token = made(&up, &admin, "a-ops", "operator", &["-n", "a"]);
    let theirs = as_admin(&["job", "trigger", "b/other"]);
    assert!(theirs.status.success(), "{}", stderr(&theirs));
    let theirs = stdout(&theirs)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();

    let http = reqwest::Client::new();
    let base = up.http.clone();
    let send = |method: reqwest::Method, path: String| {
        let http = http.clone();
        let (base, token) = (base.clone(), token.clone());
        async move {
            let response = http
                .request(method, format!("{base}{path}"))
                .bearer_auth(token)
                .json(&serde_json::json!({}))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (status, response.text().await.unwrap())
        }
    };
    use reqwest::Method;
    // Its namespace: listed, read, triggered.
    let (status, listed) = send(Method::GET, "/api/v1/jobs".into()).await;
    assert_eq!(status, 200, "{listed}");
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|j| j["name"].as_str())
        .collect();
    assert_eq!(names, ["a.own"]);
    assert_eq!(send(Method::GET, "/api/v1/jobs/a.own".into()).await.0, 200);
    let (status, done) = send(Method::POST, "/api/v1/jobs/a.own/trigger".into()).await;
    assert_eq!(status, 200, "{done}");
    let done: serde_json::Value = serde_json::from_str(&done).unwrap();
    let own = done["instance_id"].as_str().unwrap().to_string();
    assert_eq!(
        send(Method::GET, format!("/api/v1/instances/{own}"))
            .await
            .0,
        200
    );
    let listed = wait_for(Duration::from_secs(30), "its instance listed", || async {
        let (_, body) = send(Method::GET, "/api/v1/instances".into()).await;
        let body: serde_json::Value = serde_json::from_str(&body).ok()?;
        let ids: Vec<String> = body["instances"]
            .as_array()?
            .iter()
            .filter_map(|r| r["instance_id"].as_str().map(str::to_string))
            .collect();
        ids.contains(&own).then_some(ids)
    })
    .await;
    assert!(!listed.contains(&theirs), "{listed:?}");

    // Another namespace's job and instance: refused, naming the namespace.
    for (method, path) in [
        (Method::GET, "/api/v1/jobs/b.other".to_string()),
        (Method::POST, "/api/v1/jobs/b.other/trigger".to_string()),
        (Method::POST, "/api/v1/jobs/b.other/pause".to_string()),
        (Method::GET, format!("/api/v1/instances/{theirs}")),
        (Method::POST, format!("/api/v1/instances/{theirs}/cancel")),
        (Method::GET, format!("/instances/{theirs}")),
    ] {
        let (status, said) = send(method.clone(), path.clone()).await;
        assert_eq!(status, 403, "{method} {path}: {said}");
        assert!(
            said.contains("role in namespace `b`; a-ops is operator in a"),
            "{method} {path}: {said}"
        );
    }
    // What is of every namespace.
    for path in ["/api/v1/status", "/audit", "/workers"] {
        let (status, said) = send(Method::GET, path.into()).await;
        assert_eq!(status, 403, "{path}: {said}");
        assert!(said.contains("in every namespace"), "{path}: {said}");
    }
    // The dashboard shows its namespace's instances, without the figures of every namespace.
    let (status, page) = send(Method::GET, "/".into()).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains(r#"id="shown-namespaces">a<"#), "{page}");
    assert!(
        !page.contains(r#"id="latency""#) && !page.contains(&theirs),
        "{page}"
    );
    // The approvals page lists what its namespaces' plans reach (none here).
    let (status, said) = send(Method::GET, "/approvals".into()).await;
    assert_eq!(status, 200, "{said}");
    // A re-run whose body names another namespace's instance: the Scheduler refuses it.
    let http = reqwest::Client::new();
    let rerun = http
        .post(format!("{base}/api/v1/rerun"))
        .bearer_auth(&token)
        .json(&serde_json::json!({ "instance": theirs }))
        .send()
        .await
        .unwrap();
    let status = rerun.status().as_u16();
    let said = rerun.text().await.unwrap();
    assert_eq!(status, 403, "{said}");
    assert!(said.contains("in namespace `b`"), "{said}");
}
