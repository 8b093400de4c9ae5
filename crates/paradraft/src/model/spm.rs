//! The SentencePiece tokenizer that a GGUF file describes with `tokenizer.ggml.model = "llama"`
//! (Llama 1/2, Mistral, Phi-3, Gemma, TinyLlama, …), encoding and decoding exactly as llama.cpp
//! does: text is split around special tokens, spaces become `▁` (with a `▁` in front of the
//! first piece and of every piece that follows a special token, unless the file turns the space
//! prefix off), then adjacent symbols are merged, highest vocabulary score first (leftmost on a
//! tie), while the merged text is a token; characters left without a token become their
//! `<0xXX>` byte tokens.

use super::gguf::{GgufFile, Value};
use crate::error::{Error, Result};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// GGUF token types (`tokenizer.ggml.token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl Kind {
    fn of(v: u64) -> Kind {
        match v {
            2 => Kind::Unknown,
            3 => Kind::Control,
            4 => Kind::UserDefined,
            5 => Kind::Unused,
            6 => Kind::Byte,
            _ => Kind::Normal,
        }
    }
}

pub(crate) struct Spm {
    tokens: Vec<String>,
    scores: Vec<f32>,
    kinds: Vec<Kind>,
    ids: HashMap<String, u32>,
    /// The `<0xXX>` token of each byte (or the byte's own one-character token).
    bytes: [Option<u32>; 256],
    /// Control, user-defined and unknown tokens, longest text first: what the text is split
    /// around before merging (control and unknown ones only when special text is parsed).
    specials: Vec<u32>,
    /// Whitespace after a special token is dropped (llama.cpp does so for Phi-3 files).
    rstrip_specials: bool,
    add_space_prefix: bool,
    bos: Option<u32>,
}

fn bad(m: String) -> Error {
    Error::Tokenizer(m)
}

