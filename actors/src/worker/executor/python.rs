//! The `python` executor: runs `exec.script` or `exec.module` with the attempt's params as JSON
//! on stdin and as `AX_*` variables (the same environment as a shell command), each of
//! `exec.args` one argument with its placeholders substituted (no shell in between).
//!
//! With `exec.venv`, the attempt runs in that virtualenv; a worker that does not have it yet
//! makes it first (`python3 -m venv`, then `pip install` of `exec.requirements`) — the
//! article's per-plugin environments, so that two jobs needing different library versions
//! never share one. A finished virtualenv is marked with the requirements it holds; one whose
//! making was interrupted, or whose requirements changed, is made again — only when ax made
//! the directory: an existing directory ax did not make is never cleared (the attempt fails
//! saying so). Attempts of the same virtualenv wait for each other while it is made.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use futures::future::BoxFuture;

use ax_bus::messages::ExecutorInfo;
use ax_bus::spec::template::{Scope, Template};
use ax_bus::spec::{readable_upstream, Builtin, ExecSpec, PythonEntry};

use super::child::Child;
use super::{
    builtin, mismatched, AttemptContext, ExecResult, Executor, ExecutorError, ExecutorsConfig,
};
use crate::worker::process::{self, Exit, OnTimeout, ProcessSpec, TAIL_BYTES};
use ax_bus::instance::Tag;

/// The file that marks a finished virtualenv; it holds the requirements installed.
const READY_MARK: &str = ".ax-ready";
/// The file that marks a directory ax made for a virtualenv, written before anything else goes
/// in: only such a directory is ever cleared and made again. A directory without it (a user's
/// data, a virtualenv made by hand) is never touched, and the attempt fails saying so.
const MADE_MARK: &str = ".ax-made";
/// How long making a virtualenv (with its requirements) may take.
const VENV_TIMEOUT: Duration = Duration::from_secs(600);

/// See the module.
#[derive(Default)]
pub(crate) struct Python {
    interpreter: String,
    making: DashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>,
}

impl Python {
    fn interpreter_for(&self, venv: Option<&str>) -> PathBuf {
        match venv {
            Some(dir) => Path::new(dir).join("bin").join("python"),
            None => PathBuf::from(&self.interpreter),
        }
    }

    /// Makes `venv` with `requirements` unless it is there, marked with the same ones.
    async fn ensure_venv(&self, venv: &Path, requirements: &[String]) -> Result<(), String> {
        let mark = requirements.join("\n");
        let ready = || std::fs::read_to_string(venv.join(READY_MARK)).ok() == Some(mark.clone());
        if ready() {
            return Ok(());
        }
        let lock = self.making.entry(venv.to_path_buf()).or_default().clone();
        let _making = lock.lock().await;
        if ready() {
            return Ok(());
        }
        make_dir(venv)?;
        // pip goes in only where ax installs with it: a virtualenv made without requirements
        // is remade when some are added, and `ensurepip` is most of a making's time (seconds
        // against a tenth of one).
        let dir = venv.display().to_string();
        let mut args = vec!["-m", "venv"];
        if requirements.is_empty() {
            args.push("--without-pip");
        }
        args.push(&dir);
        step(&self.interpreter, &args, "make the virtualenv").await?;
        if !requirements.is_empty() {
            let pip = venv.join("bin").join("pip");
            let mut args = vec!["install", "--quiet", "--disable-pip-version-check"];
            args.extend(requirements.iter().map(String::as_str));
            step(
                &pip.display().to_string(),
                &args,
                "install the requirements",
            )
            .await?;
        }
        std::fs::write(venv.join(READY_MARK), mark)
            .map_err(|e| format!("cannot mark the virtualenv ready: {e}"))
    }
}

