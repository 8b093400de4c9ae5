//! The OpenAI API's request and response bodies (chat completions, completions, models,
//! errors) and the validation that turns a request into a prompt and [`GenerateParams`].
//!
//! Requests refuse unknown fields (as the OpenAI API does), naming them; other servers'
//! extension fields are served, accepted where they ask for nothing, or refused by name
//! ([`super::extensions`]). Known fields that this server does
//! not implement are refused when they ask for something (`functions`, audio, `echo`,
//! `suffix`, `best_of`) and accepted when they are at their defaults; bookkeeping fields (`user`, `metadata`,
//! `store`, `service_tier`) are accepted and ignored. `logit_bias`, the presence, frequency and
//! (vLLM's) repetition penalties, `logprobs` ([`crate::process`]), structured output
//! ([`crate::grammar`]), `n` and tools ([`super::tools`]) are served with every drafter.

pub use super::error::ApiError;
use super::extensions;
use super::messages::ChatMessage;
use super::structured::{compile, ConstrainFields};
use super::tools::{self, Format, Tools};
use crate::model::{ChatEnd, Tokenizer};
use crate::process::{Processing, MAX_TOP_LOGPROBS};
use crate::request::GenerateParams;
use crate::sample::SamplingParams;
use crate::types::TokenId;
use serde::Deserialize;
use serde_json::Value;

/// `stop`: one string or up to four.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
    /// Accepted and ignored (usage chunks are never obfuscated here).
    #[serde(default)]
    pub include_obfuscation: Option<bool>,
}

/// `speculative` (an extension): this request's speculation. `enabled: false` or
/// `num_speculative_tokens: 0` drafts nothing (AR decoding, the drafter still following the
/// text); `num_speculative_tokens: N` caps the draft tokens a round verifies below the
/// server's own limit.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeOptions {
    pub enabled: Option<bool>,
    pub num_speculative_tokens: Option<i64>,
}

impl SpeculativeOptions {
    /// The most draft tokens a round may verify for this request (`None`: the server's).
    fn max_draft(o: &Option<SpeculativeOptions>) -> Result<Option<usize>, ApiError> {
        let Some(o) = o else {
            return Ok(None);
        };
        let n = match o.num_speculative_tokens {
            Some(n) if !(0..=256).contains(&n) => {
                return Err(ApiError::invalid(
                    format!("speculative.num_speculative_tokens must be in 0..=256, got {n}"),
                    Some("speculative"),
                ))
            }
            n => n.map(|n| n as usize),
        };
        Ok(match o.enabled {
            Some(false) => Some(0),
            _ => n,
        })
    }
}

/// `POST /v1/chat/completions`.
#[derive(Clone, Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Not in the OpenAI API; vLLM and llama.cpp accept it.
    pub top_k: Option<i64>,
    /// Not in the OpenAI API; vLLM and llama.cpp accept it (vLLM not while speculating).
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<i64>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    /// Not in the OpenAI API; vLLM accepts it.
    pub repetition_penalty: Option<f64>,
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub user: Option<String>,
    pub metadata: Option<Value>,
    pub store: Option<bool>,
    pub service_tier: Option<String>,
    pub parallel_tool_calls: Option<bool>,
    pub reasoning_effort: Option<String>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    /// Variables for the chat template (vLLM's and llama-server's extension), e.g.
    /// `{"enable_thinking": false}`.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    pub functions: Option<Value>,
    pub function_call: Option<Value>,
    pub response_format: Option<Value>,
    pub modalities: Option<Value>,
    pub audio: Option<Value>,
    pub prediction: Option<Value>,
    pub web_search_options: Option<Value>,
    pub speculative: Option<SpeculativeOptions>,
    /// Structured-output extensions ([`ConstrainFields`]).
    pub grammar: Option<String>,
    pub json_schema: Option<Value>,
    pub regex: Option<String>,
    /// Every other field: other servers' extensions ([`super::extensions`]) or unknown.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

