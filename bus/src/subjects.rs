//! Subject names. Every subject ax uses is built here, so the contract lives in one place.
//!
//! Public (documented in docs/protocol.md, stable):
//! - `<prefix>.control.<command>`: job definitions and commands, consumed by Schedulers;
//! - `<prefix>.control.<command>.<namespace>`: `trigger`, `report` and `instance` confined to one
//!   namespace, for a namespace's business services (see [`Subjects::control_in`]);
//! - `<prefix>.request.<command>[.<namespace>]`: the same commands as plain NATS requests;
//! - `<prefix>.result.<job>`: one message per finished attempt;
//! - `<prefix>.event.<job>.<state>`: lifecycle events.
//!
//! A job outside `default` is named `<namespace>.<name>` ([`crate::ids::JobName`]), so its
//! namespace is a token of its own in every subject that names the job
//! (`ax.result.payments.settle`, `ax.event.payments.settle.failed`) and that names its
//! instances (`ax.log.payments.settle.<time>.<attempt>`): what a namespace's service user may
//! read is `ax.result.payments.*`, and the server refuses it the rest.
//!
//! - `<prefix>.alert.<kind>`: problems an operator should see (malformed control messages, ...);
//! - `<prefix>.log.<instance>.<attempt>`: an attempt's stdout and stderr, while it runs.
//!
//! Internal (`<prefix>.internal.>`): the hand-offs between actors.

use crate::ids::Namespace;
use crate::spec::Priority;

/// The default subject prefix.
pub const DEFAULT_PREFIX: &str = "ax";

/// Builds subject names under one prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subjects {
    prefix: String,
}

impl Default for Subjects {
    fn default() -> Self {
        Self::new(DEFAULT_PREFIX)
    }
}

impl Subjects {
    /// Subjects under `prefix` (a valid NATS token sequence such as `ax` or `team1.ax`).
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    /// The prefix, e.g. `ax`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `ax.control.<command>`.
    pub fn control(&self, command: &str) -> String {
        format!("{}.control.{command}", self.prefix)
    }

    /// `ax.control.>`: everything the Schedulers consume.
    pub fn control_all(&self) -> String {
        format!("{}.control.>", self.prefix)
    }

    /// `ax.control.<command>.<namespace>`: a command confined to one namespace — what the
    /// NATS permissions of a namespace's business services allow them to send (`trigger` and
    /// `report`); the Schedulers refuse one that names another namespace's job or attempt.
    pub fn control_in(&self, command: &str, namespace: &Namespace) -> String {
        format!("{}.control.{command}.{namespace}", self.prefix)
    }

    /// `ax.request.<command>`: the same commands for a plain NATS request, answered on its
    /// reply subject (the Schedulers queue them on the control subject).
    pub fn request(&self, command: &str) -> String {
        format!("{}.request.{command}", self.prefix)
    }

    /// `ax.request.<command>.<namespace>`: [`Subjects::control_in`] as a plain NATS request.
    pub fn request_in(&self, command: &str, namespace: &Namespace) -> String {
        format!("{}.request.{command}.{namespace}", self.prefix)
    }

    /// `ax.request.>`: what the Schedulers' front door serves.
    pub fn request_all(&self) -> String {
        format!("{}.request.>", self.prefix)
    }

    /// The control subject a request subject queues its command on: `ax.request.<tail>` on
    /// `ax.control.<tail>`; `None` for a subject that is not a request's.
    pub fn control_for_request(&self, subject: &str) -> Option<String> {
        let tail = subject
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(".request.")?;
        Some(format!("{}.control.{tail}", self.prefix))
    }

