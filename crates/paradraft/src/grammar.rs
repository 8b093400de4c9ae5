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
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

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

/// How JSON is laid out unless a schema's own `x-guidance` says otherwise: on one line with
/// `, ` and `: ` separators and no other whitespace. Punctuation and a schema's keys are then
/// forced, so they are drafted for free ([`Constraint::forced`]); with free whitespace almost
/// nothing is (`{"whitespace_flexible": true}` in the schema's `x-guidance` asks for it).
pub(crate) fn compact(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            })
        });
    }
    schema
}

impl Grammar {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            Grammar::JsonSchema(s) => TopLevelGrammar::from_json_schema(compact(s.clone())),
            Grammar::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Grammar::Regex(r) => TopLevelGrammar::from_regex(r),
        }
    }
}

/// A vocabulary as llguidance sees it (each id's bytes, special ids marked), and its parser
/// factory: built once per tokenizer ([`GrammarEnv::of`]).
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
        let env: TokEnv = Arc::new(Greedy(TokTrie::from(&info, &words)));
        let mut factory = ParserFactory::new_simple(&env).map_err(grammar_err)?;
        factory.quiet();
        Ok(GrammarEnv {
            factory,
            stop,
            vocab,
        })
    }

    /// The vocabulary of `tok` compiled for grammars over `vocab` logits, built on first use
    /// and kept for the few tokenizers used last (a server's one, a test's several).
    pub fn of(tok: &Tokenizer, vocab: usize) -> Result<Arc<GrammarEnv>> {
        // Most recently used last; built under the lock, so never twice.
        static KEPT: std::sync::Mutex<Vec<(u64, Arc<GrammarEnv>)>> =
            std::sync::Mutex::new(Vec::new());
        let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
        let env = match kept
            .iter()
            .position(|(id, e)| *id == tok.id() && e.vocab == vocab)
        {
            Some(i) => kept.remove(i).1,
            None => Arc::new(GrammarEnv::new(tok, vocab)?),
        };
        if kept.len() >= 4 {
            kept.remove(0);
        }
        kept.push((tok.id(), env.clone()));
        Ok(env)
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
            walk: Vec::new(),
        })
    }
}

/// The vocabulary's trie, tokenizing bytes greedily (longest token first). It answers "yes"
/// to canonical, so llguidance reports forced tokens: those are drafts ([`Constraint::forced`]),
/// verified like any other, so a tokenization the model would not choose costs a rejected
/// draft, never a different output. Masks do not depend on it.
struct Greedy(TokTrie);

impl TokenizerEnv for Greedy {
    fn tok_trie(&self) -> &TokTrie {
        &self.0
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.0.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        true
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
    /// Tokens [`Constraint::allows`] left consumed past the committed ones (the last path it
    /// judged), so a tree's paths are judged a token at a time; rolled back before anything
    /// else reads the matcher.
    walk: Vec<u32>,
}

impl Constraint {
    /// Commits a token (a stop token ends the output and is not consumed). A token the grammar
    /// refuses (it cannot be sampled from a masked row) leaves the matcher in error: from then
    /// on only stop tokens are allowed.
    pub fn push(&mut self, t: TokenId) {
        self.settle();
        if !self.stop.contains(&t) {
            let _ = self.m.consume_tokens(&[t.0]);
        }
    }

    /// The tokens the grammar forces next, after the committed ones (empty when nothing is
    /// forced, or once the grammar has ended or erred).
    pub fn forced(&mut self) -> Vec<TokenId> {
        self.settle();
        if self.m.is_error() || self.m.is_stopped() {
            return Vec::new();
        }
        self.m
            .compute_ff_tokens()
            .into_iter()
            .map(TokenId)
            .collect()
    }

    /// The tokens among `row`'s `k` best that the grammar allows after `path` and that lie
    /// within `margin` of the best of them, best first — when they are all the allowed ids
    /// within `margin` of the masked row's best (the `k` reach below it) — or `None` (none of
    /// them is allowed, the `k` do not reach that far, or `path` leaves the grammar): then
    /// [`Constraint::mask`] decides. A token the grammar forces is the whole answer, as it is
    /// the whole mask. A greedy row needs no more than this, and checking a few tokens costs
    /// far less than a mask.
    pub fn best(
        &mut self,
        row: &[f32],
        path: &[TokenId],
        k: usize,
        margin: f32,
    ) -> Option<Vec<TokenId>> {
        self.settle();
        if self.m.is_error() {
            return None;
        }
        let ids: Vec<u32> = path.iter().map(|t| t.0).collect();
        let n = self.m.try_consume_tokens(&ids).unwrap_or(0);
        let mut found = None;
        // Where the grammar forces bytes that tokenize to a fixed token, the mask allows that
        // token alone (llguidance's forced tokens), while `validate_tokens` would accept any
        // split of the bytes (`c` + `ategory` for a forced `category`): so that this choice is
        // the mask's, a forced token is the answer.
        let forced = if n == ids.len() && !self.m.is_stopped() {
            self.m.compute_ff_tokens()
        } else {
            Vec::new()
        };
        if let Some(&t) = forced.first().filter(|_| !self.m.is_error()) {
            found = Some(vec![TokenId(t)]);
        } else if n == ids.len() {
            let stopped = self.m.is_stopped();
            let can_end = stopped || self.m.is_accepting().unwrap_or(true);
            let top = crate::runtime::ops::top_k(row, k);
            // The list reaches below the band once it holds every id (fewer than k finite
            // values) or a value under it.
            let mut complete = top.len() < k || top.iter().any(|e| e.1 == f32::NEG_INFINITY);
            let mut band: Vec<TokenId> = Vec::new();
            let mut first = None;
            for &(t, l) in &top {
                if l == f32::NEG_INFINITY || first.is_some_and(|f: f32| l < f - margin) {
                    complete = true;
                    break;
                }
                let ok = if self.stop.contains(&t) {
                    can_end
                } else {
                    !stopped && self.m.validate_tokens(&[t.0]).is_ok_and(|c| c == 1)
                };
                if ok {
                    first.get_or_insert(l);
                    band.push(t);
                }
            }
            if complete && !band.is_empty() {
                found = Some(band);
            }
        }
        let _ = self.m.rollback(n);
        found
    }