impl Spm {
    pub(crate) fn from_gguf(g: &GgufFile, bos: Option<u32>) -> Result<Spm> {
        let arr = |key: &str| -> Result<&[Value]> {
            g.get(key)
                .and_then(Value::as_array)
                .ok_or_else(|| bad(format!("GGUF has no {key} array")))
        };
        let tokens: Vec<String> = arr("tokenizer.ggml.tokens")?
            .iter()
            .map(|v| {
                v.as_str()
                    .map(String::from)
                    .ok_or_else(|| bad("tokenizer.ggml.tokens holds a non-string".into()))
            })
            .collect::<Result<_>>()?;
        let n = tokens.len();
        let scores: Vec<f32> = match g.get("tokenizer.ggml.scores").and_then(Value::as_array) {
            Some(a) if a.len() == n => a.iter().map(|v| v.as_f64().unwrap_or(0.0) as f32).collect(),
            Some(a) => {
                return Err(bad(format!(
                    "tokenizer.ggml.scores has {} entries for {n} tokens",
                    a.len()
                )))
            }
            None => vec![0.0; n],
        };
        let kinds: Vec<Kind> = match g.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
            Some(a) if a.len() == n => a
                .iter()
                .map(|v| Kind::of(v.as_u64().unwrap_or(1)))
                .collect(),
            Some(a) => {
                return Err(bad(format!(
                    "tokenizer.ggml.token_type has {} entries for {n} tokens",
                    a.len()
                )))
            }
            None => vec![Kind::Normal; n],
        };
        if n == 0 || n > u32::MAX as usize {
            return Err(bad(format!("a vocabulary of {n} tokens")));
        }
        let mut ids = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            // The first id of a duplicated text wins, as in llama.cpp's map.
            ids.entry(t.clone()).or_insert(i as u32);
        }
        let mut bytes = [None; 256];
        for (b, slot) in bytes.iter_mut().enumerate() {
            *slot = ids
                .get(&format!("<0x{b:02X}>"))
                .or_else(|| {
                    std::str::from_utf8(&[b as u8])
                        .ok()
                        .and_then(|s| ids.get(s))
                })
                .copied();
        }
        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                matches!(
                    kinds[i as usize],
                    Kind::Control | Kind::UserDefined | Kind::Unknown
                ) && !tokens[i as usize].is_empty()
            })
            .collect();
        // Longest first; a stable sort keeps id order among equal lengths (as llama.cpp's sort
        // does on its id-ordered list, which is not guaranteed stable but is in practice).
        specials.sort_by_key(|&i| std::cmp::Reverse(tokens[i as usize].len()));
        let name = g.str("general.name").unwrap_or("").to_ascii_lowercase();
        Ok(Spm {
            rstrip_specials: name.contains("phi-3") || name.contains("phi3"),
            add_space_prefix: g
                .get("tokenizer.ggml.add_space_prefix")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            tokens,
            scores,
            kinds,
            ids,
            bytes,
            specials,
            bos,
        })
    }

    pub(crate) fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub(crate) fn token_to_id(&self, s: &str) -> Option<u32> {
        self.ids.get(s).copied()
    }

    pub(crate) fn id_to_token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The bytes token `id` adds to the text (`None`: a control, unknown or unused token).
    pub(crate) fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let t = self.tokens.get(id as usize)?;
        match self.kinds[id as usize] {
            Kind::Control | Kind::Unknown | Kind::Unused => None,
            Kind::UserDefined => Some(t.as_bytes().to_vec()),
            Kind::Normal => Some(t.replace('▁', " ").into_bytes()),
            Kind::Byte => byte_of(t).map(|b| vec![b]),
        }
    }

    /// The texts of the control tokens (what chat templates emit).
    pub(crate) fn control_texts(&self) -> Vec<String> {
        self.specials
            .iter()
            .filter(|&&i| self.kinds[i as usize] == Kind::Control)
            .map(|&i| self.tokens[i as usize].clone())
            .collect()
    }

    /// Whether special token `id` is matched in text: user-defined ones always, control and
    /// unknown ones only when special text is parsed.
    fn matched(&self, id: u32, parse_special: bool) -> bool {
        parse_special || self.kinds[id as usize] == Kind::UserDefined
    }

    /// Encodes pieces of text (each with whether its special-token text is parsed) as one
    /// text: special tokens are found in each piece, and neighbouring plain text of different
    /// pieces is merged as one fragment. No BOS is added.
    pub(crate) fn encode(&self, pieces: &[(&str, bool)]) -> Vec<u32> {
        // Fragments: Ok(text) or Err(token id).
        let mut frags: Vec<std::result::Result<String, u32>> = Vec::new();
        for &(text, parse_special) in pieces {
            let mut part = vec![Ok(text.to_string())];
            for &sp in &self.specials {
                if !self.matched(sp, parse_special) {
                    continue;
                }
                let st = &self.tokens[sp as usize];
                let mut next = Vec::with_capacity(part.len());
                for f in part {
                    let Ok(t) = f else {
                        next.push(f);
                        continue;
                    };
                    let mut rest = t.as_str();
                    while let Some(at) = rest.find(st.as_str()) {
                        if at > 0 {
                            next.push(Ok(rest[..at].to_string()));
                        }
                        next.push(Err(sp));
                        rest = &rest[at + st.len()..];
                        if self.rstrip_specials && self.rstrips(sp) {
                            rest = rest.trim_start_matches(is_c_space);
                        }
                    }
                    if !rest.is_empty() {
                        next.push(Ok(rest.to_string()));
                    }
                }
                part = next;
            }
            for f in part
                .into_iter()
                .filter(|f| f.as_ref().map_or(true, |t| !t.is_empty()))
            {
                match (frags.last_mut(), f) {
                    (Some(Ok(prev)), Ok(t)) => prev.push_str(&t),
                    (_, f) => frags.push(f),
                }
            }
        }
        let mut out = Vec::new();
        let mut prev_special = true;
        for f in frags {
            match f {
                Ok(t) => {
                    let mut s = String::with_capacity(t.len() + 3);
                    if self.add_space_prefix && prev_special {
                        s.push('▁');
                    }
                    s.push_str(&t.replace(' ', "▁"));
                    self.merge(&s, &mut out);
                    prev_special = false;
                }
                Err(id) => {
                    out.push(id);
                    prev_special = true;
                }
            }
        }
        out
    }

    /// llama.cpp's rule for Phi-3 files: every special token strips the whitespace after it,
    /// except `<unk>`, `<s>` and `<|endoftext|>`.
    fn rstrips(&self, id: u32) -> bool {
        !matches!(
            self.tokens[id as usize].as_str(),
            "<unk>" | "<s>" | "<|endoftext|>"
        )
    }

    /// The merge loop over one escaped fragment.
    fn merge(&self, text: &str, out: &mut Vec<u32>) {
        // Symbols: byte ranges of the text, linked as a list.
        struct Sym {
            start: usize,
            len: usize,
            prev: Option<usize>,
            next: Option<usize>,
        }
        let mut syms: Vec<Sym> = Vec::new();
        for (start, c) in text.char_indices() {
            let i = syms.len();
            syms.push(Sym {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: None,
            });
            if i > 0 {
                syms[i - 1].next = Some(i);
            }
        }
        let mut heap = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<Bigram>, syms: &[Sym], l: usize, r: usize| {
            let (a, b) = (&syms[l], &syms[r]);
            let s = &text[a.start..b.start + b.len];
            if let Some(&id) = self.ids.get(s) {
                heap.push(Bigram {
                    score: self.scores[id as usize],
                    left: l,
                    right: r,
                    size: s.len(),
                });
            }
        };
        for i in 1..syms.len() {
            push(&mut heap, &syms, i - 1, i);
        }
        while let Some(bg) = heap.pop() {
            let (l, r) = (bg.left, bg.right);
            if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != bg.size {
                continue; // one side was merged since
            }
            syms[l].len += syms[r].len;
            syms[r].len = 0;
            syms[l].next = syms[r].next;
            if let Some(nx) = syms[r].next {
                syms[nx].prev = Some(l);
            }
            if let Some(p) = syms[l].prev {
                push(&mut heap, &syms, p, l);
            }
            if let Some(nx) = syms[l].next {
                push(&mut heap, &syms, l, nx);
            }
        }
        let mut at = (!syms.is_empty()).then_some(0);
        while let Some(i) = at {
            let s = &text[syms[i].start..syms[i].start + syms[i].len];
            match self.ids.get(s) {
                Some(&id) => out.push(id),
                // A character without a token: its bytes (a byte the vocabulary lacks too is
                // dropped; llama.cpp would throw).
                None => out.extend(s.bytes().filter_map(|b| self.bytes[b as usize])),
            }
            at = syms[i].next;
        }
    }

    /// Decodes ids as llama.cpp's detokenizer does with special tokens removed: `▁` becomes a
    /// space, byte tokens their byte, control and unknown tokens nothing, and the first
    /// token's leading space is dropped when the space prefix is on (unless a BOS leads).
    pub(crate) fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        let mut strip = self.add_space_prefix;
        let ids = match (ids.first(), self.bos) {
            (Some(&f), Some(b)) if f == b => {
                strip = false;
                &ids[1..]
            }
            _ => ids,
        };
        for &id in ids {
            let Some(t) = self.tokens.get(id as usize) else {
                continue;
            };
            let piece: Vec<u8> = match self.kinds[id as usize] {
                Kind::Control | Kind::Unknown | Kind::Unused => vec![],
                Kind::UserDefined => t.as_bytes().to_vec(),
                Kind::Normal => t.replace('▁', " ").into_bytes(),
                Kind::Byte => byte_of(t).into_iter().collect(),
            };
            let piece = match (strip, piece.first()) {
                (true, Some(b' ')) => &piece[1..],
                _ => &piece[..],
            };
            strip = false;
            bytes.extend_from_slice(piece);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// C's `isspace`.
fn is_c_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r')
}

