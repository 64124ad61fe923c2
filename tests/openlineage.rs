//! OpenLineage: every attempt's start and end becomes a run event (START, then COMPLETE or
//! FAIL) on `ax.lineage.<job>`, POSTed to the `[openlineage] url` — through the endpoint's
//! errors, once each — with the job in the configured namespace, the run id the attempt's
//! trace, the instance as the parent run, the nominal time, and the datasets read and
//! written; a running attempt's START arrives before it ends; PyPI's `openlineage-python`
//! builds every event again from its fields and writes the same JSON.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use ax_bus::openlineage::attempt_run_id;
use support::webhook::Webhook;
use support::*;

const JOBS: &str = "version: v1
job:
  name: load
  consumes: [ 's3://raw/orders' ]
  produces: [ 'warehouse://orders' ]
  exec: { type: shell, command: 'true' }
---
version: v1
job:
  name: broken
  retry: { times: 1, interval: 1 }
  exec: { type: shell, command: 'exit 3' }
---
version: v1
job:
  name: slow
  exec: { type: shell, command: 'sleep 30' }
";

/// Rebuilds each event of the file with openlineage-python's classes (their validators run:
/// UUIDs, URIs, times; the schema URLs are the classes' own) and prints any whose JSON differs
/// from what ax sent.
const REBUILD: &str = r#"
import json, sys
from openlineage.client.event_v2 import RunEvent, Run, Job, InputDataset, OutputDataset, RunState
from openlineage.client.facet_v2 import error_message_run, parent_run, nominal_time_run
from openlineage.client.serde import Serde

events = json.load(open(sys.argv[1]))
for sent in events:
    facets = sent["run"]["facets"]
    parent = facets["parent"]
    nominal = facets["nominalTime"]
    rebuilt = {
        "parent": parent_run.ParentRunFacet(
            run=parent_run.Run(runId=parent["run"]["runId"]),
            job=parent_run.Job(namespace=parent["job"]["namespace"], name=parent["job"]["name"]),
            producer=parent["_producer"],
        ),
        "nominalTime": nominal_time_run.NominalTimeRunFacet(
            nominalStartTime=nominal["nominalStartTime"], producer=nominal["_producer"],
        ),
    }
    if "errorMessage" in facets:
        error = facets["errorMessage"]
        rebuilt["errorMessage"] = error_message_run.ErrorMessageRunFacet(
            message=error["message"],
            programmingLanguage=error["programmingLanguage"],
            stackTrace=error.get("stackTrace"),
            producer=error["_producer"],
        )
    event = RunEvent(
        eventType=RunState[sent["eventType"]],
        eventTime=sent["eventTime"],
        run=Run(runId=sent["run"]["runId"], facets=rebuilt),
        job=Job(namespace=sent["job"]["namespace"], name=sent["job"]["name"]),
        inputs=[InputDataset(namespace=d["namespace"], name=d["name"]) for d in sent["inputs"]],
        outputs=[OutputDataset(namespace=d["namespace"], name=d["name"]) for d in sent["outputs"]],
        producer=sent["producer"],
    )
    # The classes write the facets nobody set as `{}`, and ax leaves them out: the same.
    def bare(value):
        if isinstance(value, dict):
            return {k: bare(v) for k, v in value.items() if v != {} and v != []}
        if isinstance(value, list):
            return [bare(v) for v in value]
        return value
    again = bare(json.loads(Serde.to_json(event)))
    if again != bare(sent):
        print("DIFFERS", json.dumps(sent, sort_keys=True), json.dumps(again, sort_keys=True))
