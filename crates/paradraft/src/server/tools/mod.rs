//! Tools (`tools` / `tool_choice`): how the model hears of them, the grammar that holds it to
//! a call when `tool_choice` asks for one, and the calls read back out of its text.
//!
//! The chat template decides the format ([`Format::of`]):
//! - **Hermes** (`<tool_call>{"name", "arguments"}</tool_call>`; the templates of Qwen 2.5 / 3,
//!   Hermes, SmolLM3 and others), which render the tools and tool turns themselves;
//! - **Llama 3** (`{"name", "parameters"}` as the whole reply), likewise;
//! - **Mistral** (`[TOOL_CALLS]` then a JSON array of `{"name", "arguments"}`; Mistral 7B v0.3,
//!   Nemo, Small): the control token is dropped from the text like every other, so a reply that
//!   is a JSON array of calls reads as calls, and a grammar that asks for a call writes the
//!   token first; call ids are 9 letters and digits, as its templates demand;
//! - **generic**, for a template that knows no tools (SmolLM2's): the tools are described in
//!   a system message and the reply is held by a grammar to `{"tool_calls": [{"name",
//!   "arguments"}]}` or, with `tool_choice: auto`, `{"response": "…"}` (llama-server's generic
//!   format does the same), so even a small model's calls parse.
//!
//! With `required` or a named tool every format is held by a grammar to calls of the offered
//! tools whose arguments satisfy their schemas. Grammars are lossless with every drafter
//! ([`crate::grammar`]), so speculation changes none of this.

use super::error::ApiError;
use crate::grammar::{compact, Grammar};
use crate::model::{ChatEnd, Message, Tokenizer};
use crate::types::TokenId;
use serde_json::{json, Map, Value};

/// How the model is told of tools and writes its calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Hermes,
    Llama3,
    /// With the id of its `[TOOL_CALLS]` token, when the vocabulary has one.
    Mistral(Option<TokenId>),
    Generic,
}

/// The control token a Mistral reply's calls follow.
const MISTRAL_CALLS: &str = "[TOOL_CALLS]";

impl Format {
    /// The format `tok`'s chat template speaks.
    pub fn for_tokenizer(tok: &Tokenizer) -> Format {
        match Format::of(tok.chat_template.as_deref()) {
            Format::Mistral(_) => Format::Mistral(tok.token_id(MISTRAL_CALLS)),
            f => f,
        }
    }

    /// The format a chat template speaks (Mistral's without its token's id).
    pub fn of(template: Option<&str>) -> Format {
        match template {
            Some(t) if t.contains("<tool_call>") => Format::Hermes,
            Some(t) if t.contains(MISTRAL_CALLS) => Format::Mistral(None),
            Some(t)
                if t.contains("tools")
                    && (t.contains("<|python_tag|>") || t.contains("\"parameters\"")) =>
            {
                Format::Llama3
            }
            _ => Format::Generic,
        }
    }

    /// The key a call's arguments take in the model's text.
    fn arguments_key(self) -> &'static str {
        match self {
            Format::Llama3 => "parameters",
            Format::Hermes | Format::Mistral(_) | Format::Generic => "arguments",
        }
    }

    /// The id of call `k` of choice `index` of the response whose id ends in `tail`.
    pub fn call_id(self, tail: &str, index: usize, k: usize) -> String {
        match self {
            // Mistral's templates refuse ids other than 9 letters and digits.
            Format::Mistral(_) => {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                (tail, index, k).hash(&mut h);
                let mut x = h.finish();
                (0..9)
                    .map(|_| {
                        let c = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                            [(x % 62) as usize];
                        x /= 62;
                        c as char
                    })
                    .collect()
            }
            _ => format!("call_{tail}{index:02x}{k:02x}"),
        }
    }
}

/// `tool_choice` when tools are offered.
#[derive(Clone, Debug, PartialEq)]
enum Choice {
    Auto,
    Required,
    Named(String),
}

/// A request's tools, validated.
#[derive(Clone, Debug)]
pub struct Tools {
    format: Format,
    /// As the request gave them (`{"type": "function", "function": {"name", …}}`), each with
    /// `parameters` (an empty object schema where none was given).
    defs: Vec<Value>,
    choice: Choice,
    parallel: bool,
}

fn bad_tools(m: String) -> ApiError {
    ApiError::invalid(m, Some("tools"))
}

fn bad_choice(m: String) -> ApiError {
    ApiError::invalid(m, Some("tool_choice"))
}

