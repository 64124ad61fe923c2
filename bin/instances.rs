//! `ax instance ...` and `ax tail results`.

use anyhow::{anyhow, bail, Result};
use futures::StreamExt;

use ax_bus::client::logs::LogItem;
use ax_bus::ids::{InstanceId, JobName};
use ax_bus::log::{LogPiece, LogStream};
use ax_bus::messages::typed::{ControlRequest, Done};
use ax_bus::messages::{InstanceRequest, MarkRequest, ResultMessage};
use ax_bus::{codec, AxClient, InstanceRecord, State};

use crate::table;

/// Which instances `ax instance list` shows.
pub(crate) struct Filter {
    /// Jobs whose name holds it, or match it as a glob ([`job_matches`]).
    pub(crate) job: Option<String>,
    pub(crate) biz_date: Option<String>,
    /// Expected at or after.
    pub(crate) since: Option<chrono::DateTime<chrono::Utc>>,
    /// Expected at or before.
    pub(crate) until: Option<chrono::DateTime<chrono::Utc>>,
    pub(crate) state: Option<State>,
    pub(crate) tag: Option<ax_bus::Tag>,
    /// The newest this many; `None` for all (`--all`).
    pub(crate) limit: Option<usize>,
    /// Only instances of this namespace's jobs (`-n`).
    pub(crate) namespace: Option<ax_bus::ids::Namespace>,
}

/// Whether job `name` is one `pattern` asks for: a glob (`*`, `?`) matches the whole name,
/// anything else is a part of it (the console's search box).
fn job_matches(pattern: &str, name: &str) -> bool {
    if !pattern.contains(['*', '?']) {
        return name.contains(pattern);
    }
    // Iterative glob match: `*` any run, `?` one character.
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut i, mut j, mut star, mut from) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            i += 1;
            from = j;
        } else if let Some(at) = star {
            i = at + 1;
            from += 1;
            j = from;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

/// The records of the jobs `pattern` asks for: each matching job of the registry read by its
/// own keys; when none of the registry matches, every record (a deleted job's stay until
/// their retention) read and filtered.
async fn records_of(client: &AxClient, pattern: Option<&str>) -> Result<Vec<InstanceRecord>> {
    let Some(pattern) = pattern else {
        return Ok(client.instances(None).await?);
    };
    let jobs: Vec<JobName> = client
        .jobs()
        .await?
        .into_iter()
        .map(|r| r.spec.name)
        .filter(|name| job_matches(pattern, name))
        .collect();
    if jobs.is_empty() {
        let all = client.instances(None).await?;
        return Ok(all
            .into_iter()
            .filter(|r| job_matches(pattern, &r.job))
            .collect());
    }
    let mut records = Vec::new();
    for job in &jobs {
        records.extend(client.instances(Some(job)).await?);
    }
    Ok(records)
}

pub(crate) async fn list(client: &AxClient, filter: &Filter, json: bool, ids: bool) -> Result<()> {
    let mut records: Vec<InstanceRecord> = records_of(client, filter.job.as_deref())
        .await?
        .into_iter()
        .filter(|r| filter.biz_date.as_ref().is_none_or(|d| &r.biz_date == d))
        .filter(|r| filter.since.is_none_or(|t| r.expected_time >= t))
        .filter(|r| filter.until.is_none_or(|t| r.expected_time <= t))
        .filter(|r| filter.state.is_none_or(|s| r.state == s))
        .filter(|r| filter.tag.is_none_or(|t| r.tag == t))
        .filter(|r| {
            filter
                .namespace
                .as_ref()
                .is_none_or(|ns| r.job.namespace() == ns.as_str())
        })
        .collect();
    // Instances due later (a trigger `--at` next month) are no recent runs: left out unless
    // asked for by their tag, or by a window that reaches them.
    let now = ax_bus::time::now();
    let asked_later =
        filter.tag == Some(ax_bus::Tag::Scheduled) || filter.until.is_some_and(|t| t > now);
    let later = records
        .iter()
        .filter(|r| r.tag == ax_bus::Tag::Scheduled && r.expected_time > now)
        .count();
    if !asked_later && later > 0 {
        records.retain(|r| !(r.tag == ax_bus::Tag::Scheduled && r.expected_time > now));
        eprintln!("{later} instance(s) due later left out; --tag scheduled lists them");
    }
    newest_first(&mut records);
    let matched = records.len();
    if let Some(limit) = filter.limit.filter(|limit| *limit < matched) {
        records.truncate(limit);
        eprintln!("the newest {limit} of {matched} instances; --limit N or --all for more");
    }
    if json {
        return table::json(&records);
    }
    if ids {
        for record in &records {
            println!("{}", record.instance_id);
        }
        return Ok(());
    }
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                r.instance_id.to_string(),
                r.biz_date.clone(),
                r.attempt.to_string(),
                r.state.to_string(),
                tag_said(r),
                r.worker
                    .as_ref()
                    .map_or_else(|| "-".into(), |w| w.to_string()),
                table::time(r.finished_at),
                table::time(r.next_attempt_at),
                table::short(&r.message, 48),
            ]
        })
        .collect();
    table::print(
        &[
            "INSTANCE",
            "BIZ DATE",
            "ATTEMPT",
            "STATE",
            "TAG",
            "WORKER",
            "FINISHED",
            "NEXT ATTEMPT",
            "MESSAGE",
        ],
        &rows,
    );
    Ok(())
}

