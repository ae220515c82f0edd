//! The picture: one panel per contender sharing the time axis, each the slowest request intended
//! in every 100 ms of its run (log scale), failed requests marked in red, the phases' bounds as
//! vertical lines named in the top panel.

use std::error::Error;
use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::orchestrate::figures::ContenderRun;
use crate::orchestrate::load::BUCKET;
use crate::orchestrate::report::Setting;

const WIDTH: u32 = 1000;
const PANEL: u32 = 120;
const HEADER: u32 = 40;
const FOOTER: u32 = 40;

/// Draws `runs` to an SVG at `path`.
pub fn draw(path: &Path, setting: &Setting, runs: &[ContenderRun]) -> Result<(), Box<dyn Error>> {
    let seconds = setting.plan.end().as_secs_f64().max(0.1);
    let slowest_ms = runs
        .iter()
        .flat_map(|run| run.timeline.iter().map(|b| b.slowest_us))
        .max()
        .unwrap_or(1_000) as f64
        / 1e3;
    let top = 10f64.powf((slowest_ms * 1.5).log10().ceil()).max(10.0);
    let bottom = 0.1;
    let height = HEADER + PANEL * runs.len().max(1) as u32 + FOOTER;
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "Expiry storm: the slowest request in each 100 ms, per contender ({} instances, {:.0} req/s, Zipf {})",
        setting.instances, setting.rate, setting.zipf
    );
    let root = root.titled(&title, ("sans-serif", 16))?;
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
            .build_cartesian_2d(0f64..seconds, (bottom..top).log_scale())?;
        let mut mesh = chart.configure_mesh();
        mesh.y_desc("ms")
            .y_labels(4)
            .y_label_formatter(&|ms| format!("{ms}"))
            .light_line_style(WHITE);
        if last {
            mesh.x_desc("seconds since the contender's first request");
        } else {
            mesh.x_label_formatter(&|_| String::new());
        }
        mesh.draw()?;
        for (phase, from, _) in &setting.plan.phases {
            let x = from.as_secs_f64();
            chart.draw_series(LineSeries::new(
                [(x, bottom), (x, top)],
                RGBColor(170, 170, 170).stroke_width(1),
            ))?;
            if index == 0 {
                chart.draw_series(std::iter::once(Text::new(
                    phase.label().to_owned(),
                    (x + 0.2, top / 2.0),
                    ("sans-serif", 12)
                        .into_font()
                        .color(&RGBColor(90, 90, 90))
                        .pos(Pos::new(HPos::Left, VPos::Top)),
                )))?;
            }
        }
        let points: Vec<(f64, f64)> = run
            .timeline
            .iter()
            .enumerate()
            .filter(|(_, bucket)| bucket.requests > 0)
            .map(|(i, bucket)| {
                (
                    i as f64 * BUCKET.as_secs_f64(),
                    (bucket.slowest_us as f64 / 1e3).max(bottom),
                )
            })
            .collect();
        chart.draw_series(LineSeries::new(
            points.iter().copied(),
            Palette99::pick(index).stroke_width(2),
        ))?;
        chart.draw_series(
            run.timeline
                .iter()
                .enumerate()
                .filter(|(_, bucket)| bucket.errors > 0)
                .map(|(i, bucket)| {
                    Circle::new(
                        (
                            i as f64 * BUCKET.as_secs_f64(),
                            (bucket.slowest_us as f64 / 1e3).max(bottom),
                        ),
                        2,
                        RED.filled(),
                    )
                }),
        )?;
        // The contender's name in the bottom right corner, below the requests' times.
        chart.draw_series(std::iter::once(Text::new(
            run.contender.label().to_owned(),
            (seconds * 0.99, bottom * 1.3),
            ("sans-serif", 14)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Right, VPos::Bottom)),
        )))?;
    }
    root.present()?;
    Ok(())
}
