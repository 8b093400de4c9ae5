//! Tokenizer (from `tokenizer.json`, or built from GGUF metadata: GPT-2-style BPE or
//! SentencePiece), the stop-token set, incremental detokenisation for streaming, and the chat
//! template.

use super::gguf::{GgufFile, Value};
use super::spm::Spm;
use crate::error::{Error, Result};
use crate::types::TokenId;
use std::collections::BTreeSet;
use std::path::Path;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer as HfTokenizer};

/// Names that end a turn in common chat formats; any present in the vocabulary join the stop set.
const END_OF_TURN_NAMES: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "</s>",
    "<|end|>",
    "<end_of_turn>",
];

const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-4o's (o200k) split, which llama.cpp's `gpt-4o` / `llama4` files name (Phi-4-mini).
const GPT4O_REGEX: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

pub struct Tokenizer {
    inner: Inner,
    pub bos: Option<TokenId>,
    pub add_bos: bool,
    /// Tokens that end generation (EOS and end-of-turn tokens).
    pub stop_tokens: BTreeSet<TokenId>,
    pub chat_template: Option<String>,
    pub bos_text: String,
    pub eos_text: String,
    /// This tokenizer's identity (its clones share it): what is built from its vocabulary
    /// once (the grammars' compiled vocabulary) is kept under it.
    id: u64,
}

/// A fresh tokenizer identity.
fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The tokenizer model: HF `tokenizers` (tokenizer.json, or GPT-2-style BPE built from GGUF
/// metadata), or SentencePiece as GGUF files describe it.
enum Inner {
    Hf {
        tok: Box<HfTokenizer>,
        /// `tok` encoding special-token strings as plain text (made on first use).
        plain: std::sync::OnceLock<Box<HfTokenizer>>,
        /// `tok.get_vocab_size(true)`, which builds the whole vocabulary's map at each call
        /// (5 % of a cold `generate --drafter auto`'s samples under `perf`, 2-vCPU Zen 5).
        size: std::sync::OnceLock<usize>,
    },
    Spm(Box<Spm>),
}

impl Inner {
    fn hf(tok: HfTokenizer) -> Inner {
        Inner::Hf {
            tok: Box::new(tok),
            plain: Default::default(),
            size: Default::default(),
        }
    }

    fn token_to_id(&self, s: &str) -> Option<u32> {
        match self {
            Inner::Hf { tok, .. } => tok.token_to_id(s),
            Inner::Spm(m) => m.token_to_id(s),
        }
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        match self {
            Inner::Hf { tok, .. } => tok.id_to_token(id),
            Inner::Spm(m) => m.id_to_token(id).map(String::from),
        }
    }

    /// The bytes each id adds to the text (`None`: special tokens).
    fn token_bytes(&self) -> Vec<Option<Vec<u8>>> {
        match self {
            Inner::Hf { tok, .. } => super::token_bytes::hf(tok),
            Inner::Spm(m) => super::token_bytes::spm(m),
        }
    }

    fn vocab_size(&self) -> usize {
        match self {
            Inner::Hf { tok, size, .. } => *size.get_or_init(|| tok.get_vocab_size(true)),
            Inner::Spm(m) => m.vocab_size(),
        }
    }

    /// Texts of the special tokens a chat template emits.
    fn special_texts(&self) -> Vec<String> {
        match self {
            Inner::Hf { tok, .. } => tok
                .get_added_tokens_decoder()
                .into_values()
                .filter(|t| t.special)
                .map(|t| t.content)
                .collect(),
            Inner::Spm(m) => m.control_texts(),
        }
    }

    /// Encodes pieces of text, each with whether special-token text in it becomes the tokens.
    fn encode(&self, pieces: &[(&str, bool)]) -> Result<Vec<TokenId>> {
        match self {
            Inner::Hf { tok, plain, .. } => {
                let mut ids = Vec::new();
                for &(piece, special) in pieces {
                    if piece.is_empty() {
                        continue;
                    }
                    let t = if special {
                        tok
                    } else {
                        plain.get_or_init(|| {
                            let mut t = (**tok).clone();
                            t.set_encode_special_tokens(true);
                            Box::new(t)
                        })
                    };
                    let enc = t.encode(piece, false).map_err(tok_err)?;
                    ids.extend(enc.get_ids().iter().map(|&i| TokenId(i)));
                }
                Ok(ids)
            }
            Inner::Spm(m) => Ok(m.encode(pieces).into_iter().map(TokenId).collect()),
        }
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            Inner::Hf { tok, .. } => tok.decode(ids, true).map_err(tok_err),
            Inner::Spm(m) => Ok(m.decode(ids)),
        }
    }
}