/// The tag as an operator acts on it: when a scheduled instance is due, what a waiting one
/// waits for.
fn tag_said(record: &InstanceRecord) -> String {
    match record.tag {
        ax_bus::Tag::Scheduled => format!(
            "scheduled for {}",
            record.expected_time.format("%m-%d %H:%M:%S")
        ),
        ax_bus::Tag::WaitingDeps if record.message.starts_with("waiting for ") => {
            table::short(&record.message, 40)
        }
        tag => tag.to_string(),
    }
}

/// Newest first: the latest expected time first, ties by id (the greater first), so the order
/// is the same on every run.
fn newest_first(records: &mut [InstanceRecord]) {
    records
        .sort_by(|a, b| (b.expected_time, &b.instance_id).cmp(&(a.expected_time, &a.instance_id)));
}

/// `id`'s record. With a token, read through the Schedulers (`instance`), which hold it to the
/// token's namespaces: a token of `a` reads no instance of `b`, whatever the NATS user may.
async fn fetch(client: &AxClient, id: &InstanceId) -> Result<InstanceRecord> {
    if client.has_caller() {
        let request = ax_bus::messages::ReadRequest {
            instance: id.clone(),
        };
        match client.send(&request, crate::jobs::CONTROL_TIMEOUT).await {
            Ok(read) => return Ok(*read.record),
            // Unknown there too: said below as a direct read says it (purged, or never made).
            Err(ax_bus::ClientError::Refused(_)) => {}
            Err(ax_bus::ClientError::Denied(why)) => {
                return Err(crate::jobs::refusal(&[why], "refused by the scheduler"))
            }
            Err(e) => return Err(e.into()),
        }
    }
    client
        .instance(id)
        .await?
        .map(|(r, _)| r)
        .ok_or_else(|| anyhow!(ax_bus::client::retention::missing(id)))
}

pub(crate) async fn get(client: &AxClient, id: &InstanceId, json: bool) -> Result<()> {
    let record = fetch(client, id).await?;
    if json {
        return table::json(&record);
    }
    let fields = [
        ("instance_id", record.instance_id.to_string()),
        ("trace_id", record.trace_id.to_string()),
        ("job", record.job.to_string()),
        ("biz_date", record.biz_date.clone()),
        ("attempt", record.attempt.to_string()),
        ("state", record.state.to_string()),
        ("tag", record.tag.to_string()),
        ("expected_time", table::time(Some(record.expected_time))),
        ("created_at", table::time(Some(record.created_at))),
        ("started_at", table::time(record.started_at)),
        ("finished_at", table::time(record.finished_at)),
        ("next_attempt_at", table::time(record.next_attempt_at)),
        (
            "worker",
            record
                .worker
                .as_ref()
                .map_or_else(|| "-".into(), |w| w.to_string()),
        ),
        (
            "exit_code",
            record.exit_code.map_or("-".into(), |c| c.to_string()),
        ),
        ("message", record.message.clone()),
        (
            "usage",
            record.usage.map_or_else(|| "-".into(), |u| u.to_string()),
        ),
        ("output", record.output.to_string()),
        ("params", serde_json::to_string(&record.params)?),
    ];
    for (name, value) in fields {
        println!("{name:<16}{value}");
    }
    // Each attempt with its own outcome, from the record's revisions.
    if let Some(history) = client.instance_history(id).await? {
        println!();
        let rows: Vec<Vec<String>> = history
            .attempts
            .iter()
            .map(|a| {
                vec![
                    a.attempt.to_string(),
                    format!("{} {}", a.state, a.tag),
                    a.worker
                        .as_ref()
                        .map_or_else(|| "-".into(), |w| w.to_string()),
                    table::time(a.started_at),
                    table::time(a.finished_at),
                    a.exit_code.map_or("-".into(), |c| c.to_string()),
                    a.usage.map_or_else(|| "-".into(), |u| u.to_string()),
                    table::short(&a.message, 60),
                ]
            })
            .collect();
        table::print(
            &[
                "ATTEMPT", "STATE", "WORKER", "STARTED", "ENDED", "EXIT", "USAGE", "MESSAGE",
            ],
            &rows,
        );
    }
    Ok(())
}

