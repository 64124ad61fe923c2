//! Each control command typed from its sender to its reply: a request type names its command
//! and what its answer is read as ([`ControlRequest`]), so that
//! [`AxClient::send`](crate::AxClient::send) takes a request and gives back that command's
//! reply, with no command name to spell and no field of another command's answer to read.
//!
//! The Scheduler's handlers answer with the same types: each returns its command's reply, and
//! the one place that carries out a request checks by the request's type that the handler's
//! answer is that command's ([`ControlRequest::Reply`]).
//!
//! On the wire nothing changes: every command still answers with the one documented reply
//! ([`ControlReply`], schema `control-reply`), of which each reply type here is the part its
//! command fills (`From` writes it, [`FromReply`] reads it back). A refusal never becomes a
//! reply: the client returns it as an error.
//! Requests shared by several commands (`delete`, `pause` and `resume` name a job; `cancel` and
//! `kill` an instance) are wrapped in one type per command, sent as the request they wrap.

use serde::{Deserialize, Serialize};

use super::commands::Command;
use super::{
    ApplyRequest, ApprovalRequest, AuthRequest, BackfillRequest, ControlReply, InstanceRequest,
    JobChange, JobNameRequest, MarkRequest, NamespaceRequest, PlanStep, QueueRequest, ReadRequest,
    ReplayRequest, ReportRequest, RerunRequest, TriggerRequest,
};
use crate::auth::approval::Approval;
use crate::auth::token::TokenRecord;
use crate::ids::InstanceId;

/// A control command's request: the command it is sent as, and what its answer is read as.
pub trait ControlRequest: Serialize {
    /// The command.
    const COMMAND: Command;
    /// What it answers when it is carried out.
    type Reply: FromReply + Into<ControlReply>;
}

/// A command's reply, read from the wire's one reply document.
pub trait FromReply: Sized {
    /// The reply `reply` holds; why not, when it lacks what the command always answers.
    fn from_reply(reply: ControlReply) -> Result<Self, String>;
}

/// What any command's reply says, whichever command: its message, the instance it names and
/// the plan it carries (none by default) — for a caller that shows every answer one way.
pub trait Said {
    /// What was said.
    fn message(&self) -> &str;
    /// The instance it names, if one.
    fn instance(&self) -> Option<&InstanceId> {
        None
    }
    /// The plan it carries, if one.
    fn plan(&self) -> &[PlanStep] {
        &[]
    }
}

/// The answer of a command that changes one thing and says so (`delete`, `pause`, `resume`,
/// `queue`, `cancel`, `kill`, `mark`, `report`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Done {
    /// What it did.
    pub message: String,
    /// The instance it changed (`cancel`, `kill`, `mark`, `report`).
    pub instance_id: Option<InstanceId>,
    /// What the audit keeps of it (an instance's state before and after).
    pub detail: serde_json::Value,
}

impl FromReply for Done {
    fn from_reply(reply: ControlReply) -> Result<Self, String> {
        Ok(Self {
            message: reply.message,
            instance_id: reply.instance_id,
            detail: reply.detail,
        })
    }
}

/// The answer of `apply`: what became of each job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Applied {
    /// Each job, created, updated or unchanged.
    pub changes: Vec<JobChange>,
    /// What was said beside.
    pub message: String,
}

impl FromReply for Applied {
    fn from_reply(reply: ControlReply) -> Result<Self, String> {
        Ok(Self {
            changes: reply.changes,
            message: reply.message,
        })
    }
}

/// The answer of `trigger`: the instance (made now, or found made by an earlier trigger of its
/// key) and what became of it (`triggered`, `scheduled for …`, `already triggered`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Triggered {
    /// The instance.
    pub instance_id: InstanceId,
    /// What became of it.
    pub message: String,
}

impl FromReply for Triggered {
    fn from_reply(reply: ControlReply) -> Result<Self, String> {
        let instance_id = reply
            .instance_id
            .ok_or("the answer to a trigger names no instance")?;
        Ok(Self {
            instance_id,
            message: reply.message,
        })
    }
}