/// The byte of a `<0xXX>` token (or of a one-byte token text).
fn byte_of(t: &str) -> Option<u8> {
    t.strip_prefix("<0x")
        .and_then(|h| h.strip_suffix('>'))
        .and_then(|h| u8::from_str_radix(h, 16).ok())
        .or_else(|| (t.len() == 1).then(|| t.as_bytes()[0]))
}

/// A candidate merge: the higher score first, then the leftmost.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for Bigram {
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.left.cmp(&self.left))
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}

#[cfg(test)]
mod tests {
    use crate::model::gguf::{GgufFile, Value};
    use crate::model::Tokenizer;
    use crate::types::TokenId;
    use std::path::PathBuf;

    fn fixtures() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizers")
    }

    /// Token ids equal llama.cpp's `llama-tokenize` on every fixture string (344 of them: its
    /// own test strings, whitespace runs, special tokens in text, scripts, emoji, byte
    /// fallback, bench prompts), for Llama 2's and Phi-3's vocabularies and for Llama 2's with
    /// the space prefix off (as Gemma files have it); decoding gives the text back.
    #[test]
    fn sentencepiece_ids_equal_llama_cpp() {
        let fx: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(fixtures().join("spm_ids.json")).unwrap(),
        )
        .unwrap();
        let texts: Vec<&str> = fx["strings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        assert!(texts.len() >= 300);
        for (case, file, prefix) in [
            ("llama-spm", "llama-spm.gguf", true),
            ("phi-3", "phi-3.gguf", true),
            ("llama-spm-no-prefix", "llama-spm.gguf", false),
        ] {
            let mut g = GgufFile::open(&fixtures().join(file)).unwrap();
            if !prefix {
                g.metadata
                    .insert("tokenizer.ggml.add_space_prefix".into(), Value::Bool(false));
            }
            let tok = Tokenizer::from_gguf(&g).unwrap();
            let bos = tok.bos.unwrap();
            let (mut same, mut round) = (0, 0);
            for (i, text) in texts.iter().enumerate() {
                let mut want: Vec<TokenId> = fx["ids"][case][i]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| TokenId(v.as_u64().unwrap() as u32))
                    .collect();
                // llama.cpp adds its BOS before a text that starts with one ("<s>…"); this
                // tokenizer does not double it.
                if want.len() >= 2 && want[0] == bos && want[1] == bos {
                    want.remove(0);
                }
                let got = tok.encode(text).unwrap();
                assert_eq!(got, want, "{case}: {text:?}");
                same += 1;
                // Text without special-token text (or a literal `▁`, which reads as a space)
                // decodes back to itself.
                if !text.contains(['<', '[', '▁']) {
                    assert_eq!(tok.decode(&got[1..]).unwrap(), *text, "{case}: {text:?}");
                    round += 1;
                }
            }
            eprintln!("{case}: {same} strings identical, {round} decoded back");
        }
    }
}