    /// The command a control subject names, and its namespace if it names one
    /// (`ax.control.trigger.payments`); the whole tail after `ax.control.` as the command, for
    /// a subject of more tokens (no command has that name: it is refused as unknown).
    pub fn command_of<'a>(&self, subject: &'a str) -> (&'a str, Option<&'a str>) {
        let tail = subject
            .strip_prefix(self.prefix.as_str())
            .and_then(|rest| rest.strip_prefix(".control."))
            .unwrap_or(subject);
        match tail.split_once('.') {
            Some((command, namespace)) if !namespace.contains('.') => (command, Some(namespace)),
            Some(_) => (tail, None),
            None => (tail, None),
        }
    }

    /// `ax.result.<job>`.
    pub fn result(&self, job: &str) -> String {
        format!("{}.result.{job}", self.prefix)
    }

    /// `ax.result.>`.
    pub fn result_all(&self) -> String {
        format!("{}.result.>", self.prefix)
    }

    /// `ax.event.<job>.<state>`.
    pub fn event(&self, job: &str, state: &str) -> String {
        format!("{}.event.{job}.{state}", self.prefix)
    }

    /// `ax.event.*.<state>` and `ax.event.*.*.<state>`: one state's events of every job, in
    /// `default` and in the other namespaces (a wildcard stands for one token).
    pub fn events_in_state(&self, state: &str) -> [String; 2] {
        [
            format!("{}.event.*.{state}", self.prefix),
            format!("{}.event.*.*.{state}", self.prefix),
        ]
    }

    /// `ax.log.<instance>.<attempt>`: the log of one attempt.
    pub fn log(&self, instance: &str, attempt: u32) -> String {
        format!("{}.log.{instance}.{attempt}", self.prefix)
    }

    /// `ax.log.>`.
    pub fn log_all(&self) -> String {
        format!("{}.log.>", self.prefix)
    }

    /// `ax.lineage.<job>`: the job's attempts as OpenLineage run events (JSON).
    pub fn lineage(&self, job: &str) -> String {
        format!("{}.lineage.{job}", self.prefix)
    }

    /// `ax.lineage.>`.
    pub fn lineage_all(&self) -> String {
        format!("{}.lineage.>", self.prefix)
    }

    /// `ax.alert.<kind>`.
    pub fn alert(&self, kind: &str) -> String {
        format!("{}.alert.{kind}", self.prefix)
    }

    /// `ax.alert.>`.
    pub fn alert_all(&self) -> String {
        format!("{}.alert.>", self.prefix)
    }

    /// `ax.audit.<kind>`: operator actions kept for the record (re-runs, backfills).
    pub fn audit(&self, kind: &str) -> String {
        format!("{}.audit.{kind}", self.prefix)
    }

    /// `ax.audit.>`.
    pub fn audit_all(&self) -> String {
        format!("{}.audit.>", self.prefix)
    }

    /// `ax.internal.tick.<job>`: what became of each cron tick.
    pub fn tick(&self, job: &str) -> String {
        format!("{}.internal.tick.{job}", self.prefix)
    }

    /// `ax.internal.tick.>`.
    pub fn tick_all(&self) -> String {
        format!("{}.internal.tick.>", self.prefix)
    }

    /// `ax.internal.cancel.<worker>`: stop an attempt running there (core NATS).
    pub fn cancel(&self, worker: &str) -> String {
        format!("{}.internal.cancel.{worker}", self.prefix)
    }

    /// `ax.internal.created.<job>`: a Scheduler created an instance (to the DagCoordinator).
    pub fn created(&self, job: &str) -> String {
        format!("{}.internal.created.{job}", self.prefix)
    }

    /// `ax.internal.created.>`.
    pub fn created_all(&self) -> String {
        format!("{}.internal.created.>", self.prefix)
    }

    /// `ax.internal.ready.<priority>`: an instance of `default` may run now (to the Router).
    pub fn ready(&self, priority: Priority) -> String {
        format!("{}.internal.ready.{}", self.prefix, priority.as_str())
    }

    /// Where an instance of a job in `namespace` that may run now goes: `default`'s
    /// `ax.internal.ready.<priority>`, any other's `ax.internal.ready.<priority>.<namespace>`
    /// — a queue per namespace, so that the Routers can take each namespace's work by its
    /// share rather than in the order it came.
    pub fn ready_in(&self, priority: Priority, namespace: &str) -> String {
        if namespace == crate::ids::DEFAULT_NAMESPACE {
            self.ready(priority)
        } else {
            format!("{}.{namespace}", self.ready(priority))
        }
    }

    /// [`Self::ready_in`] for `work`'s priority and job.
    pub fn ready_for(&self, work: &crate::messages::WorkItem) -> String {
        self.ready_in(work.spec.priority, work.spec.name.namespace())
    }

    /// The namespace whose ready queue `subject` is, if it is one of a namespace other than
    /// `default` (`ax.internal.ready.<priority>.<namespace>`).
    pub fn namespace_of_ready(&self, subject: &str) -> Option<crate::ids::Namespace> {
        let rest = subject.strip_prefix(&format!("{}.internal.ready.", self.prefix))?;
        let (_, namespace) = rest.split_once('.')?;
        crate::ids::Namespace::parse(namespace).ok()
    }

    /// `ax.internal.ready.>`.
    pub fn ready_all(&self) -> String {
        format!("{}.internal.ready.>", self.prefix)
    }

    /// `ax.internal.split.<job>`: an instance split into sub-instances (to the DagCoordinator).
    pub fn split(&self, job: &str) -> String {
        format!("{}.internal.split.{job}", self.prefix)
    }

    /// `ax.internal.split.>`.
    pub fn split_all(&self) -> String {
        format!("{}.internal.split.>", self.prefix)
    }

    /// `ax.internal.retry.<job>`: an attempt failed with a retry left (to the Schedulers).
    pub fn retry(&self, job: &str) -> String {
        format!("{}.internal.retry.{job}", self.prefix)
    }

    /// `ax.internal.retry.>`.
    pub fn retry_all(&self) -> String {
        format!("{}.internal.retry.>", self.prefix)
    }

    /// `ax.internal.dispatch.<worker>.<priority>`: one attempt for one worker.
    pub fn dispatch(&self, worker: &str, priority: Priority) -> String {
        format!(
            "{}.internal.dispatch.{worker}.{}",
            self.prefix,
            priority.as_str()
        )
    }

    /// `ax.internal.dispatch.<worker>.>`: everything sent to one worker.
    pub fn dispatch_to(&self, worker: &str) -> String {
        format!("{}.internal.dispatch.{worker}.>", self.prefix)
    }

    /// `ax.internal.ack.<router>`: workers acknowledge that Router's dispatches (core NATS).
    pub fn ack(&self, router: &str) -> String {
        format!("{}.internal.ack.{router}", self.prefix)
    }

    /// `ax.internal.dispatch.>`.
    pub fn dispatch_all(&self) -> String {
        format!("{}.internal.dispatch.>", self.prefix)
    }

    /// `ax.internal.delayed.<instance>`: the server-side schedule of a delayed trigger's
    /// instance (JetStream publishes its body on [`Subjects::due`] at its time).
    pub fn delayed(&self, instance: &str) -> String {
        format!("{}.internal.delayed.{instance}", self.prefix)
    }

    /// `ax.internal.delayed.>`.
    pub fn delayed_all(&self) -> String {
        format!("{}.internal.delayed.>", self.prefix)
    }

    /// `ax.internal.due.<job>`: a delayed instance about to be due (to the Schedulers).
    pub fn due(&self, job: &str) -> String {
        format!("{}.internal.due.{job}", self.prefix)
    }

    /// `ax.internal.due.>`.
    pub fn due_all(&self) -> String {
        format!("{}.internal.due.>", self.prefix)
    }

    /// `ax.internal.expiry.<seconds>`: the instances whose records became final, one message
    /// each, by how long they are kept (see [`crate::client::retention`]).
    pub fn expiry(&self, kept_secs: u64) -> String {
        format!("{}.internal.expiry.{kept_secs}", self.prefix)
    }

    /// `ax.internal.expiry.<mark>`: a mark in the expiry stream (not a length of retention).
    pub fn expiry_mark(&self, mark: &str) -> String {
        format!("{}.internal.expiry.{mark}", self.prefix)
    }

    /// `ax.internal.expiry.>`.
    pub fn expiry_all(&self) -> String {
        format!("{}.internal.expiry.>", self.prefix)
    }

    /// `ax.internal.clock.<node>`: a node's clock probes (see the clock guard).
    pub fn clock(&self, node: &str) -> String {
        format!("{}.internal.clock.{node}", self.prefix)
    }

    /// `ax.internal.clock.>`.
    pub fn clock_all(&self) -> String {
        format!("{}.internal.clock.>", self.prefix)
    }

    /// `ax.internal.dead.<kind>`: a dead letter (see [`crate::dead_letter`]).
    pub fn dead(&self, kind: &str) -> String {
        format!("{}.internal.dead.{kind}", self.prefix)
    }

    /// `ax.internal.dead.>`.
    pub fn dead_all(&self) -> String {
        format!("{}.internal.dead.>", self.prefix)
    }

    /// Name prefix for JetStream streams, buckets and consumers (`ax` → `AX`/`ax`), so two
    /// prefixes on one server never share storage.
    pub fn storage_tag(&self) -> String {
        self.prefix.replace('.', "_")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_subjects_follow_the_contract() {
        let s = Subjects::default();
        assert_eq!(s.control("apply"), "ax.control.apply");
        assert_eq!(s.result("hello"), "ax.result.hello");
        assert_eq!(s.event("hello", "success"), "ax.event.hello.success");
        assert_eq!(s.ready(Priority::High), "ax.internal.ready.high");
        assert_eq!(
            s.ready_in(Priority::High, "default"),
            "ax.internal.ready.high"
        );
        assert_eq!(
            s.ready_in(Priority::Low, "payments"),
            "ax.internal.ready.low.payments"
        );
        assert_eq!(
            s.namespace_of_ready("ax.internal.ready.low.payments")
                .map(|n| n.to_string()),
            Some("payments".to_string())
        );
        assert_eq!(s.namespace_of_ready("ax.internal.ready.low"), None);
        assert_eq!(Subjects::new("a.b").storage_tag(), "a_b");
    }

    #[test]
    fn a_namespace_is_a_token_of_its_own_in_every_subject_that_names_it() {
        let s = Subjects::new("team.ax");
        let payments = Namespace::parse("payments").unwrap();
        let job = crate::ids::JobName::parse("payments/settle").unwrap();
        assert_eq!(s.result(&job), "team.ax.result.payments.settle");
        assert_eq!(
            s.event(&job, "failed"),
            "team.ax.event.payments.settle.failed"
        );
        assert_eq!(
            s.control_in("trigger", &payments),
            "team.ax.control.trigger.payments"
        );
        assert_eq!(
            s.command_of("team.ax.control.trigger.payments"),
            ("trigger", Some("payments"))
        );
        assert_eq!(s.command_of("team.ax.control.apply"), ("apply", None));
        assert_eq!(s.command_of("team.ax.control.a.b.c"), ("a.b.c", None));
        assert_eq!(
            s.control_for_request(&s.request_in("report", &payments))
                .as_deref(),
            Some("team.ax.control.report.payments")
        );
        assert_eq!(s.control_for_request("team.ax.result.x"), None);
    }
}
