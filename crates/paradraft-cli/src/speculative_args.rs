//! Drafter selection for `generate` and `bench`: the `--drafter` methods, their options and
//! the vLLM-style `--speculative-config`, and building the chosen drafter.

use anyhow::{bail, Context, Result};
use clap::Args;
use paradraft::drafters::dart::{Dart, DartModel};
use paradraft::drafters::dflash::{Dflash, DflashModel, DraftSampling};
use paradraft::drafters::draft_model::DraftModel;
use paradraft::drafters::pld::PromptLookup;
use paradraft::model;
use paradraft::ngram::NgramTrie;
use paradraft::sample::SamplingParams;
use paradraft::speculative::tree_search::{TreeDrafting, TreeSearchParams};
use paradraft::speculative::Drafter;
use std::path::PathBuf;

/// Which drafter proposes tokens (speculative decoding); `none` is plain AR decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    None,
    /// Prompt lookup: n-gram matches over prompt and output.
    Pld,
    /// A draft model sharing the tokenizer, or the target's first --draft-layers layers.
    #[value(name = "draft-model")]
    #[serde(alias = "draft-model")]
    DraftModel,
    /// DFlash block-diffusion drafter (the committed SmolLM2 drafter unless --draft-model);
    /// at temperature > 0 it drafts greedily (one-hot q).
    Dflash,
    /// DFlash drafting by sampling each slot from the drafter's distribution (q known).
    #[value(name = "dflash-sample")]
    #[serde(alias = "dflash-sample")]
    DflashSample,
    /// DFlash's block searched into a tree with DART's continuity-aware pruning (n-gram
    /// scored unless --no-ngram); --tree-budget nodes at most.
    #[value(name = "dflash-tree")]
    #[serde(alias = "dflash-tree")]
    DflashTree,
    /// DART: a one-layer parallel drafter (the committed SmolLM2 drafter unless --draft-model)
    /// whose per-depth distributions are searched into an n-gram-pruned tree (--no-ngram:
    /// without the trie); --tree-budget nodes at most.
    Dart,
}

/// Where `paradraft ngram build` puts the SmolLM2 trie by default (see the README).
fn default_ngram() -> PathBuf {
    paradraft::fetch::resource_path("data/ngram/smollm2-135m.trie")
}

/// The DART drafter trained for SmolLM2-135M-Instruct that ships with the repository (found in
/// `$PARADRAFT_HOME`, beside the installed binary or in the source tree: `fetch::resource`).
fn default_dart_drafter() -> PathBuf {
    paradraft::fetch::resource_path("drafters/smollm2-135m-dart")
}

/// The DFlash drafter trained for SmolLM2-135M-Instruct that ships with the repository.
fn default_dflash_drafter() -> PathBuf {
    paradraft::fetch::resource_path("drafters/smollm2-135m-dflash")
}

