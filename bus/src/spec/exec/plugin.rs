//! A plugin executor: one a worker's plugin directory offers, by name.

use std::collections::BTreeMap;

use super::{builtin_names, is_plugin_name};
use crate::spec::SpecError;

/// The settings of a job run by a plugin.
#[derive(Clone, Debug, PartialEq)]
pub struct PluginExec {
    /// The plugin's name (its `type`). Its form is one of the spec's rules, not of the
    /// representation: a forged message naming a path reaches the Router, which fails it.
    pub name: String,
    /// Settings handed to the plugin as they are (a JSON object).
    pub with: Option<serde_json::Map<String, serde_json::Value>>,
    /// The working directory (the worker's own when absent).
    pub workdir: Option<String>,
    /// Extra environment variables (literal values, never templates).
    pub env: BTreeMap<String, String>,
}

impl PluginExec {
    /// The settings it takes besides `type`.
    pub(super) const SETTINGS: &'static [&'static str] = &["with", "workdir", "env"];

    /// `ax job init`'s block for a plugin of this name.
    pub fn starting_spec(name: &str) -> String {
        format!(
            "  exec:
    type: {name}
    # A plugin executor of the workers' plugin_dir; `with` is handed to it as it is.
    with: {{}}
"
        )
    }

    pub(super) fn validate(&self, errors: &mut Vec<SpecError>) {
        if !is_plugin_name(&self.name) {
            errors.push(unknown(&self.name));
        }
    }
}

/// `type` names no built-in executor and cannot name a plugin.
pub(super) fn unknown(name: &str) -> SpecError {
    SpecError::new(
        "job.exec.type",
        format!(
            "unknown executor `{name}` (built in: {}; a plugin's name matches [a-z][a-z0-9_-]*)",
            builtin_names()
        ),
    )
}
