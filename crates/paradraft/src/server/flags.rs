//! The sampler's command-line flags, validated by the same code that validates a server
//! request, so the command line accepts exactly what the API accepts (and names the flag).

use super::openai::{ApiError, Knobs, Stop};
use crate::error::{Error, Result};
use crate::sample::SamplingParams;

/// The sampler: temperature → top-k → min-p → top-p, seeded (temperature 0 is greedy).
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct SamplingFlags {
    /// 0 (greedy) to 2.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f64,
    /// 0 or -1 disables top-k.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub top_k: i64,
    /// In (0, 1].
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f64,
    /// In [0, 1]: drops tokens less probable than min-p × the most probable one (0: off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub min_p: f64,
    /// Every random draw is a function of (seed, position): the same seed gives the same
    /// tokens, with or without a drafter (under the coupled rule).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// How drafts are verified at temperature > 0: `coupled` accepts the target's own keyed
    /// sample (output equals AR's with the same seed); `rejection` is classic speculative
    /// sampling (min(1, p/q), recursive over siblings), equal to AR in distribution only.
    #[arg(long, default_value = "coupled")]
    pub verify_rule: crate::speculative::VerifyRule,
}

impl SamplingFlags {
    /// The request knobs the server validates, so the CLI accepts exactly what it accepts.
    pub fn knobs<'a>(&self, max_tokens: i64, stop: &'a Option<Stop>) -> Knobs<'a> {
        Knobs {
            max_tokens: Some(max_tokens),
            temperature: Some(self.temperature),
            top_p: Some(self.top_p),
            top_k: Some(self.top_k),
            min_p: Some(self.min_p),
            seed: Some(self.seed as i64),
            stop,
            n: None,
            frequency_penalty: None,
            presence_penalty: None,
            repetition_penalty: None,
            logit_bias: &None,
            logprobs: None,
        }
    }

    /// The sampler alone (no prompt yet), validated as the server validates it.
    pub fn params(&self) -> Result<SamplingParams> {
        Ok(self
            .knobs(1, &None)
            .params(1, 2, 1, || self.seed)
            .map_err(flag_error)?
            .sampling)
    }
}

/// Logit bias, penalties and log-probabilities ([`crate::process`]), as the API takes them.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ProcessingFlags {
    /// -2 to 2: subtracted once from the logit of every token the output already holds.
    #[arg(long, allow_negative_numbers = true)]
    pub presence_penalty: Option<f64>,
    /// -2 to 2: subtracted from a token's logit per occurrence in the output.
    #[arg(long, allow_negative_numbers = true)]
    pub frequency_penalty: Option<f64>,
    /// In (0, 100]: > 1 divides the positive logits (multiplies the negative ones) of every
    /// token in the prompt or the output; 1 is off.
    #[arg(long)]
    pub repetition_penalty: Option<f64>,
    /// `TOKEN_ID=BIAS`, BIAS in -100..=100, added to the token's logit (repeatable).
    #[arg(
        long = "logit-bias",
        value_name = "ID=BIAS",
        allow_hyphen_values = true
    )]
    pub logit_bias: Vec<String>,
    /// 0 to 20: each output token's log-probability and this many alternatives, in the
    /// `--json` output.
    #[arg(long, allow_negative_numbers = true)]
    pub logprobs: Option<i64>,
    /// The output must satisfy this JSON schema (the schema, or `@FILE`).
    #[arg(long, value_name = "SCHEMA", group = "constrain")]
    pub json_schema: Option<String>,
    /// The output must be a JSON object.
    #[arg(long, group = "constrain")]
    pub json_object: bool,
    /// The output must match this Lark grammar (llguidance's dialect; the text, or `@FILE`).
    #[arg(long, value_name = "LARK", group = "constrain")]
    pub grammar: Option<String>,
    /// The whole output must match this regular expression.
    #[arg(long, value_name = "REGEX", group = "constrain")]
    pub regex: Option<String>,
}

impl ProcessingFlags {
    /// `--logit-bias` as the API's `logit_bias` object.
    pub fn bias(&self) -> Result<Option<serde_json::Map<String, serde_json::Value>>> {
        if self.logit_bias.is_empty() {
            return Ok(None);
        }
        let mut m = serde_json::Map::new();
        for b in &self.logit_bias {
            let parsed = b
                .split_once('=')
                .and_then(|(id, v)| Some((id.trim(), v.trim().parse::<f64>().ok()?)));
            match parsed {
                Some((id, v)) if serde_json::Number::from_f64(v).is_some() => {
                    m.insert(id.to_string(), serde_json::json!(v));
                }
                _ => {
                    return Err(Error::BadRequest(format!(
                        "--logit-bias: expected TOKEN_ID=BIAS, got {b:?}"
                    )))
                }
            }
        }
        Ok(Some(m))
    }

    /// The grammar the flags ask for (compiled when the generation starts).
    pub fn grammar(&self) -> Result<Option<crate::grammar::Grammar>> {
        use crate::grammar::Grammar;
        let text = |flag: &str, v: &str| -> Result<String> {
            match v.strip_prefix('@') {
                Some(path) => std::fs::read_to_string(path)
                    .map_err(|e| Error::BadRequest(format!("{flag}: reading {path}: {e}"))),
                None => Ok(v.to_string()),
            }
        };
        Ok(if let Some(s) = &self.json_schema {
            let s = text("--json-schema", s)?;
            let v: serde_json::Value = serde_json::from_str(&s)
                .map_err(|e| Error::BadRequest(format!("--json-schema: not JSON: {e}")))?;
            Some(Grammar::JsonSchema(v))
        } else if self.json_object {
            Some(Grammar::JsonObject)
        } else if let Some(g) = &self.grammar {
            Some(Grammar::Lark(text("--grammar", g)?))
        } else {
            self.regex.clone().map(Grammar::Regex)
        })
    }

    /// `knobs` with these flags (`bias`: [`ProcessingFlags::bias`]).
    pub fn knobs<'a>(
        &self,
        knobs: Knobs<'a>,
        bias: &'a Option<serde_json::Map<String, serde_json::Value>>,
    ) -> Result<Knobs<'a>> {
        let logprobs = match self.logprobs {
            Some(k) if !(0..=crate::process::MAX_TOP_LOGPROBS as i64).contains(&k) => {
                return Err(Error::BadRequest(format!(
                    "--logprobs must be in 0..={}, got {k}",
                    crate::process::MAX_TOP_LOGPROBS
                )))
            }
            k => k.map(|k| k as usize),
        };
        Ok(Knobs {
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
            logit_bias: bias,
            logprobs,
            ..knobs
        })
    }
}

/// A request refused by the server's validation, worded for the command line (its flag).
pub fn flag_error(e: ApiError) -> Error {
    let flag = match e.param.as_deref() {
        Some("presence_penalty") => "--presence-penalty",
        Some("frequency_penalty") => "--frequency-penalty",
        Some("repetition_penalty") => "--repetition-penalty",
        Some("logit_bias") => "--logit-bias",
        Some("max_tokens") => "--max-new-tokens",
        Some("temperature") => "--temperature",
        Some("top_p") => "--top-p",
        Some("top_k") => "--top-k",
        Some("min_p") => "--min-p",
        Some("stop") => "--stop",
        _ => "--prompt",
    };
    Error::BadRequest(format!("{flag}: {}", e.message))
}
