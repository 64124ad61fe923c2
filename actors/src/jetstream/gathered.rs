//! Gathered publishes: messages to one stream handed in one by one by tasks running side by
//! side (the Reporter's reports), sent together as [`burst`]s — what waited while one burst
//! was out goes as the next.
//!
//! Why: a plain publish costs its answer; a burst of n costs n + n/flow + 2 messages (see
//! [`burst`]). Under load the reports of a node end many at a time, so their results gathered
//! cost one answer each burst instead of one each; alone, a message goes as a burst of one, a
//! plain publish. One burst is out at a time, which is what the server's flow favours.

use tokio::sync::{mpsc, oneshot};

use ax_bus::error::{NatsError, Reason};
use ax_bus::AxClient;

use super::burst::{self, Item};

/// The most messages in one burst.
const MOST: usize = 1024;

type Answer = oneshot::Sender<Result<(), NatsError>>;

/// A publisher gathering what it is given into bursts; cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Gathered(mpsc::UnboundedSender<(Item, Answer)>);

impl Gathered {
    /// A publisher on `client`, sending from a task of its own until every clone is dropped.
    pub(crate) fn new(client: &AxClient) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<(Item, Answer)>();
        let client = client.clone();
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut waiting = vec![first];
                while waiting.len() < MOST {
                    match rx.try_recv() {
                        Ok(next) => waiting.push(next),
                        Err(_) => break,
                    }
                }
                let (items, answers): (Vec<Item>, Vec<Answer>) = waiting.into_iter().unzip();
                let stored = burst::publish(&client, items);
                for (stored, answer) in stored.into_iter().zip(answers) {
                    let _ = answer.send(stored.await);
                }
            }
        });
        Self(tx)
    }

    /// Publishes `item` with the next burst; Ok once it is stored.
    pub(crate) async fn publish(&self, item: Item) -> Result<(), NatsError> {
        let (tx, rx) = oneshot::channel();
        let gone = || {
            NatsError::new(
                "publish with a burst",
                Reason("the publishing task ended".into()),
            )
        };
        self.0.send((item, tx)).map_err(|_| gone())?;
        rx.await.unwrap_or_else(|_| Err(gone()))
    }
}
