//! Identities, roles and two-person approval, with `[auth]` on: checked by the Scheduler that
//! carries a command out, whatever door it came through (the CLI, a raw control message with
//! valid NATS credentials), and every decision on the audit trail without a secret in it.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use ax_bus::auth::audit::{AuditRecord, Outcome};
use ax_bus::messages::ControlReply;
use ax_bus::State;
use futures::StreamExt;
use support::*;

const JOBS: &str = "version: v1
job: { name: up, exec: { type: noop } }
---
version: v1
job:
  name: down
  deps: [{ name: up, biz_date: current }]
  exec: { type: noop }
";

/// `ax` with a token file.
fn as_(nats: &TestNats, token: &Path, args: &[&str]) -> std::process::Output {
    let mut full = vec!["--token-file", token.to_str().expect("utf-8 path")];
    full.extend_from_slice(args);
    ax(&nats.url(), &full)
}

/// Makes a token with the admin's and returns its file.
fn token(nats: &TestNats, admin: &Path, name: &str, role: &str) -> PathBuf {
    token_with(nats, admin, (name, role), &[])
}

/// Makes a token with the admin's, `more` added to its command (`-n a`), and returns its file.
fn token_with(nats: &TestNats, admin: &Path, (name, role): (&str, &str), more: &[&str]) -> PathBuf {
    let file = nats.path("tokens").join(name);
    let mut args = vec!["auth", "token", "create", "--name", name, "--role", role];
    args.extend_from_slice(more);
    args.extend(["--out", file.to_str().expect("utf-8 path")]);
    let out = as_(nats, admin, &args);
    assert!(out.status.success(), "create {name}: {}", stderr(&out));
    file
}

/// A raw control command with `headers`, answered on an inbox.
async fn raw_command(
    client: &ax_bus::AxClient,
    command: &str,
    json: &str,
    token: Option<&str>,
) -> ControlReply {
    let inbox = client.nats.new_inbox();
    let mut replies = client.nats.subscribe(inbox.clone()).await.unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Content-Type", "application/json");
    headers.insert("Ax-Reply-To", inbox.as_str());
    if let Some(token) = token {
        headers.insert("Ax-Token", token);
    }
    client
        .js
        .publish_with_headers(
            format!("ax.control.{command}"),
            headers,
            json.to_string().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), replies.next())
        .await
        .expect("an answer")
        .unwrap();
    serde_json::from_slice(&answer.payload).expect("a JSON command is answered in JSON")
}

/// `ax auth bootstrap` once a Scheduler takes commands; the admin token's file.
async fn bootstrap(nats: &TestNats) -> PathBuf {
    std::fs::create_dir_all(nats.path("tokens")).unwrap();
    let admin = nats.path("tokens").join("admin");
    wait_for(Duration::from_secs(30), "the first admin token", || async {
        let out = ax(
            &nats.url(),
            &["auth", "bootstrap", "--out", admin.to_str().unwrap()],
        );
        out.status.success().then_some(())
    })
    .await;
    admin
}

