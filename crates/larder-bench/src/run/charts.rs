//! SVG charts of a `larder bench run` (plotters): decode tok/s per arm with
//! the I/O bound drawn, hit rate vs RAM budget share, TTFT vs prompt length.

use std::path::Path;

use plotters::prelude::*;
use serde_json::Value;

use super::summary::{rows, Row};
use super::write_atomic;
use crate::{BenchError, Result};

const SIZE: (u32, u32) = (900, 520);

/// Writes tok_per_s.svg, hit_rate.svg and ttft.svg into `dir`.
pub fn write_all(doc: &Value, dir: &Path) -> Result<()> {
    let rows = rows(doc);
    let name = doc["scenario"]["name"].as_str().unwrap_or("").to_string();
    for (file, svg) in [
        ("tok_per_s.svg", tok_per_s(&rows, &name)),
        ("hit_rate.svg", hit_rate(&rows, &name)),
        ("ttft.svg", ttft(&rows, &name)),
    ] {
        let svg = svg.map_err(|e| BenchError::Failed(format!("cannot draw {file}: {e}")))?;
        write_atomic(&dir.join(file), svg.as_bytes())?;
    }
    Ok(())
}

type Draw = Result<String, Box<dyn std::error::Error>>;

/// The top of a y axis holding `max` (never an empty range).
fn top(max: f64) -> f64 {
    if max.is_finite() && max > 0.0 {
        max * 1.15
    } else {
        1.0
    }
}

fn tok_per_s(rows: &[Row], scenario: &str) -> Draw {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        let n = rows.len().max(1);
        let ymax = top(rows
            .iter()
            .flat_map(|r| [r.tok_per_s, if r.io_bound.is_finite() { r.io_bound } else { 0.0 }])
            .fold(0.0, f64::max));
        let labels: Vec<String> = rows.iter().map(|r| format!("{} p{}", r.arm, r.prompt)).collect();
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("{scenario}: decode tok/s per arm (line: I/O bound)"), ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..n as f64, 0f64..ymax)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n + 1)
            .x_label_formatter(&|x| {
                let i = (x - 0.5).round();
                if (x - 0.5 - i).abs() < 1e-6 && i >= 0.0 {
                    labels.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_desc("decode tok/s (median)")
            .draw()?;
        chart
            .draw_series(
                rows.iter()
                    .enumerate()
                    .map(|(i, r)| Rectangle::new([(i as f64 + 0.15, 0.0), (i as f64 + 0.85, r.tok_per_s)], BLUE.mix(0.6).filled())),
            )?
            .label("decode tok/s")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], BLUE.mix(0.6).filled()));
        chart
            .draw_series(rows.iter().enumerate().filter(|(_, r)| r.io_bound.is_finite()).map(|(i, r)| {
                PathElement::new(
                    vec![(i as f64 + 0.05, r.io_bound), (i as f64 + 0.95, r.io_bound)],
                    RED.stroke_width(3),
                )
            }))?
            .label("I/O bound (drive limit / miss bytes per token)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], RED.stroke_width(3)));
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
    }
    Ok(svg)
}

fn hit_rate(rows: &[Row], scenario: &str) -> Draw {
    let xmax = top(rows.iter().map(|r| r.budget_share).fold(0.0, f64::max)).min(1.05);
    let key = |r: &Row| format!("{} prefetch {} p{}", r.io, r.prefetch, r.prompt);
    let chart = LineChart {
        caption: format!("{scenario}: decode hit rate vs RAM budget"),
        x: (0.0, xmax, "RAM budget (share of the expert bank)"),
        y: (0.0, 1.05, "hit rate (median)"),
    };
    chart.draw(series(rows, key, |r| (r.budget_share, r.hit_rate)))
}

fn ttft(rows: &[Row], scenario: &str) -> Draw {
    let chart = LineChart {
        caption: format!("{scenario}: time to first token vs prompt length"),
        x: (0.0, top(rows.iter().map(|r| r.prompt as f64).fold(0.0, f64::max)), "prompt tokens"),
        y: (0.0, top(rows.iter().map(|r| r.ttft).fold(0.0, f64::max)), "TTFT s (median)"),
    };
    chart.draw(series(rows, |r| r.arm.clone(), |r| (r.prompt as f64, r.ttft)))
}

/// `rows` grouped by `key` (in first-seen order), each group's points by x.
fn series(rows: &[Row], key: impl Fn(&Row) -> String, point: impl Fn(&Row) -> (f64, f64)) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut out: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in rows {
        let k = key(r);
        match out.iter_mut().find(|(name, _)| *name == k) {
            Some((_, pts)) => pts.push(point(r)),
            None => out.push((k, vec![point(r)])),
        }
    }
    for (_, pts) in &mut out {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// A line chart with points and a legend: one line per named series.
struct LineChart<'a> {
    caption: String,
    /// (min, max, label) of each axis.
    x: (f64, f64, &'a str),
    y: (f64, f64, &'a str),
}

impl LineChart<'_> {
    fn draw(&self, series: Vec<(String, Vec<(f64, f64)>)>) -> Draw {
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
            root.fill(&WHITE)?;
            let mut chart = ChartBuilder::on(&root)
                .caption(&self.caption, ("sans-serif", 20))
                .margin(12)
                .x_label_area_size(50)
                .y_label_area_size(70)
                .build_cartesian_2d(self.x.0..self.x.1, self.y.0..self.y.1)?;
            chart.configure_mesh().x_desc(self.x.2).y_desc(self.y.2).draw()?;
            for (i, (name, pts)) in series.into_iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                    .label(name)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2)));
                chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
            root.present()?;
        }
        Ok(svg)
    }
}
