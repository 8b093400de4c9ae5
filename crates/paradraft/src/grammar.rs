//! Structured output: a grammar — a JSON schema, any JSON object, a Lark grammar or a regex —
//! compiled by llguidance (the constrained-decoding engine llama.cpp and vLLM use) over the
//! model's vocabulary, and per request a [`Constraint`] that masks a row of logits to the
//! tokens the grammar allows after that row's own context.
//!
//! Verify forwards mask each row after *its own* draft path ([`crate::process`]), so the
//! masked distribution at every node is what AR decoding with the grammar would see there, and
//! every drafter stays lossless. A draft token the grammar forbids gets probability 0, so it is
//! never accepted and its row is never read (its mask is not computed).
//!
//! Stop tokens (EOS, end of turn) are allowed exactly where the grammar can end; once it has
//! ended (or if it errs) they are all that is allowed, so the output ends there.

use crate::error::{Error, Result};
use crate::model::Tokenizer;
use crate::types::TokenId;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::sync::Arc;
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON schema (`json_schema`).
    JsonSchema(Value),
    /// A Lark grammar in llguidance's dialect (its regexes, `%json` and the rest).
    Lark(String),
    /// A regular expression the whole output matches.
    Regex(String),
}

impl Grammar {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonObject => {
                TopLevelGrammar::from_json_schema(serde_json::json!({"type": "object"}))
            }
            Grammar::JsonSchema(s) => TopLevelGrammar::from_json_schema(s.clone()),
            Grammar::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Grammar::Regex(r) => TopLevelGrammar::from_regex(r),
        }
    }
}

/// A vocabulary as llguidance sees it (each id's bytes, special ids marked), and its parser
/// factory: built once per model ([`Tokenizer::grammar_env`]).
pub struct GrammarEnv {
    factory: ParserFactory,
    stop: Vec<TokenId>,
    vocab: usize,
}

impl GrammarEnv {
    /// The vocabulary of `tok`, padded to the model's `vocab` logits (ids past the tokenizer's
    /// are never allowed).
    pub fn new(tok: &Tokenizer, vocab: usize) -> Result<GrammarEnv> {
        let bytes = tok.token_bytes();
        let words: Vec<Vec<u8>> = (0..vocab)
            .map(|i| match bytes.get(i) {
                Some(Some(b)) => b.clone(),
                // Special: llguidance's marker byte, then a name no text can produce.
                _ => [
                    &[TokTrie::SPECIAL_TOKEN_MARKER][..],
                    format!("<[{i}]>").as_bytes(),
                ]
                .concat(),
            })
            .collect();
        let stop: Vec<TokenId> = tok.stop_tokens.iter().copied().collect();
        let eos = tok.eos().or(stop.first().copied()).map_or(0, |t| t.0);
        let info = TokRxInfo {
            tok_bos: tok.bos.map(|t| t.0),
            ..TokRxInfo::new(vocab as u32, eos)
        };
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
        let mut factory = ParserFactory::new_simple(&env).map_err(grammar_err)?;
        factory.quiet();
        Ok(GrammarEnv {
            factory,
            stop,
            vocab,
        })
    }

    /// Logits per row this vocabulary masks.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// A fresh constraint for one output (an error names what does not compile).
    pub fn constraint(&self, g: &Grammar) -> Result<Constraint> {
        let parser = self
            .factory
            .create_parser(g.top_level())
            .map_err(grammar_err)?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(Error::BadSampling(format!("the grammar: {e}")));
        }
        Ok(Constraint {
            m,
            stop: self.stop.clone(),
            saved: Vec::new(),
        })
    }
}

fn grammar_err(e: impl std::fmt::Display) -> Error {
    Error::BadSampling(format!("the grammar does not compile: {e:#}"))
}

/// One output's grammar state: the committed tokens consumed.
pub struct Constraint {
    m: Matcher,
    stop: Vec<TokenId>,
    saved: Vec<f32>,
}

