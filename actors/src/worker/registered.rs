//! The registry check of a dispatch's definition (see [`ax_bus::client::registered`]), with a
//! memory, so that attempts of a job that fires again and again cost no read of the registry.
//!
//! A definition found in the registry is vouched for until its job changes: each worker follows
//! the registry's changes (a watch from now on, not its contents) and forgets a job as soon as
//! a change of it arrives. While that watch is not running (not opened yet, broken, being
//! opened again — changes may be missed then), a definition is vouched for only [`FRESH`] after
//! it was read, and what was remembered before the watch (re)opened is no longer trusted; a
//! definition read while a change of any job arrived is not trusted either. So a job deleted or
//! edited may still start with its old definition on this worker for as long as the change
//! takes to reach it (milliseconds; up to [`FRESH`] without the watch) — as a dispatch already
//! in flight does. [`TRUSTED_FOR`] bounds even a trusted entry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;

use ax_bus::ids::JobName;
use ax_bus::spec::JobSpec;
use ax_bus::{AxClient, ClientError};

/// How long a definition found in the registry is taken as still there when no watch of the
/// registry's changes vouches for it.
pub(super) const FRESH: Duration = Duration::from_secs(1);
/// The longest a definition is vouched for without reading the registry again.
const TRUSTED_FOR: Duration = Duration::from_secs(600);
/// Past this many remembered jobs, the expired ones are forgotten (then all, if none expired).
const KEEP: usize = 16_384;
/// How long a broken watch waits before it is opened again.
const REOPEN_AFTER: Duration = Duration::from_secs(1);
/// How often the watch looks whether its worker is still there.
const LOOK_EVERY: Duration = Duration::from_secs(5);

/// One definition found in the registry.
#[derive(Debug)]
struct Found {
    spec: JobSpec,
    at: Instant,
    /// Read while the watch ran and no change arrived meanwhile: vouched for until a change.
    trusted: bool,
}

#[derive(Debug, Default)]
struct Memory {
    found: HashMap<JobName, Found>,
    /// Grows with every change seen and every (re)opening of the watch.
    changes: u64,
    /// Whether the watch of the registry's changes runs.
    watching: bool,
}

impl Memory {
    fn vouches(&self, spec: &JobSpec, now: Instant) -> bool {
        self.found.get(&spec.name).is_some_and(|found| {
            let age = now.duration_since(found.at);
            found.spec == *spec
                && (age < FRESH || (found.trusted && self.watching && age < TRUSTED_FOR))
        })
    }

    fn remember(&mut self, spec: &JobSpec, at: Instant, changes_before: u64) {
        if self.found.len() >= KEEP {
            let watching = self.watching;
            self.found.retain(|_, found| {
                let age = at.duration_since(found.at);
                age < FRESH || (found.trusted && watching && age < TRUSTED_FOR)
            });
            if self.found.len() >= KEEP {
                self.found.clear();
            }
        }
        let trusted = self.watching && self.changes == changes_before;
        let found = Found {
            spec: spec.clone(),
            at,
            trusted,
        };
        self.found.insert(spec.name.clone(), found);
    }

    fn changed(&mut self, job: &str) {
        self.changes += 1;
        self.found.remove(job);
    }

    fn watching(&mut self, watching: bool) {
        self.watching = watching;
        self.changes += 1;
        self.found.values_mut().for_each(|f| f.trusted = false);
    }
}

/// The definitions this worker found in the registry; cheap to clone.
#[derive(Clone, Debug, Default)]
pub(super) struct Registered {
    memory: Arc<Mutex<Memory>>,
}

impl Registered {
    fn memory(&self) -> MutexGuard<'_, Memory> {
        lock(&self.memory)
    }

    /// Whether `spec` is a valid revision of its job that the registry holds.
    pub(super) async fn check(
        &self,
        client: &AxClient,
        spec: &JobSpec,
    ) -> Result<bool, ClientError> {
        let now = Instant::now();
        let changes = {
            let memory = self.memory();
            if memory.vouches(spec, now) {
                return Ok(true);
            }
            memory.changes
        };
        let registered = client.is_registered(spec).await?;
        if registered {
            self.memory().remember(spec, now, changes);
        }
        Ok(registered)
    }

    /// Starts following the registry's changes, for as long as this memory is used.
    pub(super) fn follow(&self, client: AxClient) {
        tokio::spawn(follow(Arc::downgrade(&self.memory), client));
    }
}

