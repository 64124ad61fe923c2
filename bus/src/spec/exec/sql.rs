//! `type: sql`: a statement against a database the worker's config names.

use serde::{Deserialize, Serialize};

use super::{check_template, not_blank};
use crate::spec::{JobSpec, SpecError};

/// The settings of a sql job.
#[derive(Clone, Debug, PartialEq)]
pub struct SqlExec {
    /// The database, by its name in the worker's `[databases]` config.
    pub database: String,
    /// The statement; placeholders become bound parameters.
    pub statement: String,
    /// What becomes the output.
    pub output: SqlOutput,
}

/// What a `sql` attempt outputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SqlOutput {
    /// `{"rows_affected": n}`.
    #[default]
    RowsAffected,
    /// The first row returned, as an object of its columns (`null` when there is none).
    FirstRow,
}

impl SqlExec {
    /// The settings it takes besides `type`.
    pub(super) const SETTINGS: &'static [&'static str] = &["database", "statement", "output"];

    /// `ax job init`'s block for it.
    pub(super) const STARTING_SPEC: &'static str = "  exec:
    type: sql
    # A database of the worker's [databases] (`ax up` has `demo`, a SQLite file); every
    # placeholder is a bound parameter, never SQL text.
    database: demo
    statement: SELECT {{biz_date}} AS day, 1 AS ok
    output: first_row                  # or rows_affected
";

    pub(super) fn validate(&self, job: &JobSpec, errors: &mut Vec<SpecError>) {
        not_blank(&self.database, "database", errors);
        if not_blank(&self.statement, "statement", errors) {
            check_template(&self.statement, job, "job.exec.statement", errors);
        }
    }
}
