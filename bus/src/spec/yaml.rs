//! Job files: YAML, one job per document, several documents per file.
//!
//! Parsing goes through "raw" mirrors of the spec types whose fields carry their source
//! location, so that a problem found after parsing (a bad cron, an unknown time zone) still
//! reads `file:line: job.cron: reason`. Unknown fields are refused at every level.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::ids::JobName;

use super::{
    DepSpec, DumpSignal, ExecFields, ExecProblems, ExecSpec, JobDocument, JobSpec, Misfire,
    OnTimeoutSpec, Overlap, Priority, RetrySpec, SpecError, SqlOutput, SuccessWhen,
};

/// A job read from a file, with where it came from.
#[derive(Clone, Debug)]
pub struct LocatedJob {
    /// The file as given.
    pub file: String,
    /// The line of the job's name.
    pub line: u64,
    /// The document.
    pub doc: JobDocument,
    lines: HashMap<String, u64>,
}

impl LocatedJob {
    /// The line of `field` (or of its closest parent that has one).
    pub fn line_of(&self, field: &str) -> u64 {
        line_in(&self.lines, self.line, field)
    }

    /// Places a validation error in this job's file.
    pub fn locate(&self, error: SpecError) -> LocatedError {
        LocatedError {
            file: self.file.clone(),
            line: Some(self.line_of(&error.field)),
            field: Some(error.field),
            reason: error.reason,
        }
    }
}

/// The line of `field` (or of its closest parent that has one; else `otherwise`).
fn line_in(lines: &HashMap<String, u64>, otherwise: u64, field: &str) -> u64 {
    let mut path = field;
    loop {
        if let Some(line) = lines.get(path) {
            return *line;
        }
        match path.rsplit_once('.') {
            Some((parent, _)) => path = parent,
            None => return otherwise,
        }
    }
}

/// A problem with its place: `file:line: field: reason`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocatedError {
    /// The file.
    pub file: String,
    /// The line, when known.
    pub line: Option<u64>,
    /// The field, when known (YAML syntax errors have none).
    pub field: Option<String>,
    /// Why.
    pub reason: String,
}

impl fmt::Display for LocatedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": {field}")?;
        }
        write!(f, ": {}", self.reason)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDocument {
    version: Spanned<String>,
    job: Spanned<RawJob>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    name: Spanned<String>,
    namespace: Option<Spanned<String>>,
    cron: Option<Spanned<String>>,
    at: Option<Spanned<String>>,
    timezone: Option<Spanned<String>>,
    deps: Option<Spanned<Vec<Spanned<DepSpec>>>>,
    exec: Spanned<RawExec>,
    params: Option<Spanned<BTreeMap<String, serde_json::Value>>>,
    retry: Option<Spanned<RawRetry>>,
    timeout: Option<Spanned<u64>>,
    on_timeout: Option<Spanned<RawOnTimeout>>,
    lease: Option<Spanned<super::seconds::Seconds>>,
    tags: Option<Spanned<Vec<String>>>,
    priority: Option<Spanned<Priority>>,
    deps_timeout: Option<Spanned<u64>>,
    misfire: Option<Spanned<Misfire>>,
    catchup_window: Option<Spanned<u64>>,
    overlap: Option<Spanned<Overlap>>,
    shards: Option<Spanned<u32>>,
    broadcast: Option<Spanned<bool>>,
    retention: Option<Spanned<super::seconds::Seconds>>,
    produces: Option<Spanned<Vec<Spanned<super::dataset::DatasetUri>>>>,
    consumes: Option<Spanned<Vec<Spanned<super::dataset::DatasetUri>>>>,
    on_datasets: Option<Spanned<Vec<Spanned<super::dataset::DatasetUri>>>>,
    rerun: Option<Spanned<super::DataRerun>>,
    freshness: Option<Spanned<BTreeMap<super::dataset::DatasetUri, super::seconds::Seconds>>>,
    resources: Option<Spanned<RawResources>>,
}

