//! Time as ax writes it: UTC instants with millisecond precision, RFC 3339 on the wire.

use chrono::{DateTime, LocalResult, NaiveDate, SubsecRound, TimeZone, Utc};
use chrono_tz::Tz;

/// The current instant, truncated to milliseconds (the scheduler's precision).
pub fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(3)
}

/// Milliseconds since the Unix epoch.
pub fn to_millis(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

/// The instant `ms` milliseconds after the Unix epoch (clamped to the representable range).
pub fn from_millis(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// RFC 3339 with milliseconds and `Z`, e.g. `2026-11-29T18:37:00.123Z`.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Converts a JetStream/NATS server timestamp into chrono.
pub fn from_server(t: time::OffsetDateTime) -> DateTime<Utc> {
    from_millis((t.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// Parses a business date written exactly `YYYY-MM-DD` (four, two and two digits): a date is a
/// key (instance ids, dependencies by date), so `2026-2-3` or `+2026-02-03`, which chrono would
/// take, are refused rather than stored as written.
pub fn parse_biz_date(text: &str) -> Option<NaiveDate> {
    let canonical = text.len() == 10
        && text.bytes().enumerate().all(|(i, b)| match i {
            4 | 7 => b == b'-',
            _ => b.is_ascii_digit(),
        });
    canonical
        .then(|| NaiveDate::parse_from_str(text, "%Y-%m-%d").ok())
        .flatten()
}

/// The local date of `at` in `tz`, as YYYY-MM-DD.
pub fn biz_date_in(tz: Tz, at: DateTime<Utc>) -> String {
    at.with_timezone(&tz).format("%Y-%m-%d").to_string()
}

/// The first instant of local date `date` in `tz` (midnight, or the end of a DST gap that
/// swallows midnight): the expected time of instances that belong to a date rather than a tick.
pub fn start_of_day(tz: Tz, date: NaiveDate) -> DateTime<Utc> {
    let mut local = date.and_hms_opt(0, 0, 0).unwrap_or_default();
    for _ in 0..(24 * 60) {
        match tz.from_local_datetime(&local) {
            LocalResult::Single(t) => return t.with_timezone(&Utc),
            LocalResult::Ambiguous(a, b) => {
                return a.with_timezone(&Utc).min(b.with_timezone(&Utc))
            }
            LocalResult::None => local += chrono::Duration::minutes(1),
        }
    }
    local.and_utc()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn business_dates_are_exactly_yyyy_mm_dd() {
        assert_eq!(
            parse_biz_date("2026-02-03"),
            NaiveDate::from_ymd_opt(2026, 2, 3)
        );
        for bad in [
            "2026-2-3",
            "+2026-02-03",
            "2026-02-30",
            "2026-02-03 ",
            "20260203",
            "2026/02/03",
            "",
        ] {
            assert_eq!(parse_biz_date(bad), None, "{bad:?}");
        }
    }
}
