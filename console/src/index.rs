//! The console's index of instances: one compact row per instance record, kept current by a
//! feed over the instances bucket (every record once at start, then every change).
//!
//! Why: the instance list must filter and page on the server and stay fast with a million
//! records (the grids of other schedulers slow down because they read every run per page).
//! Reading the bucket per request costs a consumer and every record; the index costs one feed
//! and about 670 bytes per row (1,556 MB measured with 2.3 million rows, each id held once and
//! shared by the maps; a kilobyte before), and a page is a walk over
//! rows already in memory, newest first, that stops as soon as the page is full. The instance
//! page itself still reads the record from the bucket, so what it shows is never older than
//! the index.
//!
//! What it holds is bounded by a window ([`DEFAULT_WINDOW`], `[console] index_window`) and a
//! count ([`DEFAULT_ROWS`], `[console] index_rows`): every open instance, and the final ones
//! that ended within the window, at most that many, the latest ended; older ones are dropped
//! as they age out (looked for every minute) or as newer ones come in. So its memory is
//! bounded by its settings, not by what the bucket holds. An older instance is still shown by
//! its id (the instance page reads the bucket), and `ax history export` writes them all.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use ax_bus::client::kv_view::FeedItem;
use ax_bus::ids::{InstanceId, JobName};
use ax_bus::{codec, AxClient, InstanceRecord, State};
use futures::StreamExt;

/// How long to wait before opening the feed again after it broke.
const REOPEN_AFTER: Duration = Duration::from_secs(1);
/// The longest message kept per row (the instance page shows the whole one).
const MESSAGE_CHARS: usize = 160;
/// How long after their end final instances stay in the index unless the node's config says
/// otherwise.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often rows that aged out of the window are dropped.
const EVICT_EVERY: Duration = Duration::from_secs(60);
/// How many final instances the index holds at most unless the node's config says otherwise.
pub const DEFAULT_ROWS: usize = 250_000;

/// One instance, as lists show it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// The instance (shared with the index's key and places of the row).
    #[serde(serialize_with = "shared")]
    pub instance_id: Arc<InstanceId>,
    /// Its job.
    pub job: JobName,
    /// Its business date.
    pub biz_date: String,
    /// Its state.
    pub state: State,
    /// The detail beside the state (`timeout`, `exit_code`, ...).
    pub tag: &'static str,
    /// The current attempt.
    pub attempt: u32,
    /// When it was due.
    pub expected_time: DateTime<Utc>,
    /// When the current attempt started.
    pub started_at: Option<DateTime<Utc>>,
    /// When the current attempt finished.
    pub finished_at: Option<DateTime<Utc>>,
    /// The worker of the current attempt.
    pub worker: Option<String>,
    /// The start of the state's message.
    pub message: String,
    /// The start of the last line the current attempt wrote to stderr (empty if none).
    pub last_line: String,
    /// What the ended attempt's processes used, where its worker counted it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<ax_bus::Usage>,
}

/// An id held by several of the index's maps, written as the id.
fn shared<S: serde::Serializer>(id: &Arc<InstanceId>, serializer: S) -> Result<S::Ok, S::Error> {
    id.as_ref().serialize(serializer)
}

impl Row {
    /// A row for the tests: instance `id` of `job` on 2026-12-01, in `state` with `tag`, due at
    /// `due`, not started.
    #[cfg(test)]
    pub(crate) fn sample(
        id: &str,
        job: &str,
        state: State,
        tag: &'static str,
        due: DateTime<Utc>,
    ) -> Row {
        Row {
            instance_id: Arc::new(id.parse().expect("an id")),
            job: job.parse().expect("a job"),
            biz_date: "2026-12-01".into(),
            state,
            tag,
            attempt: 1,
            expected_time: due,
            started_at: None,
            finished_at: None,
            worker: None,
            message: String::new(),
            last_line: String::new(),
            usage: None,
        }
    }

