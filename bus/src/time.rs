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
    with_rfc3339(t, str::to_owned)
}

/// `f` of [`rfc3339`]'s text, without allocating it in the usual case.
fn with_rfc3339<R>(t: DateTime<Utc>, f: impl FnOnce(&str) -> R) -> R {
    let text = canonical(t);
    match text.as_ref().and_then(|b| std::str::from_utf8(b).ok()) {
        Some(text) => f(text),
        None => f(&t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
    }
}

/// [`rfc3339`]'s text written by hand for the years 0 to 9999 (`None` outside them, and for a
/// leap second). Every record and message carries a few instants, encoded and decoded at each
/// hop: chrono's general formatter and parser took about 6 % of ax's CPU in the throughput
/// bench's profile.
fn canonical(t: DateTime<Utc>) -> Option<[u8; 24]> {
    use chrono::{Datelike, Timelike};
    let year = u32::try_from(t.year()).ok().filter(|y| *y <= 9999)?;
    let millis = t.timestamp_subsec_millis();
    if millis > 999 {
        return None;
    }
    let mut text = *b"0000-00-00T00:00:00.000Z";
    let fields = [
        (0, 4, year),
        (5, 2, t.month()),
        (8, 2, t.day()),
        (11, 2, t.hour()),
        (14, 2, t.minute()),
        (17, 2, t.second()),
        (20, 3, millis),
    ];
    for (at, width, mut value) in fields {
        for digit in text[at..at + width].iter_mut().rev() {
            *digit = b'0' + (value % 10) as u8;
            value /= 10;
        }
    }
    Some(text)
}

/// The inverse of [`canonical`]: `None` for any other shape (read by chrono instead).
fn parse_canonical(text: &str) -> Option<DateTime<Utc>> {
    let b = text.as_bytes();
    let shaped = b.len() == 24
        && [
            (4, b'-'),
            (7, b'-'),
            (10, b'T'),
            (13, b':'),
            (16, b':'),
            (19, b'.'),
            (23, b'Z'),
        ]
        .iter()
        .all(|&(at, c)| b[at] == c);
    if !shaped {
        return None;
    }
    let number = |from: usize, to: usize| {
        b[from..to].iter().try_fold(0u32, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
        })
    };
    let date = NaiveDate::from_ymd_opt(number(0, 4)? as i32, number(5, 7)?, number(8, 10)?)?;
    let (hour, minute, second) = (number(11, 13)?, number(14, 16)?, number(17, 19)?);
    if second > 59 {
        return None;
    }
    let at = date.and_hms_milli_opt(hour, minute, second, number(20, 23)?)?;
    Some(at.and_utc())
}

/// Serde for an instant on the wire: always RFC 3339 with milliseconds and `Z`
/// (`2026-12-01T14:03:05.000Z`), so strict parsers and fixed-width readers see one shape.
/// chrono's own serde drops the fraction on a whole second; this writes what [`rfc3339`]
/// writes and reads any RFC 3339 instant.
pub mod wire {
    use chrono::{DateTime, Utc};
    use serde::de::{self, IntoDeserializer, Visitor};
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `t` as [`super::rfc3339`] does.
    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, serializer: S) -> Result<S::Ok, S::Error> {
        super::with_rfc3339(*t, |text| serializer.serialize_str(text))
    }

    /// Reads any RFC 3339 instant.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<DateTime<Utc>, D::Error> {
        deserializer.deserialize_str(Instant)
    }

    /// An instant from its text: the canonical shape read by hand, any other by chrono.
    struct Instant;

    impl Visitor<'_> for Instant {
        type Value = DateTime<Utc>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an RFC 3339 instant")
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
            match super::parse_canonical(text) {
                Some(at) => Ok(at),
                None => DateTime::<Utc>::deserialize(text.into_deserializer()),
            }
        }
    }
}

/// [`wire`] for an optional instant (`null` when absent). Fields using it carry
/// `#[serde(default)]`: a `with` module turns off serde's own default for a missing `Option`.
pub mod wire_opt {
    use chrono::{DateTime, Utc};
    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    /// Writes `Some(t)` as [`super::rfc3339`] does, `None` as null.
    pub fn serialize<S: Serializer>(
        t: &Option<DateTime<Utc>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        struct Wired(DateTime<Utc>);
        impl serde::Serialize for Wired {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                super::wire::serialize(&self.0, serializer)
            }
        }
        match t {
            Some(t) => serializer.serialize_some(&Wired(*t)),
            None => serializer.serialize_none(),
        }
    }

    /// Reads null or any RFC 3339 instant.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<DateTime<Utc>>, D::Error> {
        deserializer.deserialize_option(Optional)
    }

    struct Optional;

    impl<'de> Visitor<'de> for Optional {
        type Value = Option<DateTime<Utc>>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("null or an RFC 3339 instant")
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(
            self,
            deserializer: D,
        ) -> Result<Self::Value, D::Error> {
            super::wire::deserialize(deserializer).map(Some)
        }
    }
}

