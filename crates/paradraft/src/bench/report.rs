//! Bench reports: a markdown table under the run's header, and SVG charts (plotters): speedup
//! per dataset and method, decode latency per generated token split into its stages, and the
//! τ histogram.

use super::harness::{Run, Summary};
use super::header::Header;
use crate::error::{Error, Result};
use plotters::prelude::*;
use std::fmt::Write;
use std::path::Path;

/// Runs whose output differs from AR's where it must not: (dataset, method, count).
pub fn mismatches(summaries: &[Summary]) -> Vec<(&str, &str, usize)> {
    summaries
        .iter()
        .filter_map(|x| match x.ar_mismatches {
            Some(n) if n > 0 => Some((x.dataset.as_str(), x.method.as_str(), n)),
            _ => None,
        })
        .collect()
}

pub fn markdown(header: &Header, summaries: &[Summary]) -> String {
    let mut s = String::from("# paradraft bench\n\n");
    s.push_str(&header.markdown());
    s.push('\n');
    for (ds, m, n) in mismatches(summaries) {
        let _ = writeln!(
            s,
            "**ERROR: {n} {ds} run(s) of {m} differ from AR's output on the same prompt** \
             (they must be token-identical here; see runs.jsonl).\n"
        );
    }
    s.push_str("| dataset | method | runs | tokens | τ micro | τ macro | τ min / median / max | tok/s | speedup | speedup min / median / max | draft prefill ms | draft ms | of which select ms | tree ms | verify ms | commit ms | accepted ≥1 / ≥2 / ≥4 / ≥8 | = AR |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for x in summaries {
        let acc = |d: usize| x.accept_at_least.get(d - 1).copied().unwrap_or(0.0);
        let [t0, t1, t2] = x.tau_spread;
        let [s0, s1, s2] = x.speedup_spread;
        let same = match x.ar_mismatches {
            None => "n/a".to_string(),
            Some(0) => "yes".to_string(),
            Some(n) => format!("**NO ({n})**"),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.2} | {:.2} | {t0:.2} / {t1:.2} / {t2:.2} | {:.1} | {:.2}× | {s0:.2} / {s1:.2} / {s2:.2} | {:.1} | {:.2} | {:.3} | {:.3} | {:.2} | {:.3} | {:.2} / {:.2} / {:.2} / {:.2} | {same} |",
            x.dataset, x.method, x.runs, x.tokens, x.tau_micro, x.tau_macro, x.tok_s, x.speedup,
            x.draft_prefill_ms, x.draft_ms, x.select_ms, x.tree_ms, x.verify_ms, x.commit_ms, acc(1), acc(2), acc(4), acc(8)
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

/// One legend entry of a bar chart: its rectangles as ((x0, y0), (x1, y1)).
struct Series {
    label: String,
    rects: Vec<((f64, f64), (f64, f64))>,
}

/// Axis description of a bar chart: x from 0 to `x_max`, named categories (one per unit) or
/// numeric ticks, and the y extent.
struct Axes<'a> {
    x: std::ops::Range<f64>,
    categories: Option<&'a [&'a str]>,
    x_desc: &'a str,
    y_desc: &'a str,
    y_max: f64,
}

/// Height of the plot kept free above the tallest bar for the legend: one row per series
/// (about 22 px of the 330-px plot) plus a margin, so the legend hides no bar.
fn legend_headroom(series: usize) -> f64 {
    (0.07 * series as f64 + 0.06).min(0.7)
}

/// Draws bars; `axes.y_max` is the tallest bar, the axis is raised to make room for the legend.
fn bar_chart(path: &Path, caption: &str, axes: Axes, series: Vec<Series>) -> Result<()> {
    let y_top = axes.y_max.max(1e-9) / (1.0 - legend_headroom(series.len()));
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(chart_err)?;
    let mut ch = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(axes.x.clone(), 0f64..y_top)
        .map_err(chart_err)?;
    let mut mesh = ch.configure_mesh();
    mesh.disable_x_mesh()
        .y_desc(axes.y_desc)
        .x_desc(axes.x_desc);
    let integer = |x: f64| {
        if (x - x.round()).abs() < 1e-6 {
            format!("{x:.0}")
        } else {
            String::new()
        }
    };
    let fmt = |x: &f64| {
        axes.categories
            .map_or_else(|| integer(*x), |c| category(c, *x))
    };
    if let Some(c) = axes.categories {
        mesh.x_labels(2 * c.len() + 1);
    }
    mesh.x_label_formatter(&fmt).draw().map_err(chart_err)?;
    for (i, s) in series.into_iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        ch.draw_series(
            s.rects
                .into_iter()
                .map(|(a, b)| Rectangle::new([a, b], c.filled())),
        )
        .map_err(chart_err)?
        .label(s.label)
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], c.filled()));
    }
    ch.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(chart_err)?;
    root.present().map_err(chart_err)
}

