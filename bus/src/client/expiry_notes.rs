//! Notes of records' ends, gathered: one message in `<AX>_EXPIRY` names every instance whose
//! end was noted while the previous message was on its way.
//!
//! Why: a final write is preceded by its note ([`crate::client::retention`]), and a note of
//! its own was two JetStream messages per finished instance (the note and its answer), for an
//! index that only needs to be read in order. The Reporter reports many outcomes at once, so
//! the notes of those in flight together share a message (a group commit): the first note goes
//! out at once, and the ones asked for while it is on its way go together in the next message
//! of their subject. Each caller still waits for the server's answer to the message that holds
//! its note before it writes the record final, so no final record goes unnoted.
//!
//! A message's payload is its instances' ids, one per line; an earlier version's note (one id)
//! reads the same ([`ids`]). The notes are sent by a task of their own, started on first use
//! in the runtime of whoever asks first; if that task is gone (its runtime stopped), a note is
//! sent on its own as before.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_nats::jetstream::{self, message::PublishMessage};
use tokio::sync::{mpsc, oneshot};

use crate::client::ClientError;
use crate::error::{During, NatsError, Reason};
use crate::ids::InstanceId;

/// The most ids one message carries (about 40 bytes each).
pub const MOST_PER_MESSAGE: usize = 1024;

/// The ids an index message names, in order, skipping lines that are not ids.
pub fn ids(payload: &[u8]) -> Vec<InstanceId> {
    std::str::from_utf8(payload)
        .map(|text| {
            text.split('\n')
                .filter_map(|line| InstanceId::parse(line.trim()).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// One note asked for: its subject, its instance, who waits for the answer.
struct Asked {
    subject: String,
    id: InstanceId,
    answered: oneshot::Sender<Result<(), String>>,
}

/// The gatherer of one client and its clones.
#[derive(Clone, Default)]
pub(crate) struct ExpiryNotes {
    sender: Arc<Mutex<Option<mpsc::UnboundedSender<Asked>>>>,
}

impl ExpiryNotes {
    /// Notes `id` on `subject`; answered once the server stored a message naming it.
    pub(crate) async fn note(
        &self,
        js: &jetstream::Context,
        subject: String,
        id: &InstanceId,
    ) -> Result<(), ClientError> {
        let (answered, answer) = oneshot::channel();
        let asked = Asked {
            subject: subject.clone(),
            id: id.clone(),
            answered,
        };
        if self.sender(js).send(asked).is_ok() {
            if let Ok(answer) = answer.await {
                return answer.map_err(|reason| {
                    NatsError::new(format!("note the end of instance {id}"), Reason(reason)).into()
                });
            }
        }
        // The task is gone (its runtime stopped): on its own, and a new task next time.
        if let Ok(mut sender) = self.sender.lock() {
            *sender = None;
        }
        js.send_publish(
            subject,
            PublishMessage::build().payload(id.to_string().into()),
        )
        .await
        .during(|| format!("note the end of instance {id}"))?
        .await
        .during(|| format!("note the end of instance {id}"))?;
        Ok(())
    }

    /// The task's sender, starting the task if there is none.
    fn sender(&self, js: &jetstream::Context) -> mpsc::UnboundedSender<Asked> {
        let mut held = self
            .sender
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match held.as_ref().filter(|s| !s.is_closed()) {
            Some(sender) => sender.clone(),
            None => {
                let (sender, asked) = mpsc::unbounded_channel();
                tokio::spawn(send_notes(js.clone(), asked));
                *held = Some(sender.clone());
                sender
            }
        }
    }
}

/// Sends what is asked, a message per subject for all that waits, until every clone of the
/// client is gone.
async fn send_notes(js: jetstream::Context, mut asked: mpsc::UnboundedReceiver<Asked>) {
    while let Some(first) = asked.recv().await {
        let mut by_subject: BTreeMap<String, Vec<Asked>> = BTreeMap::new();
        by_subject
            .entry(first.subject.clone())
            .or_default()
            .push(first);
        let mut taken = 1;
        while taken < MOST_PER_MESSAGE {
            let Ok(next) = asked.try_recv() else { break };
            by_subject
                .entry(next.subject.clone())
                .or_default()
                .push(next);
            taken += 1;
        }
        let mut sent = Vec::with_capacity(by_subject.len());
        for (subject, notes) in by_subject {
            let payload = notes
                .iter()
                .map(|n| n.id.to_string())
                .collect::<Vec<_>>()
                .join("\n");
            match js
                .send_publish(subject, PublishMessage::build().payload(payload.into()))
                .await
            {
                Ok(ack) => sent.push((ack, notes)),
                Err(e) => answer(notes, &Err(e.to_string())),
            }
        }
        for (ack, notes) in sent {
            let answered = ack.await.map(|_| ()).map_err(|e| e.to_string());
            answer(notes, &answered);
        }
    }
}

fn answer(notes: Vec<Asked>, answered: &Result<(), String>) {
    for note in notes {
        let _ = note.answered.send(answered.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_names_its_ids_one_per_line_and_an_earlier_note_reads_the_same() {
        let a = InstanceId::parse("a.20261205T000000000Z").unwrap();
        let b = InstanceId::parse("b.20261205T000000001Z").unwrap();
        assert_eq!(ids(a.to_string().as_bytes()), vec![a.clone()]);
        assert_eq!(
            ids(format!("{a}\n{b}").as_bytes()),
            vec![a.clone(), b.clone()]
        );
        assert_eq!(ids(format!("{a}\nnot an id\n\n{b}").as_bytes()), vec![a, b]);
        assert!(ids(b"\xff\xfe").is_empty());
    }
}
