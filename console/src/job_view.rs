//! A job as readers see it — `ax job list`, the API's job list and the console's pages: its next
//! fire, and its summary with the secrets of its spec redacted (as `ax job get` prints it; a
//! listing ends up in terminals and tickets as much as a get does).

use ax_actors::FireSchedule;
use ax_bus::messages::JobRecord;
use ax_bus::spec::{self, JobSpec};

/// The next fire of a job that fires on a cron and is not paused.
pub fn next_fire(spec: &JobSpec, paused: bool) -> Option<chrono::DateTime<chrono::Utc>> {
    if paused {
        return None;
    }
    FireSchedule::new(spec.cron.as_deref()?, &spec.timezone)
        .ok()?
        .next_after(chrono::Utc::now())
}

/// `{name, paused, updated_at, next_fire, spec}`, the spec redacted.
pub fn summary(job: &JobRecord) -> serde_json::Value {
    serde_json::json!({
        "name": job.spec.name,
        "paused": job.paused,
        "updated_at": job.updated_at,
        "next_fire": next_fire(&job.spec, job.paused),
        "spec": spec::redact::spec(&job.spec),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_never_shows_a_secret_and_a_paused_job_has_no_next_fire() {
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "name": "call", "cron": "0 2 * * *", "timezone": "UTC",
            "exec": {"type": "http", "url": "https://etl:s3cret@api.example.com/",
                     "headers": {"Authorization": "Bearer abc"}},
        }))
        .unwrap();
        let record = JobRecord {
            spec,
            paused: false,
            updated_at: chrono::Utc::now(),
            defined_at: None,
        };
        let text = summary(&record).to_string();
        assert!(
            !text.contains("s3cret") && !text.contains("Bearer abc"),
            "{text}"
        );
        assert!(summary(&record)["next_fire"].is_string());
        let paused = JobRecord {
            paused: true,
            ..record
        };
        assert!(summary(&paused)["next_fire"].is_null());
    }
}