/// The start of a window given as `24h`, `7d` (that long before now) or an RFC 3339 instant
/// (`ax audit list --since`, the console's audit page).
pub fn parse_since(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(at) = parse_instant(text) {
        return Ok(at);
    }
    let ago = parse_delay(text)
        .map_err(|e| format!("`{text}` is neither a duration nor an instant: {e}"))?;
    let ago = chrono::Duration::from_std(ago).unwrap_or(chrono::Duration::MAX);
    Ok(now()
        .checked_sub_signed(ago)
        .unwrap_or(DateTime::<Utc>::MIN_UTC))
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

/// A delay as written after `--in` or in a trigger's `in`: a whole positive number and one
/// unit of `ms`, `s`, `m`, `h` or `d` (`250ms`, `30s`, `5m`, `2h`, `1d`), at most
/// [`crate::duration::MAX`] (read by [`crate::duration::parse_positive`]).
pub fn parse_delay(text: &str) -> Result<std::time::Duration, String> {
    crate::duration::parse_positive(text).map_err(|e| e.to_string())
}

/// A duration of `ms` milliseconds as people read it: `850 ms`, `12.5 s`, `3m 07s`, `58h 32m`
/// (what the console and `ax status` print).
pub fn human_ms(ms: i64) -> String {
    match ms {
        ms if ms < 1_000 => format!("{ms} ms"),
        ms if ms < 60_000 => format!("{:.1} s", ms as f64 / 1_000.0),
        ms if ms < 3_600_000 => format!("{}m {:02}s", ms / 60_000, (ms / 1_000) % 60),
        ms => format!("{}h {:02}m", ms / 3_600_000, (ms / 60_000) % 60),
    }
}

/// An instant as written after `--at` or in a trigger's `at`: RFC 3339 with its offset.
/// Refused too, though RFC 3339 allows them, what ax's records and clients cannot hold: a
/// leap second (`23:59:60`, which chrono keeps as a second's 1000th millisecond and Python's
/// `datetime` rejects) and an instant outside the years 1 to 9999 in UTC.
pub fn parse_instant(text: &str) -> Result<DateTime<Utc>, String> {
    use chrono::{Datelike, Timelike};
    let at = DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| {
            format!("`{text}` is not an RFC 3339 instant such as 2026-12-01T14:03:05.250Z")
        })?;
    if at.nanosecond() >= 1_000_000_000 {
        return Err(format!(
            "`{text}` is a leap second, which ax does not keep: give the second after it"
        ));
    }
    if !(1..=9999).contains(&at.year()) {
        return Err(format!(
            "`{text}` is outside the years 1 to 9999 (in UTC) that ax keeps"
        ));
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    #[test]
    fn delays_and_instants_are_read_as_written_or_refused_saying_why() {
        use std::time::Duration;
        assert_eq!(super::parse_delay("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(super::parse_delay("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(super::parse_delay("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(super::parse_delay("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(super::parse_delay("1d"), Ok(Duration::from_secs(86_400)));
        for bad in ["-5s", "5", "s", "1.5s", "5 s", "5sec", ""] {
            let e = super::parse_delay(bad).unwrap_err();
            assert!(e.contains("is not a duration"), "{bad}: {e}");
        }
        for zero in ["0s", "0ms"] {
            let e = super::parse_delay(zero).unwrap_err();
            assert!(e.contains("is zero"), "{zero}: {e}");
        }
        for long in ["99999999999999999999d", "213504d"] {
            let e = super::parse_delay(long).unwrap_err();
            assert!(e.contains("longer than 36500d"), "{long}: {e}");
        }
        let t = super::parse_instant("2026-12-01T15:03:05.250+01:00").unwrap();
        assert_eq!(super::rfc3339(t), "2026-12-01T14:03:05.250Z");
        assert!(super::parse_instant("2026-12-01 14:03").is_err());
        // Instants that RFC 3339 allows and ax's records and clients cannot hold.
        let leap = super::parse_instant("2027-06-30T23:59:60Z").unwrap_err();
        assert!(leap.contains("is a leap second"), "{leap}");
        for far in ["9999-12-31T23:30:00-01:00", "0000-06-01T00:00:00Z"] {
            let e = super::parse_instant(far).unwrap_err();
            assert!(e.contains("outside the years 1 to 9999"), "{far}: {e}");
        }
    }

    use super::*;

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(human_ms(850), "850 ms");
        assert_eq!(human_ms(12_500), "12.5 s");
        assert_eq!(human_ms(187_000), "3m 07s");
        assert_eq!(human_ms(210_720_000), "58h 32m");
    }

    #[test]
    fn a_window_starts_at_an_instant_or_a_while_ago() {
        assert_eq!(
            parse_since("2026-12-01T00:00:00Z").map(rfc3339),
            Ok("2026-12-01T00:00:00.000Z".to_string())
        );
        let day_ago = parse_since("24h").unwrap();
        assert!(
            (now() - day_ago - chrono::Duration::hours(24))
                .num_seconds()
                .abs()
                < 5
        );
        let err = parse_since("yesterday").unwrap_err();
        assert!(
            err.contains("`yesterday` is neither a duration nor an instant"),
            "{err}"
        );
    }

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

    #[test]
    fn instants_on_the_wire_keep_their_milliseconds_on_a_whole_second() {
        #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
        struct Probe {
            #[serde(with = "super::wire")]
            at: DateTime<Utc>,
            #[serde(default, with = "super::wire_opt")]
            until: Option<DateTime<Utc>>,
        }
        let at = parse_instant("2026-12-01T14:03:05Z").unwrap();
        let probe = Probe {
            at,
            until: Some(at),
        };
        let json = serde_json::to_string(&probe).unwrap();
        assert_eq!(
            json,
            r#"{"at":"2026-12-01T14:03:05.000Z","until":"2026-12-01T14:03:05.000Z"}"#
        );
        assert_eq!(serde_json::from_str::<Probe>(&json).unwrap(), probe);
        let packed = rmp_serde::to_vec_named(&probe).unwrap();
        assert_eq!(rmp_serde::from_slice::<Probe>(&packed).unwrap(), probe);
        // Written by an older node, or by hand: any RFC 3339 instant; a missing option is none.
        let old: Probe = serde_json::from_str(r#"{"at":"2026-12-01T15:03:05+01:00"}"#).unwrap();
        assert_eq!(old, Probe { at, until: None });
        let null: Probe =
            serde_json::from_str(r#"{"at":"2026-12-01T14:03:05.000Z","until":null}"#).unwrap();
        assert_eq!(null, Probe { at, until: None });
        for bad in [
            r#"{"at":"2026-13-01T14:03:05.000Z"}"#,
            r#"{"at":"yesterday"}"#,
            r#"{"at":5}"#,
        ] {
            assert!(serde_json::from_str::<Probe>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_hand_written_wire_form_is_chronos_in_both_directions() {
        let chrono_text = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let mut t = parse_instant("0001-01-01T00:00:00Z").unwrap();
        let end = parse_instant("9999-12-31T23:59:59.999Z").unwrap();
        // A stride that is no whole number of anything visits every field's digits.
        let step = chrono::Duration::milliseconds(7_777_777_777);
        let mut seen = 0;
        while t < end {
            let text = rfc3339(t);
            assert_eq!(text, chrono_text(t));
            assert_eq!(parse_canonical(&text), Some(t), "{text}");
            t += step;
            seen += 1;
        }
        assert!(seen > 40_000, "{seen}");
        let sub_milli = parse_instant("2026-12-01T14:03:05.123456789Z").unwrap();
        assert_eq!(rfc3339(sub_milli), "2026-12-01T14:03:05.123Z");
        assert_eq!(rfc3339(sub_milli), chrono_text(sub_milli));
        let far = parse_instant("+10000-01-01T00:00:00Z");
        if let Ok(far) = far {
            assert_eq!(rfc3339(far), chrono_text(far));
        }
        // Any other shape is left to chrono.
        for other in [
            "2026-12-01T14:03:05Z",
            "2026-12-01T14:03:05.000+00:00",
            "2026-12-01t14:03:05.000Z",
            "2026-12-01T14:03:60.000Z",
            "2026-02-30T14:03:05.000Z",
            "2026-12-01T24:03:05.000Z",
            "2026-12-01T14:03:05.0a0Z",
        ] {
            assert_eq!(parse_canonical(other), None, "{other}");
        }
    }
}
