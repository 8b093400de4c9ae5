//! Prompt lookup decoding (n-gram drafting over prompt + output, as llama.cpp's ngram-simple
//! and HF's prompt lookup): find the most recent earlier occurrence of the last n committed
//! tokens (n from `max_ngram` down to `min_ngram`) and propose the tokens that followed it.

use crate::drafters::registry::{LoadArgs, LoadedMethod, MethodEntry, Mode, Template};
use crate::error::{Error, Result};
use crate::sample::SamplingParams;
use crate::speculative::{DraftTree, Drafter, Hidden, Outcome};
use crate::types::TokenId;

#[derive(Clone, Debug)]
pub struct PromptLookup {
    pub min_ngram: usize,
    pub max_ngram: usize,
    /// Most tokens proposed per round.
    pub draft_len: usize,
}

impl Default for PromptLookup {
    fn default() -> Self {
        PromptLookup {
            min_ngram: 1,
            max_ngram: 3,
            draft_len: 8,
        }
    }
}

impl PromptLookup {
    /// The continuation of the latest earlier match of the longest matching suffix.
    pub fn lookup(&self, ctx: &[TokenId], max: usize) -> Vec<TokenId> {
        let want = self.draft_len.min(max);
        for n in (self.min_ngram.max(1)..=self.max_ngram).rev() {
            if ctx.len() <= n {
                continue;
            }
            let suffix = &ctx[ctx.len() - n..];
            // Latest start first, excluding the suffix itself.
            for start in (0..ctx.len() - n).rev() {
                if &ctx[start..start + n] == suffix {
                    let from = start + n;
                    let to = (from + want).min(ctx.len());
                    if to > from {
                        return ctx[from..to].to_vec();
                    }
                }
            }
        }
        Vec::new()
    }
}

impl Drafter for PromptLookup {
    fn name(&self) -> &str {
        "pld"
    }

    fn begin(&mut self, _prompt: &[TokenId], _hidden: Hidden) -> Result<()> {
        Ok(())
    }

    fn propose(&mut self, committed: &[TokenId], max_nodes: usize) -> Result<DraftTree> {
        Ok(DraftTree::chain(&self.lookup(committed, max_nodes)))
    }

    fn observe(&mut self, _outcome: &Outcome, _hidden: Hidden) -> Result<()> {
        Ok(())
    }
}

impl<'t> Template<'t> for PromptLookup {
    fn fork(&self, _: usize, _: SamplingParams) -> Result<Box<dyn Drafter + 't>> {
        Ok(Box::new(self.clone()))
    }
}

pub static METHOD: MethodEntry = MethodEntry {
    name: "pld",
    about: "prompt lookup: n-gram matches over prompt and output",
    modes: &[Mode::Greedy],
    options: &[],
    default_dir: None,
    load,
    label: None,
    prefetch: None,
};

fn load<'t>(a: &LoadArgs<'_, 't>) -> Result<LoadedMethod<'t>> {
    let (min, max, k) = (
        a.cfg.prompt_lookup_min,
        a.cfg.prompt_lookup_max,
        a.cfg.num_speculative_tokens,
    );
    if min == 0 || min > max {
        return Err(Error::BadRequest(
            "prompt lookup needs 1 <= prompt_lookup_min <= prompt_lookup_max".into(),
        ));
    }
    let p = PromptLookup {
        min_ngram: min,
        max_ngram: max,
        draft_len: k,
    };
    Ok(LoadedMethod {
        template: Box::new(p),
        max_draft: k,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[u32]) -> Vec<TokenId> {
        v.iter().map(|&x| TokenId(x)).collect()
    }

    #[test]
    fn finds_latest_longest_match() {
        let p = PromptLookup {
            min_ngram: 1,
            max_ngram: 3,
            draft_len: 3,
        };
        // suffix [1,2] occurs at 0 (→ 3,4,5) and at 5 (→ 9,1,2); the latest wins
        assert_eq!(
            p.lookup(&t(&[1, 2, 3, 4, 5, 1, 2, 9, 1, 2]), 8),
            t(&[9, 1, 2])
        );
        assert_eq!(p.lookup(&t(&[7, 8, 9]), 8), t(&[]));
        assert_eq!(p.lookup(&t(&[5, 6, 5]), 8), t(&[6, 5]));
        assert_eq!(p.lookup(&t(&[1, 2, 3, 4, 5, 1, 2, 9, 1, 2]), 1), t(&[9]));
    }
}
