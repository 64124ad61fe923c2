//! `trigger`: one instance of a job now, or at a time (`at`, `in`: a delayed trigger), under a
//! business key or the command's own identity.

use std::collections::BTreeMap;

use ax_bus::instance::Trigger;
use ax_bus::messages::typed::Triggered;
use ax_bus::messages::TriggerRequest;
use ax_bus::spec;
use ax_bus::time::biz_date_in;

use super::CommandError;
use crate::scheduler::creator::{Created, Creates};
use crate::scheduler::graph::Graph;
use crate::scheduler::new_instance::NewInstance;
use crate::scheduler::store::Registry;

/// What a trigger is checked against besides its job.
pub(super) struct Bounds<'a> {
    /// How far ahead a delayed trigger may be due (`[scheduler] max_delay_days`).
    pub(super) max_delay: std::time::Duration,
    /// The largest message the server takes: every hand-off of the attempt carries the
    /// instance.
    pub(super) max_payload: usize,
    /// The dependency graph: whether the instance skips the DagCoordinator.
    pub(super) graph: &'a Graph,
}

/// A manual run. Its expected time is when the command reached the server (the JetStream
/// timestamp, identical on every redelivery) and its id adds the command's stream sequence, so
/// a redelivered trigger never runs twice and two triggers within a millisecond both run.
pub(super) async fn trigger(
    (registry, creator): (&impl Registry, &impl Creates),
    bounds: &Bounds<'_>,
    request: TriggerRequest,
    (published, sequence): (chrono::DateTime<chrono::Utc>, u64),
) -> Result<Triggered, CommandError> {
    let Some((job, _)) = registry.job(&request.name).await? else {
        return Err(super::jobs::no_such_job(&request.name));
    };
    let invalid = spec::validate_spec(&job.spec);
    if !invalid.is_empty() {
        // Written past the Schedulers' checks: never run.
        return Err(CommandError::Refused(
            invalid
                .iter()
                .map(|e| format!("the registry's `{}` is not a valid job: {e}", request.name))
                .collect(),
        ));
    }
    let due = checked(&request, published, bounds.max_delay).map_err(CommandError::Refused)?;
    let tz: chrono_tz::Tz = job.spec.timezone.parse().unwrap_or(chrono_tz::UTC);
    let biz_date = request
        .biz_date
        .unwrap_or_else(|| biz_date_in(tz, due.unwrap_or(published)));
    let mut params: BTreeMap<String, serde_json::Value> = job.spec.params.clone();
    params.extend(request.params);
    if let Err(size) = spec::params_fit(&params) {
        // Refused here, before a record exists: every hand-off of the attempt carries them.
        return Err(CommandError::refused(format!(
            "params: {size} bytes as JSON (the job's merged with the trigger's) is more than {}",
            spec::MAX_PARAMS_BYTES
        )));
    }
    let mut instance = NewInstance::new(
        &job.spec,
        published,
        biz_date,
        params,
        Trigger::Manual,
        ax_bus::time::now(),
    );
    instance = match &request.key {
        Some(key) => instance.under_key(key),
        None => instance.under_command(published, sequence),
    };
    if let Some(due) = due {
        instance = instance.delayed_until(due);
        instance.defined_at = job.defined_at;
    }
    instance.skip_coordinator = !bounds.graph.needs_coordinator(&job.spec);
    instance
        .too_big_for(bounds.max_payload)
        .map_err(CommandError::refused)?;
    let id = instance.record.instance_id.clone();
    let created = creator.create(instance).await?;
    if created == Created::SetAside {
        return Err(CommandError::refused(format!(
            "instance {id} was set aside: it cannot be handed on (see its record and \
             ax.alert.flow)"
        )));
    }
    Ok(Triggered {
        instance_id: id,
        message: match created {
            Created::Fired => match due {
                Some(due) => format!("scheduled for {}", ax_bus::time::rfc3339(due)),
                None => "triggered".into(),
            },
            Created::Deduplicated => "already triggered".into(),
            Created::Skipped => "skipped".into(),
            Created::SetAside => "set aside".into(),
        },
    })
}

