//! Time as ax writes it: UTC instants with millisecond precision, RFC 3339 on the wire.

use chrono::{DateTime, SubsecRound, TimeZone, Utc};

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
