//! `paradraft train campaign`: start or resume THE training campaign of a drafter (DART,
//! DFlash or PARD; see `paradraft::train::campaign`): argument mapping only.

use crate::ModelArgs;
use anyhow::{bail, Result};
use clap::Args;
use paradraft::train::campaign::{self, CampaignMethod, Params, Setup, Sources, Stamp};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Args)]
pub struct CampaignArgs {
    #[command(flatten)]
    pub m: ModelArgs,
    /// The drafter the campaign trains.
    #[arg(long, value_enum, default_value_t = MethodArg::Dart)]
    pub method: MethodArg,
    /// The campaign's directory (default: $HOME/.cache/paradraft/campaign/<method>).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The drafter a campaign without a checkpoint starts from (its shape and draft vocabulary
    /// fix the campaign's; default: the committed drafters/smollm2-135m-<method>).
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// Self-distilled samples the data starts from; their last 5 % are held out.
    #[arg(long, default_value = "data/distill/smollm2-135m-samples.bin.gz")]
    pub seed_samples: PathBuf,
    /// More self-distilled samples a new campaign's data gets after the seed (answers earlier
    /// campaigns distilled; samples of held-out or already answered prompts are left out).
    /// Default: `data/distill/smollm2-135m-samples-more.bin.gz` when it is there.
    #[arg(long)]
    pub more_samples: Option<PathBuf>,
    /// Sampled answers a new campaign's data starts with (training prompts answered again at a
    /// temperature, labelled by the target; answers to held-out prompts are left out).
    /// Default: `data/distill/smollm2-135m-sampled.bin.gz` when it is there.
    #[arg(long)]
    pub more_sampled: Option<PathBuf>,
    /// Prompts of the samples, and of the samples the campaign distils.
    #[arg(long, default_value = "data/train/distill_prompts.jsonl.gz")]
    pub prompts: PathBuf,
    /// Corpus text for teacher forcing ({"id", "text"} JSON Lines); repeatable.
    #[arg(long, default_values = ["data/corpus/corpus_permissive.jsonl.gz"])]
    pub corpus: Vec<PathBuf>,
    #[arg(long, default_value_t = 512)]
    pub corpus_max_len: usize,
    /// Learning rate (default: the method's; DART and DFlash 1e-4, PARD 2e-4).
    #[arg(long)]
    pub lr: Option<f64>,
    #[arg(long, default_value_t = Params::default().batch_seqs)]
    pub batch_seqs: usize,
    /// DART prefixes or DFlash block anchors per sequence (PARD: COD decides).
    #[arg(long, default_value_t = Params::default().anchors)]
    pub anchors: usize,
    #[arg(long, default_value_t = Params::default().kl_weight)]
    pub kl_weight: f64,
    /// Loss decay over the drafts (default: the method's; DART 0.6, DFlash 7).
    #[arg(long)]
    pub gamma: Option<f32>,
    /// Share of sequences drawn from the corpus (default 0).
    #[arg(long)]
    pub corpus_share: Option<f64>,
    /// Share of the time spent self-distilling new samples (default: the method's; DART and
    /// DFlash 0.5, PARD 0: its data outlasts it).
    #[arg(long)]
    pub distill_share: Option<f64>,
    /// Temperature of sampled self-distillation, once every prompt has its greedy answer (0:
    /// greedy answers only; default 0.8).
    #[arg(long)]
    pub sample_temp: Option<f32>,
    /// Share of self-distilled sequences drawn from sampled ones (default: by their number).
    #[arg(long)]
    pub sampled_share: Option<f64>,
    /// Steps between held-out evaluations.
    #[arg(long, default_value_t = Params::default().eval_every)]
    pub eval_every: usize,
    /// Minutes of training between checkpoints.
    #[arg(long, default_value_t = Params::default().round_s / 60.0)]
    pub save_every_min: f64,
    /// Stop (after a checkpoint) after this many hours of wall time (0: run until killed).
    #[arg(long, default_value_t = 0.0)]
    pub hours: f64,
    /// Stop (after a checkpoint) at this step (0: no limit); for fixed-length experiments.
    #[arg(long, default_value_t = 0)]
    pub max_steps: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Training matmuls in f32 (default: bf16 products, f32 sums, where the CPU has AVX-512 BF16).
    #[arg(long)]
    pub f32_matmul: bool,
    /// Self-distil this many sampled samples into the campaign's data now, and exit.
    #[arg(long)]
    pub sample: Option<usize>,
    /// Measure training throughput over this many steps (nothing saved) and exit.
    #[arg(long)]
    pub bench: Option<usize>,
    /// Draw the held-out curve (α1 and expected τ against CPU-hours) as an SVG here and exit.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// `--method`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MethodArg {
    Dart,
    Dflash,
    Pard,
}

