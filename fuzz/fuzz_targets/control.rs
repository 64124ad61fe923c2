//! Control commands as they arrive: any payload, as MessagePack or JSON, into every request
//! type, and a decoded apply through the spec's rules; any `Ax-Reply-To`.
#![no_main]

use ax_bus::messages::{
    ApplyRequest, BackfillRequest, JobNameRequest, QueueRequest, RerunRequest, TriggerRequest,
};
use libfuzzer_sys::fuzz_target;

fn both<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Vec<T> {
    let mut decoded = Vec::new();
    if let Ok(v) = ax_bus::codec::decode::<T>(payload) {
        decoded.push(v);
    }
    if let Ok(v) = serde_json::from_slice::<T>(payload) {
        decoded.push(v);
    }
    decoded
}

fuzz_target!(|payload: &[u8]| {
    for apply in both::<ApplyRequest>(payload) {
        let docs: Vec<_> = apply.jobs.iter().collect();
        let _ = ax_bus::spec::check_documents(&docs, |i| format!("document {i}"));
    }
    for trigger in both::<TriggerRequest>(payload) {
        let _ = ax_bus::spec::params_fit(&trigger.params);
        if let Some(date) = &trigger.biz_date {
            let _ = ax_bus::time::parse_biz_date(date);
        }
    }
    let _ = both::<JobNameRequest>(payload);
    let _ = both::<QueueRequest>(payload);
    let _ = both::<RerunRequest>(payload);
    let _ = both::<BackfillRequest>(payload);
    if let Ok(text) = std::str::from_utf8(payload) {
        let _ = ax_bus::reply_to::reply_subject(text);
    }
});
