//! Which namespaces a command touches, for the caller check and the audit: a token holds roles in every
//! namespace, in single ones, or both (see [`ax_bus::auth::Principal`]), and a command is
//! allowed only where it holds the role the command needs.
//!
//! A command naming jobs touches their namespaces; one naming an instance or an attempt, its
//! job's (read from its record, which is the authority: an id is only text). What reaches
//! across namespaces — queues, dead letters, tokens, a whole business date's re-run — touches
//! every namespace and needs the role everywhere. Approvals are checked against each one's plan
//! where they are listed and decided (`approvals`). A re-run's plan that
//! crosses into other namespaces is checked step by step where the plan is made (see
//! `rerun`).

use std::collections::BTreeSet;

use ax_bus::client::reports::ReportState;
use ax_bus::ids::InstanceId;
use ax_bus::messages::commands::Request;

use crate::scheduler::store::{Instances, Reports};
use crate::ActorError;

/// Where a command acts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Across namespaces.
    Everywhere,
    /// Within these namespaces (none: it names nothing that exists, and is refused as unknown
    /// when carried out).
    In(BTreeSet<String>),
}

impl Scope {
    /// The namespaces it is confined to, as the audit records them (none: everywhere).
    pub(crate) fn namespaces(&self) -> Vec<String> {
        match self {
            Scope::Everywhere => Vec::new(),
            Scope::In(namespaces) => namespaces.iter().cloned().collect(),
        }
    }

    fn of_names<'a>(names: impl IntoIterator<Item = &'a ax_bus::ids::JobName>) -> Self {
        Scope::In(
            names
                .into_iter()
                .map(|name| name.namespace().to_string())
                .collect(),
        )
    }
}

/// Where `request` acts.
pub(crate) async fn of(
    store: &(impl Instances + Reports),
    request: &Request,
) -> Result<Scope, ActorError> {
    Ok(match request {
        Request::Apply(apply) => Scope::of_names(apply.jobs.iter().map(|d| &d.job.name)),
        Request::Delete(r) | Request::Pause(r) | Request::Resume(r) => Scope::of_names([&r.name]),
        Request::Trigger(r) => Scope::of_names([&r.name]),
        Request::Backfill(r) => Scope::of_names([&r.job]),
        Request::Rerun(r) => match (&r.instance, &r.root) {
            (Some(instance), _) => of_instance(store, instance).await?,
            (None, Some(root)) => Scope::of_names([root]),
            (None, None) => Scope::Everywhere,
        },
        Request::Cancel(r) | Request::Kill(r) => of_instance(store, &r.instance).await?,
        Request::Mark(r) => of_instance(store, &r.instance).await?,
        Request::Instance(r) => of_instance(store, &r.instance).await?,
        Request::Report(r) => match store.report_state(&r.trace_id).await? {
            Some(ReportState::Waiting { instance_id, .. }) => {
                of_instance(store, &instance_id).await?
            }
            _ => Scope::In(BTreeSet::new()),
        },
        // Checked against each approval's plan where they are listed or decided.
        Request::Approval(_) => Scope::In(BTreeSet::new()),
        Request::Queue(_) | Request::Replay(_) | Request::Auth(_) | Request::Namespace(_) => {
            Scope::Everywhere
        }
    })
}

async fn of_instance(store: &impl Instances, id: &InstanceId) -> Result<Scope, ActorError> {
    Ok(match store.record(id).await? {
        Some(record) => Scope::of_names([&record.job]),
        None => Scope::In(BTreeSet::new()),
    })
}
