//! A job's `lease`: how long its running attempt may go without its worker being heard. A
//! worker cut off from NATS stops an attempt only 5 s short of its lease, and no Router hands
//! the attempt to another worker before the lease has run out — so a long step with `lease:
//! 60s` rides out a 20 s NATS outage, where a step without a lease is stopped after 5 s and
//! runs again from the start. Neither ever has two executions at once.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use ax_bus::State;
use support::*;

/// A job whose command writes `start` and, 24 s later, `end`, each with its trace id.
fn step(name: &str, lease: &str, ledger: &Path) -> String {
    format!(
        "version: v1\njob:\n  name: {name}\n{lease}  timeout: 120\n  exec:\n    type: shell\n    command: 'echo start $AX_TRACE_ID >> {l}; sleep 24; echo end $AX_TRACE_ID >> {l}'\n",
        l = ledger.display()
    )
}

/// The ledger's (event, trace) pairs.
fn events(ledger: &Path) -> Vec<(String, String)> {
    lines_of(ledger)
        .into_iter()
        .filter_map(|line| {
            let (event, trace) = line.split_once(' ')?;
            Some((event.to_string(), trace.to_string()))
        })
        .collect()
}

/// No execution of an instance overlaps another: every `start` after the first comes after
/// the `end` of the one before, or the one before never ended (it was killed).
fn assert_one_at_a_time(ledger: &Path, killed: &[String]) {
    let mut running: Option<String> = None;
    for (event, trace) in events(ledger) {
        match event.as_str() {
            "start" => {
                if let Some(before) = &running {
                    assert!(
                        killed.contains(before),
                        "{trace} started while {before} ran: {:?}",
                        events(ledger)
                    );
                }
                running = Some(trace);
            }
            _ => running = None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_lease_rides_out_a_nats_outage_that_stops_a_step_without_one() {
    let mut nats = TestNats::start();
    let client = nats.client().await;
    let control = AxProcess::node(&nats, "core", "scheduler,dag,router", &[]);
    let worker = AxProcess::node(&nats, "w1", "worker", &[]);
    let files = nats.path("files");
    let (leased_ledger, plain_ledger) = (files.join("leased"), files.join("plain"));
    apply_job(
        &nats,
        "leased",
        &step("leased", "  lease: 60s\n", &leased_ledger),
    )
    .await;
    apply_job(&nats, "plain", &step("plain", "", &plain_ledger)).await;
    let triggered = Instant::now();
    let leased = trigger(&nats, &["leased"]);
    let plain = trigger(&nats, &["plain"]);
    wait_for(Duration::from_secs(20), "both steps to start", || async {
        (!lines_of(&leased_ledger).is_empty() && !lines_of(&plain_ledger).is_empty()).then_some(())
    })
    .await;
    nats.outage(Duration::from_secs(20)).await;
    let client_again = nats.client().await;
    let done = |id: String| {
        let client = client_again.clone();
        let nodes = [&worker, &control];
        async move {
            wait_for_logged(
                Duration::from_secs(90),
                "the step's end",
                &nodes,
                || async {
                    client
                        .instance(&support::id(&id))
                        .await
                        .ok()
                        .flatten()
                        .map(|(r, _)| r)
                        .filter(|r| r.state.is_final())
                },
            )
            .await
        }
    };
    let leased_record = done(leased).await;
    let leased_took = triggered.elapsed();
    let plain_record = done(plain).await;
    let plain_took = triggered.elapsed();
    println!(
        "a 20 s outage: the step with a 60 s lease ended after {leased_took:?} (attempt {}), the one without after {plain_took:?} (attempt {})",
        leased_record.attempt, plain_record.attempt
    );
    drop(client);

    // The leased step ran through: one attempt, one execution, never stopped.
    assert_eq!(
        leased_record.state,
        State::Success,
        "{}",
        leased_record.message
    );
    assert_eq!((leased_record.attempt, leased_record.worker_losses), (1, 0));
    let trace = leased_record.trace_id.to_string();
    assert_eq!(
        events(&leased_ledger),
        [("start".into(), trace.clone()), ("end".into(), trace)]
    );

    // The other was stopped by its worker (self-fencing) and ran again, after the first.
    assert_eq!(
        plain_record.state,
        State::Success,
        "{}",
        plain_record.message
    );
    assert_eq!((plain_record.attempt, plain_record.worker_losses), (2, 1));
    let plain_events = events(&plain_ledger);
    let first = plain_events[0].1.clone();
    assert_ne!(first, plain_record.trace_id.to_string());
    assert!(
        !plain_events.contains(&("end".into(), first.clone())),
        "the fenced attempt went on: {plain_events:?}"
    );
    assert_one_at_a_time(&plain_ledger, &[first]);
    assert!(worker.log_text().contains("self-fencing"));
}
