//! The verdict on a run under faults (the chaos and partition suites): the fires their cron
//! jobs owed over a window, the wait until each has an instance and every instance has ended,
//! and what the records, the results stream, the jobs' ledger (`ledger.rs`) and the nodes'
//! heartbeats show against them. One judge, so both suites hold ax to the same rules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};

use ax_bus::{AxClient, InstanceRecord, State};

use super::ledger::{self, Findings};

/// A cron job whose shell command writes `start`, `ticks` ticks 0.2 s apart and `end` to the
/// ledger; retried up to ten times, fires missed while no Scheduler ran all made up.
pub(crate) fn ledger_job(
    name: &str,
    cron: &str,
    deps: &str,
    ledger_file: &Path,
    ticks: u32,
    timeout: u32,
) -> String {
    let head = format!("  cron: '{cron}'\n  misfire: fire_all\n  catchup_window: 900\n{deps}");
    ledger_spec(name, &head, ledger_file, ticks, timeout, "")
}

/// A job (`head`: its trigger and other fields, as YAML lines of the `job` map) whose shell
/// command writes to the ledger as [`ledger_job`]'s does, then runs `then` (another shell
/// command, after the ledger's end); retried up to ten times.
pub(crate) fn ledger_spec(
    name: &str,
    head: &str,
    ledger_file: &Path,
    ticks: u32,
    timeout: u32,
    then: &str,
) -> String {
    let mut command = ledger::command(ledger_file, ticks);
    if !then.is_empty() {
        command = format!("{command} && {then}");
    }
    format!(
        "version: v1
job:
  name: {name}
{head}  retry: {{ times: 10, interval: 1, max_interval: 4 }}
  timeout: {timeout}
  exec:
    type: shell
    command: '{}'
",
        command.replace('\'', "''")
    )
}

/// The fires of a cron of period `every` seconds in [from, to].
pub(crate) fn fires(from: DateTime<Utc>, to: DateTime<Utc>, every: i64) -> BTreeSet<DateTime<Utc>> {
    let mut t = from
        .duration_trunc(TimeDelta::seconds(every))
        .expect("a whole-second period");
    if t < from {
        t += TimeDelta::seconds(every);
    }
    let mut all = BTreeSet::new();
    while t <= to {
        all.insert(t);
        t += TimeDelta::seconds(every);
    }
    all
}

/// The fires owed: for each job, those of its period in [from, to].
#[derive(Debug)]
pub(crate) struct Owed {
    pub due: BTreeMap<&'static str, BTreeSet<DateTime<Utc>>>,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

impl Owed {
    /// The fires of each (job, period in seconds) in [from, to].
    pub(crate) fn new(
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        jobs: &[(&'static str, i64)],
    ) -> Self {
        let due = jobs
            .iter()
            .map(|(name, every)| (*name, fires(from, to, *every)))
            .collect();
        Self { due, from, to }
    }

    fn in_window(&self, record: &InstanceRecord) -> bool {
        record.expected_time >= self.from && record.expected_time <= self.to
    }

    /// Every record of the jobs (a listing that fails, while a NATS node is away, adds none).
    pub(crate) async fn records(&self, client: &AxClient) -> Vec<InstanceRecord> {
        let mut all = Vec::new();
        for name in self.due.keys() {
            if let Ok(found) = client.instances(Some(&super::job(name))).await {
                all.extend(found);
            }
        }
        all
    }

    /// The records in the window that have not ended.
    pub(crate) fn open<'a>(&self, records: &'a [InstanceRecord]) -> Vec<&'a InstanceRecord> {
        records
            .iter()
            .filter(|r| self.in_window(r) && !r.state.is_final())
            .collect()
    }

    fn count(&self) -> usize {
        self.due.values().map(BTreeSet::len).sum()
    }