/// Every problem of `request`, each naming its field; else when it is due (`None`: now).
fn checked(
    request: &TriggerRequest,
    published: chrono::DateTime<chrono::Utc>,
    max_delay: std::time::Duration,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, Vec<String>> {
    let mut errors = Vec::new();
    if let Some(date) = &request.biz_date {
        if ax_bus::time::parse_biz_date(date).is_none() {
            errors.push(format!("biz_date: `{date}` is not a date (YYYY-MM-DD)"));
        }
    }
    for name in request.params.keys() {
        if !spec::is_valid_param_name(name) {
            errors.push(format!(
                "params.{name}: a param name must match [A-Za-z_][A-Za-z0-9_]{{0,63}}"
            ));
        }
    }
    let due = due_of(request, published, max_delay).unwrap_or_else(|e| {
        errors.push(e);
        None
    });
    if errors.is_empty() {
        Ok(due)
    } else {
        Err(errors)
    }
}

/// When a delayed trigger is due (`at` or `in`, counted from the command's publication so a
/// redelivered command means the same instant); `None` for one that runs now.
fn due_of(
    request: &TriggerRequest,
    published: chrono::DateTime<chrono::Utc>,
    max_delay: std::time::Duration,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, String> {
    let due = match (&request.at, &request.delay) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => return Err("at and in: give one of them, not both".into()),
        (Some(at), None) => ax_bus::time::parse_instant(at).map_err(|e| format!("at: {e}"))?,
        (None, Some(delay)) => {
            let delay = ax_bus::time::parse_delay(delay).map_err(|e| format!("in: {e}"))?;
            chrono::Duration::from_std(delay)
                .ok()
                .and_then(|d| published.checked_add_signed(d))
                .ok_or_else(|| {
                    format!(
                        "in: `{}` is too far ahead",
                        request.delay.as_deref().unwrap_or_default()
                    )
                })?
        }
    };
    within(due, published, max_delay)
        .map_err(|e| format!("{}: {e}", if request.at.is_some() { "at" } else { "in" }))?;
    Ok(Some(due))
}

/// Whether `due` is at most `max_delay` after `from` (the node's `[scheduler] max_delay_days`).
pub(super) fn within(
    due: chrono::DateTime<chrono::Utc>,
    from: chrono::DateTime<chrono::Utc>,
    max_delay: std::time::Duration,
) -> Result<(), String> {
    let limit = chrono::Duration::from_std(max_delay).unwrap_or(chrono::Duration::MAX);
    match from.checked_add_signed(limit) {
        Some(last) if due > last => Err(format!(
            "{} is more than {} days ahead (the Schedulers' max_delay_days)",
            ax_bus::time::rfc3339(due),
            limit.num_days()
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(json: serde_json::Value) -> TriggerRequest {
        let mut all = serde_json::json!({"name": "etl"});
        if let (Some(all), Some(more)) = (all.as_object_mut(), json.as_object()) {
            all.extend(more.clone());
        }
        serde_json::from_value(all).unwrap()
    }

    fn at(text: &str) -> chrono::DateTime<chrono::Utc> {
        ax_bus::time::parse_instant(text).unwrap()
    }

    const YEAR: std::time::Duration = std::time::Duration::from_secs(366 * 86_400);

    #[test]
    fn a_trigger_runs_now_or_is_due_at_its_instant_or_after_its_delay() {
        let sent = at("2026-12-07T10:00:00.000Z");
        assert_eq!(
            checked(&request(serde_json::json!({})), sent, YEAR),
            Ok(None)
        );
        let delayed = request(serde_json::json!({"in": "90s"}));
        assert_eq!(
            checked(&delayed, sent, YEAR),
            Ok(Some(at("2026-12-07T10:01:30.000Z")))
        );
        let timed = request(serde_json::json!({"at": "2026-12-24T18:00:00+08:00"}));
        assert_eq!(
            checked(&timed, sent, YEAR),
            Ok(Some(at("2026-12-24T10:00:00.000Z")))
        );
    }

    #[test]
    fn every_problem_of_a_trigger_is_named_at_once() {
        let sent = at("2026-12-07T10:00:00.000Z");
        let bad = request(serde_json::json!({
            "biz_date": "2026-02-30",
            "params": {"9lives": 1, "ok": 2},
            "at": "2026-12-08T00:00:00Z",
            "in": "1h",
        }));
        let errors = checked(&bad, sent, YEAR).unwrap_err();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(
            errors[0].starts_with("biz_date: `2026-02-30`"),
            "{errors:?}"
        );
        assert!(errors[1].starts_with("params.9lives:"), "{errors:?}");
        assert_eq!(errors[2], "at and in: give one of them, not both");
    }

    #[test]
    fn a_trigger_too_far_ahead_is_refused_by_the_schedulers_limit() {
        let sent = at("2026-12-07T10:00:00.000Z");
        let far = request(serde_json::json!({"in": "400d"}));
        let errors = checked(&far, sent, YEAR).unwrap_err();
        assert!(
            errors[0].starts_with("in: ") && errors[0].contains("more than 366 days ahead"),
            "{errors:?}"
        );
        let past = request(serde_json::json!({"at": "yesterday"}));
        let errors = checked(&past, sent, YEAR).unwrap_err();
        assert!(
            errors[0].starts_with("at: `yesterday` is not an RFC 3339 instant"),
            "{errors:?}"
        );
    }

    mod carried_out {
        use ax_bus::instance::Trigger;

        use super::super::*;
        use super::{at, request};
        use crate::scheduler::store::memory::{Made, Memory};
        use crate::test_fixtures::spec;

        const SENT: &str = "2026-12-07T10:00:00.000Z";

        /// A registry holding `etl` (param `region: eu`, Shanghai time).
        fn registry() -> Memory {
            let mut etl = spec("etl", None, &[]);
            etl.timezone = "Asia/Shanghai".into();
            etl.params.insert("region".into(), "eu".into());
            Memory::default().registering([etl])
        }

        fn bounds(graph: &Graph) -> Bounds<'_> {
            Bounds {
                max_delay: std::time::Duration::from_secs(86_400),
                max_payload: 1024 * 1024,
                graph,
            }
        }

        async fn sent(
            registry: &Memory,
            made: &Made,
            bounds: &Bounds<'_>,
            json: serde_json::Value,
            sequence: u64,
        ) -> Result<Triggered, CommandError> {
            trigger(
                (registry, made),
                bounds,
                request(json),
                (at(SENT), sequence),
            )
            .await
        }

        fn refused(outcome: Result<Triggered, CommandError>) -> String {
            match outcome {
                Err(CommandError::Refused(why)) => why.join("; "),
                other => panic!("not refused: {other:?}"),
            }
        }

        #[tokio::test]
        async fn a_trigger_makes_one_manual_instance_of_its_jobs_day_with_the_params_merged() {
            let (registry, made, graph) = (registry(), Made::default(), Graph::default());
            graph.loaded();
            let params = serde_json::json!({"params": {"day": 7}});
            let triggered = sent(&registry, &made, &bounds(&graph), params, 41)
                .await
                .unwrap();
            assert_eq!(triggered.message, "triggered");
            let instance = made.made.lock().unwrap()[0].clone();
            assert_eq!(instance.record.instance_id, triggered.instance_id);
            assert_eq!(instance.record.trigger, Trigger::Manual);
            // 18:00 in Shanghai: the job's own day.
            assert_eq!(instance.record.biz_date, "2026-12-07");
            assert_eq!(instance.record.params["region"], "eu");
            assert_eq!(instance.record.params["day"], 7);
            assert!(instance.skip_coordinator, "nothing in the DAG concerns it");
            // A job something depends on goes through the DagCoordinator.
            graph.note_deps(&spec("report", None, &[("etl", "current")]));
            let made = Made::default();
            sent(&registry, &made, &bounds(&graph), serde_json::json!({}), 42)
                .await
                .unwrap();
            assert!(!made.made.lock().unwrap()[0].skip_coordinator);
        }

        #[tokio::test]
        async fn a_redelivered_trigger_or_one_of_the_same_key_makes_nothing_new() {
            let (registry, made, graph) = (registry(), Made::default(), Graph::default());
            let bounds = bounds(&graph);
            let first = sent(&registry, &made, &bounds, serde_json::json!({}), 41)
                .await
                .unwrap();
            let again = sent(&registry, &made, &bounds, serde_json::json!({}), 41)
                .await
                .unwrap();
            assert_eq!(again.message, "already triggered");
            assert_eq!(again.instance_id, first.instance_id);
            // Another command within the same millisecond is another instance.
            let other = sent(&registry, &made, &bounds, serde_json::json!({}), 42)
                .await
                .unwrap();
            assert_ne!(other.instance_id, first.instance_id);
            let keyed = serde_json::json!({"key": "order-17"});
            let one = sent(&registry, &made, &bounds, keyed.clone(), 43)
                .await
                .unwrap();
            let two = sent(&registry, &made, &bounds, keyed, 44).await.unwrap();
            assert_eq!(
                (one.instance_id, two.message.as_str()),
                (two.instance_id.clone(), "already triggered")
            );
            assert_eq!(made.made.lock().unwrap().len(), 3);
        }

        #[tokio::test]
        async fn a_delayed_trigger_is_scheduled_for_its_instant() {
            let (registry, made, graph) = (registry(), Made::default(), Graph::default());
            let delayed = serde_json::json!({"in": "90s"});
            let triggered = sent(&registry, &made, &bounds(&graph), delayed, 41)
                .await
                .unwrap();
            assert_eq!(triggered.message, "scheduled for 2026-12-07T10:01:30.000Z");
            let made = made.made.lock().unwrap();
            assert!(made[0].delayed);
            assert_eq!(
                ax_bus::time::rfc3339(made[0].record.expected_time),
                "2026-12-07T10:01:30.000Z"
            );
        }

        #[tokio::test]
        async fn what_cannot_run_is_refused_before_anything_is_made() {
            let (registry, made, graph) = (registry(), Made::default(), Graph::default());
            let bounds = bounds(&graph);
            let unknown = request(serde_json::json!({"name": "nope"}));
            let why = refused(trigger((&registry, &made), &bounds, unknown, (at(SENT), 1)).await);
            assert_eq!(why, "no job named `nope`");
            let huge = "x".repeat(spec::MAX_PARAMS_BYTES);
            let big = serde_json::json!({"params": {"blob": huge}});
            let why = refused(sent(&registry, &made, &bounds, big, 2).await);
            assert!(why.starts_with("params: "), "{why}");
            let small = Bounds {
                max_payload: 512,
                ..bounds
            };
            let why = refused(sent(&registry, &made, &small, serde_json::json!({}), 3).await);
            assert!(!why.is_empty());
            let far = serde_json::json!({"in": "2d"});
            let why = refused(sent(&registry, &made, &bounds, far, 4).await);
            assert!(why.contains("more than 1 days ahead"), "{why}");
            assert!(made.made.lock().unwrap().is_empty());
        }
    }
}
