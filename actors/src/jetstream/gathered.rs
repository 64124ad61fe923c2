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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use ax_bus::client::local_server::{find_binary, LocalServer, ServerOptions};
    use ax_bus::client::ConnectConfig;

    async fn stored(client: &AxClient) -> u64 {
        let mut stream = client
            .js
            .get_stream(client.layout.results_stream())
            .await
            .unwrap();
        stream.info().await.unwrap().state.messages
    }

    fn item(client: &AxClient, i: usize) -> Item {
        Item::new(client.subjects().result("j"), &format!("result:{i}"), &i).unwrap()
    }

    /// Publishes made side by side are each stored once, a repeat (a report run again) too;
    /// across a restart of nats-server a publish waits and is stored; one no stream takes is
    /// an error, not a wait.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_is_stored_once_across_a_restart_and_a_subject_of_no_stream_fails() {
        let dir = tempfile::tempdir().unwrap();
        let mut server = LocalServer::start(ServerOptions {
            binary: find_binary().unwrap(),
            port: None,
            store_dir: dir.path().join("store"),
            log_file: None,
            extra_args: Vec::new(),
        })
        .unwrap();
        let client = AxClient::connect_node(&ConnectConfig::new(server.url.clone(), "t"))
            .await
            .unwrap();
        let gathered = Gathered::new(&client);
        for _ in 0..2 {
            let all = (0..200).map(|i| gathered.publish(item(&client, i)));
            for done in futures::future::join_all(all).await {
                done.unwrap();
            }
            assert_eq!(stored(&client).await, 200);
        }

        server.stop();
        let late = tokio::spawn({
            let (gathered, item) = (gathered.clone(), item(&client, 200));
            async move { gathered.publish(item).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.restart().unwrap();
        let after = tokio::time::timeout(Duration::from_secs(60), late).await;
        after.unwrap().unwrap().unwrap();
        assert_eq!(stored(&client).await, 201);

        let nowhere = Item::new("no.stream.here".into(), "x", &1).unwrap();
        let refused = tokio::time::timeout(Duration::from_secs(30), gathered.publish(nowhere));
        assert!(refused.await.unwrap().is_err());
    }
}