    /// Waits (up to `within`) until every owed fire has an instance and every instance in the
    /// window has ended, and returns the records that showed it. Those are the ones judged:
    /// read again right after a NATS node came back, a listing can be served by a new stream
    /// leader that has not applied the last writes yet, and miss the newest records (seen once:
    /// the last seconds' fires "lost" and two instances "unfinished" in the re-read, all of
    /// them present and final in the read before). Not settled: `Err` with the last read.
    pub(crate) async fn settle(
        &self,
        client: &AxClient,
        within: Duration,
    ) -> Result<Vec<InstanceRecord>, Vec<InstanceRecord>> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let all = self.records(client).await;
            if self.lost(&all).is_empty() && self.open(&all).is_empty() {
                return Ok(all);
            }
            if std::time::Instant::now() >= deadline {
                return Err(all);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The owed fires without an instance, as `job@time`.
    pub(crate) fn lost(&self, records: &[InstanceRecord]) -> Vec<String> {
        let mut lost = Vec::new();
        for (name, due) in &self.due {
            let got: BTreeSet<DateTime<Utc>> = records
                .iter()
                .filter(|r| r.job == *name)
                .map(|r| r.expected_time)
                .collect();
            lost.extend(
                due.iter()
                    .filter(|t| !got.contains(t))
                    .map(|t| format!("{name}@{t}")),
            );
        }
        lost
    }
}

/// What a run under faults must never show, and the counts around it.
#[derive(Debug)]
pub(crate) struct Verdict {
    /// Whether the run settled in time.
    pub settled: bool,
    /// Owed fires without an instance (`job@time`).
    pub lost: Vec<String>,
    /// Instances in the window that have not ended: `id state/tag on worker: message`.
    pub not_final: Vec<String>,
    /// The ledger's findings: attempts started twice, on two workers, overlapping.
    pub findings: Findings,
    /// Traces with more than one result.
    pub double_results: Vec<String>,
    /// Successful instances without a result.
    pub without_result: Vec<String>,
    /// Successful instances whose command never reached its end in the ledger.
    pub without_run: Vec<String>,
    /// Actors of the running processes that panicked or stalled.
    pub troubled: Vec<String>,
    /// The nodes' heartbeats.
    pub heartbeats: usize,
    /// Actor restarts in the running processes (expected: NATS nodes went away).
    pub restarts: u64,
    /// Owed fires.
    pub owed: usize,
    /// Results recorded.
    pub results: usize,
    /// Successful instances in the window.
    pub successes: usize,
}

impl Verdict {
    /// Judges `settled` (the records [`Owed::settle`] returned) against `owed`, the results
    /// stream, the ledger in `ledger_file` and the nodes' heartbeats.
    pub(crate) async fn judge(
        client: &AxClient,
        owed: &Owed,
        settled: &Result<Vec<InstanceRecord>, Vec<InstanceRecord>>,
        ledger_file: &Path,
    ) -> Self {
        let all = match settled {
            Ok(all) | Err(all) => all,
        };
        let findings = ledger::examine(&ledger::read(ledger_file));
        let results = super::all_results(client).await;
        let mut results_per_trace: BTreeMap<String, usize> = BTreeMap::new();
        for result in &results {
            *results_per_trace
                .entry(result.trace_id.to_string())
                .or_default() += 1;
        }
        let successes: Vec<&InstanceRecord> = all
            .iter()
            .filter(|r| owed.in_window(r) && r.state == State::Success)
            .collect();
        let nodes = client.nodes().await.unwrap_or_default();
        Self {
            settled: settled.is_ok(),
            lost: owed.lost(all),
            not_final: owed
                .open(all)
                .iter()
                .map(|r| {
                    format!(
                        "{} attempt {} {:?}/{} on {:?}: {}",
                        r.instance_id, r.attempt, r.state, r.tag, r.worker, r.message
                    )
                })
                .collect(),
            double_results: results_per_trace
                .iter()
                .filter(|(_, n)| **n > 1)
                .map(|(t, _)| t.clone())
                .collect(),
            without_result: successes
                .iter()
                .filter(|r| !results_per_trace.contains_key(r.trace_id.as_str()))
                .map(|r| r.instance_id.to_string())
                .collect(),
            without_run: successes
                .iter()
                .filter(|r| !findings.ended.contains(r.trace_id.as_str()))
                .map(|r| r.instance_id.to_string())
                .collect(),
            troubled: nodes
                .iter()
                .flat_map(|n| {
                    n.actors
                        .iter()
                        .filter(|(_, h)| h.panics + h.stalls > 0)
                        .map(move |(actor, h)| format!("{} {actor}: {h:?}", n.node))
                })
                .collect(),
            heartbeats: nodes.len(),
            restarts: nodes
                .iter()
                .flat_map(|n| n.actors.values())
                .map(|h| h.restarts)
                .sum(),
            owed: owed.count(),
            results: results.len(),
            successes: successes.len(),
            findings,
        }
    }

    /// Whether anything that must never happen happened (or the run did not settle).
    pub(crate) fn failing(&self) -> bool {
        !self.settled
            || !self.lost.is_empty()
            || !self.not_final.is_empty()
            || !self.findings.started_twice.is_empty()
            || !self.findings.on_two_workers.is_empty()
            || !self.findings.overlapping.is_empty()
            || !self.double_results.is_empty()
            || !self.without_result.is_empty()
            || !self.without_run.is_empty()
            || !self.troubled.is_empty()
    }

    /// One line of counts, and one of the nodes, prefixed by `suite`.
    pub(crate) fn print(&self, suite: &str) {
        println!(
            "{suite} ledger: expected {}, lost {}, unfinished {}, runs {}, started twice {}, \
             on two workers {}, overlapping {}, results {} (twice {}), successes {}",
            self.owed,
            self.lost.len(),
            self.not_final.len(),
            self.findings.starts,
            self.findings.started_twice.len(),
            self.findings.on_two_workers.len(),
            self.findings.overlapping.len(),
            self.results,
            self.double_results.len(),
            self.successes,
        );
        println!(
            "{suite} nodes: {} heartbeats, {} actor restarts in the running processes, \
             panics or stalls: {:?}",
            self.heartbeats, self.restarts, self.troubled
        );
    }

    /// Fails the test on the first rule broken, naming it and what broke it.
    pub(crate) fn assert_clean(&self) {
        assert!(
            self.settled,
            "not settled within the wait: lost {:?}, not final {:?}",
            self.lost, self.not_final
        );
        assert!(
            self.lost.is_empty(),
            "fires without an instance: {:?}",
            self.lost
        );
        assert!(
            self.not_final.is_empty(),
            "instances not final: {:?}",
            self.not_final
        );
        assert!(
            self.findings.on_two_workers.is_empty(),
            "attempts run on two workers: {:?}",
            self.findings.on_two_workers
        );
        assert!(
            self.findings.overlapping.is_empty(),
            "attempts of one instance running at once: {:?}",
            self.findings.overlapping
        );
        assert!(
            self.double_results.is_empty(),
            "results recorded twice: {:?}",
            self.double_results
        );
        assert!(
            self.findings.started_twice.is_empty(),
            "attempts started twice under one trace id: {:?}",
            self.findings.started_twice
        );
        assert!(
            self.without_result.is_empty(),
            "successes without a result: {:?}",
            self.without_result
        );
        assert!(
            self.without_run.is_empty(),
            "successes whose command never ended: {:?}",
            self.without_run
        );
        assert!(
            self.troubled.is_empty(),
            "panics or stalls: {:?}",
            self.troubled
        );
    }
}
