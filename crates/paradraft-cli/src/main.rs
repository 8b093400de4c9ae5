//! `paradraft`: the command-line front end.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use paradraft::drafters::speculative_config::{DrafterConfig, Method};
use paradraft::generate::generate;
use paradraft::model::{self, Batch, Logits, Message, OutputSpec, Rows, Scratch};
use paradraft::sample::SamplingParams;
use paradraft::server::openai::{ApiError, Knobs, Stop};
use paradraft::speculative::sizing::{CostCurve, UndraftedCounts};
use paradraft::speculative::{speculative_generate, RoundStats, VerifyRule};
use paradraft::types::{Pos, TokenId};
use serde_json::json;
use speculative_args::{MethodArg, SpecArgs};
use std::io::Write;
use std::path::PathBuf;

mod ngram;
mod serve;
mod speculative_args;
mod train;
mod train_campaign;
mod train_dart;
mod train_mask;

#[derive(Parser)]
#[command(
    name = "paradraft",
    version,
    about = "Lossless speculative decoding with parallel drafters"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Download the default model (SmolLM2-135M-Instruct Q4_1) into the cache and print its path.
    FetchModel(FetchArgs),
    /// Generate a reply to a prompt (chat template applied).
    Generate(GenerateArgs),
    /// Teacher-forced logits at every position of a prompt or token list.
    Logits(LogitsArgs),
    /// Forward cost curve c(k), decode and prefill speed (optionally next to llama.cpp).
    BenchKernels(BenchKernelsArgs),
    /// Speculative methods side by side with AR on benchmark prompt sets.
    Bench(BenchArgs),
    /// Train a drafter for the target.
    #[command(subcommand)]
    Train(train::TrainCmd),
    /// Serve the OpenAI-compatible API (chat and text completions, streaming) with continuous
    /// batching and the chosen drafter.
    Serve(serve::ServeArgs),
    /// Build, convert and measure n-gram tries (DART's tree pruning) and 3-gram ARPA models
    /// (DiffuSpec's causal proxy). The defaults are built on first use (`fetch-model --ngram`).
    #[command(subcommand)]
    Ngram(ngram::NgramCmd),
}

#[derive(Args)]
struct FetchArgs {
    /// Also build the default n-gram trie and 3-gram ARPA model for the default model's
    /// tokenizer from the shipped corpus (otherwise built on first use).
    #[arg(long)]
    ngram: bool,
}

fn cmd_fetch(a: FetchArgs) -> Result<()> {
    let p = paradraft::fetch::verify_default_model()?;
    if a.ngram {
        let lm = model::load(&p)?;
        for path in [
            paradraft::ngram::defaults::trie(&lm.tokenizer)?.0,
            paradraft::ngram::defaults::arpa(&lm.tokenizer)?.0,
        ] {
            eprintln!("{}", path.display());
        }
    }
    println!("{}", p.display());
    Ok(())
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// Speculative methods to run next to the AR baseline (which always runs).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "pld")]
    methods: Vec<MethodArg>,
    /// Datasets: mt_bench, humaneval, gsm8k, math500, mbpp, alpaca.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "mt_bench,humaneval,gsm8k,math500"
    )]
    datasets: Vec<String>,
    /// Items per dataset.
    #[arg(long, default_value_t = 10)]
    num_prompts: usize,
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Directory for runs.jsonl, summary.json, summary.md and the SVG charts.
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
    /// Directory of the prompt sets (default: the repository's data/bench).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[command(flatten)]
    spec: SpecArgs,
}

#[derive(Args)]
struct BenchKernelsArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// A llama.cpp `llama-bench` binary to measure in the same run, interleaved.
    #[arg(long)]
    llama_bench: Option<PathBuf>,
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Tokens in the KV cache while the curve is measured.
    #[arg(long, default_value_t = 64)]
    context: usize,
    #[arg(long, default_value_t = 128)]
    decode_tokens: usize,
    #[arg(long, default_value_t = 512)]
    prefill_tokens: usize,
    #[arg(long)]
    json: bool,
    /// With a drafter: also its draft pass's cost curve (ms per proposal of n nodes) against
    /// one target decode step.
    #[command(flatten)]
    spec: SpecArgs,
}