#[derive(Args, Clone, Debug)]
pub struct SpecArgs {
    #[arg(long, value_enum, default_value = "none")]
    pub(crate) drafter: Method,
    /// A draft model (.gguf or HF directory) for --drafter draft-model.
    #[arg(long)]
    pub(crate) draft_model: Option<PathBuf>,
    /// Draft with the target's first N layers (self-speculative) for --drafter draft-model.
    #[arg(long)]
    pub(crate) draft_layers: Option<usize>,
    /// Most draft tokens per round (DFlash: block size − 1 unless --block-size is given).
    #[arg(long, default_value_t = 8)]
    pub(crate) num_speculative_tokens: usize,
    /// DFlash block size at run time (default: the size it was trained with).
    #[arg(long)]
    pub(crate) block_size: Option<usize>,
    #[arg(long, default_value_t = 1)]
    pub(crate) prompt_lookup_min: usize,
    #[arg(long, default_value_t = 3)]
    pub(crate) prompt_lookup_max: usize,
    /// Always draft --num-speculative-tokens; by default each round's draft size is chosen
    /// from the target's measured verify costs and the acceptance so far (none when drafting
    /// does not pay).
    #[arg(long)]
    pub(crate) fixed_draft: bool,
    /// Most nodes of a searched draft tree (dflash-tree, dart).
    #[arg(long, default_value_t = 32)]
    pub(crate) tree_budget: usize,
    /// N-gram trie scoring tree continuity (default: data/ngram/smollm2-135m.trie).
    #[arg(long)]
    pub(crate) ngram: Option<PathBuf>,
    /// Search trees on the drafter's distributions alone.
    #[arg(long)]
    pub(crate) no_ngram: bool,
    /// vLLM-style JSON, e.g. '{"method": "pld", "num_speculative_tokens": 8}'; overrides the
    /// flags above. Keys: method, num_speculative_tokens, model, draft_layers,
    /// prompt_lookup_min, prompt_lookup_max.
    #[arg(long)]
    pub(crate) speculative_config: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecConfig {
    method: Method,
    num_speculative_tokens: Option<usize>,
    block_size: Option<usize>,
    pub(crate) model: Option<PathBuf>,
    draft_layers: Option<usize>,
    prompt_lookup_min: Option<usize>,
    prompt_lookup_max: Option<usize>,
    tree_budget: Option<usize>,
    ngram: Option<PathBuf>,
}

impl SpecArgs {
    pub(crate) fn resolved(&self) -> Result<SpecArgs> {
        let Some(js) = &self.speculative_config else {
            return Ok(self.clone());
        };
        let c: SpecConfig = serde_json::from_str(js).context("--speculative-config")?;
        Ok(SpecArgs {
            drafter: c.method,
            draft_model: c.model.or(self.draft_model.clone()),
            draft_layers: c.draft_layers.or(self.draft_layers),
            num_speculative_tokens: c
                .num_speculative_tokens
                .unwrap_or(self.num_speculative_tokens),
            prompt_lookup_min: c.prompt_lookup_min.unwrap_or(self.prompt_lookup_min),
            prompt_lookup_max: c.prompt_lookup_max.unwrap_or(self.prompt_lookup_max),
            block_size: c.block_size.or(self.block_size),
            fixed_draft: self.fixed_draft,
            tree_budget: c.tree_budget.unwrap_or(self.tree_budget),
            ngram: c.ngram.or(self.ngram.clone()),
            no_ngram: self.no_ngram,
            speculative_config: None,
        })
    }

