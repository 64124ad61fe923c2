//! Cron expressions with classic semantics on top of the `cron` crate.
//!
//! Users write classic cron: 5 fields (`min hour dom month dow`) or 6 with seconds first,
//! day-of-week `0`–`7` with both `0` and `7` meaning Sunday, names (`MON`) and `@daily`-style
//! macros. The `cron` crate differs on three points, bridged here:
//! - it always wants a seconds field (a 5-field spec gets `0` seconds);
//! - it numbers Sunday 1, so day-of-week is expanded to an explicit list of day names;
//! - it ANDs day-of-month and day-of-week, while classic cron fires when *either* matches if
//!   both are restricted: such a spec becomes two schedules whose fires are merged. "Restricted"
//!   is Vixie cron's rule, to the letter: a field that starts with `*` (`*`, `*/2`) is not, so
//!   `0 0 */2 * 1` fires on odd days that are Mondays (AND), while `0 0 1-31/2 * 1` fires on
//!   odd days and on Mondays (OR).
//!
//! The `cron` crate evaluates years up to 2100: a schedule finds no fire after that (a
//! `0 0 29 2 *` fires last in 2096). Documented, not bridged.
//!
//! Evaluation here is on naive local times; mapping them to instants (time zones, DST) is the
//! Scheduler's job.

use std::str::FromStr;

use chrono::NaiveDateTime;

const DAY_NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// A parsed cron expression.
#[derive(Clone, Debug)]
pub struct CronExpr {
    schedules: Vec<cron::Schedule>,
    hour_is_wildcard: bool,
}

impl CronExpr {
    /// Parses a 5- or 6-field expression or a macro (`@hourly`, `@daily`, `@midnight`,
    /// `@weekly`, `@monthly`, `@yearly`, `@annually`). The error is one readable sentence.
    pub fn parse(text: &str) -> Result<Self, String> {
        let expanded = expand_macro(text.trim())?;
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let fields: Vec<&str> = match fields.len() {
            5 => std::iter::once("0").chain(fields).collect(),
            6 => fields,
            n => {
                return Err(format!(
                    "`{text}` has {n} fields; expected 5 (minute hour day-of-month month \
                     day-of-week) or 6 (seconds first)"
                ))
            }
        };
        let [sec, min, hour, dom, month, dow] = [0, 1, 2, 3, 4, 5].map(|i| fields[i]);
        for (name, field, low, high) in [
            ("seconds", sec, 0, 59),
            ("minute", min, 0, 59),
            ("hour", hour, 0, 23),
            ("day-of-month", dom, 1, 31),
            ("month", month, 1, 12),
        ] {
            check_bounds(field, low, high).map_err(|e| format!("`{text}`: {name}: {e}"))?;
        }
        let days = parse_day_of_week(dow).map_err(|e| format!("`{text}`: day-of-week: {e}"))?;
        // Vixie cron's DOM_STAR / DOW_STAR: a field starting with `*` is not a restriction.
        let dom_restricted = !(dom.starts_with('*') || dom == "?");
        let dow_restricted = !(dow.starts_with('*') || dow == "?");
        let build = |dom: &str, dow: &str| {
            cron::Schedule::from_str(&format!("{sec} {min} {hour} {dom} {month} {dow}"))
                // The crate's errors span lines; one line here, like every spec error.
                .map_err(|e| {
                    let flat: Vec<String> = e
                        .to_string()
                        .lines()
                        .map(|l| l.trim().to_string())
                        .filter(|l| !l.is_empty())
                        .collect();
                    format!("`{text}`: {}", flat.join(" "))
                })
        };
        let schedules = match days {
            None => vec![build(dom, "*")?],
            // One of them unrestricted: both must match (the crate's AND).
            Some(list) if !dom_restricted || !dow_restricted => vec![build(dom, &list)?],
            Some(list) => vec![build(dom, "*")?, build("*", &list)?],
        };
        Ok(Self {
            schedules,
            hour_is_wildcard: hour == "*",
        })
    }

    /// Whether the hour field is `*`: such schedules follow elapsed time across DST changes,
    /// the others follow the wall clock (see the Scheduler's DST rule).
    pub fn hour_is_wildcard(&self) -> bool {
        self.hour_is_wildcard
    }

    /// The first matching naive local time strictly after `after`.
    pub fn next_after(&self, after: NaiveDateTime) -> Option<NaiveDateTime> {
        let after = after.and_utc();
        self.schedules
            .iter()
            .filter_map(|s| s.after(&after).next())
            .min()
            .map(|t| t.naive_utc())
    }
}

