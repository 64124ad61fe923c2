//! The NATS permissions of one namespace's business services: what `ax namespace user` prints
//! for the server's `authorization` block.
//!
//! ax's own roles check who may do what once a command reaches a Scheduler; what a business
//! service may publish and read at all is the NATS server's to enforce, before anything of
//! ax runs. A namespace is a token of its own in every subject and key that names its jobs
//! (see [`crate::ids::JobName`]), so a service user confined to `payments` is given exactly:
//!
//! - **commands**: `trigger`, `report` and `instance` (a record's read) on the subjects
//!   confined to it (`ax.control.trigger.payments`, `ax.request.trigger.payments`, and the
//!   same for the others), which the Schedulers hold to the namespace's jobs and attempts;
//! - **live messages**: its results, events, OpenLineage events and attempt logs
//!   (`ax.result.payments.*`, `ax.event.payments.*.*`, `ax.lineage.payments.*`,
//!   `ax.log.payments.>`) and answers on its own inbox prefix (`_INBOX.payments.>`);
//! - **stored messages**: consumers of its own (`payments-1` … `payments-8`) on `AX_RESULTS`,
//!   `AX_LOGS` and `AX_LINEAGE`, each created only with a filter inside the namespace (the
//!   server reads the filter from the subject `$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`);
//!   no direct reads of those streams by sequence, which would reach every namespace;
//!
//! Nothing else: no other namespace's subjects, no consumer of ax's own (`dag-results-N`,
//! `openlineage`) to list or delete, no stream to create or change. Nor the instance records:
//! the buckets are read through their leader (`allow_direct` off, see
//! [`crate::client::provision`]), by a request whose body names the key, which a subject
//! permission cannot confine; a namespace's services read their instances' records through the
//! Schedulers instead (`instance` on their subject), which find only the namespace's.

use std::fmt::Write as _;

use crate::client::provision::Layout;
use crate::ids::Namespace;

/// How many consumers of its own a namespace's services may keep on each stream they follow.
pub const OWN_CONSUMERS: u32 = 8;

/// The subjects one namespace's business services may publish and subscribe to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePermissions {
    /// The namespace.
    pub namespace: Namespace,
    /// What they may publish (commands, and JetStream's API for what they may read).
    pub publish: Vec<String>,
    /// What they may subscribe to (live messages and their inbox).
    pub subscribe: Vec<String>,
}

impl ServicePermissions {
    /// The permissions of `namespace`'s services under `layout`.
    pub fn of(layout: &Layout, namespace: &Namespace) -> Self {
        let s = &layout.subjects;
        let prefix = s.prefix();
        let mut publish = Vec::new();
        for command in ["trigger", "report", "instance"] {
            publish.push(s.control_in(command, namespace));
            publish.push(s.request_in(command, namespace));
        }
        let followed = [
            (
                layout.results_stream(),
                format!("{prefix}.result.{namespace}.>"),
            ),
            (layout.logs_stream(), format!("{prefix}.log.{namespace}.>")),
            (
                layout.lineage_stream(),
                format!("{prefix}.lineage.{namespace}.>"),
            ),
        ];
        for (stream, filter) in &followed {
            for consumer in Self::consumers_of(namespace) {
                publish.extend([
                    format!("$JS.API.CONSUMER.CREATE.{stream}.{consumer}.{filter}"),
                    format!("$JS.API.CONSUMER.INFO.{stream}.{consumer}"),
                    format!("$JS.API.CONSUMER.DELETE.{stream}.{consumer}"),
                    format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"),
                    format!("$JS.ACK.{stream}.{consumer}.>"),
                    format!("$JS.FC.{stream}.{consumer}.>"),
                ]);
            }
        }
        let subscribe = vec![
            format!("{prefix}.result.{namespace}.*"),
            format!("{prefix}.event.{namespace}.*.*"),
            format!("{prefix}.lineage.{namespace}.*"),
            format!("{prefix}.log.{namespace}.>"),
            Self::inbox_prefix_of(namespace) + ".>",
        ];
        Self {
            namespace: namespace.clone(),
            publish,
            subscribe,
        }
    }

    /// The names its consumers may have: `<namespace>-1` … `<namespace>-8`.
    pub fn consumers_of(namespace: &Namespace) -> impl Iterator<Item = String> + '_ {
        (1..=OWN_CONSUMERS).map(move |n| format!("{namespace}-{n}"))
    }

    /// The inbox prefix its connections must use (`_INBOX.<namespace>`): answers and
    /// JetStream's replies come there, and nowhere another namespace reads.
    pub fn inbox_prefix_of(namespace: &Namespace) -> String {
        format!("_INBOX.{namespace}")
    }

    /// One user of a server config's `authorization { users = [ … ] }` with these permissions,
    /// its password as it stands in the config (`"secret"` or `$PAYMENTS_NATS_PASSWORD`).
    pub fn user_block(&self, user: &str, password: &str) -> String {
        let list = |subjects: &[String]| {
            subjects
                .iter()
                .map(|s| format!("          \"{s}\""))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let mut block = String::new();
        let _ = write!(
            block,
            "    # business services of namespace {}\n    {{\n      user: {user}, password: \
             {password},\n      permissions: {{\n        publish: {{ allow: [\n{}\n        ] }}\n        \
             subscribe: {{ allow: [\n{}\n        ] }}\n      }}\n    }}\n",
            self.namespace,
            list(&self.publish),
            list(&self.subscribe),
        );
        block
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subjects::Subjects;

    fn payments() -> ServicePermissions {
        let layout = Layout::new(Subjects::default(), None);
        ServicePermissions::of(&layout, &Namespace::parse("payments").unwrap())
    }

    #[test]
    fn every_subject_names_the_namespace_as_a_whole_token_or_is_its_own_consumer() {
        let permissions = payments();
        for subject in permissions.publish.iter().chain(&permissions.subscribe) {
            let tokens: Vec<&str> = subject.split('.').collect();
            let confined =
                tokens.contains(&"payments") || tokens.iter().any(|t| t.starts_with("payments-"));
            assert!(confined, "{subject} reaches past the namespace");
        }
        // No unfiltered consumer, no read by sequence, no stream's metadata.
        assert!(!permissions
            .publish
            .iter()
            .any(|s| s == "$JS.API.CONSUMER.CREATE.AX_RESULTS"
                || s.starts_with("$JS.API.CONSUMER.DURABLE.")
                || s.starts_with("$JS.API.DIRECT.GET.AX_")
                || s.starts_with("$JS.API.STREAM.")));
    }

    #[test]
    fn the_block_lists_each_subject_quoted_under_its_user() {
        let block = payments().user_block("payments", "$PAYMENTS_NATS_PASSWORD");
        assert!(block.contains("user: payments, password: $PAYMENTS_NATS_PASSWORD,"));
        assert!(block.contains("          \"ax.control.trigger.payments\"\n"));
        assert!(block.contains("          \"_INBOX.payments.>\"\n"));
    }
}
