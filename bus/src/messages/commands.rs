//! Control command names (the last token of `ax.control.<command>`).

/// Create or update jobs.
pub const APPLY: &str = "apply";
/// Delete a job.
pub const DELETE: &str = "delete";
/// Stop firing a job.
pub const PAUSE: &str = "pause";
/// Fire a paused job again.
pub const RESUME: &str = "resume";
/// Run one instance now.
pub const TRIGGER: &str = "trigger";
/// Re-run instances.
pub const RERUN: &str = "rerun";
/// Create instances for past dates.
pub const BACKFILL: &str = "backfill";
/// Pause or resume a priority's queue.
pub const QUEUE: &str = "queue";
/// End a waiting instance `cancelled`.
pub const CANCEL: &str = "cancel";
/// Stop a running attempt; the instance ends `failed`.
pub const KILL: &str = "kill";
/// An operator's verdict: the instance ends `success` or `failed`.
pub const MARK: &str = "mark";
/// Submit a dead letter again.
pub const REPLAY: &str = "replay";
/// List, approve or reject re-runs waiting for a second person.
pub const APPROVAL: &str = "approval";
/// Make, list or revoke API tokens.
pub const AUTH: &str = "auth";
/// The business's report of an attempt whose endpoint answered `202 Accepted`.
pub const REPORT: &str = "report";
/// Store or remove a namespace's settings (weight, quotas).
pub const NAMESPACE: &str = "namespace";
/// Read one instance's record (what a namespace's services read it through).
pub const INSTANCE: &str = "instance";
/// Every command, as `ax.control.<command>` names it.
pub const ALL: [&str; 17] = [
    APPLY, DELETE, PAUSE, RESUME, TRIGGER, RERUN, BACKFILL, QUEUE, CANCEL, KILL, MARK, REPLAY,
    APPROVAL, AUTH, REPORT, NAMESPACE, INSTANCE,
];

/// A control command by kind, one variant per `ax.control.<command>`. Matched exhaustively
/// where a command's treatment is decided — the role it needs
/// ([`crate::auth::role_of`]), the Scheduler's dispatch — so that a new command cannot be
/// added without deciding each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Command {
    /// [`APPLY`].
    Apply,
    /// [`DELETE`].
    Delete,
    /// [`PAUSE`].
    Pause,
    /// [`RESUME`].
    Resume,
    /// [`TRIGGER`].
    Trigger,
    /// [`RERUN`].
    Rerun,
    /// [`BACKFILL`].
    Backfill,
    /// [`QUEUE`].
    Queue,
    /// [`CANCEL`].
    Cancel,
    /// [`KILL`].
    Kill,
    /// [`MARK`].
    Mark,
    /// [`REPLAY`].
    Replay,
    /// [`APPROVAL`].
    Approval,
    /// [`AUTH`].
    Auth,
    /// [`REPORT`].
    Report,
    /// [`NAMESPACE`].
    Namespace,
    /// [`INSTANCE`].
    Instance,
}

impl Command {
    /// Every command.
    pub const ALL: [Command; 17] = [
        Command::Apply,
        Command::Delete,
        Command::Pause,
        Command::Resume,
        Command::Trigger,
        Command::Rerun,
        Command::Backfill,
        Command::Queue,
        Command::Cancel,
        Command::Kill,
        Command::Mark,
        Command::Replay,
        Command::Approval,
        Command::Auth,
        Command::Report,
        Command::Namespace,
        Command::Instance,
    ];

    /// Its name, the last token of its subject.
    pub const fn name(self) -> &'static str {
        match self {
            Command::Apply => APPLY,
            Command::Delete => DELETE,
            Command::Pause => PAUSE,
            Command::Resume => RESUME,
            Command::Trigger => TRIGGER,
            Command::Rerun => RERUN,
            Command::Backfill => BACKFILL,
            Command::Queue => QUEUE,
            Command::Cancel => CANCEL,
            Command::Kill => KILL,
            Command::Mark => MARK,
            Command::Replay => REPLAY,
            Command::Approval => APPROVAL,
            Command::Auth => AUTH,
            Command::Report => REPORT,
            Command::Namespace => NAMESPACE,
            Command::Instance => INSTANCE,
        }
    }

    /// The command named `name`, if there is one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A control command with what it asks, decoded: one variant per command, so that the one
/// match that carries commands out takes each request in its type (a new command is a new
/// variant here, then every match the compiler points at).
#[derive(Clone, Debug)]
pub enum Request {
    /// [`APPLY`].
    Apply(super::ApplyRequest),
    /// [`DELETE`].
    Delete(super::JobNameRequest),
    /// [`PAUSE`].
    Pause(super::JobNameRequest),
    /// [`RESUME`].
    Resume(super::JobNameRequest),
    /// [`TRIGGER`].
    Trigger(super::TriggerRequest),
    /// [`RERUN`].
    Rerun(super::RerunRequest),
    /// [`BACKFILL`].
    Backfill(super::BackfillRequest),
    /// [`QUEUE`].
    Queue(super::QueueRequest),
    /// [`CANCEL`].
    Cancel(super::InstanceRequest),
    /// [`KILL`].
    Kill(super::InstanceRequest),
    /// [`MARK`].
    Mark(super::MarkRequest),
    /// [`REPLAY`].
    Replay(super::ReplayRequest),
    /// [`APPROVAL`].
    Approval(super::ApprovalRequest),
    /// [`AUTH`].
    Auth(super::AuthRequest),
    /// [`REPORT`].
    Report(super::ReportRequest),
    /// [`NAMESPACE`].
    Namespace(super::NamespaceRequest),
    /// [`INSTANCE`].
    Instance(super::ReadRequest),
}

