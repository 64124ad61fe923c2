//! Backlog control (the article's 5.5): work waiting per worker, watched on the janitor's node.
//!
//! Every [`CHECK_EVERY`] it asks its Router for the live workers (also `ax_workers_live`) and
//! reads, per priority, what waits — the ready queue's undelivered
//! messages plus what the Routers dispatched to the workers' queues and the workers have not
//! taken yet — and the number of workers consuming that priority. When what waits stays above
//! `factor` times the workers for `hold`, `ax.alert.backlog` is raised and, with
//! `auto_pause_low`, the low-priority queue is paused (recorded on `ax.audit.queue`, shown by
//! `ax queue list` as paused by the backlog control): the workers' slots go to normal and high
//! work. Once every priority stays below half the limit for `resume_after`, the queue is
//! resumed — only a pause of its own: an operator's pause is the operator's to lift. What the
//! paused low queue itself holds back in its ready queue does not count against its resume
//! (only what waits at the workers does): it is what the pause keeps back, and counting it
//! would keep a queue that filled faster than the Routers moved it paused for ever. High and
//! normal queues are never paused by it.
//!
//! [`Control`] decides from the depths alone (a pure state machine, unit-tested); [`watch`]
//! reads JetStream and carries out what it decides.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;

use ax_bus::codec;
use ax_bus::error::During;
use ax_bus::ids::WorkerId;
use ax_bus::messages::{AlertKind, QueueState};
use ax_bus::spec::Priority;
use ax_bus::AxClient;

use super::Dispatcher;
use crate::jetstream::publish;
use crate::ActorError;

/// How often the depths are read.
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// The backlog control's settings (`[backlog]` in the node config).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BacklogConfig {
    /// Work waiting per worker above which a priority is backlogged (100).
    pub factor: u64,
    /// How long it must stay above before the alert (2 minutes).
    pub hold: Duration,
    /// Whether the low-priority queue is paused then.
    pub auto_pause_low: bool,
    /// How long every priority must stay below half the limit before the queue is resumed
    /// (10 minutes).
    pub resume_after: Duration,
}

impl Default for BacklogConfig {
    fn default() -> Self {
        Self {
            factor: 100,
            hold: Duration::from_secs(120),
            auto_pause_low: false,
            resume_after: Duration::from_secs(600),
        }
    }
}

/// What waits in one priority, and who consumes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Depth {
    /// Messages not yet taken in the ready queue: what a pause of the priority holds back.
    pub(crate) held: u64,
    /// Messages not yet taken in the workers' queues.
    pub(crate) at_workers: u64,
    /// Workers consuming the priority.
    pub(crate) workers: u64,
}

impl Depth {
    /// Messages not yet taken: the ready queue's and the workers' queues'.
    pub(crate) fn waiting(&self) -> u64 {
        self.held.saturating_add(self.at_workers)
    }
}

/// What the control decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Raise the alert for a backlogged priority.
    Alert(Priority, Depth),
    /// Pause the low queue.
    PauseLow,
    /// Resume the low queue (it was paused by the control).
    ResumeLow,
}

/// The control's memory between readings.
#[derive(Debug)]
pub(crate) struct Control {
    config: BacklogConfig,
    above_since: BTreeMap<Priority, Instant>,
    alerted: BTreeMap<Priority, bool>,
    calm_since: Option<Instant>,
}

impl Control {
    pub(crate) fn new(config: BacklogConfig) -> Self {
        Self {
            config,
            above_since: BTreeMap::new(),
            alerted: BTreeMap::new(),
            calm_since: None,
        }
    }

