//! The `--drafter` flags of `generate`, `bench` and `serve`, mapped onto the library's
//! [`DrafterConfig`] (which also reads `--speculative-config`).

use anyhow::Result;
use clap::builder::PossibleValue;
use clap::Args;
use paradraft::drafters::speculative_config::{DraftLength, DrafterConfig, Method, Mode};
use std::path::PathBuf;

/// `--drafter` values: the library's methods (and their sampled and tree modes), with their
/// descriptions in `--help`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MethodArg(pub Method);

/// Every `--drafter` value with its name and help (made once; the names live as long as the
/// program, as clap's `'static` values want).
fn listed() -> &'static [(MethodArg, &'static str, String)] {
    static ALL: std::sync::OnceLock<Vec<(MethodArg, &'static str, String)>> =
        std::sync::OnceLock::new();
    ALL.get_or_init(|| {
        Method::listed()
            .into_iter()
            .map(|(m, help)| {
                let name: &'static str = Box::leak(m.to_string().into_boxed_str());
                (MethodArg(m), name, help)
            })
            .collect()
    })
}

impl clap::ValueEnum for MethodArg {
    fn value_variants<'a>() -> &'a [Self] {
        static ARGS: std::sync::OnceLock<Vec<MethodArg>> = std::sync::OnceLock::new();
        ARGS.get_or_init(|| listed().iter().map(|m| m.0).collect())
    }
    fn to_possible_value(&self) -> Option<PossibleValue> {
        let (_, name, help) = listed().iter().find(|m| m.0 == *self)?;
        Some(PossibleValue::new(*name).help(help.clone()))
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
    /// Which drafter proposes tokens (speculative decoding); `none` is plain AR decoding
    /// (default: `auto` for generate; `none` for serve, whose batches gain nothing from
    /// drafting yet, and for bench-kernels).
    #[arg(long, value_enum)]
    pub(crate) drafter: Option<MethodArg>,
    /// A draft model (.gguf or HF directory) for --drafter draft-model, or a DFlash / DART
    /// drafter directory (default: the committed SmolLM2 drafter).
    #[arg(long)]
    pub(crate) draft_model: Option<PathBuf>,
    /// Draft with the target's first N layers (self-speculative) for --drafter draft-model.
    #[arg(long)]
    pub(crate) draft_layers: Option<usize>,
    /// Most draft tokens per round (DFlash: block size − 1 unless --block-size is given).
    #[arg(long, default_value_t = DrafterConfig::default().num_speculative_tokens)]
    pub(crate) num_speculative_tokens: usize,
    /// DFlash block size at run time (default: the size it was trained with).
    #[arg(long)]
    pub(crate) block_size: Option<usize>,
    #[arg(long, default_value_t = DrafterConfig::default().prompt_lookup_min)]
    pub(crate) prompt_lookup_min: usize,
    #[arg(long, default_value_t = DrafterConfig::default().prompt_lookup_max)]
    pub(crate) prompt_lookup_max: usize,
    /// Always draft --num-speculative-tokens; by default each round's draft size is chosen
    /// from the target's measured verify costs and the acceptance so far (none when drafting
    /// does not pay).
    #[arg(long)]
    pub(crate) fixed_draft: bool,
    /// Most nodes of a searched draft tree (dflash-tree, dart).
    #[arg(long, default_value_t = DrafterConfig::default().tree_budget)]
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
    /// How a block drafter's block becomes a draft: greedy (each slot's argmax), sample (each
    /// slot sampled from its distribution), tree (n-gram-pruned tree search), cps (DiffuSpec's
    /// causal-consistency path search); default: the method's own.
    #[arg(long)]
    pub(crate) drafting: Option<String>,
    /// Choose each chain by DiffuSpec's causal-consistency path search over the block's pruned
    /// lattice (dflash, pard); short for --drafting cps.
    #[arg(long)]
    pub(crate) cps: bool,
    /// The 3-gram ARPA model (`paradraft ngram arpa`) that CPS scores drafts with (diffuspec
    /// default: data/ngram/smollm2-135m.arpa).
    #[arg(long)]
    pub(crate) ngram_arpa: Option<PathBuf>,
    /// DiffuSpec without causal-consistency path search: the raw per-slot argmax chain; short
    /// for --drafting greedy.
    #[arg(long)]
    pub(crate) no_cps: bool,
    /// DiffuSpec drafting mode: fast (prefix cached and causal, block bidirectional), faithful
    /// (re-encode prefix and block with full attention each step), auto (as trained).
    #[arg(long, default_value = "auto")]
    pub(crate) dlm_mode: String,
    /// DiffuSpec refinement steps S (1: one pass; S > 1 fixes the most confident slots first).
    #[arg(long, default_value_t = DrafterConfig::default().dlm_steps)]
    pub(crate) dlm_steps: usize,
    /// What --drafter auto drafts from, comma-separated: pld (the request's own text), suffix
    /// (earlier requests' text), trie (the n-gram trie), recycle (the target's own earlier
    /// top candidates), and one model drafter by method name (default: pld,suffix,trie,dart).
    #[arg(long, value_delimiter = ',')]
    pub(crate) sources: Option<Vec<String>>,
    /// Most tokens of earlier requests' text --drafter auto's suffix cache holds (fixed
    /// memory: about 52 bytes per token; 0: no cache).
    #[arg(long, default_value_t = DrafterConfig::default().suffix_cache_tokens)]
    pub(crate) suffix_cache_tokens: usize,
    /// vLLM-style JSON, e.g. '{"method": "pld", "num_speculative_tokens": 8}'; its keys
    /// override the flags above. Keys: method, num_speculative_tokens, model, draft_layers,
    /// block_size, prompt_lookup_min, prompt_lookup_max, tree_budget, ngram, no_ngram,
    /// draft_length, drafting, ngram_arpa, dlm_mode, dlm_steps, sources, suffix_cache_tokens
    /// (and as before: fixed_draft,
    /// cps, no_cps).
    #[arg(long)]
    pub(crate) speculative_config: Option<String>,
}

impl SpecArgs {
    /// The drafter these flags (and `--speculative-config`) choose, `default` where
    /// `--drafter` is not given.
    pub(crate) fn config(&self, default: Method) -> Result<DrafterConfig> {
        let draft_length = match (self.fixed_draft, self.draft_length) {
            (true, Some(DraftLengthArg::Adl)) => {
                anyhow::bail!("--fixed-draft and --draft-length adl exclude each other")
            }
            (true, _) | (false, Some(DraftLengthArg::Fixed)) => DraftLength::Fixed,
            (false, None | Some(DraftLengthArg::Auto)) => DraftLength::Auto,
            (false, Some(DraftLengthArg::Adl)) => DraftLength::Adl,
        };
        let drafting = match (&self.drafting, self.cps, self.no_cps) {
            (None, false, false) => None,
            (Some(m), false, false) => Some(m.parse::<Mode>()?),
            (None, true, false) => Some(Mode::Cps),
            (None, false, true) => Some(Mode::Greedy),
            _ => anyhow::bail!("--drafting, --cps and --no-cps exclude each other"),
        };
        let c = DrafterConfig {
            method: self.drafter.map_or(default, |d| d.0),
            num_speculative_tokens: self.num_speculative_tokens,
            block_size: self.block_size,
            draft_model: self.draft_model.clone(),
            draft_layers: self.draft_layers,
            prompt_lookup_min: self.prompt_lookup_min,
            prompt_lookup_max: self.prompt_lookup_max,
            draft_length,
            tree_budget: self.tree_budget,
            ngram: self.ngram.clone(),
            no_ngram: self.no_ngram,
            drafting,
            ngram_arpa: self.ngram_arpa.clone(),
            dlm_mode: self.dlm_mode.parse()?,
            dlm_steps: self.dlm_steps,
            sources: match &self.sources {
                Some(s) => s.clone(),
                None => DrafterConfig::default().sources,
            },
            suffix_cache_tokens: self.suffix_cache_tokens,
        };
        Ok(match &self.speculative_config {
            Some(js) => c.with_json(js)?,
            None => c,
        })
    }
}
