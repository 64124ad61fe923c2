//! What walls between jobs cost an attempt: making and removing an attempt's cgroup, and a
//! command (`true`) run as a worker runs it in a cgroup of its own against one in its process
//! group only — the same process spawn, watcher and pipes, measured alternately in one run.
//! Where this process cannot make cgroups (not root, a read-only `/sys/fs/cgroup`) the section
//! says why instead of a figure.

use crate::Figure;

pub(crate) async fn measure(quick: bool) -> Vec<Figure> {
    let n = if quick { 20 } else { 200 };
    let cost = match ax_actors::bench::cgroup_cost(n).await {
        Ok(cost) => cost,
        Err(why) => {
            return vec![Figure {
                section: "cgroups",
                name: "not measured".into(),
                value: 0.0,
                unit: "",
                note: format!("this process cannot make cgroups: {why}"),
            }]
        }
    };
    let micros = |d: std::time::Duration| d.as_secs_f64() * 1e6;
    let added = micros(cost.confined) - micros(cost.plain);
    vec![
        Figure {
            section: "cgroups",
            name: "make and remove an attempt's cgroup".into(),
            value: micros(cost.make_and_remove),
            unit: "µs",
            note: format!("{n} cgroups, a memory limit where enforced; {}", cost.said),
        },
        Figure {
            section: "cgroups",
            name: "an attempt of `true` in a cgroup of its own".into(),
            value: micros(cost.confined),
            unit: "µs",
            note: format!(
                "made, entered before exec, killed, read, removed; {n} runs alternated with the next line's"
            ),
        },
        Figure {
            section: "cgroups",
            name: "an attempt of `true` in its process group only".into(),
            value: micros(cost.plain),
            unit: "µs",
            note: format!(
                "the cgroup adds {added:.0} µs ({:.2}x)",
                micros(cost.confined) / micros(cost.plain).max(1.0)
            ),
        },
    ]
}
