//! `type: python`: a script or a module, optionally in a per-job virtualenv.

use std::collections::BTreeMap;

use super::check_template;
use crate::spec::{JobSpec, SpecError};

/// The settings of a python job.
#[derive(Clone, Debug, PartialEq)]
pub struct PythonExec {
    /// What runs: a script or a module, never both.
    pub entry: PythonEntry,
    /// Arguments; placeholders are substituted, each argument stays one argument.
    pub args: Vec<String>,
    /// The virtualenv to run in, created on the worker when it does not exist.
    pub venv: Option<String>,
    /// Packages pip installs into `venv` when it is created.
    pub requirements: Vec<String>,
    /// The working directory (the worker's own when absent).
    pub workdir: Option<String>,
    /// Extra environment variables (literal values, never templates).
    pub env: BTreeMap<String, String>,
}

/// What a python job runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PythonEntry {
    /// `script:` a file, run as `python SCRIPT`.
    Script(String),
    /// `module:` a module, run as `python -m MODULE`.
    Module(String),
}

impl PythonExec {
    /// The settings it takes besides `type`.
    pub(super) const SETTINGS: &'static [&'static str] = &[
        "script",
        "module",
        "args",
        "venv",
        "requirements",
        "workdir",
        "env",
    ];

    /// `ax job init`'s block for it.
    pub(super) const STARTING_SPEC: &'static str = "  exec:
    type: python
    # The params arrive as JSON on stdin; JSON written to $AX_OUTPUT_FILE becomes the output.
    script: jobs/report.py
    # module: mypackage.report        # instead of script
    # args: [\"--date\", \"{{biz_date}}\"]
    # venv: report-env                 # one virtualenv per job, made on the worker
    # requirements: [\"requests==2.32.3\"]
";

    pub(super) fn validate(&self, job: &JobSpec, errors: &mut Vec<SpecError>) {
        for (i, arg) in self.args.iter().enumerate() {
            check_template(arg, job, &format!("job.exec.args[{i}]"), errors);
        }
        if !self.requirements.is_empty() && self.venv.is_none() {
            errors.push(SpecError::new(
                "job.exec.requirements",
                "requirements are installed into a virtualenv: set `venv` too",
            ));
        }
    }
}