#[derive(Args)]
pub(crate) struct ModelArgs {
    /// A .gguf file or an HF model directory; defaults to the fetched SmolLM2.
    #[arg(long)]
    pub(crate) model: Option<PathBuf>,
    /// Worker threads (default: all available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// KV-cache capacity in tokens (default: the model's context length, at most 8192). Above
    /// the model's trained context only with --force-ctx-size; never beyond available memory.
    #[arg(long)]
    ctx_size: Option<usize>,
    /// Allow --ctx-size above the model's trained context length.
    #[arg(long)]
    force_ctx_size: bool,
    /// KV-cache element type: f16 (half the attention traffic) or f32.
    #[arg(long, default_value = "f16")]
    kv_dtype: paradraft::kv::KvDtype,
}

/// The sampler: temperature → top-k → top-p, seeded (temperature 0 is greedy).
#[derive(Args, Clone, Copy)]
struct SamplingArgs {
    /// 0 (greedy) to 2.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f64,
    /// 0 or -1 disables top-k.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    top_k: i64,
    /// In (0, 1].
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    top_p: f64,
    /// Every random draw is a function of (seed, position): the same seed gives the same
    /// tokens, with or without a drafter (under the coupled rule).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// How drafts are verified at temperature > 0: `coupled` accepts the target's own keyed
    /// sample (output equals AR's with the same seed); `rejection` is classic speculative
    /// sampling (min(1, p/q), recursive over siblings), equal to AR in distribution only.
    #[arg(long, default_value = "coupled")]
    verify_rule: paradraft::speculative::VerifyRule,
}

impl SamplingArgs {
    /// The request knobs the server validates, so the CLI accepts exactly what it accepts.
    fn knobs<'a>(&self, max_tokens: i64, stop: &'a Option<Stop>) -> Knobs<'a> {
        Knobs {
            max_tokens: Some(max_tokens),
            temperature: Some(self.temperature),
            top_p: Some(self.top_p),
            top_k: Some(self.top_k),
            seed: Some(self.seed as i64),
            stop,
            n: None,
            frequency_penalty: None,
            presence_penalty: None,
            logit_bias: &None,
        }
    }

    /// The sampler alone (no prompt yet), validated as the server validates it.
    fn params(&self) -> Result<SamplingParams> {
        Ok(self
            .knobs(1, &None)
            .params(1, 2, || self.seed)
            .map_err(cli_error)?
            .sampling)
    }
}

/// A request refused by the server's validation, worded for the command line (its flag).
fn cli_error(e: ApiError) -> anyhow::Error {
    let flag = match e.param {
        Some("max_tokens") => "--max-new-tokens",
        Some("temperature") => "--temperature",
        Some("top_p") => "--top-p",
        Some("top_k") => "--top-k",
        Some("stop") => "--stop",
        _ => "--prompt",
    };
    anyhow::anyhow!("{flag}: {}", e.message)
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// The prompt; `-` reads it from standard input.
    #[arg(long, required_unless_present = "prompt_file")]
    prompt: Option<String>,
    /// Read the prompt from this file (long prompts exceed the command-line limit).
    #[arg(long, conflicts_with = "prompt")]
    prompt_file: Option<PathBuf>,
    /// A system message before the prompt (chat template only).
    #[arg(long, conflicts_with = "raw")]
    system: Option<String>,
    /// Send the prompt as raw text, without the chat template; special-token strings in it
    /// (`<|im_start|>`) become control tokens. Without it they are encoded as plain text.
    #[arg(long)]
    raw: bool,
    /// At least 1; the prompt and these must fit the context (default: 256, or what room
    /// the context leaves).
    #[arg(long, allow_negative_numbers = true)]
    max_new_tokens: Option<i64>,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Extra stop strings (repeatable, at most 4, none empty).
    #[arg(long = "stop")]
    stop: Vec<String>,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    spec: SpecArgs,
}

