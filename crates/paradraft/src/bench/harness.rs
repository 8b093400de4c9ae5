//! `paradraft bench`: methods × datasets on one target, the AR baseline through the same code
//! path and interleaved per prompt (so machine noise hits all methods alike), per-round and
//! per-prompt records, and a summary per (dataset, method).

use super::datasets::PromptSet;
use crate::drafters::speculative_config::DrafterSet;
use crate::error::Result;
use crate::model::{Loaded, Message};
use crate::request::GenerateParams;
use crate::sample::SamplingParams;
use crate::speculative::{speculative_generate, RoundStats, SpecGeneration, VerifyRule};
use crate::types::TokenId;
use serde::Serialize;

/// One method under test: a loaded drafter (each run gets its own, with the run's sampling;
/// costs measured for adaptive sizing). The AR baseline is the method `none` through the same
/// loop.
pub struct Contender<'a> {
    pub name: String,
    pub drafters: DrafterSet<'a>,
}

#[derive(Clone, Debug)]
pub struct BenchParams {
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    /// KV capacity; prompts that do not fit with `max_new_tokens` are skipped.
    pub ctx: usize,
    /// How drafts are verified at temperature > 0.
    pub rule: VerifyRule,
}

/// One generation (one turn of one item with one method).
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub dataset: String,
    pub id: String,
    pub turn: usize,
    pub method: String,
    pub prompt_tokens: usize,
    pub generated: usize,
    pub prefill_ms: f64,
    /// The drafter's own prompt pass (not in decode time).
    pub draft_prefill_ms: f64,
    pub decode_ms: f64,
    /// Target passes after the prefill.
    pub target_passes: usize,
    pub tau: f64,
    pub seed: u64,
    /// The generated tokens (compared with AR's at T = 0 and under the coupled rule).
    pub token_ids: Vec<TokenId>,
    pub rounds: Vec<RoundStats>,
}

/// Runs every item of every dataset with every method (AR first), turn by turn; MT-Bench's
/// second turn follows each method's own first answer. `on_run` sees each run as it ends.
pub fn run_bench(
    lm: &Loaded,
    datasets: &[PromptSet],
    methods: &mut [Contender<'_>],
    p: &BenchParams,
    mut on_run: impl FnMut(&Run),
) -> Result<Vec<Run>> {
    let mut kv = lm.model.new_kv(p.ctx);
    let mut runs = Vec::new();
    for set in datasets {
        for (ii, item) in set.items.iter().enumerate() {
            for m in methods.iter_mut() {
                let mut msgs: Vec<Message> = Vec::new();
                if let Some(s) = &item.system {
                    msgs.push(Message::new("system", s));
                }
                for (turn, text) in item.turns.iter().enumerate() {
                    msgs.push(Message::new("user", text));
                    let prompt = lm.tokenizer.encode_chat(&msgs, true)?;
                    if prompt.len() + p.max_new_tokens + 2 > p.ctx {
                        // A later turn after long answers (the first turns are checked before
                        // the bench starts, `suite::check_fits`).
                        eprintln!(
                            "\nnote: {}/{} with {}: turn {} and later skipped ({} prompt tokens + {} new do not fit the {}-token context)",
                            set.name, item.id, m.name, turn + 1, prompt.len(), p.max_new_tokens, p.ctx
                        );
                        break;
                    }
                    let params = GenerateParams {
                        max_new_tokens: p.max_new_tokens,
                        sampling: SamplingParams {
                            seed: p.sampling.seed.wrapping_add(ii as u64 * 1000 + turn as u64),
                            ..p.sampling
                        },
                        stop_strings: vec![],
                        ..Default::default()
                    };
                    let sp = m.drafters.speculation(params.sampling, p.rule)?;
                    let SpecGeneration {
                        out: g,
                        rounds,
                        tau,
                    } = speculative_generate(
                        &lm.model,
                        &lm.tokenizer,
                        &mut kv,
                        &prompt,
                        &params,
                        sp,
                        |_| {},
                    )?;
                    msgs.push(Message::new("assistant", &g.text));
                    let run = Run {
                        dataset: set.name.clone(),
                        id: item.id.clone(),
                        turn,
                        method: m.name.clone(),
                        prompt_tokens: prompt.len(),
                        generated: g.token_ids.len(),
                        prefill_ms: g.stats.prefill_ms,
                        draft_prefill_ms: g.stats.draft_prefill_ms,
                        decode_ms: g.stats.decode_ms,
                        target_passes: rounds.len(),
                        tau,
                        seed: params.sampling.seed,
                        token_ids: g.token_ids,
                        rounds,
                    };
                    on_run(&run);
                    runs.push(run);
                }
            }
        }
    }
    Ok(runs)
}

/// Aggregates of one (dataset, method).
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub dataset: String,
    pub method: String,
    pub runs: usize,
    pub tokens: usize,
    /// Target passes after the prefill.
    pub rounds: usize,
    /// Committed tokens per target pass over all rounds (micro), and the mean of per-run τ (macro).
    pub tau_micro: f64,
    pub tau_macro: f64,
    /// Per-run τ: min / median / max.
    pub tau_spread: [f64; 3],
    /// Decode tokens per second (prefill excluded) and its ratio to the AR baseline's.
    pub tok_s: f64,
    pub speedup: f64,
    /// Per-prompt speedup (against AR on the same prompt): min / median / max.
    pub speedup_spread: [f64; 3],
    pub prefill_ms: f64,
    /// The drafter's own prompt pass, mean per run.
    pub draft_prefill_ms: f64,
    /// Mean per round.
    pub draft_ms: f64,
    /// Of `draft_ms`: the draft's selection (CPS, tree search).
    pub select_ms: f64,
    pub tree_ms: f64,
    pub verify_ms: f64,
    pub commit_ms: f64,
    /// Fraction of rounds that accepted at least d drafts, d = 1, 2, ….
    pub accept_at_least: Vec<f64>,
    /// Runs whose tokens differ from AR's on the same prompt, where they must not (T = 0, or
    /// the coupled rule); `None` where outputs may differ.
    pub ar_mismatches: Option<usize>,
}

