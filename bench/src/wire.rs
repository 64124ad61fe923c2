//! Wire: every message one no-op instance puts on the wire, by kind — what the hot path's work
//! is measured in. A monitor connection subscribed to `>` sees each message once as the server
//! routes it: a publish, a key-value write or read request, the answer to each, a consumer's
//! delivery (it keeps the subject it was stored under; its reply subject is `$JS.ACK.…`), its
//! acknowledgement, a pull request, an event.
//!
//! N jobs fire at one second on a node running every actor, and again 25 seconds later;
//! for each fire messages are counted from a second before it (its records are written a
//! quarter of a second ahead) to the last success and for as long again as the consistency
//! sweep takes to read a record's writes ([`ax_actors::WRITES_READ_WITHIN`], 20 s: it reads
//! them once they are old), and divided by N
//! (so the node's background traffic — heartbeats, leases, clock probes — weighs little; it is
//! counted under its own kinds). The first fire pays what a node reads once per job (its
//! definition, checked against the registry); the later one is what a job firing again and
//! again costs.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;

use crate::{client_for, fire_soon, noop_jobs_watched, start_node, successes, Figure, Result};

/// The kind of one message: what it is for, from its subject and reply subject.
fn kind(prefix: &str, subject: &str, reply: Option<&str>) -> String {
    let tag = prefix.replace('.', "_");
    let ours = |rest: &str| format!("{tag}_{rest}");
    // A consumer's delivery keeps the subject it was stored under; its reply is where it is
    // acknowledged.
    if let Some(reply) = reply.filter(|r| r.starts_with("$JS.ACK.")) {
        let stream = reply.split('.').nth(2).unwrap_or_default();
        return format!("delivery ({stream})");
    }
    if let Some(rest) = subject.strip_prefix("$KV.") {
        let bucket = rest.split('.').next().unwrap_or_default();
        let bucket = bucket.strip_prefix(&ours("")).unwrap_or(bucket);
        return format!("kv write {bucket}");
    }
    if let Some(rest) = subject
        .strip_prefix("$JS.API.DIRECT.GET.")
        .or_else(|| subject.strip_prefix("$JS.API.STREAM.MSG.GET."))
    {
        let stream = rest.split('.').next().unwrap_or_default();
        let bucket = stream.strip_prefix(&format!("KV_{tag}_")).unwrap_or(stream);
        return format!("kv read {bucket}");
    }
    if subject.starts_with("$JS.ACK.") {
        let stream = subject.split('.').nth(2).unwrap_or_default();
        return format!("ack of a delivery ({stream})");
    }
    if subject.starts_with("$JS.API.CONSUMER.MSG.NEXT.") {
        return "pull request".into();
    }
    if let Some(rest) = subject.strip_prefix("$JS.API.") {
        let call: Vec<&str> = rest.split('.').take(2).collect();
        return format!("JetStream API {}", call.join("."));
    }
    if subject.starts_with("_INBOX.") {
        return "answer (publish ack, kv result, reply)".into();
    }
    if let Some(rest) = subject.strip_prefix(&format!("{prefix}.")) {
        let mut tokens = rest.split('.');
        return match (tokens.next(), tokens.next()) {
            (Some("internal"), Some(what)) => format!("publish internal.{what}"),
            (Some(what), _) => format!("publish {what}"),
            _ => "publish".into(),
        };
    }
    let first: Vec<&str> = subject.split('.').take(3).collect();
    format!("other ({}…)", first.join("."))
}

/// Seconds between the two fires of every job: enough for the first to settle and for the
/// sweep to read its writes.
const BETWEEN: i64 = 25;
/// The same with `--quick`, which does not wait for the sweep (its figures show the section
/// works; they are not figures to compare).
const BETWEEN_QUICK: i64 = 4;

