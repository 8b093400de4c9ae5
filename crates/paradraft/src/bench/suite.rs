//! `paradraft bench` as one call: the asked methods loaded next to the AR baseline (costs
//! measured for adaptive sizing), every prompt set run through the harness, and the reports
//! written (runs.jsonl, summary.json, summary.md, charts); outputs that must equal AR's and do
//! not are an error.

use super::datasets::{self, Dataset, PromptSet};
use super::{harness, header, report};
use crate::drafters::speculative_config::{DraftLength, DrafterConfig, Method};
use crate::error::{Error, Result};
use crate::model::Loaded;
use crate::sample::SamplingParams;
use crate::speculative::sizing::CostCurve;
use crate::speculative::VerifyRule;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What one bench run compares, on what, and where its reports go.
pub struct Suite<'a> {
    pub lm: &'a Loaded,
    pub target_path: &'a Path,
    pub ctx: usize,
    /// The options every method is loaded with (its `method` is ignored).
    pub base: &'a DrafterConfig,
    /// The methods next to AR (which always runs, first).
    pub methods: &'a [Method],
    pub sets: Vec<PromptSet>,
    /// Items per set asked for (`None`: all of a prompt file's).
    pub prompts_per_dataset: Option<usize>,
    /// The user's prompt file the sets came from (`None`: the vendored datasets).
    pub prompt_file: Option<&'a Path>,
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    pub rule: VerifyRule,
    pub out: PathBuf,
    /// The commit the binary was built from (for the report header).
    pub commit: &'a str,
}

/// The named prompt sets of `dir`, `n` items each.
pub fn load_sets(names: &[String], dir: &Path, n: usize) -> Result<Vec<PromptSet>> {
    if n == 0 {
        return Err(Error::BadRequest("--num-prompts must be at least 1".into()));
    }
    names
        .iter()
        .map(|name| {
            let d = Dataset::from_name(name).ok_or_else(|| {
                Error::BadRequest(format!("unknown dataset {name:?} (known: mt_bench, humaneval, gsm8k, math500, mbpp, alpaca)"))
            })?;
            Ok(PromptSet {
                name: d.name().to_string(),
                items: d.load(dir, n)?,
            })
        })
        .collect()
}

/// The default prompt sets' directory (the repository's data/bench).
pub fn default_dir() -> PathBuf {
    datasets::default_dir()
}

/// Refuses, before anything runs, a set whose first turn (with its system message) and
/// `max_new` new tokens do not fit a `ctx`-token context, naming the set, item and sizes.
pub fn check_fits(lm: &Loaded, sets: &[PromptSet], max_new: usize, ctx: usize) -> Result<()> {
    for s in sets {
        for it in &s.items {
            let mut msgs = vec![];
            if let Some(sys) = &it.system {
                msgs.push(crate::model::Message::new("system", sys));
            }
            msgs.push(crate::model::Message::new("user", &it.turns[0]));
            let n = lm.tokenizer.encode_chat(&msgs, true)?.len();
            if n + max_new + 2 > ctx {
                return Err(Error::BadRequest(format!(
                    "prompt {} of {}: {n} tokens and {max_new} new do not fit the {ctx}-token \
                     context (raise --ctx-size, lower --max-new-tokens or shorten the prompt)",
                    it.id, s.name
                )));
            }
        }
    }
    Ok(())
}

