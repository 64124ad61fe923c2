//! Cron expressions: any text parsed, and a parsed one evaluated in a zone from any instant.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (&str, u8, i64)| {
    let (text, zone, at) = input;
    let zones = [
        "UTC",
        "America/New_York",
        "Australia/Lord_Howe",
        "America/Santiago",
        "Asia/Kolkata",
    ];
    let zone = zones[usize::from(zone) % zones.len()];
    if let Ok(schedule) = ax_actors::FireSchedule::new(text, zone) {
        if let Some(after) = chrono::DateTime::from_timestamp_millis(at % 8_000_000_000_000) {
            let mut cursor = after;
            for _ in 0..3 {
                match schedule.next_after(cursor) {
                    Some(next) => cursor = next,
                    None => break,
                }
            }
        }
    }
});
