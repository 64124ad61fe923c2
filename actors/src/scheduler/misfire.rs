//! The misfire policy: what becomes of the ticks a job missed while no Scheduler ran.
//!
//! A Scheduler starting up reads each job's last recorded tick; the ticks between it and the
//! instant from which the Scheduler fires the job itself were missed. A failover is not a
//! misfire: the ticks a partition's owner missed by dying, while the Scheduler that takes the
//! partition over was already running, are all fired whatever the policy ([`with_failover`]).
//! Inside `catchup_window`
//! (counted back from that instant), `fire_all` runs every missed tick in order, `fire_once`
//! runs the latest and skips the others, `skip` skips them all; ticks older than the window are
//! always skipped. Nothing is dropped silently: every missed tick is recorded, as caught up or
//! as skipped with its reason. Pure: the caller says what "now" is.

use chrono::{DateTime, Duration, Utc};

use ax_bus::spec::Misfire;

use crate::scheduler::fire_schedule::FireSchedule;

/// Most missed ticks of one job recorded one by one; beyond, one summary record.
pub(crate) const MAX_RECORDED: usize = 10_000;
/// Most ticks counted at all (an every-second job down for a long time).
const MAX_COUNTED: usize = 1_000_000;

/// The decision for one job's missed ticks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CatchUp {
    /// Ticks to run now, oldest first.
    pub fire: Vec<DateTime<Utc>>,
    /// Ticks skipped, with the reason.
    pub skip: Vec<(DateTime<Utc>, String)>,
    /// Further missed ticks beyond [`MAX_RECORDED`], skipped (counted up to a million).
    pub more_skipped: usize,
}

/// The longest stretch before a take-over whose ticks count as missed by a failover: far
/// longer than a take-over takes (a few seconds), so that only ticks missed while no Scheduler
/// could fire (an outage of NATS, every Scheduler down) go to the policy.
const FAILOVER_SPAN: Duration = Duration::seconds(60);

/// [`plan`] for a job of a partition taken over: the ticks after `failover_from` (the latest of
/// the instant its earlier owner said its fires were settled and the instant the taker
/// started; `None` when neither is known) were missed only because the owner died, and are
/// all fired, whatever the policy (at most [`FAILOVER_SPAN`] of them); the policy decides about
/// those before.
pub(crate) fn with_failover(
    schedule: &FireSchedule,
    policy: Misfire,
    window_secs: u64,
    last: DateTime<Utc>,
    failover_from: Option<DateTime<Utc>>,
    until: DateTime<Utc>,
) -> CatchUp {
    let split = match failover_from {
        Some(from) => from.max(last).max(until - FAILOVER_SPAN).min(until),
        None => until,
    };
    let mut result = plan(schedule, policy, window_secs, last, split);
    let mut cursor = split;
    while let Some(tick) = schedule.next_after(cursor) {
        if tick > until {
            break;
        }
        result.fire.push(tick);
        cursor = tick;
    }
    result
}

