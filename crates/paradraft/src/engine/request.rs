//! What the engine is configured with, what it is sent and what it answers.

use super::pool;
use crate::process::TokenLogprob;
use crate::request::{GenerateParams, StopReason};
use crate::speculative::VerifyRule;
use crate::types::TokenId;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// How the engine batches and what it admits.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Tokens a request may hold (prompt and output).
    pub ctx: usize,
    /// Most requests in the running batch.
    pub max_running: usize,
    /// Most requests waiting for admission; beyond it `submit` refuses (HTTP 429).
    pub max_queue: usize,
    /// KV pool size in pages of 16 slots.
    pub kv_pages: usize,
    /// Most prompt tokens per step while other requests decode.
    pub prefill_chunk: usize,
    pub rule: VerifyRule,
    /// Bytes of recent prompts' K/V kept for requests that share their prefix (0: off).
    pub prefix_cache_bytes: usize,
    /// How much of its remaining `max_tokens` each running request is expected to take when
    /// admitting more (SGLang's `--schedule-conservativeness`): 1 (default) starts at 0.7 and
    /// settles towards 0.1 while nothing is preempted; 0 admits for a prompt and a round alone
    /// (most preemptions); 10 or more sets aside whole runs (none).
    pub conservativeness: f64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            ctx: 2048,
            max_running: 64,
            max_queue: 256,
            kv_pages: 64 * 2048 / pool::PAGE_SLOTS,
            prefill_chunk: 256,
            rule: VerifyRule::Coupled,
            prefix_cache_bytes: 256 << 20,
            conservativeness: 1.0,
        }
    }
}

/// A validated generation request.
pub struct Request {
    pub prompt: Vec<TokenId>,
    pub params: GenerateParams,
    /// Where the request's text and result go; dropping the receiver cancels the request.
    pub events: UnboundedSender<Event>,
    /// Most draft tokens a round verifies for this request, below the drafter's own limit
    /// (`Some(0)`: none, AR decoding; `None`: the drafter's limit).
    pub max_draft: Option<usize>,
}

/// What a request hears from the engine: text pieces as they become final (after a step's
/// pieces, the log-probabilities of the tokens that step committed, when asked for), then one
/// `Done` or `Error`.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Text(String),
    Logprobs(Vec<TokenLogprob>),
    Done(Finished),
    Error(String),
}

/// A finished request's summary.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub stop_reason: StopReason,
    pub token_ids: Vec<TokenId>,
    /// Tokens per target pass (0 without rounds).
    pub tau: f64,
    /// Decode rounds (target passes after the prompt), draft nodes verified in them, and
    /// those accepted.
    pub rounds: usize,
    pub drafted: usize,
    pub accepted: usize,
}

/// Why a request was not queued.
#[derive(Debug, thiserror::Error)]
pub enum Rejected {
    #[error("the server is at capacity ({0} requests running or queued); retry later")]
    Busy(usize),
    #[error("the engine has stopped")]
    Stopped,
}

/// What the engine thread is sent.
pub(super) enum Command {
    Run(Box<Request>, Instant),
    Shutdown,
}