    fn of(record: &InstanceRecord) -> Row {
        Row {
            instance_id: Arc::new(record.instance_id.clone()),
            job: record.job.clone(),
            biz_date: record.biz_date.clone(),
            state: record.state,
            tag: record.tag.as_str(),
            attempt: record.attempt,
            expected_time: record.expected_time,
            started_at: record.started_at,
            finished_at: record.finished_at,
            worker: record.worker.as_ref().map(|w| w.to_string()),
            message: record.message.chars().take(MESSAGE_CHARS).collect(),
            last_line: record
                .stderr_tail
                .lines()
                .rev()
                .find(|line| !line.trim().is_empty())
                .unwrap_or_default()
                .chars()
                .take(MESSAGE_CHARS)
                .collect(),
            usage: record.usage,
        }
    }
}

/// Which instances a list shows; every field set must match.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Filter {
    /// Of this job.
    pub job: Option<JobName>,
    /// Of a job whose name contains this (the pages' search box).
    pub job_part: Option<String>,
    /// In this state.
    pub state: Option<State>,
    /// With this tag.
    pub tag: Option<String>,
    /// Of this business date.
    pub biz_date: Option<String>,
    /// Due at or after this instant.
    pub from: Option<DateTime<Utc>>,
    /// Due before this instant.
    pub to: Option<DateTime<Utc>>,
    /// Not of these jobs (a busy job hidden from a list).
    pub hide: Vec<JobName>,
    /// Only of these namespaces' jobs (a caller whose roles are in single namespaces sees
    /// theirs); `None`: every namespace.
    pub namespaces: Option<std::collections::BTreeSet<String>>,
}

impl Filter {
    fn admits(&self, row: &Row) -> bool {
        self.job.as_ref().is_none_or(|j| *j == row.job)
            && self
                .namespaces
                .as_ref()
                .is_none_or(|kept| kept.contains(row.job.namespace()))
            && self
                .job_part
                .as_ref()
                .is_none_or(|part| row.job.as_str().contains(part.as_str()))
            && self.state.is_none_or(|s| s == row.state)
            && self.tag.as_ref().is_none_or(|t| t == row.tag)
            && self.biz_date.as_ref().is_none_or(|d| *d == row.biz_date)
            && self.from.is_none_or(|f| row.expected_time >= f)
            && self.to.is_none_or(|t| row.expected_time < t)
            && !self.hide.contains(&row.job)
    }
}

/// One page of a list.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Page {
    /// The rows, newest due first.
    pub rows: Vec<Row>,
    /// Whether rows follow this page.
    pub more: bool,
}

/// Counts of instances by state.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Counts {
    /// All of them.
    pub total: u64,
    /// Per state, every state present (zero when none).
    pub by_state: Vec<(State, u64)>,
}

/// Where a row sits in a list: newest due first, then by id. The id is shared by the row, its
/// key and its places in every order (one copy of it, not five: a million rows are held).
type Place = (Reverse<DateTime<Utc>>, Arc<InstanceId>);

#[derive(Debug, Default)]
struct Rows {
    by_id: HashMap<Arc<InstanceId>, Row>,
    /// Newest due first.
    order: BTreeSet<Place>,
    /// The same, per job: a list of one job walks only its rows.
    by_job: HashMap<JobName, BTreeSet<Place>>,
    /// The same, per business date: a date's list (and the dashboard's counts of a day) walks
    /// only that date's rows.
    by_date: HashMap<String, BTreeSet<Place>>,
    /// How many of the rows are final.
    finals: usize,
    /// Whether every record that existed when the feed opened is in.
    current: bool,
}

impl Rows {
    fn put(&mut self, row: Row) {
        self.remove(&row.instance_id);
        self.finals += usize::from(row.state.is_final());
        let id = row.instance_id.clone();
        let key = (Reverse(row.expected_time), id.clone());
        self.order.insert(key.clone());
        self.by_job
            .entry(row.job.clone())
            .or_default()
            .insert(key.clone());
        self.by_date
            .entry(row.biz_date.clone())
            .or_default()
            .insert(key);
        self.by_id.insert(id, row);
    }