/// Makes `venv` an empty directory marked as ax's, clearing what a previous making left there
/// — only when ax made it ([`MADE_MARK`]); anything else at that path stays as it is.
fn make_dir(venv: &Path) -> Result<(), String> {
    if venv.exists() {
        if !venv.join(MADE_MARK).is_file() {
            return Err(format!(
                "{} exists and was not made by ax (no {MADE_MARK} in it): not touching it; \
                 name a new directory, or remove this one yourself",
                venv.display()
            ));
        }
        // Moved aside first, in one step, so that a crash while clearing never leaves the
        // path holding a directory without the mark.
        let aside = venv.with_file_name(format!(
            ".{}.ax-clearing-{}",
            venv.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            std::process::id()
        ));
        std::fs::rename(venv, &aside)
            .map_err(|e| format!("cannot move the old virtualenv aside: {e}"))?;
        if let Err(e) = std::fs::remove_dir_all(&aside) {
            tracing::warn!(dir = %aside.display(), error = %e, "old virtualenv not removed");
        }
    }
    std::fs::create_dir_all(venv).map_err(|e| format!("cannot make {}: {e}", venv.display()))?;
    std::fs::write(venv.join(MADE_MARK), "made by ax for a virtualenv\n")
        .map_err(|e| format!("cannot mark {} as ax's: {e}", venv.display()))
}

/// Runs one step of making a virtualenv.
async fn step(program: &str, args: &[&str], what: &str) -> Result<(), String> {
    let spec = ProcessSpec {
        program: PathBuf::from(program),
        args: args.iter().map(|a| a.to_string()).collect(),
        env: Vec::new(),
        workdir: None,
        timeout: VENV_TIMEOUT,
        on_timeout: OnTimeout {
            dump_signal: None,
            grace: Duration::ZERO,
        },
        stdin: None,
        stdout_limit: TAIL_BYTES,
        groups: None,
        confine: None,
        log: None,
    };
    let ran = process::run(&spec, None).await;
    match ran.exit {
        Exit::Code(0) => Ok(()),
        exit => Err(format!(
            "cannot {what} ({program} {}): {exit:?}: {}",
            args.join(" "),
            ran.stderr_tail.trim()
        )),
    }
}

impl Executor for Python {
    fn init(&mut self, config: &ExecutorsConfig) -> Result<(), ExecutorError> {
        self.interpreter = if config.python.is_empty() {
            "python3".to_string()
        } else {
            config.python.clone()
        };
        Ok(())
    }

    fn describe(&self) -> ExecutorInfo {
        builtin(
            Builtin::Python,
            "runs exec.script or exec.module (params as JSON on stdin), optionally in a per-job virtualenv",
        )
    }

    fn prepare<'a>(&'a self, ctx: &'a AttemptContext<'a>) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let ExecSpec::Python(exec) = &ctx.work.spec.exec else {
                return Ok(());
            };
            if let PythonEntry::Script(script) = &exec.entry {
                let path = match &exec.workdir {
                    Some(dir) => Path::new(dir).join(script),
                    None => PathBuf::from(script),
                };
                if !path.is_file() {
                    return Err(format!("exec.script: no file {}", path.display()));
                }
            }
            match &exec.venv {
                Some(venv) => self
                    .ensure_venv(Path::new(venv), &exec.requirements)
                    .await
                    .map_err(|e| format!("exec.venv: {e}")),
                None => Ok(()),
            }
        })
    }

    fn run<'a>(&'a self, ctx: &'a AttemptContext<'a>) -> BoxFuture<'a, ExecResult> {
        Box::pin(async move {
            let work = ctx.work;
            let ExecSpec::Python(exec) = &work.spec.exec else {
                return mismatched(work, Builtin::Python);
            };
            let mut args = match &exec.entry {
                PythonEntry::Script(script) => vec![script.clone()],
                PythonEntry::Module(module) => vec!["-m".to_string(), module.clone()],
            };
            let upstream = readable_upstream(&work.spec);
            let scope = Scope {
                params: &work.params,
                upstream: &upstream,
            };
            for (i, arg) in exec.args.iter().enumerate() {
                match Template::parse(arg, &scope) {
                    Ok(t) => args.push(t.render_value(&|p| ctx.values.text(work, p))),
                    Err(reason) => {
                        return ExecResult::failed(
                            Tag::ExecutorError,
                            format!("exec.args[{i}]: {reason}"),
                        )
                    }
                }
            }
            let mut child = Child::new(self.interpreter_for(exec.venv.as_deref()), args);
            child.stdin = Some(serde_json::to_vec(&work.params).unwrap_or_default());
            child.run(ctx).await.0
        })
    }
}
