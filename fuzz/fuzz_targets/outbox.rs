//! The worker's outbox file as a crash, a bad disk or a hostile hand could leave it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    ax_actors::fuzz::outbox(bytes);
});
