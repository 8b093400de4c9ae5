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
            logit_bias: &None,
        }
    }

    /// The sampler alone (no prompt yet), validated as the server validates it.
    pub fn params(&self) -> Result<SamplingParams> {
        Ok(self
            .knobs(1, &None)
            .params(1, 2, || self.seed)
            .map_err(flag_error)?
            .sampling)
    }
}

/// A request refused by the server's validation, worded for the command line (its flag).
pub fn flag_error(e: ApiError) -> Error {
    let flag = match e.param {
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