/// How `ax instance logs` prints.
pub(crate) struct LogsHow {
    /// Follows the instance (or the attempt asked for) to its end.
    pub follow: bool,
    /// Writes the job's bytes as they are, even to a terminal.
    pub raw: bool,
    /// One JSON document.
    pub json: bool,
}

/// `ax instance logs`: an attempt's shipped log (the record's tails for an attempt that
/// shipped none: one that ran before logs were shipped, or whose log is past its retention).
pub(crate) async fn logs(
    client: &AxClient,
    id: &InstanceId,
    asked: Option<u32>,
    how: LogsHow,
) -> Result<()> {
    let LogsHow { follow, raw, json } = how;
    let mut screen = crate::screen::Screen::stdout(raw);
    let record = fetch(client, id).await?;
    let attempt = asked.unwrap_or(record.attempt);
    if attempt > record.attempt {
        bail!(
            "instance `{id}` has {} attempt(s); there is no attempt {attempt}",
            record.attempt
        );
    }
    if follow && !json {
        if asked.is_some() {
            return follow_log(client, id, attempt, &mut screen).await;
        }
        return follow_instance(client, id, attempt, &mut screen).await;
    }
    let log = client.attempt_log(id, attempt).await?;
    let current = attempt == record.attempt;
    if json {
        let (stdout, stderr) = if log.is_empty() && current {
            (record.stdout_tail.clone(), record.stderr_tail.clone())
        } else {
            (
                String::from_utf8_lossy(&log.bytes_of(LogStream::Stdout)).into_owned(),
                String::from_utf8_lossy(&log.bytes_of(LogStream::Stderr)).into_owned(),
            )
        };
        let pieces: Vec<serde_json::Value> = log
            .pieces()
            .map(|p| {
                serde_json::json!({
                    "stream": p.stream.as_str(),
                    "text": String::from_utf8_lossy(&p.data),
                })
            })
            .collect();
        return table::json(&serde_json::json!({
            "instance_id": record.instance_id,
            "attempt": attempt,
            "shipped": !log.is_empty(),
            "complete": log.end().is_some(),
            "end": log.end(),
            "stdout": stdout,
            "stderr": stderr,
            "pieces": pieces,
        }));
    }
    if log.is_empty() {
        if current && !(record.stdout_tail.is_empty() && record.stderr_tail.is_empty()) {
            eprintln!("(no shipped log for attempt {attempt}; the tails its record keeps)");
            screen.write(record.stdout_tail.as_bytes());
            screen.write(record.stderr_tail.as_bytes());
        } else {
            eprintln!("(attempt {attempt} of {id} has no log: it wrote nothing, has not run, or its log is past the retention)");
        }
        return Ok(());
    }
    print_pieces(log.pieces(), &mut screen);
    if log.end().is_none() {
        eprintln!("(attempt {attempt} is still writing: `--follow` to see the rest)");
    }
    Ok(())
}

/// Prints pieces of a log as they were written, stdout and stderr interleaved.
fn print_pieces<'a>(
    pieces: impl Iterator<Item = &'a LogPiece>,
    screen: &mut crate::screen::Screen,
) {
    for piece in pieces {
        screen.write(&piece.data);
    }
}

/// How often a follow looks at the record between two attempts.
const FOLLOW_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// `ax instance logs --follow`: each attempt's log from `attempt` on, as it is written, and
/// between two attempts what became of the one before and when the next starts; until the
/// instance ends. An error (so a non-zero exit) unless it ended in success.
async fn follow_instance(
    client: &AxClient,
    id: &InstanceId,
    mut attempt: u32,
    screen: &mut crate::screen::Screen,
) -> Result<()> {
    loop {
        follow_log(client, id, attempt, screen).await?;
        // The attempt's log is over; its record may trail it.
        let mut told_retry = false;
        let record = loop {
            let record = fetch(client, id).await?;
            let this_runs = record.attempt == attempt && !record.state.is_final();
            let waits = record.state == ax_bus::State::WaitingRetry;
            if record.attempt > attempt || (!this_runs && !waits) {
                break record;
            }
            if waits && !told_retry {
                let at = record
                    .next_attempt_at
                    .map_or_else(|| "later".to_string(), |t| table::time(Some(t)));
                eprintln!(
                    "(attempt {attempt} failed: {} {}; attempt {} starts at {at})",
                    record.tag,
                    record.message,
                    attempt + 1
                );
                told_retry = true;
            }
            tokio::time::sleep(FOLLOW_POLL).await;
        };
        if record.attempt > attempt {
            eprintln!("(attempt {} of {id} started)", record.attempt);
            attempt = record.attempt;
            continue;
        }
        if record.state == ax_bus::State::Success {
            return Ok(());
        }
        bail!(
            "instance {id} ended {} ({}) after attempt {attempt}: {}",
            record.state,
            record.tag,
            record.message
        );
    }
}

