//! The `sql` executor: runs `exec.statement` against a database the worker's config names
//! (`[databases] <name> = "<url>"`: PostgreSQL, MySQL/MariaDB or SQLite).
//!
//! Placeholders are bound parameters, never text spliced into the SQL: `{{params.x}}` becomes
//! `$n` (PostgreSQL) or `?` (MySQL, SQLite) and its value is bound with its JSON type (a
//! string, an integer, a float, a boolean, NULL; arrays and objects as JSON text). A value
//! holding `'; DROP TABLE x; --` is just a value. Dates travel as text: write
//! `{{biz_date}}::date` on PostgreSQL where a column wants a date.
//!
//! The connection string stays in the worker's config: a spec names the database, and every
//! message that could quote the URL has it replaced by the database's name. With
//! `exec.output: first_row`, the first row returned becomes the output (columns of types
//! boolean, integer, float, text and binary; cast others to text in the query), otherwise the
//! output is `{"rows_affected": n}`. One statement per job.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::any::{AnyPoolOptions, AnyRow, AnyTypeInfoKind};
use sqlx::{AnyPool, Column, Row, ValueRef};

use ax_bus::instance::Tag;
use ax_bus::messages::ExecutorInfo;
use ax_bus::spec::template::{Scope, Template};
use ax_bus::spec::SqlOutput;
use ax_bus::spec::{readable_upstream, Builtin, ExecSpec};

use super::{
    builtin, mismatched, AttemptContext, ExecResult, Executor, ExecutorError, ExecutorsConfig,
};

/// Connections kept per database.
const POOL_SIZE: u32 = 4;
/// How long an attempt waits for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How a database writes bind markers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Markers {
    /// `$1`, `$2`, ... (PostgreSQL).
    Numbered,
    /// `?` (MySQL, MariaDB, SQLite).
    Question,
}

struct Database {
    pool: AnyPool,
    markers: Markers,
    /// The URL, to be scrubbed from messages.
    url: String,
}

/// See the module.
#[derive(Default)]
pub(crate) struct Sql {
    databases: BTreeMap<String, Database>,
}

fn markers_of(url: &str) -> Option<Markers> {
    let scheme = url.split(':').next()?;
    match scheme {
        "postgres" | "postgresql" => Some(Markers::Numbered),
        "mysql" | "mariadb" | "sqlite" => Some(Markers::Question),
        _ => None,
    }
}

impl Database {
    /// `text` with the URL (and its password, should a driver quote that alone) replaced.
    fn scrub(&self, name: &str, text: String) -> String {
        let mut text = text.replace(&self.url, &format!("<database {name}>"));
        if let Some(password) = url_password(&self.url) {
            text = text.replace(&password, "<password>");
        }
        text
    }
}

fn url_password(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let userinfo = rest.split_once('@')?.0;
    let password = userinfo.split_once(':')?.1;
    (!password.is_empty()).then(|| password.to_string())
}

