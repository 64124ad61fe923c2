//! What the actors' unit tests build their cases from, in one place.

use ax_bus::spec::JobSpec;

/// A shell job `name` (running `true`), with a cron if given, depending on each `(job,
/// biz_date)` of `deps`.
pub(crate) fn spec(name: &str, cron: Option<&str>, deps: &[(&str, &str)]) -> JobSpec {
    let mut value = serde_json::json!({
        "name": name,
        "exec": {"type": "shell", "command": "true"},
        "deps": deps.iter().map(|(n, d)| serde_json::json!({"name": n, "biz_date": d})).collect::<Vec<_>>(),
    });
    if let Some(cron) = cron {
        value["cron"] = cron.into();
    }
    serde_json::from_value(value).unwrap()
}

/// An instance of `spec` for business date `biz_date` that ended `state` (attempt 1).
pub(crate) fn ended(
    spec: &JobSpec,
    biz_date: &str,
    state: ax_bus::State,
) -> ax_bus::InstanceRecord {
    let now = ax_bus::time::now();
    let mut record = ax_bus::InstanceRecord::first(
        spec,
        now,
        biz_date.into(),
        Default::default(),
        ax_bus::instance::Trigger::Manual,
        now,
    );
    record.state = state;
    record
}
