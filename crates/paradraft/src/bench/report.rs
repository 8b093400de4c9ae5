//! Bench reports: a markdown table and SVG charts (plotters): speedup per dataset and method,
//! the mean latency of a round split into its stages, and the τ histogram.

use super::harness::{Run, Summary};
use crate::error::{Error, Result};
use plotters::prelude::*;
use std::fmt::Write;
use std::path::Path;

pub fn markdown(summaries: &[Summary]) -> String {
    let mut s = String::new();
    s.push_str("| dataset | method | runs | tokens | τ micro | τ macro | tok/s | speedup | draft ms | tree ms | verify ms | commit ms | accepted ≥1 / ≥2 / ≥4 / ≥8 |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for x in summaries {
        let acc = |d: usize| x.accept_at_least.get(d - 1).copied().unwrap_or(0.0);
        if x.rounds == 0 {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | 1.00 | 1.00 | {:.1} | {:.2}× | — | — | — | — | — |",
                x.dataset, x.method, x.runs, x.tokens, x.tok_s, x.speedup
            );
            continue;
        }
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.2} | {:.2} | {:.1} | {:.2}× | {:.2} | {:.3} | {:.2} | {:.3} | {:.2} / {:.2} / {:.2} / {:.2} |",
            x.dataset, x.method, x.runs, x.tokens, x.tau_micro, x.tau_macro, x.tok_s, x.speedup,
            x.draft_ms, x.tree_ms, x.verify_ms, x.commit_ms, acc(1), acc(2), acc(4), acc(8)
        );
    }
    s
}

