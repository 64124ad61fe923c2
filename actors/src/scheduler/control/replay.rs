//! `ax.control.replay` (`ax dlq replay`): a dead letter submitted again, by a Scheduler so
//! that the caller's rights are checked where it happens.
//!
//! One that belongs to an instance (retries exhausted, a dispatch delivered too often) is
//! replayed as a re-run of that instance — a new attempt with its original params, so its
//! cancelled downstream runs again too — and only while the instance is still at the attempt
//! that died. Any other message is put back on its subject as it came. An undecodable one is
//! not replayed: it would die the same way. The letter is removed once its replay is stored;
//! the replay is audited like any command.

use super::{rerun, CommandError};
use crate::scheduler::store::{DeadLetters, History, Instances, Registry};
use ax_bus::dead_letter;
use ax_bus::ids::InstanceId;
use ax_bus::messages::typed::Planned;
use ax_bus::messages::{DlqReplay, ReplayRequest, RerunRequest};

/// Replays dead letter `request.id`.
pub(crate) async fn replay(
    store: &(impl DeadLetters + Registry + Instances + History),
    request: &ReplayRequest,
) -> Result<Planned, CommandError> {
    let id = request.id;
    let not_found = || {
        CommandError::refused(format!(
            "dead letter {id}: no such dead letter (ax dlq list shows them)"
        ))
    };
    // Stream sequences start at 1; the server refuses to look up 0.
    if id == 0 {
        return Err(not_found());
    }
    let letter = store.letter(id).await?.ok_or_else(not_found)?;
    if letter.kind == dead_letter::UNDECODABLE {
        return Err(CommandError::refused(format!(
            "dead letter {id}: undecodable ({}); replaying it would fail the same way — fix \
             what published it on {} and publish it again",
            letter.reason, letter.subject
        )));
    }
    let (action, plan) = match (&letter.instance, &letter.trace) {
        (Some(instance), Some(trace)) => {
            let plan = rerun_dead(store, request, instance, trace).await?;
            ("rerun", plan)
        }
        _ => {
            if letter.subject.is_empty() {
                return Err(CommandError::refused(format!(
                    "dead letter {id}: it does not say which subject it came from"
                )));
            }
            store.put_back(id, &letter.subject).await?;
            ("republished", Vec::new())
        }
    };
    store.remove_letter(id).await?;
    let message = match action {
        "rerun" => format!(
            "dead letter {id}: {} runs again",
            letter.instance.as_deref().unwrap_or_default()
        ),
        _ => format!("dead letter {id}: published again on {}", letter.subject),
    };
    let detail = serde_json::to_value(DlqReplay {
        letter,
        action: action.to_string(),
    })
    .unwrap_or_default();
    Ok(Planned {
        message,
        plan,
        detail,
        ..Planned::default()
    })
}

