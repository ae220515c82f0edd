//! The expiry-under-load timeline, drawn to SVG: one panel per contender, sharing the time axis,
//! each a line of the slowest call started in every 10 ms of the run on a log scale, so the
//! spikes at each expiry (and their absence under `stale`) show.

use std::error::Error;
use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::drive::{BUCKET, Run};

const WIDTH: u32 = 960;
const PANEL: u32 = 120;
const HEADER: u32 = 40;
const FOOTER: u32 = 40;

pub fn draw(path: &Path, title: &str, runs: &[Run]) -> Result<(), Box<dyn Error>> {
    let buckets = runs.iter().map(|run| run.timeline.len()).max().unwrap_or(0);
    let seconds = (buckets as f64 * BUCKET.as_secs_f64()).max(0.1);
    // Milliseconds, from 10 µs (below any call here) to above the slowest call.
    let slowest = runs
        .iter()
        .flat_map(|run| run.timeline.iter().flatten())
        .max()
        .map_or(1.0, |slowest| slowest.as_secs_f64() * 1e3);
    let top = 10f64.powf((slowest * 1.5).log10().ceil()).max(1.0);

    let height = HEADER + PANEL * runs.len() as u32 + FOOTER;
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 16))?;
    // Equal plot areas: the last panel is taller by the time axis it carries.
    let (_, body) = root.dim_in_pixel();
    let unit = (body.saturating_sub(FOOTER) / runs.len().max(1) as u32) as i32;
    let breaks: Vec<i32> = (1..runs.len() as i32).map(|i| i * unit).collect();
    let panels = root.split_by_breakpoints([] as [i32; 0], breaks);
    for (index, (run, panel)) in runs.iter().zip(&panels).enumerate() {
        let last = index + 1 == runs.len();
        let mut chart = ChartBuilder::on(panel)
            .margin_left(12)
            .margin_right(16)
            .margin_top(6)
            .x_label_area_size(if last { FOOTER } else { 4 })
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..seconds, (0.01f64..top).log_scale())?;
        let mut mesh = chart.configure_mesh();
        mesh.y_desc("ms")
            .y_labels(4)
            .y_label_formatter(&|ms| format!("{ms}"))
            .light_line_style(WHITE);
        if last {
            mesh.x_desc("seconds since the first call");
        } else {
            mesh.x_label_formatter(&|_| String::new());
        }
        mesh.draw()?;
        let color = Palette99::pick(index).stroke_width(2);
        let points = run
            .timeline
            .iter()
            .enumerate()
            .filter_map(|(bucket, slowest)| {
                slowest.map(|slowest| {
                    (
                        bucket as f64 * BUCKET.as_secs_f64(),
                        slowest.as_secs_f64() * 1e3,
                    )
                })
            });
        chart.draw_series(LineSeries::new(points, color))?;
        // The contender's name in the panel's top right corner.
        chart.draw_series(std::iter::once(Text::new(
            run.label.to_owned(),
            (seconds * 0.98, top / 2.0),
            ("sans-serif", 14)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Right, VPos::Top)),
        )))?;
    }
    root.present()?;
    Ok(())
}