#[derive(Args)]
struct LogitsArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// The prompt; `-` reads it from standard input.
    #[arg(long, conflicts_with = "token_ids")]
    prompt: Option<String>,
    /// Read the prompt from this file.
    #[arg(long, conflicts_with_all = ["prompt", "token_ids"])]
    prompt_file: Option<PathBuf>,
    /// Comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    token_ids: Option<Vec<u32>>,
    /// Wrap --prompt in the chat template (as a user turn, with the generation prompt).
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 20)]
    top_k: usize,
    #[arg(long)]
    json: bool,
}

/// The most worker threads a run may ask for.
const MAX_THREADS: usize = 1024;

/// The prompt text of `--prompt TEXT`, `--prompt -` (standard input) or `--prompt-file PATH`.
fn read_prompt(prompt: Option<&str>, file: Option<&std::path::Path>) -> Result<Option<String>> {
    Ok(match (prompt, file) {
        (_, Some(f)) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("reading --prompt-file {}", f.display()))?,
        ),
        (Some("-"), None) => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                .context("reading the prompt from standard input")?;
            Some(s)
        }
        (p, None) => p.map(str::to_string),
    })
}

/// Bytes the machine can still give (`MemAvailable`), when known.
fn available_memory() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

pub(crate) fn load(m: &ModelArgs) -> Result<(model::Loaded, usize)> {
    let cores = paradraft::runtime::default_threads();
    let threads = m.threads.unwrap_or(cores);
    if threads == 0 || threads > MAX_THREADS {
        bail!("--threads {threads}: must be between 1 and {MAX_THREADS}");
    }
    if threads > cores {
        eprintln!("warning: --threads {threads} is more than the {cores} cores available (slower, not faster)");
    }
    paradraft::runtime::init_threads(threads);
    let path = match &m.model {
        Some(p) => p.clone(),
        None => paradraft::fetch::ensure_default_model()?,
    };
    let mut loaded = model::load(&path).with_context(|| format!("loading {}", path.display()))?;
    loaded.model.set_kv_dtype(m.kv_dtype);
    let ctx = m
        .ctx_size
        .unwrap_or(loaded.model.config.max_position_embeddings.min(8192));
    if ctx == 0 {
        bail!("--ctx-size must be at least 1");
    }
    let c = &loaded.model.config;
    if ctx > c.max_position_embeddings && !m.force_ctx_size {
        bail!(
            "--ctx-size {ctx} exceeds the model's trained context of {} tokens (pass --force-ctx-size to allow it)",
            c.max_position_embeddings
        );
    }
    // K and V of every layer for every position (drafters and speculation add little).
    let slot = paradraft::kv::bytes_per_slot(c.n_layers, c.n_kv_heads, c.head_dim, m.kv_dtype);
    let kv_bytes = slot as u128 * ctx as u128;
    if let Some(avail) = available_memory() {
        if kv_bytes > avail as u128 {
            bail!(
                "--ctx-size {ctx} needs a {:.1} GiB KV cache but only {:.1} GiB of memory is available",
                kv_bytes as f64 / (1u64 << 30) as f64,
                avail as f64 / (1u64 << 30) as f64
            );
        }
    }
    Ok((loaded, ctx))
}

