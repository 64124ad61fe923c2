//! The jobs' own ledger in the chaos and partition suites: each command writes lines
//! `<kind> <instance> <trace> <worker> <unix time in ns>` — `start`, then `tick` every 0.2 s
//! for a long command, then `end` — to a file all nodes share, so what ran, where, under which
//! trace and when is known from the commands themselves, not from ax's records.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One line.
#[derive(Clone, Debug)]
pub(crate) struct Line {
    pub kind: String,
    pub instance: String,
    pub trace: String,
    pub worker: String,
    pub at_ns: u128,
}

/// The ledger's lines (a torn last line is skipped).
pub(crate) fn read(path: &Path) -> Vec<Line> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            Some(Line {
                kind: parts.next()?.to_string(),
                instance: parts.next()?.to_string(),
                trace: parts.next()?.to_string(),
                worker: parts.next()?.to_string(),
                at_ns: parts.next()?.parse().ok()?,
            })
        })
        .collect()
}

/// The shell command of a job that writes to `ledger`: `start`, then — from a subshell, a
/// grandchild of the worker's command process, which a worker's death must end too — `ticks`
/// ticks 0.2 s apart and `end`. A grandchild outliving its attempt would go on writing ticks
/// while the next attempt of its instance runs: an overlap the verdict finds.
pub(crate) fn command(ledger: &Path, ticks: u32) -> String {
    let line = |kind: &str| {
        format!(
            "echo \"{kind} $AX_INSTANCE_ID $AX_TRACE_ID $AX_WORKER $(date +%s%N)\" >> {}",
            ledger.display()
        )
    };
    format!(
        "{} || exit 1; ( i=0 && while [ $i -lt {ticks} ]; do sleep 0.2; {}; i=$((i+1)); done && {} ) & wait $!",
        line("start"),
        line("tick"),
        line("end")
    )
}

/// What the ledger shows that must never happen, and what ran to its end.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    /// Traces whose command started more than once.
    pub started_twice: Vec<String>,
    /// Traces whose command ran on more than one worker.
    pub on_two_workers: Vec<String>,
    /// Two attempts of one instance running at the same time: (instance, trace, trace), by
    /// the wall-clock span of each attempt's lines.
    pub overlapping: Vec<(String, String, String)>,
    /// Traces whose command reached its end.
    pub ended: BTreeSet<String>,
    /// Commands started.
    pub starts: usize,
}

/// Examines the lines.
pub(crate) fn examine(lines: &[Line]) -> Findings {
    let mut findings = Findings::default();
    let mut starts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut workers: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    // instance -> trace -> (first, last)
    let mut spans: BTreeMap<&str, BTreeMap<&str, (u128, u128)>> = BTreeMap::new();
    for line in lines {
        workers.entry(&line.trace).or_default().insert(&line.worker);
        let span = spans
            .entry(&line.instance)
            .or_default()
            .entry(&line.trace)
            .or_insert((line.at_ns, line.at_ns));
        span.0 = span.0.min(line.at_ns);
        span.1 = span.1.max(line.at_ns);
        match line.kind.as_str() {
            "start" => *starts.entry(&line.trace).or_default() += 1,
            "end" => {
                findings.ended.insert(line.trace.clone());
            }
            _ => {}
        }
    }
    findings.starts = starts.values().sum();
    findings.started_twice = starts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(t, _)| t.to_string())
        .collect();
    findings.on_two_workers = workers
        .iter()
        .filter(|(_, w)| w.len() > 1)
        .map(|(t, _)| t.to_string())
        .collect();
    for (instance, traces) in &spans {
        let spans: Vec<(&&str, &(u128, u128))> = traces.iter().collect();
        for (i, (a, (a0, a1))) in spans.iter().enumerate() {
            for (b, (b0, b1)) in &spans[i + 1..] {
                if a0 <= b1 && b0 <= a1 {
                    findings
                        .overlapping
                        .push((instance.to_string(), a.to_string(), b.to_string()));
                }
            }
        }
    }
    findings
}
