//! `paradraft`: the command-line front end.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use paradraft::drafters::speculative_config::Method;
use paradraft::generate::generate;
use paradraft::model::{self, Message};
use paradraft::server::openai::Stop;
use paradraft::speculative::speculative_generate;
use paradraft::types::TokenId;
use serde_json::json;
use speculative_args::{MethodArg, SpecArgs};
use std::io::Write;
use std::path::PathBuf;

mod ngram;
mod serve;
mod speculative_args;
mod train;
mod train_campaign;

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
    #[arg(long, value_enum, value_delimiter = ',', default_value = "auto")]
    methods: Vec<MethodArg>,
    /// Datasets: mt_bench, humaneval, gsm8k, math500, mbpp, alpaca, copy (copy-heavy Alpaca edits).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "mt_bench,humaneval,gsm8k,math500"
    )]
    datasets: Vec<String>,
    /// Your own prompts instead of the datasets: JSON Lines of Spec-Bench / MT-Bench questions
    /// (`turns`, `category`), OpenAI `messages`, ShareGPT `conversations` or `{"prompt": ..}`,
    /// reported per category.
    #[arg(long, conflicts_with_all = ["datasets", "data_dir"])]
    prompts: Option<PathBuf>,
    /// The field of --prompts lines naming their category (default: `category` where present,
    /// else one set named after the file).
    #[arg(long, requires = "prompts")]
    category_field: Option<String>,
    /// Items per dataset, or per category of --prompts (default: 10 per dataset; every prompt
    /// of a --prompts file).
    #[arg(long)]
    num_prompts: Option<usize>,
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

/// The target's flags: the library's model options.
pub(crate) type ModelArgs = paradraft::model::ModelOptions;

/// The sampler's flags: the library's, validated as the server validates a request.
type SamplingArgs = paradraft::server::flags::SamplingFlags;

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
    #[command(flatten)]
    processing: paradraft::server::flags::ProcessingFlags,
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
    /// The exact reference path: f32 activations and an f32 KV cache on the dequantised
    /// weights (what the int8 kernels are checked against).
    #[arg(long, conflicts_with = "exact_activations")]
    exact: bool,
    /// The exact path's f32 activations on the dequantised weights, but the --kv-dtype cache:
    /// what a cache type alone moves the logits, without the int8 activations' own noise.
    #[arg(long)]
    exact_activations: bool,
    #[arg(long)]
    json: bool,
}

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

