//! The `--drafter` flags of `generate`, `bench` and `serve`, mapped onto the library's
//! [`DrafterConfig`] (which also reads `--speculative-config`).

use anyhow::Result;
use clap::builder::PossibleValue;
use clap::Args;
use paradraft::drafters::speculative_config::{DraftLength, DrafterConfig, Method};
use std::path::PathBuf;

/// `--drafter` values: the library's methods, with their descriptions in `--help`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MethodArg(pub Method);

impl clap::ValueEnum for MethodArg {
    fn value_variants<'a>() -> &'a [Self] {
        // Every library method, in its order.
        const ALL: [MethodArg; Method::ALL.len()] = {
            let mut out = [MethodArg(Method::None); Method::ALL.len()];
            let mut i = 0;
            while i < out.len() {
                out[i] = MethodArg(Method::ALL[i].0);
                i += 1;
            }
            out
        };
        &ALL
    }
    fn to_possible_value(&self) -> Option<PossibleValue> {
        let (_, name, help) = Method::ALL.iter().find(|m| m.0 == self.0)?;
        Some(PossibleValue::new(*name).help(*help))
    }
}

/// `--draft-length` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DraftLengthArg {
    Auto,
    Fixed,
    Adl,
}

#[derive(Args, Clone, Debug)]
pub struct SpecArgs {
    /// Which drafter proposes tokens (speculative decoding); `none` is plain AR decoding.
    #[arg(long, value_enum, default_value = "none")]
    pub(crate) drafter: MethodArg,
    /// A draft model (.gguf or HF directory) for --drafter draft-model, or a DFlash / DART
    /// drafter directory (default: the committed SmolLM2 drafter).
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
    /// How each round's draft size is chosen: auto (this machine's costs and the acceptance so
    /// far), fixed (always the most; as --fixed-draft), adl (DiffuSpec's adaptive draft length).
    #[arg(long, value_enum)]
    pub(crate) draft_length: Option<DraftLengthArg>,
    /// Choose each chain by DiffuSpec's causal-consistency path search over the block's pruned
    /// lattice (dflash, pard).
    #[arg(long)]
    pub(crate) cps: bool,
    /// The 3-gram ARPA model (`paradraft ngram arpa`) that CPS scores drafts with (diffuspec
    /// default: data/ngram/smollm2-135m.arpa).
    #[arg(long)]
    pub(crate) ngram_arpa: Option<PathBuf>,
    /// DiffuSpec without causal-consistency path search: the raw per-slot argmax chain.
    #[arg(long)]
    pub(crate) no_cps: bool,
    /// DiffuSpec drafting mode: fast (prefix cached and causal, block bidirectional), faithful
    /// (re-encode prefix and block with full attention each step), auto (as trained).
    #[arg(long, default_value = "auto")]
    pub(crate) dlm_mode: String,
    /// DiffuSpec refinement steps S (1: one pass; S > 1 fixes the most confident slots first).
    #[arg(long, default_value_t = 1)]
    pub(crate) dlm_steps: usize,
    /// vLLM-style JSON, e.g. '{"method": "pld", "num_speculative_tokens": 8}'; its keys
    /// override the flags above. Keys: method, num_speculative_tokens, model, draft_layers,
    /// block_size, prompt_lookup_min, prompt_lookup_max, tree_budget, ngram, no_ngram,
    /// fixed_draft, draft_length, cps, ngram_arpa, no_cps, dlm_mode, dlm_steps.
    #[arg(long)]
    pub(crate) speculative_config: Option<String>,
}

impl SpecArgs {
    /// The drafter these flags (and `--speculative-config`) choose.
    pub(crate) fn config(&self) -> Result<DrafterConfig> {
        let c = DrafterConfig {
            method: self.drafter.0,
            num_speculative_tokens: self.num_speculative_tokens,
            block_size: self.block_size,
            draft_model: self.draft_model.clone(),
            draft_layers: self.draft_layers,
            prompt_lookup_min: self.prompt_lookup_min,
            prompt_lookup_max: self.prompt_lookup_max,
            fixed_draft: self.fixed_draft,
            draft_length: match self.draft_length {
                None | Some(DraftLengthArg::Auto) => DraftLength::Auto,
                Some(DraftLengthArg::Fixed) => DraftLength::Fixed,
                Some(DraftLengthArg::Adl) => DraftLength::Adl,
            },
            tree_budget: self.tree_budget,
            ngram: self.ngram.clone(),
            no_ngram: self.no_ngram,
            cps: self.cps,
            ngram_arpa: self.ngram_arpa.clone(),
            no_cps: self.no_cps,
            dlm_mode: self.dlm_mode.parse()?,
            dlm_steps: self.dlm_steps,
        };
        Ok(match &self.speculative_config {
            Some(js) => c.with_json(js)?,
            None => c,
        })
    }
}