fn cmd_generate(a: GenerateArgs) -> Result<()> {
    let sampling = a.sampling.params()?;
    let user = read_prompt(a.prompt.as_deref(), a.prompt_file.as_deref())?.unwrap_or_default();
    if user.is_empty() {
        bail!("--prompt: the prompt is empty");
    }
    let (lm, ctx) = load(&a.m)?;
    let tok = &lm.tokenizer;
    // --raw: the text as given, special-token strings included; otherwise the chat template,
    // whose control tokens are the only ones (the messages are encoded as text).
    let prompt = if a.raw {
        tok.encode(&user)?
    } else {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(Message::new("system", s));
        }
        msgs.push(Message::new("user", &user));
        tok.encode_chat(&msgs, true)?
    };
    let stop = Some(Stop::Many(a.stop.clone()));
    let params = a
        .sampling
        .knobs(
            a.max_new_tokens
                .unwrap_or_else(|| 256.min(ctx.saturating_sub(prompt.len())).max(1) as i64),
            &stop,
        )
        .params(prompt.len(), ctx, || sampling.seed)
        .map_err(cli_error)?;
    let mut kv = lm.model.new_kv(ctx);
    let stream = !a.json;
    let print = |piece: &str| {
        if stream {
            print!("{piece}");
            let _ = std::io::stdout().flush();
        }
    };
    let cfg = a.spec.config()?;
    cfg.check_used(&[cfg.method])?;
    let target_path =
        a.m.model
            .clone()
            .unwrap_or_else(paradraft::fetch::default_model_path);
    let mut set = cfg.load(&target_path, &lm, ctx)?;
    let (json, stats, stop, extra) = if set.is_ar() {
        let g = generate(&lm.model, tok, &mut kv, &prompt, &params, print)?;
        (
            serde_json::to_value(&g)?,
            g.stats,
            g.stop_reason,
            String::new(),
        )
    } else {
        let curve = if set.adaptive {
            let c = CostCurve::measure(&lm.model, 64, 2)?;
            set.measure_costs(&lm.model, &c)?;
            Some(c)
        } else {
            None
        };
        let sp = set.speculation(sampling, a.sampling.verify_rule)?;
        let g = speculative_generate(&lm.model, tok, &mut kv, &prompt, &params, sp, print)?;
        let sum = |f: fn(&RoundStats) -> f64| g.rounds.iter().map(f).sum::<f64>();
        let mut v = serde_json::to_value(&g)?;
        let st = &mut v["stats"];
        st["rounds"] = json!(g.rounds.len());
        st["tau"] = json!(g.tau);
        st["draft_ms"] = json!(sum(|r| r.draft_ms));
        st["tree_ms"] = json!(sum(|r| r.tree_ms));
        st["verify_ms"] = json!(sum(|r| r.verify_ms));
        st["commit_ms"] = json!(sum(|r| r.commit_ms));
        let off = UndraftedCounts::of(g.rounds.iter().map(|r| r.undrafted));
        let why = off.explain(g.rounds.len(), curve.as_ref());
        st["undrafted"] = json!(off);
        st["undrafted_reason"] = json!(why);
        v["rounds_detail"] = v["rounds"].take();
        v.as_object_mut().map(|o| o.remove("rounds"));
        let extra = format!(
            " | drafter prefill {:.0} ms, {} rounds, tau {:.2}{}",
            g.out.stats.draft_prefill_ms,
            g.rounds.len(),
            g.tau,
            if why.is_empty() {
                String::new()
            } else {
                format!(" ({why})")
            }
        );
        (v, g.out.stats, g.out.stop_reason, extra)
    };
    if a.json {
        println!("{json}");
    } else {
        println!();
        eprintln!(
            "[prompt {} tok, prefill {:.1} tok/s | generated {} tok, decode {:.1} tok/s{extra} | total {:.0} ms | stop: {}]",
            stats.prompt_tokens, stats.prefill_tok_s, stats.generated_tokens, stats.decode_tok_s, stats.total_ms, stop
        );
    }
    Ok(())
}

