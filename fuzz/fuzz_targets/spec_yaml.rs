//! Job files: any text through the YAML parser and every rule of the spec.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(jobs) = ax_bus::spec::yaml::parse_str("fuzz.yaml", text) {
        for job in &jobs {
            let _ = ax_bus::spec::validate(&job.doc);
            let _ = ax_bus::spec::warnings(&job.doc);
            let _ = ax_bus::spec::redact::spec(&job.doc.job);
        }
    }
});