/// `POST /v1/completions`.
#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Value,
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<i64>,
    pub best_of: Option<i64>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    pub logprobs: Option<i64>,
    pub user: Option<String>,
    pub speculative: Option<SpeculativeOptions>,
    /// vLLM accepts it on completions too.
    pub response_format: Option<Value>,
    pub grammar: Option<String>,
    pub json_schema: Option<Value>,
    pub regex: Option<String>,
    /// Every other field: other servers' extensions ([`super::extensions`]) or unknown.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

/// What both endpoints validate the same way.
pub struct Knobs<'r> {
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: &'r Option<Stop>,
    pub n: Option<i64>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub logit_bias: &'r Option<serde_json::Map<String, Value>>,
    /// Log-probabilities with this many alternatives per token (validated per endpoint).
    pub logprobs: Option<usize>,
}

/// A validated request: the prompt's tokens and how to generate.
#[derive(Clone, Debug)]
pub struct Validated {
    pub prompt: Vec<TokenId>,
    pub params: GenerateParams,
    pub stream: bool,
    pub include_usage: bool,
    /// Most draft tokens a round verifies for this request (`None`: the server's limit).
    pub max_draft: Option<usize>,
    /// Choices to generate (`n`).
    pub n: usize,
    /// The format tool calls are read back in, when the request offers tools.
    pub tool_format: Option<Format>,
}

/// The most choices (`n`) one request may ask for.
pub const MAX_CHOICES: usize = 16;

fn unsupported(what: &str, param: &'static str) -> ApiError {
    ApiError::invalid(
        format!("{what} is not supported by this server"),
        Some(param),
    )
    .with_code("unsupported_parameter")
}