    fn remove(&mut self, id: &InstanceId) {
        if let Some((id, old)) = self.by_id.remove_entry(id) {
            self.finals -= usize::from(old.state.is_final());
            let key = (Reverse(old.expected_time), id);
            self.order.remove(&key);
            if let Some(rows) = self.by_job.get_mut(&old.job) {
                rows.remove(&key);
                if rows.is_empty() {
                    self.by_job.remove(&old.job);
                }
            }
            if let Some(rows) = self.by_date.get_mut(&old.biz_date) {
                rows.remove(&key);
                if rows.is_empty() {
                    self.by_date.remove(&old.biz_date);
                }
            }
        }
    }

    /// How long `job` usually runs: the median duration of its last
    /// [`crate::attention::USUAL_OF`] successful runs, when it has at least three.
    fn usual(&self, job: &JobName) -> Option<chrono::Duration> {
        let durations: Vec<chrono::Duration> = self
            .by_job
            .get(job)?
            .iter()
            .filter_map(|(_, id)| self.by_id.get(id.as_ref()))
            .filter(|row| row.state == State::Success)
            .filter_map(|row| Some(row.finished_at? - row.started_at?))
            .take(crate::attention::USUAL_OF)
            .collect();
        crate::attention::median(durations)
    }

    /// Drops the final rows that ended before `since`.
    fn evict(&mut self, since: DateTime<Utc>) {
        let old: Vec<Arc<InstanceId>> = self
            .by_id
            .values()
            .filter(|row| !held(row.state, row.finished_at, row.expected_time, since))
            .map(|row| row.instance_id.clone())
            .collect();
        for id in old {
            self.remove(&id);
        }
    }

    /// Drops the final rows that ended first until at most `most` are left.
    fn keep_at_most(&mut self, most: usize) {
        let Some(over) = self.finals.checked_sub(most).filter(|n| *n > 0) else {
            return;
        };
        let mut ended: Vec<(DateTime<Utc>, &Arc<InstanceId>)> = self
            .by_id
            .values()
            .filter(|row| row.state.is_final())
            .map(|row| {
                (
                    row.finished_at.unwrap_or(row.expected_time),
                    &row.instance_id,
                )
            })
            .collect();
        ended.select_nth_unstable(over - 1);
        let first: Vec<Arc<InstanceId>> =
            ended[..over].iter().map(|(_, id)| (*id).clone()).collect();
        for id in first {
            self.remove(&id);
        }
    }

    fn clear(&mut self) {
        self.by_id.clear();
        self.finals = 0;
        self.order.clear();
        self.by_job.clear();
        self.by_date.clear();
        self.current = false;
    }

    /// The rows `filter` may admit, newest due first: one job's when it names one (else one
    /// date's when it names one), those of the due window when it has one.
    fn candidates<'a>(&'a self, filter: &Filter) -> Box<dyn Iterator<Item = &'a Row> + 'a> {
        let narrowest = match (&filter.job, &filter.biz_date) {
            (Some(job), _) => Some(self.by_job.get(job)),
            (None, Some(date)) => Some(self.by_date.get(date)),
            (None, None) => None,
        };
        let keys: Box<dyn Iterator<Item = &Place>> = match narrowest {
            Some(Some(rows)) => Box::new(rows.iter()),
            Some(None) => Box::new(std::iter::empty()),
            None => Box::new(self.order.iter()),
        };
        // Newest first: rows due at or after `to` come first and are skipped; the walk stops at
        // the first row due before `from`.
        let (from, to) = (filter.from, filter.to);
        Box::new(
            keys.skip_while(move |(Reverse(due), _)| to.is_some_and(|to| *due >= to))
                .take_while(move |(Reverse(due), _)| from.is_none_or(|from| *due >= from))
                .filter_map(|(_, id)| self.by_id.get(id.as_ref())),
        )
    }
}

/// Whether an instance in `state`, ended at `finished` (due at `due`), belongs in an index
/// holding what ended since `since`: every open one, and the final ones that ended since.
fn held(
    state: State,
    finished: Option<DateTime<Utc>>,
    due: DateTime<Utc>,
    since: DateTime<Utc>,
) -> bool {
    !state.is_final() || finished.unwrap_or(due) >= since
}