impl Suite<'_> {
    /// Runs every method on every prompt set and writes the reports: the markdown summary,
    /// and an error naming the runs whose outputs differ from AR's where they must not.
    pub fn run(self) -> Result<(String, Option<Error>)> {
        self.base.check_used(self.methods)?;
        let (lm, ctx) = (self.lm, self.ctx);
        check_fits(lm, &self.sets, self.max_new_tokens, ctx)?;
        let sizing = self.base.draft_length;
        let curve = match sizing {
            DraftLength::Fixed => None,
            _ => Some(CostCurve::measure(&lm.model, 64, 2)?),
        };
        let with = |method| DrafterConfig {
            method,
            ..self.base.clone()
        };
        let mut methods = vec![harness::Contender {
            name: "ar".into(),
            drafters: with(Method::none()).load(self.target_path, lm, ctx)?,
        }];
        for &m in self.methods.iter().filter(|m| !m.is_none()) {
            let cfg = with(m);
            let mut drafters = cfg.load(self.target_path, lm, ctx)?;
            if let Some(c) = &curve {
                drafters.measure_costs(&lm.model, c, !self.sampling.is_greedy())?;
            }
            methods.push(harness::Contender {
                name: cfg.label(),
                drafters,
            });
        }
        let out = &self.out;
        std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
        let log_path = out.join("runs.jsonl");
        let mut log = std::fs::File::create(&log_path).map_err(|e| Error::io(&log_path, e))?;
        let total = self.sets.iter().map(|s| s.items.len()).sum::<usize>() * methods.len();
        let mut done = 0;
        let params = harness::BenchParams {
            max_new_tokens: self.max_new_tokens,
            sampling: self.sampling,
            ctx,
            rule: self.rule,
        };
        let runs = harness::run_bench(lm, &self.sets, &mut methods, &params, |r| {
            let _ = writeln!(log, "{}", serde_json::to_string(r).unwrap_or_default());
            if r.turn == 0 {
                done += 1;
            }
            eprint!(
                "\r[{done}/{total}] {} {} {}: {} tok, tau {:.2}      ",
                r.dataset, r.id, r.method, r.generated, r.tau
            );
        })?;
        eprintln!();
        // What the drafters say of themselves (auto: accepted nodes per source).
        let notes: serde_json::Map<String, serde_json::Value> = methods
            .iter()
            .filter_map(|m| Some((m.name.clone(), m.drafters.report()?.into())))
            .collect();
        for (name, note) in &notes {
            eprintln!("{name}: {}", note.as_str().unwrap_or_default());
        }
        let identical = self.sampling.is_greedy() || self.rule == VerifyRule::Coupled;
        let summaries = harness::summarize(&runs, "ar", identical);
        let header = header::Header::collect(
            &header::Setup {
                model: self.target_path,
                threads: crate::runtime::current_threads(),
                rule: self.rule,
                sizing,
                max_new_tokens: self.max_new_tokens,
                prompts_per_dataset: self.prompts_per_dataset,
                prompt_file: self.prompt_file,
                commit: self.commit,
            },
            &self.sampling,
        );
        write_json(
            &out.join("summary.json"),
            &serde_json::json!({
                "header": header,
                "summaries": summaries,
                "drafters": notes,
                // The verify-cost curve the sizers started from: (rows, ms).
                "verify_curve": curve.as_ref().map(|c| &c.points),
            }),
        )?;
        let mut md = report::markdown(&header, &summaries);
        for (name, note) in &notes {
            md.push_str(&format!(
                "\n{name}: {}\n",
                note.as_str().unwrap_or_default()
            ));
        }
        let md_path = out.join("summary.md");
        std::fs::write(&md_path, &md).map_err(|e| Error::io(&md_path, e))?;
        report::charts(&summaries, &runs, out)?;
        eprintln!(
            "wrote {}/{{runs.jsonl,summary.json,summary.md,speedup.svg,latency.svg,tau_hist.svg}}",
            out.display()
        );
        let bad = report::mismatches(&summaries);
        let lossy = (!bad.is_empty()).then(|| {
            let list: Vec<String> = bad
                .iter()
                .map(|(ds, m, n)| format!("{m} on {ds}: {n} run(s)"))
                .collect();
            Error::BadRequest(format!(
                "outputs differ from AR's where they must be identical ({}): a losslessness bug",
                list.join(", ")
            ))
        });
        Ok((md, lossy))
    }
}

/// `v` as pretty JSON into `path`.
fn write_json(path: &std::path::Path, v: &impl serde::Serialize) -> Result<()> {
    let s = serde_json::to_string_pretty(v)
        .map_err(|e| crate::error::Error::BadRequest(format!("{}: {e}", path.display())))?;
    std::fs::write(path, s).map_err(|e| crate::error::Error::io(path, e))
}