/// Writes `speedup.svg`, `latency.svg` and `tau_hist.svg` into `dir`.
pub fn charts(summaries: &[Summary], runs: &[Run], dir: &Path) -> Result<()> {
    let datasets: Vec<&str> = dedup(summaries.iter().map(|s| s.dataset.as_str()));
    let methods: Vec<&str> = dedup(summaries.iter().map(|s| s.method.as_str()));
    let rounds_of = |m: &str| -> Vec<&crate::speculative::RoundStats> {
        runs.iter()
            .filter(|r| r.method == m)
            .flat_map(|r| r.rounds.iter())
            .collect()
    };

    // Speedup per dataset, one bar per method.
    let w = 0.8 / methods.len() as f64;
    let series = methods
        .iter()
        .enumerate()
        .map(|(mi, m)| Series {
            label: m.to_string(),
            rects: datasets
                .iter()
                .enumerate()
                .filter_map(|(di, d)| {
                    summaries
                        .iter()
                        .find(|s| s.dataset == *d && s.method == *m)
                        .map(|s| (di, s.speedup))
                })
                .map(|(di, v)| {
                    let x0 = di as f64 + 0.1 + w * mi as f64;
                    ((x0, 0.0), (x0 + w * 0.9, v))
                })
                .collect(),
        })
        .collect();
    let y_max = summaries.iter().map(|s| s.speedup).fold(1.0, f64::max);
    let axes = Axes {
        x: 0.0..datasets.len() as f64,
        categories: Some(&datasets),
        x_desc: "",
        y_desc: "speedup ×",
        y_max,
    };
    bar_chart(
        &dir.join("speedup.svg"),
        "decode speedup over AR",
        axes,
        series,
    )?;

    // Decode latency per generated token, stacked by stage, per method (datasets pooled):
    // the time a stage took over all rounds divided by the tokens those rounds committed.
    let per: Vec<[f64; 4]> = methods
        .iter()
        .map(|m| {
            let rs = rounds_of(m);
            let tokens: usize = rs.iter().map(|r| r.accepted + 1).sum();
            let per_token = |f: fn(&crate::speculative::RoundStats) -> f64| {
                rs.iter().map(|r| f(r)).sum::<f64>() / tokens.max(1) as f64
            };
            [
                per_token(|r| r.draft_ms),
                per_token(|r| r.tree_ms),
                per_token(|r| r.verify_ms),
                per_token(|r| r.commit_ms),
            ]
        })
        .collect();
    let series = ["draft", "tree", "verify", "commit"]
        .iter()
        .enumerate()
        .map(|(si, stage)| Series {
            label: stage.to_string(),
            rects: per
                .iter()
                .enumerate()
                .map(|(mi, v)| {
                    let lo: f64 = v[..si].iter().sum();
                    ((mi as f64 + 0.2, lo), (mi as f64 + 0.8, lo + v[si]))
                })
                .collect(),
        })
        .collect();
    let y_max = per
        .iter()
        .map(|v| v.iter().sum::<f64>())
        .fold(0.0, f64::max);
    let axes = Axes {
        x: 0.0..methods.len().max(1) as f64,
        categories: Some(&methods),
        x_desc: "",
        y_desc: "ms per generated token",
        y_max,
    };
    bar_chart(
        &dir.join("latency.svg"),
        "decode latency per generated token, by stage",
        axes,
        series,
    )?;

    // Histogram of tokens committed per round, per speculative method.
    let spec_methods: Vec<&str> = methods
        .iter()
        .copied()
        .filter(|m| rounds_of(m).iter().any(|r| r.drafted > 0))
        .collect();
    let maxk = runs
        .iter()
        .flat_map(|r| r.rounds.iter())
        .map(|r| r.accepted + 1)
        .max()
        .unwrap_or(1);
    let w = 0.8 / spec_methods.len().max(1) as f64;
    let mut tallest = 0f64;
    let series = spec_methods
        .iter()
        .enumerate()
        .map(|(mi, m)| {
            let rs = rounds_of(m);
            Series {
                label: m.to_string(),
                rects: (1..=maxk)
                    .map(|k| {
                        let f = rs.iter().filter(|r| r.accepted + 1 == k).count() as f64
                            / rs.len().max(1) as f64;
                        tallest = tallest.max(f);
                        let x0 = k as f64 - 0.4 + w * mi as f64;
                        ((x0, 0.0), (x0 + w * 0.9, f))
                    })
                    .collect(),
            }
        })
        .collect();
    let axes = Axes {
        x: 0.5..maxk as f64 + 0.5,
        categories: None,
        x_desc: "tokens committed in a round (τ of the round)",
        y_desc: "fraction of rounds",
        y_max: tallest,
    };
    bar_chart(
        &dir.join("tau_hist.svg"),
        "tokens committed per target pass",
        axes,
        series,
    )
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