/// The index: cheap to clone, shared by every request.
#[derive(Clone, Debug, Default)]
pub struct InstanceIndex {
    rows: Arc<RwLock<Rows>>,
}

impl InstanceIndex {
    /// An index kept current from `client`'s instances bucket, by a task of the current
    /// runtime that lives as long as the connection, holding what ended within `window`, at
    /// most `most` final instances.
    pub fn follow(client: AxClient, window: Duration, most: usize) -> InstanceIndex {
        let index = InstanceIndex::default();
        let rows = index.rows.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = feed(&client, &rows, window, most).await {
                    tracing::warn!(error = %e, "the console's instance index stopped; reopening");
                }
                tokio::time::sleep(REOPEN_AFTER).await;
            }
        });
        index
    }

    /// Whether it holds an instance of `job`.
    pub fn has_job(&self, job: &JobName) -> bool {
        self.read().by_job.contains_key(job)
    }

    /// Whether every record that existed when the index started is in it.
    pub fn is_current(&self) -> bool {
        self.read().current
    }

    /// How many instances the index holds.
    pub fn len(&self) -> usize {
        self.read().by_id.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Page `page` (0-based) of `per_page` rows that `filter` admits, newest due first.
    pub fn page(&self, filter: &Filter, page: usize, per_page: usize) -> Page {
        let rows = self.read();
        let skip = page.saturating_mul(per_page);
        let mut admitted = rows
            .candidates(filter)
            .filter(|row| filter.admits(row))
            .skip(skip);
        let page_rows: Vec<Row> = admitted.by_ref().take(per_page).cloned().collect();
        let more = admitted.next().is_some();
        Page {
            rows: page_rows,
            more,
        }
    }

    /// How many instances `filter` admits, by state.
    pub fn counts(&self, filter: &Filter) -> Counts {
        let rows = self.read();
        let mut by_state: Vec<(State, u64)> = State::ALL.iter().map(|s| (*s, 0)).collect();
        let mut total = 0;
        // Counting needs no order: all rows straight from the map, unless a job, a date or a
        // window narrows them.
        let narrowed = filter.job.is_some()
            || filter.biz_date.is_some()
            || filter.from.is_some()
            || filter.to.is_some();
        let candidates: Box<dyn Iterator<Item = &Row>> = if !narrowed {
            Box::new(rows.by_id.values())
        } else {
            rows.candidates(filter)
        };
        for row in candidates.filter(|row| filter.admits(row)) {
            total += 1;
            if let Some(entry) = by_state.iter_mut().find(|(s, _)| *s == row.state) {
                entry.1 += 1;
            }
        }
        Counts { total, by_state }
    }

    /// The rows of `job`, newest due first, at most `limit`.
    pub fn recent(&self, job: &JobName, limit: usize) -> Vec<Row> {
        let filter = Filter {
            job: Some(job.clone()),
            ..Filter::default()
        };
        self.page(&filter, 0, limit).rows
    }

    /// What needs a look at `now` (see [`crate::attention`]): the failures of business date
    /// `date`, and what is stuck or runs long whatever its date (a backfill of last month
    /// waiting on its dependencies is today's problem). A walk of the date's rows and one of
    /// the open rows, under one read of the index, copying only the rows listed.
    /// Only the instances of `namespaces`' jobs, where given.
    pub fn attention(
        &self,
        date: &str,
        now: DateTime<Utc>,
        namespaces: Option<&std::collections::BTreeSet<String>>,
    ) -> crate::attention::Attention {
        let rows = self.read();
        let filter = Filter {
            biz_date: Some(date.to_string()),
            namespaces: namespaces.cloned(),
            ..Filter::default()
        };
        let of_date = rows.candidates(&filter).filter(|row| filter.admits(row));
        let of_date = crate::attention::of(of_date, |job| rows.usual(job), now);
        let in_namespaces = Filter {
            namespaces: namespaces.cloned(),
            ..Filter::default()
        };
        let open = rows
            .candidates(&in_namespaces)
            .filter(|row| in_namespaces.admits(row) && !row.state.is_final());
        let every_date = crate::attention::of(open, |job| rows.usual(job), now);
        crate::attention::Attention {
            stuck: every_date.stuck,
            stuck_count: every_date.stuck_count,
            long: every_date.long,
            long_count: every_date.long_count,
            ..of_date
        }
    }

    /// The latest-due instance of each job for business date `date`.
    pub fn latest_of_date(&self, date: &str) -> HashMap<JobName, Row> {
        let rows = self.read();
        let mut latest: HashMap<JobName, Row> = HashMap::new();
        let filter = Filter {
            biz_date: Some(date.to_string()),
            ..Filter::default()
        };
        // Newest due first: the first row seen of a job is its latest.
        for row in rows.candidates(&filter) {
            latest.entry(row.job.clone()).or_insert_with(|| row.clone());
        }
        latest
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Rows> {
        // A writer that panicked leaves rows that are still whole (each change is one insert
        // or removal): go on with them.
        self.rows.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// Follows the bucket until the feed ends or breaks; starts from an empty index each time
/// (a record deleted while the feed was down must not stay). Holds what ended within `window`,
/// at most `most` final instances: once a tenth more came in (and every minute), the first
/// ended go, so that the index never holds much more than `most` of them, at start either.
async fn feed(
    client: &AxClient,
    rows: &RwLock<Rows>,
    window: Duration,
    most: usize,
) -> Result<(), ax_bus::ClientError> {
    let mut feed = client.instance_feed().await?.into_stream();
    let write = || rows.write().unwrap_or_else(|e| e.into_inner());
    let window = chrono::Duration::from_std(window).unwrap_or(chrono::Duration::MAX);
    let since = || ax_bus::time::now() - window;
    write().clear();
    let mut evict = tokio::time::interval(EVICT_EVERY);
    loop {
        let item = tokio::select! {
            item = feed.next() => match item {
                Some(item) => item,
                None => return Ok(()),
            },
            _ = evict.tick() => {
                let mut rows = write();
                rows.evict(since());
                rows.keep_at_most(most);
                continue;
            }
        };
        match item.map_err(ax_bus::ClientError::from)? {
            FeedItem::Put { key, value, .. } => match codec::decode::<InstanceRecord>(&value) {
                Ok(record) => {
                    let row = Row::of(&record);
                    if held(row.state, row.finished_at, row.expected_time, since()) {
                        let mut rows = write();
                        rows.put(row);
                        if rows.finals > most.saturating_add(most / 10) {
                            rows.keep_at_most(most);
                        }
                    } else {
                        write().remove(&row.instance_id);
                    }
                }
                Err(e) => {
                    tracing::warn!(key, error = %e, "undecodable instance record: not indexed")
                }
            },
            FeedItem::Deleted { key } => {
                if let Ok(id) = key.parse::<InstanceId>() {
                    write().remove(&id);
                }
            }
            FeedItem::Current => write().current = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, job: &str, state: State, minute: u32) -> Row {
        let at = chrono::NaiveDate::from_ymd_opt(2026, 12, 1)
            .and_then(|d| d.and_hms_opt(10, minute, 0))
            .map(|t| t.and_utc())
            .unwrap_or_default();
        Row::sample(id, job, state, "completed", at)
    }

    #[test]
    fn what_is_stuck_is_listed_whatever_its_date_and_failures_of_the_date_only() {
        let index = InstanceIndex::default();
        {
            let mut rows = index.rows.write().unwrap();
            let mut waiting = row("down.a", "down", State::Running, 0);
            waiting.tag = "waiting_deps";
            waiting.biz_date = "2026-01-01".into();
            rows.put(waiting);
            let mut failed = row("old.a", "old", State::Failed, 1);
            failed.biz_date = "2026-01-01".into();
            rows.put(failed);
            let mut today = row("today.a", "today", State::Failed, 2);
            today.biz_date = "2026-12-07".into();
            rows.put(today);
        }
        let now = chrono::TimeZone::with_ymd_and_hms(&Utc, 2026, 12, 7, 12, 0, 0).unwrap();
        let attention = index.attention("2026-12-07", now, None);
        assert_eq!(attention.stuck_count, 1);
        assert_eq!(attention.stuck[0].row.instance_id.as_str(), "down.a");
        assert_eq!(attention.failed_count, 1);
        assert_eq!(attention.failed[0].instance_id.as_str(), "today.a");
    }

    #[test]
    fn rows_that_ended_before_the_window_go_and_open_ones_stay() {
        let index = InstanceIndex::default();
        let mut rows = index.rows.write().unwrap();
        for minute in 0..10 {
            let mut ended = row(&format!("a.m{minute:02}"), "a", State::Success, minute);
            ended.finished_at = Some(ended.expected_time);
            rows.put(ended);
        }
        rows.put(row("a.open", "a", State::Running, 0));
        let since = row("x", "a", State::Success, 5).expected_time;
        rows.evict(since);
        let mut kept: Vec<String> = rows.by_id.keys().map(|id| id.to_string()).collect();
        kept.sort();
        assert_eq!(
            kept,
            ["a.m05", "a.m06", "a.m07", "a.m08", "a.m09", "a.open"],
            "an open instance stays however old"
        );
        assert_eq!(rows.order.len(), 6);
        assert_eq!(
            rows.by_job
                .get(&"a".parse::<JobName>().unwrap())
                .map(BTreeSet::len),
            Some(6)
        );
    }

    #[test]
    fn at_most_so_many_final_rows_stay_the_last_ended_and_open_ones_stay() {
        let index = InstanceIndex::default();
        let mut rows = index.rows.write().unwrap();
        // Due in one order, ended in the reverse one.
        for minute in 0..10 {
            let mut ended = row(&format!("a.m{minute:02}"), "a", State::Failed, minute);
            ended.finished_at = Some(row("x", "a", State::Success, 30 - minute).expected_time);
            rows.put(ended);
        }
        rows.put(row("a.open", "a", State::Running, 0));
        rows.keep_at_most(4);
        let mut kept: Vec<String> = rows.by_id.keys().map(|id| id.to_string()).collect();
        kept.sort();
        assert_eq!(kept, ["a.m00", "a.m01", "a.m02", "a.m03", "a.open"]);
        assert_eq!((rows.finals, rows.order.len()), (4, 5));
        rows.keep_at_most(4);
        assert_eq!(rows.by_id.len(), 5, "nothing more when at the bound");
        rows.keep_at_most(0);
        assert_eq!(rows.by_id.len(), 1, "an open instance stays");
    }

    #[test]
    fn pages_are_newest_first_filtered_and_say_whether_more_follow() {
        let index = InstanceIndex::default();
        {
            let mut rows = index.rows.write().unwrap();
            for minute in 0..25 {
                let job = if minute % 2 == 0 { "even" } else { "odd" };
                let state = if minute % 5 == 0 {
                    State::Failed
                } else {
                    State::Success
                };
                rows.put(row(&format!("{job}.m{minute:02}"), job, state, minute));
            }
            // A record written again moves, not doubles.
            rows.put(row("even.m00", "even", State::Success, 0));
        }
        assert_eq!(index.len(), 25);
        let first = index.page(&Filter::default(), 0, 10);
        assert_eq!(first.rows[0].instance_id.to_string(), "even.m24");
        assert!(first.more);
        let last = index.page(&Filter::default(), 2, 10);
        assert_eq!(last.rows.len(), 5);
        assert!(!last.more);
        let failed_even = Filter {
            job: Some("even".parse().unwrap()),
            state: Some(State::Failed),
            ..Filter::default()
        };
        let page = index.page(&failed_even, 0, 10);
        let ids: Vec<String> = page
            .rows
            .iter()
            .map(|r| r.instance_id.to_string())
            .collect();
        assert_eq!(ids, ["even.m20", "even.m10"]);
        let counts = index.counts(&Filter::default());
        assert_eq!(counts.total, 25);
        assert!(counts.by_state.contains(&(State::Failed, 4)));
        index
            .rows
            .write()
            .unwrap()
            .remove(&"even.m20".parse().unwrap());
        assert_eq!(index.counts(&failed_even).total, 1);
        assert_eq!(
            index.page(&failed_even, 0, 10).rows.len(),
            1,
            "gone from the job's rows too"
        );
    }
}