/// `resources`, each limit with its line.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResources {
    memory: Option<Spanned<super::resources::Memory>>,
    cpu: Option<Spanned<super::resources::Cpu>>,
    pids: Option<Spanned<u32>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExec {
    #[serde(rename = "type")]
    kind: Spanned<String>,
    command: Option<Spanned<String>>,
    workdir: Option<Spanned<String>>,
    env: Option<Spanned<BTreeMap<String, String>>>,
    url: Option<Spanned<String>>,
    headers: Option<Spanned<BTreeMap<String, String>>>,
    header_env: Option<Spanned<BTreeMap<String, String>>>,
    success_when: Option<Spanned<SuccessWhen>>,
    script: Option<Spanned<String>>,
    module: Option<Spanned<String>>,
    args: Option<Spanned<Vec<String>>>,
    venv: Option<Spanned<String>>,
    requirements: Option<Spanned<Vec<String>>>,
    database: Option<Spanned<String>>,
    statement: Option<Spanned<String>>,
    output: Option<Spanned<SqlOutput>>,
    with: Option<Spanned<serde_json::Map<String, serde_json::Value>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    times: Spanned<u32>,
    interval: Spanned<u64>,
    max_interval: Option<Spanned<u64>>,
    jitter: Option<Spanned<f64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOnTimeout {
    signal: Option<Spanned<DumpSignal>>,
    grace: Option<Spanned<u64>>,
}

/// Records field lines while unwrapping spanned values.
struct Lines(HashMap<String, u64>);

impl Lines {
    fn take<T>(&mut self, field: &str, value: Spanned<T>) -> T {
        self.0.insert(field.to_string(), value.referenced.line());
        value.value
    }

    fn take_opt<T>(&mut self, field: &str, value: Option<Spanned<T>>) -> Option<T> {
        value.map(|v| self.take(field, v))
    }

    /// [`Lines::take_opt`], its type's default when absent.
    fn take_or_default<T: Default>(&mut self, field: &str, value: Option<Spanned<T>>) -> T {
        self.take_opt(field, value).unwrap_or_default()
    }

    /// A list whose every item keeps its own line, as `field[i]`.
    fn take_list<T>(&mut self, field: &str, value: Option<Spanned<Vec<Spanned<T>>>>) -> Vec<T> {
        self.take_opt(field, value)
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, item)| self.take(&format!("{field}[{i}]"), item))
            .collect()
    }
}

/// Parses every job document of one file. Syntax and type errors stop the file (one error);
/// semantic validation is left to the caller, which has the whole apply in view.
pub fn parse_str(file: &str, text: &str) -> Result<Vec<LocatedJob>, LocatedError> {
    let raws: Vec<RawDocument> = serde_saphyr::from_multiple(text).map_err(|e| LocatedError {
        file: file.to_string(),
        line: e.location().map(|l| l.line()).filter(|l| *l > 0),
        field: None,
        reason: serde_error_reason(&e),
    })?;
    raws.into_iter()
        .map(|raw| into_located(file, raw))
        .collect()
}

