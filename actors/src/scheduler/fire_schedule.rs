//! When a cron job fires: its expression evaluated in its time zone, with ax's DST rule.
//!
//! # The DST rule
//! Cron expressions name wall-clock times, and twice a year some wall-clock times do not exist
//! (spring forward) or exist twice (fall back). ax follows the rule classic cron (Vixie) uses:
//! - **Fixed-time jobs** (the hour field is not `*`, e.g. `30 2 * * *`) follow the wall clock
//!   and fire **exactly once** per matching local time: a time inside the spring-forward gap fires
//!   at the first instant after the gap (02:30 → 03:00 new time); a repeated time fires at its
//!   first occurrence only (01:30 in daylight time, not again in standard time). Several fires
//!   that land on the same instant this way fire once.
//! - **Interval jobs** (the hour field is `*`, e.g. `*/15 * * * *`) follow elapsed time: they
//!   fire at every instant whose local time matches, so the repeated hour is run through twice and
//!   the skipped hour simply has no instants (the 15-minute rhythm is kept in real time).
//!
//! The business date of a fire is its local date.

use chrono::{DateTime, Duration, LocalResult, NaiveDateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;

use ax_bus::spec::cron_expr::CronExpr;

/// The widest window examined around a DST change.
const OFFSET_PROBE: i64 = 6;

/// A cron expression in a time zone.
#[derive(Clone, Debug)]
pub struct FireSchedule {
    cron: CronExpr,
    tz: Tz,
}

impl FireSchedule {
    /// Parses `cron` in the IANA zone `timezone`.
    pub fn new(cron: &str, timezone: &str) -> Result<Self, String> {
        Ok(Self {
            cron: CronExpr::parse(cron)?,
            tz: timezone
                .parse()
                .map_err(|_| format!("unknown time zone `{timezone}`"))?,
        })
    }

    /// The zone.
    pub fn timezone(&self) -> Tz {
        self.tz
    }

    /// The first fire strictly after `after`.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Offsets around `after`: a local time n can only map to instants in
        // [n - max_offset, n - min_offset], which bounds the search on both sides.
        let offsets = [-OFFSET_PROBE, 0, OFFSET_PROBE].map(|h| {
            let probe = after + Duration::hours(h);
            Duration::seconds(
                self.tz
                    .offset_from_utc_datetime(&probe.naive_utc())
                    .fix()
                    .local_minus_utc() as i64,
            )
        });
        let min_offset = offsets.iter().min().copied()?;
        let max_offset = offsets.iter().max().copied()?;
        let mut cursor = after.naive_utc() + min_offset;
        let mut best: Option<DateTime<Utc>> = None;
        loop {
            let local = self.cron.next_after(cursor)?;
            if let Some(best) = best {
                if (local - max_offset).and_utc() > best {
                    return Some(best);
                }
            }
            let (instants, resume_at) = self.instants_of(local);
            for instant in instants {
                if instant > after && best.is_none_or(|b| instant < b) {
                    best = Some(instant);
                }
            }
            // Inside a gap nothing else exists until its end: skip to it.
            cursor = resume_at.unwrap_or(local);
            // Far from any DST change the first candidate is the answer.
            if best.is_some() && min_offset == max_offset {
                return best;
            }
        }
    }

    /// The instants a matching local time fires at, by the DST rule, and for a time inside a
    /// spring-forward gap the last local time of the gap (where the search resumes).
    fn instants_of(&self, local: NaiveDateTime) -> (Vec<DateTime<Utc>>, Option<NaiveDateTime>) {
        let interval = self.cron.hour_is_wildcard();
        match self.tz.from_local_datetime(&local) {
            LocalResult::Single(t) => (vec![t.with_timezone(&Utc)], None),
            LocalResult::Ambiguous(a, b) => {
                let (a, b) = (a.with_timezone(&Utc), b.with_timezone(&Utc));
                if interval {
                    (vec![a.min(b), a.max(b)], None)
                } else {
                    (vec![a.min(b)], None)
                }
            }
            LocalResult::None => match self.gap_end(local) {
                Some((end_local, end_instant)) => {
                    let resume = Some(end_local - Duration::seconds(1));
                    if interval {
                        (vec![], resume)
                    } else {
                        (vec![end_instant], resume)
                    }
                }
                None => (vec![], None),
            },
        }
    }

    /// The first existing local minute after `local` (inside a gap), and its instant.
    fn gap_end(&self, local: NaiveDateTime) -> Option<(NaiveDateTime, DateTime<Utc>)> {
        let mut probe = local - Duration::seconds(local.and_utc().timestamp().rem_euclid(60));
        for _ in 0..(24 * 60) {
            probe += Duration::minutes(1);
            match self.tz.from_local_datetime(&probe) {
                LocalResult::Single(t) => return Some((probe, t.with_timezone(&Utc))),
                LocalResult::Ambiguous(a, b) => {
                    return Some((probe, a.with_timezone(&Utc).min(b.with_timezone(&Utc))))
                }
                LocalResult::None => {}
            }
        }
        None
    }

    /// The business date (YYYY-MM-DD) of an instant: its local date.
    pub fn biz_date(&self, at: DateTime<Utc>) -> String {
        ax_bus::time::biz_date_in(self.tz, at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ax_bus::time::{biz_date_in, start_of_day};

    fn utc(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    /// Every fire in [from, to).
    fn fires(cron: &str, tz: &str, from: &str, to: &str) -> Vec<String> {
        let schedule = FireSchedule::new(cron, tz).unwrap();
        let (mut t, end) = (utc(from) - Duration::milliseconds(1), utc(to));
        let mut out = Vec::new();
        while let Some(next) = schedule.next_after(t) {
            if next >= end {
                break;
            }
            out.push(next.with_timezone(&schedule.tz).to_rfc3339());
            t = next;
        }
        out
    }

    #[test]
    fn daily_0230_new_york_fires_once_on_spring_forward_day() {
        // 2026-03-08: 02:00 EST jumps to 03:00 EDT, so 02:30 does not exist.
        let f = fires(
            "30 2 * * *",
            "America/New_York",
            "2026-03-07T00:00:00Z",
            "2026-03-10T00:00:00Z",
        );
        assert_eq!(
            f,
            [
                "2026-03-07T02:30:00-05:00",
                "2026-03-08T03:00:00-04:00",
                "2026-03-09T02:30:00-04:00"
            ]
        );
    }

    #[test]
    fn daily_0230_new_york_fires_once_on_fall_back_day() {
        // 2026-11-01: 02:00 EDT falls back to 01:00 EST; 02:30 exists once.
        let f = fires(
            "30 2 * * *",
            "America/New_York",
            "2026-10-31T00:00:00Z",
            "2026-11-03T00:00:00Z",
        );
        assert_eq!(
            f,
            [
                "2026-10-31T02:30:00-04:00",
                "2026-11-01T02:30:00-05:00",
                "2026-11-02T02:30:00-05:00"
            ]
        );
    }

    #[test]
    fn a_repeated_fixed_time_fires_at_its_first_occurrence_only() {
        let f = fires(
            "30 1 * * *",
            "America/New_York",
            "2026-11-01T00:00:00Z",
            "2026-11-02T12:00:00Z",
        );
        assert_eq!(
            f,
            ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"]
        );
    }

    #[test]
    fn fires_collapsing_into_the_gap_fire_once() {
        let f = fires(
            "*/20 2 * * *",
            "America/New_York",
            "2026-03-08T05:00:00Z",
            "2026-03-08T12:00:00Z",
        );
        assert_eq!(f, ["2026-03-08T03:00:00-04:00"]);
    }

    #[test]
    fn interval_jobs_keep_real_time_across_both_changes() {
        let fall = fires(
            "*/30 * * * *",
            "America/New_York",
            "2026-11-01T04:45:00Z",
            "2026-11-01T07:31:00Z",
        );
        assert_eq!(
            fall,
            [
                "2026-11-01T01:00:00-04:00",
                "2026-11-01T01:30:00-04:00",
                "2026-11-01T01:00:00-05:00",
                "2026-11-01T01:30:00-05:00",
                "2026-11-01T02:00:00-05:00",
                "2026-11-01T02:30:00-05:00"
            ]
        );
        let spring = fires(
            "*/30 * * * *",
            "America/New_York",
            "2026-03-08T06:00:00Z",
            "2026-03-08T07:31:00Z",
        );
        assert_eq!(
            spring,
            [
                "2026-03-08T01:00:00-05:00",
                "2026-03-08T01:30:00-05:00",
                "2026-03-08T03:00:00-04:00",
                "2026-03-08T03:30:00-04:00"
            ]
        );
    }

    #[test]
    fn zone_and_business_date() {
        let schedule = FireSchedule::new("0 2 * * *", "Asia/Shanghai").unwrap();
        let next = schedule.next_after(utc("2026-11-29T12:00:00Z")).unwrap();
        assert_eq!(next, utc("2026-11-29T18:00:00Z"));
        assert_eq!(schedule.biz_date(next), "2026-11-30");
    }

    #[test]
    fn days_start_at_midnight_or_after_a_gap_that_swallows_it() {
        let date = chrono::NaiveDate::from_ymd_opt(2026, 11, 30).unwrap();
        assert_eq!(
            start_of_day(chrono_tz::Asia::Shanghai, date),
            utc("2026-11-29T16:00:00Z")
        );
        // Santiago springs forward at midnight: 2026-09-06 starts at 01:00 local.
        let date = chrono::NaiveDate::from_ymd_opt(2026, 9, 6).unwrap();
        let start = start_of_day(chrono_tz::America::Santiago, date);
        assert_eq!(
            biz_date_in(chrono_tz::America::Santiago, start),
            "2026-09-06"
        );
        assert_eq!(
            start
                .with_timezone(&chrono_tz::America::Santiago)
                .format("%H:%M")
                .to_string(),
            "01:00"
        );
    }

    #[test]
    fn month_ends_and_leap_days() {
        let f = fires(
            "0 0 29 2 *",
            "UTC",
            "2026-01-01T00:00:00Z",
            "2029-01-01T00:00:00Z",
        );
        assert_eq!(f, ["2028-02-29T00:00:00+00:00"]);
        let f = fires(
            "0 12 31 * *",
            "Europe/Paris",
            "2026-01-15T00:00:00Z",
            "2026-06-01T00:00:00Z",
        );
        assert_eq!(f.len(), 3, "{f:?}");
    }

    #[test]
    fn every_second_near_a_dst_change_stays_cheap_and_exact() {
        let f = fires(
            "* * * * * *",
            "America/New_York",
            "2026-03-08T06:59:58Z",
            "2026-03-08T07:00:02Z",
        );
        assert_eq!(
            f,
            [
                "2026-03-08T01:59:58-05:00",
                "2026-03-08T01:59:59-05:00",
                "2026-03-08T03:00:00-04:00",
                "2026-03-08T03:00:01-04:00"
            ]
        );
    }
}

#[cfg(test)]
mod properties {
    //! The fire schedule against a brute-force reading of the DST rule, minute by minute in UTC,
    //! across DST changes in zones of both hemispheres, with half-hour and midnight changes.

    use super::*;
    use chrono::Timelike;
    use proptest::prelude::*;

    const ZONES: &[&str] = &[
        "America/New_York",
        "Europe/London",
        "Europe/Berlin",
        "Australia/Sydney",
        "Australia/Lord_Howe",
        "America/Santiago",
        "America/Havana",
        "Asia/Kolkata",
        "UTC",
    ];
    /// (field, the minutes or hours it matches)
    const MINUTES: &[(&str, &[u32])] = &[
        ("0", &[0]),
        ("30", &[30]),
        ("*/15", &[0, 15, 30, 45]),
        ("5,35", &[5, 35]),
    ];
    const HOURS: &[(&str, &[u32])] = &[
        ("*", &[]),
        ("0", &[0]),
        ("1", &[1]),
        ("2", &[2]),
        ("1-3", &[1, 2, 3]),
        ("*/2", &[0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22]),
        ("0,23", &[0, 23]),
    ];

    /// The fires in (from, to] by the rule read literally, minute by minute in UTC: an interval
    /// job (hour `*`) fires at every instant whose local time matches; a fixed-time job fires at
    /// the first instant of each matching local time, and a matching local time skipped by a
    /// jump forward fires at the first instant after the jump.
    fn brute_force(
        tz: Tz,
        minutes: &[u32],
        hours: &[u32],
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Vec<DateTime<Utc>> {
        let interval = hours.is_empty();
        let matches = |l: NaiveDateTime| {
            minutes.contains(&l.minute()) && (interval || hours.contains(&l.hour()))
        };
        let local = |u: DateTime<Utc>| u.with_timezone(&tz).naive_local();
        // Seen local times start a day early, so that a repeat in the window is known as one.
        let mut u = from - Duration::days(1);
        let mut latest_local = local(u);
        let mut fires = Vec::new();
        while u < to {
            u += Duration::minutes(1);
            let (prev, cur) = (local(u - Duration::minutes(1)), local(u));
            let fires_here = if interval {
                matches(cur)
            } else {
                let first_time = cur > latest_local;
                let mut skipped = prev + Duration::minutes(1);
                let mut in_gap = false;
                while skipped < cur {
                    in_gap |= matches(skipped);
                    skipped += Duration::minutes(1);
                }
                (first_time && matches(cur)) || in_gap
            };
            latest_local = latest_local.max(cur);
            if fires_here && u > from {
                fires.push(u);
            }
        }
        fires
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn fires_follow_the_dst_rule_minute_by_minute(
            zone in 0..ZONES.len(),
            minute in 0..MINUTES.len(),
            hour in 0..HOURS.len(),
            year in 2024i32..=2027,
            month in prop::sample::select(vec![3u32, 4, 9, 10, 11]),
            day in 1u32..=28,
            at_hour in 0u32..24,
        ) {
            let tz: Tz = ZONES[zone].parse().expect("a zone");
            let (m, minutes) = MINUTES[minute];
            let (h, hours) = HOURS[hour];
            let schedule = FireSchedule::new(&format!("{m} {h} * * *"), ZONES[zone]).expect("parses");
            let from = chrono::NaiveDate::from_ymd_opt(year, month, day)
                .and_then(|d| d.and_hms_opt(at_hour, 0, 0))
                .expect("a time")
                .and_utc();
            let to = from + Duration::hours(48);
            let mut fires = Vec::new();
            let mut cursor = from;
            while let Some(next) = schedule.next_after(cursor).filter(|n| *n <= to) {
                fires.push(next);
                cursor = next;
            }
            let expected = brute_force(tz, minutes, hours, from, to);
            prop_assert_eq!(fires, expected, "`{} {} * * *` in {} from {}", m, h, ZONES[zone], from);
        }
    }
}
