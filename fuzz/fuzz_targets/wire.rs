//! Messages between the actors and in the buckets: any bytes into every wire type, and a
//! registry value through the checks every reader makes.
#![no_main]

use ax_bus::messages::{
    Alert, DispatchAck, JobRecord, ResultMessage, SplitPlan, StoredRecord, TickRecord, Waiting,
    WorkItem, WorkerInfo,
};
use ax_bus::InstanceRecord;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|payload: &[u8]| {
    let _ = JobRecord::from_registry(payload);
    let _ = ax_bus::codec::decode::<WorkItem>(payload);
    let _ = ax_bus::codec::decode::<ResultMessage>(payload);
    let _ = ax_bus::codec::decode::<InstanceRecord>(payload);
    let _ = ax_bus::codec::decode::<StoredRecord>(payload);
    let _ = ax_bus::codec::decode::<SplitPlan>(payload);
    let _ = ax_bus::codec::decode::<DispatchAck>(payload);
    let _ = ax_bus::codec::decode::<TickRecord>(payload);
    let _ = ax_bus::codec::decode::<Waiting>(payload);
    let _ = ax_bus::codec::decode::<Alert>(payload);
    let _ = ax_bus::codec::decode::<WorkerInfo>(payload);
    if let Ok(work) = ax_bus::codec::decode::<WorkItem>(payload) {
        // What a worker does first with a dispatch.
        let _ = ax_bus::spec::validate_spec(&work.spec);
        if let Some(retry) = &work.spec.retry {
            let _ =
                retry.next_attempt_at(work.attempt, work.trace_id.as_str(), ax_bus::time::now());
        }
    }
});