/// How long a follow waits for more once the attempt is over without a last chunk (it wrote
/// nothing, or ran before logs were shipped).
const FOLLOW_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// `ax instance logs --follow --attempt N`: prints the chunks as they come, until the one with
/// the end — or, for an attempt that ships none, until it is over.
async fn follow_log(
    client: &AxClient,
    id: &InstanceId,
    attempt: u32,
    screen: &mut crate::screen::Screen,
) -> Result<()> {
    let mut feed = Box::pin(client.follow_log(id, attempt).await?);
    let mut log = ax_bus::log::AttemptLog::default();
    let mut over_since: Option<std::time::Instant> = None;
    loop {
        match tokio::time::timeout(std::time::Duration::from_secs(1), feed.next()).await {
            Ok(Some(item)) => match item? {
                LogItem::Chunk(chunk, _) => {
                    let end = chunk.end;
                    let pieces = chunk.pieces.clone();
                    if log.add(chunk) {
                        print_pieces(pieces.iter(), screen);
                    }
                    if end.is_some() {
                        return Ok(());
                    }
                    continue;
                }
                LogItem::Current => continue,
            },
            Ok(None) => bail!("the log of {id} attempt {attempt} stopped being delivered"),
            Err(_) => {}
        }
        // A second without a chunk: is the attempt over?
        let record = fetch(client, id).await?;
        // Over: a later attempt began, or this one ended (final, or waiting for its retry).
        let over = record.attempt > attempt || record.state != ax_bus::State::Running;
        match (over, over_since) {
            (false, _) => over_since = None,
            (true, None) => over_since = Some(std::time::Instant::now()),
            (true, Some(since)) if since.elapsed() >= FOLLOW_GRACE => {
                if log.is_empty() {
                    eprintln!("(attempt {attempt} of {id} is over and shipped no log)");
                }
                return Ok(());
            }
            (true, Some(_)) => {}
        }
    }
}

/// `ax instance history`: one row per step, oldest first.
pub(crate) async fn history(client: &AxClient, id: &InstanceId, json: bool) -> Result<()> {
    if client.has_caller() {
        // The token's right to read it, checked where the record is read.
        fetch(client, id).await?;
    }
    let history = client
        .instance_history(id)
        .await?
        .ok_or_else(|| anyhow!(ax_bus::client::retention::missing(id)))?;
    if json {
        return table::json(&history);
    }
    if history.truncated {
        println!("(older steps are gone: the bucket keeps the last writes of a record)");
    }
    let dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let rows: Vec<Vec<String>> = history
        .steps
        .iter()
        .map(|s| {
            vec![
                table::time(Some(s.at)),
                s.attempt.to_string(),
                s.step.as_str().to_string(),
                dash(s.node.as_ref().map(|n| n.to_string())),
                dash(s.worker.as_ref().map(|w| w.to_string())),
                format!("{} {}", s.state, s.tag),
                s.detail.clone(),
            ]
        })
        .collect();
    table::print(
        &["AT", "ATTEMPT", "STEP", "NODE", "WORKER", "STATE", "DETAIL"],
        &rows,
    );
    Ok(())
}

/// Prints each result as one JSON line, as it arrives, until interrupted.
pub(crate) async fn tail_results(client: &AxClient, job: Option<&JobName>) -> Result<()> {
    let subject = match job {
        Some(job) => client.subjects().result(job),
        None => client.subjects().result_all(),
    };
    let mut results = client.nats.subscribe(subject).await?;
    while let Some(message) = results.next().await {
        match codec::decode::<ResultMessage>(&message.payload) {
            Ok(result) => println!("{}", serde_json::to_string(&result)?),
            Err(e) => eprintln!("{}: undecodable result: {e}", message.subject),
        }
    }
    Ok(())
}

/// Gives an operator's verdict on one instance: success, or failed.
pub(crate) async fn mark(
    client: &AxClient,
    id: InstanceId,
    success: bool,
    reason: String,
    json: bool,
) -> Result<()> {
    let request = MarkRequest {
        instance: id,
        state: if success {
            State::Success
        } else {
            State::Failed
        },
        reason,
        requested_by: crate::jobs::requested_by(),
    };
    let reply = crate::jobs::send(client, &request, crate::jobs::CONTROL_TIMEOUT).await?;
    print_acted(reply, json)
}