print("rebuilt", len(events))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attempt_reaches_the_lineage_endpoint_as_a_start_and_an_end_once() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let endpoint = Webhook::start(2).await;
    // A POST answered after its timeout is POSTed again (at least once): the timeout is long
    // enough for a loaded machine, so that each event comes once here.
    let config = format!(
        "[openlineage]\nurl = \"{}\"\ntimeout = 10\nnamespace = \"etl\"\n",
        endpoint.url
    );
    let mut node = AxProcess::configured(&nats, "n1", "all", &config);
    let file = job_file(&nats.path("jobs"), "jobs.yaml", JOBS);
    let applied = ax(&nats.url(), &["job", "apply", "-f", file.to_str().unwrap()]);
    assert!(applied.status.success(), "{}", stderr(&applied));

    // A running attempt's START comes while it runs.
    let slow = trigger(&nats, &["slow"]);
    let slow_trace = executing(&client, &slow, Duration::from_secs(30))
        .await
        .trace_id;
    let slow_run = attempt_run_id(&slow_trace);
    wait_for_logged(
        Duration::from_secs(30),
        "slow's START while it runs",
        &[&node],
        || async {
            endpoint
                .bodies()
                .iter()
                .any(|(status, e)| *status == 200 && e["run"]["runId"] == slow_run.as_str())
                .then_some(())
        },
    )
    .await;
    let (record, _) = client
        .instance(&slow.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(!record.state.is_final(), "slow ended before its START came");
    let out = ax(
        &nats.url(),
        &["instance", "kill", &slow, "--reason", "enough"],
    );
    assert!(out.status.success(), "{}", stderr(&out));

    let load = trigger(&nats, &["load"]);
    let broken = trigger(&nats, &["broken"]);
    let load = final_record(&client, &load, Duration::from_secs(30)).await;
    let broken = final_record(&client, &broken, Duration::from_secs(30)).await;
    assert_eq!(
        (load.state, broken.state, broken.attempt),
        (ax_bus::State::Success, ax_bus::State::Failed, 2)
    );
    // Its first attempt's trace comes from its instance id; the retry's is the record's now.
    let broken_traces = vec![
        ax_bus::ids::TraceId::first_of(&broken.instance_id),
        broken.trace_id.clone(),
    ];
    assert_ne!(broken_traces[0], broken_traces[1]);

    // START and end of each of the four runs taken (200), the first two POSTs refused.
    let runs: Vec<String> = [load.trace_id.clone(), slow_trace]
        .iter()
        .chain(&broken_traces)
        .map(attempt_run_id)
        .collect();
    let taken = wait_for_logged(
        Duration::from_secs(60),
        "every run's START and end at the endpoint",
        &[&node],
        || async {
            let bodies = endpoint.bodies();
            let taken: Vec<serde_json::Value> = bodies
                .iter()
                .filter(|(status, _)| *status == 200)
                .map(|(_, e)| e.clone())
                .collect();
            let ended = runs.iter().all(|run| {
                taken
                    .iter()
                    .filter(|e| e["run"]["runId"] == run.as_str())
                    .count()
                    >= 2
            });
            ended.then_some(taken)
        },
    )
    .await;
    let statuses: Vec<u16> = endpoint.bodies().iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses[..2], [500, 500], "{statuses:?}");
    let mut by_run: BTreeMap<String, Vec<&serde_json::Value>> = BTreeMap::new();
    for event in &taken {
        by_run
            .entry(event["run"]["runId"].as_str().unwrap().to_string())
            .or_default()
            .push(event);
    }
    let kinds = |run: &str| -> Vec<&str> {
        by_run[run]
            .iter()
            .map(|e| e["eventType"].as_str().unwrap())
            .collect()
    };
    assert_eq!(kinds(&runs[0]), ["START", "COMPLETE"], "load, once each");
    assert_eq!(kinds(&runs[1]), ["START", "ABORT"], "slow, killed");
    assert_eq!(kinds(&runs[2]), ["START", "FAIL"]);
    assert_eq!(kinds(&runs[3]), ["START", "FAIL"]);

    let load_end = by_run[&runs[0]][1];
    assert_eq!(
        load_end["job"],
        serde_json::json!({"namespace": "etl", "name": "load"})
    );
    assert_eq!(
        load_end["inputs"],
        serde_json::json!([{"namespace": "s3://raw", "name": "orders"}])
    );
    assert_eq!(
        load_end["outputs"],
        serde_json::json!([{"namespace": "warehouse", "name": "orders"}])
    );
    // The START is when the attempt started — its `executing` record's time, which the
    // record keeps to its end, whichever source told it first — the end when it finished.
    let time = |e: &serde_json::Value| {
        chrono::DateTime::parse_from_rfc3339(e["eventTime"].as_str().unwrap())
            .unwrap()
            .with_timezone(&chrono::Utc)
    };
    let (load_start, started) = (by_run[&runs[0]][0], load.started_at.unwrap());
    assert!(
        load_start["eventTime"] == ax_bus::time::rfc3339(started).as_str()
            && time(load_start) <= time(load_end)
            && time(load_end) == load.finished_at.unwrap(),
        "{load_start} {load_end} {load:?}"
    );
    assert_eq!(
        load_end["run"]["facets"]["nominalTime"]["nominalStartTime"],
        ax_bus::time::rfc3339(load.expected_time)
    );
    // A failure says why, with the executor and the end of stderr when there is one; a
    // success has nothing to say.
    assert!(load_end["run"]["facets"].get("errorMessage").is_none());
    let error = &by_run[&runs[2]][1]["run"]["facets"]["errorMessage"];
    assert_eq!(error["programmingLanguage"], "shell", "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("exit"),
        "{error}"
    );
    let killed = &by_run[&runs[1]][1]["run"]["facets"]["errorMessage"];
    assert!(
        killed["message"].as_str().unwrap().contains("enough"),
        "{killed}"
    );
    // Both attempts of `broken` are runs of one parent, its instance.
    let parent = |run: &str| by_run[run][0]["run"]["facets"]["parent"].clone();
    assert_eq!(parent(&runs[2])["run"], parent(&runs[3])["run"]);
    assert_eq!(
        parent(&runs[2])["job"],
        serde_json::json!({"namespace": "etl", "name": "broken"})
    );
    assert_ne!(parent(&runs[0])["run"], parent(&runs[2])["run"]);

    // The node killed with kill -9 and started again: the events it had taken are not sent
    // again (its consumers resume past them, a repeat is stored once), and a new run's are.
    // Killed once the forwarder has acknowledged every event it POSTed: one killed between a
    // POST and its acknowledgement sends that event again, as at-least-once delivery must.
    wait_for(
        Duration::from_secs(30),
        "every event acknowledged",
        || async {
            let stream = client
                .js
                .get_stream(client.layout.lineage_stream())
                .await
                .ok()?;
            let info = stream.consumer_info("openlineage-http").await.ok()?;
            (info.num_pending == 0 && info.num_ack_pending == 0).then_some(())
        },
    )
    .await;
    node.kill9();
    let node = AxProcess::configured(&nats, "n1", "all", &config);
    let later = trigger(&nats, &["load"]);
    let later = final_record(&client, &later, Duration::from_secs(60)).await;
    let later_run = attempt_run_id(&later.trace_id);
    let taken = wait_for_logged(
        Duration::from_secs(60),
        "the run after the restart",
        &[&node],
        || async {
            let taken: Vec<serde_json::Value> = endpoint
                .bodies()
                .into_iter()
                .filter(|(status, _)| *status == 200)
                .map(|(_, e)| e)
                .collect();
            let ended = taken
                .iter()
                .filter(|e| e["run"]["runId"] == later_run.as_str())
                .count()
                == 2;
            ended.then_some(taken)
        },
    )
    .await;
    let mut per_run: BTreeMap<&str, usize> = BTreeMap::new();
    for event in &taken {
        *per_run
            .entry(event["run"]["runId"].as_str().unwrap())
            .or_default() += 1;
    }
    assert!(per_run.values().all(|n| *n == 2), "{per_run:?}");
    assert_eq!(per_run.len(), 5, "{per_run:?}");

    // openlineage-python reads each one as its model.
    let events = nats.path("lineage").join("events.json");
    std::fs::write(&events, serde_json::to_vec(&taken).unwrap()).unwrap();
    let python = support::python::venv();
    let said = support::python::run(
        std::process::Command::new(python)
            .args(["-c", REBUILD])
            .arg(&events),
        "openlineage-python",
    );
    assert!(
        said.contains(&format!("rebuilt {}", taken.len())) && !said.contains("DIFFERS"),
        "{said}"
    );
}