async fn rerun_dead(
    store: &(impl Registry + Instances + History),
    request: &ReplayRequest,
    instance: &str,
    trace: &str,
) -> Result<Vec<ax_bus::messages::PlanStep>, CommandError> {
    let id = request.id;
    let instance = InstanceId::parse(instance)
        .map_err(|e| CommandError::refused(format!("dead letter {id}: {e}")))?;
    let Some(record) = store.record(&instance).await? else {
        return Err(CommandError::refused(format!(
            "dead letter {id}: instance {instance} no longer exists"
        )));
    };
    if record.trace_id != trace || !record.state.is_final() {
        return Err(CommandError::refused(format!(
            "dead letter {id}: instance {instance} has moved on since (attempt {}, {}); \
             nothing replayed",
            record.attempt, record.state
        )));
    }
    let rerun = RerunRequest {
        instance: Some(instance),
        failed_only: true,
        requested_by: format!("{} (ax dlq replay {id})", request.requested_by),
        ..RerunRequest::default()
    };
    let plan = rerun::rerun(store, &rerun).await?;
    if !plan.iter().any(|s| s.will_run) {
        return Err(CommandError::refused(format!(
            "dead letter {id}: nothing started again; it is kept"
        )));
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use ax_bus::dead_letter::DeadLetter;
    use ax_bus::{InstanceRecord, State};

    use super::*;
    use crate::scheduler::store::memory::Memory;
    use crate::test_fixtures::{ended, spec};

    /// A letter of kind `kind` that came on `subject`, for `record`'s attempt if given.
    fn letter(id: u64, kind: &str, subject: &str, record: Option<&InstanceRecord>) -> DeadLetter {
        DeadLetter {
            id,
            kind: kind.into(),
            at: None,
            reason: "delivered 5 times".into(),
            subject: subject.into(),
            node: "n1".into(),
            instance: record.map(|r| r.instance_id.to_string()),
            trace: record.map(|r| r.trace_id.to_string()),
            job: record.map(|r| r.job.to_string()),
            payload_bytes: 10,
        }
    }

    fn holding(memory: Memory, letters: impl IntoIterator<Item = DeadLetter>) -> Memory {
        memory
            .letters
            .lock()
            .unwrap()
            .extend(letters.into_iter().map(|l| (l.id, l)));
        memory
    }

    fn asked(id: u64) -> ReplayRequest {
        ReplayRequest {
            id,
            requested_by: "ops@host".into(),
        }
    }

    fn refused(outcome: Result<Planned, CommandError>) -> String {
        match outcome {
            Err(CommandError::Refused(why)) => why.join("; "),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_letter_of_no_instance_goes_back_on_its_subject_and_is_removed() {
        let memory = holding(
            Memory::default(),
            [letter(3, "dispatch", "ax.internal.created.etl", None)],
        );
        let replayed = replay(&memory, &asked(3)).await.unwrap();
        assert_eq!(
            replayed.message,
            "dead letter 3: published again on ax.internal.created.etl"
        );
        assert_eq!(replayed.detail["action"], "republished");
        assert_eq!(
            *memory.put_back.lock().unwrap(),
            [(3, "ax.internal.created.etl".to_string())]
        );
        assert!(memory.letters.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_letter_of_an_instance_runs_it_again_while_it_is_at_the_attempt_that_died() {
        let etl = spec("etl", None, &[]);
        let dead = ended(&etl, "2026-01-01", State::Failed);
        let memory = holding(
            Memory::with([dead.clone()])
                .registering([etl])
                .with_history(),
            [letter(4, "retries", "ax.dispatch.normal", Some(&dead))],
        );
        let replayed = replay(&memory, &asked(4)).await.unwrap();
        assert_eq!(
            replayed.message,
            format!("dead letter 4: {} runs again", dead.instance_id)
        );
        assert_eq!(memory.handed.lock().unwrap().len(), 1);
        assert!(memory.put_back.lock().unwrap().is_empty());
        assert!(memory.letters.lock().unwrap().is_empty());
        // Its instance has moved on: a second letter of the same attempt is refused and kept.
        let memory = holding(
            memory,
            [letter(5, "retries", "ax.dispatch.normal", Some(&dead))],
        );
        let why = refused(replay(&memory, &asked(5)).await);
        assert!(why.contains("has moved on since (attempt 2"), "{why}");
        assert!(memory.letters.lock().unwrap().contains_key(&5));
    }

    #[tokio::test]
    async fn what_cannot_be_replayed_is_refused_and_kept() {
        let etl = spec("etl", None, &[]);
        let gone = ended(&etl, "2026-01-01", State::Failed);
        let memory = holding(
            Memory::default(),
            [
                letter(6, dead_letter::UNDECODABLE, "ax.internal.created.etl", None),
                letter(7, "dispatch", "", None),
                letter(8, "retries", "ax.dispatch.normal", Some(&gone)),
            ],
        );
        assert!(refused(replay(&memory, &asked(0)).await).contains("no such dead letter"));
        assert!(refused(replay(&memory, &asked(99)).await).contains("no such dead letter"));
        assert!(refused(replay(&memory, &asked(6)).await).contains("undecodable"));
        assert!(refused(replay(&memory, &asked(7)).await)
            .contains("does not say which subject it came from"));
        assert!(refused(replay(&memory, &asked(8)).await).contains("no longer exists"));
        assert_eq!(memory.letters.lock().unwrap().len(), 3);
        assert!(memory.put_back.lock().unwrap().is_empty());
    }
}