/// A parsed document with the line of each field. Long on purpose: one line per field of the
/// spec, which must stay in step with [`JobSpec`] field by field.
///
/// An `exec` map that is no executor's (a setting of another, one missing) is refused here,
/// at the line of its first problem, with every problem of the map.
fn into_located(file: &str, raw: RawDocument) -> Result<LocatedJob, LocatedError> {
    let mut lines = Lines(HashMap::new());
    let version = lines.take("version", raw.version);
    let job = lines.take("job", raw.job);
    let name_line = job.name.referenced.line();
    let name = lines.take("job.name", job.name);
    let exec = lines.take("job.exec", job.exec);
    let exec = ExecFields {
        kind: lines.take("job.exec.type", exec.kind),
        command: lines.take_opt("job.exec.command", exec.command),
        workdir: lines.take_opt("job.exec.workdir", exec.workdir),
        env: lines.take_or_default("job.exec.env", exec.env),
        url: lines.take_opt("job.exec.url", exec.url),
        headers: lines.take_or_default("job.exec.headers", exec.headers),
        header_env: lines.take_or_default("job.exec.header_env", exec.header_env),
        success_when: lines.take_opt("job.exec.success_when", exec.success_when),
        script: lines.take_opt("job.exec.script", exec.script),
        module: lines.take_opt("job.exec.module", exec.module),
        args: lines.take_or_default("job.exec.args", exec.args),
        venv: lines.take_opt("job.exec.venv", exec.venv),
        requirements: lines.take_or_default("job.exec.requirements", exec.requirements),
        database: lines.take_opt("job.exec.database", exec.database),
        statement: lines.take_opt("job.exec.statement", exec.statement),
        output: lines.take_or_default("job.exec.output", exec.output),
        with: lines.take_opt("job.exec.with", exec.with),
    };
    let exec = ExecSpec::try_from(exec).map_err(|ExecProblems(problems)| {
        let mut problems = problems.into_iter();
        let first = problems
            .next()
            .unwrap_or_else(|| super::SpecError::new("job.exec", ""));
        let mut reason = first.reason;
        for more in problems {
            reason.push_str(&format!("; {more}"));
        }
        LocatedError {
            file: file.to_string(),
            line: Some(line_in(&lines.0, name_line, &first.field)),
            field: Some(first.field),
            reason,
        }
    })?;
    let retry = lines.take_opt("job.retry", job.retry).map(|r| RetrySpec {
        times: lines.take("job.retry.times", r.times),
        interval: lines.take("job.retry.interval", r.interval),
        max_interval: lines.take_opt("job.retry.max_interval", r.max_interval),
        jitter: lines.take_or_default("job.retry.jitter", r.jitter),
    });
    let on_timeout = lines
        .take_opt("job.on_timeout", job.on_timeout)
        .map(|t| OnTimeoutSpec {
            signal: lines.take_or_default("job.on_timeout.signal", t.signal),
            grace: lines.take_opt("job.on_timeout.grace", t.grace),
        })
        .unwrap_or_default();
    let mut spec = JobSpec {
        name: JobName::unchecked(name),
        namespace: lines.take_opt("job.namespace", job.namespace),
        cron: lines.take_opt("job.cron", job.cron),
        at: lines.take_opt("job.at", job.at),
        timezone: lines
            .take_opt("job.timezone", job.timezone)
            .unwrap_or_else(super::default_timezone),
        deps: lines.take_list("job.deps", job.deps),
        exec,
        params: lines.take_or_default("job.params", job.params),
        retry,
        timeout: lines.take_opt("job.timeout", job.timeout),
        on_timeout,
        lease: lines.take_opt("job.lease", job.lease).map(|s| s.0),
        tags: lines.take_or_default("job.tags", job.tags),
        priority: lines.take_or_default("job.priority", job.priority),
        deps_timeout: lines.take_opt("job.deps_timeout", job.deps_timeout),
        misfire: lines.take_or_default("job.misfire", job.misfire),
        catchup_window: lines.take_opt("job.catchup_window", job.catchup_window),
        overlap: lines.take_or_default("job.overlap", job.overlap),
        shards: lines.take_opt("job.shards", job.shards),
        broadcast: lines.take_or_default("job.broadcast", job.broadcast),
        retention: lines.take_opt("job.retention", job.retention).map(|s| s.0),
        produces: lines.take_list("job.produces", job.produces),
        consumes: lines.take_list("job.consumes", job.consumes),
        on_datasets: lines.take_list("job.on_datasets", job.on_datasets),
        rerun: lines.take_or_default("job.rerun", job.rerun),
        freshness: lines
            .take_or_default("job.freshness", job.freshness)
            .into_iter()
            .map(|(uri, secs)| (uri, secs.0))
            .collect(),
        resources: match lines.take_opt("job.resources", job.resources) {
            Some(raw) => super::resources::Resources {
                memory: lines.take_opt("job.resources.memory", raw.memory),
                cpu: lines.take_opt("job.resources.cpu", raw.cpu),
                pids: lines.take_opt("job.resources.pids", raw.pids),
            },
            None => super::resources::Resources::default(),
        },
    };
    spec.settle_namespace();
    Ok(LocatedJob {
        file: file.to_string(),
        line: name_line,
        doc: JobDocument { version, job: spec },
        lines: lines.0,
    })
}

