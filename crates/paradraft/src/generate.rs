//! Autoregressive generation: the speculative loop without a drafter (one AR path: the same
//! checks, sampling, stopping and statistics as every speculative run), and teacher-forced
//! scoring. The request types live in [`crate::request`] (re-exported here).

use crate::drafters::NoDraft;
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::{Model, Tokenizer};
use crate::speculative::{speculative_generate, Speculation, VerifyRule};
use crate::types::TokenId;

pub use crate::request::{GenerateParams, Generation, Stats, StopReason};

/// Generates a continuation of `prompt` token by token, calling `on_text` with each new piece
/// of text as soon as it is final. This is the speculative loop with no drafter (one AR path:
/// the same checks, sampling, stopping and statistics as every speculative run).
pub fn generate(
    model: &Model,
    tok: &Tokenizer,
    kv: &mut KvCache,
    prompt: &[TokenId],
    params: &GenerateParams,
    on_text: impl FnMut(&str),
) -> Result<Generation> {
    let sp = Speculation {
        drafter: Box::new(NoDraft),
        max_draft: 0,
        sizer: None,
        rule: VerifyRule::Coupled,
    };
    Ok(speculative_generate(model, tok, kv, prompt, params, sp, on_text)?.out)
}

/// Teacher-forced scoring: for every position of `ids`, the `k` highest next-token logits
/// (`paradraft logits`).
pub fn top_logits(model: &Model, ids: &[TokenId], k: usize) -> Result<Vec<Vec<(TokenId, f32)>>> {
    use crate::model::{Batch, Logits, OutputSpec, Rows, Scratch};
    if ids.is_empty() {
        return Err(Error::BadRequest("no tokens to score".into()));
    }
    let mut kv = model.new_kv(ids.len());
    let positions: Vec<crate::types::Pos> = (0..ids.len() as u32).map(crate::types::Pos).collect();
    let spec = OutputSpec {
        rows: Rows::All,
        logits: Logits::TopK(k.max(1)),
        taps: vec![],
    };
    let batch = Batch {
        tokens: ids,
        positions: &positions,
        mask: None,
    };
    let mut scratch = Scratch::default();
    Ok(model
        .forward(&mut kv, &batch, &spec, &mut scratch)?
        .top
        .clone())
}