pub(crate) async fn measure(url: &str, quick: bool) -> Result<Vec<Figure>> {
    let n = if quick { 200 } else { 2_000 };
    let prefix = "wire";
    let client = client_for(url, prefix).await?;
    let monitor = async_nats::connect(url).await?;
    let scratch = tempfile::tempdir()?;
    // Both fires in one minute, so that one cron expression names them.
    let between = if quick { BETWEEN_QUICK } else { BETWEEN };
    let idle = if quick { Duration::ZERO } else { IDLE };
    let (mut first, _) = fire_soon(if quick { 4 } else { 6 + IDLE.as_secs() as i64 })?;
    while chrono::Timelike::second(&(first + chrono::Duration::seconds(between))) < between as u32 {
        first += chrono::Duration::seconds(1);
    }
    let second = first + chrono::Duration::seconds(between);
    let sweep = if quick {
        Duration::ZERO
    } else {
        ax_actors::WRITES_READ_WITHIN + Duration::from_secs(1)
    };
    let cron = {
        use chrono::{Datelike, Timelike};
        format!(
            "{},{} {} {} {} {} *",
            first.second(),
            second.second(),
            first.minute(),
            first.hour(),
            first.day(),
            first.month()
        )
    };
    let mut results = noop_jobs_watched(&client, "w", n, &cron).await?;
    let node = start_node(&client, "all", 256, scratch.path()).await?;
    // The node's background (heartbeats, leases, polls of the queues, the advisories of those
    // calls), measured with nothing firing and taken off each fire's counts pro rata.
    let quiet_from = first - chrono::Duration::seconds(1) - chrono::Duration::from_std(idle)?;
    tokio::time::sleep(
        (quiet_from - ax_bus::time::now())
            .to_std()
            .unwrap_or(Duration::ZERO),
    )
    .await;
    let (background, quiet) = count(&monitor, prefix, || async {
        tokio::time::sleep(idle).await;
        Ok(())
    })
    .await?;
    let mut figures = Vec::new();
    for (fire_at, which) in [(first, "first"), (second, "later")] {
        // Counting starts a second before the fire, once the node has settled: a Scheduler
        // writes a cron fire's record a quarter of a second ahead of its instant.
        let start = fire_at - chrono::Duration::seconds(1);
        tokio::time::sleep(
            (start - ax_bus::time::now())
                .to_std()
                .unwrap_or(Duration::ZERO),
        )
        .await;
        let (counts, took) = count(&monitor, prefix, || async {
            successes("wire", &mut results, n, Duration::from_secs(120)).await?;
            tokio::time::sleep(sweep).await;
            Ok(())
        })
        .await?;
        let counts = without_background(
            counts,
            &background,
            took.as_secs_f64() / quiet.as_secs_f64().max(1.0),
        );
        figures.extend(tally(n, which, counts, !idle.is_zero()));
    }
    node.stop();
    Ok(figures)
}

/// How long the node's background is counted before the fires.
const IDLE: Duration = Duration::from_secs(8);

/// `counts` less `background` times `scale` (the ratio of the two spans), kind by kind.
fn without_background(
    mut counts: BTreeMap<String, Tally>,
    background: &BTreeMap<String, Tally>,
    scale: f64,
) -> BTreeMap<String, Tally> {
    for (kind, quiet) in background {
        if let Some(tally) = counts.get_mut(kind) {
            let less = |n: u64, by: u64| n.saturating_sub((by as f64 * scale).round() as u64);
            tally.messages = less(tally.messages, quiet.messages);
            tally.bytes = less(tally.bytes, quiet.bytes);
        }
    }
    counts.retain(|_, tally| tally.messages > 0);
    counts
}

/// Counts every message by kind while `until` runs, and half a second after (what the last
/// instances still do after their result: the DagCoordinator's acknowledgement); with how
/// long it counted.
async fn count<F, Fut, T>(
    monitor: &async_nats::Client,
    prefix: &'static str,
    until: F,
) -> Result<(BTreeMap<String, Tally>, Duration)>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut everything = monitor.subscribe(">").await?;
    monitor.flush().await?;
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let counting = tokio::spawn(async move {
        let mut counts: BTreeMap<String, Tally> = BTreeMap::new();
        loop {
            let message = tokio::select! {
                message = everything.next() => message,
                _ = &mut stopped => None,
            };
            let Some(message) = message else {
                return counts;
            };
            let kind = kind(
                prefix,
                &message.subject,
                message.reply.as_ref().map(|r| r.as_str()),
            );
            let tally = counts.entry(kind).or_default();
            tally.messages += 1;
            tally.bytes += message.length as u64;
        }
    });
    let started = std::time::Instant::now();
    until().await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    monitor.flush().await?;
    let took = started.elapsed();
    let _ = stop.send(());
    let counts = tokio::time::timeout(Duration::from_secs(10), counting).await??;
    Ok((counts, took))
}

