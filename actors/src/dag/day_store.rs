//! The coordinator reads days of the deps bucket by their subjects ([`read`]): on taking the
//! lead, the recent days of the jobs it follows (see [`super::state::DagState::follows`]);
//! later, any other day a wait names. The values of earlier versions found (one key per (job,
//! date) holding the whole day) are rewritten as per-instance entries; a day noted while no
//! decision named its job has its instances read from their records. The bucket's keys and reading live in
//! [`ax_bus::client::deps`], shared with the re-run planner and the executors.

use ax_bus::client::deps::{encode_entry, entry_key, noted, parse_key, DayKey, Days, StoredKey};
use ax_bus::error::During;
use ax_bus::AxClient;

use crate::jetstream::publish::AckWindow;
use crate::ActorError;

/// The days `keys` as stored (those with entries; nothing read when there are none). Legacy
/// day values found are rewritten as entries (pipelined; entries already there win, being
/// newer) and deleted.
pub(crate) async fn read(client: &AxClient, keys: &[DayKey]) -> Result<Days, ActorError> {
    if keys.is_empty() {
        return Ok(Days::new());
    }
    let stored = client.deps_entries_of_days(keys).await?;
    let notes = noted(&stored);
    let legacy: Vec<(DayKey, String)> = stored
        .iter()
        .filter_map(|(key, _, _)| match parse_key(key) {
            Some(StoredKey::LegacyDay(day)) if !notes.contains(&day) => Some((day, key.clone())),
            _ => None,
        })
        .collect();
    let days = client.days_of(stored).await?;
    if legacy.is_empty() {
        return Ok(days);
    }
    let bucket = client.layout.deps_bucket();
    let mut acks = AckWindow::new(1024);
    for (day, _) in &legacy {
        for (instance, (attempt, state)) in
            days.get(day).map(|d| &d.instances).into_iter().flatten()
        {
            let key = entry_key(&day.0, day.1, instance);
            acks.push(
                client
                    .kv_put_pipelined(&bucket, &key, encode_entry(*attempt, *state)?)
                    .await?,
            )
            .await?;
        }
    }
    acks.flush().await?;
    for (_, key) in &legacy {
        client
            .deps
            .delete(key)
            .await
            .during(|| format!("delete legacy deps day {key}"))?;
    }
    tracing::info!(
        days = legacy.len(),
        "deps days of an earlier version stored per instance"
    );
    Ok(days)
}
