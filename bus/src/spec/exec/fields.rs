//! `job.exec` as users write it and the wire carries it: one flat map keyed by `type`, every
//! executor's settings side by side. It becomes an [`ExecSpec`] only if the executor takes
//! every setting given and is given every setting it needs; otherwise each problem is named
//! (a setting of another executor says which ones take it, and the built-in meant by a
//! misspelt `type`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::plugin::unknown;
use super::{
    is_plugin_name, meant_builtin, Builtin, ExecSpec, HttpExec, PluginExec, PythonEntry,
    PythonExec, ShellExec, SqlExec, SqlOutput, SuccessWhen,
};
use crate::spec::SpecError;

/// Every executor's settings in one map; which apply depends on `type`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecFields {
    /// `shell`, `http`, `python`, `sql`, `noop` or a plugin's name.
    #[serde(rename = "type")]
    pub kind: String,
    /// shell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// shell, python, plugins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// shell, python, plugins.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// http.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// http.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// http.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub header_env: BTreeMap<String, String>,
    /// http.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_when: Option<SuccessWhen>,
    /// python.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// python.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// python.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// python.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub venv: Option<String>,
    /// python.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<String>,
    /// sql.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
    /// sql.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statement: Option<String>,
    /// sql.
    #[serde(default, skip_serializing_if = "crate::spec::is_default")]
    pub output: SqlOutput,
    /// plugins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub with: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Why an `exec` map is no [`ExecSpec`]: each problem with its field.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub struct ExecProblems(pub Vec<SpecError>);

impl std::fmt::Display for ExecProblems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", problem.field, problem.reason)?;
        }
        Ok(())
    }
}

impl ExecFields {
    /// The settings given besides `type`.
    fn given(&self) -> Vec<&'static str> {
        [
            ("command", self.command.is_some()),
            ("workdir", self.workdir.is_some()),
            ("env", !self.env.is_empty()),
            ("url", self.url.is_some()),
            ("headers", !self.headers.is_empty()),
            ("header_env", !self.header_env.is_empty()),
            ("success_when", self.success_when.is_some()),
            ("script", self.script.is_some()),
            ("module", self.module.is_some()),
            ("args", !self.args.is_empty()),
            ("venv", self.venv.is_some()),
            ("requirements", !self.requirements.is_empty()),
            ("database", self.database.is_some()),
            ("statement", self.statement.is_some()),
            ("output", self.output != SqlOutput::default()),
            ("with", self.with.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect()
    }
}

/// Who takes `setting`: the built-ins' names, and `plugin`.
fn takers(setting: &str) -> Vec<&'static str> {
    Builtin::ALL
        .into_iter()
        .filter(|b| b.settings().contains(&setting))
        .map(Builtin::name)
        .chain(PluginExec::SETTINGS.contains(&setting).then_some("plugin"))
        .collect()
}

/// A setting the executor needs: the problem is named when it is missing.
fn needed(
    value: Option<String>,
    field: &str,
    executor: Builtin,
    problems: &mut Vec<SpecError>,
) -> String {
    value.unwrap_or_else(|| {
        problems.push(SpecError::new(
            format!("job.exec.{field}"),
            format!("the {} executor needs `{field}`", executor.name()),
        ));
        String::new()
    })
}

impl TryFrom<ExecFields> for ExecSpec {
    type Error = ExecProblems;