impl Constraint {
    /// Commits a token (a stop token ends the output and is not consumed). A token the grammar
    /// refuses (it cannot be sampled from a masked row) leaves the matcher in error: from then
    /// on only stop tokens are allowed.
    pub fn push(&mut self, t: TokenId) {
        if !self.stop.contains(&t) {
            let _ = self.m.consume_tokens(&[t.0]);
        }
    }

    /// Masks `row` (−∞ where disallowed) to what the grammar allows after the committed
    /// tokens and then `path`. Returns false when `path` itself leaves the grammar (the row
    /// is unreachable: its draft token has probability 0 at its parent) and leaves the row as
    /// it is.
    pub fn mask(&mut self, row: &mut [f32], path: &[TokenId]) -> bool {
        let ids: Vec<u32> = path.iter().map(|t| t.0).collect();
        let n = if self.m.is_error() {
            0
        } else {
            self.m.try_consume_tokens(&ids).unwrap_or(0)
        };
        if n < ids.len() {
            let _ = self.m.rollback(n);
            return false;
        }
        let (allowed, can_end) = if self.m.is_stopped() {
            (None, true)
        } else {
            let mask = self.m.compute_mask().ok().filter(|m| !m.is_zero());
            let end = mask.is_none() || self.m.is_accepting().unwrap_or(true);
            (mask, end)
        };
        let _ = self.m.rollback(n);
        self.saved.clear();
        self.saved.extend(
            self.stop
                .iter()
                .map(|s| row.get(s.idx()).copied().unwrap_or(0.0)),
        );
        match &allowed {
            Some(a) => {
                for (i, l) in row.iter_mut().enumerate() {
                    if !a.is_allowed(i as u32) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            None => row.fill(f32::NEG_INFINITY),
        }
        for (s, &v) in self.stop.iter().zip(&self.saved) {
            if let Some(l) = row.get_mut(s.idx()) {
                *l = if can_end { v } else { f32::NEG_INFINITY };
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Tokenizer {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/qwen3");
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        Tokenizer::from_hf_dir(&dir, &cfg).unwrap()
    }

    /// A regex grammar allows exactly the tokens that keep the text a prefix of a match, and
    /// the stop tokens once the text is a whole match.
    #[test]
    fn masks_follow_the_grammar_along_a_path() {
        let tok = tiny();
        let vocab = tok.vocab_size();
        let env = GrammarEnv::new(&tok, vocab).unwrap();
        let mut c = env.constraint(&Grammar::Regex("(yes|no)!".into())).unwrap();
        let stop = *tok.stop_tokens.iter().next().unwrap();
        let allowed = |c: &mut Constraint, path: &[TokenId]| -> Vec<TokenId> {
            let mut row = vec![0.0f32; vocab];
            assert!(c.mask(&mut row, path));
            (0..vocab as u32)
                .map(TokenId)
                .filter(|t| row[t.idx()].is_finite())
                .collect()
        };
        let first = allowed(&mut c, &[]);
        assert!(!first.is_empty());
        for t in &first {
            let s = tok.decode(&[*t]).unwrap();
            assert!("yes!".starts_with(&s) || "no!".starts_with(&s), "{s:?}");
        }
        assert!(!first.contains(&stop));
        let yes = tok.encode("yes!").unwrap();
        let end = allowed(&mut c, &yes);
        assert_eq!(end, tok.stop_tokens.iter().copied().collect::<Vec<_>>());
        // A path the grammar refuses: the row is unreachable.
        let mut row = vec![0.0f32; vocab];
        assert!(!c.mask(&mut row, &tok.encode("maybe").unwrap()));
        // Masks never consumed anything: committing "no" then allows only "!".
        for t in tok.encode("no").unwrap() {
            c.push(t);
        }
        let bang = allowed(&mut c, &[]);
        assert!(bang
            .iter()
            .all(|t| tok.decode(&[*t]).unwrap().starts_with('!')));
        assert!(env.constraint(&Grammar::Regex("(".into())).is_err());
        assert!(env
            .constraint(&Grammar::JsonSchema(serde_json::json!({"type": 5})))
            .is_err());
    }
}