fn bind<'q>(
    query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    value: serde_json::Value,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    use serde_json::Value;
    match value {
        Value::Null => query.bind(Option::<String>::None),
        Value::Bool(b) => query.bind(b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => query.bind(i),
            None => query.bind(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => query.bind(s),
        other => query.bind(other.to_string()),
    }
}

/// The first row as a JSON object.
fn row_json(row: &AnyRow) -> Result<serde_json::Value, String> {
    use serde_json::Value;
    let mut object = serde_json::Map::new();
    for (i, column) in row.columns().iter().enumerate() {
        let unreadable = |e: sqlx::Error| format!("column `{}`: {e}", column.name());
        // The value's own type: an expression column (`COUNT(*)` in SQLite) has no declared
        // type, its values do.
        let raw = row.try_get_raw(i).map_err(unreadable)?;
        let value = match raw.type_info().kind() {
            AnyTypeInfoKind::Null => Value::Null,
            AnyTypeInfoKind::Bool => row
                .try_get::<Option<bool>, _>(i)
                .map_err(unreadable)?
                .map_or(Value::Null, Value::from),
            AnyTypeInfoKind::SmallInt | AnyTypeInfoKind::Integer | AnyTypeInfoKind::BigInt => row
                .try_get::<Option<i64>, _>(i)
                .map_err(unreadable)?
                .map_or(Value::Null, Value::from),
            AnyTypeInfoKind::Real | AnyTypeInfoKind::Double => row
                .try_get::<Option<f64>, _>(i)
                .map_err(unreadable)?
                .map_or(Value::Null, Value::from),
            AnyTypeInfoKind::Text => row
                .try_get::<Option<String>, _>(i)
                .map_err(unreadable)?
                .map_or(Value::Null, Value::from),
            AnyTypeInfoKind::Blob => row
                .try_get::<Option<Vec<u8>>, _>(i)
                .map_err(unreadable)?
                .map_or(Value::Null, |b| {
                    Value::from(String::from_utf8_lossy(&b).into_owned())
                }),
        };
        object.insert(column.name().to_string(), value);
    }
    Ok(Value::Object(object))
}

impl Sql {
    async fn execute(&self, ctx: &AttemptContext<'_>) -> ExecResult {
        let work = ctx.work;
        let ExecSpec::Sql(exec) = &work.spec.exec else {
            return mismatched(work, Builtin::Sql);
        };
        let name = exec.database.as_str();
        let Some(database) = self.databases.get(name) else {
            return ExecResult::failed(
                Tag::ExecutorError,
                format!("exec.database: this worker has no database `{name}`"),
            );
        };
        let upstream = readable_upstream(&work.spec);
        let scope = Scope {
            params: &work.params,
            upstream: &upstream,
        };
        let bound = Template::parse(&exec.statement, &scope).and_then(|t| {
            t.render_bind(&|n| match database.markers {
                Markers::Numbered => format!("${n}"),
                Markers::Question => "?".to_string(),
            })
        });
        let (sql, placeholders) = match bound {
            Ok(bound) => bound,
            Err(reason) => {
                return ExecResult::failed(Tag::ExecutorError, format!("exec.statement: {reason}"))
            }
        };
        // The text is the job author's, with every value a bound parameter: nothing an
        // instance carries is part of it.
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for placeholder in &placeholders {
            query = bind(query, ctx.values.json(work, placeholder));
        }
        let failed = |e: sqlx::Error| {
            let tag = match e {
                sqlx::Error::Database(_) => Tag::Rejected,
                _ => Tag::ExecutorError,
            };
            ExecResult::failed(
                tag,
                format!("database {name}: {}", database.scrub(name, e.to_string())),
            )
        };
        match exec.output {
            SqlOutput::FirstRow => match query.fetch_optional(&database.pool).await {
                Ok(Some(row)) => match row_json(&row) {
                    Ok(output) => ExecResult::completed("first row read", output),
                    Err(reason) => ExecResult::failed(
                        Tag::ExecutorError,
                        format!("database {name}: {}", database.scrub(name, reason)),
                    ),
                },
                Ok(None) => ExecResult::completed("no row", serde_json::Value::Null),
                Err(e) => failed(e),
            },
            SqlOutput::RowsAffected => match query.execute(&database.pool).await {
                Ok(done) => ExecResult::completed(
                    format!("{} rows affected", done.rows_affected()),
                    serde_json::json!({ "rows_affected": done.rows_affected() }),
                ),
                Err(e) => failed(e),
            },
        }
    }
}

impl Executor for Sql {
    fn init(&mut self, config: &ExecutorsConfig) -> Result<(), ExecutorError> {
        sqlx::any::install_default_drivers();
        for (name, url) in &config.databases {
            let refuse = |reason: String| ExecutorError {
                executor: "sql".into(),
                reason: format!("database `{name}`: {reason}"),
            };
            let markers = markers_of(url).ok_or_else(|| {
                refuse(
                    "the URL must start with postgres://, mysql://, mariadb:// or sqlite:".into(),
                )
            })?;
            let url = url.replacen("mariadb://", "mysql://", 1);
            let pool = AnyPoolOptions::new()
                .max_connections(POOL_SIZE)
                .acquire_timeout(CONNECT_TIMEOUT)
                .connect_lazy(&url)
                .map_err(|e| refuse(e.to_string().replace(&url, "<its url>")))?;
            self.databases
                .insert(name.clone(), Database { pool, markers, url });
        }
        Ok(())
    }

    fn describe(&self) -> ExecutorInfo {
        let mut info = builtin(
            Builtin::Sql,
            "runs exec.statement on a database of the worker's config, placeholders bound as parameters",
        );
        if !self.databases.is_empty() {
            let names: Vec<&str> = self.databases.keys().map(String::as_str).collect();
            info.description = format!("{} (databases: {})", info.description, names.join(", "));
        }
        info
    }

    fn prepare<'a>(&'a self, ctx: &'a AttemptContext<'a>) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let ExecSpec::Sql(exec) = &ctx.work.spec.exec else {
                return Ok(());
            };
            let name = exec.database.as_str();
            if self.databases.contains_key(name) {
                return Ok(());
            }
            let known: Vec<&str> = self.databases.keys().map(String::as_str).collect();
            Err(format!(
                "exec.database: worker {} has no database `{name}` (its [databases]: {})",
                ctx.worker,
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ))
        })
    }

    fn run<'a>(&'a self, ctx: &'a AttemptContext<'a>) -> BoxFuture<'a, ExecResult> {
        Box::pin(async move {
            let limit = Duration::from_secs(ctx.work.spec.timeout_secs());
            tokio::select! {
                ended = tokio::time::timeout(limit, self.execute(ctx)) => match ended {
                    Ok(result) => result,
                    Err(_) => ExecResult::failed(
                        Tag::Timeout,
                        format!("the statement did not finish within {}s", limit.as_secs()),
                    ),
                },
                _ = ctx.cancel.notified() => ExecResult::failed(
                    Tag::Killed,
                    "stopped: the instance was cancelled; statement abandoned",
                ),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_follow_the_scheme_and_passwords_are_found() {
        assert_eq!(markers_of("postgres://u@h/db"), Some(Markers::Numbered));
        assert_eq!(markers_of("mariadb://root@h/db"), Some(Markers::Question));
        assert_eq!(markers_of("sqlite:/tmp/x.db"), Some(Markers::Question));
        assert_eq!(markers_of("oracle://h"), None);
        assert_eq!(
            url_password("postgres://u:s3cret@h/db").as_deref(),
            Some("s3cret")
        );
        assert_eq!(url_password("postgres://u@h/db"), None);
    }
}
