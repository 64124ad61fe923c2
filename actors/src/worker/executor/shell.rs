//! The `shell` executor: `/bin/sh -c <command>` in its own process group.
//!
//! The command's placeholders become quoted references to `AX_*` variables (see
//! [`ax_bus::spec::template`]), and every value reaches the process only through its
//! environment (see [`super::values::Values::env`]). A command may write JSON to the file
//! named by `AX_OUTPUT_FILE`; it becomes the attempt's structured output.

use futures::future::BoxFuture;

use ax_bus::instance::Tag;
use ax_bus::messages::ExecutorInfo;
use ax_bus::spec::template::{Scope, Template};
use ax_bus::spec::{readable_upstream, Builtin, ExecSpec};

use super::child::Child;
use super::{builtin, mismatched, AttemptContext, ExecResult, Executor};

/// See the module.
pub(crate) struct Shell;

impl Executor for Shell {
    fn describe(&self) -> ExecutorInfo {
        builtin(
            Builtin::Shell,
            "runs exec.command with /bin/sh -c in its own process group",
        )
    }

    fn run<'a>(&'a self, ctx: &'a AttemptContext<'a>) -> BoxFuture<'a, ExecResult> {
        Box::pin(async move {
            let work = ctx.work;
            let ExecSpec::Shell(shell) = &work.spec.exec else {
                return mismatched(work, Builtin::Shell);
            };
            let command = &shell.command;
            let upstream = readable_upstream(&work.spec);
            let scope = Scope {
                params: &work.params,
                upstream: &upstream,
            };
            let template = match Template::parse(command, &scope) {
                Ok(template) => template,
                Err(reason) => {
                    return ExecResult::failed(Tag::SpawnFailed, format!("exec.command: {reason}"))
                }
            };
            let child = Child::new("/bin/sh", vec!["-c".to_string(), template.render_shell()]);
            child.run(ctx).await.0
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::executor::values::Values;
    use ax_bus::ids::{InstanceId, TraceId, WorkerId};
    use ax_bus::messages::WorkItem;
    use tokio::sync::Notify;

    async fn run(
        work: &WorkItem,
        worker: &str,
        scratch: &std::path::Path,
        _: Option<()>,
    ) -> ExecResult {
        let worker = &WorkerId::parse(worker).unwrap();
        let cancel = Notify::new();
        let values = Values::default();
        let ctx = AttemptContext {
            work,
            worker,
            scratch,
            cancel: &cancel,
            values: &values,
            cluster: None,
            log: None,
            confinement: None,
        };
        Shell.run(&ctx).await
    }

    fn work(command: &str, params: serde_json::Value, timeout: u64) -> WorkItem {
        let doc: ax_bus::spec::JobDocument = serde_json::from_value(serde_json::json!({
            "version": "v1",
            "job": {"name": "j", "exec": {"type": "shell", "command": command},
                    "params": params, "timeout": timeout}
        }))
        .unwrap();
        WorkItem {
            attempt: 2,
            ..WorkItem::first(
                InstanceId::parse("j.20260101T000000000Z").unwrap(),
                TraceId::random(),
                "2026-01-01",
                doc.job,
            )
        }
    }

    #[tokio::test]
    async fn placeholders_and_env_reach_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let w = work(
            "echo {{biz_date}} {{attempt}} $AX_JOB $AX_PARAM_n \"{{params.n}}\"",
            serde_json::json!({"n": 7}),
            10,
        );
        let end = run(&w, "w1", dir.path(), None).await;
        assert!(end.success, "{end:?}");
        assert_eq!(end.stdout_tail, "2026-01-01 2 j 7 7\n");
    }

    #[tokio::test]
    async fn shell_metacharacters_in_params_stay_literal() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("pwned");
        let evil = format!(
            "$(touch {m}); touch {m}; `touch {m}` ' \" \\",
            m = marker.display()
        );
        let w = work(
            "printf '%s|' {{params.x}} \"{{params.x}}\" '{{params.x}}'",
            serde_json::json!({ "x": evil }),
            10,
        );
        let end = run(&w, "w1", dir.path(), None).await;
        assert!(end.success, "{end:?}");
        assert!(!marker.exists(), "a param value was executed");
        assert_eq!(end.stdout_tail, format!("{evil}|{evil}|{evil}|"));
    }

    #[tokio::test]
    async fn comments_here_documents_and_substitutions_do_not_fool_the_quoting() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("g1.txt"), "").unwrap();
        std::fs::write(dir.path().join("g2.txt"), "").unwrap();
        let each = "for a in \"$@\"; do printf '[%s]' \"$a\"; done";
        // Each line prints its words in brackets: one bracket each means one whole word.
        let command = [
            format!("cd {}", dir.path().display()),
            "# say \"hi".to_string(),
            format!("sh -c '{each}' - {{{{params.p}}}}; echo"),
            "# don't".to_string(),
            format!("sh -c '{each}' - {{{{params.p}}}}; echo"),
            "cat <<EOF".to_string(),
            "it's [{{params.p}}]".to_string(),
            "EOF".to_string(),
            format!("sh -c '{each}' - \"$(printf %s {{{{params.p}}}})\"; echo"),
        ]
        .join("\n");
        let w = work(&command, serde_json::json!({ "p": "a b *" }), 10);
        let end = run(&w, "w1", dir.path(), None).await;
        assert!(end.success, "{end:?}");
        assert_eq!(
            end.stdout_tail, "[a b *]\n[a b *]\nit's [a b *]\n[a b *]\n",
            "{command}"
        );
    }

    #[tokio::test]
    async fn output_file_becomes_structured_output() {
        let dir = tempfile::tempdir().unwrap();
        let w = work(
            "echo '{\"rows\": 42}' > \"$AX_OUTPUT_FILE\"",
            serde_json::json!({}),
            10,
        );
        let end = run(&w, "w1", dir.path(), None).await;
        assert_eq!(end.output["rows"], 42);
        let w = work(
            "echo 'not json' > \"$AX_OUTPUT_FILE\"",
            serde_json::json!({}),
            10,
        );
        let end = run(&w, "w1", dir.path(), None).await;
        assert!(end.success && end.message.contains("not JSON"), "{end:?}");
    }

    #[tokio::test]
    async fn failures_are_tagged() {
        let dir = tempfile::tempdir().unwrap();
        let end = run(
            &work("exit 4", serde_json::json!({}), 10),
            "w1",
            dir.path(),
            None,
        )
        .await;
        assert_eq!(
            (end.success, end.tag, end.exit_code),
            (false, Tag::ExitCode, Some(4))
        );
        let end = run(
            &work("sleep 30", serde_json::json!({}), 1),
            "w1",
            dir.path(),
            None,
        )
        .await;
        assert_eq!(end.tag, Tag::Timeout);
    }
}
