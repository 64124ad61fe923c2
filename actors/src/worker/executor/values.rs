//! The values placeholders stand for in one attempt, and the attempt's environment.
//!
//! Most come with the dispatch (`biz_date`, `params.x`, ...). `{{deps.<job>.output.<field>}}`
//! is read when the attempt starts: the upstream instance that met the dependency is the one
//! of `<job>` for the dependency's business date in `success` (the latest, if a re-run made
//! several), and the field is read from its recorded output. A missing instance or field fails
//! the attempt with a message saying which — a downstream never runs on a value it could not
//! read.

use std::collections::BTreeMap;
use std::path::Path;

use ax_bus::ids::{JobName, WorkerId};
use ax_bus::instance::State;
use ax_bus::messages::WorkItem;
use ax_bus::spec::template::{param_env_name, Placeholder, Scope, Template};
use ax_bus::spec::{readable_upstream, JobSpec};
use ax_bus::AxClient;

use ax_bus::time::parse_biz_date;

/// Upstream output fields, by (job, field).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Values {
    upstream: BTreeMap<(JobName, String), serde_json::Value>,
}

fn text_of(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The templates of a job's executor settings: the shell command, the python arguments, the
/// SQL statement.
pub(crate) fn templates(
    spec: &JobSpec,
    params: &BTreeMap<String, serde_json::Value>,
) -> Vec<Template> {
    let upstream = readable_upstream(spec);
    let scope = Scope {
        params,
        upstream: &upstream,
    };
    spec.exec
        .templates()
        .into_iter()
        .filter_map(|text| Template::parse(text, &scope).ok())
        .collect()
}

impl Values {
    /// Values with these upstream fields (tests, and [`Values::resolve`]).
    pub fn with_upstream(upstream: BTreeMap<(JobName, String), serde_json::Value>) -> Self {
        Self { upstream }
    }

    /// Reads the upstream outputs the attempt's templates use.
    pub async fn resolve(client: &AxClient, work: &WorkItem) -> Result<Self, String> {
        let mut wanted: BTreeMap<JobName, Vec<String>> = BTreeMap::new();
        for template in templates(&work.spec, &work.params) {
            for placeholder in template.placeholders() {
                if let Placeholder::DepOutput { job, field } = placeholder {
                    wanted.entry(job.clone()).or_default().push(field.clone());
                }
            }
        }
        let mut upstream = BTreeMap::new();
        for (job, fields) in wanted {
            let output = upstream_output(client, work, &job).await?;
            for field in fields {
                let value = output.get(&field).cloned().ok_or_else(|| {
                    format!(
                        "deps.{job}.output.{field}: the output of `{job}` has no field `{field}` \
                         (it is {})",
                        serde_json::Value::Object(output.clone())
                    )
                })?;
                upstream.insert((job.clone(), field), value);
            }
        }
        Ok(Self { upstream })
    }

    /// A placeholder's value as JSON (params keep their types; SQL binds them so).
    pub fn json(&self, work: &WorkItem, placeholder: &Placeholder) -> serde_json::Value {
        use serde_json::Value;
        match placeholder {
            Placeholder::BizDate => Value::String(work.biz_date.clone()),
            Placeholder::InstanceId => Value::String(work.instance_id.to_string()),
            Placeholder::TraceId => Value::String(work.trace_id.to_string()),
            Placeholder::Job => Value::String(work.job().to_string()),
            Placeholder::Attempt => Value::from(work.attempt),
            Placeholder::ExpectedTime => Value::String(ax_bus::time::rfc3339(work.expected_time)),
            Placeholder::Param(name) => work.params.get(name).cloned().unwrap_or(Value::Null),
            Placeholder::DepOutput { job, field } => self
                .upstream
                .get(&(job.clone(), field.clone()))
                .cloned()
                .unwrap_or(Value::Null),
        }
    }

    /// A placeholder's value as text (strings as they are, anything else as JSON).
    pub fn text(&self, work: &WorkItem, placeholder: &Placeholder) -> String {
        text_of(&self.json(work, placeholder))
    }

    /// The environment of a process running the attempt: `AX_WORKER`, `AX_INSTANCE_ID`,
    /// `AX_TRACE_ID`, `AX_JOB`, `AX_BIZ_DATE`, `AX_ATTEMPT`, `AX_EXPECTED_TIME`, `AX_PARAMS`
    /// (JSON), `AX_OUTPUT_FILE`, `AX_PARAM_<name>`, `AX_DEP_<job>_<field>`, the shard's
    /// `AX_SHARD_INDEX`/`AX_SHARD_TOTAL`, then the spec's own `exec.env`.
    pub fn env(
        &self,
        work: &WorkItem,
        worker: &WorkerId,
        output_file: &Path,
    ) -> Vec<(String, String)> {
        let mut env = vec![
            ("AX_WORKER".to_string(), worker.to_string()),
            ("AX_INSTANCE_ID".to_string(), work.instance_id.to_string()),
            ("AX_TRACE_ID".to_string(), work.trace_id.to_string()),
            ("AX_JOB".to_string(), work.job().to_string()),
            ("AX_BIZ_DATE".to_string(), work.biz_date.clone()),
            ("AX_ATTEMPT".to_string(), work.attempt.to_string()),
            (
                "AX_EXPECTED_TIME".to_string(),
                ax_bus::time::rfc3339(work.expected_time),
            ),
            (
                "AX_PARAMS".to_string(),
                serde_json::to_string(&work.params).unwrap_or_default(),
            ),
            (
                "AX_OUTPUT_FILE".to_string(),
                output_file.display().to_string(),
            ),
        ];
        if let Some(shard) = &work.shard {
            env.push(("AX_SHARD_INDEX".to_string(), shard.index.to_string()));
            env.push(("AX_SHARD_TOTAL".to_string(), shard.total.to_string()));
        }
        env.extend(
            work.params
                .iter()
                .map(|(name, value)| (param_env_name(name), text_of(value))),
        );
        env.extend(self.upstream.iter().map(|((job, field), value)| {
            (
                Placeholder::DepOutput {
                    job: job.clone(),
                    field: field.clone(),
                }
                .env_name(),
                text_of(value),
            )
        }));
        env.extend(
            work.spec
                .exec
                .env()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        env
    }
}

/// The output of the successful instance of `job` that meets the attempt's dependency on it.
async fn upstream_output(
    client: &AxClient,
    work: &WorkItem,
    job: &JobName,
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let dep = work
        .spec
        .deps
        .iter()
        .find(|d| d.name == job)
        .ok_or_else(|| format!("deps.{job}: not a dependency of this job"))?;
    let offset = dep.offset_days().map_err(|e| format!("deps.{job}: {e}"))?;
    let date = parse_biz_date(&work.biz_date)
        .and_then(|d| d.checked_add_signed(chrono::Duration::days(offset)))
        .ok_or_else(|| format!("biz_date `{}` is not a date", work.biz_date))?;
    let unread = |e: String| format!("deps.{job}: cannot read the upstream instance: {e}");
    let instances = client
        .deps_of_day(job, date)
        .await
        .map_err(|e| unread(e.to_string()))?;
    let id = instances
        .instances
        .iter()
        .filter(|(_, (_, state))| *state == State::Success)
        .map(|(id, _)| id.clone())
        .max()
        .ok_or_else(|| format!("deps.{job}: no instance of `{job}` succeeded for {date}"))?;
    let (record, _) = client
        .instance(&id)
        .await
        .map_err(|e| unread(e.to_string()))?
        .ok_or_else(|| format!("deps.{job}: instance {id} is gone"))?;
    match record.output {
        serde_json::Value::Object(map) => Ok(map),
        other => Err(format!(
            "deps.{job}: the output of {id} is not a JSON object (it is {other})"
        )),
    }
}
