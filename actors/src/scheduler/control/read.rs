//! `instance`: one instance's record, read for the caller. A namespace's services cannot read
//! the instance buckets themselves (a bucket's read names its key in the request's body, which
//! no subject permission confines), so they ask the Schedulers on their own subject
//! (`ax.request.instance.<namespace>`), which find only the namespace's instances.

use ax_bus::ids::Namespace;
use ax_bus::messages::typed::Read;
use ax_bus::messages::ReadRequest;

use super::CommandError;
use crate::scheduler::store::Instances;

/// The record of `request`'s instance; one of another namespace than the subject's
/// `namespace` is told unknown, as one that does not exist.
pub(super) async fn instance(
    store: &impl Instances,
    request: &ReadRequest,
    namespace: Option<&Namespace>,
) -> Result<Read, CommandError> {
    let unknown = || CommandError::refused(format!("unknown instance `{}`", request.instance));
    let record = store.record(&request.instance).await?.ok_or_else(unknown)?;
    if namespace.is_some_and(|ns| record.job.namespace() != ns.as_str()) {
        return Err(unknown());
    }
    Ok(Read {
        message: format!("{} is {}", record.instance_id, record.state.as_str()),
        record: Box::new(record),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::store::memory::Memory;

    #[tokio::test]
    async fn a_namespaces_subject_finds_only_its_instances() {
        let now = ax_bus::time::now();
        let record = ax_bus::InstanceRecord::first(
            &crate::test_fixtures::spec("a.hello", None, &[]),
            now,
            "2026-12-07".into(),
            Default::default(),
            ax_bus::instance::Trigger::Manual,
            now,
        );
        let store = Memory::with([record.clone()]);
        let request = ReadRequest {
            instance: record.instance_id.clone(),
        };
        let read = instance(&store, &request, None).await.expect("read");
        assert_eq!(read.record.instance_id, record.instance_id);
        let own = Namespace::parse("a").unwrap();
        assert!(instance(&store, &request, Some(&own)).await.is_ok());
        // Another namespace's instance reads as one that does not exist.
        let other = Namespace::parse("b").unwrap();
        let refused = format!(
            "{:?}",
            instance(&store, &request, Some(&other)).await.unwrap_err()
        );
        let missing = ReadRequest {
            instance: "a.hello.20261207T000000Z-9".parse().unwrap(),
        };
        let unknown = format!("{:?}", instance(&store, &missing, None).await.unwrap_err());
        assert!(refused.contains("unknown instance `a.hello."), "{refused}");
        assert!(
            unknown.contains("unknown instance `a.hello.20261207T000000Z-9`"),
            "{unknown}"
        );
    }
}
