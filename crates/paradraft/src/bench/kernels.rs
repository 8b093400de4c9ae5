//! `bench-kernels`: the target's forward cost curve c(k) on this machine, decode and prefill
//! speed, achieved bandwidth and compute, and (given a `llama-bench` binary) llama.cpp measured
//! in the same run, interleaved, so that ratios survive a noisy shared machine.

use crate::error::{Error, Result};
use crate::model::{Batch, Logits, Model, OutputSpec, Rows, Scratch};
use crate::speculative::sizing::WARM_FORWARDS;
use crate::types::{Pos, TokenId};
use serde::Serialize;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

pub const CURVE_K: [usize; 6] = [1, 2, 4, 8, 16, 32];

#[derive(Clone, Debug)]
pub struct KernelBenchParams {
    pub repeats: usize,
    /// Tokens already in the KV cache when the curve is measured.
    pub context: usize,
    pub decode_tokens: usize,
    pub prefill_tokens: usize,
    pub threads: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Stat {
    pub min: f64,
    pub median: f64,
}

impl Stat {
    fn of(mut v: Vec<f64>) -> Stat {
        v.sort_by(f64::total_cmp);
        Stat {
            min: v[0],
            median: v[v.len() / 2],
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct CurvePoint {
    pub k: usize,
    /// Median ms of one forward over k tokens with full logits for every row.
    pub ms_all_logits: f64,
    /// Median ms with the fused argmax instead of logits.
    pub ms_argmax: f64,
    pub min_ms_all_logits: f64,
    pub min_ms_argmax: f64,
    /// Median ms without the output layer (the layers alone): `ms_argmax` less this is what
    /// the output layer's argmax costs for k rows.
    pub ms_no_output: f64,
    /// `ms_all_logits(k) / ms_all_logits(1)`.
    pub cost_vs_k1: f64,
    pub gmac_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct LlamaCpp {
    pub tg128_tok_s: f64,
    pub pp512_tok_s: f64,
    pub curve: Vec<LlamaPoint>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LlamaPoint {
    pub k: usize,
    pub ms: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct KernelBench {
    /// The kernel family and the CPU's SIMD features ([`crate::runtime::isa::describe`]).
    pub kernels: String,
    /// The CPU's model name, where the OS says it.
    pub cpu: Option<String>,
    pub threads: usize,
    pub repeats: usize,
    pub context: usize,
    /// Weight bytes of a forward with full logits.
    pub weight_bytes: usize,
    /// Weight bytes of a greedy decode step (fused argmax: the output layer's 4-bit screen).
    pub decode_weight_bytes: usize,
    pub macs_per_token: f64,
    pub decode_tok_s: f64,
    pub decode: Stat,
    pub prefill_tok_s: f64,
    pub prefill: Stat,
    pub prefill_tokens: usize,
    /// Weight bytes streamed per second in decode.
    pub decode_gb_s: f64,
    pub curve: Vec<CurvePoint>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llama_cpp: Option<LlamaCpp>,
    /// Ours / llama.cpp (speeds) and ours / llama.cpp (16-token forward time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratios: Option<serde_json::Value>,
    /// A drafter's proposal cost against a decode step ([`KernelBench::add_drafter`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft: Option<DraftCost>,
}

/// What a drafter's proposal of n nodes costs against one target decode step.
#[derive(Clone, Debug, Serialize)]
pub struct DraftCost {
    pub drafter: String,
    pub decode_step_ms: f64,
    /// Repeats each point is the minimum of.
    #[serde(skip)]
    pub repeats: usize,
    pub curve: Vec<DraftPoint>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DraftPoint {
    pub nodes: usize,
    pub ms: f64,
    pub vs_decode_step: f64,
}

impl KernelBench {
    /// Measures `drafter`'s proposal cost for 1..=`max_nodes` nodes after `context` tokens
    /// (minimum of `repeats`) against this bench's decode step.
    pub fn add_drafter(
        &mut self,
        model: &Model,
        drafter: &mut dyn crate::speculative::Drafter,
        max_nodes: usize,
        repeats: usize,
    ) -> Result<()> {
        let c = crate::speculative::sizing::CostCurve::measure_drafter(
            model,
            drafter,
            self.context,
            max_nodes,
            repeats,
        )?;
        let step = 1e3 / self.decode_tok_s;
        self.draft = Some(DraftCost {
            drafter: drafter.name().to_string(),
            decode_step_ms: step,
            repeats,
            curve: c
                .points
                .iter()
                .map(|&(nodes, ms)| DraftPoint {
                    nodes,
                    ms,
                    vs_decode_step: ms / step,
                })
                .collect(),
        });
        Ok(())
    }
}

impl std::fmt::Display for KernelBench {
    /// The report as text: machine, speeds, the c(k) table (llama.cpp beside), the drafter.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self;
        writeln!(
            f,
            "{}, {}",
            r.cpu.as_deref().unwrap_or("unknown CPU"),
            r.kernels
        )?;
        writeln!(
            f,
            "threads {}, weights {:.1} MB ({:.1} MB per greedy decode step), context {}",
            r.threads,
            r.weight_bytes as f64 / 1e6,
            r.decode_weight_bytes as f64 / 1e6,
            r.context
        )?;
        writeln!(
            f,
            "decode  {:.1} tok/s ({:.1} GB/s of weights)   prefill({}) {:.1} tok/s",
            r.decode_tok_s, r.decode_gb_s, r.prefill_tokens, r.prefill_tok_s
        )?;
        writeln!(
            f,
            "{:>3} {:>10} {:>10} {:>10} {:>8} {:>8} {:>10}",
            "k", "ms(logits)", "ms(argmax)", "ms(layers)", "c(k)/c1", "GMAC/s", "llama ms"
        )?;
        for c in &r.curve {
            let l = r
                .llama_cpp
                .as_ref()
                .and_then(|l| l.curve.iter().find(|p| p.k == c.k))
                .map(|p| format!("{:.2}", p.ms))
                .unwrap_or_default();
            writeln!(
                f,
                "{:>3} {:>10.2} {:>10.2} {:>10.2} {:>8.2} {:>8.1} {:>10}",
                c.k, c.ms_all_logits, c.ms_argmax, c.ms_no_output, c.cost_vs_k1, c.gmac_s, l
            )?;
        }
        if let Some(l) = &r.llama_cpp {
            writeln!(
                f,
                "llama.cpp tg128 {:.1} tok/s, pp512 {:.1} tok/s",
                l.tg128_tok_s, l.pp512_tok_s
            )?;
            writeln!(f, "ratios {}", r.ratios.clone().unwrap_or_default())?;
        }
        if let Some(d) = &r.draft {
            writeln!(
                f,
                "{} draft pass (min of {} repeats) against a {:.2} ms decode step:",
                d.drafter, d.repeats, d.decode_step_ms
            )?;
            for p in &d.curve {
                writeln!(
                    f,
                    "  {:>2} nodes {:>6.3} ms  {:.3} × step",
                    p.nodes, p.ms, p.vs_decode_step
                )?;
            }
        }
        Ok(())
    }
}

fn tokens(n: usize, vocab: usize) -> Vec<TokenId> {
    (0..n)
        .map(|i| TokenId(((i * 7919 + 13) % vocab) as u32))
        .collect()
}

fn positions(start: usize, n: usize) -> Vec<Pos> {
    (start..start + n).map(|p| Pos(p as u32)).collect()
}

/// Seconds of one forward of `k` tokens after `ctx` cached ones (median of
/// [`FORWARDS_PER_REPEAT`]).
fn time_forward(
    model: &Model,
    ctx: usize,
    k: usize,
    logits: Logits,
    s: &mut Scratch,
) -> Result<f64> {
    let vocab = model.config.vocab_size;
    let mut kv = model.new_kv(ctx + k + 1);
    let pre = tokens(ctx.max(1), vocab);
    model.forward(
        &mut kv,
        &Batch {
            tokens: &pre[..ctx.max(1)],
            positions: &positions(0, ctx.max(1)),
            mask: None,
        },
        &OutputSpec {
            rows: Rows::Last,
            logits: Logits::None,
            taps: vec![],
        },
        s,
    )?;
    let toks = tokens(k, vocab);
    let pos = positions(kv.len(), k);
    let spec = OutputSpec {
        rows: Rows::All,
        logits,
        taps: vec![],
    };
    let base = kv.len();
    // The forwards right after a prefill run slow for a while (see `WARM_FORWARDS`); decoding
    // does not, so neither is timed there.
    for _ in 0..WARM_FORWARDS {
        model.forward(
            &mut kv,
            &Batch {
                tokens: &toks[..1],
                positions: &pos[..1],
                mask: None,
            },
            &spec,
            s,
        )?;
        kv.truncate(base);
    }
    // The median of a few back-to-back forwards (the new tokens dropped after each), so one
    // repeat is not one scheduler hiccup on a shared machine.
    let mut times = Vec::with_capacity(FORWARDS_PER_REPEAT);
    for _ in 0..FORWARDS_PER_REPEAT {
        let t = Instant::now();
        model.forward(
            &mut kv,
            &Batch {
                tokens: &toks,
                positions: &pos,
                mask: None,
            },
            &spec,
            s,
        )?;
        times.push(t.elapsed().as_secs_f64());
        kv.truncate(base);
    }
    Ok(Stat::of(times).median)
}

/// Forwards timed per repeat of a curve point (their median is the repeat's value).
const FORWARDS_PER_REPEAT: usize = 5;

fn time_decode(model: &Model, n: usize, s: &mut Scratch) -> Result<f64> {
    let mut kv = model.new_kv(n + 8);
    let spec = OutputSpec {
        rows: Rows::Last,
        logits: Logits::Argmax,
        taps: vec![],
    };
    let mut tok = TokenId(1);
    model.forward(
        &mut kv,
        &Batch {
            tokens: &[tok],
            positions: &[Pos(0)],
            mask: None,
        },
        &spec,
        s,
    )?;
    let t = Instant::now();
    for i in 1..n {
        let out = model.forward(
            &mut kv,
            &Batch {
                tokens: &[tok],
                positions: &[Pos(i as u32)],
                mask: None,
            },
            &spec,
            s,
        )?;
        tok = out.argmax[0];
    }
    Ok((n - 1) as f64 / t.elapsed().as_secs_f64())
}

fn time_prefill(model: &Model, n: usize, s: &mut Scratch) -> Result<f64> {
    let mut kv = model.new_kv(n);
    let toks = tokens(n, model.config.vocab_size);
    let spec = OutputSpec {
        rows: Rows::Last,
        logits: Logits::Full,
        taps: vec![],
    };
    let t = Instant::now();
    model.forward(
        &mut kv,
        &Batch {
            tokens: &toks,
            positions: &positions(0, n),
            mask: None,
        },
        &spec,
        s,
    )?;
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// One llama-bench run.
struct LlamaRun {
    tg128: f64,
    pp512: f64,
    /// (k, ms per k-token batch)
    curve: Vec<(usize, f64)>,
}

fn llama_bench_once(bin: &Path, model: &Path, threads: usize) -> Result<LlamaRun> {
    let ks: Vec<String> = CURVE_K
        .iter()
        .map(|k| k.to_string())
        .chain(["512".into()])
        .collect();
    let out = Command::new(bin)
        .args(["-m"])
        .arg(model)
        .args([
            "-t",
            &threads.to_string(),
            "-p",
            &ks.join(","),
            "-n",
            "128",
            "-r",
            "1",
            "-o",
            "jsonl",
        ])
        .output()
        .map_err(|e| Error::BadRequest(format!("running {}: {e}", bin.display())))?;
    if !out.status.success() {
        return Err(Error::BadRequest(format!(
            "{} failed: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let (mut tg, mut pp512, mut curve) = (0.0, 0.0, vec![]);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (np, ng, ts) = (
            v["n_prompt"].as_u64().unwrap_or(0) as usize,
            v["n_gen"].as_u64().unwrap_or(0),
            v["avg_ts"].as_f64().unwrap_or(0.0),
        );
        if ng > 0 {
            tg = ts;
        } else if np == 512 {
            pp512 = ts;
        } else if np > 0 && ts > 0.0 {
            curve.push((np, np as f64 / ts * 1e3));
        }
    }
    Ok(LlamaRun {
        tg128: tg,
        pp512,
        curve,
    })
}

/// Multiply-accumulates of one token through the weights (attention over the cache excluded).
pub fn macs_per_token(model: &Model) -> f64 {
    let c = &model.config;
    let (h, hd, ff) = (
        c.hidden_size as f64,
        c.head_dim as f64,
        c.intermediate_size as f64,
    );
    let attn = h * (c.n_heads as f64 * hd) * 2.0 + h * (c.n_kv_heads as f64 * hd) * 2.0;
    // A mixture of experts: the router, and the experts a token uses (each `ff` wide).
    let mlp = match &c.extras.moe {
        Some(m) => 3.0 * h * ff * m.n_used as f64 + h * m.n_experts as f64,
        None => 3.0 * h * ff,
    };
    c.n_layers as f64 * (attn + mlp) + h * c.vocab_size as f64
}

pub fn run_kernel_bench(
    model: &Model,
    p: &KernelBenchParams,
    model_path: Option<&Path>,
    llama_bench: Option<&Path>,
) -> Result<KernelBench> {
    let mut s = Scratch::default();
    // Warm-up: page in weights, grow scratch buffers.
    time_forward(model, p.context, 32, Logits::Full, &mut s)?;
    let mut all = vec![vec![]; CURVE_K.len()];
    let mut arg = vec![vec![]; CURVE_K.len()];
    let mut bare = vec![vec![]; CURVE_K.len()];
    let (mut dec, mut pre) = (vec![], vec![]);
    let (mut ltg, mut lpp, mut lcurve) = (vec![], vec![], vec![vec![]; CURVE_K.len()]);
    for _ in 0..p.repeats {
        if let (Some(bin), Some(mp)) = (llama_bench, model_path) {
            let run = llama_bench_once(bin, mp, p.threads)?;
            ltg.push(run.tg128);
            lpp.push(run.pp512);
            for (k, ms) in run.curve {
                if let Some(i) = CURVE_K.iter().position(|&x| x == k) {
                    lcurve[i].push(ms);
                }
            }
        }
        for (i, &k) in CURVE_K.iter().enumerate() {
            all[i].push(time_forward(model, p.context, k, Logits::Full, &mut s)? * 1e3);
            arg[i].push(time_forward(model, p.context, k, Logits::Argmax, &mut s)? * 1e3);
            bare[i].push(time_forward(model, p.context, k, Logits::None, &mut s)? * 1e3);
        }
        dec.push(time_decode(model, p.decode_tokens, &mut s)?);
        pre.push(time_prefill(model, p.prefill_tokens, &mut s)?);
    }
    let macs = macs_per_token(model);
    let all: Vec<Stat> = all.into_iter().map(Stat::of).collect();
    let k1 = all[0].median;
    let curve = CURVE_K
        .iter()
        .enumerate()
        .map(|(i, &k)| {
            let a = Stat::of(arg[i].clone());
            CurvePoint {
                k,
                ms_all_logits: all[i].median,
                ms_argmax: a.median,
                min_ms_all_logits: all[i].min,
                min_ms_argmax: a.min,
                ms_no_output: Stat::of(bare[i].clone()).median,
                cost_vs_k1: all[i].median / k1,
                gmac_s: macs * k as f64 / (all[i].median / 1e3) / 1e9,
            }
        })
        .collect::<Vec<_>>();
    let decode = Stat::of(dec);
    let prefill = Stat::of(pre);
    let llama_cpp = (!ltg.is_empty()).then(|| LlamaCpp {
        tg128_tok_s: Stat::of(ltg).median,
        pp512_tok_s: Stat::of(lpp).median,
        curve: CURVE_K
            .iter()
            .zip(&lcurve)
            .filter(|(_, v)| !v.is_empty())
            .map(|(&k, v)| LlamaPoint {
                k,
                ms: Stat::of(v.clone()).median,
            })
            .collect(),
    });
    let ratios = llama_cpp.as_ref().map(|l| {
        let l16 = l.curve.iter().find(|p| p.k == 16).map(|p| p.ms);
        let ours16 = curve.iter().find(|p| p.k == 16).map(|p| p.ms_all_logits);
        serde_json::json!({
            "decode_vs_llama_tg128": decode.median / l.tg128_tok_s,
            "prefill_vs_llama_pp512": prefill.median / l.pp512_tok_s,
            "k16_time_vs_llama": match (ours16, l16) { (Some(a), Some(b)) => Some(a / b), _ => None },
        })
    });
    Ok(KernelBench {
        kernels: crate::runtime::isa::describe(),
        cpu: crate::runtime::isa::cpu_model(),
        threads: p.threads,
        repeats: p.repeats,
        context: p.context,
        weight_bytes: model.weight_bytes(),
        macs_per_token: macs,
        decode_tok_s: decode.median,
        decode_weight_bytes: model.argmax_weight_bytes(),
        decode_gb_s: model.argmax_weight_bytes() as f64 * decode.median / 1e9,
        decode,
        prefill_tok_s: prefill.median,
        prefill,
        prefill_tokens: p.prefill_tokens,
        curve,
        llama_cpp,
        ratios,
        draft: None,
    })
}
