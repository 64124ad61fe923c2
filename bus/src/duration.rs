//! The one reader of durations written by people: in a job spec (`lease: 60s`), in the node's
//! settings (`[retention] results = "30d"`) and on the command line (`--in 5m`, `--expires
//! 30d`, `--since 24h`).
//!
//! Every duration ax reads goes through [`parse`], with checked arithmetic and one ceiling,
//! [`MAX`] (100 years): anything longer is refused where it is written, never wrapped. Two
//! hand-written readers once each multiplied on their own, and a retention of `213504d` (just
//! past 2^64 nanoseconds) became a stream age of 25 minutes once converted to nanoseconds.
//! The ceiling keeps every duration ax reads inside what JetStream (signed 64-bit
//! nanoseconds) and chrono can hold, with room for sums.

use std::time::Duration;

/// The longest duration ax reads anywhere: 36,500 days (100 years).
pub const MAX: Duration = Duration::from_secs(MAX_DAYS * 86_400);

/// [`MAX`] in days, as written in the errors and the docs.
pub const MAX_DAYS: u64 = 36_500;

/// Why a text is not a duration; each message quotes the text.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DurationError {
    /// No whole number first, or a unit ax does not know.
    #[error("`{0}` is not a duration such as 250ms, 30s, 5m, 2h or 1d")]
    Shape(String),
    /// Longer than [`MAX`].
    #[error("`{0}` is longer than {MAX_DAYS}d, the longest duration ax reads")]
    TooLong(String),
    /// Zero where something must last.
    #[error("`{0}` is zero: give a duration such as 250ms, 30s, 5m, 2h or 1d")]
    Zero(String),
    /// A number of seconds that is negative, not a number, or past [`MAX`].
    #[error("{0} is not a number of seconds from 0 to {max}", max = MAX.as_secs())]
    Seconds(f64),
    /// Finer than whole seconds where seconds are kept.
    #[error("`{0}` is not a whole number of seconds")]
    NotWholeSeconds(String),
}

/// A whole number and one unit of `ms`, `s`, `m`, `h` or `d` (`250ms`, `30s`, `5m`, `2h`,
/// `1d`), at most [`MAX`]. Zero is read (`0s`); callers that need a positive length say so.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let shape = || DurationError::Shape(text.to_string());
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(shape)?;
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(shape());
    }
    let ms_per: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(shape()),
    };
    // A number too long for u64 is too long whatever its unit.
    let too_long = || DurationError::TooLong(text.to_string());
    let n: u64 = number.parse().map_err(|_| too_long())?;
    let ms = n.checked_mul(ms_per).ok_or_else(too_long)?;
    let length = Duration::from_millis(ms);
    if length > MAX {
        return Err(too_long());
    }
    Ok(length)
}

/// [`parse`], refusing zero: a delay, an age, a window.
pub fn parse_positive(text: &str) -> Result<Duration, DurationError> {
    match parse(text)? {
        length if length.is_zero() => Err(DurationError::Zero(text.to_string())),
        length => Ok(length),
    }
}

/// Whole seconds as a job spec writes them: a bare number (`60`, seconds) or [`parse`]'s
/// form in whole seconds (`60s`, `5m`), at most [`MAX`].
pub fn parse_seconds(text: &str) -> Result<u64, DurationError> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        let seconds: u64 = text
            .parse()
            .map_err(|_| DurationError::TooLong(text.to_string()))?;
        return within_ceiling(seconds);
    }
    let length = parse(text)?;
    if length.subsec_nanos() != 0 {
        return Err(DurationError::NotWholeSeconds(text.to_string()));
    }
    Ok(length.as_secs())
}

/// `seconds` as a setting gives them (a number, maybe with a fraction), from 0 to [`MAX`]:
/// `Duration::from_secs_f64` panics past its own range and JetStream's nanoseconds wrap well
/// before it.
pub fn from_secs_f64(seconds: f64) -> Result<Duration, DurationError> {
    if seconds.is_finite() && (0.0..=MAX.as_secs_f64()).contains(&seconds) {
        Ok(Duration::from_secs_f64(seconds))
    } else {
        Err(DurationError::Seconds(seconds))
    }
}

/// `seconds` if at most [`MAX`].
pub fn within_ceiling(seconds: u64) -> Result<u64, DurationError> {
    if seconds <= MAX.as_secs() {
        Ok(seconds)
    } else {
        Err(DurationError::TooLong(seconds.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_is_read_and_nothing_past_the_ceiling_wraps() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7_200)));
        assert_eq!(parse("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("36500d"), Ok(MAX));
        // The tester's values: just past 2^64 ns, far past it, and past u64 itself.
        for long in [
            "36501d",
            "213504d",
            "100000000d",
            "99999999999999999999d",
            "18446744073709551615ms",
            "3153600000001ms",
        ] {
            assert_eq!(
                parse(long),
                Err(DurationError::TooLong(long.into())),
                "{long}"
            );
        }
        assert!(
            MAX.as_nanos() < i64::MAX as u128,
            "JetStream's max_age holds it"
        );
        for bad in ["", "s", "-5s", "1.5s", "5 s", "5sec", "5", " 5s", "5S"] {
            assert_eq!(parse(bad), Err(DurationError::Shape(bad.into())), "{bad:?}");
        }
    }

    #[test]
    fn positive_and_whole_second_readings_refuse_saying_why() {
        assert_eq!(
            parse_positive("0ms"),
            Err(DurationError::Zero("0ms".into()))
        );
        assert_eq!(parse_positive("1ms"), Ok(Duration::from_millis(1)));
        assert_eq!(parse_seconds("60"), Ok(60));
        assert_eq!(parse_seconds("5m"), Ok(300));
        assert_eq!(parse_seconds("2000ms"), Ok(2));
        assert_eq!(
            parse_seconds("1500ms"),
            Err(DurationError::NotWholeSeconds("1500ms".into()))
        );
        assert_eq!(parse_seconds("3153600000"), Ok(MAX.as_secs()));
        assert_eq!(
            parse_seconds("3153600001"),
            Err(DurationError::TooLong("3153600001".into()))
        );
        assert_eq!(
            parse_seconds("99999999999999999999"),
            Err(DurationError::TooLong("99999999999999999999".into()))
        );
        assert_eq!(from_secs_f64(1.5), Ok(Duration::from_millis(1_500)));
        assert_eq!(from_secs_f64(3_153_600_000.0), Ok(MAX));
        for bad in [-1.0, f64::NAN, f64::INFINITY, 3_153_600_000.5, 1e30] {
            let e = from_secs_f64(bad).unwrap_err().to_string();
            assert!(
                e.ends_with("is not a number of seconds from 0 to 3153600000"),
                "{e}"
            );
        }
        let e = parse_seconds("213504d").unwrap_err().to_string();
        assert_eq!(
            e,
            "`213504d` is longer than 36500d, the longest duration ax reads"
        );
    }
}