    /// Whether the grammar allows `path` after the committed tokens (a path through a stop
    /// token is allowed where the grammar can end there; past one, it is not judged: true).
    /// Incremental: only the tokens after the part `path` shares with the last path judged are
    /// consumed, so judging a tree's nodes in order costs about a token each.
    pub fn allows(&mut self, path: &[TokenId]) -> bool {
        let end = path
            .iter()
            .position(|t| self.stop.contains(t))
            .unwrap_or(path.len());
        let ids: Vec<u32> = path[..end].iter().map(|t| t.0).collect();
        let common = self
            .walk
            .iter()
            .zip(&ids)
            .take_while(|(a, b)| a == b)
            .count();
        if common < self.walk.len() {
            let _ = self.m.rollback(self.walk.len() - common);
            self.walk.truncate(common);
        }
        if self.m.is_error() {
            return true;
        }
        let n = self.m.try_consume_tokens(&ids[common..]).unwrap_or(0);
        self.walk.extend_from_slice(&ids[common..common + n]);
        common + n == ids.len()
            && (end == path.len() || self.m.is_stopped() || self.m.is_accepting().unwrap_or(true))
    }

    /// Rolls back what [`Constraint::allows`] left consumed.
    fn settle(&mut self) {
        if !self.walk.is_empty() {
            let _ = self.m.rollback(self.walk.len());
            self.walk.clear();
        }
    }

    /// Masks `row` (−∞ where disallowed) to what the grammar allows after the committed
    /// tokens and then `path`. Returns false when `path` itself leaves the grammar (the row
    /// is unreachable: its draft token has probability 0 at its parent) and leaves the row as
    /// it is.
    pub fn mask(&mut self, row: &mut [f32], path: &[TokenId]) -> bool {
        self.settle();
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

    /// A regex grammar allows exactly the tokens that keep the text a prefix of a match, and
    /// the stop tokens once the text is a whole match.
    #[test]
    fn masks_follow_the_grammar_along_a_path() {
        let tok = crate::model::tokenizer::tiny_fixture();
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
        // The greedy shortcut picks the masked row's argmax, along any path.
        let mut c = env
            .constraint(&Grammar::JsonSchema(serde_json::json!({
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                "required": ["a", "b"]
            })))
            .unwrap();
        let mut state = 7u64;
        let text = tok.encode("{\"a\": 12, \"b\": \"xy\"}").unwrap();
        for cut in 0..text.len() {
            for _ in 0..20 {
                let row: Vec<f32> = (0..vocab)
                    .map(|_| {
                        state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                        (state >> 40) as f32 / (1u64 << 24) as f32
                    })
                    .collect();
                let mut masked = row.clone();
                assert!(c.mask(&mut masked, &text[..cut]));
                let want = crate::runtime::ops::argmax(&masked);
                // The allowed ids within the margin of the masked row's best, best first.
                let margin = 0.05;
                let band: Vec<TokenId> = crate::runtime::ops::top_k(&masked, vocab)
                    .into_iter()
                    .take_while(|e| e.1 >= masked[want.idx()] - margin)
                    .map(|e| e.0)
                    .collect();
                let top = crate::runtime::ops::top_k(&row, 16);
                match c.best(&row, &text[..cut], 16, margin) {
                    Some(b) => assert_eq!(b, band, "cut {cut}"),
                    None => assert!(
                        !top.iter().any(|e| e.0 == want)
                            || top[15].1 >= masked[want.idx()] - margin,
                        "cut {cut}"
                    ),
                }
            }
        }
        // Paths judged one after another (a tree's nodes) get the answers each gets alone,
        // and leave the matcher as it was.
        let g = Grammar::Regex("(yes|no)!( ok)?".into());
        let paths: Vec<Vec<TokenId>> = [
            "y", "ye", "yes", "yes!", "no", "maybe", "no!", "no! ok", "yes?",
        ]
        .iter()
        .map(|s| tok.encode(s).unwrap())
        .chain([[tok.encode("no!").unwrap(), vec![stop]].concat()])
        .chain([[tok.encode("no").unwrap(), vec![stop]].concat()])
        .collect();
        let mut walked = env.constraint(&g).unwrap();
        let mut before = vec![0.0f32; vocab];
        walked.mask(&mut before, &[]);
        for p in &paths {
            let alone = env.constraint(&g).unwrap().allows(p);
            assert_eq!(walked.allows(p), alone, "{p:?}");
        }
        let mut after = vec![0.0f32; vocab];
        walked.mask(&mut after, &[]);
        assert_eq!(before, after);
        let ok = |s: &str| env.constraint(&g).unwrap().allows(&tok.encode(s).unwrap());
        assert!(ok("yes") && ok("no! o") && !ok("maybe"));
        assert!(env
            .constraint(&g)
            .unwrap()
            .allows(&[tok.encode("no!").unwrap(), vec![stop]].concat()));
        assert!(!env
            .constraint(&g)
            .unwrap()
            .allows(&[tok.encode("no").unwrap(), vec![stop]].concat()));
        assert!(env.constraint(&Grammar::Regex("(".into())).is_err());
        assert!(env
            .constraint(&Grammar::JsonSchema(serde_json::json!({"type": 5})))
            .is_err());
    }
}