impl Request {
    /// The request of command `kind` in `payload` (MessagePack, or JSON when the headers
    /// say so).
    pub fn decode(
        kind: Command,
        headers: Option<&async_nats::HeaderMap>,
        payload: &[u8],
    ) -> Result<Self, crate::codec::CodecError> {
        use crate::codec::decode_request as read;
        Ok(match kind {
            Command::Apply => {
                let mut apply: super::ApplyRequest = read(headers, payload)?;
                // A client that skips the CLI may write `namespace:`: stored, it is in the name.
                for doc in &mut apply.jobs {
                    doc.job.settle_namespace();
                }
                Self::Apply(apply)
            }
            Command::Delete => Self::Delete(read(headers, payload)?),
            Command::Pause => Self::Pause(read(headers, payload)?),
            Command::Resume => Self::Resume(read(headers, payload)?),
            Command::Trigger => Self::Trigger(read(headers, payload)?),
            Command::Rerun => Self::Rerun(read(headers, payload)?),
            Command::Backfill => Self::Backfill(read(headers, payload)?),
            Command::Queue => Self::Queue(read(headers, payload)?),
            Command::Cancel => Self::Cancel(read(headers, payload)?),
            Command::Kill => Self::Kill(read(headers, payload)?),
            Command::Mark => Self::Mark(read(headers, payload)?),
            Command::Replay => Self::Replay(read(headers, payload)?),
            Command::Approval => Self::Approval(read(headers, payload)?),
            Command::Auth => Self::Auth(read(headers, payload)?),
            Command::Report => Self::Report(read(headers, payload)?),
            Command::Namespace => Self::Namespace(read(headers, payload)?),
            Command::Instance => Self::Instance(read(headers, payload)?),
        })
    }

    /// The request as JSON (the audit keeps it so): the request's own fields, whichever
    /// command it is.
    pub fn to_json(&self) -> serde_json::Value {
        let json = match self {
            Self::Apply(r) => serde_json::to_value(r),
            Self::Delete(r) | Self::Pause(r) | Self::Resume(r) => serde_json::to_value(r),
            Self::Trigger(r) => serde_json::to_value(r),
            Self::Rerun(r) => serde_json::to_value(r),
            Self::Backfill(r) => serde_json::to_value(r),
            Self::Queue(r) => serde_json::to_value(r),
            Self::Cancel(r) | Self::Kill(r) => serde_json::to_value(r),
            Self::Mark(r) => serde_json::to_value(r),
            Self::Replay(r) => serde_json::to_value(r),
            Self::Approval(r) => serde_json::to_value(r),
            Self::Auth(r) => serde_json::to_value(r),
            Self::Report(r) => serde_json::to_value(r),
            Self::Namespace(r) => serde_json::to_value(r),
            Self::Instance(r) => serde_json::to_value(r),
        };
        json.unwrap_or(serde_json::Value::Null)
    }

    /// Which command it is.
    pub fn kind(&self) -> Command {
        match self {
            Self::Apply(_) => Command::Apply,
            Self::Delete(_) => Command::Delete,
            Self::Pause(_) => Command::Pause,
            Self::Resume(_) => Command::Resume,
            Self::Trigger(_) => Command::Trigger,
            Self::Rerun(_) => Command::Rerun,
            Self::Backfill(_) => Command::Backfill,
            Self::Queue(_) => Command::Queue,
            Self::Cancel(_) => Command::Cancel,
            Self::Kill(_) => Command::Kill,
            Self::Mark(_) => Command::Mark,
            Self::Replay(_) => Command::Replay,
            Self::Approval(_) => Command::Approval,
            Self::Auth(_) => Command::Auth,
            Self::Report(_) => Command::Report,
            Self::Namespace(_) => Command::Namespace,
            Self::Instance(_) => Command::Instance,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_is_one_kind_and_back() {
        assert_eq!(Command::ALL.map(Command::name), ALL);
        for command in Command::ALL {
            assert_eq!(Command::parse(command.name()), Some(command));
        }
        assert_eq!(Command::parse("reboot"), None);
        assert_eq!(Command::parse("Apply"), None);
    }

    #[test]
    fn a_request_decodes_as_its_command_and_says_which() {
        let json = |text: &str| {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Content-Type", "application/json");
            (headers, text.as_bytes().to_vec())
        };
        let (headers, payload) = json(r#"{"name": "nightly"}"#);
        for kind in [Command::Delete, Command::Pause, Command::Resume] {
            let request = Request::decode(kind, Some(&headers), &payload).unwrap();
            assert_eq!(request.kind(), kind);
        }
        let (headers, payload) = json(r#"{"instance": "nightly.k"}"#);
        let request = Request::decode(Command::Kill, Some(&headers), &payload).unwrap();
        assert!(matches!(request, Request::Kill(ref r) if r.instance.as_str() == "nightly.k"));
        assert!(Request::decode(Command::Trigger, Some(&headers), &payload).is_err());
    }
}
