//! The chaos suite: a 3-node NATS cluster on loopback, two core nodes (Scheduler,
//! DagCoordinator, Router) and three workers as `ax node` processes, a steady load of cron and
//! DAG jobs, and random `kill -9` + restart of core nodes and workers and stop + restart of one
//! NATS node at a time. The jobs' own commands write a ledger; at the end it is checked
//! against the instance records and the results stream:
//!
//! - every expected fire produced exactly one instance (none lost; ids make a second one
//!   impossible, and the ledger shows no second run of one attempt);
//! - every instance reached a final state;
//! - no attempt (trace id) started twice — on two workers, or on one worker killed and
//!   restarted in between: an attempt whose command may have run is lost with its worker and
//!   its instance gets a new attempt under a new trace id, worker kills or not;
//! - no two attempts of one instance ran at the same time (the wall-clock spans of their
//!   ledger lines, see `support/ledger.rs`, written mostly by a grandchild of the worker's
//!   command process, which must die with a killed worker);
//! - every result is recorded once, and every success has its result;
//! - a chain run by its data (`data_up` announces a dataset for a business date of its own
//!   each fire, `data_down` runs on it) ran `data_down` once for every date announced, and
//!   only for those;
//! - a long job with a `lease` is held to the same rules: each fire once, no two attempts at
//!   once.
//!
//! `AX_CHAOS_MINUTES` sets the length of the chaos (1.5 by default: the short profile; past
//! 14 minutes run it with `--profile chaos`, which does not end a test after 15);
//! `AX_CHAOS_SEED` replays a run's sequence of kills (its seed is printed); `AX_CHAOS_KEEP=1`
//! keeps the cluster's and the nodes' logs; `AX_CHAOS_REPORT` names the file of the run's
//! one-page report (`target/chaos-report.md` by default). The short profile runs with every
//! `cargo test`; `cargo nextest run -E 'test(/^chaos::/)' --no-capture` shows its story.

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::TimeDelta;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use support::verdict::{ledger_job, ledger_spec, Owed, Verdict};
use support::*;

const CORES: [&str; 2] = ["core-1", "core-2"];
const WORKERS: [&str; 3] = ["w1", "w2", "w3"];

/// The ax processes, restartable under their names (same data dir, same worker id).
struct Fleet {
    url: String,
    root: std::path::PathBuf,
    running: BTreeMap<&'static str, AxProcess>,
}

impl Fleet {
    fn start(&mut self, name: &'static str) {
        let roles = if CORES.contains(&name) {
            "scheduler,dag,router"
        } else {
            "worker"
        };
        let dir = self.root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join(format!(
            "node-{}.log",
            ax_bus::time::now().timestamp_millis()
        ));
        let data = dir.join("data");
        let process = AxProcess::spawn(
            Some(&self.url),
            &[
                "node",
                "--roles",
                roles,
                "--id",
                name,
                "--replicas",
                "3",
                "--slots",
                "4",
                "--data-dir",
                data.to_str().unwrap(),
            ],
            &dir,
            &log,
        );
        self.running.insert(name, process);
    }

    /// `kill -9` of `name`, and its start again after `pause`.
    async fn bounce(&mut self, name: &'static str, pause: Duration) {
        println!("chaos: {} kill -9 {name}", ax_bus::time::now());
        if let Some(mut process) = self.running.remove(name) {
            process.kill9();
        }
        tokio::time::sleep(pause).await;
        self.start(name);
        println!("chaos: {} {name} started again", ax_bus::time::now());
    }
}

/// The first of the business dates `data_up`'s fires announce (2020-01-01 in Unix seconds).
const FIRST_DATE: i64 = 1_577_836_800;
/// How many dates they cycle through: one a fire (every 3 s), 2.5 hours before one comes back.
const DATES: i64 = 3000;