/// The answer of a planned command (`rerun`, `backfill`, `replay`): its plan, and for a re-run
/// that waits for a second person the approval that holds it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Planned {
    /// Each instance, and whether it runs.
    pub plan: Vec<PlanStep>,
    /// What was said beside (`waiting for approval …`, `self-approved by …`).
    pub message: String,
    /// The pending approval, when it waits for one.
    pub approval: Option<Approval>,
    /// What else it says (`replay`: the letter and what was done with it).
    pub detail: serde_json::Value,
}

impl FromReply for Planned {
    fn from_reply(reply: ControlReply) -> Result<Self, String> {
        Ok(Self {
            plan: reply.plan,
            message: reply.message,
            approval: reply.approval,
            detail: reply.detail,
        })
    }
}

/// The answer of `approval`: the pending re-runs (list), or the one decided and, approved, the
/// plan it ran.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Approvals {
    /// The approvals listed.
    pub approvals: Vec<Approval>,
    /// The approval decided.
    pub approval: Option<Approval>,
    /// The plan an approved re-run ran.
    pub plan: Vec<PlanStep>,
    /// What was said.
    pub message: String,
}

impl FromReply for Approvals {
    fn from_reply(reply: ControlReply) -> Result<Self, String> {
        Ok(Self {
            approvals: reply.approvals,
            approval: reply.approval,
            plan: reply.plan,
            message: reply.message,
        })
    }
}

/// The answer of `auth`: the tokens listed (never their hashes), or what was done to one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Tokens {
    /// The tokens listed.
    pub tokens: Vec<TokenRecord>,
    /// What was said.
    pub message: String,
    /// What else it says.
    pub detail: serde_json::Value,
}

impl FromReply for Tokens {
    fn from_reply(reply: ControlReply) -> Result<Self, String> {
        Ok(Self {
            tokens: reply.tokens,
            message: reply.message,
            detail: reply.detail,
        })
    }
}

/// The answer of `instance`: the record read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Read {
    /// The record.
    pub record: Box<crate::instance::InstanceRecord>,
    /// What was said.
    pub message: String,
}

impl FromReply for Read {
    fn from_reply(reply: ControlReply) -> Result<Self, String> {
        let record = reply
            .record
            .ok_or("the answer to an instance read holds no record")?;
        Ok(Self {
            record,
            message: reply.message,
        })
    }
}

impl Said for Read {
    fn message(&self) -> &str {
        &self.message
    }
    fn instance(&self) -> Option<&InstanceId> {
        Some(&self.record.instance_id)
    }
}

/// Each reply written as the wire's one reply document: carried out, with its fields.
macro_rules! on_the_wire {
    ($($reply:ty { $($field:ident),* };)*) => {
        $(impl From<$reply> for ControlReply {
            fn from(reply: $reply) -> Self {
                Self {
                    ok: true,
                    $($field: reply.$field.into(),)*
                    ..Self::default()
                }
            }
        })*
    };
}

on_the_wire! {
    Done { message, instance_id, detail };
    Applied { changes, message };
    Triggered { instance_id, message };
    Planned { plan, message, approval, detail };
    Approvals { approvals, approval, plan, message };
    Tokens { tokens, message, detail };
    Read { record, message };
}

impl Said for Done {
    fn message(&self) -> &str {
        &self.message
    }
    fn instance(&self) -> Option<&InstanceId> {
        self.instance_id.as_ref()
    }
}

impl Said for Applied {
    fn message(&self) -> &str {
        &self.message
    }
}

impl Said for Triggered {
    fn message(&self) -> &str {
        &self.message
    }
    fn instance(&self) -> Option<&InstanceId> {
        Some(&self.instance_id)
    }
}

impl Said for Planned {
    fn message(&self) -> &str {
        &self.message
    }
    fn plan(&self) -> &[PlanStep] {
        &self.plan
    }
}

impl Said for Approvals {
    fn message(&self) -> &str {
        &self.message
    }
    fn plan(&self) -> &[PlanStep] {
        &self.plan
    }
}

impl Said for Tokens {
    fn message(&self) -> &str {
        &self.message
    }
}

