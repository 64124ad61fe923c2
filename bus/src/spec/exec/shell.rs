//! `type: shell`: a command run by `/bin/sh -c`.

use std::collections::BTreeMap;

use super::{check_template, not_blank, MAX_COMMAND_BYTES};
use crate::spec::{JobSpec, SpecError};

/// The settings of a shell job.
#[derive(Clone, Debug, PartialEq)]
pub struct ShellExec {
    /// The command, run by `/bin/sh -c` in its own process group, with placeholders
    /// substituted safely.
    pub command: String,
    /// The working directory (the worker's own when absent).
    pub workdir: Option<String>,
    /// Extra environment variables (literal values, never templates).
    pub env: BTreeMap<String, String>,
}

impl ShellExec {
    /// The settings it takes besides `type`.
    pub(super) const SETTINGS: &'static [&'static str] = &["command", "workdir", "env"];

    /// `ax job init`'s block for it.
    pub(super) const STARTING_SPEC: &'static str = "  exec:
    type: shell
    # Run by /bin/sh -c in its own process group; {{biz_date}}, {{instance_id}} and
    # {{params.<name>}} are filled in, and params are also in $AX_PARAM_<name>. JSON written to
    # $AX_OUTPUT_FILE becomes the result's output.
    command: >-
      echo \"working on {{biz_date}} for {{params.customer}}\" &&
      printf '{\"rows\": %d}' 3 > \"$AX_OUTPUT_FILE\"
    # workdir: /srv/app
    # env: { LOG_LEVEL: info }
";

    pub(super) fn validate(&self, job: &JobSpec, errors: &mut Vec<SpecError>) {
        if !not_blank(&self.command, "command", errors) {
            return;
        }
        check_template(&self.command, job, "job.exec.command", errors);
        if self.command.len() > MAX_COMMAND_BYTES {
            errors.push(SpecError::new(
                "job.exec.command",
                format!(
                    "{} bytes is more than {MAX_COMMAND_BYTES}, the longest argument Linux \
                     passes to `/bin/sh -c` (put a longer script in a file)",
                    self.command.len()
                ),
            ));
        }
    }
}
