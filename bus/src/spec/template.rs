//! Placeholders in commands, arguments and SQL statements: `{{biz_date}}`, `{{instance_id}}`,
//! `{{trace_id}}`, `{{job}}`, `{{attempt}}`, `{{expected_time}}`, `{{params.<name>}}` and
//! `{{deps.<job>.output.<field>}}` (a field of the structured output of the upstream instance
//! that met the dependency).
//!
//! Values are never spliced into code. Where there is no shell (a Python argument), a value is
//! one whole argument; in SQL it is a bound parameter ([`Template::render_bind`]).
//!
//! A value must never be able to break out of its argument. Rather than quoting values into
//! the command text (which depends on shell contexts that are easy to get wrong), a shell
//! command receives every value as an `AX_*` environment variable and each placeholder becomes
//! a *reference* to that variable, quoted for the context it stands in:
//! `echo {{params.x}}` → `echo "${AX_PARAM_x}"`, `echo "id={{instance_id}}"` →
//! `echo "id=${AX_INSTANCE_ID}"`. The shell never parses the result of a parameter expansion
//! as code, so `$(touch /tmp/x)` or `; echo pwned` in a value stays a literal string.

use crate::ids::JobName;
use std::collections::BTreeMap;

use super::shell_context::{Reader, Spot};

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
    /// `{{deps.<job>.output.<field>}}`.
    DepOutput {
        /// The upstream job.
        job: JobName,
        /// The top-level field of its output.
        field: String,
    },
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
            Placeholder::DepOutput { job, field } => dep_env_name(job, field),
        }
    }
}

/// `AX_DEP_<job>_<field>` (a `-` in the job's name becomes `_`, the `.` after a namespace
/// `__`: `AX_DEP_payments__settle_rows`).
pub fn dep_env_name(job: &str, field: &str) -> String {
    format!(
        "AX_DEP_{}_{field}",
        job.replace('-', "_").replace('.', "__")
    )
}

/// What a template may refer to.
#[derive(Clone, Copy, Debug)]
pub struct Scope<'a> {
    /// The declared params.
    pub params: &'a BTreeMap<String, serde_json::Value>,
    /// The upstream jobs whose output may be read.
    pub upstream: &'a [JobName],
}

impl<'a> Scope<'a> {
    /// Params only, no upstream job.
    pub fn params(params: &'a BTreeMap<String, serde_json::Value>) -> Self {
        Self {
            params,
            upstream: &[],
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
    /// Parses `text`; every `{{params.x}}` must name a declared param and every
    /// `{{deps.j.output.f}}` an upstream job of the scope.
    pub fn parse(text: &str, scope: &Scope<'_>) -> Result<Self, String> {
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
            pieces.push(Piece::Value(placeholder(name, scope)?));
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

    /// The text with each placeholder replaced by its value, verbatim: for a single argument
    /// passed to a program without a shell.
    pub fn render_value(&self, value: &dyn Fn(&Placeholder) -> String) -> String {
        self.pieces
            .iter()
            .map(|piece| match piece {
                Piece::Text(text) => text.clone(),
                Piece::Value(placeholder) => value(placeholder),
            })
            .collect()
    }

    /// SQL with each placeholder replaced by a bind marker (`marker(n)` for the n-th, from 1),
    /// and the placeholders to bind in that order. A placeholder inside a quoted SQL string
    /// would be a literal there, not a parameter: that is an error.
    pub fn render_bind(
        &self,
        marker: &dyn Fn(usize) -> String,
    ) -> Result<(String, Vec<Placeholder>), String> {
        let mut sql = String::new();
        let mut binds = Vec::new();
        let mut quoted = false;
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => {
                    quoted ^= text.matches('\'').count() % 2 == 1;
                    sql.push_str(text);
                }
                Piece::Value(placeholder) => {
                    if quoted {
                        return Err(format!(
                            "a placeholder inside quotes is not a parameter: write `{{{{...}}}}` \
                             without the quotes around it (it is bound as a value) [{}]",
                            placeholder.env_name()
                        ));
                    }
                    binds.push(placeholder.clone());
                    sql.push_str(&marker(binds.len()));
                }
            }
        }
        Ok((sql, binds))
    }

    /// The command text for `/bin/sh -c`, each placeholder replaced by a quoted reference to
    /// its environment variable.
    /// The spot is read as `/bin/sh` would (`spec::shell_context`): a quote in a comment or
    /// a here-document is no quote, a command substitution starts afresh inside double quotes.
    /// In a quoted here-document (`<<'EOF'`), where nothing is expanded, the reference stays
    /// literal text.
    pub fn render_shell(&self) -> String {
        let mut out = String::new();
        let mut reader = Reader::default();
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => {
                    reader.read(text);
                    out.push_str(text);
                }
                Piece::Value(value) => {
                    let var = value.env_name();
                    match reader.placeholder() {
                        Spot::Bare => out.push_str(&format!("\"${{{var}}}\"")),
                        Spot::Quoted | Spot::Literal => out.push_str(&format!("${{{var}}}")),
                        Spot::SingleQuoted => out.push_str(&format!("'\"${{{var}}}\"'")),
                    }
                }
            }
        }
        out
    }
}

