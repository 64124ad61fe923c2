//! Every attempt as OpenLineage run events (see [`ax_bus::openlineage`]), made by the leading
//! DagCoordinator when its node's config has an `[openlineage]` section, and published on `ax.lineage.<job>` into `<AX>_LINEAGE`, from where the
//! nodes with an `[openlineage] url` POST them (see [`crate::node::webhook`]).
//!
//! Two sources, so that a `START` is live and yet never missing:
//! - the `running` events of attempts that start executing (core NATS, as they happen): a
//!   `START` at once;
//! - every attempt's result (`<AX>_RESULTS`, through a durable consumer, so nothing is missed
//!   while no coordinator leads): its `START` — unless this coordinator already published it
//!   — then its `COMPLETE`, `FAIL` or `ABORT`; the result is acknowledged once both are
//!   stored.
//!
//! Each event carries a message id (`<trace>.start`, `<trace>.end`): a `START` published from
//! both sources, or again after a redelivery, is stored once within the stream's duplicate
//! window. A `START` is stored before its run's end: the result's path stores it first.

use futures::StreamExt;
use std::collections::{BTreeMap, HashSet, VecDeque};

use ax_bus::client::kv_view::{FeedItem, KvFeed};
use ax_bus::error::During;
use ax_bus::ids::{JobName, NodeId, TraceId};
use ax_bus::instance::{InstanceRecord, State, Tag};
use ax_bus::messages::{AlertKind, JobRecord, ResultMessage};
use ax_bus::openlineage::{self, Attempt, EventType, RunEvent};
use ax_bus::spec::JobSpec;
use ax_bus::{codec, AxClient};

use crate::jetstream::consume::{self, ConsumerSpec};
use crate::jetstream::publish;
use crate::ActorError;

/// The durable consumer of the results.
const CONSUMER: &str = "openlineage";
/// How many traces whose `START` was published are remembered.
const REMEMBERED: usize = 100_000;

/// The traces whose `START` this coordinator published, the oldest forgotten first.
#[derive(Debug, Default)]
struct Started {
    set: HashSet<TraceId>,
    order: VecDeque<TraceId>,
}

impl Started {
    fn insert(&mut self, trace: TraceId) {
        if self.set.insert(trace.clone()) {
            self.order.push_back(trace);
            if self.order.len() > REMEMBERED {
                if let Some(oldest) = self.order.pop_front() {
                    self.set.remove(&oldest);
                }
            }
        }
    }
}

/// Publishes the run events until a source ends or fails (the pump restarts it).
pub(crate) async fn translate(
    client: AxClient,
    node: NodeId,
    namespace: String,
) -> Result<(), ActorError> {
    let mut registry = KvFeed::open(&client.js, &client.layout.jobs_bucket(), ">")
        .await?
        .into_stream();
    let mut specs: BTreeMap<JobName, JobSpec> = BTreeMap::new();
    let mut subscribed = Vec::new();
    for running in client.subjects().events_in_state(State::Running.as_str()) {
        let subscriber = client.nats.subscribe(running.clone()).await;
        subscribed.push(subscriber.during(|| format!("subscribe {running}"))?);
    }
    let mut starts = futures::stream::select_all(subscribed);
    let spec = ConsumerSpec::new(
        client.layout.results_stream(),
        CONSUMER,
        client.subjects().result_all(),
    );
    let mut results = consume::messages(&client, &spec, 64).await?;
    let mut started = Started::default();
    loop {
        tokio::select! {
            item = registry.next() => match item {
                Some(item) => follow(&mut specs, item?),
                None => return Err(ActorError::Stopped("the registry feed")),
            },
            event = starts.next() => {
                let Some(event) = event else {
                    return Err(ActorError::Stopped("the running events"));
                };
                let Ok(record) = codec::decode::<InstanceRecord>(&event.payload) else {
                    continue;
                };
                if let Some(start) = live_start(&record, specs.get(&record.job), &namespace) {
                    publish(&client, &record.trace_id, "start", &start).await?;
                    started.insert(record.trace_id.clone());
                }
            }
            message = results.next() => {
                let Some(message) = message else {
                    return Err(ActorError::Stopped("the results consumer"));
                };
                let message = message.during(|| "the results consumer")?;
                let flow = AlertKind::Flow;
                let decoded = consume::decode_or_dead_letter(&client, &node, flow, &message);
                let Some(result): Option<ResultMessage> = decoded.await else {
                    continue;
                };
                if let Some((start, end)) =
                    openlineage::of_result(&result, specs.get(&result.job), &namespace)
                {
                    if !started.set.contains(&result.trace_id) {
                        publish(&client, &result.trace_id, "start", &start).await?;
                    }
                    publish(&client, &result.trace_id, "end", &end).await?;
                    started.insert(result.trace_id.clone());
                }
                consume::ack(&message).await;
            }
        }
    }
}

/// Keeps the registry's definitions (their datasets make the events' inputs and outputs).
fn follow(specs: &mut BTreeMap<JobName, JobSpec>, item: FeedItem) {
    match item {
        FeedItem::Put { value, .. } => {
            if let Ok(record) = codec::decode::<JobRecord>(&value) {
                specs.insert(record.spec.name.clone(), record.spec);
            }
        }
        FeedItem::Deleted { key } => {
            if let Ok(name) = key.parse::<JobName>() {
                specs.remove(&name);
            }
        }
        FeedItem::Current => {}
    }
}

/// The `START` of an attempt that has just started executing.
fn live_start(
    record: &InstanceRecord,
    spec: Option<&JobSpec>,
    namespace: &str,
) -> Option<RunEvent> {
    if record.tag != Tag::Executing {
        return None;
    }
    let at = record.started_at?;
    let attempt = Attempt {
        instance_id: &record.instance_id,
        trace_id: &record.trace_id,
        job: &record.job,
        expected_time: record.expected_time,
    };
    Some(attempt.event(
        namespace,
        EventType::Start,
        at,
        openlineage::inputs(spec),
        openlineage::outputs(spec),
    ))
}

/// Stores `event` on `ax.lineage.<job>` as JSON under `<trace>.<which>`, waiting for the
/// stream's ack.
async fn publish(
    client: &AxClient,
    trace: &TraceId,
    which: &str,
    event: &RunEvent,
) -> Result<(), ActorError> {
    let subject = client.subjects().lineage(&event.job.name);
    let payload = serde_json::to_vec(event).map_err(codec::CodecError::EncodeJson)?;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(codec::CONTENT_TYPE, codec::JSON);
    let msg_id = format!("{trace}.{which}");
    publish::raw_acked(client, subject, &msg_id, headers, payload.into()).await
}
