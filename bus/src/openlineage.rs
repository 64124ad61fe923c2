//! OpenLineage run events: every attempt's start and end as the lineage tools teams already run
//! (Marquez, DataHub) take them — `START`, then `COMPLETE`, `FAIL` or `ABORT` (killed), with the
//! job, the run (its id is the attempt's trace id, written as a UUID), the parent run (the
//! instance, of which each attempt is a run), the business date's nominal time, and the
//! datasets read (`consumes:`) and written (`produces:`, or those the attempt's output named).
//!
//! Made by the leading DagCoordinator of a deployment whose dag nodes have an `[openlineage]`
//! section, published as JSON on `ax.lineage.<job>` (kept in `<AX>_LINEAGE`), and POSTed by the
//! nodes configured with an `[openlineage] url` to that endpoint (`/api/v1/lineage` for
//! Marquez).
//! The model follows OpenLineage's spec 2-0-2; `tests/openlineage.rs` has PyPI's
//! `openlineage-python` build each event again from its fields (its validators run) and checks
//! that it writes the same JSON.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ids::{InstanceId, JobName, TraceId};
use crate::instance::{State, Tag};
use crate::messages::ResultMessage;
use crate::spec::dataset::{named_in, DatasetUri};
use crate::spec::JobSpec;

/// The run event schema the events follow.
pub const SCHEMA_URL: &str = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent";
/// Who produced the events: this version of ax.
pub const PRODUCER: &str = concat!(
    "https://github.com/ax-scheduler/ax/tree/v",
    env!("CARGO_PKG_VERSION")
);
const PARENT_SCHEMA: &str =
    "https://openlineage.io/spec/facets/1-2-0/ParentRunFacet.json#/$defs/ParentRunFacet";
const NOMINAL_SCHEMA: &str =
    "https://openlineage.io/spec/facets/1-0-1/NominalTimeRunFacet.json#/$defs/NominalTimeRunFacet";
const ERROR_SCHEMA: &str =
    "https://openlineage.io/spec/facets/1-0-1/ErrorMessageRunFacet.json#/$defs/ErrorMessageRunFacet";
/// The namespace of ax's jobs when the node's config names none.
pub const DEFAULT_NAMESPACE: &str = "ax";

/// What happened to the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum EventType {
    /// The attempt started executing.
    Start,
    /// It succeeded.
    Complete,
    /// It failed (a retry, if one is left, is another run).
    Fail,
    /// It was stopped: killed (by an operator, or by a signal), or its instance cancelled
    /// while it ran.
    Abort,
}

/// One run event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunEvent {
    /// What happened.
    pub event_type: EventType,
    /// When (RFC 3339).
    pub event_time: String,
    /// The attempt.
    pub run: Run,
    /// Its job.
    pub job: Job,
    /// The datasets it reads.
    pub inputs: Vec<Dataset>,
    /// The datasets it writes.
    pub outputs: Vec<Dataset>,
    /// [`PRODUCER`].
    pub producer: String,
    /// [`SCHEMA_URL`].
    #[serde(rename = "schemaURL")]
    pub schema_url: String,
}

/// A run: one attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    /// The attempt's trace id as a UUID.
    pub run_id: String,
    /// Its parent (the instance) and its nominal time (the fire's expected time).
    pub facets: RunFacets,
}

/// The facets of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunFacets {
    /// The instance the attempt belongs to.
    pub parent: ParentRunFacet,
    /// When the fire was due.
    pub nominal_time: NominalTimeRunFacet,
    /// Why a failed or stopped attempt ended (on `FAIL` and `ABORT` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<ErrorMessageRunFacet>,
}

/// `errorMessage`: why the run failed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorMessageRunFacet {
    /// [`PRODUCER`].
    #[serde(rename = "_producer")]
    pub producer: String,
    /// The facet's schema.
    #[serde(rename = "_schemaURL")]
    pub schema_url: String,
    /// The attempt's message (`exit_code 3`, `killed by an operator: hung`, ...).
    pub message: String,
    /// The executor that ran it (`shell`, `python`, `http`, `sql`, a plugin's name).
    pub programming_language: String,
    /// The end of what it wrote on stderr, when it wrote anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_trace: Option<String>,
}

/// `parent`: the run (and job) this one is part of.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParentRunFacet {
    /// [`PRODUCER`].
    #[serde(rename = "_producer")]
    pub producer: String,
    /// The facet's schema.
    #[serde(rename = "_schemaURL")]
    pub schema_url: String,
    /// The parent run.
    pub run: ParentRun,
    /// The parent's job.
    pub job: Job,
}

/// The parent run's id.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentRun {
    /// The instance id as a UUID (see [`instance_run_id`]).
    pub run_id: String,
}