    fn try_from(fields: ExecFields) -> Result<Self, ExecProblems> {
        let builtin = Builtin::named(&fields.kind);
        let takes = builtin.map_or(PluginExec::SETTINGS, Builtin::settings);
        let foreign: Vec<&str> = fields
            .given()
            .into_iter()
            .filter(|setting| !takes.contains(setting))
            .collect();
        if builtin.is_none() && !is_plugin_name(&fields.kind) && !foreign.is_empty() {
            // Neither a built-in nor a plugin: the settings say nothing more.
            return Err(ExecProblems(vec![unknown(&fields.kind)]));
        }
        let mut problems = Vec::new();
        for setting in foreign {
            let who = match builtin {
                Some(builtin) => format!("the {} executor", builtin.name()),
                None => format!("a plugin executor (`{}`)", fields.kind),
            };
            let hint = meant_builtin(&fields.kind)
                .map(|meant| format!("; did you mean `type: {meant}`?"))
                .unwrap_or_default();
            problems.push(SpecError::new(
                format!("job.exec.{setting}"),
                format!(
                    "{who} takes no `{setting}` (a setting of: {}){hint}",
                    takers(setting).join(", ")
                ),
            ));
        }
        let spec = match builtin {
            Some(Builtin::Shell) => ExecSpec::Shell(ShellExec {
                command: needed(fields.command, "command", Builtin::Shell, &mut problems),
                workdir: fields.workdir,
                env: fields.env,
            }),
            Some(Builtin::Http) => ExecSpec::Http(HttpExec {
                url: needed(fields.url, "url", Builtin::Http, &mut problems),
                headers: fields.headers,
                header_env: fields.header_env,
                success_when: fields.success_when,
            }),
            Some(Builtin::Python) => {
                let entry = match (fields.script, fields.module) {
                    (Some(script), None) => PythonEntry::Script(script),
                    (None, Some(module)) => PythonEntry::Module(module),
                    (None, None) => {
                        problems.push(SpecError::new(
                            "job.exec.script",
                            "the python executor needs `script` or `module`",
                        ));
                        PythonEntry::Script(String::new())
                    }
                    (Some(script), Some(_)) => {
                        problems.push(SpecError::new(
                            "job.exec.module",
                            "give `script` or `module`, not both",
                        ));
                        PythonEntry::Script(script)
                    }
                };
                ExecSpec::Python(PythonExec {
                    entry,
                    args: fields.args,
                    venv: fields.venv,
                    requirements: fields.requirements,
                    workdir: fields.workdir,
                    env: fields.env,
                })
            }
            Some(Builtin::Sql) => ExecSpec::Sql(SqlExec {
                database: needed(fields.database, "database", Builtin::Sql, &mut problems),
                statement: needed(fields.statement, "statement", Builtin::Sql, &mut problems),
                output: fields.output,
            }),
            Some(Builtin::Noop) => ExecSpec::Noop,
            None => ExecSpec::Plugin(PluginExec {
                name: fields.kind,
                with: fields.with,
                workdir: fields.workdir,
                env: fields.env,
            }),
        };
        if problems.is_empty() {
            Ok(spec)
        } else {
            Err(ExecProblems(problems))
        }
    }
}