impl Knobs<'_> {
    /// `n`: how many choices (1 to [`MAX_CHOICES`]).
    pub fn choices(&self) -> Result<usize, ApiError> {
        match self.n {
            None => Ok(1),
            Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => Ok(n as usize),
            Some(n) => Err(ApiError::invalid(
                format!("n must be in 1..={MAX_CHOICES}, got {n}"),
                Some("n"),
            )),
        }
    }

    /// Bias, penalties and log-probabilities, checked against a vocabulary of `vocab` ids.
    fn processing(&self, vocab: usize) -> Result<Processing, ApiError> {
        let mut p = Processing {
            logprobs: self.logprobs,
            ..Default::default()
        };
        for (v, name, slot) in [
            (
                self.frequency_penalty,
                "frequency_penalty",
                &mut p.frequency_penalty,
            ),
            (
                self.presence_penalty,
                "presence_penalty",
                &mut p.presence_penalty,
            ),
        ] {
            let x = v.unwrap_or(0.0);
            if !(-2.0..=2.0).contains(&x) {
                return Err(ApiError::invalid(
                    format!("{name} must be between -2 and 2, got {x}"),
                    Some(name),
                ));
            }
            *slot = x as f32;
        }
        let r = self.repetition_penalty.unwrap_or(1.0);
        if !(r.is_finite() && r > 0.0 && r <= 100.0) {
            return Err(ApiError::invalid(
                format!("repetition_penalty must be in (0, 100], got {r}"),
                Some("repetition_penalty"),
            ));
        }
        p.repetition_penalty = r as f32;
        for (k, v) in self.logit_bias.iter().flatten() {
            let bad = |m: String| ApiError::invalid(m, Some("logit_bias"));
            let id = match k.parse::<u32>() {
                Ok(i) if (i as usize) < vocab => TokenId(i),
                _ => {
                    return Err(bad(format!(
                        "logit_bias keys must be token ids in 0..{vocab}, got {k:?}"
                    )))
                }
            };
            let b = match v.as_f64() {
                Some(b) if (-100.0..=100.0).contains(&b) => b as f32,
                _ => {
                    return Err(bad(format!(
                        "logit_bias[{k:?}] must be a number in -100..=100, got {v}"
                    )))
                }
            };
            p.logit_bias.push((id, b));
        }
        p.logit_bias.sort_by_key(|e| e.0);
        Ok(p)
    }

    /// Sampling, processing and stopping for a prompt of `prompt_len` tokens in a context of
    /// `ctx` and a vocabulary of `vocab` ids; `draw_seed` gives a seed to requests without one.
    pub fn params(
        &self,
        prompt_len: usize,
        ctx: usize,
        vocab: usize,
        draw_seed: impl FnOnce() -> u64,
    ) -> Result<GenerateParams, ApiError> {
        let processing = self.processing(vocab)?;
        let temperature = self.temperature.unwrap_or(1.0);
        if !temperature.is_finite() || !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid(
                format!("temperature must be between 0 and 2, got {temperature}"),
                Some("temperature"),
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p.is_finite() && top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid(
                format!("top_p must be in (0, 1], got {top_p}"),
                Some("top_p"),
            ));
        }
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => k as usize,
            Some(k) => {
                return Err(ApiError::invalid(
                    format!("top_k must be -1, 0 (off) or positive, got {k}"),
                    Some("top_k"),
                ))
            }
        };
        let min_p = self.min_p.unwrap_or(0.0);
        if !(min_p.is_finite() && (0.0..=1.0).contains(&min_p)) {
            return Err(ApiError::invalid(
                format!("min_p must be in [0, 1], got {min_p}"),
                Some("min_p"),
            ));
        }
        let stop_strings = match self.stop {
            None => vec![],
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop_strings.len() > 4 {
            return Err(ApiError::invalid(
                format!("at most 4 stop sequences, got {}", stop_strings.len()),
                Some("stop"),
            ));
        }
        if stop_strings.iter().any(String::is_empty) {
            return Err(ApiError::invalid(
                "stop sequences must not be empty",
                Some("stop"),
            ));
        }
        if prompt_len == 0 {
            return Err(ApiError::invalid("the prompt is empty", Some("prompt")));
        }
        let too_long = |want: usize| {
            ApiError::invalid(
                format!(
                    "This model's maximum context length is {ctx} tokens. However, you requested {} tokens ({prompt_len} in the prompt, {want} for the completion). Please reduce the length of the prompt or of the completion.",
                    prompt_len + want
                ),
                Some("messages"),
            )
            .with_code("context_length_exceeded")
        };
        if prompt_len >= ctx {
            return Err(too_long(1));
        }
        let max_new_tokens = match self.max_tokens {
            None => ctx - prompt_len,
            Some(m) if m < 1 => {
                return Err(ApiError::invalid(
                    format!("max_tokens must be at least 1, got {m}"),
                    Some("max_tokens"),
                ))
            }
            Some(m) if prompt_len as i64 + m > ctx as i64 => return Err(too_long(m as usize)),
            Some(m) => m as usize,
        };
        let seed = match self.seed {
            Some(s) => s as u64,
            None => draw_seed(),
        };
        let sampling = SamplingParams {
            temperature: temperature as f32,
            top_k,
            top_p: top_p as f32,
            min_p: min_p as f32,
            seed,
        };
        sampling
            .validate()
            .map_err(|e| ApiError::invalid(e.to_string(), Some("temperature")))?;
        Ok(GenerateParams {
            max_new_tokens,
            sampling,
            stop_strings,
            processing,
        })
    }
}