/// Where to look from for a first fire, to tell an expression that never fires: any that fires
/// at all does so within the following leap-year cycle.
pub fn never_fires_probe() -> NaiveDateTime {
    chrono::NaiveDate::from_ymd_opt(2024, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .unwrap_or_default()
}

/// Every number of a field (in lists, ranges and range starts; not steps) is within
/// `low..=high`.
fn check_bounds(field: &str, low: u32, high: u32) -> Result<(), String> {
    for item in field.split(',') {
        let range = item.split('/').next().unwrap_or(item);
        for number in range.split('-') {
            if let Ok(n) = number.parse::<u64>() {
                if n < u64::from(low) || n > u64::from(high) {
                    return Err(format!("{n} is out of {low}–{high}"));
                }
            }
        }
    }
    Ok(())
}

fn expand_macro(text: &str) -> Result<String, String> {
    if !text.starts_with('@') {
        return Ok(text.to_string());
    }
    let fields = match text.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        _ => {
            return Err(format!(
                "unknown macro `{text}` (use @hourly, @daily, @midnight, @weekly, @monthly, \
                 @yearly or @annually)"
            ))
        }
    };
    Ok(fields.to_string())
}

/// Expands a classic day-of-week field into `cron`'s day names; `None` means every day.
fn parse_day_of_week(field: &str) -> Result<Option<String>, String> {
    if matches!(field, "*" | "?") {
        return Ok(None);
    }
    let mut days = [false; 7];
    for item in field.split(',') {
        let (base, step) = match item.split_once('/') {
            Some((base, step)) => {
                let step: usize = step
                    .parse()
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or_else(|| format!("bad step `{step}`"))?;
                (base, step)
            }
            None => (item, 1),
        };
        let (from, to) = match base {
            "*" | "?" => (0, 6),
            _ => match base.split_once('-') {
                Some((a, b)) => (day_number(a)?, day_number(b)?),
                None if step > 1 => (day_number(base)?, 7),
                None => {
                    let d = day_number(base)?;
                    (d, d)
                }
            },
        };
        if from > to {
            return Err(format!("range `{base}` runs backwards"));
        }
        for d in (from..=to).step_by(step) {
            days[d % 7] = true;
        }
    }
    let names: Vec<&str> = (0..7).filter(|d| days[*d]).map(|d| DAY_NAMES[d]).collect();
    Ok(Some(names.join(",")))
}

