//! Control commands as they arrive: any payload, as MessagePack or JSON, into the request of
//! every command ([`Command::ALL`], through the one decoder the Scheduler uses), a decoded apply
//! through the spec's rules and a trigger's params and date through their checks; any
//! `Ax-Reply-To`.
#![no_main]

use ax_bus::messages::commands::{Command, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|payload: &[u8]| {
    let mut json = async_nats::HeaderMap::new();
    json.insert("Content-Type", "application/json");
    for headers in [None, Some(&json)] {
        for kind in Command::ALL {
            let Ok(request) = Request::decode(kind, headers, payload) else {
                continue;
            };
            assert_eq!(request.kind(), kind);
            match request {
                Request::Apply(apply) => {
                    let docs: Vec<_> = apply.jobs.iter().collect();
                    let _ = ax_bus::spec::check_documents(&docs, |i| format!("document {i}"));
                }
                Request::Trigger(trigger) => {
                    let _ = ax_bus::spec::params_fit(&trigger.params);
                    if let Some(date) = &trigger.biz_date {
                        let _ = ax_bus::time::parse_biz_date(date);
                    }
                }
                _ => {}
            }
        }
    }
    if let Ok(text) = std::str::from_utf8(payload) {
        let _ = ax_bus::reply_to::reply_subject(text);
    }
});
