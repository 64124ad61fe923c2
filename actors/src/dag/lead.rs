//! Taking the lead: the coordinator's lease, then its view rebuilt from JetStream — the job
//! registry replayed, the days of the deps bucket and the waiting attempts restored — away
//! from the actor (a large history takes seconds to read), then handed to it whole.

use actix::Addr;

use ax_bus::client::deps::DayKey;
use ax_bus::client::kv_view::{FeedItem, KvFeed};
use ax_bus::ids::NodeId;
use ax_bus::messages::Waiting;
use ax_bus::{codec, AxClient};

use super::state::{Action, DagState};
use super::{day_store, decode_job, DagCoordinator, Lead};
use crate::runtime::lease::Lease;
use crate::ActorError;

const LEASE: &str = "dag";
/// How many days back from today a leader taking over reads the days of the jobs it follows
/// (and one ahead): the days the results coming in name. Any other day is read when a wait
/// first names it, beside the decisions; reading fewer at the lead shortens it (the server scans
/// every job's entries from the first day read).
const RECENT_DAYS: i64 = 2;

/// Waits for the lease, rebuilds the view and hands it to the coordinator; returns once the
/// coordinator has carried out what the restored view decided.
pub(super) async fn lead(
    client: AxClient,
    node: NodeId,
    coordinator: Addr<DagCoordinator>,
) -> Result<(), ActorError> {
    let mut lease = Lease::acquire(&client, LEASE, &node).await?;
    // The view is read back under the lease, renewed meanwhile.
    let (state, actions, registry) = lease.renewed_during(view(&client)).await??;
    coordinator
        .send(Lead {
            state,
            actions,
            lease,
            registry,
        })
        .await?
}

/// The view read back: the registry replayed, then the days and waits restored; what the
/// restored view decides at once, and the registry's feed to follow on.
async fn view(client: &AxClient) -> Result<(DagState, Vec<Action>, KvFeed), ActorError> {
    let mut state = DagState::new();
    let mut registry = KvFeed::open(&client.js, &client.layout.jobs_bucket(), ">").await?;
    while let Some(item) = registry.next().await {
        let item = item?;
        if matches!(item, FeedItem::Current) {
            break;
        }
        // The days of the jobs followed are read below, once the registry is whole.
        apply_registry_change(&mut state, item);
    }
    let actions = restore(client, &mut state).await?;
    if let Some(delay) = crate::test_hooks::lead_delay() {
        tokio::time::sleep(delay).await;
    }
    Ok((state, actions, registry))
}

/// Applies a registry change to the view.
pub(super) fn apply_registry_change(state: &mut DagState, item: FeedItem) {
    match item {
        FeedItem::Put { key, value, .. } => {
            match decode_job(&key, &value) {
                Some(record) => state.upsert_job(record.spec),
                // What was there before is not what the registry says any more.
                None => state.remove_job(&key),
            }
        }
        FeedItem::Deleted { key } => state.remove_job(&key),
        FeedItem::Current => {}
    }
}

/// Rebuilds the view from the deps and waiting buckets; returns what it decides at once (waits
/// met or failed meanwhile).
async fn restore(client: &AxClient, state: &mut DagState) -> Result<Vec<Action>, ActorError> {
    let today = ax_bus::time::now().date_naive();
    let recent = today - chrono::Duration::days(RECENT_DAYS)..=today + chrono::Duration::days(1);
    let keys: Vec<DayKey> = state
        .followed()
        .into_iter()
        .flat_map(|job| {
            let dates = (*recent.start())
                .iter_days()
                .take_while(|d| recent.contains(d));
            dates.map(move |date| (job.clone(), date))
        })
        .collect();
    let days = day_store::read(client, &keys).await?.into_iter().collect();
    let waiting: Vec<Waiting> = KvFeed::open(&client.js, &client.layout.waiting_bucket(), ">")
        .await?
        .snapshot()
        .await?
        .into_iter()
        .filter_map(|(key, value, _)| match codec::decode(&value) {
            Ok(waiting) => Some(waiting),
            Err(e) => {
                tracing::error!(instance = %key, error = %e, "undecodable waiting entry ignored");
                None
            }
        })
        .collect();
    let (splits, waiting): (Vec<Waiting>, Vec<Waiting>) =
        waiting.into_iter().partition(|w| w.children.is_some());
    let mut actions = state.restore(recent, days, waiting, ax_bus::time::now());
    for split in splits {
        let mut children = Vec::new();
        for child in split.children.unwrap_or_default() {
            let ended = client
                .instance(&child)
                .await?
                .map(|(r, _)| r.state)
                .filter(|s| s.is_final());
            children.push((child, ended));
        }
        actions.extend(state.restore_split(split.work, children));
    }
    Ok(actions)
}