/// A function name as OpenAI allows them: 1 to 64 of `a-z A-Z 0-9 _ -`.
fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Tools {
    /// The request's `tools`, `tool_choice` and `parallel_tool_calls` in `format`; `None`
    /// when no tools are offered or `tool_choice` is `"none"`.
    pub fn of_request(
        tools: &Option<Value>,
        choice: &Option<Value>,
        parallel: Option<bool>,
        format: Format,
    ) -> Result<Option<Tools>, ApiError> {
        let mut defs = match tools {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(a)) => a.clone(),
            Some(_) => return Err(bad_tools("tools must be an array".into())),
        };
        let mut names: Vec<String> = vec![];
        for (i, t) in defs.iter_mut().enumerate() {
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(bad_tools(format!("tools[{i}].type must be \"function\"")));
            }
            let Some(f) = t.get_mut("function").and_then(Value::as_object_mut) else {
                return Err(bad_tools(format!("tools[{i}].function must be an object")));
            };
            let name = match f.get("name").and_then(Value::as_str) {
                Some(n) if valid_name(n) => n.to_string(),
                _ => {
                    return Err(bad_tools(format!(
                        "tools[{i}].function.name must be 1 to 64 letters, digits, _ or -"
                    )))
                }
            };
            if names.contains(&name) {
                return Err(bad_tools(format!(
                    "tools[{i}]: a second tool named {name:?}"
                )));
            }
            match f.get("parameters") {
                None | Some(Value::Null) => {
                    f.insert(
                        "parameters".into(),
                        json!({"type": "object", "properties": {}}),
                    );
                }
                Some(Value::Object(_)) => {}
                Some(_) => {
                    return Err(bad_tools(format!(
                        "tools[{i}].function.parameters must be a JSON schema (an object)"
                    )))
                }
            }
            if f.get("description").is_some_and(|d| !d.is_string()) {
                return Err(bad_tools(format!(
                    "tools[{i}].function.description must be a string"
                )));
            }
            names.push(name);
        }
        let choice = match choice {
            None | Some(Value::Null) => Choice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => return Ok(None),
                "auto" => Choice::Auto,
                "required" => Choice::Required,
                _ => {
                    return Err(bad_choice(format!(
                        "tool_choice must be none, auto, required or a function, got {s:?}"
                    )))
                }
            },
            Some(v) => match (
                v.get("type").and_then(Value::as_str),
                v.get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str),
            ) {
                (Some("function"), Some(n)) if names.iter().any(|m| m == n) => {
                    Choice::Named(n.to_string())
                }
                (Some("function"), Some(n)) => {
                    return Err(bad_choice(format!("tool_choice names {n:?}, not in tools")))
                }
                _ => {
                    return Err(bad_choice(
                        "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": …}}"
                            .into(),
                    ))
                }
            },
        };
        if defs.is_empty() {
            return match choice {
                Choice::Auto => Ok(None),
                _ => Err(bad_choice(
                    "tool_choice asks for a tool but tools is empty".into(),
                )),
            };
        }
        Ok(Some(Tools {
            format,
            defs,
            choice,
            // llama-server's default: one call unless the request allows more.
            parallel: parallel.unwrap_or(false),
        }))
    }

    /// The schema of one call of an allowed tool (`{"name", <arguments key>}`), rooted: a
    /// tool's parameters that refer into themselves (`$ref: "#/$defs/…"`) are moved under the
    /// root's `$defs`, their references rewritten to point there, as the call schema is
    /// embedded in others.
    fn call_schema(&self) -> Value {
        let (call, defs) = self.call_parts();
        rooted(call, defs)
    }

    /// [`Tools::call_schema`] before rooting: the call's schema and the `$defs` its root needs.
    fn call_parts(&self) -> (Value, Map<String, Value>) {
        let key = self.format.arguments_key();
        let mut defs = Map::new();
        let allowed: Vec<Value> = self
            .defs
            .iter()
            .map(|t| &t["function"])
            .filter(|f| match &self.choice {
                Choice::Named(n) => f["name"] == **n,
                _ => true,
            })
            .map(|f| {
                let mut params = f["parameters"].clone();
                if has_local_ref(&params) {
                    let at = format!("tool_{}", f["name"].as_str().unwrap_or_default());
                    rebase_refs(&mut params, &format!("#/$defs/{at}"));
                    defs.insert(at.clone(), params);
                    params = json!({"$ref": format!("#/$defs/{at}")});
                }
                json!({
                    "type": "object",
                    "properties": {"name": {"const": f["name"]}, key: params},
                    "required": ["name", key],
                    "additionalProperties": false,
                })
            })
            .collect();
        let call = match <[Value; 1]>::try_from(allowed) {
            Ok([one]) => one,
            Err(all) => json!({"anyOf": all}),
        };
        (call, defs)
    }

    /// An array of `call`s: at least one, at most one unless parallel calls are allowed.
    fn calls(&self, call: Value) -> Value {
        let mut calls = json!({"type": "array", "items": call, "minItems": 1});
        if !self.parallel {
            calls["maxItems"] = json!(1);
        }
        calls
    }

    /// The grammar the reply is held to, if any.
    pub fn grammar(&self) -> Option<Grammar> {
        match (self.format, &self.choice) {
            (Format::Generic, choice) => {
                let (call, defs) = self.call_parts();
                let calls = self.calls(call);
                let call = json!({
                    "type": "object",
                    "properties": {"tool_calls": calls},
                    "required": ["tool_calls"],
                    "additionalProperties": false,
                });
                let answer = json!({
                    "type": "object",
                    "properties": {"response": {"type": "string"}},
                    "required": ["response"],
                    "additionalProperties": false,
                });
                Some(Grammar::JsonSchema(rooted(
                    match choice {
                        Choice::Auto => json!({"anyOf": [call, answer]}),
                        _ => call,
                    },
                    defs,
                )))
            }
            (_, Choice::Auto) => None,
            (Format::Hermes, _) => {
                let call = compact(self.call_schema());
                let start = if self.parallel {
                    "call (\"\\n\" call)*"
                } else {
                    "call"
                };
                Some(Grammar::Lark(format!(
                    "start: {start}\ncall: \"<tool_call>\\n\" %json {call} \"\\n</tool_call>\"\n"
                )))
            }
            (Format::Llama3, _) => Some(Grammar::JsonSchema(self.call_schema())),
            (Format::Mistral(token), _) => {
                let (call, defs) = self.call_parts();
                let calls = rooted(self.calls(call), defs);
                Some(match token {
                    Some(t) => Grammar::Lark(format!(
                        "start: <[{}]> \" \"? %json {}\n",
                        t.0,
                        compact(calls)
                    )),
                    None => Grammar::JsonSchema(calls),
                })
            }
        }
    }

    /// What a template that knows no tools is told of them (a system message).
    fn describe(&self) -> String {
        let mut s = String::from(
            "You can call these tools (their arguments follow the JSON schema given):\n",
        );
        for t in &self.defs {
            let f = &t["function"];
            let mut d = json!({"name": f["name"], "parameters": f["parameters"]});
            if let Some(desc) = f.get("description") {
                d["description"] = desc.clone();
            }
            s.push_str(&compact_json(&d));
            s.push('\n');
        }
        s.push_str(
            "To call tools, reply with only {\"tool_calls\": [{\"name\": <tool name>, \"arguments\": <arguments object>}]}.",
        );
        if self.choice == Choice::Auto {
            s.push_str(" To answer without a tool, reply with only {\"response\": <your answer>}.");
        }
        s
    }
}