/// What one kind of message added up to.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    messages: u64,
    /// Subjects, reply subjects, headers and payloads, as the server routed them.
    bytes: u64,
}

/// The figures of one fire of `n` instances: the totals per instance, then each kind.
fn tally(
    n: usize,
    which: &str,
    counts: BTreeMap<String, Tally>,
    background_off: bool,
) -> Vec<Figure> {
    let off = if background_off {
        "; the node's background, counted before the fires, taken off"
    } else {
        ""
    };
    let total: u64 = counts.values().map(|t| t.messages).sum();
    let bytes: u64 = counts.values().map(|t| t.bytes).sum();
    let per = |count: u64| count as f64 / n as f64;
    let (name, note) = match which {
        "first" => (
            "messages per instance on the wire".to_string(),
            format!("{n} no-op cron instances, each its job's first fire on this node: every message the server routed, by kind below{off}"),
        ),
        _ => (
            "messages per instance on the wire, a job's later fire".to_string(),
            format!("the same {n} jobs {BETWEEN} s later (what a job firing again and again costs), by kind below{off}"),
        ),
    };
    let mut figures = vec![
        Figure {
            section: "wire",
            name,
            value: per(total),
            unit: "msg",
            note,
        },
        Figure {
            section: "wire",
            name: format!("{which} fire: bytes per instance on the wire"),
            value: per(bytes),
            unit: "B",
            note: "subjects, reply subjects, headers and payloads of those messages".into(),
        },
    ];
    let mut kinds: Vec<(String, Tally)> = counts.into_iter().collect();
    kinds.sort_by(|a, b| {
        (b.1.messages, b.1.bytes)
            .cmp(&(a.1.messages, a.1.bytes))
            .then_with(|| a.0.cmp(&b.0))
    });
    figures.extend(kinds.into_iter().map(|(kind, tally)| Figure {
        section: "wire",
        name: format!("{which} fire: {kind}"),
        value: per(tally.messages),
        unit: "msg",
        note: format!(
            "{} in all, {:.0} B per instance",
            tally.messages,
            per(tally.bytes)
        ),
    }));
    figures
}

#[cfg(test)]
mod tests {
    use super::kind;

    #[test]
    fn messages_are_told_apart_by_subject_and_reply() {
        let k = |subject: &str, reply: Option<&str>| kind("wire", subject, reply);
        assert_eq!(k("$KV.wire_instances.w1.x", None), "kv write instances");
        assert_eq!(
            k("$JS.API.DIRECT.GET.KV_wire_jobs.$KV.wire_jobs.w1", None),
            "kv read jobs"
        );
        assert_eq!(
            k("$JS.API.STREAM.MSG.GET.KV_wire_jobs", Some("_INBOX.r")),
            "kv read jobs"
        );
        assert_eq!(
            k("$JS.ACK.WIRE_DISPATCH.c.1.2.3.4.5", None),
            "ack of a delivery (WIRE_DISPATCH)"
        );
        assert_eq!(
            k(
                "wire.internal.ready.normal",
                Some("$JS.ACK.WIRE_FLOW.c.1.2.3.4.5")
            ),
            "delivery (WIRE_FLOW)"
        );
        assert_eq!(
            k("_INBOX.x.y", None),
            "answer (publish ack, kv result, reply)"
        );
        assert_eq!(
            k("wire.internal.ready.normal", None),
            "publish internal.ready"
        );
        assert_eq!(k("wire.event.w1.running", None), "publish event");
        assert_eq!(
            k("$JS.API.CONSUMER.MSG.NEXT.WIRE_FLOW.c", Some("_INBOX.z")),
            "pull request"
        );
    }
}
