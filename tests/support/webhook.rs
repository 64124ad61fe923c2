//! A webhook for the tests of what ax POSTs (alerts, OpenLineage events): a real HTTP server on
//! a free port that answers 500 to its first requests, then 200, and keeps every body.

use std::sync::{Arc, Mutex};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use super::read_request;

/// A webhook that answers 500 to its first `failures` requests, then 200; it keeps every body.
pub(crate) struct Webhook {
    pub(crate) url: String,
    bodies: Arc<Mutex<Vec<(u16, serde_json::Value)>>>,
}

impl Webhook {
    pub(crate) async fn start(failures: usize) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let bodies: Arc<Mutex<Vec<(u16, serde_json::Value)>>> = Arc::default();
        let seen = bodies.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let seen = seen.clone();
                tokio::spawn(async move {
                    let Some((_, body)) = read_request(&mut socket).await else {
                        return;
                    };
                    let status = {
                        let mut seen = seen.lock().unwrap();
                        let status = if seen.len() < failures { 500 } else { 200 };
                        seen.push((status, serde_json::from_slice(&body).unwrap()));
                        status
                    };
                    let reply = format!(
                        "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    );
                    let _ = socket.write_all(reply.as_bytes()).await;
                });
            }
        });
        Self { url, bodies }
    }

    pub(crate) fn bodies(&self) -> Vec<(u16, serde_json::Value)> {
        self.bodies.lock().unwrap().clone()
    }
}