/// What `data_up`'s fire at `expected` announces: the dataset `w://chaos` updated for this
/// date — what its shell command computes from `$AX_EXPECTED_TIME`.
fn announced(expected: chrono::DateTime<chrono::Utc>) -> chrono::NaiveDate {
    let days = expected.timestamp() / 3 % DATES;
    chrono::DateTime::from_timestamp(FIRST_DATE + days * 86_400, 0)
        .expect("a date")
        .date_naive()
}

/// The shell command that makes `data_up`'s output announce [`announced`]'s date.
fn announce_command() -> String {
    r#"s=$(date -u -d "$AX_EXPECTED_TIME" +%s) && d=$(date -u -d "@$(( FIRST + (s / 3 % DATES) * 86400 ))" +%F) && printf "{\"datasets\": [{\"uri\": \"w://chaos\", \"biz_date\": \"%s\"}]}" "$d" > "$AX_OUTPUT_FILE""#
        .replace("FIRST", &FIRST_DATE.to_string())
        .replace("DATES", &DATES.to_string())
}

/// The node-log lines that mention `needle` (for a failure's story).
fn print_log_lines(root: &std::path::Path, needle: &str) {
    let mut logs: Vec<std::path::PathBuf> = Vec::new();
    for node in CORES.iter().chain(WORKERS.iter()) {
        if let Ok(entries) = std::fs::read_dir(root.join(node)) {
            logs.extend(entries.filter_map(Result::ok).map(|e| e.path()));
        }
    }
    logs.sort();
    for log in logs
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
    {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains(needle)) {
            println!("  {}: {line}", log.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_or_run_twice_under_random_kills() {
    let minutes: f64 = std::env::var("AX_CHAOS_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(1.5);
    let seed: u64 = std::env::var("AX_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("chaos: seed {seed}, {minutes} minutes (AX_CHAOS_SEED={seed} replays the kills)");
    let mut rng = StdRng::seed_from_u64(seed);

    let mut cluster = TestCluster::start();
    let client = cluster.client().await;
    let root = cluster.dir.path().join("ax");
    let mut fleet = Fleet {
        url: cluster.url(),
        root: root.clone(),
        running: BTreeMap::new(),
    };
    for name in CORES.iter().chain(WORKERS.iter()) {
        fleet.start(name);
    }
    let ledger_file = root.join("ledger");
    let jobs = root.join("jobs.yaml");
    std::fs::write(
        &jobs,
        [
            ledger_job("tick", "* * * * * *", "", &ledger_file, 1, 20),
            ledger_job("dag_up", "*/3 * * * * *", "", &ledger_file, 1, 20),
            ledger_job(
                "dag_down",
                "*/3 * * * * *",
                "  deps: [ { name: dag_up, biz_date: current } ]\n",
                &ledger_file,
                1,
                20,
            ),
            // Four seconds of ticks from a grandchild: worker kills land mid-command.
            ledger_job("long", "*/10 * * * * *", "", &ledger_file, 20, 30),
            // Five seconds under a lease: a worker cut off keeps it, none other starts it.
            ledger_job(
                "leased",
                "*/15 * * * * *",
                "  lease: 20s\n",
                &ledger_file,
                25,
                30,
            ),
            // A chain run by its data: each fire announces a date of its own.
            ledger_spec(
                "data_up",
                "  cron: '*/3 * * * * *'\n  misfire: fire_all\n  catchup_window: 900\n  produces: [ 'w://chaos' ]\n",
                &ledger_file,
                1,
                20,
                &announce_command(),
            ),
            ledger_spec(
                "data_down",
                "  consumes: [ 'w://chaos' ]\n  on_datasets: [ 'w://chaos' ]\n",
                &ledger_file,
                1,
                20,
                "",
            ),
        ]
        .join("---\n"),
    )
    .unwrap();
    // The fleet up first (on a loaded machine a three-server cluster and five nodes take a
    // while): an apply nobody answers within its 30 s would fail the test before the chaos.
    wait_for(Duration::from_secs(120), "every node's heartbeat", || {
        let client = client.clone();
        async move {
            let nodes = client.nodes().await.ok()?;
            (nodes.len() >= CORES.len() + WORKERS.len()).then_some(())
        }
    })
    .await;
    let applied = ax(&fleet.url, &["job", "apply", "-f", jobs.to_str().unwrap()]);
    assert!(applied.status.success(), "{}", stderr(&applied));
    let applied_at = ax_bus::time::now();

    // The chaos.
    let (mut scheduler_kills, mut worker_kills, mut nats_stops) = (0, 0, 0);
    let deadline = Instant::now() + Duration::from_secs_f64(minutes * 60.0);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(rng.random_range(3000..8000))).await;
        let pause = Duration::from_millis(rng.random_range(1000..5000));
        match rng.random_range(0..3) {
            0 => {
                fleet
                    .bounce(CORES[rng.random_range(0..CORES.len())], pause)
                    .await;
                scheduler_kills += 1;
            }
            1 => {
                fleet
                    .bounce(WORKERS[rng.random_range(0..WORKERS.len())], pause)
                    .await;
                worker_kills += 1;
            }
            _ => {
                let index = rng.random_range(0..cluster.servers.len());
                println!("chaos: {} stop NATS node s{index}", ax_bus::time::now());
                cluster.servers[index].stop();
                nats_stops += 1;
                tokio::time::sleep(pause * 2).await;
                cluster.servers[index]
                    .restart()
                    .expect("the NATS node restarts on its store");
                println!(
                    "chaos: {} NATS node s{index} started again",
                    ax_bus::time::now()
                );
            }
        }
    }
    let chaos_ended = ax_bus::time::now();
    println!(
        "chaos: over; {scheduler_kills} core kills, {worker_kills} worker kills, {nats_stops} NATS stops"
    );

    // Every fire up to the end of the chaos must end.
    let owed = Owed::new(
        applied_at + TimeDelta::seconds(2),
        chaos_ended - TimeDelta::seconds(1),
        &[
            ("tick", 1),
            ("dag_up", 3),
            ("dag_down", 3),
            ("long", 10),
            ("leased", 15),
            ("data_up", 3),
        ],
    );
    let settled = owed.settle(&client, Duration::from_secs(180)).await;
    // Each date a successful data_up announced must have its data_down instance, and it must
    // end; only once they have is the ledger read.
    let runs_by_data = wait_for(Duration::from_secs(120), "data_down for every date", || {
        let client = client.clone();
        async move {
            let data = DataRuns::read(&client).await;
            data.missing
                .is_empty()
                .then_some(data)
                .filter(|d| d.open.is_empty())
        }
    })
    .await;
    let verdict = Verdict::judge(&client, &owed, &settled, &ledger_file).await;
    verdict.print("chaos");
    let results = all_results(&client).await;
    let ran: std::collections::BTreeSet<String> = ledger::read(&ledger_file)
        .into_iter()
        .filter(|l| l.kind == "end")
        .map(|l| l.trace)
        .collect();
    let unreported: Vec<&str> = runs_by_data
        .done
        .iter()
        .filter(|r| r.state == ax_bus::State::Success)
        .filter(|r| {
            !results.iter().any(|m| m.trace_id == r.trace_id) || !ran.contains(r.trace_id.as_str())
        })
        .map(|r| r.instance_id.as_str())
        .collect();
    let report = Report {
        seed,
        minutes,
        kills: (scheduler_kills, worker_kills, nats_stops),
        verdict: &verdict,
        data: &runs_by_data,
        unreported: &unreported,
    }
    .write();
    println!("{report}");
    let all = match &settled {
        Ok(all) | Err(all) => all,
    };
    for record in owed.open(all) {
        println!("chaos: unfinished {record:?}");
        print_log_lines(&root, &record.instance_id);
        print_log_lines(&root, &record.trace_id);
    }
    if !verdict.lost.is_empty() {
        // What each Scheduler recorded around the lost fires.
        for name in owed.due.keys() {
            let ticks = client
                .ticks(&support::job(name), 1000)
                .await
                .unwrap_or_default();
            for t in ticks.iter().filter(|t| {
                verdict
                    .lost
                    .iter()
                    .any(|l| l.starts_with(&format!("{name}@")) && l.ends_with(&t.tick.to_string()))
            }) {
                println!("chaos: tick record {t:?}");
            }
        }
    }
    if verdict.failing() || std::env::var_os("AX_CHAOS_KEEP").is_some() {
        println!("chaos: keeping {}", cluster.dir.path().display());
        let _ = cluster.dir.keep();
    }
    verdict.assert_clean();
    runs_by_data.assert_clean();
    assert!(
        unreported.is_empty(),
        "data_down successes without a result or a run: {unreported:?}"
    );
    assert_eq!(
        verdict.heartbeats,
        CORES.len() + WORKERS.len(),
        "a node is missing its heartbeat"
    );
    drop(fleet);
}

/// What the chain run by its data came to: the dates `data_up`'s successes announced, and
/// `data_down`'s instances.
struct DataRuns {
    /// The dates announced.
    announced: std::collections::BTreeSet<chrono::NaiveDate>,
    /// `data_down`'s instances that have ended.
    done: Vec<ax_bus::InstanceRecord>,
    /// Those that have not.
    open: Vec<String>,
    /// Dates announced without a `data_down` instance.
    missing: Vec<chrono::NaiveDate>,
    /// `data_down` instances of a date never announced, or more than one for a date.
    extra: Vec<String>,
}

impl DataRuns {
    /// Reads `data_down`'s instances, then `data_up`'s (which fires on after the chaos): a
    /// date run by its data was announced by a success the later read sees.
    async fn read(client: &ax_bus::AxClient) -> Self {
        let down = client
            .instances(Some(&support::job("data_down")))
            .await
            .unwrap_or_default();
        let announced: std::collections::BTreeSet<chrono::NaiveDate> = client
            .instances(Some(&support::job("data_up")))
            .await
            .unwrap_or_default()
            .iter()
            .filter(|r| r.state == ax_bus::State::Success)
            .map(|r| announced(r.expected_time))
            .collect();
        let mut per_date: BTreeMap<String, usize> = BTreeMap::new();
        for record in &down {
            *per_date.entry(record.biz_date.clone()).or_default() += 1;
        }
        let extra = per_date
            .iter()
            .filter(|(date, n)| {
                **n > 1
                    || !announced
                        .iter()
                        .any(|a| a.format("%Y-%m-%d").to_string() == **date)
            })
            .map(|(date, n)| format!("{date}: {n} instances"))
            .collect();
        let missing = announced
            .iter()
            .filter(|d| !per_date.contains_key(&d.format("%Y-%m-%d").to_string()))
            .copied()
            .collect();
        let (done, open): (Vec<_>, Vec<_>) = down.into_iter().partition(|r| r.state.is_final());
        Self {
            announced,
            done,
            open: open
                .iter()
                .map(|r| format!("{} {:?}/{}: {}", r.instance_id, r.state, r.tag, r.message))
                .collect(),
            missing,
            extra,
        }
    }

    fn failed(&self) -> Vec<&str> {
        self.done
            .iter()
            .filter(|r| r.state != ax_bus::State::Success)
            .map(|r| r.instance_id.as_str())
            .collect()
    }

    fn assert_clean(&self) {
        assert!(
            self.missing.is_empty(),
            "dates never run: {:?}",
            self.missing
        );
        assert!(self.extra.is_empty(), "dates run wrongly: {:?}", self.extra);
        assert!(self.open.is_empty(), "data_down not final: {:?}", self.open);
        assert!(
            self.failed().is_empty(),
            "data_down failed: {:?}",
            self.failed()
        );
    }
}

/// The run's one-page report: what the chaos did, what each rule found.
struct Report<'a> {
    seed: u64,
    minutes: f64,
    kills: (u32, u32, u32),
    verdict: &'a Verdict,
    data: &'a DataRuns,
    unreported: &'a [&'a str],
}

impl Report<'_> {
    /// The report, also written to `AX_CHAOS_REPORT` (`target/chaos-report.md`).
    fn write(&self) -> String {
        let v = self.verdict;
        let f = &v.findings;
        let rule = |name: &str, broken: &dyn std::fmt::Debug, none: bool| {
            let said = if none {
                "held".to_string()
            } else {
                format!("BROKEN: {broken:?}")
            };
            format!("| {name} | {said} |\n")
        };
        let (cores, workers, nats) = self.kills;
        let mut text = format!(
            "# Chaos run, seed {seed}\n\n\
             {minutes} minutes of chaos on a 3-server NATS cluster (replicas 3), two core nodes \
             and three workers: {cores} kill -9 of a core node, {workers} of a worker, {nats} \
             stops of a NATS node (`AX_CHAOS_SEED={seed}` replays them).\n\n\
             Jobs: `tick` (every second), `dag_up` -> `dag_down` (every 3 s), `long` (4 s of \
             work every 10 s), `leased` (5 s under a 20 s lease every 15 s), `data_up` (every \
             3 s, each fire announcing `w://chaos` for a date of its own) -> `data_down` (run by \
             that dataset, once per date).\n\n\
             Expected fires {owed}; runs {runs}; results {results}; successes in the window \
             {successes}; dates announced {dates}, `data_down` instances {down}; actor restarts \
             in the running processes {restarts}.\n\n| rule | |\n|---|---|\n",
            seed = self.seed,
            minutes = self.minutes,
            owed = v.owed,
            runs = f.starts,
            results = v.results,
            successes = v.successes,
            dates = self.data.announced.len(),
            down = self.data.done.len() + self.data.open.len(),
            restarts = v.restarts,
        );
        for line in [
            rule("settled within the wait", &v.not_final, v.settled),
            rule("every fire has its instance", &v.lost, v.lost.is_empty()),
            rule("every instance final", &v.not_final, v.not_final.is_empty()),
            rule(
                "no attempt started twice",
                &f.started_twice,
                f.started_twice.is_empty(),
            ),
            rule(
                "no attempt on two workers",
                &f.on_two_workers,
                f.on_two_workers.is_empty(),
            ),
            rule(
                "no two attempts of an instance at once",
                &f.overlapping,
                f.overlapping.is_empty(),
            ),
            rule(
                "every result once",
                &v.double_results,
                v.double_results.is_empty(),
            ),
            rule(
                "every success has its result and its run",
                &(&v.without_result, &v.without_run),
                v.without_result.is_empty() && v.without_run.is_empty(),
            ),
            rule(
                "every announced date run by its data",
                &self.data.missing,
                self.data.missing.is_empty(),
            ),
            rule(
                "no date run twice, none not announced",
                &self.data.extra,
                self.data.extra.is_empty(),
            ),
            rule(
                "every run by data final and succeeded",
                &(&self.data.open, self.data.failed()),
                self.data.open.is_empty() && self.data.failed().is_empty(),
            ),
            rule(
                "every run by data reported",
                &self.unreported,
                self.unreported.is_empty(),
            ),
            rule("no panic or stall", &v.troubled, v.troubled.is_empty()),
        ] {
            text.push_str(&line);
        }
        let path = std::env::var_os("AX_CHAOS_REPORT")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/chaos-report.md")
            });
        if let Err(e) = std::fs::write(&path, &text) {
            println!(
                "chaos: the report was not written to {}: {e}",
                path.display()
            );
        }
        text
    }
}