/// `delete`: a job removed.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Delete(pub JobNameRequest);

/// `pause`: a job that stops firing.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Pause(pub JobNameRequest);

/// `resume`: a paused job that fires again.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Resume(pub JobNameRequest);

/// `cancel`: a waiting instance ended.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Cancel(pub InstanceRequest);

/// `kill`: an executing attempt stopped.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Kill(pub InstanceRequest);

/// Each request type's command and reply.
macro_rules! typed {
    ($($request:ty => $command:ident, $reply:ty;)*) => {
        $(impl ControlRequest for $request {
            const COMMAND: Command = Command::$command;
            type Reply = $reply;
        })*
    };
}

typed! {
    ApplyRequest => Apply, Applied;
    Delete => Delete, Done;
    Pause => Pause, Done;
    Resume => Resume, Done;
    TriggerRequest => Trigger, Triggered;
    RerunRequest => Rerun, Planned;
    BackfillRequest => Backfill, Planned;
    QueueRequest => Queue, Done;
    Cancel => Cancel, Done;
    Kill => Kill, Done;
    MarkRequest => Mark, Done;
    ReplayRequest => Replay, Planned;
    ApprovalRequest => Approval, Approvals;
    AuthRequest => Auth, Tokens;
    ReportRequest => Report, Done;
    NamespaceRequest => Namespace, Done;
    ReadRequest => Instance, Read;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wrapped request is sent as the request it wraps: a Scheduler of any version reads it.
    #[test]
    fn a_wrapped_request_is_sent_as_the_one_it_wraps() {
        let name = JobNameRequest {
            name: "etl".parse().unwrap(),
        };
        assert_eq!(
            serde_json::to_value(Pause(name.clone())).unwrap(),
            serde_json::to_value(&name).unwrap()
        );
        assert_eq!(<Pause as ControlRequest>::COMMAND, Command::Pause);
        assert_eq!(<Delete as ControlRequest>::COMMAND, Command::Delete);
        assert_eq!(<Kill as ControlRequest>::COMMAND, Command::Kill);
    }

    /// What a handler answers is read back whole by its sender.
    #[test]
    fn each_reply_is_read_back_as_it_was_written() {
        fn round_trip<R: FromReply + Into<ControlReply> + Clone + PartialEq + std::fmt::Debug>(
            reply: R,
        ) {
            let wire: ControlReply = reply.clone().into();
            assert!(wire.ok);
            let bytes = serde_json::to_vec(&wire).unwrap();
            let read: ControlReply = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(R::from_reply(read).unwrap(), reply);
        }
        let id: InstanceId = "etl.20260101T000000000Z".parse().unwrap();
        let step = PlanStep {
            instance_id: id.clone(),
            job: "etl".parse().unwrap(),
            biz_date: "2026-01-01".into(),
            state: crate::State::Failed,
            will_run: true,
            why: "failed".into(),
            rewrites: Vec::new(),
        };
        round_trip(Done {
            message: "paused".into(),
            instance_id: Some(id.clone()),
            detail: serde_json::json!({"before": "waiting"}),
        });
        round_trip(Applied {
            changes: vec![JobChange {
                name: "etl".parse().unwrap(),
                change: super::super::Change::Created,
            }],
            message: String::new(),
        });
        round_trip(Triggered {
            instance_id: id,
            message: "triggered".into(),
        });
        round_trip(Planned {
            plan: vec![step.clone()],
            message: "waiting for approval".into(),
            approval: None,
            detail: serde_json::Value::Null,
        });
        round_trip(Approvals {
            plan: vec![step],
            message: "approved".into(),
            ..Approvals::default()
        });
        round_trip(Tokens {
            message: "revoked".into(),
            ..Tokens::default()
        });
    }

    #[test]
    fn a_trigger_reply_without_its_instance_is_an_error_not_an_empty_id() {
        let reply = ControlReply {
            ok: true,
            message: "triggered".into(),
            ..ControlReply::default()
        };
        assert!(Triggered::from_reply(reply).is_err());
    }
}