impl From<MethodArg> for CampaignMethod {
    fn from(m: MethodArg) -> CampaignMethod {
        match m {
            MethodArg::Dart => CampaignMethod::Dart,
            MethodArg::Dflash => CampaignMethod::Dflash,
            MethodArg::Pard => CampaignMethod::Pard,
        }
    }
}

pub fn run(a: CampaignArgs) -> Result<()> {
    let method = CampaignMethod::from(a.method);
    let d = method.params();
    let p = Params {
        lr: a.lr.unwrap_or(d.lr),
        batch_seqs: a.batch_seqs,
        anchors: a.anchors,
        kl_weight: a.kl_weight,
        gamma: a.gamma.unwrap_or(d.gamma),
        corpus_share: a.corpus_share.unwrap_or(d.corpus_share),
        distill_share: a.distill_share.unwrap_or(d.distill_share),
        sample_temp: a.sample_temp.unwrap_or(d.sample_temp),
        sampled_share: a.sampled_share,
        eval_every: a.eval_every,
        round_s: a.save_every_min * 60.0,
        seed: a.seed,
        bf16_matmul: !a.f32_matmul,
        ..d
    };
    p.validate()?;
    method.check(&p)?;
    if a.hours < 0.0 {
        bail!("--hours {}: must be at least 0", a.hours);
    }
    let dir = a.dir.clone().unwrap_or_else(|| method.default_dir());
    if let Some(out) = &a.plot {
        let title = format!("{} campaign: held-out", method.label());
        campaign::plot_curve(&dir, out, &title)?;
        eprintln!("curve written to {}", out.display());
        return Ok(());
    }
    let from = a.from.clone().unwrap_or_else(|| method.published());
    let (lm, _) = a.m.load()?;
    let (net, vocab) = method.load(&from, &lm.model)?;
    let shape = net.shape();
    let stamp = Stamp::new(&lm, &shape, &vocab);
    campaign::check_stamp(&dir, &stamp, &p)?;
    let more = a.more_samples.clone().or_else(|| {
        let d = PathBuf::from("data/distill/smollm2-135m-samples-more.bin.gz");
        d.exists().then_some(d)
    });
    let sampled = a.more_sampled.clone().or_else(|| {
        let d = PathBuf::from("data/distill/smollm2-135m-sampled.bin.gz");
        d.exists().then_some(d)
    });
    let src = Sources {
        seed: a.seed_samples.clone(),
        more,
        sampled,
        prompts: a.prompts.clone(),
        // Tokenised (once per directory) only when drawn from.
        corpus: if p.corpus_share > 0.0 {
            a.corpus.clone()
        } else {
            vec![]
        },
        corpus_max_len: a.corpus_max_len,
    };
    let prep = campaign::prepare(&dir, &lm, &src, |n| eprintln!("{n}"))?;
    drop(net);
    let target = &lm.model;
    let start = move || Ok(method.load(&from, target)?.0);
    let setup = Setup {
        dir: &dir,
        lm: &lm,
        vocab: &vocab,
        shape: &shape,
        held_out: prep.held_out,
        corpus: prep.corpus,
        prompts: &prep.prompts,
        start: &start,
    };
    if let Some(n) = a.sample {
        let added = campaign::grow_sampled(&setup, &p, n)?;
        println!(
            "self-distilled {added} sampled samples at temperature {}",
            p.sample_temp
        );
        return Ok(());
    }
    if let Some(steps) = a.bench {
        let (pos_s, s_step) = campaign::bench(&setup, &p, steps)?;
        println!("campaign bench: {steps} steps, {s_step:.3} s/step, {pos_s:.0} positions/s");
        return Ok(());
    }
    eprintln!("campaign in {}", dir.display());
    let t0 = std::time::Instant::now();
    let (hours, max_steps, signalled) = (a.hours, a.max_steps, on_signal());
    let pr = campaign::run(
        &setup,
        &p,
        |pr| {
            (hours > 0.0 && t0.elapsed().as_secs_f64() > hours * 3600.0)
                || (max_steps > 0 && pr.step >= max_steps)
                || signalled.load(Ordering::Relaxed)
        },
        |e| {
            let line = e.to_string();
            if !line.is_empty() {
                eprintln!("{line}");
            }
        },
    )?;
    eprintln!("stopped at {pr}");
    Ok(())
}

/// Set once SIGTERM or Ctrl-C arrives: the campaign then stops after its current step and
/// writes a checkpoint (`scripts/campaign.sh stop`).
fn on_signal() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        if let Ok(rt) = rt {
            rt.block_on(paradraft::server::shutdown_signal());
            eprintln!("stop requested: checkpointing after this step");
            f.store(true, Ordering::Relaxed);
        }
    });
    flag
}
