//! `ttrace simulate --plot`: disk bytes per generated token against the
//! budget, one curve per policy, drawn with plotters.

use std::path::Path;

use plotters::prelude::*;

use crate::analyze::simulate::{Policy, Row};

const MIB: f64 = 1024.0 * 1024.0;

#[derive(Debug, thiserror::Error)]
#[error("drawing the plot: {0}")]
pub struct PlotError(String);

pub fn write(path: &Path, rows: &[Row], title: &str) -> Result<(), PlotError> {
    let err = |e: &dyn std::fmt::Display| PlotError(e.to_string());
    let mut policies: Vec<Policy> = rows.iter().map(|r| r.policy).collect();
    policies.sort_unstable();
    policies.dedup();
    let point = |r: &Row| (r.budget_bytes as f64 / MIB, r.disk_bytes_per_token.unwrap_or(0.0) / MIB);
    let x_max = rows.iter().map(|r| point(r).0).fold(1.0, f64::max);
    let y_max = rows.iter().map(|r| point(r).1).fold(0.0, f64::max).max(1e-3) * 1.05;
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("ttrace simulate: {title}"), ("sans-serif", 18))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x_max * 1.02, 0.0..y_max)
        .map_err(|e| err(&e))?;
    chart.configure_mesh().x_desc("budget (MiB)").y_desc("disk MiB per generated token").draw().map_err(|e| err(&e))?;
    for (i, policy) in policies.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points: Vec<(f64, f64)> = rows.iter().filter(|r| r.policy == *policy).map(point).collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(policy.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(|e| err(&e))?;
    }
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE).draw().map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}
