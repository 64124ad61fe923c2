//! `namespace`: store or remove a namespace's settings — its weight in the fair share of the
//! workers' free slots (read by every Router from the queues bucket) and its quota of jobs
//! (read by `apply`). A global admin's command: a team that could raise its own weight would
//! take the others' share.

use ax_bus::messages::typed::Done;
use ax_bus::messages::NamespaceRequest;

use super::CommandError;
use crate::scheduler::store::Registry;

/// Stores or removes the settings `request` names; settings out of range are refused with the
/// reason, and nothing is written.
pub(super) async fn set(
    registry: &impl Registry,
    request: &NamespaceRequest,
) -> Result<Done, CommandError> {
    let namespace = &request.namespace;
    if let Some(why) = request.settings.as_ref().and_then(|s| s.invalid()) {
        return Err(CommandError::refused(format!(
            "namespace {namespace}: {why}"
        )));
    }
    registry
        .set_namespace(namespace, request.settings.as_ref())
        .await?;
    let message = match &request.settings {
        Some(s) => {
            let jobs = s.max_jobs.map_or_else(
                || "no quota of jobs".to_string(),
                |n| format!("at most {n} jobs"),
            );
            let running = s.max_running.map_or_else(
                || "no quota of running attempts".to_string(),
                |n| format!("at most {n} attempts running"),
            );
            let waiting = s.max_waiting.map_or_else(
                || "no quota of waiting instances".to_string(),
                |n| format!("at most {n} instances waiting"),
            );
            format!(
                "namespace {namespace}: weight {}, {jobs}, {running}, {waiting}",
                s.weight
            )
        }
        None => format!("namespace {namespace}: settings removed (weight 1, no quota)"),
    };
    Ok(Done {
        message,
        ..Done::default()
    })
}

/// Why applying `applied` (job names, each once) over `registered` would take a namespace past
/// its quota of jobs, one line per namespace over it.
pub(super) fn over_quota<'a>(
    applied: impl IntoIterator<Item = &'a ax_bus::ids::JobName>,
    registered: &std::collections::BTreeSet<&ax_bus::ids::JobName>,
    settings: &std::collections::BTreeMap<
        ax_bus::ids::Namespace,
        ax_bus::messages::NamespaceSettings,
    >,
) -> Vec<String> {
    use std::collections::BTreeMap;
    let mut new: BTreeMap<&str, usize> = BTreeMap::new();
    for name in applied {
        if !registered.contains(name) {
            *new.entry(name.namespace()).or_default() += 1;
        }
    }
    let mut errors = Vec::new();
    for (namespace, added) in new {
        let quota = settings.iter().find(|(n, _)| n.as_str() == namespace);
        let Some(most) = quota.and_then(|(_, s)| s.max_jobs) else {
            continue;
        };
        let held = registered
            .iter()
            .filter(|name| name.namespace() == namespace)
            .count();
        if held + added > most as usize {
            errors.push(format!(
                "namespace {namespace} may hold at most {most} jobs (its quota, `ax namespace \
                 set {namespace} --max-jobs`): it holds {held}, and this apply adds {added}"
            ));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use ax_bus::ids::{JobName, Namespace};
    use ax_bus::messages::NamespaceSettings;

    use super::*;
    use crate::scheduler::store::memory::Jobs;

    fn names(list: &[&str]) -> Vec<JobName> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn an_apply_past_a_namespaces_quota_of_jobs_is_refused_naming_it() {
        let a = Namespace::parse("a").unwrap();
        let settings = BTreeMap::from([(
            a.clone(),
            NamespaceSettings {
                max_jobs: Some(2),
                ..NamespaceSettings::default()
            },
        )]);
        let held = names(&["a.one", "x"]);
        let registered: BTreeSet<&JobName> = held.iter().collect();
        // A change of a held job and one new job fit.
        assert!(over_quota(&names(&["a.one", "a.two"]), &registered, &settings).is_empty());
        // Two new ones do not; a namespace without a quota takes any number.
        let errors = over_quota(
            &names(&["a.two", "a.three", "y", "z"]),
            &registered,
            &settings,
        );
        assert_eq!(
            errors,
            ["namespace a may hold at most 2 jobs (its quota, `ax namespace set a --max-jobs`): \
              it holds 1, and this apply adds 2"]
        );
    }

    #[tokio::test]
    async fn settings_out_of_range_are_refused_and_nothing_is_stored() {
        let registry = Jobs::default();
        let request = |weight| NamespaceRequest {
            namespace: Namespace::parse("a").unwrap(),
            settings: Some(NamespaceSettings {
                weight,
                ..NamespaceSettings::default()
            }),
        };
        let why = format!("{:?}", set(&registry, &request(0)).await.unwrap_err());
        assert!(
            why.contains("namespace a: weight 0 is out of range"),
            "{why}"
        );
        assert!(set(&registry, &request(1001)).await.is_err());
        assert!(registry.namespaces.lock().unwrap().is_empty());
        let done = set(&registry, &request(2)).await.unwrap();
        assert_eq!(
            done.message,
            "namespace a: weight 2, no quota of jobs, no quota of running attempts, no quota \
             of waiting instances"
        );
        let mut none_running = request(2);
        if let Some(s) = none_running.settings.as_mut() {
            s.max_running = Some(0);
        }
        assert!(set(&registry, &none_running).await.is_err());
        assert_eq!(registry.namespaces.lock().unwrap().len(), 1);
        let removed = NamespaceRequest {
            settings: None,
            ..request(2)
        };
        set(&registry, &removed).await.unwrap();
        assert!(registry.namespaces.lock().unwrap().is_empty());
    }
}