/// Decides what becomes of the ticks strictly after `last` and up to `until`.
pub(crate) fn plan(
    schedule: &FireSchedule,
    policy: Misfire,
    window_secs: u64,
    last: DateTime<Utc>,
    until: DateTime<Utc>,
) -> CatchUp {
    let window = Duration::seconds(window_secs.min(366 * 86_400) as i64);
    let window_start = until - window;
    let mut result = CatchUp::default();
    // Ticks older than the window are skipped: recorded one by one up to a limit, then counted.
    let mut cursor = last;
    while let Some(tick) = schedule.next_after(cursor) {
        if tick > until || tick >= window_start {
            break;
        }
        if result.skip.len() < MAX_RECORDED {
            result
                .skip
                .push((tick, "missed; older than the catch-up window".to_string()));
        } else {
            result.more_skipped += 1;
            if result.more_skipped >= MAX_COUNTED {
                break;
            }
        }
        cursor = tick;
    }
    // Ticks inside the window go to the policy (the newest MAX_RECORDED of them).
    let mut inside = std::collections::VecDeque::new();
    let mut cursor = last.max(window_start - Duration::milliseconds(1));
    while let Some(tick) = schedule.next_after(cursor) {
        if tick > until {
            break;
        }
        if inside.len() == MAX_RECORDED {
            inside.pop_front();
            result.more_skipped += 1;
        }
        inside.push_back(tick);
        cursor = tick;
    }
    let inside: Vec<DateTime<Utc>> = inside.into();
    match policy {
        Misfire::Skip => result.skip.extend(
            inside
                .into_iter()
                .map(|t| (t, "missed; misfire policy skip".to_string())),
        ),
        Misfire::FireAll => result.fire = inside,
        Misfire::FireOnce => {
            let mut inside = inside;
            if let Some(latest) = inside.pop() {
                result.skip.extend(inside.into_iter().map(|t| {
                    (
                        t,
                        "missed; misfire policy fire_once runs only the latest".to_string(),
                    )
                }));
                result.fire.push(latest);
            }
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn every_minute() -> FireSchedule {
        FireSchedule::new("* * * * *", "UTC").unwrap()
    }

    #[test]
    fn fire_all_runs_every_missed_tick_inside_the_window() {
        let plan = plan(
            &every_minute(),
            Misfire::FireAll,
            180,
            t("2026-01-01T00:00:00Z"),
            t("2026-01-01T00:05:30Z"),
        );
        assert_eq!(
            plan.fire,
            [
                t("2026-01-01T00:03:00Z"),
                t("2026-01-01T00:04:00Z"),
                t("2026-01-01T00:05:00Z")
            ]
        );
        let skipped: Vec<_> = plan.skip.iter().map(|(t, _)| *t).collect();
        assert_eq!(
            skipped,
            [t("2026-01-01T00:01:00Z"), t("2026-01-01T00:02:00Z")]
        );
        assert!(plan.skip[0].1.contains("older than the catch-up window"));
    }

    #[test]
    fn fire_once_runs_the_latest_only() {
        let plan = plan(
            &every_minute(),
            Misfire::FireOnce,
            3600,
            t("2026-01-01T00:00:00Z"),
            t("2026-01-01T00:03:00Z"),
        );
        assert_eq!(plan.fire, [t("2026-01-01T00:03:00Z")]);
        assert_eq!(plan.skip.len(), 2);
        assert!(plan.skip[0].1.contains("fire_once"));
    }

    #[test]
    fn skip_runs_nothing_and_records_everything() {
        let plan = plan(
            &every_minute(),
            Misfire::Skip,
            3600,
            t("2026-01-01T00:00:00Z"),
            t("2026-01-01T00:03:00Z"),
        );
        assert!(plan.fire.is_empty());
        assert_eq!(plan.skip.len(), 3);
    }

    #[test]
    fn nothing_missed_nothing_planned() {
        let plan = plan(
            &every_minute(),
            Misfire::FireAll,
            3600,
            t("2026-01-01T00:03:00Z"),
            t("2026-01-01T00:03:59Z"),
        );
        assert_eq!(plan, CatchUp::default());
    }

    #[test]
    fn a_failover_fires_every_tick_the_dead_owner_missed_whatever_the_policy() {
        let every_second = FireSchedule::new("* * * * * *", "UTC").unwrap();
        // The owner settled through :10 and died; the taker, running since long before,
        // took over at :15.
        for policy in [Misfire::FireOnce, Misfire::Skip, Misfire::FireAll] {
            let plan = with_failover(
                &every_second,
                policy,
                60,
                t("2026-01-01T00:00:10Z"),
                Some(t("2026-01-01T00:00:10Z")),
                t("2026-01-01T00:00:15Z"),
            );
            let seconds: Vec<u32> = plan
                .fire
                .iter()
                .map(|t| t.timestamp() as u32 % 60)
                .collect();
            assert_eq!(seconds, [11, 12, 13, 14, 15], "{policy:?}");
            assert!(plan.skip.is_empty(), "{policy:?}");
        }
    }

    #[test]
    fn ticks_before_the_taker_ran_go_to_the_policy() {
        let every_second = FireSchedule::new("* * * * * *", "UTC").unwrap();
        // Settled through :10 by a Scheduler gone; the taker started at :13 (nobody ran in
        // between), took the partition at :15.
        let plan = with_failover(
            &every_second,
            Misfire::FireOnce,
            60,
            t("2026-01-01T00:00:10Z"),
            Some(t("2026-01-01T00:00:13Z")),
            t("2026-01-01T00:00:15Z"),
        );
        let fired: Vec<u32> = plan
            .fire
            .iter()
            .map(|t| t.timestamp() as u32 % 60)
            .collect();
        assert_eq!(
            fired,
            [13, 14, 15],
            "the latest before :13 by the policy, then all"
        );
        let skipped: Vec<u32> = plan
            .skip
            .iter()
            .map(|(t, _)| t.timestamp() as u32 % 60)
            .collect();
        assert_eq!(skipped, [11, 12]);
        // Nothing known of the earlier owners: the policy decides about everything.
        let plan = with_failover(
            &every_second,
            Misfire::FireOnce,
            60,
            t("2026-01-01T00:00:10Z"),
            None,
            t("2026-01-01T00:00:15Z"),
        );
        assert_eq!(plan.fire, [t("2026-01-01T00:00:15Z")]);
    }

    #[test]
    fn a_take_over_long_after_the_death_leaves_the_older_ticks_to_the_policy() {
        let every_second = FireSchedule::new("* * * * * *", "UTC").unwrap();
        let plan = with_failover(
            &every_second,
            Misfire::Skip,
            3600,
            t("2026-01-01T00:00:00Z"),
            Some(t("2026-01-01T00:00:00Z")),
            t("2026-01-01T00:10:00Z"),
        );
        assert_eq!(plan.fire.len(), 60, "the last minute only");
        assert_eq!(plan.fire[0], t("2026-01-01T00:09:01Z"));
        assert_eq!(plan.skip.len(), 540);
    }

    #[test]
    fn a_long_outage_is_summarised_beyond_the_record_limit() {
        let every_second = FireSchedule::new("* * * * * *", "UTC").unwrap();
        let plan = plan(
            &every_second,
            Misfire::FireOnce,
            60,
            t("2026-01-01T00:00:00Z"),
            t("2026-01-01T06:00:00Z"),
        );
        assert_eq!(plan.fire, [t("2026-01-01T06:00:00Z")]);
        assert_eq!(plan.skip.len() + plan.more_skipped + 1, 6 * 3600);
    }
}
