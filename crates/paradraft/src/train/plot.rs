//! The training curve (loss and first-slot accuracy per step, smoothed) as an SVG; the README
//! shows how to turn it into a PNG with `rsvg-convert`.

use super::run::LogLine;
use crate::error::{Error, Result};
use plotters::prelude::*;
use std::path::Path;

fn err(e: impl std::fmt::Display) -> Error {
    Error::BadRequest(format!("plotting the training curve: {e}"))
}

/// Moving average over `w` points.
fn smooth(v: &[(f64, f64)], w: usize) -> Vec<(f64, f64)> {
    (0..v.len())
        .map(|i| {
            let lo = i.saturating_sub(w - 1);
            let s: f64 = v[lo..=i].iter().map(|p| p.1).sum();
            (v[i].0, s / (i - lo + 1) as f64)
        })
        .collect()
}

/// Reads `train_log.jsonl` (later lines win for a repeated step, as after a resume).
pub fn read_log(path: &Path) -> Result<Vec<LogLine>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let mut by_step = std::collections::BTreeMap::new();
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        let x: LogLine = serde_json::from_str(l).map_err(err)?;
        by_step.insert(x.step, x);
    }
    Ok(by_step.into_values().collect())
}

pub fn loss_svg(log: &[LogLine], title: &str, path: &Path) -> Result<()> {
    let loss: Vec<(f64, f64)> = log.iter().map(|l| (l.step as f64, l.loss)).collect();
    let acc: Vec<(f64, f64)> = log.iter().map(|l| (l.step as f64, l.acc1)).collect();
    let w = (log.len() / 50).max(1);
    let (loss, acc) = (smooth(&loss, w), smooth(&acc, w));
    let x_max = loss.last().map_or(1.0, |p| p.0).max(1.0);
    // Skip the first steps' huge random-init loss when scaling the axis.
    let y_max = loss
        .iter()
        .skip(loss.len() / 20)
        .map(|p| p.1)
        .fold(1.0, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut ch = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .right_y_label_area_size(56)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(err)?
        .set_secondary_coord(0.0..x_max, 0.0..1.0);
    ch.configure_mesh()
        .x_desc("optimiser step")
        .y_desc("weighted CE loss")
        .draw()
        .map_err(err)?;
    ch.configure_secondary_axes()
        .y_desc("slot-1 accuracy")
        .draw()
        .map_err(err)?;
    ch.draw_series(LineSeries::new(loss, &BLUE))
        .map_err(err)?
        .label("loss (moving average)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLUE));
    ch.draw_secondary_series(LineSeries::new(acc, &RED))
        .map_err(err)?
        .label("slot-1 accuracy (moving average)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RED));
    ch.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

/// A campaign's held-out curve: α₁ (left axis, with the goal line) and expected chain τ (right
/// axis) against CPU-hours; `points` are (CPU-hours, millions of trained positions, α₁, τ).
pub fn curve_svg(
    points: &[(f64, f64, f64, f64)],
    goal: f64,
    title: &str,
    path: &Path,
) -> Result<()> {
    let x_max = points.iter().map(|p| p.0).fold(0.1, f64::max) * 1.05;
    let tau_max = points.iter().map(|p| p.3).fold(2.0, f64::max).ceil() + 0.5;
    let root = SVGBackend::new(path, (900, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut ch = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .right_y_label_area_size(56)
        .build_cartesian_2d(0.0..x_max, 0.0..1.0)
        .map_err(err)?
        .set_secondary_coord(0.0..x_max, 1.0..tau_max);
    ch.configure_mesh()
        .x_desc("CPU-hours of campaign (training + evaluation + self-distillation)")
        .y_desc("held-out α1")
        .draw()
        .map_err(err)?;
    ch.configure_secondary_axes()
        .y_desc("expected chain τ (the drafter's depths)")
        .draw()
        .map_err(err)?;
    let goal_style = ShapeStyle::from(&GREEN).stroke_width(2);
    ch.draw_series(LineSeries::new(
        vec![(0.0, goal), (x_max, goal)],
        goal_style,
    ))
    .map_err(err)?
    .label(format!("goal α1 {goal}"))
    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], goal_style));
    let a: Vec<(f64, f64)> = points.iter().map(|p| (p.0, p.2)).collect();
    ch.draw_series(LineSeries::new(a.clone(), &BLUE))
        .map_err(err)?
        .label("held-out α1")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLUE));
    ch.draw_series(a.iter().map(|&p| Circle::new(p, 3, BLUE.filled())))
        .map_err(err)?;
    let t: Vec<(f64, f64)> = points.iter().map(|p| (p.0, p.3)).collect();
    ch.draw_secondary_series(LineSeries::new(t.clone(), &RED))
        .map_err(err)?
        .label("expected chain τ")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RED));
    ch.draw_secondary_series(t.iter().map(|&p| Circle::new(p, 3, RED.filled())))
        .map_err(err)?;
    if let Some(last) = points.last() {
        let note = format!("{:.1} M trained positions at the last point", last.1);
        ch.draw_series(std::iter::once(Text::new(
            note,
            (x_max * 0.02, 0.05),
            ("sans-serif", 13),
        )))
        .map_err(err)?;
    }
    ch.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}