fn cmd_logits(a: LogitsArgs) -> Result<()> {
    let prompt = read_prompt(a.prompt.as_deref(), a.prompt_file.as_deref())?;
    let (lm, ctx) = load(&a.m)?;
    let tok = &lm.tokenizer;
    let ids: Vec<TokenId> = match (&prompt, &a.token_ids) {
        (Some(p), None) => {
            if a.chat {
                tok.encode_chat(&[Message::new("user", p)], true)?
            } else {
                tok.encode(p)?
            }
        }
        (None, Some(ids)) => ids.iter().map(|&i| TokenId(i)).collect(),
        _ => bail!("give exactly one of --prompt, --prompt-file or --token-ids"),
    };
    if ids.is_empty() {
        bail!("no tokens to score");
    }
    let mut kv = lm.model.new_kv(ctx.max(ids.len()).min(ids.len().max(1)));
    let positions: Vec<Pos> = (0..ids.len() as u32).map(Pos).collect();
    let spec = OutputSpec {
        rows: Rows::All,
        logits: Logits::TopK(a.top_k.max(1)),
        taps: vec![],
    };
    let mut scratch = Scratch::default();
    let out = lm.model.forward(
        &mut kv,
        &Batch {
            tokens: &ids,
            positions: &positions,
            mask: None,
        },
        &spec,
        &mut scratch,
    )?;
    let positions: Vec<_> = out
        .top
        .iter()
        .map(|t| json!({"top": t.iter().map(|(id, l)| json!([id.0, l])).collect::<Vec<_>>()}))
        .collect();
    let obj = json!({"token_ids": ids, "positions": positions});
    if a.json {
        println!("{obj}");
    } else {
        // Per position: its token, then the top-k next tokens as id:logit "text".
        for (i, p) in out.top.iter().enumerate() {
            let top: Vec<String> = p
                .iter()
                .map(|(id, l)| {
                    let piece = tok.decode(&[*id]).unwrap_or_default();
                    format!("{}:{l:.3} {piece:?}", id.0)
                })
                .collect();
            println!("{i}\t{}\t{}", ids[i].0, top.join("\t"));
        }
    }
    Ok(())
}