impl From<ExecSpec> for ExecFields {
    fn from(spec: ExecSpec) -> Self {
        let kind = spec.name().to_string();
        match spec {
            ExecSpec::Shell(shell) => ExecFields {
                kind,
                command: Some(shell.command),
                workdir: shell.workdir,
                env: shell.env,
                ..ExecFields::default()
            },
            ExecSpec::Http(http) => ExecFields {
                kind,
                url: Some(http.url),
                headers: http.headers,
                header_env: http.header_env,
                success_when: http.success_when,
                ..ExecFields::default()
            },
            ExecSpec::Python(python) => {
                let (script, module) = match python.entry {
                    PythonEntry::Script(script) => (Some(script), None),
                    PythonEntry::Module(module) => (None, Some(module)),
                };
                ExecFields {
                    kind,
                    script,
                    module,
                    args: python.args,
                    venv: python.venv,
                    requirements: python.requirements,
                    workdir: python.workdir,
                    env: python.env,
                    ..ExecFields::default()
                }
            }
            ExecSpec::Sql(sql) => ExecFields {
                kind,
                database: Some(sql.database),
                statement: Some(sql.statement),
                output: sql.output,
                ..ExecFields::default()
            },
            ExecSpec::Noop => ExecFields {
                kind,
                ..ExecFields::default()
            },
            ExecSpec::Plugin(plugin) => ExecFields {
                kind,
                with: plugin.with,
                workdir: plugin.workdir,
                env: plugin.env,
                ..ExecFields::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(fields: ExecFields) -> Vec<String> {
        match ExecSpec::try_from(fields) {
            Ok(spec) => panic!("became {spec:?}"),
            Err(ExecProblems(problems)) => problems.into_iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn each_executor_needs_its_settings_and_takes_no_others() {
        let http = ExecFields {
            kind: "http".into(),
            command: Some("echo".into()),
            ..ExecFields::default()
        };
        assert_eq!(
            problems(http),
            vec![
                "job.exec.command: the http executor takes no `command` (a setting of: shell)",
                "job.exec.url: the http executor needs `url`"
            ]
        );
        let sql = ExecFields {
            kind: "sql".into(),
            database: Some("main".into()),
            ..ExecFields::default()
        };
        assert_eq!(
            problems(sql),
            vec!["job.exec.statement: the sql executor needs `statement`"]
        );
        let python = ExecFields {
            kind: "python".into(),
            ..ExecFields::default()
        };
        assert_eq!(
            problems(python.clone()),
            vec!["job.exec.script: the python executor needs `script` or `module`"]
        );
        let both = ExecFields {
            script: Some("a.py".into()),
            module: Some("a".into()),
            ..python
        };
        assert_eq!(
            problems(both),
            vec!["job.exec.module: give `script` or `module`, not both"]
        );
        // Every setting is somebody's: the table names who takes each one given.
        let shared = ExecFields {
            kind: "noop".into(),
            workdir: Some("/tmp".into()),
            ..ExecFields::default()
        };
        assert_eq!(
            problems(shared),
            vec!["job.exec.workdir: the noop executor takes no `workdir` (a setting of: python, shell, plugin)"]
        );
    }

    #[test]
    fn a_type_that_is_neither_built_in_nor_a_plugin_is_named_as_such() {
        let cobol = ExecFields {
            kind: "Cobol".into(),
            command: Some("run".into()),
            ..ExecFields::default()
        };
        let said = problems(cobol);
        assert_eq!(said.len(), 1);
        assert!(
            said[0].starts_with("job.exec.type: unknown executor `Cobol`"),
            "{said:?}"
        );
        // A plugin's form: its settings are what it is told about.
        let misspelt = ExecFields {
            kind: "shel".into(),
            command: Some("true".into()),
            ..ExecFields::default()
        };
        assert_eq!(
            problems(misspelt),
            vec!["job.exec.command: a plugin executor (`shel`) takes no `command` (a setting of: shell); did you mean `type: shell`?"]
        );
    }

    #[test]
    fn every_executor_goes_to_the_wire_and_back_unchanged() {
        let examples = [
            r#"{"type":"shell","command":"echo {{biz_date}}","workdir":"/srv","env":{"A":"1"}}"#,
            r#"{"type":"http","url":"https://x/run","headers":{"X-T":"b"},"header_env":{"Authorization":"TOKEN"},"success_when":{"path":"/ok","equals":true}}"#,
            r#"{"type":"python","module":"m","args":["--d","{{biz_date}}"],"venv":"v","requirements":["r==1"]}"#,
            r#"{"type":"python","script":"a.py"}"#,
            r#"{"type":"sql","database":"main","statement":"select 1","output":"first_row"}"#,
            r#"{"type":"noop"}"#,
            r#"{"type":"line-count","with":{"n":3},"env":{"B":"2"}}"#,
        ];
        for example in examples {
            let spec: ExecSpec = serde_json::from_str(example).unwrap();
            let back: serde_json::Value = serde_json::to_value(&spec).unwrap();
            let want: serde_json::Value = serde_json::from_str(example).unwrap();
            assert_eq!(back, want, "{example}");
            let packed = rmp_serde::to_vec_named(&spec).unwrap();
            assert_eq!(rmp_serde::from_slice::<ExecSpec>(&packed).unwrap(), spec);
        }
    }

    #[test]
    fn a_map_that_is_no_exec_spec_says_why_when_decoded() {
        let e = serde_json::from_str::<ExecSpec>(r#"{"type":"shell","url":"http://x"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("job.exec.url: the shell executor takes no `url`")
                && e.contains("job.exec.command: the shell executor needs `command`"),
            "{e}"
        );
    }
}
