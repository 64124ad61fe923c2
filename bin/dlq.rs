//! `ax dlq list` and `ax dlq replay ID`: reading the dead letters and submitting one again.
//!
//! A dead letter that belongs to an instance (retries exhausted, or a dispatch delivered too
//! often) is replayed as a re-run of that instance: a new attempt with its original params,
//! through the Schedulers like `ax rerun --instance`, so its cancelled downstream runs again
//! too. Any other message is put back on its subject as it came. An undecodable message is not
//! replayed: it would die the same way. Every replay is recorded on `ax.audit.dlq`, and the
//! dead letter is removed once its replay is stored.

use anyhow::{anyhow, bail, Context, Result};
use async_nats::jetstream::message::PublishMessage;

use ax_bus::dead_letter::{self, DeadLetter};
use ax_bus::messages::{commands, DlqReplayAudit, RerunRequest};
use ax_bus::{codec, AxClient};

use crate::jobs::{print_plan, refused, requested_by, PLANNED_TIMEOUT};
use crate::table;

pub async fn list(client: &AxClient, json: bool) -> Result<()> {
    let letters = client.dead_letters().await?;
    if json {
        return table::json(&letters);
    }
    let rows: Vec<Vec<String>> = letters
        .iter()
        .map(|l| {
            vec![
                l.id.to_string(),
                l.at.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
                    .unwrap_or_default(),
                l.kind.clone(),
                l.job.clone().unwrap_or_else(|| "-".into()),
                l.instance.clone().unwrap_or_else(|| l.subject.clone()),
                l.reason.clone(),
            ]
        })
        .collect();
    table::print(
        &["ID", "AT", "KIND", "JOB", "INSTANCE / SUBJECT", "REASON"],
        &rows,
    );
    Ok(())
}

pub async fn replay(client: &AxClient, id: u64, json: bool) -> Result<()> {
    let stored = client
        .dead_letter(id)
        .await?
        .ok_or_else(|| anyhow!("dead letter {id}: no such dead letter (ax dlq list shows them)"))?;
    let letter = DeadLetter::from_stored(&stored);
    if letter.kind == dead_letter::UNDECODABLE {
        bail!(
            "dead letter {id}: undecodable ({}); replaying it would fail the same way — fix what \
             published it on {} and publish it again",
            letter.reason,
            letter.subject
        );
    }
    let by = requested_by();
    let action = match (&letter.instance, &letter.trace) {
        (Some(instance), Some(trace)) => {
            let (record, _) = client
                .instance(instance)
                .await?
                .ok_or_else(|| anyhow!("dead letter {id}: instance {instance} no longer exists"))?;
            if &record.trace_id != trace || !record.state.is_final() {
                bail!(
                    "dead letter {id}: instance {instance} has moved on since (attempt {}, {}); \
                     nothing replayed",
                    record.attempt,
                    record.state
                );
            }
            let request = RerunRequest {
                instance: Some(instance.clone()),
                biz_date: None,
                root: None,
                failed_only: true,
                force_downstream: false,
                dry_run: false,
                requested_by: format!("{by} (ax dlq replay {id})"),
            };
            let reply = refused(
                client
                    .control(commands::RERUN, &request, PLANNED_TIMEOUT)
                    .await?,
            )?;
            if !reply.plan.iter().any(|s| s.will_run) {
                bail!("dead letter {id}: the Scheduler started nothing again; it is kept");
            }
            if !json {
                print_plan(&reply.plan, false, false)?;
            }
            "rerun"
        }
        _ => {
            let subject = letter.subject.clone();
            if subject.is_empty() {
                bail!("dead letter {id}: it does not say which subject it came from");
            }
            client
                .js
                .send_publish(
                    subject.clone(),
                    PublishMessage::build()
                        .headers(dead_letter::original_headers(&stored.headers))
                        .message_id(format!("replay:{}:{id}", client.layout.dead_stream()))
                        .payload(stored.payload.clone()),
                )
                .await
                .with_context(|| format!("publish on {subject}"))?
                .await
                .with_context(|| format!("publish on {subject}"))?;
            if !json {
                println!("dead letter {id} published again on {subject}");
            }
            "republished"
        }
    };
    let audit = DlqReplayAudit {
        letter: letter.clone(),
        action: action.to_string(),
        requested_by: by,
        at: ax_bus::time::now(),
    };
    client
        .js
        .send_publish(
            client.subjects().audit("dlq"),
            PublishMessage::build()
                .headers(codec::msgpack_headers())
                .message_id(format!("dlq-replay:{id}"))
                .payload(codec::encode(&audit)?),
        )
        .await
        .context("record the replay on the audit stream")?
        .await
        .context("record the replay on the audit stream")?;
    client.remove_dead_letter(id).await?;
    if json {
        return table::json(&audit);
    }
    println!("dead letter {id} replayed ({action}) and removed");
    Ok(())
}