fn dep_output(name: &str, scope: &Scope<'_>) -> Result<Placeholder, String> {
    let usage = || {
        format!("`{{{{{name}}}}}`: write `{{{{deps.<job>.output.<field>}}}}`, with <job> one of job.deps")
    };
    let rest = name.strip_prefix("deps.").ok_or_else(usage)?;
    // A field holds no `.`, a job's name may (`payments.settle`).
    let (job, field) = rest.rsplit_once(".output.").ok_or_else(usage)?;
    // Named whole, or within its namespace when no other upstream has that name.
    let mut by_short = scope.upstream.iter().filter(|u| u.short() == job);
    let found = match scope.upstream.iter().find(|u| *u == job) {
        Some(upstream) => Some(upstream),
        None => match (by_short.next(), by_short.next()) {
            (Some(upstream), None) => Some(upstream),
            _ => None,
        },
    };
    let Some(job) = found else {
        return Err(format!(
            "`{{{{{name}}}}}` reads the output of `{job}`, which job.deps does not list (or \
             lists in several namespaces: name it whole, `<namespace>.<name>`)"
        ));
    };
    if field.is_empty() || !field.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!(
            "`{{{{{name}}}}}`: the field must be a top-level output field matching [A-Za-z0-9_]+"
        ));
    }
    Ok(Placeholder::DepOutput {
        job: job.clone(),
        field: field.to_string(),
    })
}