    /// What to do after reading `depths` at `now`; `paused_by_control` says whether the low
    /// queue is paused by the control now.
    pub(crate) fn observe(
        &mut self,
        depths: &BTreeMap<Priority, Depth>,
        paused_by_control: bool,
        now: Instant,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let limit = |d: &Depth| self.config.factor.saturating_mul(d.workers.max(1));
        for (priority, depth) in depths {
            if depth.waiting() > limit(depth) {
                let since = *self.above_since.entry(*priority).or_insert(now);
                let alerted = self.alerted.entry(*priority).or_insert(false);
                if now.duration_since(since) >= self.config.hold && !*alerted {
                    *alerted = true;
                    actions.push(Action::Alert(*priority, *depth));
                    if self.config.auto_pause_low && !paused_by_control {
                        actions.push(Action::PauseLow);
                    }
                }
            } else {
                self.above_since.remove(priority);
                if depth.waiting().saturating_mul(2) < limit(depth) {
                    self.alerted.insert(*priority, false);
                }
            }
        }
        // The paused low queue is judged by what waits at the workers, not by what it holds.
        let judged = |priority: &Priority, d: &Depth| match priority {
            Priority::Low if paused_by_control => d.at_workers,
            _ => d.waiting(),
        };
        let calm = depths
            .iter()
            .all(|(p, d)| judged(p, d).saturating_mul(2) < limit(d));
        if !calm {
            self.calm_since = None;
            return actions;
        }
        let since = *self.calm_since.get_or_insert(now);
        if paused_by_control && now.duration_since(since) >= self.config.resume_after {
            actions.push(Action::ResumeLow);
        }
        actions
    }
}

/// Watches the depths for ever (on the janitor's node), carrying out what [`Control`] decides.
pub(crate) async fn watch(shared: Dispatcher) -> Result<(), ActorError> {
    let mut control = Control::new(shared.config.backlog);
    let mut every = tokio::time::interval(CHECK_EVERY);
    loop {
        every.tick().await;
        let client = &shared.client;
        let Ok(live) = shared.router.send(super::Live).await else {
            continue;
        };
        crate::metrics::metrics()
            .workers_live
            .set(i64::try_from(live.len()).unwrap_or(i64::MAX));
        let (depths, paused) = match (depths(client, &live).await, low_state(client).await) {
            (Ok(depths), Ok(paused)) => (depths, paused),
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!(error = %e, "backlog not read; again at the next check");
                continue;
            }
        };
        let paused_by_control = paused
            .as_ref()
            .is_some_and(|s| s.by == QueueState::BY_BACKLOG);
        record(&depths);
        for action in control.observe(&depths, paused_by_control, Instant::now()) {
            carry_out(&shared, action, paused.as_ref()).await?;
        }
    }
}

/// The depths as read, for `/metrics` (what waits and who consumes it, per priority).
fn record(depths: &BTreeMap<Priority, Depth>) {
    let metrics = crate::metrics::metrics();
    let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    for (priority, depth) in depths {
        let label = crate::metrics::PriorityLabel {
            priority: priority.as_str(),
        };
        let waiting = metrics.backlog_waiting.get_or_create(&label);
        waiting.set(gauge(depth.waiting()));
        let workers = metrics.backlog_workers.get_or_create(&label);
        workers.set(gauge(depth.workers));
    }
}

async fn carry_out(
    shared: &Dispatcher,
    action: Action,
    low: Option<&QueueState>,
) -> Result<(), ActorError> {
    let (client, node) = (&shared.client, &shared.node);
    let factor = shared.config.backlog.factor;
    match action {
        Action::Alert(priority, depth) => {
            let message = format!(
                "{} work waiting: {} for {} worker(s), more than {factor} per worker for {:?}",
                priority.as_str(),
                depth.waiting(),
                depth.workers,
                shared.config.backlog.hold
            );
            publish::alert(client, node, AlertKind::Backlog, message, None).await;
        }
        Action::PauseLow if low.is_some_and(|s| s.paused) => {
            // Paused by an operator already: theirs to resume.
        }
        Action::PauseLow => {
            set_low(shared, true, "a queue's backlog stayed above its limit").await?
        }
        Action::ResumeLow => {
            set_low(
                shared,
                false,
                "every queue's backlog stayed below half its limit",
            )
            .await?
        }
    }
    Ok(())
}