/// JSON on one line with `, ` and `: ` (the layout the grammars hold JSON to).
fn compact_json(v: &Value) -> String {
    crate::model::pyjson::dumps(v, None)
}

/// Encodes `msgs` as the prompt, telling the model of `tools` in `format`. A template that
/// knows no tools reads tool calls as the generic reply they were and tool results as `tool`
/// turns — or, where the template refuses those (or a system turn), as user turns.
pub fn encode(
    tok: &Tokenizer,
    mut msgs: Vec<Message>,
    tools: Option<&Tools>,
    format: Format,
    mut vars: Map<String, Value>,
    end: ChatEnd,
) -> crate::error::Result<Vec<TokenId>> {
    if format != Format::Generic {
        if let Some(t) = tools {
            vars.insert("tools".into(), Value::Array(t.defs.clone()));
        }
        return tok.encode_chat_with(&msgs, end, &vars);
    }
    for m in &mut msgs {
        if let Some(calls) = m.tool_calls.take() {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| json!({"name": c["function"]["name"], "arguments": c["function"]["arguments"]}))
                .collect();
            m.content = compact_json(&json!({"tool_calls": calls}));
        }
        if let Some(id) = m.tool_call_id.take() {
            m.content = compact_json(&json!({"tool_call_id": id, "content": m.content}));
        }
    }
    if let Some(t) = tools {
        let text = t.describe();
        match msgs.first_mut() {
            Some(m) if m.role == "system" => m.content = format!("{text}\n\n{}", m.content),
            _ => msgs.insert(0, Message::new("system", &text)),
        }
    }
    let first = tok.encode_chat_with(&msgs, end, &vars);
    if first.is_ok() || !msgs.iter().any(|m| m.role == "tool" || m.role == "system") {
        return first;
    }
    // The template refused a turn: tool turns as user turns, a system turn as the start of
    // the first user turn.
    for m in &mut msgs {
        if m.role == "tool" {
            m.role = "user".into();
        }
    }
    if msgs.first().is_some_and(|m| m.role == "system") && msgs.len() > 1 {
        let sys = msgs.remove(0);
        msgs[0].content = format!("{}\n\n{}", sys.content, msgs[0].content);
    }
    tok.encode_chat_with(&msgs, end, &vars)
}

