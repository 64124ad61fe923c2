//! A namespace's quota of waiting instances (`ax namespace set --max-waiting`): a trigger of
//! its job is refused, with the reason, while that many of its instances wait to run (the
//! messages of its ready queues), until some have run. Only triggers: a cron fire or a
//! dependency's release is owed and never refused.
//!
//! Both reads are kept a moment, so that a burst of triggers does not read the settings and
//! the queues once each: the settings for [`SETTINGS_FOR`] (the Scheduler that stores a
//! namespace's settings forgets them at once; the others see a change within that time), a
//! namespace's count for [`COUNT_FOR`], plus the triggers this Scheduler admitted since it
//! was read. Several Schedulers each count their own admissions: together they may pass the
//! quota by what each admits within one count's life.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ax_bus::ids::Namespace;
use ax_bus::messages::NamespaceSettings;

use super::CommandError;
use crate::scheduler::store::Registry;

/// How long the namespaces' settings read are used.
const SETTINGS_FOR: Duration = Duration::from_secs(2);
/// How long a namespace's count of waiting instances is used.
const COUNT_FOR: Duration = Duration::from_secs(1);

/// The quotas' reads, shared by the Scheduler's command pumps; cheap to clone.
#[derive(Clone, Debug, Default)]
pub(crate) struct Admission(Arc<Mutex<Reads>>);

#[derive(Debug, Default)]
struct Reads {
    settings: Option<(Instant, BTreeMap<Namespace, NamespaceSettings>)>,
    /// Per namespace: when counted, what waited, what was admitted since.
    counts: HashMap<String, (Instant, u64, u64)>,
}

impl Admission {
    fn reads(&self) -> MutexGuard<'_, Reads> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets the settings read: they were just changed.
    pub(crate) fn forget_settings(&self) {
        self.reads().settings = None;
    }

    /// Admits one trigger of a job of `namespace`, or refuses it for the namespace's quota of
    /// waiting instances, saying so.
    pub(crate) async fn admit(
        &self,
        store: &impl Registry,
        namespace: &str,
    ) -> Result<(), CommandError> {
        let now = Instant::now();
        let fresh = |at: Instant| now.saturating_duration_since(at) < SETTINGS_FOR;
        let cached = self
            .reads()
            .settings
            .as_ref()
            .filter(|(at, _)| fresh(*at))
            .cloned();
        let settings = match cached {
            Some((_, settings)) => settings,
            None => {
                let settings = store.namespaces().await?;
                self.reads().settings = Some((now, settings.clone()));
                settings
            }
        };
        let quota = settings
            .iter()
            .find(|(n, _)| n.as_str() == namespace)
            .and_then(|(_, s)| s.max_waiting);
        let Some(most) = quota else {
            return Ok(());
        };
        let counted = self
            .reads()
            .counts
            .get(namespace)
            .filter(|(at, _, _)| now.saturating_duration_since(*at) < COUNT_FOR)
            .copied();
        if counted.is_none() {
            let waiting = store.waiting(namespace).await?;
            self.reads()
                .counts
                .insert(namespace.to_string(), (now, waiting, 0));
        }
        let mut reads = self.reads();
        let Some((_, waiting, admitted)) = reads.counts.get_mut(namespace) else {
            return Ok(());
        };
        if *waiting + *admitted >= u64::from(most) {
            return Err(CommandError::refused(format!(
                "namespace {namespace} has {} instances waiting to run, its quota (`ax namespace \
                 set {namespace} --max-waiting`): not triggered; trigger again once some have run",
                *waiting + *admitted
            )));
        }
        *admitted += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::store::memory::Jobs;

    #[tokio::test]
    async fn triggers_past_a_namespaces_quota_of_waiting_instances_are_refused_naming_it() {
        let store = Jobs::default();
        let quota = NamespaceSettings {
            max_waiting: Some(3),
            ..NamespaceSettings::default()
        };
        store
            .namespaces
            .lock()
            .unwrap()
            .insert(Namespace::parse("a").unwrap(), quota);
        store.waiting.lock().unwrap().insert("a".into(), 1);
        let admission = Admission::default();
        // One waits; two more are admitted, counted before the queues say so.
        admission.admit(&store, "a").await.expect("the second");
        admission.admit(&store, "a").await.expect("the third");
        let refused = format!("{:?}", admission.admit(&store, "a").await.unwrap_err());
        assert!(
            refused.contains("namespace a has 3 instances waiting to run, its quota"),
            "{refused}"
        );
        // Settings changed here are seen at once.
        store.namespaces.lock().unwrap().clear();
        admission.forget_settings();
        admission
            .admit(&store, "a")
            .await
            .expect("no quota any more");
        // A namespace without the quota, or `default`, takes any number.
        for _ in 0..10 {
            admission.admit(&store, "b").await.expect("no quota");
            admission.admit(&store, "default").await.expect("no quota");
        }
    }
}
