//! The registry check of a dispatch's definition (see [`ax_bus::client::registered`]), with a
//! one-second memory: a burst of attempts of one job costs one read of the registry, not one
//! per attempt. So a job deleted or edited may still start with its old definition on this
//! worker for up to [`FRESH`] after the change — the same as a dispatch already in flight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ax_bus::ids::JobName;
use ax_bus::spec::JobSpec;
use ax_bus::{AxClient, ClientError};

/// How long a definition found in the registry is taken as still there.
pub(super) const FRESH: Duration = Duration::from_secs(1);
/// Past this many remembered jobs, the stale ones are forgotten.
const KEEP: usize = 4096;

/// The definitions this worker found in the registry in the last [`FRESH`]; cheap to clone.
#[derive(Clone, Debug, Default)]
pub(super) struct Registered {
    found: Arc<Mutex<HashMap<JobName, (JobSpec, Instant)>>>,
}

impl Registered {
    /// Whether `spec` is a valid revision of its job that the registry holds.
    pub(super) async fn check(
        &self,
        client: &AxClient,
        spec: &JobSpec,
    ) -> Result<bool, ClientError> {
        if self.recently(spec, Instant::now()) {
            return Ok(true);
        }
        let registered = client.is_registered(spec).await?;
        if registered {
            self.remember(spec, Instant::now());
        }
        Ok(registered)
    }

    fn recently(&self, spec: &JobSpec, now: Instant) -> bool {
        let found = self.found.lock().unwrap_or_else(|e| e.into_inner());
        found
            .get(&spec.name)
            .is_some_and(|(known, at)| now.duration_since(*at) < FRESH && known == spec)
    }

    fn remember(&self, spec: &JobSpec, now: Instant) {
        let mut found = self.found.lock().unwrap_or_else(|e| e.into_inner());
        if found.len() >= KEEP {
            found.retain(|_, (_, at)| now.duration_since(*at) < FRESH);
        }
        found.insert(spec.name.clone(), (spec.clone(), now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, command: &str) -> JobSpec {
        let doc: ax_bus::spec::JobDocument = serde_json::from_value(serde_json::json!({
            "version": "v1",
            "job": {"name": name, "exec": {"type": "shell", "command": command}}
        }))
        .unwrap();
        doc.job
    }

    #[test]
    fn a_definition_is_remembered_only_as_it_was_and_only_briefly() {
        let registered = Registered::default();
        let start = Instant::now();
        let job = spec("a", "true");
        assert!(!registered.recently(&job, start));
        registered.remember(&job, start);
        assert!(registered.recently(&job, start + FRESH / 2));
        // Another definition under the same name is not vouched for by the first.
        assert!(!registered.recently(&spec("a", "rm -rf /"), start));
        assert!(!registered.recently(&job, start + FRESH));
    }

    #[test]
    fn stale_entries_go_when_the_memory_is_full() {
        let registered = Registered::default();
        let start = Instant::now();
        for i in 0..KEEP {
            registered.remember(&spec(&format!("j{i}"), "true"), start);
        }
        registered.remember(&spec("last", "true"), start + FRESH);
        let found = registered.found.lock().unwrap();
        assert_eq!(found.len(), 1);
        assert!(found.contains_key(&JobName::parse("last").unwrap()));
    }
}