/// `nominalTime`: when the run was meant to start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NominalTimeRunFacet {
    /// [`PRODUCER`].
    #[serde(rename = "_producer")]
    pub producer: String,
    /// The facet's schema.
    #[serde(rename = "_schemaURL")]
    pub schema_url: String,
    /// The fire's expected time (RFC 3339).
    pub nominal_start_time: String,
}

/// A job, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// The deployment's namespace (`[openlineage] namespace`, `ax` by default).
    pub namespace: String,
    /// The job's name.
    pub name: String,
}

/// A dataset, by namespace and name: `s3://lake/events/clicks` is namespace `s3://lake`, name
/// `events/clicks` (OpenLineage's naming); a URI without a path, `warehouse://orders`, is
/// namespace `warehouse`, name `orders`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Dataset {
    /// Where it lives.
    pub namespace: String,
    /// What it is there.
    pub name: String,
}

impl Dataset {
    /// The dataset `uri` names.
    pub fn of(uri: &DatasetUri) -> Self {
        let text = uri.as_str();
        let (scheme, rest) = text.split_once("://").unwrap_or(("ax", text));
        match rest.split_once('/') {
            Some((authority, path)) => Dataset {
                namespace: format!("{scheme}://{authority}"),
                name: path.to_string(),
            },
            None => Dataset {
                namespace: scheme.to_string(),
                name: rest.to_string(),
            },
        }
    }
}

/// `hex` (32 hexadecimal digits) written as a UUID: `8-4-4-4-12`.
fn as_uuid(hex: &str) -> String {
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The run id of an attempt: its trace id as a UUID (a trace id that is not 32 hexadecimal
/// digits, which ax never makes, is hashed into one).
pub fn attempt_run_id(trace: &TraceId) -> String {
    let text = trace.as_str();
    if text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        as_uuid(&text.to_ascii_lowercase())
    } else {
        hashed_uuid("trace", text)
    }
}

/// The run id of an instance, the parent of its attempts: a version 8 UUID (RFC 9562) from the
/// SHA-256 of its id, the same wherever it is computed.
pub fn instance_run_id(instance: &InstanceId) -> String {
    hashed_uuid("instance", instance.as_str())
}

fn hashed_uuid(what: &str, text: &str) -> String {
    let digest = Sha256::digest(format!("ax/openlineage/{what}/{text}").as_bytes());
    let mut bytes: [u8; 16] = [0; 16];
    bytes.copy_from_slice(&digest[..16]);
    bytes[6] = (bytes[6] & 0x0f) | 0x80; // version 8
    bytes[8] = (bytes[8] & 0x3f) | 0x80; // the RFC's variant
    as_uuid(&hex::encode(bytes))
}

/// What an attempt is, for its events.
#[derive(Clone, Debug)]
pub struct Attempt<'a> {
    /// Its instance.
    pub instance_id: &'a InstanceId,
    /// Its trace.
    pub trace_id: &'a TraceId,
    /// Its job.
    pub job: &'a JobName,
    /// When the fire was due.
    pub expected_time: DateTime<Utc>,
}

impl Attempt<'_> {
    /// The event of `event_type` at `at`, reading `inputs` and writing `outputs`, in
    /// `namespace`.
    pub fn event(
        &self,
        namespace: &str,
        event_type: EventType,
        at: DateTime<Utc>,
        inputs: Vec<Dataset>,
        outputs: Vec<Dataset>,
    ) -> RunEvent {
        let job = Job {
            namespace: namespace.to_string(),
            name: self.job.to_string(),
        };
        RunEvent {
            event_type,
            event_time: crate::time::rfc3339(at),
            run: Run {
                run_id: attempt_run_id(self.trace_id),
                facets: RunFacets {
                    parent: ParentRunFacet {
                        producer: PRODUCER.to_string(),
                        schema_url: PARENT_SCHEMA.to_string(),
                        run: ParentRun {
                            run_id: instance_run_id(self.instance_id),
                        },
                        job: job.clone(),
                    },
                    nominal_time: NominalTimeRunFacet {
                        producer: PRODUCER.to_string(),
                        schema_url: NOMINAL_SCHEMA.to_string(),
                        nominal_start_time: crate::time::rfc3339(self.expected_time),
                    },
                    error_message: None,
                },
            },
            job,
            inputs,
            outputs,
            producer: PRODUCER.to_string(),
            schema_url: SCHEMA_URL.to_string(),
        }
    }
}

/// The datasets `spec` reads.
pub fn inputs(spec: Option<&JobSpec>) -> Vec<Dataset> {
    spec.map(|s| s.consumes.iter().map(Dataset::of).collect())
        .unwrap_or_default()
}

/// The datasets `spec` declares it writes.
pub fn outputs(spec: Option<&JobSpec>) -> Vec<Dataset> {
    spec.map(|s| s.produces.iter().map(Dataset::of).collect())
        .unwrap_or_default()
}

