//! Autoregressive generation: prefill, then one token per forward, with streaming and stop
//! conditions (stop tokens, stop strings, token budget).

use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::{Batch, Logits, Model, OutputSpec, Rows, Scratch, StreamDecoder, Tokenizer};
use crate::sample::{Sampler, SamplingParams};
use crate::types::{Pos, TokenId};
use serde::Serialize;
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_strings: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A stop token (EOS / end of turn) was generated; it is not part of the output.
    StopToken,
    StopString,
    MaxTokens,
    /// The KV cache is full.
    ContextFull,
}

impl std::fmt::Display for StopReason {
    /// The name JSON output uses (`max_tokens`, …), so text and JSON agree.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StopReason::StopToken => "stop_token",
            StopReason::StopString => "stop_string",
            StopReason::MaxTokens => "max_tokens",
            StopReason::ContextFull => "context_full",
        })
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
}

impl Stats {
    /// The first generated token comes from the prefill; decode speed counts the rest.
    pub fn new(prompt_tokens: usize, generated: usize, prefill_ms: f64, decode_ms: f64) -> Stats {
        Stats {
            prompt_tokens,
            generated_tokens: generated,
            prefill_ms,
            decode_ms,
            prefill_tok_s: prompt_tokens as f64 / (prefill_ms / 1e3),
            decode_tok_s: if generated > 1 {
                (generated - 1) as f64 / (decode_ms / 1e3)
            } else {
                0.0
            },
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Generation {
    pub text: String,
    pub prompt_token_ids: Vec<TokenId>,
    /// Generated ids (a final stop token is not included).
    pub token_ids: Vec<TokenId>,
    pub stop_reason: StopReason,
    pub stats: Stats,
}

/// Holds back text that might be the start of a stop string, so streamed text never has to be
/// taken back.
pub(crate) fn safe_prefix_len(text: &str, stops: &[String]) -> usize {
    let mut cut = text.len();
    for s in stops {
        for (i, _) in text.char_indices().rev().take(s.len()) {
            if s.starts_with(&text[i..]) {
                cut = cut.min(i);
            }
        }
    }
    cut
}

/// Turns committed tokens into streamed text and decides when to stop: stop tokens (not
/// emitted), stop strings (cut from the text), the token budget. Shared by AR and speculative
/// decoding so both stop identically.
pub(crate) struct Emitter<'a> {
    tok: &'a Tokenizer,
    params: &'a GenerateParams,
    ids: Vec<TokenId>,
    dec: StreamDecoder,
    text: String,
    emitted: usize,
}

impl<'a> Emitter<'a> {
    pub(crate) fn new(tok: &'a Tokenizer, params: &'a GenerateParams) -> Self {
        Emitter {
            tok,
            params,
            ids: Vec::new(),
            dec: StreamDecoder::new(),
            text: String::new(),
            emitted: 0,
        }
    }

    /// Commits one token; returns why generation stops, if it does.
    pub(crate) fn push(
        &mut self,
        t: TokenId,
        on_text: &mut impl FnMut(&str),
    ) -> Result<Option<StopReason>> {
        if self.ids.len() >= self.params.max_new_tokens {
            return Ok(Some(StopReason::MaxTokens));
        }
        if self.tok.stop_tokens.contains(&t) {
            return Ok(Some(StopReason::StopToken));
        }
        self.ids.push(t);
        self.text = self.dec.push(self.tok, t)?.0;
        let stops = &self.params.stop_strings;
        if let Some(i) = stops
            .iter()
            .filter_map(|s| self.text.find(s.as_str()))
            .min()
        {
            self.text.truncate(i);
            return Ok(Some(StopReason::StopString));
        }
        let safe = safe_prefix_len(&self.text, stops);
        if safe > self.emitted {
            on_text(&self.text[self.emitted..safe]);
            self.emitted = safe;
        }
        if self.ids.len() >= self.params.max_new_tokens {
            return Ok(Some(StopReason::MaxTokens));
        }
        Ok(None)
    }

    /// Flushes held-back text; returns the final text and ids.
    pub(crate) fn finish(mut self, on_text: &mut impl FnMut(&str)) -> (String, Vec<TokenId>) {
        if self.text.len() > self.emitted {
            on_text(&self.text[self.emitted..]);
        }
        (
            std::mem::take(&mut self.text),
            std::mem::take(&mut self.ids),
        )
    }
}

/// Generates a continuation of `prompt` token by token, calling `on_text` with each new piece
/// of text as soon as it is final.
pub fn generate(
    model: &Model,
    tok: &Tokenizer,
    kv: &mut KvCache,
    prompt: &[TokenId],
    params: &GenerateParams,
    mut on_text: impl FnMut(&str),
) -> Result<Generation> {
    let mut sampler = Sampler::new(params.sampling)?;
    if prompt.is_empty() {
        return Err(Error::BadRequest("the prompt is empty".into()));
    }
    if prompt.len() >= kv.capacity() {
        return Err(Error::ContextOverflow {
            needed: prompt.len() + 1,
            capacity: kv.capacity(),
        });
    }
    kv.clear();
    let mut scratch = Scratch::default();
    let spec = OutputSpec::last_full();
    // Greedy steps ask for the fused argmax (the same output-layer path as greedy verification,
    // so speculative greedy decoding reproduces this loop token for token).
    let greedy = params.sampling.is_greedy();
    let argmax = OutputSpec {
        rows: Rows::Last,
        logits: Logits::Argmax,
        taps: vec![],
    };
    let t0 = Instant::now();
    let positions: Vec<Pos> = (0..prompt.len() as u32).map(Pos).collect();
    let out = model.forward(
        kv,
        &Batch {
            tokens: prompt,
            positions: &positions,
            mask: None,
        },
        &spec,
        &mut scratch,
    )?;
    let mut next = sampler.sample(out.logits_row(0));
    let prefill_ms = t0.elapsed().as_secs_f64() * 1e3;

    let t1 = Instant::now();
    let mut em = Emitter::new(tok, params);
    let stop_reason = loop {
        if let Some(r) = em.push(next, &mut on_text)? {
            break r;
        }
        if kv.len() >= kv.capacity() {
            break StopReason::ContextFull;
        }
        let pos = [Pos(kv.len() as u32)];
        let out = model.forward(
            kv,
            &Batch {
                tokens: &[next],
                positions: &pos,
                mask: None,
            },
            if greedy { &argmax } else { &spec },
            &mut scratch,
        )?;
        next = if greedy {
            out.argmax[0]
        } else {
            sampler.sample(out.logits_row(0))
        };
    };
    let (text, ids) = em.finish(&mut on_text);
    let decode_ms = t1.elapsed().as_secs_f64() * 1e3;
    Ok(Generation {
        text,
        prompt_token_ids: prompt.to_vec(),
        stop_reason,
        stats: Stats::new(prompt.len(), ids.len(), prefill_ms, decode_ms),
        token_ids: ids,
    })
}

#[cfg(test)]
mod tests {
    use super::safe_prefix_len;

    #[test]
    fn holds_back_partial_stop_strings() {
        let stops = vec!["STOP".to_string()];
        assert_eq!(safe_prefix_len("hello ST", &stops), 6);
        assert_eq!(safe_prefix_len("hello", &stops), 5);
        assert_eq!(safe_prefix_len("héllo S", &stops), 7);
    }
}