fn chart_err(e: impl std::fmt::Display) -> Error {
    Error::BadRequest(format!("drawing a chart: {e}"))
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Writes `speedup.svg`, `latency.svg` and `tau_hist.svg` into `dir`.
pub fn charts(summaries: &[Summary], runs: &[Run], dir: &Path) -> Result<()> {
    let datasets: Vec<&str> = dedup(summaries.iter().map(|s| s.dataset.as_str()));
    let methods: Vec<&str> = dedup(summaries.iter().map(|s| s.method.as_str()));
    let find = |d: &str, m: &str| summaries.iter().find(|s| s.dataset == d && s.method == m);

    // Speedup per dataset, one bar per method.
    {
        let path = dir.join("speedup.svg");
        let root = SVGBackend::new(&path, (900, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(chart_err)?;
        let ymax = summaries.iter().map(|s| s.speedup).fold(1.0, f64::max) * 1.15;
        let nd = datasets.len();
        let nm = methods.len();
        let mut ch = ChartBuilder::on(&root)
            .caption("decode speedup over AR", ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(45)
            .build_cartesian_2d(0f64..nd as f64, 0f64..ymax)
            .map_err(chart_err)?;
        ch.configure_mesh()
            .disable_x_mesh()
            .x_labels(2 * nd + 1)
            .x_label_formatter(&|x| category(&datasets, *x))
            .y_desc("speedup ×")
            .draw()
            .map_err(chart_err)?;
        for (mi, m) in methods.iter().enumerate() {
            let w = 0.8 / nm as f64;
            let c = COLORS[mi % COLORS.len()];
            let bars: Vec<_> = datasets
                .iter()
                .enumerate()
                .filter_map(|(di, d)| find(d, m).map(|s| (di, s.speedup)))
                .map(|(di, v)| {
                    let x0 = di as f64 + 0.1 + w * mi as f64;
                    Rectangle::new([(x0, 0.0), (x0 + w * 0.9, v)], c.filled())
                })
                .collect();
            ch.draw_series(bars)
                .map_err(chart_err)?
                .label(m.to_string())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], c.filled()));
        }
        ch.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(chart_err)?;
        root.present().map_err(chart_err)?;
    }

    // Mean latency per round, stacked by stage, per method (all datasets pooled).
    {
        let path = dir.join("latency.svg");
        let root = SVGBackend::new(&path, (900, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(chart_err)?;
        let per: Vec<(f64, f64, f64, f64)> = methods
            .iter()
            .map(|m| {
                let rs: Vec<_> = runs
                    .iter()
                    .filter(|r| r.method == *m)
                    .flat_map(|r| r.rounds.iter())
                    .collect();
                let n = rs.len().max(1) as f64;
                let sum = |f: fn(&crate::spec::RoundStats) -> f64| {
                    rs.iter().map(|r| f(r)).sum::<f64>() / n
                };
                (
                    sum(|r| r.draft_ms),
                    sum(|r| r.tree_ms),
                    sum(|r| r.verify_ms),
                    sum(|r| r.commit_ms),
                )
            })
            .collect();
        let ymax = per
            .iter()
            .map(|p| p.0 + p.1 + p.2 + p.3)
            .fold(1.0, f64::max)
            * 1.15;
        let mut ch = ChartBuilder::on(&root)
            .caption(
                "mean ms per round (speculative methods)",
                ("sans-serif", 20),
            )
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(45)
            .build_cartesian_2d(0f64..methods.len() as f64, 0f64..ymax)
            .map_err(chart_err)?;
        ch.configure_mesh()
            .disable_x_mesh()
            .x_labels(2 * methods.len() + 1)
            .x_label_formatter(&|x| category(&methods, *x))
            .y_desc("ms")
            .draw()
            .map_err(chart_err)?;
        let stages = ["draft", "tree", "verify", "commit"];
        for (si, stage) in stages.iter().enumerate() {
            let c = COLORS[si % COLORS.len()];
            let bars: Vec<_> = per
                .iter()
                .enumerate()
                .map(|(mi, p)| {
                    let v = [p.0, p.1, p.2, p.3];
                    let lo: f64 = v[..si].iter().sum();
                    Rectangle::new(
                        [(mi as f64 + 0.2, lo), (mi as f64 + 0.8, lo + v[si])],
                        c.filled(),
                    )
                })
                .collect();
            ch.draw_series(bars)
                .map_err(chart_err)?
                .label(stage.to_string())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], c.filled()));
        }
        ch.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(chart_err)?;
        root.present().map_err(chart_err)?;
    }

    // Histogram of committed tokens per round (τ of single rounds), per method.
    {
        let path = dir.join("tau_hist.svg");
        let root = SVGBackend::new(&path, (900, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(chart_err)?;
        let spec_methods: Vec<&str> = methods
            .iter()
            .copied()
            .filter(|m| runs.iter().any(|r| r.method == *m && !r.rounds.is_empty()))
            .collect();
        let maxk = runs
            .iter()
            .flat_map(|r| r.rounds.iter())
            .map(|r| r.accepted + 1)
            .max()
            .unwrap_or(1);
        let frac = |m: &str, k: usize| {
            let rs: Vec<_> = runs
                .iter()
                .filter(|r| r.method == m)
                .flat_map(|r| r.rounds.iter())
                .collect();
            rs.iter().filter(|r| r.accepted + 1 == k).count() as f64 / rs.len().max(1) as f64
        };
        let mut ch = ChartBuilder::on(&root)
            .caption("tokens committed per round", ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(45)
            .build_cartesian_2d(0.5f64..maxk as f64 + 0.5, 0f64..1f64)
            .map_err(chart_err)?;
        ch.configure_mesh()
            .disable_x_mesh()
            .y_desc("fraction of rounds")
            .x_desc("τ of a round")
            .draw()
            .map_err(chart_err)?;
        let nm = spec_methods.len().max(1) as f64;
        for (mi, m) in spec_methods.iter().enumerate() {
            let c = COLORS[mi % COLORS.len()];
            let w = 0.8 / nm;
            let bars: Vec<_> = (1..=maxk)
                .map(|k| {
                    let x0 = k as f64 - 0.4 + w * mi as f64;
                    Rectangle::new([(x0, 0.0), (x0 + w * 0.9, frac(m, k))], c.filled())
                })
                .collect();
            ch.draw_series(bars)
                .map_err(chart_err)?
                .label(m.to_string())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], c.filled()));
        }
        ch.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(chart_err)?;
        root.present().map_err(chart_err)?;
    }
    Ok(())
}

/// The name of category i at x = i + 0.5 (the centre of its slot); nothing elsewhere.
fn category(names: &[&str], x: f64) -> String {
    let i = x.floor();
    if (x - i - 0.5).abs() < 0.01 {
        names
            .get(i as usize)
            .map_or(String::new(), |n| n.to_string())
    } else {
        String::new()
    }
}

fn dedup<'a>(it: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = Vec::new();
    for x in it {
        if !v.contains(&x) {
            v.push(x);
        }
    }
    v
}