fn placeholder(name: &str, scope: &Scope<'_>) -> Result<Placeholder, String> {
    let declared_params = scope.params;
    if name.starts_with("deps.") {
        return dep_output(name, scope);
    }
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
                     trace_id, job, attempt, expected_time, params.<name>, \
                     deps.<job>.output.<field>)"
                ))
            }
        },
    })
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
        Template::parse(text, &Scope::params(&params(&["x"])))
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
        // A comment ends at its line: the next line's `#` starts a comment again (found by
        // the property below: two such lines once left the reader inside double quotes).
        assert_eq!(
            render("# say \"hi\n# say \"hi\necho {{params.x}}"),
            "# say \"hi\n# say \"hi\necho \"${AX_PARAM_x}\""
        );
    }

    #[test]
    fn unknown_and_undeclared_placeholders_are_errors() {
        let none = params(&[]);
        let none = Scope::params(&none);
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

#[cfg(test)]
mod render_tests {
    use super::*;

    fn scope_parse(text: &str) -> Result<Template, String> {
        let params: BTreeMap<String, serde_json::Value> =
            [("x".to_string(), serde_json::Value::Null)].into();
        let upstream = [JobName::parse("load-orders").unwrap()];
        Template::parse(
            text,
            &Scope {
                params: &params,
                upstream: &upstream,
            },
        )
    }

    #[test]
    fn dep_outputs_name_a_listed_upstream_and_a_plain_field() {
        let t = scope_parse("echo {{deps.load-orders.output.rows}}").unwrap();
        assert_eq!(t.render_shell(), r#"echo "${AX_DEP_load_orders_rows}""#);
        assert!(scope_parse("{{deps.other.output.rows}}")
            .unwrap_err()
            .contains("does not list"));
        assert!(scope_parse("{{deps.load-orders.rows}}")
            .unwrap_err()
            .contains("deps.<job>.output.<field>"));
        assert!(scope_parse("{{deps.load-orders.output.a.b}}")
            .unwrap_err()
            .contains("top-level"));
    }

    #[test]
    fn an_upstream_of_another_namespace_is_read_by_its_whole_name_or_its_own() {
        let upstream: Vec<JobName> = ["payments.settle", "ledger.close", "risk.close"]
            .iter()
            .map(|n| n.parse().unwrap())
            .collect();
        let params = BTreeMap::new();
        let scope = Scope {
            params: &params,
            upstream: &upstream,
        };
        for text in [
            "{{deps.payments.settle.output.rows}}",
            "{{deps.settle.output.rows}}",
        ] {
            let t = Template::parse(text, &scope).unwrap();
            assert_eq!(
                t.render_shell(),
                r#""${AX_DEP_payments__settle_rows}""#,
                "{text}"
            );
        }
        // Two upstreams share the name `close`: it must be named whole.
        let why = Template::parse("{{deps.close.output.rows}}", &scope).unwrap_err();
        assert!(why.contains("name it whole"), "{why}");
        assert!(Template::parse("{{deps.risk.close.output.rows}}", &scope).is_ok());
    }

    #[test]
    fn values_are_whole_and_sql_gets_bind_markers() {
        let t = scope_parse("--x={{params.x}}").unwrap();
        assert_eq!(t.render_value(&|_| "a b; rm".to_string()), "--x=a b; rm");
        let sql = scope_parse("insert into t values ({{params.x}}, {{biz_date}}, 'it''s')")
            .unwrap()
            .render_bind(&|n| format!("${n}"))
            .unwrap();
        assert_eq!(sql.0, "insert into t values ($1, $2, 'it''s')");
        assert_eq!(
            sql.1,
            vec![Placeholder::Param("x".into()), Placeholder::BizDate]
        );
        assert!(scope_parse("select '{{biz_date}}'")
            .unwrap()
            .render_bind(&|_| "?".into())
            .unwrap_err()
            .contains("inside quotes"));
    }
}

/// The shell rendering held against a real `sh -c`: whatever comes before a placeholder
/// (comments and strings with stray quotes, here-documents, command substitutions) and
/// wherever it stands (a bare word, inside double or single quotes, in `$( )` or backquotes,
/// in a here-document), its value arrives as one piece, unsplit, unglobbed, never executed.
#[cfg(test)]
mod shell_property {
    use super::*;
    use proptest::prelude::*;

    /// Lines that print nothing and leave the shell where a new command starts, each with a
    /// quote or construct a naive reader would take for the start of a string.
    const PREFIXES: &[&str] = &[
        "# say \"hi",
        "# don't",
        "true # it's",
        ": \"it's\"",
        ": 'say \"hi'",
        ": \"$(echo \"it's\")\"",
        ": `echo \"'\"`",
        ": $(: ')')",
        ": <<EOF\nit's \"x\nEOF",
        ": <<'EOF'\n\"it's\nEOF",
        ": <<-EOF\n\tit's\n\tEOF",
        "x='a \"b' y=\"c 'd\"",
        ": \\' \\\"",
        "case x in (x) : \"'\" ;; esac",
    ];

    /// What the shell prints for a value at a spot.
    type Printed = fn(&str) -> String;

    /// Where the placeholder stands, and what the shell prints for value `v` there.
    const SPOTS: &[(&str, Printed)] = &[
        ("printf '[%s]' {{params.p}}", |v| format!("[{v}]")),
        ("printf '[%s]' \"x{{params.p}}y\"", |v| format!("[x{v}y]")),
        ("printf '[%s]' 'x{{params.p}}y'", |v| format!("[x{v}y]")),
        ("printf '[%s]' \"$(printf %s {{params.p}})\"", |v| {
            format!("[{}]", v.trim_end_matches('\n'))
        }),
        ("printf '[%s]' \"`printf %s {{params.p}}`\"", |v| {
            format!("[{}]", v.trim_end_matches('\n'))
        }),
        ("cat <<EOF\n[{{params.p}}]\nEOF", |v| format!("[{v}]\n")),
        (
            "for a in {{params.p}}; do printf '[%s]' \"$a\"; done",
            |v| format!("[{v}]"),
        ),
    ];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

        #[test]
        fn a_value_arrives_whole_wherever_it_stands(
            prefixes in proptest::collection::vec(0..PREFIXES.len(), 0..4),
            spot in 0..SPOTS.len(),
            value in "[ a-z*?'\"$`\\\\;|&(){}<>#~!\\[\\]\t\n%-]{1,12}",
        ) {
            let dir = tempfile::tempdir().unwrap();
            for name in ["g1", "g2", "pwned-not"] {
                std::fs::write(dir.path().join(name), "").unwrap();
            }
            let (text, expected) = SPOTS[spot];
            let mut command: Vec<&str> = prefixes.iter().map(|i| PREFIXES[*i]).collect();
            command.push(text);
            let command = command.join("\n");
            let declared = BTreeMap::from([("p".to_string(), serde_json::Value::Null)]);
            let rendered = Template::parse(&command, &Scope::params(&declared))
                .unwrap()
                .render_shell();
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(&rendered)
                .env(param_env_name("p"), &value)
                .current_dir(dir.path())
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            prop_assert!(out.status.success(), "{rendered}\n{}", String::from_utf8_lossy(&out.stderr));
            prop_assert_eq!(stdout.as_ref(), expected(&value), "{}", rendered);
        }
    }
}