/// min / median / max (zeros for no values).
fn spread(mut v: Vec<f64>) -> [f64; 3] {
    if v.is_empty() {
        return [0.0; 3];
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    [v[0], median, v[n - 1]]
}

/// Decode ms per token after the first (which comes from the prefill).
fn ms_per_token(r: &Run) -> f64 {
    r.decode_ms / r.generated.saturating_sub(1).max(1) as f64
}

/// Summaries per (dataset, method) against `baseline`; `identical`: every method's tokens
/// must equal the baseline's on the same prompt (T = 0 or the coupled rule).
pub fn summarize(runs: &[Run], baseline: &str, identical: bool) -> Vec<Summary> {
    let mut keys: Vec<(String, String)> = Vec::new();
    for r in runs {
        let k = (r.dataset.clone(), r.method.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let base_of = |r: &Run| {
        runs.iter().find(|b| {
            b.method == baseline && b.dataset == r.dataset && b.id == r.id && b.turn == r.turn
        })
    };
    let tok_s = |ds: &str, m: &str| {
        let rs: Vec<&Run> = runs
            .iter()
            .filter(|r| r.dataset == ds && r.method == m)
            .collect();
        // The first token of a run comes from the prefill; decode time covers the rest.
        let toks: usize = rs.iter().map(|r| r.generated.saturating_sub(1)).sum();
        let ms: f64 = rs.iter().map(|r| r.decode_ms).sum();
        toks as f64 / (ms / 1e3).max(1e-9)
    };
    keys.iter()
        .map(|(ds, m)| {
            let rs: Vec<&Run> = runs
                .iter()
                .filter(|r| &r.dataset == ds && &r.method == m)
                .collect();
            let rounds: Vec<&RoundStats> = rs.iter().flat_map(|r| r.rounds.iter()).collect();
            let nr = rounds.len().max(1) as f64;
            let mean = |f: fn(&RoundStats) -> f64| {
                rounds.iter().map(|r| f(r)).fold(0.0, |a, b| a + b) / nr
            };
            let per_run =
                |f: fn(&Run) -> f64| rs.iter().map(|r| f(r)).sum::<f64>() / rs.len().max(1) as f64;
            let max_acc = rounds.iter().map(|r| r.accepted).max().unwrap_or(0);
            let ts = tok_s(ds, m);
            Summary {
                dataset: ds.clone(),
                method: m.clone(),
                runs: rs.len(),
                tokens: rs.iter().map(|r| r.generated).sum(),
                rounds: rounds.len(),
                tau_micro: if rounds.is_empty() {
                    1.0
                } else {
                    rounds.iter().map(|r| r.accepted as f64 + 1.0).sum::<f64>() / nr
                },
                tau_macro: per_run(|r| r.tau),
                tau_spread: spread(rs.iter().map(|r| r.tau).collect()),
                tok_s: ts,
                speedup: ts / tok_s(ds, baseline),
                speedup_spread: spread(
                    rs.iter()
                        .filter_map(|r| base_of(r).map(|b| ms_per_token(b) / ms_per_token(r)))
                        .collect(),
                ),
                prefill_ms: per_run(|r| r.prefill_ms),
                draft_prefill_ms: per_run(|r| r.draft_prefill_ms),
                draft_ms: mean(|r| r.draft_ms),
                select_ms: mean(|r| r.select_ms),
                tree_ms: mean(|r| r.tree_ms),
                verify_ms: mean(|r| r.verify_ms),
                commit_ms: mean(|r| r.commit_ms),
                accept_at_least: (1..=max_acc)
                    .map(|d| rounds.iter().filter(|r| r.accepted >= d).count() as f64 / nr)
                    .collect(),
                ar_mismatches: identical.then(|| {
                    rs.iter()
                        .filter(|r| base_of(r).is_none_or(|b| b.token_ids != r.token_ids))
                        .count()
                }),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(method: &str, id: &str, decode_ms: f64, ids: &[u32], taus: &[usize]) -> Run {
        Run {
            dataset: "gsm8k".into(),
            id: id.into(),
            turn: 0,
            method: method.into(),
            prompt_tokens: 10,
            generated: ids.len(),
            prefill_ms: 1.0,
            draft_prefill_ms: 0.0,
            decode_ms,
            target_passes: taus.len(),
            tau: taus.iter().map(|&a| a as f64 + 1.0).sum::<f64>() / taus.len() as f64,
            seed: 0,
            token_ids: ids.iter().map(|&t| TokenId(t)).collect(),
            rounds: taus
                .iter()
                .map(|&a| RoundStats {
                    drafted: 4,
                    accepted: a,
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn spreads_and_mismatches_against_the_baseline() {
        let runs = vec![
            run("ar", "a", 40.0, &[1, 2, 3, 4, 5], &[0, 0, 0, 0]),
            run("x", "a", 20.0, &[1, 2, 3, 4, 5], &[1, 1]),
            run("ar", "b", 40.0, &[7, 8, 9, 9, 9], &[0, 0, 0, 0]),
            run("x", "b", 10.0, &[7, 8, 9, 9, 1], &[3]),
            run("ar", "c", 40.0, &[1, 1, 1, 1, 1], &[0, 0, 0, 0]),
            run("x", "c", 40.0, &[1, 1, 1, 1, 1], &[0, 0, 0, 0]),
        ];
        let s = summarize(&runs, "ar", true);
        let x = s.iter().find(|s| s.method == "x").unwrap();
        assert_eq!(x.speedup_spread, [1.0, 2.0, 4.0]);
        assert_eq!(x.tau_spread, [1.0, 2.0, 4.0]);
        assert_eq!(x.ar_mismatches, Some(1));
        assert_eq!(
            s.iter().find(|s| s.method == "ar").unwrap().ar_mismatches,
            Some(0)
        );
        assert_eq!(summarize(&runs, "ar", false)[1].ar_mismatches, None);
        assert_eq!(
            crate::bench::report::mismatches(&s),
            vec![("gsm8k", "x", 1)]
        );
    }
}