fn cmd_generate(a: GenerateArgs) -> Result<()> {
    let sampling = a.sampling.params()?;
    let user = read_prompt(a.prompt.as_deref(), a.prompt_file.as_deref())?.unwrap_or_default();
    if user.is_empty() {
        bail!("--prompt: the prompt is empty");
    }
    let cfg = a.spec.config(Method::auto())?;
    cfg.check_used(&[cfg.method])?;
    // The drafter's weights and n-gram trie load beside the target's.
    cfg.prefetch();
    let (lm, ctx) = a.m.load_with(&|tok| cfg.on_tokenizer(tok))?;
    let tok = &lm.tokenizer;
    let prompt = tok.encode_prompt(&user, a.system.as_deref(), a.raw)?;
    let stop = Some(Stop::Many(a.stop.clone()));
    let bias = a.processing.bias()?;
    let knobs = a.sampling.knobs(
        a.max_new_tokens
            .unwrap_or_else(|| 256.min(ctx.saturating_sub(prompt.len())).max(1) as i64),
        &stop,
    );
    let mut params = a
        .processing
        .knobs(knobs, &bias)?
        .params(prompt.len(), ctx, lm.model.config.vocab_size, || {
            sampling.seed
        })
        .map_err(paradraft::server::flags::flag_error)?;
    params.processing.grammar = a.processing.grammar()?;
    let mut kv = lm.model.new_kv(ctx);
    let stream = !a.json;
    let print = |piece: &str| {
        if stream {
            print!("{piece}");
            let _ = std::io::stdout().flush();
        }
    };
    let mut set = cfg.load(&a.m.path(), &lm, ctx)?;
    let (json, stats, stop, extra) = if set.is_ar() {
        let g = generate(&lm.model, tok, &mut kv, &prompt, &params, print)?;
        (
            serde_json::to_value(&g)?,
            g.stats,
            g.stop_reason,
            String::new(),
        )
    } else {
        set.persist(
            &paradraft::fetch::home_dir().join("guard"),
            &a.m.path(),
            &lm.model,
        );
        let curve = set.measure(&lm.model, !sampling.is_greedy())?;
        let sp = set.speculation(sampling, a.sampling.verify_rule)?;
        let g = speculative_generate(&lm.model, tok, &mut kv, &prompt, &params, sp, print)?;
        let (v, extra) = (
            g.summary_json(curve.as_ref()),
            g.summary_line(curve.as_ref()),
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
    let (mut lm, _) = a.m.load()?;
    if a.exact || a.exact_activations {
        // f32 activations and an f32 cache (`set_exact`); --exact-activations then puts the
        // --kv-dtype cache back. Without either, --kv-dtype's cache stands (set at load).
        lm.model.set_exact(true);
        if a.exact_activations {
            lm.model.set_kv_dtype(a.m.kv_dtype);
        }
    }
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
    let top = paradraft::generate::top_logits(&lm.model, &ids, a.top_k)?;
    let positions: Vec<_> = top
        .iter()
        .map(|t| json!({"top": t.iter().map(|(id, l)| json!([id.0, l])).collect::<Vec<_>>()}))
        .collect();
    let obj = json!({"token_ids": ids, "positions": positions});
    if a.json {
        println!("{obj}");
    } else {
        // Per position: its token, then the top-k next tokens as id:logit "text".
        for (i, p) in top.iter().enumerate() {
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
    let (lm, _) = a.m.load()?;
    let path = a.m.path();
    let p = paradraft::bench::KernelBenchParams {
        repeats: a.repeats,
        context: a.context,
        decode_tokens: a.decode_tokens,
        prefill_tokens: a.prefill_tokens,
        threads: paradraft::runtime::current_threads(),
    };
    let mut r =
        paradraft::bench::run_kernel_bench(&lm.model, &p, Some(&path), a.llama_bench.as_deref())?;
    let cfg = a.spec.config(Method::none())?;
    cfg.check_used(&[cfg.method])?;
    let set = cfg.load(&path, &lm, a.context + 64)?;
    if !set.is_ar() {
        let mut d = set.create(Default::default())?;
        r.add_drafter(&lm.model, d.as_mut(), set.max_draft, 5 * a.repeats)?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{r}");
    }
    Ok(())
}

fn cmd_bench(a: BenchArgs) -> Result<()> {
    use paradraft::bench::suite;
    let sampling = a.sampling.params()?;
    if a.spec.drafter.is_some() || a.spec.speculative_config.is_some() {
        bail!("bench compares the drafters given by --methods; --drafter and --speculative-config are for generate");
    }
    let methods: Vec<Method> = a.methods.iter().map(|m| m.0).collect();
    let base = a.spec.config(Method::none())?;
    base.check_used(&methods)?;
    let (sets, per_set) = match &a.prompts {
        Some(f) => {
            let o = paradraft::bench::prompt_file::Options {
                category_field: a.category_field.clone(),
                per_category: a.num_prompts,
            };
            (paradraft::bench::prompt_file::load(f, &o)?, a.num_prompts)
        }
        None => {
            let dir = a.data_dir.clone().unwrap_or_else(suite::default_dir);
            let n = a.num_prompts.unwrap_or(10);
            (suite::load_sets(&a.datasets, &dir, n)?, Some(n))
        }
    };
    let (lm, ctx) = a.m.load()?;
    let (md, lossy) = suite::Suite {
        lm: &lm,
        target_path: &a.m.path(),
        ctx,
        base: &base,
        methods: &methods,
        sets,
        prompts_per_dataset: per_set,
        prompt_file: a.prompts.as_deref(),
        max_new_tokens: a.max_new_tokens,
        sampling,
        rule: a.sampling.verify_rule,
        out: a.out,
        commit: env!("PARADRAFT_COMMIT"),
    }
    .run()?;
    println!("{md}");
    lossy.map_or(Ok(()), |e| Err(e.into()))
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
