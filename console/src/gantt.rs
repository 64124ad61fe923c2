//! The Gantt chart of a business date's chain, under the DAG: one bar per job from its
//! instance's start to its end (to now while it runs), on one time axis, so that the run that
//! held the chain up is seen at a glance. Pure: the page hands the rows and the clock.

use chrono::{DateTime, Duration, Utc};

use crate::index::Row;

/// The width of the job names' column.
pub const LABEL_WIDTH: f64 = 200.0;
/// The width of the time axis.
pub const CHART_WIDTH: f64 = 720.0;
/// The height of one bar's row.
pub const ROW_HEIGHT: f64 = 26.0;
/// The room above the first row for the axis's labels.
const AXIS_HEIGHT: f64 = 22.0;
/// The narrowest bar drawn (a run of milliseconds still shows).
const MIN_BAR: f64 = 2.0;

/// One job's bar.
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    /// The job.
    pub job: String,
    /// Its instance (the bar's link).
    pub instance_id: String,
    /// The instance's state (the bar's colour).
    pub state: String,
    /// Where the bar starts (its run's start).
    pub x: f64,
    /// Its top.
    pub y: f64,
    /// Its length (its run's).
    pub width: f64,
    /// Where the job's name is written.
    pub label_y: f64,
    /// How long it ran (or has run), as the pages write it.
    pub took: String,
}

/// A tick of the time axis.
#[derive(Clone, Debug, PartialEq)]
pub struct Tick {
    /// Where on the axis.
    pub x: f64,
    /// `HH:MM:SS` (UTC), with milliseconds when the chart spans less than 20 seconds.
    pub label: String,
}

/// The chart.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gantt {
    /// Ordered by start.
    pub bars: Vec<Bar>,
    /// The axis's ticks, from the first start to the last end.
    pub ticks: Vec<Tick>,
    /// The drawing's size.
    pub width: f64,
    /// Its height.
    pub height: f64,
}

/// The chart of `rows` that have started (the others have no bar), at `now`.
pub fn of(rows: &[Row], now: DateTime<Utc>) -> Gantt {
    let mut runs: Vec<(&Row, DateTime<Utc>, DateTime<Utc>)> = rows
        .iter()
        .filter_map(|row| {
            let start = row.started_at?;
            let end = row.finished_at.unwrap_or(now).max(start);
            Some((row, start, end))
        })
        .collect();
    if runs.is_empty() {
        return Gantt::default();
    }
    runs.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.job.cmp(&b.0.job)));
    let first = runs.iter().map(|r| r.1).min().unwrap_or(now);
    let last = runs.iter().map(|r| r.2).max().unwrap_or(now);
    let span = (last - first).max(Duration::seconds(1));
    let span_ms = span.num_milliseconds() as f64;
    let x_of = |at: DateTime<Utc>| {
        LABEL_WIDTH + (at - first).num_milliseconds() as f64 / span_ms * CHART_WIDTH
    };
    let bars = runs
        .iter()
        .enumerate()
        .map(|(i, (row, start, end))| {
            let y = AXIS_HEIGHT + i as f64 * ROW_HEIGHT;
            let x = x_of(*start);
            Bar {
                job: row.job.to_string(),
                instance_id: row.instance_id.to_string(),
                state: row.state.to_string(),
                x,
                y: y + 4.0,
                width: (x_of(*end) - x).max(MIN_BAR),
                label_y: y + 17.0,
                took: ax_bus::time::human_ms((*end - *start).num_milliseconds()),
            }
        })
        .collect();
    let ticks = (0..=4)
        .map(|i| {
            let at = first + Duration::milliseconds((span_ms * f64::from(i) / 4.0) as i64);
            Tick {
                x: x_of(at),
                // A short span's ticks would all read the same second.
                label: if span < Duration::seconds(20) {
                    at.format("%H:%M:%S%.3f").to_string()
                } else {
                    at.format("%H:%M:%S").to_string()
                },
            }
        })
        .collect();
    Gantt {
        bars,
        ticks,
        width: LABEL_WIDTH + CHART_WIDTH + 80.0,
        height: AXIS_HEIGHT + runs.len() as f64 * ROW_HEIGHT + 4.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ax_bus::State;

    fn at(second: i64) -> DateTime<Utc> {
        chrono::NaiveDate::from_ymd_opt(2026, 12, 1)
            .and_then(|d| d.and_hms_opt(2, 0, 0))
            .map(|t| t.and_utc())
            .unwrap_or_default()
            + Duration::seconds(second)
    }

    fn row(job: &str, state: State, start: Option<i64>, end: Option<i64>) -> Row {
        Row {
            started_at: start.map(at),
            finished_at: end.map(at),
            ..Row::sample(&format!("{job}.20261201"), job, state, "", at(0))
        }
    }

    #[test]
    fn bars_follow_the_runs_on_one_axis_in_the_order_they_started() {
        let rows = vec![
            row("load", State::Success, Some(100), Some(400)),
            row("extract", State::Success, Some(0), Some(100)),
            row("report", State::Running, Some(400), None),
            row("waiting", State::Running, None, None),
        ];
        let chart = of(&rows, at(800));
        let jobs: Vec<&str> = chart.bars.iter().map(|b| b.job.as_str()).collect();
        assert_eq!(jobs, ["extract", "load", "report"], "not started: no bar");
        // 800 s over 720 px: 0.9 px a second.
        let [extract, load, report] = [&chart.bars[0], &chart.bars[1], &chart.bars[2]];
        assert_eq!((extract.x, extract.width), (LABEL_WIDTH, 90.0));
        assert_eq!((load.x, load.width), (LABEL_WIDTH + 90.0, 270.0));
        // Still running: up to now.
        assert_eq!(report.x + report.width, LABEL_WIDTH + CHART_WIDTH);
        assert_eq!(
            (load.took.as_str(), report.state.as_str()),
            ("5m 00s", "running")
        );
        assert_eq!(
            chart.ticks.first().map(|t| t.label.as_str()),
            Some("02:00:00")
        );
        assert_eq!(
            chart.ticks.last().map(|t| t.label.as_str()),
            Some("02:13:20")
        );
        assert!(chart.bars.iter().all(|b| b.y + ROW_HEIGHT <= chart.height));
    }

    #[test]
    fn a_run_of_milliseconds_still_shows_and_no_run_draws_nothing() {
        let rows = vec![row("quick", State::Success, Some(0), Some(0))];
        let chart = of(&rows, at(10));
        assert_eq!(chart.bars[0].width, MIN_BAR);
        assert_eq!(chart.ticks[1].label, "02:00:00.250");
        assert_eq!(of(&[], at(0)), Gantt::default());
    }
}