    /// Refuses options that none of `methods` would use (they would be silently ignored).
    pub(crate) fn check_used(&self, methods: &[Method]) -> Result<()> {
        use Method::*;
        let uses = |ok: &[Method]| methods.iter().any(|m| ok.contains(m));
        let named: Vec<String> = methods
            .iter()
            .map(|m| {
                clap::ValueEnum::to_possible_value(m)
                    .map_or_else(|| format!("{m:?}"), |v| v.get_name().to_string())
            })
            .collect();
        let checks: [(bool, &str, &[Method]); 5] = [
            (
                self.draft_model.is_some(),
                "--draft-model (\"model\")",
                &[DraftModel, Dflash, DflashSample, DflashTree, Dart],
            ),
            (self.draft_layers.is_some(), "--draft-layers", &[DraftModel]),
            (
                self.block_size.is_some(),
                "--block-size",
                &[Dflash, DflashSample, DflashTree, Dart],
            ),
            (self.ngram.is_some(), "--ngram", &[DflashTree, Dart]),
            (self.no_ngram, "--no-ngram", &[DflashTree, Dart]),
        ];
        for (given, name, users) in checks {
            if given && !uses(users) {
                bail!(
                    "{name} has no effect with {} (it applies to {})",
                    named.join(","),
                    users
                        .iter()
                        .filter_map(clap::ValueEnum::to_possible_value)
                        .map(|v| v.get_name().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        Ok(())
    }

    /// Tree search settings, with the n-gram trie unless --no-ngram.
    pub(crate) fn tree_drafting(&self, lm: &model::Loaded, ctx: usize) -> Result<TreeDrafting> {
        if self.tree_budget == 0 || self.tree_budget >= ctx {
            bail!(
                "--tree-budget {} must be between 1 and the context ({ctx} tokens) minus one",
                self.tree_budget
            );
        }
        let ngram = if self.no_ngram {
            None
        } else {
            let path = self.ngram.clone().unwrap_or_else(default_ngram);
            if !path.exists() && self.ngram.is_none() {
                bail!(
                    "no n-gram trie at {}: build it with `paradraft ngram build --corpus FILE.jsonl.gz --out {}` (see the README), or pass --no-ngram",
                    path.display(),
                    path.display()
                );
            }
            let t = NgramTrie::open(&path)?;
            t.check_stamp(paradraft::ngram::stamp_of(&lm.tokenizer), &path)?;
            Some(std::sync::Arc::new(t))
        };
        let stop = lm.tokenizer.stop_tokens.iter().copied().collect();
        Ok(TreeDrafting::new(TreeSearchParams::default(), ngram, stop))
    }

    /// The drafter and the most nodes it may propose per round.
    pub(crate) fn drafter<'a>(
        &self,
        target_path: &std::path::Path,
        lm: &'a model::Loaded,
        ctx: usize,
        sampling: SamplingParams,
    ) -> Result<Option<(Box<dyn Drafter + 'a>, usize)>> {
        if self.drafter == Method::None {
            return Ok(None);
        }
        if self.num_speculative_tokens == 0 || self.num_speculative_tokens >= ctx {
            bail!(
                "num_speculative_tokens {} must be between 1 and the context ({ctx} tokens) minus one",
                self.num_speculative_tokens
            );
        }
        if self.prompt_lookup_max > ctx {
            bail!(
                "prompt_lookup_max {} exceeds the context ({ctx} tokens)",
                self.prompt_lookup_max
            );
        }
        let k = self.num_speculative_tokens;
        Ok(match self.drafter {
            Method::None => None,
            Method::Dflash | Method::DflashSample | Method::DflashTree => {
                let dir = self
                    .draft_model
                    .clone()
                    .unwrap_or_else(default_dflash_drafter);
                let m = DflashModel::load(&dir)
                    .with_context(|| format!("loading DFlash drafter {}", dir.display()))?;
                let mut d = Dflash::new(m, &lm.model, ctx, self.block_size, sampling)?;
                if self.drafter == Method::DflashSample {
                    d.draft_sampling = DraftSampling::Sample;
                }
                let mut max = d.block_size - 1;
                if self.drafter == Method::DflashTree {
                    d.tree = Some(self.tree_drafting(lm, ctx)?);
                    max = self.tree_budget;
                }
                Some((Box::new(d), max))
            }
            Method::Dart => {
                let dir = self
                    .draft_model
                    .clone()
                    .unwrap_or_else(default_dart_drafter);
                let (m, head) = DartModel::load(&dir, true)
                    .with_context(|| format!("loading DART drafter {}", dir.display()))?;
                let tree = self.tree_drafting(lm, ctx)?;
                let masks = self.block_size.map(|b| b.saturating_sub(1));
                let d = Dart::new(m, head, &lm.model, ctx, masks, tree)?;
                Some((Box::new(d), self.tree_budget))
            }
            Method::Pld => {
                if self.prompt_lookup_min == 0 || self.prompt_lookup_min > self.prompt_lookup_max {
                    bail!("prompt lookup needs 1 <= prompt_lookup_min <= prompt_lookup_max");
                }
                Some((
                    Box::new(PromptLookup {
                        min_ngram: self.prompt_lookup_min,
                        max_ngram: self.prompt_lookup_max,
                        draft_len: k,
                    }),
                    k,
                ))
            }
            Method::DraftModel => {
                let draft = match (&self.draft_model, self.draft_layers) {
                    (Some(p), layers) => model::load_truncated(p, layers)
                        .with_context(|| format!("loading draft model {}", p.display()))?,
                    (None, Some(n)) => model::load_truncated(target_path, Some(n))?,
                    (None, None) => {
                        bail!("--drafter draft-model needs --draft-model PATH or --draft-layers N")
                    }
                };
                let vocab = lm.model.config.vocab_size;
                Some((
                    Box::new(DraftModel::new(draft.model, vocab, ctx, k, sampling)?),
                    k,
                ))
            }
        })
    }
}