impl ChatRequest {
    fn knobs(&self) -> Knobs<'_> {
        Knobs {
            max_tokens: self.max_completion_tokens.or(self.max_tokens),
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            seed: self.seed,
            stop: &self.stop,
            n: self.n,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            repetition_penalty: self.repetition_penalty,
            logit_bias: &self.logit_bias,
            logprobs: None,
        }
    }

    /// `logprobs` / `top_logprobs`: the alternatives per token, `None` when not asked for.
    fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        let top = match self.top_logprobs {
            Some(k) if !(0..=MAX_TOP_LOGPROBS as i64).contains(&k) => {
                return Err(ApiError::invalid(
                    format!("top_logprobs must be in 0..={MAX_TOP_LOGPROBS}, got {k}"),
                    Some("top_logprobs"),
                ))
            }
            k => k.map(|k| k as usize),
        };
        match (self.logprobs.unwrap_or(false), top) {
            (true, k) => Ok(Some(k.unwrap_or(0))),
            (false, Some(_)) => Err(ApiError::invalid(
                "top_logprobs requires logprobs: true",
                Some("top_logprobs"),
            )),
            (false, None) => Ok(None),
        }
    }

    /// The messages through the model's chat template, and the generation settings.
    pub fn validate(
        &self,
        tok: &Tokenizer,
        ctx: usize,
        vocab: usize,
        draw_seed: impl FnOnce() -> u64,
    ) -> Result<Validated, ApiError> {
        let served = extensions::check(&self.extra)?;
        let logprobs = self.logprobs()?;
        let absent = |v: &Option<Value>| v.as_ref().is_none_or(Value::is_null);
        for (v, name) in [
            (&self.functions, "functions"),
            (&self.audio, "audio"),
            (&self.prediction, "prediction"),
            (&self.web_search_options, "web_search_options"),
        ] {
            if !absent(v) {
                return Err(unsupported(name, name));
            }
        }
        if !absent(&self.function_call)
            && self.function_call.as_ref().and_then(Value::as_str) != Some("none")
        {
            return Err(unsupported("function_call", "function_call"));
        }
        let format = Format::for_tokenizer(tok);
        let tools = Tools::of_request(
            &self.tools,
            &self.tool_choice,
            self.parallel_tool_calls,
            format,
        )?;
        if let Some(m) = &self.modalities {
            if m != &serde_json::json!(["text"]) {
                return Err(unsupported(
                    "modalities other than [\"text\"]",
                    "modalities",
                ));
            }
        }
        if self.messages.is_empty() {
            return Err(ApiError::invalid(
                "messages must not be empty",
                Some("messages"),
            ));
        }
        let mut msgs = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            msgs.push(m.to_message(i)?);
        }
        let vars = self.chat_template_kwargs.clone().unwrap_or_default();
        let end = served.end.unwrap_or(ChatEnd::Generate);
        if end == ChatEnd::Continue && msgs.last().is_none_or(|m| m.role != "assistant") {
            return Err(ApiError::invalid(
                "continue_final_message needs an assistant message last",
                Some("continue_final_message"),
            ));
        }
        let prompt = tools::encode(tok, msgs, tools.as_ref(), format, vars, end)
            .map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))?;
        let mut knobs = Knobs {
            logprobs,
            ..self.knobs()
        };
        if let Some(n) = served.n_predict {
            knobs.max_tokens = n;
        }
        let mut params = knobs.params(prompt.len(), ctx, vocab, draw_seed)?;
        params.processing.grammar = ConstrainFields {
            grammar: self.grammar.clone(),
            json_schema: self.json_schema.clone(),
            regex: self.regex.clone(),
            more: served.grammars,
        }
        .grammar(&self.response_format, tok, vocab)?;
        if let Some(g) = tools.as_ref().and_then(Tools::grammar) {
            if params.processing.grammar.is_some() {
                return Err(ApiError::invalid(
                    "tool_choice holds the reply to tool calls, and a response_format or grammar constrains it too: give one",
                    Some("tool_choice"),
                ));
            }
            compile(&g, tok, vocab, "tools")?;
            params.processing.grammar = Some(g);
        }
        Ok(Validated {
            prompt,
            params,
            stream: self.stream,
            include_usage: stream_usage(self.stream, &self.stream_options)?,
            max_draft: SpeculativeOptions::max_draft(&self.speculative)?,
            n: self.knobs().choices()?,
            tool_format: tools.map(|_| format),
        })
    }
}