/// Pauses or resumes the low queue as the control, and records it on `ax.audit.queue`.
async fn set_low(shared: &Dispatcher, paused: bool, why: &str) -> Result<(), ActorError> {
    let client = &shared.client;
    let state = QueueState {
        paused,
        by: if paused {
            QueueState::BY_BACKLOG.to_string()
        } else {
            String::new()
        },
    };
    client
        .queues
        .put(Priority::Low.as_str(), codec::encode(&state)?)
        .await
        .during(|| "set the low queue")?;
    let action = if paused { "pause" } else { "resume" };
    tracing::warn!(queue = "low", action, why, "backlog control");
    let record = ax_bus::auth::audit::AuditRecord {
        action: "queue".into(),
        actor: QueueState::BY_BACKLOG.into(),
        role: ax_bus::auth::Role::Admin,
        verified: false,
        via: ax_bus::auth::Via::System,
        namespaces: Vec::new(),
        request: serde_json::json!({ "priority": Priority::Low.as_str(), "paused": paused }),
        outcome: ax_bus::auth::audit::Outcome::Done,
        message: format!("low queue {action}d: {why}"),
        approval: None,
        approved_by: None,
        dry_run: false,
        detail: serde_json::Value::Null,
        at: ax_bus::time::now(),
        node: shared.node.clone(),
    };
    let msg_id = format!(
        "queue:{action}:{}",
        ax_bus::time::to_millis(ax_bus::time::now())
    );
    publish::to_stream_acked(client, client.subjects().audit("queue"), &msg_id, &record).await
}

/// The low queue's state, if one was ever set.
async fn low_state(client: &AxClient) -> Result<Option<QueueState>, ActorError> {
    match client
        .queues
        .get(Priority::Low.as_str())
        .await
        .during(|| "read the low queue's state")?
    {
        Some(value) => Ok(Some(codec::decode(&value)?)),
        None => Ok(None),
    }
}

