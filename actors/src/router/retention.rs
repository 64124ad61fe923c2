//! The retention sweep: finished instance records leave the instances bucket once their
//! retention has passed (see [`ax_bus::client::retention`] for the index it reads).
//!
//! Run by the node holding the janitor lease. Each subject of `<AX>_EXPIRY` (one per length of
//! retention) is read by a durable consumer of its own, in order: the head message is the
//! first to fall due, so the sweep removes records while the head is due and otherwise waits
//! for it, holding the few messages it has fetched (kept from redelivery by progress acks). A
//! janitor that dies leaves them unacknowledged: the next one gets them after [`ACK_WAIT`].
//! A record is removed at the earliest when its retention has passed, and at the latest about
//! a second after — or later while NATS is away or the sweep is behind, never early. The
//! first janitor of a deployment notes the records that ended before their ends were noted
//! (an earlier version's), as ending then ([`AxClient::note_unnoted`]).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use async_nats::jetstream::{
    self,
    consumer::{pull, AckPolicy, DeliverPolicy},
};
use chrono::{DateTime, Utc};
use futures::TryStreamExt;

use ax_bus::client::expiry_notes;
use ax_bus::client::retention::{subject_secs, Expiry};
use ax_bus::error::NatsError;
use ax_bus::ids::InstanceId;
use ax_bus::AxClient;

use super::Dispatcher;
use crate::jetstream::consume;
use crate::ActorError;

/// Messages fetched at once from one subject.
const FETCH: usize = 256;
/// How long a fetched message may stay unacknowledged before another janitor gets it.
const ACK_WAIT: Duration = Duration::from_secs(15);
/// How often held messages are kept from redelivery.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// The longest the sweep sleeps: new subjects (a job with a retention of its own) are looked
/// for this often.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// One subject's reader.
struct Subject {
    kept: Duration,
    consumer: jetstream::consumer::Consumer<pull::Config>,
    /// Fetched and not yet settled, in order.
    held: VecDeque<jetstream::Message>,
    /// How many of the head's instances are settled (a message names those whose ends were
    /// noted together).
    head_settled: usize,
    progressed: Instant,
}

/// Removes records past their retention until the lease or the connection is lost.
pub(super) async fn sweep(shared: Dispatcher) -> Result<(), ActorError> {
    let client = &shared.client;
    let failed = |what: &str, e: ax_bus::error::BoxError| ActorError::from(NatsError::new(what, e));
    let stream = client
        .js
        .get_stream(client.layout.expiry_stream())
        .await
        .map_err(|e| failed("open the expiry stream", e.into()))?;
    // Once per deployment: the records that ended before their ends were noted.
    match client.note_unnoted().await {
        Ok(Some(noted)) => {
            tracing::info!(
                noted,
                "retention: the records that ended before it was noted"
            );
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "retention: earlier records not noted; next term"),
    }
    let mut subjects: BTreeMap<u64, Subject> = BTreeMap::new();
    loop {
        if let Err(e) = look_for_subjects(client, &stream, &mut subjects).await {
            tracing::warn!(error = %e, "retention: cannot list the expiry subjects");
        }
        let mut wake = Instant::now() + LOOK_EVERY;
        for subject in subjects.values_mut() {
            match subject.step(client).await {
                Ok(Some(due)) => {
                    let wait = (due - ax_bus::time::now()).to_std().unwrap_or_default();
                    wake = wake.min(Instant::now() + wait);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "retention: sweep failed; trying again"),
            }
        }
        tokio::time::sleep_until(wake.into()).await;
    }
}

/// Opens a reader for each subject that has none yet.
async fn look_for_subjects(
    client: &AxClient,
    stream: &jetstream::stream::Stream,
    subjects: &mut BTreeMap<u64, Subject>,
) -> Result<(), ActorError> {
    let failed = |what: &str, e: ax_bus::error::BoxError| ActorError::from(NatsError::new(what, e));
    let listed: Vec<(String, usize)> = stream
        .info_with_subjects(client.subjects().expiry_all())
        .await
        .map_err(|e| failed("list the expiry subjects", e.into()))?
        .try_collect()
        .await
        .map_err(|e| failed("list the expiry subjects", e.into()))?;
    for (name, _) in listed {
        let Some(secs) = subject_secs(&name) else {
            continue;
        };
        if subjects.contains_key(&secs) {
            continue;
        }
        let consumer = stream
            .create_consumer(pull::Config {
                durable_name: Some(format!("expiry-{secs}")),
                filter_subject: name,
                ack_policy: AckPolicy::Explicit,
                deliver_policy: DeliverPolicy::All,
                ack_wait: ACK_WAIT,
                max_ack_pending: i64::try_from(FETCH).unwrap_or(i64::MAX),
                ..Default::default()
            })
            .await
            .map_err(|e| failed("open an expiry consumer", e.into()))?;
        subjects.insert(
            secs,
            Subject {
                kept: Duration::from_secs(secs),
                consumer,
                held: VecDeque::new(),
                head_settled: 0,
                progressed: Instant::now(),
            },
        );
    }
    Ok(())
}

impl Subject {
    /// Removes what is due, in order; the time the head falls due, if one waits.
    async fn step(&mut self, client: &AxClient) -> Result<Option<DateTime<Utc>>, ActorError> {
        loop {
            if self.held.is_empty() {
                self.fetch().await?;
                if self.held.is_empty() {
                    return Ok(None);
                }
                self.progressed = Instant::now();
            }
            let Some(head) = self.held.front() else {
                return Ok(None);
            };
            let Some((noted, ids)) = read(head) else {
                tracing::warn!(subject = %head.subject, "retention: unreadable index message dropped");
                self.settle().await;
                continue;
            };
            let now = ax_bus::time::now();
            let due =
                noted + chrono::Duration::from_std(self.kept).unwrap_or(chrono::Duration::MAX);
            if due > now {
                self.keep_held().await;
                return Ok(Some(due));
            }
            // The head's ids in order, from the first not settled yet.
            while let Some(id) = ids.get(self.head_settled) {
                match client.remove_expired(id, self.kept, noted, now).await? {
                    Expiry::KeptUntil(due) => {
                        self.keep_held().await;
                        return Ok(Some(due));
                    }
                    Expiry::Removed => {
                        tracing::debug!(instance = %id, "record past its retention removed");
                    }
                    Expiry::Nothing => {}
                }
                self.head_settled += 1;
            }
            self.settle().await;
        }
    }

    async fn fetch(&mut self) -> Result<(), ActorError> {
        let fetched = consume::fetch_now(&self.consumer, FETCH)
            .await
            .map_err(|e| NatsError::new("fetch from an expiry consumer", e))?;
        self.held.extend(fetched);
        Ok(())
    }

    /// Acknowledges the head.
    async fn settle(&mut self) {
        self.head_settled = 0;
        if let Some(head) = self.held.pop_front() {
            consume::ack(&head).await;
        }
    }

    /// Keeps the held messages from being delivered again while the head waits.
    async fn keep_held(&mut self) {
        if self.progressed.elapsed() < PROGRESS_EVERY {
            return;
        }
        for message in &self.held {
            consume::in_progress(message).await;
        }
        self.progressed = Instant::now();
    }
}

/// When an index message was stored, and the instances it names (none: unreadable).
fn read(message: &jetstream::Message) -> Option<(DateTime<Utc>, Vec<InstanceId>)> {
    let info = message.info().ok()?;
    let noted = ax_bus::time::from_server(info.published);
    let ids = expiry_notes::ids(&message.payload);
    (!ids.is_empty()).then_some((noted, ids))
}