fn stream_usage(stream: bool, o: &Option<StreamOptions>) -> Result<bool, ApiError> {
    match o {
        Some(_) if !stream => Err(ApiError::invalid(
            "stream_options is only allowed with stream: true",
            Some("stream_options"),
        )),
        Some(o) => Ok(o.include_usage),
        None => Ok(false),
    }
}

impl CompletionRequest {
    fn knobs(&self) -> Knobs<'_> {
        Knobs {
            max_tokens: Some(self.max_tokens.unwrap_or(16)),
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            seed: self.seed,
            stop: &self.stop,
            n: self.n,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            repetition_penalty: self.repetition_penalty,
            logit_bias: &self.logit_bias,
            logprobs: self.logprobs.map(|k| k.max(0) as usize),
        }
    }

    /// The prompt as given (text, encoded without a template, or token ids), and the
    /// generation settings. `max_tokens` defaults to 16, as in the OpenAI API.
    pub fn validate(
        &self,
        tok: &Tokenizer,
        ctx: usize,
        vocab: usize,
        draw_seed: impl FnOnce() -> u64,
    ) -> Result<Validated, ApiError> {
        let served = extensions::check(&self.extra)?;
        if served.end.is_some() {
            return Err(unsupported(
                "add_generation_prompt / continue_final_message on completions (no chat template)",
                "add_generation_prompt",
            ));
        }
        if self.echo == Some(true) {
            return Err(unsupported("echo", "echo"));
        }
        if self.suffix.is_some() {
            return Err(unsupported("suffix", "suffix"));
        }
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(unsupported("best_of other than 1", "best_of"));
        }
        if let Some(k) = self.logprobs {
            if !(0..=MAX_TOP_LOGPROBS as i64).contains(&k) {
                return Err(ApiError::invalid(
                    format!("logprobs must be in 0..={MAX_TOP_LOGPROBS}, got {k}"),
                    Some("logprobs"),
                ));
            }
        }
        let bad = |m: &str| ApiError::invalid(m, Some("prompt"));
        let ids = |v: &[Value]| -> Result<Vec<TokenId>, ApiError> {
            v.iter()
                .map(|x| match x.as_u64() {
                    Some(i) if (i as usize) < vocab => Ok(TokenId(i as u32)),
                    _ => Err(bad(&format!(
                        "token ids must be integers in 0..{vocab}, got {x}"
                    ))),
                })
                .collect()
        };
        let prompt = match &self.prompt {
            Value::String(s) => tok
                .encode(s)
                .map_err(|e| ApiError::invalid(e.to_string(), Some("prompt")))?,
            Value::Array(a) if a.len() == 1 && a[0].is_string() => tok
                .encode(a[0].as_str().unwrap_or_default())
                .map_err(|e| ApiError::invalid(e.to_string(), Some("prompt")))?,
            Value::Array(a) if a.len() == 1 && a[0].is_array() => {
                ids(a[0].as_array().map(Vec::as_slice).unwrap_or_default())?
            }
            Value::Array(a) if a.iter().all(Value::is_number) && !a.is_empty() => ids(a)?,
            Value::Array(a) if a.len() > 1 => {
                return Err(unsupported("more than one prompt per request", "prompt"))
            }
            _ => {
                return Err(bad(
                    "prompt must be a string, an array of one string, or token ids",
                ))
            }
        };
        let mut knobs = self.knobs();
        if let Some(n) = served.n_predict {
            knobs.max_tokens = n;
        }
        let mut params = knobs.params(prompt.len(), ctx, vocab, draw_seed)?;
        params.processing.grammar = ConstrainFields {
            grammar: self.grammar.clone(),
            json_schema: self.json_schema.clone(),
            regex: self.regex.clone(),
            more: served.grammars,
        }
        .grammar(&self.response_format, tok, vocab)?;
        Ok(Validated {
            prompt,
            params,
            stream: self.stream,
            include_usage: stream_usage(self.stream, &self.stream_options)?,
            max_draft: SpeculativeOptions::max_draft(&self.speculative)?,
            n: self.knobs().choices()?,
            tool_format: None,
        })
    }
}