/// What waits in each priority: its ready queue's consumer's undelivered messages, and the
/// `live` workers' queues of that priority (their consumers' undelivered messages), with how
/// many of them consume it.
async fn depths(
    client: &AxClient,
    live: &[WorkerId],
) -> Result<BTreeMap<Priority, Depth>, ActorError> {
    let mut depths: BTreeMap<Priority, Depth> = Priority::ALL
        .into_iter()
        .map(|p| (p, Depth::default()))
        .collect();
    let flow = client
        .js
        .get_stream(client.layout.flow_stream())
        .await
        .during(|| "open the flow stream")?;
    // Each namespace's ready queue of each priority (`default`'s and the others').
    let mut names = flow.consumer_names();
    let mut ready = Vec::new();
    while let Some(name) = names.next().await {
        let name = name.during(|| "list the flow stream's consumers")?;
        let priority = Priority::ALL.into_iter().find(|p| {
            let default = format!("router-ready-{}", p.as_str());
            name == default || name.starts_with(&format!("{default}-"))
        });
        if let Some(priority) = priority {
            ready.push((priority, name));
        }
    }
    for (priority, name) in ready {
        if let (Ok(info), Some(depth)) =
            (flow.consumer_info(&name).await, depths.get_mut(&priority))
        {
            depth.held += info.num_pending;
        }
    }
    let dispatch = client
        .js
        .get_stream(client.layout.dispatch_stream())
        .await
        .during(|| "open the dispatch stream")?;
    // Each live worker's queue per priority (one that has not opened a priority's queue yet
    // does not consume it).
    for worker in live {
        for (priority, depth) in depths.iter_mut() {
            let name = client.layout.worker_consumer(worker, *priority);
            if let Ok(info) = dispatch.consumer_info(&name).await {
                depth.at_workers += info.num_pending;
                depth.workers += 1;
            }
        }
    }
    Ok(depths)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BacklogConfig {
        BacklogConfig {
            factor: 100,
            hold: Duration::from_secs(120),
            auto_pause_low: true,
            resume_after: Duration::from_secs(600),
        }
    }

    fn depths(low: u64, high: u64) -> BTreeMap<Priority, Depth> {
        BTreeMap::from([
            (
                Priority::Low,
                Depth {
                    held: 0,
                    at_workers: low,
                    workers: 1,
                },
            ),
            (
                Priority::High,
                Depth {
                    held: 0,
                    at_workers: high,
                    workers: 1,
                },
            ),
        ])
    }

    #[test]
    fn a_backlog_held_past_the_hold_alerts_once_pauses_low_and_resumes_when_calm() {
        let mut control = Control::new(config());
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(control.observe(&depths(150, 0), false, at(0)).is_empty());
        assert!(control.observe(&depths(150, 0), false, at(119)).is_empty());
        assert_eq!(
            control.observe(&depths(150, 0), false, at(120)),
            [
                Action::Alert(
                    Priority::Low,
                    Depth {
                        held: 0,
                        at_workers: 150,
                        workers: 1
                    }
                ),
                Action::PauseLow
            ]
        );
        // Once: still above, paused, nothing more.
        assert!(control.observe(&depths(150, 0), true, at(200)).is_empty());
        // Below the limit but not below half: not calm.
        assert!(control.observe(&depths(60, 0), true, at(300)).is_empty());
        assert!(control.observe(&depths(40, 0), true, at(301)).is_empty());
        assert!(control.observe(&depths(40, 0), true, at(900)).is_empty());
        assert_eq!(
            control.observe(&depths(40, 0), true, at(901)),
            [Action::ResumeLow]
        );
    }

    #[test]
    fn a_dip_restarts_the_hold_and_an_operators_pause_is_not_resumed() {
        let mut control = Control::new(config());
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        control.observe(&depths(0, 150), false, at(0));
        control.observe(&depths(0, 90), false, at(60));
        assert!(control.observe(&depths(0, 150), false, at(150)).is_empty());
        assert_eq!(control.observe(&depths(0, 150), false, at(270)).len(), 2);
        // Calm for long, but the low queue is not paused by the control (an operator's, or
        // none): nothing to resume.
        control.observe(&depths(0, 0), false, at(300));
        assert!(control.observe(&depths(0, 0), false, at(2000)).is_empty());
    }

    #[test]
    fn without_auto_pause_it_only_alerts_and_more_workers_take_more() {
        let mut control = Control::new(BacklogConfig {
            auto_pause_low: false,
            ..config()
        });
        let t0 = Instant::now();
        let busy = BTreeMap::from([(
            Priority::Normal,
            Depth {
                held: 0,
                at_workers: 250,
                workers: 3,
            },
        )]);
        control.observe(&busy, false, t0);
        assert!(control
            .observe(&busy, false, t0 + Duration::from_secs(500))
            .is_empty());
        let busier = BTreeMap::from([(
            Priority::Normal,
            Depth {
                held: 0,
                at_workers: 301,
                workers: 3,
            },
        )]);
        control.observe(&busier, false, t0 + Duration::from_secs(501));
        assert_eq!(
            control.observe(&busier, false, t0 + Duration::from_secs(621)),
            [Action::Alert(
                Priority::Normal,
                Depth {
                    held: 0,
                    at_workers: 301,
                    workers: 3
                }
            )]
        );
    }

    #[test]
    fn what_the_paused_low_queue_holds_back_does_not_keep_it_paused() {
        let mut control = Control::new(config());
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // 300 low held in the ready queue by the pause, 10 left at the worker.
        let held = |at_workers: u64| {
            BTreeMap::from([(
                Priority::Low,
                Depth {
                    held: 300,
                    at_workers,
                    workers: 1,
                },
            )])
        };
        control.observe(&held(10), false, at(0));
        let paused = control.observe(&held(10), false, at(120));
        assert_eq!(paused.last(), Some(&Action::PauseLow));
        assert!(control.observe(&held(10), true, at(121)).is_empty());
        assert_eq!(
            control.observe(&held(10), true, at(721)),
            [Action::ResumeLow]
        );
        // Not paused by the control: the whole backlog counts, and it is not calm.
        let mut unpaused = Control::new(config());
        unpaused.observe(&held(10), false, at(0));
        assert!(!unpaused
            .observe(&held(10), false, at(900))
            .contains(&Action::ResumeLow));
        // Paused, but the workers still have more than half the limit waiting: not calm.
        let mut busy = Control::new(config());
        busy.observe(&held(60), false, at(0));
        busy.observe(&held(60), false, at(120));
        assert!(busy.observe(&held(60), true, at(121)).is_empty());
        assert!(busy.observe(&held(60), true, at(900)).is_empty());
    }
}
