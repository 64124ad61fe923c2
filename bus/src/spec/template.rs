//! Placeholders in commands: `{{biz_date}}`, `{{instance_id}}`, `{{trace_id}}`, `{{job}}`,
//! `{{attempt}}`, `{{expected_time}}` and `{{params.<name>}}`.
//!
//! A value must never be able to break out of its argument. Rather than quoting values into
//! the command text (which depends on shell contexts that are easy to get wrong), a shell
//! command receives every value as an `AX_*` environment variable and each placeholder becomes
//! a *reference* to that variable, quoted for the context it stands in:
//! `echo {{params.x}}` → `echo "${AX_PARAM_x}"`, `echo "id={{instance_id}}"` →
//! `echo "id=${AX_INSTANCE_ID}"`. The shell never parses the result of a parameter expansion
//! as code, so `$(touch /tmp/x)` or `; echo pwned` in a value stays a literal string.

use std::collections::BTreeMap;

/// A value a placeholder stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placeholder {
    /// `{{biz_date}}`: YYYY-MM-DD.
    BizDate,
    /// `{{instance_id}}`.
    InstanceId,
    /// `{{trace_id}}`.
    TraceId,
    /// `{{job}}`.
    Job,
    /// `{{attempt}}`: 1-based.
    Attempt,
    /// `{{expected_time}}`: RFC 3339.
    ExpectedTime,
    /// `{{params.<name>}}`.
    Param(String),
}

impl Placeholder {
    /// The environment variable that carries the value.
    pub fn env_name(&self) -> String {
        match self {
            Placeholder::BizDate => "AX_BIZ_DATE".into(),
            Placeholder::InstanceId => "AX_INSTANCE_ID".into(),
            Placeholder::TraceId => "AX_TRACE_ID".into(),
            Placeholder::Job => "AX_JOB".into(),
            Placeholder::Attempt => "AX_ATTEMPT".into(),
            Placeholder::ExpectedTime => "AX_EXPECTED_TIME".into(),
            Placeholder::Param(name) => param_env_name(name),
        }
    }
}

/// `AX_PARAM_<name>`.
pub fn param_env_name(name: &str) -> String {
    format!("AX_PARAM_{name}")
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Text(String),
    Value(Placeholder),
}

/// A parsed command template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    pieces: Vec<Piece>,
}

impl Template {
    /// Parses `text`; every `{{params.x}}` must name a declared param.
    pub fn parse(
        text: &str,
        declared_params: &BTreeMap<String, serde_json::Value>,
    ) -> Result<Self, String> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find("{{") {
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 2..];
            let close = after.find("}}").ok_or_else(|| {
                format!("unclosed `{{{{` at byte {}", text.len() - rest.len() + open)
            })?;
            let name = after[..close].trim();
            pieces.push(Piece::Value(placeholder(name, declared_params)?));
            rest = &after[close + 2..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_string()));
        }
        Ok(Self { pieces })
    }

    /// The placeholders used, in order.
    pub fn placeholders(&self) -> impl Iterator<Item = &Placeholder> {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Value(v) => Some(v),
            Piece::Text(_) => None,
        })
    }

    /// The command text for `/bin/sh -c`, each placeholder replaced by a quoted reference to
    /// its environment variable.
    pub fn render_shell(&self) -> String {
        let mut out = String::new();
        let mut quoting = Quoting::None;
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => {
                    quoting = quoting.after(text);
                    out.push_str(text);
                }
                Piece::Value(value) => {
                    let var = value.env_name();
                    match quoting {
                        Quoting::None => out.push_str(&format!("\"${{{var}}}\"")),
                        Quoting::Double => out.push_str(&format!("${{{var}}}")),
                        Quoting::Single => out.push_str(&format!("'\"${{{var}}}\"'")),
                    }
                }
            }
        }
        out
    }
}

fn placeholder(
    name: &str,
    declared_params: &BTreeMap<String, serde_json::Value>,
) -> Result<Placeholder, String> {
    Ok(match name {
        "biz_date" => Placeholder::BizDate,
        "instance_id" => Placeholder::InstanceId,
        "trace_id" => Placeholder::TraceId,
        "job" => Placeholder::Job,
        "attempt" => Placeholder::Attempt,
        "expected_time" => Placeholder::ExpectedTime,
        _ => match name.strip_prefix("params.") {
            Some(param) if declared_params.contains_key(param) => {
                Placeholder::Param(param.to_string())
            }
            Some(param) => {
                return Err(format!(
                    "`{{{{{name}}}}}` names param `{param}`, which job.params does not declare"
                ))
            }
            None => {
                return Err(format!(
                    "unknown placeholder `{{{{{name}}}}}` (known: biz_date, instance_id, \
                     trace_id, job, attempt, expected_time, params.<name>)"
                ))
            }
        },
    })
}

/// The POSIX shell quoting context at a point of the command text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Quoting {
    None,
    Single,
    Double,
}

impl Quoting {
    fn after(self, text: &str) -> Quoting {
        let mut state = self;
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            state = match (state, c) {
                (Quoting::None, '\\') | (Quoting::Double, '\\') => {
                    chars.next();
                    state
                }
                (Quoting::None, '\'') => Quoting::Single,
                (Quoting::None, '"') => Quoting::Double,
                (Quoting::Single, '\'') => Quoting::None,
                (Quoting::Double, '"') => Quoting::None,
                (s, _) => s,
            };
        }
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(names: &[&str]) -> BTreeMap<String, serde_json::Value> {
        names
            .iter()
            .map(|n| (n.to_string(), serde_json::Value::Null))
            .collect()
    }

    fn render(text: &str) -> String {
        Template::parse(text, &params(&["x"]))
            .unwrap()
            .render_shell()
    }

    #[test]
    fn placeholders_become_quoted_variable_references() {
        assert_eq!(
            render("run --date {{biz_date}}"),
            r#"run --date "${AX_BIZ_DATE}""#
        );
        assert_eq!(
            render(r#"echo "x={{ params.x }}!""#),
            r#"echo "x=${AX_PARAM_x}!""#
        );
        assert_eq!(render("echo 'a {{job}} b'"), r#"echo 'a '"${AX_JOB}"' b'"#);
        assert_eq!(render(r#"echo \"{{job}}"#), r#"echo \""${AX_JOB}""#);
        assert_eq!(render("plain"), "plain");
    }

    #[test]
    fn unknown_and_undeclared_placeholders_are_errors() {
        let none = params(&[]);
        assert!(Template::parse("{{nope}}", &none)
            .unwrap_err()
            .contains("unknown placeholder"));
        assert!(Template::parse("{{params.y}}", &none)
            .unwrap_err()
            .contains("does not declare"));
        assert!(Template::parse("echo {{biz_date", &none)
            .unwrap_err()
            .contains("unclosed"));
    }
}
