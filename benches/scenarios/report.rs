//! The tables the runner prints: one per scenario, one row per contender.

use std::fmt::Write as _;
use std::time::Duration;

use crate::drive::Run;

/// A column beyond the common ones, with how to fill it from a run.
pub struct Extra {
    pub header: &'static str,
    pub cell: fn(&Run) -> String,
}

/// Prints a table of `runs`: loads, p50 / p99 / max latency, wall time, calls per second, then
/// the `extras`.
pub fn table(title: &str, runs: &[Run], extras: &[Extra]) -> String {
    let mut headers = vec!["contender", "loads", "p50", "p99", "max", "wall", "calls/s"];
    headers.extend(extras.iter().map(|extra| extra.header));
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|run| {
            let mut label = run.label.to_owned();
            if !run.finished {
                label.push_str(" (cut at time bound)");
            }
            let quantile = |q| latency(Duration::from_nanos(run.latency.value_at_quantile(q)));
            let mut row = vec![
                label,
                run.loads.to_string(),
                quantile(0.5),
                quantile(0.99),
                latency(Duration::from_nanos(run.latency.max())),
                latency(run.wall),
                rate(run.calls(), run.wall),
            ];
            row.extend(extras.iter().map(|extra| (extra.cell)(run)));
            row
        })
        .collect();

    let widths: Vec<usize> = (0..headers.len())
        .map(|column| {
            rows.iter()
                .map(|row| row[column].len())
                .chain([headers[column].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let _ = writeln!(out, "{title}");
    let line = |out: &mut String, cells: &[&str]| {
        for (column, cell) in cells.iter().enumerate() {
            let width = widths[column];
            let _ = if column == 0 {
                write!(out, "{cell:<width$}")
            } else {
                write!(out, "  {cell:>width$}")
            };
        }
        out.push('\n');
    };
    line(&mut out, &headers);
    let rule: Vec<String> = widths.iter().map(|width| "-".repeat(*width)).collect();
    line(
        &mut out,
        &rule.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    for row in &rows {
        line(
            &mut out,
            &row.iter().map(String::as_str).collect::<Vec<_>>(),
        );
    }
    out
}

/// A duration with three significant digits in a unit that suits it.
pub fn latency(duration: Duration) -> String {
    let nanos = duration.as_nanos() as f64;
    let (value, unit) = if nanos < 1e3 {
        (nanos, "ns")
    } else if nanos < 1e6 {
        (nanos / 1e3, "µs")
    } else if nanos < 1e9 {
        (nanos / 1e6, "ms")
    } else {
        (nanos / 1e9, "s")
    };
    let decimals = if value < 10.0 {
        2
    } else if value < 100.0 {
        1
    } else {
        0
    };
    format!("{value:.decimals$} {unit}")
}

/// Calls per second, with a thousands separator.
pub fn rate(calls: u64, wall: Duration) -> String {
    let per_second = calls as f64 / wall.as_secs_f64().max(f64::MIN_POSITIVE);
    thousands(per_second.round() as u64)
}

pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}
