//! A request's parameters, its stop conditions and what it reports: shared by every decode
//! loop (AR generation, one speculative session, the engine's batched sessions), so they all
//! stream and stop identically.

use crate::error::{Error, Result};
use crate::model::{StreamDecoder, Tokenizer};
use crate::process::Processing;
use crate::sample::SamplingParams;
use crate::types::TokenId;
use serde::Serialize;

#[derive(Clone, Debug, Default)]
pub struct GenerateParams {
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_strings: Vec<String>,
    /// Logit bias, penalties and log-probabilities ([`crate::process`]).
    pub processing: Processing,
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
    /// The target's prompt prefill (its first token included).
    pub prefill_ms: f64,
    /// The drafter's own pass over the prompt (0 without a drafter); in neither prefill nor
    /// decode speed, in the end-to-end time.
    pub draft_prefill_ms: f64,
    pub decode_ms: f64,
    /// Prefill, drafter prefill and decode: the request's wall time.
    pub total_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
}

impl Stats {
    /// The first generated token comes from the prefill; decode speed counts the rest.
    pub fn new(
        prompt_tokens: usize,
        generated: usize,
        prefill_ms: f64,
        draft_prefill_ms: f64,
        decode_ms: f64,
    ) -> Stats {
        Stats {
            prompt_tokens,
            generated_tokens: generated,
            prefill_ms,
            draft_prefill_ms,
            decode_ms,
            total_ms: prefill_ms + draft_prefill_ms + decode_ms,
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
    /// Each output token's log-probabilities, when asked for ([`crate::process`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logprobs: Vec<crate::process::TokenLogprob>,
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
    params: GenerateParams,
    ids: Vec<TokenId>,
    dec: StreamDecoder,
    text: String,
    emitted: usize,
}

impl<'a> Emitter<'a> {
    pub(crate) fn new(tok: &'a Tokenizer, params: &GenerateParams) -> Self {
        Emitter {
            tok,
            params: params.clone(),
            ids: Vec::new(),
            dec: StreamDecoder::new(),
            text: String::new(),
            emitted: 0,
        }
    }

    /// Whether `t` ends the sequence (a stop token).
    pub(crate) fn is_stop(&self, t: TokenId) -> bool {
        self.tok.stop_tokens.contains(&t)
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
        let old = self.text.len();
        let piece = self.dec.push(self.tok, t)?;
        self.text.push_str(piece);
        // The text before had no stop string: a new one ends in the new piece, so only the
        // tail is searched (a stream stays O(n)).
        let stops = &self.params.stop_strings;
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = old.saturating_sub(longest.saturating_sub(1));
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        if let Some(i) = stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i))
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

    /// Tokens emitted so far (a stop token and what follows it are not).
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
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

/// Refuses a prompt that cannot start a generation in a cache of `capacity` tokens.
pub(crate) fn check_prompt(prompt: &[TokenId], capacity: usize) -> Result<()> {
    if prompt.is_empty() {
        return Err(Error::BadRequest("the prompt is empty".into()));
    }
    if prompt.len() >= capacity {
        return Err(Error::ContextOverflow {
            needed: prompt.len() + 1,
            capacity,
        });
    }
    Ok(())
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
