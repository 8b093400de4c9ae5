//! `paradraft serve`: the OpenAI-compatible server (the engine and API live in the library:
//! `paradraft::engine`, `paradraft::server`).

use crate::speculative_args::SpecArgs;
use crate::ModelArgs;
use anyhow::{Context, Result};
use clap::Args;
use paradraft::drafters::speculative_config::Method;
use paradraft::engine::{pool, Engine, EngineConfig};
use paradraft::server::{self, AppState};
use std::sync::Arc;

#[derive(Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    m: ModelArgs,
    #[command(flatten)]
    spec: SpecArgs,
    /// Address to bind (127.0.0.1: this machine only; 0.0.0.0 to serve the network).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer <KEY>` on /v1/* (also read from PARADRAFT_API_KEY).
    #[arg(long, env = "PARADRAFT_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The model name clients send and responses carry (default: the model file's stem).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Most requests decoding together in one batch.
    #[arg(long, default_value_t = 64)]
    max_running: usize,
    /// Most requests waiting for a place in the batch; beyond it requests get HTTP 429.
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// Memory for the KV page pool in MiB: requests take pages as they grow, cached prefixes
    /// lend theirs, a request is admitted when its prompt and a round fit, and when the pool
    /// runs out the latest arrivals are preempted (resumed later by recomputing their tokens).
    #[arg(long, default_value_t = 2048)]
    kv_memory_mib: usize,
    /// Most prompt tokens prefilled per step while other requests decode.
    #[arg(long, default_value_t = 256)]
    prefill_chunk: usize,
    /// How drafts are verified at temperature > 0 (see `generate --help`).
    #[arg(long, value_enum, default_value = "coupled")]
    verify_rule: paradraft::speculative::VerifyRule,
    /// Memory in MiB recent prompts' cached K/V may keep, reused by requests that begin with
    /// the same tokens (a system prompt, a chat history): their tapped states and the pool
    /// pages no running request shares; 0 turns the prefix cache off.
    #[arg(long, default_value_t = 256)]
    prefix_cache_mib: usize,
    /// How much of its remaining `max_tokens` each running request is expected to take when
    /// admitting more (as SGLang's): 1 starts at 70 % and settles towards 10 % while nothing is
    /// preempted; lower admits more (and preempts more: a preempted request recomputes its
    /// tokens); 0 admits for a prompt and one round; 10 or more sets aside whole runs.
    #[arg(long, default_value_t = 1.0)]
    schedule_conservativeness: f64,
}

pub(crate) fn run(a: ServeArgs) -> Result<()> {
    let cfg = a.spec.config(Method::none())?;
    cfg.check_used(&[cfg.method])?;
    let (lm, ctx) = a.m.load()?;
    let target_path = a.m.path();
    let name = a.served_model_name.clone().unwrap_or_else(|| {
        target_path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });
    let kv_pages = pool::KvPool::pages_in(a.kv_memory_mib, &lm.model, ctx)?;
    let ecfg = EngineConfig {
        ctx,
        max_running: a.max_running,
        max_queue: a.max_queue,
        kv_pages,
        prefill_chunk: a.prefill_chunk,
        rule: a.verify_rule,
        prefix_cache_bytes: a.prefix_cache_mib << 20,
        conservativeness: a.schedule_conservativeness,
    };
    let t0 = std::time::Instant::now();
    if cfg.method.is_none() {
        eprintln!("starting the engine (no drafter: AR decoding)…");
    } else {
        eprintln!(
            "loading drafter {} and timing this machine's forward for k = 1…64 rows and batch              sizes (the verify-cost curve draft sizing prices drafts with; a few seconds on a              quiet machine, a minute or two when other work shares the cores)…",
            cfg.label()
        );
    }
    let engine = Engine::start(Arc::new(lm), target_path, cfg, ecfg)?;
    eprintln!("engine ready in {:.1} s", t0.elapsed().as_secs_f64());
    let state = Arc::new(AppState::new(engine, name.clone(), a.api_key.clone()));
    // The HTTP side is light: one thread (this one), so it takes as little as possible from
    // the compute threads of the forward.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let addr = format!("{}:{}", a.host, a.port);
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        eprintln!(
            "serving {name} with drafter {} on http://{} ({} KV pages of 16 tokens, batch ≤ {}, queue ≤ {}{})",
            state.engine.drafter(),
            listener.local_addr().map(|a| a.to_string()).unwrap_or(addr.clone()),
            kv_pages,
            a.max_running,
            a.max_queue,
            if a.api_key.is_some() { ", API key required" } else { "" }
        );
        server::serve(listener, state.clone(), server::shutdown_signal())
            .await
            .context("serving")
    })?;
    eprintln!("shut down");
    Ok(())
}