fn approval_id(out: &std::process::Output) -> String {
    let text = stderr(out);
    let at = text
        .find("waiting for approval ")
        .unwrap_or_else(|| panic!("no approval in: {text}"));
    text[at + "waiting for approval ".len()..]
        .split(|c: char| !c.is_ascii_hexdigit())
        .next()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_valid_token_of_a_high_enough_role_changes_anything() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let n1 = AxProcess::node(&nats, "n1", "all", &["--auth"]);
    let n2 = AxProcess::node(&nats, "n2", "scheduler", &["--auth"]);
    let admin = bootstrap(&nats).await;
    // Once only.
    let again = ax(
        &nats.url(),
        &[
            "auth",
            "bootstrap",
            "--out",
            nats.path("second").to_str().unwrap(),
        ],
    );
    assert!(!again.status.success());
    assert!(stderr(&again).contains("run already"), "{}", stderr(&again));

    // Applying needs an admin: without a token nothing is applied.
    let jobs = job_file(&nats.path("jobs"), "chain.yaml", JOBS);
    let refused = ax(&nats.url(), &["job", "apply", "-f", jobs.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("denied: no token"),
        "{}",
        stderr(&refused)
    );
    assert!(client.jobs().await.unwrap().is_empty());
    let out = as_(
        &nats,
        &admin,
        &["job", "apply", "-f", jobs.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));

    let ops = token(&nats, &admin, "ops", "operator");
    let viewer = token(&nats, &admin, "watcher", "viewer");
    let viewer_secret = std::fs::read_to_string(&viewer).unwrap();

    // A viewer cannot trigger: not through the CLI, not with a raw message of its own.
    let out = as_(&nats, &viewer, &["job", "trigger", "up"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("`trigger` needs the operator role; token `watcher` is viewer"),
        "{}",
        stderr(&out)
    );
    for token in [None, Some(viewer_secret.trim()), Some("axt_watcher_0000")] {
        let reply = raw_command(&client, "trigger", r#"{"name": "up"}"#, token).await;
        assert!(!reply.ok && reply.denied, "{reply:?}");
        assert!(reply.errors[0].starts_with("denied: "), "{reply:?}");
    }
    assert!(
        instances(&client, "up").await.is_empty(),
        "a denied trigger ran"
    );

    // An operator can; a plain re-run of one instance needs no approval.
    let up = {
        let out = as_(
            &nats,
            &ops,
            &["job", "trigger", "up", "--biz-date", "2026-12-01"],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out).split_whitespace().next().unwrap().to_string()
    };
    final_record(&client, &up, Duration::from_secs(30)).await;
    let down = wait_for(Duration::from_secs(30), "down to run", || async {
        instances(&client, "down")
            .await
            .into_iter()
            .find(|r| r.state == State::Success)
    })
    .await;

    // A forced re-run by the operator waits for an admin, the plan unchanged until then.
    let out = as_(
        &nats,
        &ops,
        &["rerun", "--instance", &up, "--force-downstream"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let first = approval_id(&out);
    let attempt_of = |id: String| {
        let client = client.clone();
        async move {
            let id: ax_bus::ids::InstanceId = id.parse().unwrap();
            client.instance(&id).await.unwrap().unwrap().0.attempt
        }
    };
    assert_eq!(attempt_of(up.clone()).await, 1);
    // The operator cannot approve it (nor could any requester their own).
    let out = as_(&nats, &ops, &["approvals", "approve", &first]);
    assert!(
        stderr(&out).contains("denied: deciding an approval needs the admin role"),
        "{}",
        stderr(&out)
    );
    // An admin approves: run exactly once, upstream and forced downstream.
    let out = as_(&nats, &admin, &["approvals", "approve", &first]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("approved by admin"),
        "{}",
        stdout(&out)
    );
    wait_for(Duration::from_secs(30), "both to run again", || async {
        let up_again = final_record(&client, &up, Duration::from_secs(30)).await;
        let down_again = final_record(&client, &down.instance_id, Duration::from_secs(30)).await;
        (up_again.attempt == 2 && down_again.attempt == 2).then_some(())
    })
    .await;
    let out = as_(&nats, &admin, &["approvals", "approve", &first]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("already"), "{}", stderr(&out));
    assert_eq!(attempt_of(up.clone()).await, 2);

    // A plan that changed between the request and the approval is refused.
    let out = as_(
        &nats,
        &ops,
        &["rerun", "--instance", &up, "--force-downstream"],
    );
    let second = approval_id(&out);
    let out = as_(
        &nats,
        &admin,
        &["instance", "mark", &up, "--failed", "--reason", "bad data"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = as_(&nats, &admin, &["approvals", "approve", &second]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("the plan changed"),
        "{}",
        stderr(&out)
    );
    assert_eq!(attempt_of(up.clone()).await, 2);

    // Revoked: refused at once, by whichever Scheduler takes the command.
    let out = as_(&nats, &admin, &["auth", "token", "revoke", "ops"]);
    assert!(out.status.success(), "{}", stderr(&out));
    for _ in 0..4 {
        let out = as_(&nats, &ops, &["job", "pause", "up"]);
        assert!(
            stderr(&out).contains("token `ops` was revoked"),
            "{}",
            stderr(&out)
        );
    }

    // The audit: requester and approver, denials, and no secret anywhere.
    let out = as_(&nats, &viewer, &["audit", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let records: Vec<AuditRecord> = serde_json::from_str(&stdout(&out)).unwrap();
    let approved_rerun = records
        .iter()
        .find(|r| r.action == "rerun" && r.approved_by.is_some())
        .expect("the approved re-run in the audit");
    assert_eq!(
        (
            approved_rerun.actor.as_str(),
            approved_rerun.approved_by.as_deref(),
            approved_rerun.approval.as_ref().map(|a| a.to_string())
        ),
        ("ops", Some("admin"), Some(first.clone()))
    );
    assert!(records
        .iter()
        .any(|r| r.action == "trigger" && r.actor == "watcher" && r.outcome == Outcome::Denied));
    assert!(records
        .iter()
        .any(|r| r.action == "rerun" && r.actor == "ops" && r.outcome == Outcome::Pending));
    assert!(records
        .iter()
        .any(|r| r.action == "token.revoke" && r.actor == "admin" && r.outcome == Outcome::Done));
    let listed = stdout(&as_(&nats, &admin, &["auth", "token", "list", "--json"]));
    let record = stdout(&as_(&nats, &viewer, &["instance", "get", &up, "--json"]));
    for file in [&admin, &ops, &viewer] {
        let secret = std::fs::read_to_string(file).unwrap();
        let secret = secret.trim();
        let tail = &secret[secret.len() - 64..];
        for (place, text) in [
            ("the audit", stdout(&out)),
            ("the token list", listed.clone()),
            ("an instance record", record.clone()),
            ("node n1's log", n1.log_text()),
            ("node n2's log", n2.log_text()),
        ] {
            assert!(!text.contains(tail), "a token's secret in {place}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_admin_approves_in_time_and_no_one_approves_their_own() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let config = "[auth]\nenabled = true\nrequire_second_admin = true\napproval_ttl = \"3s\"\n";
    let _node = AxProcess::configured(&nats, "n1", "all", config);
    let admin = bootstrap(&nats).await;
    // A role that does not exist: one line, nothing made.
    let out = as_(
        &nats,
        &admin,
        &["auth", "token", "create", "--name", "x", "--role", "root"],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("`root` is not a role (viewer, operator, admin)"),
        "{}",
        stderr(&out)
    );
    let boss = token(&nats, &admin, "boss", "admin");
    let jobs = job_file(&nats.path("jobs"), "chain.yaml", JOBS);
    let out = as_(
        &nats,
        &admin,
        &["job", "apply", "-f", jobs.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = as_(
        &nats,
        &admin,
        &["job", "trigger", "up", "--biz-date", "2026-12-01"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let up = stdout(&out).split_whitespace().next().unwrap().to_string();
    final_record(&client, &up, Duration::from_secs(30)).await;

    // With require_second_admin, an admin's own forced re-run waits too, and they cannot
    // approve it themselves.
    let ask = || {
        as_(
            &nats,
            &admin,
            &["rerun", "--instance", &up, "--force-downstream"],
        )
    };
    let first = approval_id(&ask());
    let out = as_(&nats, &admin, &["approvals", "approve", &first]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("admin asked for it; another admin must approve it"),
        "{}",
        stderr(&out)
    );
    // Not decided in time: expired (as the listing finds it), and refused.
    wait_for(
        Duration::from_secs(15),
        "the approval to expire",
        || async {
            let out = as_(&nats, &boss, &["approvals", "list", "--json"]);
            let listed: serde_json::Value = serde_json::from_str(&stdout(&out)).ok()?;
            (listed[0]["state"] == "expired").then_some(())
        },
    )
    .await;
    let out = as_(&nats, &boss, &["approvals", "approve", &first]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("is expired already"),
        "{}",
        stderr(&out)
    );

    // Asked again and approved in time by the other admin: run once.
    let second = approval_id(&ask());
    let out = as_(&nats, &boss, &["approvals", "approve", &second]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for(Duration::from_secs(30), "the re-run", || async {
        let id: ax_bus::ids::InstanceId = up.parse().unwrap();
        let (record, _) = client.instance(&id).await.unwrap()?;
        (record.attempt == 2 && record.state.is_final()).then_some(())
    })
    .await;
    let records = client
        .audit_since(chrono::DateTime::UNIX_EPOCH)
        .await
        .unwrap();
    let expired = records
        .iter()
        .filter(|r| r.action == "approval.expire")
        .count();
    assert_eq!(expired, 1, "{records:?}");
    assert!(records.iter().any(|r| r.action == "rerun"
        && r.actor == "admin"
        && r.approved_by.as_deref() == Some("boss")));
}

/// Makes a token of `role` in `namespace` only, with the admin's, and returns its file.
fn namespace_token(
    nats: &TestNats,
    admin: &Path,
    name: &str,
    role: &str,
    namespace: &str,
) -> PathBuf {
    token_with(nats, admin, (name, role), &["-n", namespace])
}

const TEAMS: &str = "version: v1
job: { namespace: a, name: up, exec: { type: noop } }
---
version: v1
job:
  namespace: b
  name: down
  deps: [{ name: a/up, biz_date: current }]
  exec: { type: noop }
---
version: v1
job: { namespace: b, name: other, exec: { type: noop } }
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_of_a_namespace_acts_in_it_and_is_denied_elsewhere_naming_the_namespace() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let _node = AxProcess::node(&nats, "n1", "all", &["--auth"]);
    let admin = bootstrap(&nats).await;
    let jobs = job_file(&nats.path("jobs"), "teams.yaml", TEAMS);
    let out = as_(
        &nats,
        &admin,
        &["job", "apply", "-f", jobs.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let a_ops = namespace_token(&nats, &admin, "a-ops", "operator", "a");
    let b_admin = namespace_token(&nats, &admin, "b-admin", "admin", "b");
    let denied = |out: &std::process::Output, said: &str| {
        assert!(!out.status.success(), "allowed: {}", stdout(out));
        assert!(stderr(out).contains(said), "{}", stderr(out));
    };

    // In its namespace, an operator of `a` triggers (a short name is placed by -n).
    let date = "2026-12-01";
    let up = {
        let out = as_(
            &nats,
            &a_ops,
            &["job", "trigger", "-n", "a", "up", "--biz-date", date],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out).split_whitespace().next().unwrap().to_string()
    };
    // Elsewhere it is denied, each refusal naming the namespace and the role it needs.
    let out = as_(&nats, &a_ops, &["job", "trigger", "b/other"]);
    denied(
        &out,
        "`trigger` needs the operator role in namespace `b`; token `a-ops` is operator in a",
    );
    let out = as_(&nats, &a_ops, &["job", "pause", "b/other"]);
    denied(&out, "`pause` needs the operator role in namespace `b`");
    let out = as_(&nats, &a_ops, &["queue", "pause", "low"]);
    denied(
        &out,
        "`queue` needs the admin role; token `a-ops` is operator in a",
    );
    let out = as_(&nats, &a_ops, &["rerun", "--biz-date", date, "--yes"]);
    denied(&out, "`rerun` needs the operator role in every namespace");

    // The downstream in `b` ran after the upstream in `a`.
    let up_done = final_record(&client, &up, Duration::from_secs(30)).await;
    assert_eq!(up_done.state, State::Success);
    let down = wait_for(Duration::from_secs(30), "b.down to run", || async {
        instances(&client, "b.down")
            .await
            .into_iter()
            .find(|r| r.state == State::Success)
    })
    .await;
    // `b`'s instance is out of reach of `a`'s operator; a re-run of `a`'s that would force
    // `b`'s downstream to run again is refused whole.
    let out = as_(&nats, &a_ops, &["instance", "cancel", &down.instance_id]);
    denied(&out, "needs the operator role in namespace `b`");
    // Nor read: the CLI reads a record through the Schedulers when it has a token.
    let out = as_(&nats, &a_ops, &["instance", "get", &down.instance_id]);
    denied(
        &out,
        "`instance` needs the viewer role in namespace `b`; token `a-ops` is operator in a",
    );
    let out = as_(&nats, &a_ops, &["instance", "get", &up, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("\"instance_id\": \"{up}\"")),
        "{}",
        stdout(&out)
    );
    let out = as_(
        &nats,
        &a_ops,
        &["rerun", "--instance", &up, "--force-downstream"],
    );
    denied(&out, "the re-run reaches b.down.");
    let out = as_(&nats, &a_ops, &["rerun", "--instance", &up]);
    assert!(out.status.success(), "{}", stderr(&out));

    // An admin of `b` defines `b`'s jobs, and no other's.
    let more = job_file(
        &nats.path("jobs"),
        "more.yaml",
        "version: v1\njob: { namespace: b, name: extra, exec: { type: noop } }\n",
    );
    let out = as_(
        &nats,
        &b_admin,
        &["job", "apply", "-f", more.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let theirs = job_file(
        &nats.path("jobs"),
        "theirs.yaml",
        "version: v1\njob: { namespace: a, name: sneaky, exec: { type: noop } }\n",
    );
    let out = as_(
        &nats,
        &b_admin,
        &["job", "apply", "-f", theirs.to_str().unwrap()],
    );
    denied(&out, "`apply` needs the admin role in namespace `a`");
    let out = as_(&nats, &b_admin, &["job", "delete", "a/up"]);
    denied(&out, "`delete` needs the admin role in namespace `a`");
    // Nor re-runs the upstream its downstream waited for.
    let out = as_(&nats, &b_admin, &["rerun", "--instance", &up]);
    denied(&out, "`rerun` needs the operator role in namespace `a`");

    // A second person's approval of a forced re-run comes from an admin of its namespace.
    let b_ops = namespace_token(&nats, &admin, "b-ops", "operator", "b");
    let a_admin = namespace_token(&nats, &admin, "a-admin", "admin", "a");
    let other = {
        let out = as_(&nats, &admin, &["job", "trigger", "b/other"]);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out).split_whitespace().next().unwrap().to_string()
    };
    final_record(&client, &other, Duration::from_secs(30)).await;
    let out = as_(
        &nats,
        &b_ops,
        &["rerun", "--instance", &other, "--force-downstream"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let asked = approval_id(&out);
    let out = as_(&nats, &a_admin, &["approvals", "approve", &asked]);
    denied(
        &out,
        "deciding an approval needs the admin role in namespace `b`; token `a-admin` is admin in a",
    );
    // The admin of `b` sees it among the approvals, and approves it.
    let listed = as_(&nats, &b_admin, &["approvals", "list"]);
    assert!(stdout(&listed).contains(&asked), "{}", stdout(&listed));
    let listed = as_(&nats, &a_admin, &["approvals", "list"]);
    assert!(!stdout(&listed).contains(&asked), "{}", stdout(&listed));
    let out = as_(&nats, &b_admin, &["approvals", "approve", &asked]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for(Duration::from_secs(30), "b.other to run again", || async {
        let again = final_record(&client, &other, Duration::from_secs(30)).await;
        (again.attempt == 2).then_some(())
    })
    .await;
    let names: Vec<String> = client
        .jobs()
        .await
        .unwrap()
        .into_iter()
        .map(|j| j.spec.name.to_string())
        .collect();
    assert_eq!(names, ["a.up", "b.down", "b.extra", "b.other"]);
    let listed = as_(&nats, &admin, &["auth", "token", "list"]);
    assert!(
        stdout(&listed).contains("operator in a"),
        "{}",
        stdout(&listed)
    );
    // The audit names where each command acted: `-n b` lists the denied trigger of `b`'s job
    // and the apply in `b`, and nothing that acted elsewhere only.
    let of_b = wait_for(Duration::from_secs(30), "the audit of b", || async {
        let out = as_(&nats, &admin, &["audit", "list", "-n", "b", "--json"]);
        let records: Vec<AuditRecord> = serde_json::from_slice(&out.stdout).ok()?;
        records
            .iter()
            .any(|r| r.action == "apply" && r.actor == "b-admin" && r.outcome == Outcome::Done)
            .then_some(records)
    })
    .await;
    assert!(
        of_b.iter().any(|r| r.action == "trigger"
            && r.actor == "a-ops"
            && r.outcome == Outcome::Denied
            && r.namespaces == ["b"]),
        "{of_b:?}"
    );
    assert!(of_b.iter().all(|r| r.namespaces.iter().any(|n| n == "b")));
}