/// Reports the end of instance `id`'s current attempt (awaiting a report after a 202).
pub(crate) async fn report(
    client: &AxClient,
    id: InstanceId,
    success: bool,
    message: String,
    output: Option<serde_json::Value>,
    json: bool,
) -> Result<()> {
    let (record, _) = client
        .instance(&id)
        .await?
        .ok_or_else(|| anyhow::anyhow!(ax_bus::client::retention::missing(id)))?;
    let request = ax_bus::messages::ReportRequest {
        trace_id: record.trace_id,
        success,
        message,
        output: output.unwrap_or_default(),
    };
    let reply = crate::jobs::send(client, &request, crate::jobs::CONTROL_TIMEOUT).await?;
    print_acted(reply, json)
}

fn print_acted(reply: Done, json: bool) -> Result<()> {
    if json {
        return table::json(&serde_json::json!({
            "instance_id": reply.instance_id,
            "message": reply.message,
        }));
    }
    println!(
        "{} ({})",
        reply.instance_id.map(|i| i.to_string()).unwrap_or_default(),
        reply.message
    );
    Ok(())
}

/// Cancels or kills one instance (`wrap` makes the request a `cancel` or a `kill`) and prints
/// what became of it.
pub(crate) async fn act<C: ControlRequest<Reply = Done>>(
    client: &AxClient,
    wrap: fn(InstanceRequest) -> C,
    id: InstanceId,
    reason: Option<String>,
    json: bool,
) -> Result<()> {
    let request = wrap(InstanceRequest {
        instance: id,
        reason,
        requested_by: crate::jobs::requested_by(),
    });
    let reply = crate::jobs::send(client, &request, crate::jobs::CONTROL_TIMEOUT).await?;
    print_acted(reply, json)
}

/// One bucket of the instance records, as `ax instance buckets` prints it.
#[derive(serde::Serialize)]
struct Bucket {
    bucket: String,
    /// Keys held, a removed record's marker included until it expires.
    keys: u64,
    bytes: u64,
    leader: Option<String>,
}

/// Prints the buckets of the instance records; with `set`, first moves the records into that
/// many (see [`ax_bus::client::rebucket`]).
pub(crate) async fn buckets(client: &AxClient, set: Option<u16>, json: bool) -> Result<()> {
    let reopened;
    let client = match set {
        Some(to) => {
            let pause = ax_actors::test_hooks::rebucket_pause();
            let moved =
                ax_bus::client::rebucket::rebucket(client, to, pause, |step| eprintln!("{step}"))
                    .await?;
            eprintln!(
                "{} → {} buckets: {} revisions moved",
                moved.from, moved.to, moved.revisions
            );
            reopened = AxClient::from_client(client.nats.clone(), client.layout.clone()).await?;
            &reopened
        }
        None => client,
    };
    let mut buckets = Vec::new();
    for bucket in client.instances.buckets() {
        let info = client.stream_info(&format!("KV_{bucket}")).await?;
        buckets.push(Bucket {
            bucket: bucket.to_string(),
            keys: info.state.subjects_count,
            bytes: info.state.bytes,
            leader: info.cluster.as_ref().and_then(|c| c.leader.clone()),
        });
    }
    if json {
        return table::json(&buckets);
    }
    let rows: Vec<Vec<String>> = buckets
        .iter()
        .map(|b| {
            vec![
                b.bucket.clone(),
                b.keys.to_string(),
                b.bytes.to_string(),
                b.leader.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    table::print(&["BUCKET", "KEYS", "BYTES", "LEADER"], &rows);
    Ok(())
}

#[cfg(test)]
mod job_pattern_tests {
    use super::job_matches;

    #[test]
    fn a_part_or_a_glob_picks_the_jobs() {
        for (pattern, name, wanted) in [
            ("sync", "sync_order_daily", true),
            ("pay", "sync_pay_daily", true),
            ("hello", "hello", true),
            ("hello", "say_hello", true),
            ("hola", "hello", false),
            ("sync_*_daily", "sync_pay_daily", true),
            ("sync_*_daily", "sync_pay_weekly", false),
            ("hell?", "hello", true),
            ("hell?", "hello_world", false),
            ("*", "anything", true),
            ("*_daily", "order_stat_daily", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
        ] {
            assert_eq!(job_matches(pattern, name), wanted, "{pattern} ~ {name}");
        }
    }
}