/// The error's message without the source snippet serde-saphyr may attach.
fn serde_error_reason(error: &serde_saphyr::Error) -> String {
    let text = match error {
        serde_saphyr::Error::WithSnippet { error, .. } => error.to_string(),
        other => other.to_string(),
    };
    text.lines().next().unwrap_or_default().trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_JOBS: &str = "\
version: v1
job:
  name: first
  cron: \"*/1 * * * * *\"
  exec:
    type: shell
    command: echo one
---
version: v1
job:
  name: second
  timezone: Asia/Shanghai
  exec:
    type: shell
    command: echo {{params.x}}
  params: { x: 1 }
  timeout: 5
  deps:
    - name: first
      biz_date: -1d
  overlap: queue
";

    #[test]
    fn several_documents_with_their_lines() {
        let jobs = parse_str("jobs.yaml", TWO_JOBS).unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].doc.job.name, "first");
        assert_eq!(jobs[0].line, 3);
        assert_eq!(jobs[1].line_of("job.timezone"), 12);
        assert_eq!(jobs[1].line_of("job.exec.command"), 15);
        assert_eq!(jobs[1].line_of("job.params.x"), 16);
        assert_eq!(jobs[1].doc.job.timeout, Some(5));
        assert_eq!(jobs[1].line_of("job.deps[0].biz_date"), 19);
        assert_eq!(jobs[1].doc.job.deps[0].offset_days(), Ok(-1));
        assert_eq!(jobs[1].doc.job.overlap, super::super::Overlap::Queue);
    }

    #[test]
    fn a_namespace_is_taken_into_the_names_and_a_dependency_names_default_or_another_whole() {
        let text = "version: v1\njob:\n  namespace: payments\n  name: settle\n  deps:\n    - name: ledger\n    - name: default/rates\n    - name: risk/score\n  exec: { type: noop }\n";
        let jobs = parse_str("f.yaml", text).unwrap();
        let job = &jobs[0].doc.job;
        assert_eq!(job.name, "payments.settle");
        assert_eq!(
            job.namespace, None,
            "a stored spec holds its namespace in its name"
        );
        let deps: Vec<&str> = job.deps.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(deps, ["payments.ledger", "rates", "risk.score"]);
        assert!(super::super::validate(&jobs[0].doc).is_empty());
        // Settled again (as the Scheduler does on receipt), it is the same.
        let mut again = job.clone();
        again.settle_namespace();
        assert_eq!(&again, job);

        // Without `namespace:`, a job is in `default`, or in the namespace its name gives.
        let text = "version: v1\njob:\n  name: payments/settle\n  deps: [ { name: ledger } ]\n  exec: { type: noop }\n";
        let job = &parse_str("f.yaml", text).unwrap()[0].doc.job;
        assert_eq!(job.name, "payments.settle");
        assert_eq!(job.deps[0].name, "ledger");

        // What breaks a rule is told at its line.
        for (text, line, field) in [
            ("version: v1\njob:\n  namespace: Pay\n  name: settle\n  exec: { type: noop }\n", 3, "job.namespace"),
            ("version: v1\njob:\n  namespace: payments\n  name: risk.settle\n  exec: { type: noop }\n", 4, "job.name"),
            ("version: v1\njob:\n  name: a.b.c\n  exec: { type: noop }\n", 3, "job.name"),
        ] {
            let docs = parse_str("f.yaml", text).unwrap();
            let errors = super::super::validate(&docs[0].doc);
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert_eq!(errors[0].field, field);
            assert_eq!(docs[0].line_of(field), line);
        }
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let text = "version: v1\njob:\n  name: a\n  exec:\n    type: shell\n    command: x\n  colour: red\n";
        let err = parse_str("f.yaml", text).unwrap_err();
        let line = err.to_string();
        assert!(line.starts_with("f.yaml:7: "), "{line}");
        assert!(line.contains("colour"), "{line}");

        let text = "version: v1\njob:\n  name: a\n  exec:\n    type: shell\n    command: x\n  timeout: -3\n";
        let line = parse_str("f.yaml", text).unwrap_err().to_string();
        assert!(line.starts_with("f.yaml:7: "), "{line}");

        let line = parse_str("f.yaml", "version: v1\njob: [unclosed\n")
            .unwrap_err()
            .to_string();
        assert!(line.starts_with("f.yaml:"), "{line}");
    }

    #[test]
    fn a_retention_reads_with_a_unit_and_is_bounded_on_its_line() {
        let spec = |retention: &str| {
            format!("version: v1\njob:\n  name: a\n  exec: {{ type: noop }}\n  retention: {retention}\n")
        };
        let jobs = parse_str("f.yaml", &spec("90d")).unwrap();
        assert_eq!(jobs[0].doc.job.retention, Some(90 * 86_400));
        assert!(super::super::validate(&jobs[0].doc).is_empty());
        let line = parse_str("f.yaml", &spec("a while"))
            .unwrap_err()
            .to_string();
        assert!(line.starts_with("f.yaml:5: "), "{line}");
        for (text, reason) in [
            ("0", "must be at least 1 second"),
            ("3661d", "is more than"),
        ] {
            let jobs = parse_str("f.yaml", &spec(text)).unwrap();
            let errors = super::super::validate(&jobs[0].doc);
            let located = jobs[0].locate(errors[0].clone()).to_string();
            assert!(
                located.starts_with("f.yaml:5: job.retention: ") && located.contains(reason),
                "{located}"
            );
        }
    }

    #[test]
    fn each_resource_limit_is_read_and_refused_at_its_own_line() {
        let spec = |exec: &str, memory: &str| {
            format!(
                "version: v1\njob:\n  name: a\n  exec: {exec}\n  resources:\n    cpu: 500m\n    memory: {memory}\n    pids: 64\n"
            )
        };
        let shell = "{ type: shell, command: 'true' }";
        let jobs = parse_str("f.yaml", &spec(shell, "64Mi")).unwrap();
        let resources = jobs[0].doc.job.resources;
        assert_eq!(
            resources.memory,
            Some(super::super::resources::Memory(64 << 20))
        );
        assert_eq!(resources.cpu, Some(super::super::resources::Cpu(500)));
        assert_eq!(resources.pids, Some(64));
        assert!(super::super::validate(&jobs[0].doc).is_empty());
        let unread = parse_str("f.yaml", &spec(shell, "lots"))
            .unwrap_err()
            .to_string();
        assert!(
            unread.starts_with("f.yaml:7: ")
                && unread.contains("`lots` is not a quantity of memory"),
            "{unread}"
        );
        let jobs = parse_str("f.yaml", &spec(shell, "1Mi")).unwrap();
        let errors = super::super::validate(&jobs[0].doc);
        let located = jobs[0].locate(errors[0].clone()).to_string();
        assert!(
            located.starts_with("f.yaml:7: job.resources.memory: 1Mi is less than 4Mi"),
            "{located}"
        );
        let jobs = parse_str("f.yaml", &spec("{ type: noop }", "64Mi")).unwrap();
        let errors = super::super::validate(&jobs[0].doc);
        let located = jobs[0].locate(errors[0].clone()).to_string();
        // A block mapping is placed at its first line.
        assert!(
            located.starts_with("f.yaml:6: job.resources: only an executor that runs a process"),
            "{located}"
        );
    }

    #[test]
    fn a_freshness_names_a_produced_dataset_and_is_bounded() {
        let spec = |freshness: &str| {
            format!(
                "version: v1\njob:\n  name: a\n  exec: {{ type: noop }}\n  produces: [ 'w://a' ]\n  freshness: {freshness}\n"
            )
        };
        let jobs = parse_str("f.yaml", &spec("{ 'w://a': 26h }")).unwrap();
        let uri = super::super::dataset::DatasetUri::parse("w://a").unwrap();
        assert_eq!(jobs[0].doc.job.freshness.get(&uri), Some(&(26 * 3600)));
        assert!(super::super::validate(&jobs[0].doc).is_empty());
        for (text, says) in [
            (
                "{ 'w://b': 1h }",
                "job.freshness.w://b: `w://b` is not one of the datasets",
            ),
            (
                "{ 'w://a': 0 }",
                "job.freshness.w://a: must be at least 1 second",
            ),
            (
                "{ 'w://a': 32d }",
                "job.freshness.w://a: 2764800 s is more than",
            ),
        ] {
            let jobs = parse_str("f.yaml", &spec(text)).unwrap();
            let errors = super::super::validate(&jobs[0].doc);
            let told: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            assert!(told.iter().any(|e| e.starts_with(says)), "{text}: {told:?}");
        }
    }

    #[test]
    fn a_lease_reads_with_or_without_a_unit_and_is_checked_on_its_line() {
        let spec = |lease: &str| {
            format!("version: v1\njob:\n  name: a\n  lease: {lease}\n  exec:\n    type: shell\n    command: x\n")
        };
        let jobs = parse_str("f.yaml", &spec("60s")).unwrap();
        assert_eq!(jobs[0].doc.job.lease, Some(60));
        assert_eq!(jobs[0].doc.job.fence_after().as_secs(), 55);
        let jobs = parse_str("f.yaml", &spec("2m")).unwrap();
        assert_eq!(jobs[0].doc.job.lease, Some(120));
        let jobs = parse_str("f.yaml", &spec("30")).unwrap();
        assert_eq!(jobs[0].doc.job.lease, Some(30));
        // Without a lease, the worker fences after 5 s as it always did.
        let jobs = parse_str("f.yaml", &spec("null")).unwrap();
        assert_eq!(jobs[0].doc.job.fence_after().as_secs(), 5);
        let line = parse_str("f.yaml", &spec("soon")).unwrap_err().to_string();
        assert!(line.starts_with("f.yaml:4: "), "{line}");
        assert!(line.contains("not a duration"), "{line}");
        let jobs = parse_str("f.yaml", &spec("5s")).unwrap();
        let errors = super::super::validate(&jobs[0].doc);
        let located = jobs[0].locate(errors[0].clone()).to_string();
        assert!(
            located.starts_with("f.yaml:4: job.lease: must be at least 10 seconds"),
            "{located}"
        );
        let jobs = parse_str("f.yaml", &spec("2d")).unwrap();
        let errors = super::super::validate(&jobs[0].doc);
        assert_eq!(errors[0].field, "job.lease", "{errors:?}");
    }

    #[test]
    fn validation_errors_are_placed_on_their_line() {
        let jobs = parse_str("jobs.yaml", &TWO_JOBS.replace("Asia/Shanghai", "Mars/Base")).unwrap();
        let errors = super::super::validate(&jobs[1].doc);
        let located = jobs[1].locate(errors[0].clone()).to_string();
        assert!(
            located.starts_with("jobs.yaml:12: job.timezone: unknown time zone"),
            "{located}"
        );
    }

    #[test]
    fn a_job_run_by_its_data_names_datasets_it_consumes_with_or_without_a_cron() {
        let text = "version: v1\njob:\n  name: r\n  cron: '0 0 * * *'\n  consumes: [ 'w://a' ]\n  on_datasets: [ 'w://a', 'w://b' ]\n  exec: { type: noop }\n";
        let jobs = parse_str("r.yaml", text).unwrap();
        let errors: Vec<String> = super::super::validate(&jobs[0].doc)
            .into_iter()
            .map(|e| jobs[0].locate(e).to_string())
            .collect();
        assert_eq!(
            errors,
            ["r.yaml:6: job.on_datasets[1]: `w://b` is not one of the datasets the job consumes",]
        );
        let fine = text.replace("'w://a' ]\n  on", "'w://a', 'w://b' ]\n  on");
        let jobs = parse_str("r.yaml", &fine).unwrap();
        assert!(
            super::super::validate(&jobs[0].doc).is_empty(),
            "besides a cron"
        );
        let jobs = parse_str("r.yaml", &fine.replace("  cron: '0 0 * * *'\n", "")).unwrap();
        assert!(
            super::super::validate(&jobs[0].doc).is_empty(),
            "instead of a cron"
        );
    }
}