/// `0`–`7` (0 and 7 are Sunday) or a three-letter name.
fn day_number(token: &str) -> Result<usize, String> {
    if let Ok(n) = token.parse::<usize>() {
        return if n <= 7 {
            Ok(n)
        } else {
            Err(format!(
                "`{token}` is not a day (0-7, where 0 and 7 are Sunday)"
            ))
        };
    }
    DAY_NAMES
        .iter()
        .position(|name| name.eq_ignore_ascii_case(token))
        .ok_or_else(|| format!("`{token}` is not a day (0-7 or SUN..SAT)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Datelike, NaiveDate, Weekday};

    fn at(y: i32, m: u32, d: u32, h: u32, min: u32, s: u32) -> NaiveDateTime {
        NaiveDate::from_ymd_opt(y, m, d)
            .unwrap()
            .and_hms_opt(h, min, s)
            .unwrap()
    }

    fn fires(expr: &str, from: NaiveDateTime, n: usize) -> Vec<NaiveDateTime> {
        let cron = CronExpr::parse(expr).unwrap();
        let mut out = Vec::new();
        let mut t = from;
        for _ in 0..n {
            t = cron.next_after(t).unwrap();
            out.push(t);
        }
        out
    }

    #[test]
    fn out_of_range_fields_are_one_line_with_the_real_bounds() {
        let e = CronExpr::parse("61 * * * * *").unwrap_err();
        assert_eq!(e, "`61 * * * * *`: seconds: 61 is out of 0–59");
        let e = CronExpr::parse("0 24 * * *").unwrap_err();
        assert_eq!(e, "`0 24 * * *`: hour: 24 is out of 0–23");
        let e = CronExpr::parse("0 0 0 * *").unwrap_err();
        assert!(e.contains("day-of-month: 0 is out of 1–31"), "{e}");
        let e = CronExpr::parse("0 0 * 1-13 *").unwrap_err();
        assert!(e.contains("month: 13 is out of 1–12"), "{e}");
        let e = CronExpr::parse("0 0 * * * x").unwrap_err();
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn schedules_are_evaluated_up_to_the_year_2100_as_documented() {
        // The documented ceiling, held: the leap-day schedule's last fire is 2096's, and a
        // yearly one fires in 2100 and then finds nothing.
        let leap = CronExpr::parse("0 0 29 2 *").unwrap();
        assert_eq!(
            leap.next_after(at(2095, 1, 1, 0, 0, 0)),
            Some(at(2096, 2, 29, 0, 0, 0))
        );
        assert_eq!(leap.next_after(at(2096, 2, 29, 0, 0, 0)), None);
        let yearly = CronExpr::parse("@yearly").unwrap();
        assert_eq!(
            yearly.next_after(at(2099, 6, 1, 0, 0, 0)),
            Some(at(2100, 1, 1, 0, 0, 0))
        );
        assert_eq!(yearly.next_after(at(2100, 1, 1, 0, 0, 0)), None);
    }

    #[test]
    fn a_schedule_on_a_day_that_never_comes_never_fires() {
        let expr = CronExpr::parse("0 0 30 2 *").expect("parses");
        assert_eq!(expr.next_after(never_fires_probe()), None);
        let leap = CronExpr::parse("0 0 29 2 *").expect("parses");
        assert!(leap.next_after(never_fires_probe()).is_some());
    }

    #[test]
    fn five_fields_fire_on_the_minute() {
        let f = fires("*/15 * * * *", at(2026, 1, 1, 10, 7, 30), 2);
        assert_eq!(f, [at(2026, 1, 1, 10, 15, 0), at(2026, 1, 1, 10, 30, 0)]);
    }

    #[test]
    fn six_fields_have_seconds() {
        let f = fires("*/20 * * * * *", at(2026, 1, 1, 10, 0, 0), 3);
        assert_eq!(f[2], at(2026, 1, 1, 10, 1, 0));
    }

    #[test]
    fn sunday_is_zero_and_seven() {
        // 2026-11-29 is a Sunday.
        for expr in ["0 9 * * 0", "0 9 * * 7", "0 9 * * sun"] {
            let f = fires(expr, at(2026, 11, 25, 0, 0, 0), 1);
            assert_eq!(f[0], at(2026, 11, 29, 9, 0, 0), "{expr}");
        }
        let weekdays = fires("0 9 * * 1-5", at(2026, 11, 27, 12, 0, 0), 2);
        assert_eq!(weekdays[0].weekday(), Weekday::Mon);
        assert_eq!(weekdays[1].weekday(), Weekday::Tue);
        let weekend = fires("0 9 * * 5-7", at(2026, 11, 26, 12, 0, 0), 3);
        let days: Vec<Weekday> = weekend.iter().map(|d| d.weekday()).collect();
        assert_eq!(days, [Weekday::Fri, Weekday::Sat, Weekday::Sun]);
    }

    #[test]
    fn day_of_month_or_day_of_week_when_both_are_set() {
        // The 1st of the month or any Monday, as in classic cron.
        let f = fires("0 0 1 * 1", at(2026, 11, 29, 0, 0, 0), 3);
        assert_eq!(
            f,
            [
                at(2026, 11, 30, 0, 0, 0),
                at(2026, 12, 1, 0, 0, 0),
                at(2026, 12, 7, 0, 0, 0)
            ]
        );
    }

    #[test]
    fn a_field_starting_with_a_star_is_unrestricted_as_in_vixie_cron() {
        // */2 in day-of-month: odd days that are Mondays (AND).
        let and = fires("0 0 */2 * 1", at(2026, 11, 1, 0, 0, 0), 3);
        assert!(
            and.iter()
                .all(|d| d.day() % 2 == 1 && d.weekday() == Weekday::Mon),
            "{and:?}"
        );
        assert_eq!(and[0], at(2026, 11, 9, 0, 0, 0));
        // The same days written without the star: odd days or Mondays (OR).
        let or = fires("0 0 1-31/2 * 1", at(2026, 11, 1, 0, 0, 0), 3);
        assert_eq!(
            or,
            [
                at(2026, 11, 2, 0, 0, 0),
                at(2026, 11, 3, 0, 0, 0),
                at(2026, 11, 5, 0, 0, 0)
            ]
        );
        // */2 in day-of-week with a day-of-month: AND too.
        let and = fires("0 0 1-7 * */2", at(2026, 11, 1, 0, 0, 0), 4);
        assert!(
            and.iter().all(|d| d.day() <= 7
                && matches!(
                    d.weekday(),
                    Weekday::Sun | Weekday::Tue | Weekday::Thu | Weekday::Sat
                )),
            "{and:?}"
        );
    }

    #[test]
    fn macros_expand() {
        assert_eq!(
            fires("@daily", at(2026, 1, 1, 5, 0, 0), 1)[0],
            at(2026, 1, 2, 0, 0, 0)
        );
        assert!(CronExpr::parse("@reboot").is_err());
    }

    #[test]
    fn bad_expressions_explain_themselves() {
        for (expr, needle) in [
            ("* * *", "3 fields"),
            ("61 * * * *", "61"),
            ("0 0 * * 8", "not a day"),
            ("0 0 * * 5-1", "backwards"),
            ("0 0 * * */0", "bad step"),
        ] {
            let err = CronExpr::parse(expr).unwrap_err();
            assert!(
                err.contains(needle) || err.contains("Invalid"),
                "{expr}: {err}"
            );
        }
    }

    #[test]
    fn wildcard_hour_is_detected() {
        assert!(CronExpr::parse("*/5 * * * *").unwrap().hour_is_wildcard());
        assert!(!CronExpr::parse("30 2 * * *").unwrap().hour_is_wildcard());
    }
}