fn cmd_bench_kernels(a: BenchKernelsArgs) -> Result<()> {
    if a.repeats == 0 || a.decode_tokens < 2 || a.prefill_tokens == 0 {
        bail!("--repeats, --prefill-tokens must be >= 1 and --decode-tokens >= 2");
    }
    let (lm, _) = load(&a.m)?;
    let path = match &a.m.model {
        Some(p) => p.clone(),
        None => paradraft::fetch::default_model_path(),
    };
    let threads = paradraft::runtime::current_threads();
    let p = paradraft::bench::KernelBenchParams {
        repeats: a.repeats,
        context: a.context,
        decode_tokens: a.decode_tokens,
        prefill_tokens: a.prefill_tokens,
        threads,
    };
    let r =
        paradraft::bench::run_kernel_bench(&lm.model, &p, Some(&path), a.llama_bench.as_deref())?;
    let cfg = a.spec.config()?;
    cfg.check_used(&[cfg.method])?;
    let set = cfg.load(&path, &lm, a.context + 64)?;
    let draft = if set.is_ar() {
        None
    } else {
        let mut d = set.create(Default::default())?;
        let c = CostCurve::measure_drafter(
            &lm.model,
            d.as_mut(),
            a.context,
            set.max_draft,
            5 * a.repeats,
        )?;
        let step = 1e3 / r.decode_tok_s;
        Some(json!({
            "drafter": d.name(),
            "decode_step_ms": step,
            "curve": c.points.iter().map(|&(n, ms)| json!({"nodes": n, "ms": ms, "vs_decode_step": ms / step})).collect::<Vec<_>>(),
        }))
    };
    if a.json {
        let mut v = serde_json::to_value(&r)?;
        if let Some(d) = &draft {
            v["draft"] = d.clone();
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "{}, {}",
        r.cpu.as_deref().unwrap_or("unknown CPU"),
        r.kernels
    );
    println!(
        "threads {threads}, weights {:.1} MB ({:.1} MB per greedy decode step), context {}",
        r.weight_bytes as f64 / 1e6,
        r.decode_weight_bytes as f64 / 1e6,
        r.context
    );
    println!(
        "decode  {:.1} tok/s ({:.1} GB/s of weights)   prefill({}) {:.1} tok/s",
        r.decode_tok_s, r.decode_gb_s, a.prefill_tokens, r.prefill_tok_s
    );
    println!(
        "{:>3} {:>10} {:>10} {:>8} {:>8} {:>10}",
        "k", "ms(logits)", "ms(argmax)", "c(k)/c1", "GMAC/s", "llama ms"
    );
    for c in &r.curve {
        let l = r
            .llama_cpp
            .as_ref()
            .and_then(|l| l.curve.iter().find(|p| p.k == c.k))
            .map(|p| format!("{:.2}", p.ms))
            .unwrap_or_default();
        println!(
            "{:>3} {:>10.2} {:>10.2} {:>8.2} {:>8.1} {:>10}",
            c.k, c.ms_all_logits, c.ms_argmax, c.cost_vs_k1, c.gmac_s, l
        );
    }
    if let Some(l) = &r.llama_cpp {
        println!(
            "llama.cpp tg128 {:.1} tok/s, pp512 {:.1} tok/s",
            l.tg128_tok_s, l.pp512_tok_s
        );
        println!("ratios {}", r.ratios.clone().unwrap_or_default());
    }
    if let Some(d) = draft {
        println!(
            "{} draft pass (min of {} repeats) against a {:.2} ms decode step:",
            d["drafter"].as_str().unwrap_or(""),
            5 * a.repeats,
            d["decode_step_ms"].as_f64().unwrap_or(0.0)
        );
        for p in d["curve"].as_array().into_iter().flatten() {
            println!(
                "  {:>2} nodes {:>6.3} ms  {:.3} × step",
                p["nodes"],
                p["ms"].as_f64().unwrap_or(0.0),
                p["vs_decode_step"].as_f64().unwrap_or(0.0)
            );
        }
    }
    Ok(())
}

fn cmd_bench(a: BenchArgs) -> Result<()> {
    use paradraft::bench::{datasets, harness, report};
    let sampling = a.sampling.params()?;
    if !a.spec.drafter.0.is_none() || a.spec.speculative_config.is_some() {
        bail!("bench compares the drafters given by --methods; --drafter and --speculative-config are for generate");
    }
    if a.num_prompts == 0 {
        bail!("--num-prompts must be at least 1");
    }
    let methods_asked: Vec<Method> = a.methods.iter().map(|m| m.0).collect();
    let base = a.spec.config()?;
    base.check_used(&methods_asked)?;
    let dir = a.data_dir.clone().unwrap_or_else(datasets::default_dir);
    let sets = a
        .datasets
        .iter()
        .map(|n| {
            let d = datasets::Dataset::from_name(n).with_context(|| format!("unknown dataset {n:?} (known: mt_bench, humaneval, gsm8k, math500, mbpp, alpaca)"))?;
            Ok((d, d.load(&dir, a.num_prompts)?))
        })
        .collect::<Result<Vec<_>>>()?;
    let (lm, ctx) = load(&a.m)?;
    let target_path =
        a.m.model
            .clone()
            .unwrap_or_else(paradraft::fetch::default_model_path);
    let sizing = base.draft_length;
    let curve = if sizing == paradraft::drafters::speculative_config::DraftLength::Fixed {
        None
    } else {
        Some(CostCurve::measure(&lm.model, 64, 2)?)
    };
    let ar = DrafterConfig {
        method: Method::none(),
        ..base.clone()
    };
    let mut methods = vec![harness::Method {
        name: "ar".into(),
        drafters: ar.load(&target_path, &lm, ctx)?,
    }];
    for &m in methods_asked.iter().filter(|m| !m.is_none()) {
        let cfg = DrafterConfig {
            method: m,
            ..base.clone()
        };
        let mut drafters = cfg.load(&target_path, &lm, ctx)?;
        if let Some(c) = &curve {
            drafters.measure_costs(&lm.model, c)?;
        }
        methods.push(harness::Method {
            name: cfg.label(),
            drafters,
        });
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut log = std::fs::File::create(a.out.join("runs.jsonl"))?;
    let total: usize = sets.iter().map(|(_, i)| i.len()).sum::<usize>() * methods.len();
    let mut done = 0;
    let params = harness::BenchParams {
        max_new_tokens: a.max_new_tokens,
        sampling,
        ctx,
        rule: a.sampling.verify_rule,
    };
    let runs = harness::run_bench(&lm, &sets, &mut methods, &params, |r| {
        let _ = writeln!(log, "{}", serde_json::to_string(r).unwrap_or_default());
        if r.turn == 0 {
            done += 1;
        }
        eprint!(
            "\r[{done}/{total}] {} {} {}: {} tok, tau {:.2}      ",
            r.dataset, r.id, r.method, r.generated, r.tau
        );
    })?;
    eprintln!();
    let identical = sampling.is_greedy() || a.sampling.verify_rule == VerifyRule::Coupled;
    let summaries = harness::summarize(&runs, "ar", identical);
    let header = paradraft::bench::header::Header::collect(
        &paradraft::bench::header::Setup {
            model: &target_path,
            threads: paradraft::runtime::current_threads(),
            rule: a.sampling.verify_rule,
            sizing,
            max_new_tokens: a.max_new_tokens,
            prompts_per_dataset: a.num_prompts,
            commit: env!("PARADRAFT_COMMIT"),
        },
        &sampling,
    );
    std::fs::write(
        a.out.join("summary.json"),
        serde_json::to_string_pretty(&json!({"header": header, "summaries": summaries}))?,
    )?;
    let md = report::markdown(&header, &summaries);
    std::fs::write(a.out.join("summary.md"), &md)?;
    report::charts(&summaries, &runs, &a.out)?;
    println!("{md}");
    eprintln!(
        "wrote {}/{{runs.jsonl,summary.json,summary.md,speedup.svg,latency.svg,tau_hist.svg}}",
        a.out.display()
    );
    let bad = report::mismatches(&summaries);
    if !bad.is_empty() {
        let list: Vec<String> = bad
            .iter()
            .map(|(ds, m, n)| format!("{m} on {ds}: {n} run(s)"))
            .collect();
        bail!(
            "outputs differ from AR's where they must be identical ({}): a losslessness bug",
            list.join(", ")
        );
    }
    Ok(())
}

/// `PARADRAFT_ISA`, when set, must name a kernel family this CPU has.
fn check_env() -> Result<()> {
    paradraft::runtime::isa::selected()
        .map(|_| ())
        .map_err(anyhow::Error::msg)
}

fn main() {
    // `--version` also says which kernels this CPU runs (CI prints it).
    let long = format!(
        "{}\n{}",
        env!("CARGO_PKG_VERSION"),
        paradraft::runtime::isa::describe()
    );
    let matches = <Cli as clap::CommandFactory>::command()
        .long_version(&*Box::leak(long.into_boxed_str()))
        .get_matches();
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let r = check_env().and_then(|()| match cli.cmd {
        Cmd::FetchModel(a) => cmd_fetch(a),
        Cmd::Generate(a) => cmd_generate(a),
        Cmd::Logits(a) => cmd_logits(a),
        Cmd::BenchKernels(a) => cmd_bench_kernels(a),
        Cmd::Bench(a) => cmd_bench(a),
        Cmd::Train(c) => train::run(c),
        Cmd::Ngram(c) => ngram::run(c),
        Cmd::Serve(a) => serve::run(a),
    });
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