/// A call read from the model's text: its name and its arguments as JSON text.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub name: String,
    pub arguments: String,
}

/// A reply read: its text for the user (`None`: none besides calls) and its calls.
#[derive(Clone, Debug, PartialEq)]
pub struct Parsed {
    pub content: Option<String>,
    pub calls: Vec<Call>,
}

/// `schema` with `defs` as its root's `$defs` (unchanged when there are none).
fn rooted(mut schema: Value, defs: Map<String, Value>) -> Value {
    if !defs.is_empty() {
        schema["$defs"] = Value::Object(defs);
    }
    schema
}

/// Whether a schema refers into itself (`$ref` `#` or `#/…`) anywhere.
fn has_local_ref(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.iter().any(|(k, x)| {
            (k == "$ref" && x.as_str().is_some_and(|s| s.starts_with('#'))) || has_local_ref(x)
        }),
        Value::Array(a) => a.iter().any(has_local_ref),
        _ => false,
    }
}

/// Rewrites a schema's references into itself to the same places under `base` (a JSON pointer
/// fragment such as `#/$defs/tool_x`), where the schema is moved to.
fn rebase_refs(v: &mut Value, base: &str) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                match x {
                    Value::String(s) if k == "$ref" && s.starts_with('#') => {
                        *s = format!("{base}{}", &s[1..]);
                    }
                    _ => rebase_refs(x, base),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| rebase_refs(x, base)),
        _ => {}
    }
}

/// A call object (`{"name", "arguments" | "parameters"}`) as a [`Call`].
fn call_of(v: &Value) -> Option<Call> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").or_else(|| v.get("parameters"))?;
    let arguments = match args {
        // Some models write the arguments as a JSON string.
        Value::String(s) => serde_json::from_str::<Value>(s).ok()?.to_string(),
        Value::Object(_) => args.to_string(),
        _ => return None,
    };
    Some(Call { name, arguments })
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// The longest end of `s` that begins `tag` (text that may yet become the tag).
fn partial_tag(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

/// The start of the generic format's answer (the grammar's compact layout).
const ANSWER: &str = "{\"response\": \"";

/// How far the body `s` of a JSON string (after its opening quote) can be decoded, from
/// `from` (the end of a complete escape): to its closing quote (`true`) or to the end of its
/// last complete escape.
fn scan_string(s: &str, from: usize) -> (usize, bool) {
    let b = s.as_bytes();
    let mut i = from;
    while i < b.len() {
        match b[i] {
            b'"' => return (i, true),
            b'\\' => {
                let need = match b.get(i + 1) {
                    Some(b'u') => {
                        let hex = s
                            .get(i + 2..i + 6)
                            .and_then(|h| u16::from_str_radix(h, 16).ok());
                        match hex {
                            // A high surrogate needs its low half.
                            Some(h) if (0xD800..0xDC00).contains(&h) => 12,
                            _ => 6,
                        }
                    }
                    _ => 2,
                };
                if i + need > b.len() {
                    break;
                }
                i += need;
            }
            _ => i += 1,
        }
    }
    (i, false)
}

/// The text of JSON string-body bytes holding complete escapes only.
fn unescape(raw: &str) -> String {
    serde_json::from_str(&format!("\"{raw}\"")).unwrap_or_default()
}

/// The text of a JSON string body `s` (after its opening quote) so far: complete escapes
/// only, up to its closing quote if there is one.
fn string_so_far(s: &str) -> String {
    unescape(&s[..scan_string(s, 0).0])
}

/// Reads a reply in `format`: whole ([`read`]) or as it streams ([`Reader::push`]); what a
/// stream sends is always a prefix of the content the whole reply gives.
pub fn read(format: Format, text: &str) -> Parsed {
    let plain = || Parsed {
        content: Some(text.to_string()),
        calls: vec![],
    };
    match format {
        Format::Hermes => {
            let Some(at) = text.find(OPEN) else {
                return plain();
            };
            let mut calls = vec![];
            for part in text[at..].split(OPEN).skip(1) {
                let body = part.split(CLOSE).next().unwrap_or_default();
                match serde_json::from_str::<Value>(body.trim())
                    .ok()
                    .as_ref()
                    .and_then(call_of)
                {
                    Some(c) => calls.push(c),
                    None => return plain(),
                }
            }
            let before = &text[..at];
            Parsed {
                content: (!before.trim().is_empty()).then(|| before.to_string()),
                calls,
            }
        }
        Format::Mistral(_) => match serde_json::from_str::<Value>(text.trim()) {
            Ok(Value::Array(a)) if !a.is_empty() => {
                match a.iter().map(call_of).collect::<Option<Vec<Call>>>() {
                    Some(calls) => Parsed {
                        content: None,
                        calls,
                    },
                    None => plain(),
                }
            }
            _ => plain(),
        },
        Format::Llama3 => match serde_json::from_str::<Value>(text.trim()) {
            Ok(v) => match call_of(&v) {
                Some(c) => Parsed {
                    content: None,
                    calls: vec![c],
                },
                None => plain(),
            },
            Err(_) => plain(),
        },
        Format::Generic => match serde_json::from_str::<Value>(text) {
            Ok(v) => {
                if let Some(r) = v.get("response").and_then(Value::as_str) {
                    return Parsed {
                        content: Some(r.to_string()),
                        calls: vec![],
                    };
                }
                let calls: Option<Vec<Call>> = v
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(call_of).collect());
                match calls {
                    Some(c) if !c.is_empty() => Parsed {
                        content: None,
                        calls: c,
                    },
                    _ => plain(),
                }
            }
            // Cut short (max_tokens): what the answer had said, else the text.
            Err(_) => match text.strip_prefix(ANSWER) {
                Some(rest) => Parsed {
                    content: Some(string_so_far(rest)),
                    calls: vec![],
                },
                None => plain(),
            },
        },
    }
}