/// The events of an attempt's end: its `START` at its start and its end at its finish, with
/// what it read and wrote as `spec` declares (a success writes the datasets its output named,
/// when it names any). `None` for an attempt that never started (cancelled while it waited)
/// and for a result that is no attempt's end.
pub fn of_result(
    result: &ResultMessage,
    spec: Option<&JobSpec>,
    namespace: &str,
) -> Option<(RunEvent, RunEvent)> {
    let started = result.started_at?;
    let end = match (result.state, result.tag) {
        (State::Running, _) => return None,
        (State::Success, _) => EventType::Complete,
        (State::Cancelled, _) | (_, Tag::Killed) => EventType::Abort,
        (State::Failed | State::WaitingRetry, _) => EventType::Fail,
    };
    let attempt = Attempt {
        instance_id: &result.instance_id,
        trace_id: &result.trace_id,
        job: &result.job,
        expected_time: result.expected_time,
    };
    let written = match (end, named_in(&result.output, &result.biz_date)) {
        (EventType::Complete, Some(named)) => {
            let mut named: Vec<Dataset> = named.iter().map(|(uri, _)| Dataset::of(uri)).collect();
            named.sort();
            named.dedup();
            named
        }
        _ => outputs(spec),
    };
    let mut ended = attempt.event(namespace, end, result.finished_at, inputs(spec), written);
    if end != EventType::Complete {
        ended.run.facets.error_message = Some(ErrorMessageRunFacet {
            producer: PRODUCER.to_string(),
            schema_url: ERROR_SCHEMA.to_string(),
            message: result.message.clone(),
            programming_language: spec.map_or("unknown", |s| s.exec.name()).to_string(),
            stack_trace: Some(result.stderr_tail.clone()).filter(|t| !t.trim().is_empty()),
        });
    }
    let start = attempt.event(
        namespace,
        EventType::Start,
        started,
        inputs(spec),
        outputs(spec),
    );
    Some((start, ended))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dataset_is_named_as_openlineage_names_it() {
        let of = |uri: &str| Dataset::of(&DatasetUri::parse(uri).unwrap());
        assert_eq!(
            of("s3://lake/events/clicks"),
            Dataset {
                namespace: "s3://lake".into(),
                name: "events/clicks".into()
            }
        );
        assert_eq!(
            of("warehouse://orders"),
            Dataset {
                namespace: "warehouse".into(),
                name: "orders".into()
            }
        );
    }

    #[test]
    fn run_ids_are_uuids_the_attempts_its_trace() {
        let instance = InstanceId::parse("load.20261205T000000000Z").unwrap();
        let trace = TraceId::first_of(&instance);
        let run = attempt_run_id(&trace);
        assert_eq!(run.replace('-', ""), trace.as_str());
        let parent = instance_run_id(&instance);
        assert_eq!(parent.len(), 36);
        assert_eq!(&parent[14..15], "8", "version 8: {parent}");
        assert!(matches!(&parent[19..20], "8" | "9" | "a" | "b"), "{parent}");
        assert_eq!(parent, instance_run_id(&instance), "the same everywhere");
        assert_ne!(parent, run);
    }

    #[test]
    fn an_attempt_that_never_started_has_no_run() {
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "name": "load", "exec": {"type": "noop"},
            "consumes": ["s3://raw/orders"], "produces": ["warehouse://orders"],
        }))
        .unwrap();
        let instance = InstanceId::parse("load.20261205T000000000Z").unwrap();
        let mut result = ResultMessage {
            instance_id: instance.clone(),
            trace_id: TraceId::first_of(&instance),
            job: spec.name.clone(),
            biz_date: "2026-12-05".into(),
            attempt: 1,
            state: State::Cancelled,
            tag: crate::instance::Tag::Operator,
            message: "cancelled while it waited".into(),
            output: serde_json::Value::Null,
            worker: None,
            expected_time: crate::time::now(),
            started_at: None,
            finished_at: crate::time::now(),
            duration_ms: None,
            exit_code: None,
            next_attempt_at: None,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            usage: None,
            shard: None,
            trigger: None,
            due_at: None,
        };
        assert!(of_result(&result, Some(&spec), "ax").is_none());
        result.started_at = Some(result.finished_at);
        result.state = State::Success;
        result.output = serde_json::json!({"datasets": ["warehouse://orders_v2"]});
        let (start, end) = of_result(&result, Some(&spec), "prod").unwrap();
        assert_eq!(start.event_type, EventType::Start);
        assert_eq!(end.event_type, EventType::Complete);
        assert_eq!(start.job.namespace, "prod");
        assert_eq!(start.outputs[0].name, "orders");
        assert_eq!(end.outputs[0].name, "orders_v2", "what the output named");
        assert_eq!(end.inputs, start.inputs);
        assert_eq!(end.run, start.run, "no error on a success");
        let json = serde_json::to_value(&end).unwrap();
        assert_eq!(json["schemaURL"], SCHEMA_URL);
        assert_eq!(json["run"]["facets"]["parent"]["_schemaURL"], PARENT_SCHEMA);
    }
}
