//! What responses and stream chunks report besides the text: `finish_reason`, `usage` (with
//! the request's speculation) and `logprobs` in each endpoint's shape (a token's text is the
//! token decoded alone; `bytes` are that text's UTF-8 bytes).

use crate::model::Tokenizer;
use crate::process::TokenLogprob;
use crate::request::StopReason;
use crate::types::TokenId;
use serde::Serialize;
use serde_json::{json, Map, Value};

/// `finish_reason` of a stop reason.
pub fn finish_reason(r: StopReason) -> &'static str {
    match r {
        StopReason::StopToken | StopReason::StopString => "stop",
        StopReason::MaxTokens | StopReason::ContextFull => "length",
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// The request's own speculation (an extension; clients that do not know it ignore it).
    pub speculative: SpecUsage,
}

/// What speculation did for one request: its decode rounds (target passes after the prompt),
/// the draft nodes verified and accepted in them, and τ, tokens per round.
#[derive(Clone, Debug, Serialize)]
pub struct SpecUsage {
    pub rounds: usize,
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
    pub tau: f64,
}

impl Usage {
    /// The usage of a request of `prompt` tokens whose choices ended as `done` (the prompt
    /// counted once, the rest summed over the choices).
    pub fn of(prompt: usize, done: &[crate::engine::Finished]) -> Self {
        let sum = |f: fn(&crate::engine::Finished) -> usize| done.iter().map(f).sum::<usize>();
        let (completion, rounds) = (sum(|f| f.completion_tokens), sum(|f| f.rounds));
        let accepted = sum(|f| f.accepted);
        let tau = if rounds > 0 {
            (rounds + accepted) as f64 / rounds as f64
        } else {
            0.0
        };
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            speculative: SpecUsage {
                rounds,
                drafted_tokens: sum(|f| f.drafted),
                accepted_tokens: accepted,
                tau: (tau * 1e4).round() / 1e4,
            },
        }
    }
}

fn text(tok: &Tokenizer, id: TokenId) -> String {
    tok.decode(&[id]).unwrap_or_default()
}

/// One entry of chat's `content` list (or of its `top_logprobs`).
fn chat_entry(tok: &Tokenizer, id: TokenId, logprob: f32) -> Value {
    let t = text(tok, id);
    json!({"token": t, "logprob": logprob, "bytes": t.as_bytes()})
}

/// Chat completions: `{"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}`.
pub fn chat(tok: &Tokenizer, lps: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|lp| {
            let mut e = chat_entry(tok, lp.token, lp.logprob);
            e["top_logprobs"] = lp
                .top
                .iter()
                .map(|&(id, l)| chat_entry(tok, id, l))
                .collect();
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Completions (the legacy shape): tokens, their log-probabilities, per token a map of the
/// best alternatives with the sampled token always among them, and each token's offset in
/// the text; `offset` is where the first token starts and moves past the last.
pub fn completion(tok: &Tokenizer, lps: &[TokenLogprob], offset: &mut usize) -> Value {
    let (mut tokens, mut logprobs, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for lp in lps {
        let t = text(tok, lp.token);
        let mut top = Map::new();
        for &(id, l) in &lp.top {
            top.entry(text(tok, id)).or_insert(json!(l));
        }
        top.entry(t.clone()).or_insert(json!(lp.logprob));
        offsets.push(*offset);
        *offset += t.len();
        tokens.push(t);
        logprobs.push(lp.logprob);
        tops.push(Value::Object(top));
    }
    json!({
        "tokens": tokens,
        "token_logprobs": logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    })
}