/// A streamed reply: content sent as soon as it cannot be the start of a call. Each push
/// looks only at the text not yet decided.
pub struct Reader {
    format: Format,
    text: String,
    /// Bytes of content sent so far.
    sent: usize,
    /// Generic format: bytes of the answer's string body decoded so far.
    scanned: usize,
    /// Whether the text is decided: no more content will be sent before the end (a call
    /// began, the answer's string closed, or the reply is not an answer).
    settled: bool,
    /// Llama 3 / Mistral: the reply is not a call (its first character is not `{` / `[`):
    /// all content.
    plain: bool,
}

impl Reader {
    pub fn new(format: Format) -> Self {
        Reader {
            format,
            text: String::new(),
            sent: 0,
            scanned: 0,
            settled: false,
            plain: false,
        }
    }

    /// Adds generated text; returns the content to send now (possibly empty).
    pub fn push(&mut self, piece: &str) -> String {
        self.text.push_str(piece);
        if self.settled {
            return String::new();
        }
        let t = &self.text;
        let out = match self.format {
            // Sent text never ends in what may begin a call, so a call begins after it.
            Format::Hermes => match t[self.sent..].find(OPEN) {
                Some(k) => {
                    self.settled = true;
                    t[self.sent..self.sent + k].to_string()
                }
                None => t[self.sent..t.len() - partial_tag(t, OPEN)].to_string(),
            },
            Format::Llama3 | Format::Mistral(_) => {
                let opener = if self.format == Format::Llama3 {
                    '{'
                } else {
                    '['
                };
                if !self.plain {
                    match t.trim_start().chars().next() {
                        Some(c) if c == opener => self.settled = true,
                        Some(_) => self.plain = true,
                        None => {}
                    }
                }
                if self.plain {
                    t[self.sent..].to_string()
                } else {
                    String::new()
                }
            }
            Format::Generic => match t.strip_prefix(ANSWER) {
                Some(body) => {
                    let (end, closed) = scan_string(body, self.scanned);
                    let out = unescape(&body[self.scanned..end]);
                    self.scanned = end;
                    self.settled = closed;
                    out
                }
                None => {
                    self.settled = !ANSWER.starts_with(t.as_str());
                    String::new()
                }
            },
        };
        self.sent += out.len();
        out
    }

    /// The reply read whole: the content not sent yet, and the calls.
    pub fn finish(&mut self) -> Parsed {
        let mut p = read(self.format, &self.text);
        p.content = p
            .content
            .map(|c| c.get(self.sent..).unwrap_or_default().to_string());
        if self.sent > 0 && p.content.as_deref() == Some("") {
            p.content = None;
        }
        p
    }
}

#[cfg(test)]
mod tests;