fn lock(memory: &Arc<Mutex<Memory>>) -> MutexGuard<'_, Memory> {
    memory.lock().unwrap_or_else(|e| e.into_inner())
}

/// Forgets each job as its change arrives; opens the watch again when it breaks.
async fn follow(memory: Weak<Mutex<Memory>>, client: AxClient) {
    loop {
        let watch = client.jobs.watch_all().await;
        let Some(strong) = memory.upgrade() else {
            return;
        };
        match watch {
            Ok(mut watch) => {
                lock(&strong).watching(true);
                drop(strong);
                let mut look = tokio::time::interval(LOOK_EVERY);
                loop {
                    tokio::select! {
                        entry = watch.next() => match entry {
                            Some(Ok(entry)) => match memory.upgrade() {
                                Some(strong) => lock(&strong).changed(&entry.key),
                                None => return,
                            },
                            Some(Err(e)) => {
                                tracing::warn!(error = %e, "the registry watch broke; definitions are read again each second until it is back");
                                break;
                            }
                            None => break,
                        },
                        _ = look.tick() => if memory.strong_count() == 0 {
                            return;
                        },
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch the registry; definitions are read again each second");
            }
        }
        match memory.upgrade() {
            Some(strong) => lock(&strong).watching(false),
            None => return,
        }
        tokio::time::sleep(REOPEN_AFTER).await;
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
    fn without_the_watch_a_definition_is_remembered_only_as_it_was_and_only_briefly() {
        let mut memory = Memory::default();
        let start = Instant::now();
        let job = spec("a", "true");
        assert!(!memory.vouches(&job, start));
        memory.remember(&job, start, memory.changes);
        assert!(memory.vouches(&job, start + FRESH / 2));
        // Another definition under the same name is not vouched for by the first.
        assert!(!memory.vouches(&spec("a", "rm -rf /"), start));
        assert!(!memory.vouches(&job, start + FRESH));
    }

    #[test]
    fn with_the_watch_a_definition_is_vouched_for_until_its_job_changes() {
        let mut memory = Memory::default();
        memory.watching(true);
        let start = Instant::now();
        let (a, b) = (spec("a", "true"), spec("b", "true"));
        memory.remember(&a, start, memory.changes);
        memory.remember(&b, start, memory.changes);
        let later = start + Duration::from_secs(60);
        assert!(memory.vouches(&a, later) && memory.vouches(&b, later));
        assert!(!memory.vouches(&spec("a", "rm -rf /"), later));
        memory.changed("a");
        assert!(!memory.vouches(&a, later), "a changed");
        assert!(memory.vouches(&b, later), "b did not");
        assert!(!memory.vouches(&b, start + TRUSTED_FOR));
    }

    #[test]
    fn a_definition_read_while_a_change_arrived_or_before_the_watch_is_not_trusted() {
        let mut memory = Memory::default();
        let start = Instant::now();
        let later = start + Duration::from_secs(60);
        // Read before the watch opened: the change may have come before it.
        let old = spec("old", "true");
        memory.remember(&old, start, memory.changes);
        memory.watching(true);
        assert!(!memory.vouches(&old, later));
        // Read while a change (of any job) arrived: the read may predate it.
        let raced = spec("raced", "true");
        let before = memory.changes;
        memory.changed("other");
        memory.remember(&raced, start, before);
        assert!(memory.vouches(&raced, start));
        assert!(!memory.vouches(&raced, later));
        // The watch broke: nothing trusted any more, even once it is back.
        let fine = spec("fine", "true");
        memory.remember(&fine, start, memory.changes);
        assert!(memory.vouches(&fine, later));
        memory.watching(false);
        assert!(!memory.vouches(&fine, later));
        memory.watching(true);
        assert!(!memory.vouches(&fine, later));
    }

    #[test]
    fn expired_entries_go_when_the_memory_is_full() {
        let mut memory = Memory::default();
        let start = Instant::now();
        for i in 0..KEEP {
            memory.remember(&spec(&format!("j{i}"), "true"), start, memory.changes);
        }
        memory.remember(&spec("last", "true"), start + FRESH, memory.changes);
        assert_eq!(memory.found.len(), 1);
        assert!(memory.found.contains_key(&JobName::parse("last").unwrap()));
    }
}