/// How a rendered conversation ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatEnd {
    /// With the template's generation prompt: the assistant's turn opened.
    Generate,
    /// After the last turn, closed.
    Closed,
    /// Inside the last turn, left open so that generation continues it (vLLM's
    /// `continue_final_message`): the text ends where its content ends.
    Continue,
}

/// A chat turn as chat templates read it. Tool calls take Hugging Face's shape
/// (`{"type": "function", "id", "function": {"name", "arguments": {…}}}`, the arguments an
/// object); a tool's answer names the call it answers.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
        }
    }
}

fn tok_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

impl Tokenizer {
    /// Builds the tokenizer that a GGUF file describes (`tokenizer.ggml.*`).
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let model = g.str("tokenizer.ggml.model").unwrap_or("");
        let id = |key: &str| g.u64(key).map(|v| TokenId(v as u32));
        // SentencePiece: llama.cpp's defaults for it are BOS 1, EOS 2 and a BOS added.
        let spm = model == "llama";
        let bos = id("tokenizer.ggml.bos_token_id").or(spm.then_some(TokenId(1)));
        let eos = id("tokenizer.ggml.eos_token_id").or(spm.then_some(TokenId(2)));
        let inner = match model {
            "gpt2" => Inner::hf(Self::gguf_bpe(g)?),
            "llama" => Inner::Spm(Box::new(Spm::from_gguf(g, bos.map(|b| b.0))?)),
            other => {
                return Err(Error::Unsupported(format!(
                    "GGUF tokenizer model {other:?} (supported: \"gpt2\" byte-level BPE, \"llama\" \
                     SentencePiece); an HF directory with tokenizer.json loads any tokenizer"
                )))
            }
        };
        let add_bos = g
            .get("tokenizer.ggml.add_bos_token")
            .and_then(Value::as_bool)
            .unwrap_or(spm);
        let mut stop_tokens: BTreeSet<TokenId> = eos.into_iter().collect();
        stop_tokens.extend(id("tokenizer.ggml.eot_token_id"));
        let text_of =
            |t: Option<TokenId>| t.and_then(|t| inner.id_to_token(t.0)).unwrap_or_default();
        let mut tk = Tokenizer {
            bos_text: text_of(bos),
            eos_text: text_of(eos),
            inner,
            bos,
            add_bos,
            stop_tokens,
            chat_template: g.str("tokenizer.chat_template").map(String::from),
            id: next_id(),
        };
        tk.add_end_of_turn_tokens();
        Ok(tk)
    }

    /// The GPT-2-style byte-level BPE of a GGUF file (`tokenizer.ggml.model = "gpt2"`).
    fn gguf_bpe(g: &GgufFile) -> Result<HfTokenizer> {
        let strings = |key: &str| -> Result<Vec<String>> {
            let arr = g
                .get(key)
                .and_then(Value::as_array)
                .ok_or_else(|| Error::Tokenizer(format!("GGUF has no {key} array")))?;
            arr.iter()
                .map(|v| {
                    v.as_str()
                        .map(String::from)
                        .ok_or_else(|| tok_err(format!("{key} holds a non-string")))
                })
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges: Vec<(String, String)> = strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| tok_err(format!("bad merge {m:?}")))
            })
            .collect::<Result<_>>()?;
        let types: Vec<u64> = match g.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
            Some(a) => a.iter().map(|v| v.as_u64().unwrap_or(1)).collect(),
            None => vec![1; tokens.len()],
        };
        let vocab: tokenizers::models::bpe::Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(tok_err)?;
        let mut inner = HfTokenizer::new(bpe);
        let byte_level = ByteLevel::new(false, true, true);
        let pre = g.str("tokenizer.ggml.pre").unwrap_or("gpt2");
        let pre_tok: PreTokenizerWrapper = match pre {
            "gpt2" | "default" => byte_level.into(),
            "smollm" => Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into(),
            "llama-bpe" | "llama3" | "qwen2" | "gpt-4o" | "llama4" => {
                let re = match pre {
                    "qwen2" => QWEN2_REGEX,
                    "gpt-4o" | "llama4" => GPT4O_REGEX,
                    _ => LLAMA3_REGEX,
                };
                let split = Split::new(
                    SplitPattern::Regex(re.into()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map_err(tok_err)?;
                Sequence::new(vec![
                    split.into(),
                    ByteLevel::new(false, true, false).into(),
                ])
                .into()
            }
            other => {
                return Err(Error::Unsupported(format!(
                "GGUF pre-tokenizer {other:?} (supported: gpt2, smollm, llama-bpe, qwen2, gpt-4o)"
            )))
            }
        };
        inner.with_pre_tokenizer(Some(pre_tok));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let specials: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, &ty)| ty == 3 || ty == 4)
            .map(|(t, &ty)| AddedToken::from(t.clone(), ty == 3))
            .collect();
        inner.add_special_tokens(&specials);
        Ok(inner)
    }

    /// Loads `tokenizer.json` (+ `tokenizer_config.json`, `generation_config.json`) from an HF
    /// model directory.
    pub fn from_hf_dir(dir: &Path, config: &serde_json::Value) -> Result<Self> {
        let tj = dir.join("tokenizer.json");
        if !tj.exists() {
            return Err(Error::BadModelFile {
                path: dir.to_path_buf(),
                format: "HF model directory",
                reason: "tokenizer.json is missing".into(),
            });
        }
        let inner = HfTokenizer::from_file(&tj)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", tj.display())))?;
        let read_json = |name: &str| -> Result<serde_json::Value> {
            let p = dir.join(name);
            if !p.exists() {
                return Ok(serde_json::Value::Null);
            }
            let text = std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?;
            serde_json::from_str(&text).map_err(|e| Error::BadModelFile {
                path: p,
                format: "JSON",
                reason: e.to_string(),
            })
        };
        let tc = read_json("tokenizer_config.json")?;
        let gc = read_json("generation_config.json")?;
        let token_text = |v: &serde_json::Value| -> Option<String> {
            match v {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Object(o) => {
                    o.get("content").and_then(|c| c.as_str()).map(String::from)
                }
                _ => None,
            }
        };
        let bos_text = token_text(&tc["bos_token"]).unwrap_or_default();
        let eos_text = token_text(&tc["eos_token"]).unwrap_or_default();
        let lookup = |s: &str| inner.token_to_id(s).map(TokenId);
        let ids = |v: &serde_json::Value| -> Vec<TokenId> {
            match v {
                serde_json::Value::Number(n) => {
                    n.as_u64().map(|x| TokenId(x as u32)).into_iter().collect()
                }
                serde_json::Value::Array(a) => a
                    .iter()
                    .filter_map(|x| x.as_u64())
                    .map(|x| TokenId(x as u32))
                    .collect(),
                _ => vec![],
            }
        };
        let bos = ids(&config["bos_token_id"])
            .first()
            .copied()
            .or_else(|| lookup(&bos_text));
        let mut stop_tokens: BTreeSet<TokenId> = ids(&config["eos_token_id"]).into_iter().collect();
        stop_tokens.extend(ids(&gc["eos_token_id"]));
        stop_tokens.extend(lookup(&eos_text));
        let chat_template = match &tc["chat_template"] {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Array(a) => a
                .iter()
                .find(|t| t["name"] == "default")
                .or(a.first())
                .and_then(|t| t["template"].as_str())
                .map(String::from),
            _ => None,
        };
        let add_bos = tc["add_bos_token"].as_bool().unwrap_or(false);
        let mut tk = Tokenizer {
            inner: Inner::hf(inner),
            bos,
            add_bos,
            stop_tokens,
            chat_template,
            bos_text,
            eos_text,
            id: next_id(),
        };
        tk.add_end_of_turn_tokens();
        Ok(tk)
    }

    fn add_end_of_turn_tokens(&mut self) {
        for name in END_OF_TURN_NAMES {
            if let Some(id) = self.inner.token_to_id(name) {
                self.stop_tokens.insert(TokenId(id));
            }
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    /// The bytes each id adds to the text (`None`: special tokens).
    pub fn token_bytes(&self) -> Vec<Option<Vec<u8>>> {
        self.inner.token_bytes()
    }

    /// This tokenizer's identity (shared by its clones, never by another tokenizer).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The id of a token by its text (special tokens included), if the vocabulary has it.
    pub fn token_id(&self, text: &str) -> Option<TokenId> {
        self.inner.token_to_id(text).map(TokenId)
    }

    /// The end-of-sequence token (`eos_text`'s id), if the vocabulary has it.
    pub fn eos(&self) -> Option<TokenId> {
        self.inner.token_to_id(&self.eos_text).map(TokenId)
    }

    /// A 64-bit fingerprint of the vocabulary (every id's token string, in id order): files
    /// built with one tokenizer (n-gram tables) check it against the model they are used with.
    /// Computed once per tokenizer (its clones share it): asked for by every n-gram source a
    /// drafter set loads, it was 9 % of a cold `generate --drafter auto`'s samples under `perf`
    /// (2-vCPU Zen 5, SmolLM2's 49,152 tokens) when each computed it again.
    pub fn fingerprint(&self) -> u64 {
        static KNOWN: std::sync::Mutex<Vec<(u64, u64)>> = std::sync::Mutex::new(Vec::new());
        let known = |id| {
            let k = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
            k.iter().find(|&&(i, _)| i == id).map(|&(_, f)| f)
        };
        if let Some(f) = known(self.id) {
            return f;
        }
        let f = self.compute_fingerprint();
        KNOWN
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((self.id, f));
        f
    }

    fn compute_fingerprint(&self) -> u64 {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for id in 0..self.vocab_size() as u32 {
            let t = self.inner.id_to_token(id).unwrap_or_default();
            h.update((t.len() as u32).to_le_bytes());
            h.update(t.as_bytes());
        }
        u64::from_le_bytes(h.finalize()[..8].try_into().expect("8 bytes"))
    }

    /// Encodes text; special-token strings in it (e.g. `<|im_start|>`) become their ids. A BOS is
    /// prepended when the model asks for one and the text does not already start with it.
    pub fn encode(&self, text: &str) -> Result<Vec<TokenId>> {
        let mut ids = self.inner.encode(&[(text, true)])?;
        if let (true, Some(b)) = (self.add_bos, self.bos) {
            if ids.first() != Some(&b) {
                ids.insert(0, b);
            }
        }
        Ok(ids)
    }

    /// A user's text as a prompt: as given when `raw` (special-token strings included), else
    /// through the chat template after an optional system message (the messages are encoded
    /// as text; the template's control tokens are the only special ones).
    pub fn encode_prompt(
        &self,
        user: &str,
        system: Option<&str>,
        raw: bool,
    ) -> Result<Vec<TokenId>> {
        if raw {
            return self.encode(user);
        }
        let mut msgs = Vec::new();
        if let Some(s) = system {
            msgs.push(Message::new("system", s));
        }
        msgs.push(Message::new("user", user));
        self.encode_chat(&msgs, true)
    }

    /// Renders `messages` with the chat template and encodes the result, with control tokens
    /// from the template only: special-token text inside a message (`<|im_end|>…`) is encoded
    /// as the plain text it is. Messages without such text are encoded exactly as
    /// [`Tokenizer::encode`] of [`Tokenizer::apply_chat_template`] (HF's tokenization).
    pub fn encode_chat(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<Vec<TokenId>> {
        let end = if add_generation_prompt {
            ChatEnd::Generate
        } else {
            ChatEnd::Closed
        };
        self.encode_chat_with(messages, end, &Default::default())
    }

    /// [`Tokenizer::encode_chat`] with more variables for the template (`tools`, a request's
    /// `chat_template_kwargs`); the messages and the special tokens win over them.
    pub fn encode_chat_with(
        &self,
        messages: &[Message],
        end: ChatEnd,
        vars: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Vec<TokenId>> {
        let specials = self.inner.special_texts();
        let risky: Vec<usize> = (0..messages.len())
            .filter(|&i| {
                specials
                    .iter()
                    .any(|sp| messages[i].content.contains(sp.as_str()))
            })
            .collect();
        // Render with a sentinel in place of each such content (to encode the template's
        // pieces with special tokens and the contents as text), and, to continue the last
        // turn, a mark after its content where the text is cut.
        let sentinel = |i: usize| format!("\u{e000}paradraft-content-{i}\u{e001}");
        const CUT: &str = "\u{e000}paradraft-continue\u{e001}";
        let mut msgs = std::borrow::Cow::Borrowed(messages);
        for &i in &risky {
            msgs.to_mut()[i].content = sentinel(i);
        }
        if end == ChatEnd::Continue {
            if let Some(m) = msgs.to_mut().last_mut() {
                m.content.push_str(CUT);
            }
        }
        let mut text = self.render_chat(&msgs, end == ChatEnd::Generate, vars)?;
        if end == ChatEnd::Continue {
            let at = text.rfind(CUT).ok_or_else(|| {
                Error::ChatTemplate(
                    "the template does not write the last message's content as given, so it cannot be continued".into(),
                )
            })?;
            text.truncate(at);
        }
        if risky.is_empty() {
            return self.encode(&text);
        }
        let mut pieces: Vec<(&str, bool)> = Vec::new();
        let mut rest = text.as_str();
        while let Some((at, i)) = risky
            .iter()
            .filter_map(|&i| rest.find(&sentinel(i)).map(|at| (at, i)))
            .min()
        {
            pieces.push((&rest[..at], true));
            pieces.push((&messages[i].content, false));
            rest = &rest[at + sentinel(i).len()..];
        }
        pieces.push((rest, true));
        let mut ids = self.inner.encode(&pieces)?;
        if let (true, Some(b)) = (self.add_bos, self.bos) {
            if ids.first() != Some(&b) {
                ids.insert(0, b);
            }
        }
        Ok(ids)
    }

    /// Decodes ids to text, keeping special tokens out.
    pub fn decode(&self, ids: &[TokenId]) -> Result<String> {
        let raw: Vec<u32> = ids.iter().map(|t| t.0).collect();
        self.inner.decode(&raw)
    }

    /// Renders the chat template (or, without one, joins the turns plainly).
    pub fn apply_chat_template(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_chat(messages, add_generation_prompt, &Default::default())
    }

    fn render_chat(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        vars: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let Some(tpl) = &self.chat_template else {
            let mut s: String = messages
                .iter()
                .map(|m| format!("{}\n", m.content))
                .collect();
            s.pop();
            return Ok(s);
        };
        let mut env = minijinja::Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_filter("tojson", super::pyjson::tojson);
        env.add_function("strftime_now", |_fmt: String| "1 January 2026".to_string());
        let cerr = |e: minijinja::Error| Error::ChatTemplate(format!("{e:#}"));
        env.add_template("chat", tpl).map_err(cerr)?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_text,
            eos_token => self.eos_text,
            ..minijinja::Value::from_serialize(vars)
        };
        env.get_template("chat")
            .map_err(cerr)?
            .render(ctx)
            .map_err(cerr)
    }
}

/// Turns a growing list of generated ids into text increments without splitting multi-byte
/// characters (bytes of an unfinished character are held back). Incremental: each push decodes
/// only the tokens since the last emitted piece, plus a few before them as context (decoders that
/// drop a leading space need it), so a stream costs O(n), not O(n²).
#[derive(Default)]
pub struct StreamDecoder {
    ids: Vec<TokenId>,
    /// Tokens before `prefix` are final; `prefix..read` were decoded into the last piece.
    prefix: usize,
    read: usize,
    text: String,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// The text so far (complete characters only).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Adds a token; returns the new text it completes (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: TokenId) -> Result<&str> {
        self.ids.push(id);
        let before = tok.decode(&self.ids[self.prefix..self.read])?;
        let now = tok.decode(&self.ids[self.prefix..])?;
        if now.ends_with('\u{FFFD}') || now.len() <= before.len() {
            return Ok(""); // an unfinished character, or nothing visible yet
        }
        let start = self.text.len();
        match now.strip_prefix(before.as_str()) {
            Some(new) => self.text.push_str(new),
            None => {
                // The context changed how earlier tokens read: take what the whole output adds
                // to the text already streamed (streamed text is never taken back).
                let all = tok.decode(&self.ids)?;
                if let Some(new) = all.strip_prefix(self.text.as_str()) {
                    self.text.push_str(new);
                }
            }
        }
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(&self.text[start..])
    }
}

/// The tiny Qwen3 fixture's tokenizer (byte-level BPE), for unit tests.
#[cfg(test)]
pub(crate) fn tiny_fixture() -> Tokenizer {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/qwen3");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    Tokenizer::from_hf_dir(&dir, &cfg).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streaming pieces concatenate to the one-shot decode, on a byte-level BPE vocabulary with
    /// multi-byte characters split across tokens.
    #[test]
    fn stream_pieces_add_up_to_the_full_decode() {
        let tok = tiny_fixture();
        for text in [
            "héllo wörld — ünïcode ✓ 漢字 and emoji 🎉🎉 done",
            "  two  spaces\n\nnew lines",
        ] {
            let ids = tok.encode(text).unwrap();
            let mut d = StreamDecoder::new();
            let mut streamed = String::new();
            for &id in &ids {
                streamed.push_str(d.push(&tok, id).unwrap());
                assert!(!streamed.contains('\u{FFFD}'), "{streamed:?}");
            }
            assert_eq!(streamed, tok.decode(&ids).unwrap());
            assert_eq!(d.text(), streamed);
        }
    }

    /// GPT-4o's split (Phi-4-mini's GGUF `pre`): case runs split words, contractions stay on
    /// their word, digits in threes, `/` and line ends stay on punctuation. (On SmolLM2's
    /// vocabulary with `pre` set to `gpt-4o`, llama-tokenize and this engine gave the same ids
    /// for llama.cpp's 45 BPE test strings and 14 more.)
    #[test]
    fn gpt4o_split() {
        use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
        let split = Split::new(
            SplitPattern::Regex(GPT4O_REGEX.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .unwrap();
        let mut s = PreTokenizedString::from("camelCase HTTPServer it's 12345 a/b\n\n x");
        split.pre_tokenize(&mut s).unwrap();
        let pieces: Vec<String> = s
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(p, _, _)| p.to_string())
            .collect();
        assert_eq!(
            pieces,
            [
                "camel",
                "Case",
                " HTTPServer",
                " it's",
                " ",
                "123",
                "45",
                " a",
                "/b",
                "\n\n",
                " x"
            ]
        );
    }

    /// A conversation ends with the generation prompt, closed, or inside its last turn (the
    /// text cut where that turn's content ends, even when the content holds special-token
    /// text); a template that rewrites the content cannot be continued.
    #[test]
    fn chats_end_three_ways() {
        let mut tok = tiny_fixture();
        tok.chat_template = Some(
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}".into(),
        );
        let text = |msgs: &[Message], end| {
            let ids = tok
                .encode_chat_with(msgs, end, &Default::default())
                .unwrap();
            tok.decode(&ids).unwrap()
        };
        let msgs = [
            Message::new("user", "Hi"),
            Message::new("assistant", "Hello, I am"),
        ];
        assert_eq!(
            text(&msgs, ChatEnd::Generate),
            "<user>Hi</user><assistant>Hello, I am</assistant><assistant>"
        );
        assert_eq!(
            text(&msgs, ChatEnd::Closed),
            "<user>Hi</user><assistant>Hello, I am</assistant>"
        );
        assert_eq!(
            text(&msgs, ChatEnd::Continue),
            "<user>Hi</user><assistant>Hello, I am"
        );
        let special = [
            Message::new("user", "Hi"),
            Message::new("assistant", "a <|im_end|> b"),
        ];
        let ids = tok
            .encode_chat_with(&special, ChatEnd::Continue, &Default::default())
            .unwrap();
        let plain = tok.encode("<user>Hi</user><assistant>").unwrap();
        assert_eq!(&ids[..plain.len()], &plain[..]);
        assert!(tok.decode(&ids).unwrap().ends_with("a <|im_end|> b"));
        tok.chat_template =
            Some("{% for m in messages %}{{ m.content | upper }}{% endfor %}".into());
        assert!(tok
            .encode_chat_with(&msgs, ChatEnd::Continue, &Default::default())
            .is_err());
    }
}
