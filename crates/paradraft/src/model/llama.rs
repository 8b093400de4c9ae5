//! The Llama-family decoder (Llama 2/3, SmolLM2, Qwen2/2.5, Qwen3) with a forward pass over
//! new tokens at explicit positions, with tree masks and hidden-state taps.

use super::config::{Arch, Config};
use super::forward::{Batch, Logits, Output, OutputSpec, Rows};
use super::layer::{rope_rows, rope_table, Layer, LayerScratch, SeqAttn};
use super::source::TensorSource;
use crate::error::{Error, Result};
use crate::kv::{KvCache, KvDtype, PagePool};
use crate::runtime::attention::{AttnShape, Visibility};
use crate::runtime::ops;
use crate::runtime::pool;
use crate::runtime::quant::{
    prep_acts as prep, quantize_q4_1_into, sized, GgmlType, Matrix, SendPtr,
};
use crate::types::TokenId;
use std::cell::RefCell;

pub struct Model {
    pub config: Config,
    embed: Matrix,
    /// `None` when the output layer is tied to the embedding.
    lm_head: Option<Matrix>,
    output_norm: Vec<f32>,
    layers: Vec<Layer>,
    inv_freq: Vec<f32>,
    /// The sliding-window layers' own RoPE frequencies (Gemma 3).
    inv_freq_local: Option<Vec<f32>>,
    /// LongRoPE: the context length beyond which its long factors apply, and their frequencies.
    inv_freq_long: Option<(usize, Vec<f32>)>,
    /// What cos and sin are multiplied by (LongRoPE's attention factor).
    rope_scale: f32,
    /// f32 activations in every matmul (the reference path) instead of int8 ones.
    exact: bool,
    /// Element type of the KV caches [`Model::new_kv`] makes.
    kv_dtype: KvDtype,
    /// A 4-bit copy of the output layer that screens the vocabulary for argmax / top-k.
    screen: Option<Matrix>,
}

/// Per-forward scratch buffers, grown on demand and reused.
#[derive(Default)]
pub struct Scratch {
    l: LayerScratch,
    positions: Vec<crate::types::Pos>,
    rows_x: Vec<f32>,
    logits: Vec<f32>,
    pub out: Output,
}

impl Model {
    pub fn from_source(config: Config, src: &dyn TensorSource) -> Result<Self> {
        config.validate()?;
        let c = &config;
        let fused = super::phi3::Fused::new(src, c);
        let src: &dyn TensorSource = if c.arch == Arch::Phi3 { &fused } else { src };
        let h = c.hidden_size;
        let embed = src.matrix("token_embd.weight", c.vocab_size, h)?;
        let lm_head = if c.tie_embeddings {
            None
        } else {
            Some(src.matrix("output.weight", c.vocab_size, h)?)
        };
        let output_norm = c.extras.norm_weights(src.vector("output_norm.weight", h)?);
        let qk_norm = c.arch.qk_norm();
        let layers = (0..c.n_layers)
            .map(|i| {
                let mut l = Layer::load(src, c, qk_norm, |s| format!("blk.{i}.{s}"))?;
                l.place(c, i);
                Ok(l)
            })
            .collect::<Result<Vec<_>>>()?;
        let inv_freq = config.inv_freqs();
        let inv_freq_local = config.inv_freqs_local();
        let inv_freq_long = config.inv_freqs_long();
        let rope_scale = config.rope_attn_factor();
        let screen = screen_of(lm_head.as_ref().unwrap_or(&embed));
        Ok(Model {
            config,
            embed,
            lm_head,
            output_norm,
            layers,
            inv_freq,
            inv_freq_local,
            inv_freq_long,
            rope_scale,
            exact: false,
            kv_dtype: KvDtype::F16,
            screen,
        })
    }

    /// The first `n` decoder layers, the final norm and the output layer.
    pub fn truncate_layers(mut self, n: usize) -> Result<Self> {
        if n == 0 || n > self.layers.len() {
            return Err(Error::BadRequest(format!(
                "cannot keep {n} of the model's {} layers",
                self.layers.len()
            )));
        }
        self.layers.truncate(n);
        self.config.n_layers = n;
        if let Some(w) = &mut self.config.extras.sliding_window {
            w.layers.truncate(n);
        }
        Ok(self)
    }

    /// Decoder layer `li`'s weights in f32 under HF names (see `Layer::weights_f32`): what a
    /// drafter made of the same layers is initialised from.
    pub fn layer_weights_f32(&self, li: usize) -> Option<Vec<super::layer::NamedWeight>> {
        self.layers.get(li).map(|l| l.weights_f32(&self.config))
    }

    /// Every dense (f32/f16) matrix — layers, embedding, LM head — in Q8_0, so that a
    /// checkpoint stored in f16 runs on the int8 kernels; quantized matrices stay as they are.
    pub fn quantize_dense_q8_0(&mut self) {
        self.quantize_dense(crate::runtime::quant::GgmlType::Q8_0);
    }

    /// Every dense matrix in `ty` (Q8_0, Q4_0, Q4_1, Q2_K, Q3_K, Q4_K, Q5_K or Q6_K; see
    /// [`crate::runtime::quant::Matrix::quantized`]):
    /// `--quantize`, for HF checkpoints and f16 / bf16 / f32 GGUF files. The embedding and
    /// the LM head stay wider under a 2- to 5-bit type (llama-quantize keeps the output layer
    /// wider too: it decides the logits directly): Q8_0 under Q4_0 / Q4_1, Q6_K under the
    /// K-quants and IQ4s. Those are llama-quantize's mixes ([`k_mix`]): `Q2_K`, `Q3_K_M`,
    /// `Q4_K_M`, `Q5_K_M`, `IQ4_NL` and `IQ4_XS`.
    pub fn quantize_dense(&mut self, ty: crate::runtime::quant::GgmlType) {
        use crate::runtime::quant::GgmlType;
        let n = self.layers.len();
        let gqa = self.config.n_heads / self.config.n_kv_heads.max(1);
        for (i, l) in self.layers.iter_mut().enumerate() {
            // The wider ones first: a quantized matrix stays as it is.
            let [v, o, down] = k_mix(ty, i, n, gqa);
            for (w, t) in l.v_and_down_mut().into_iter().zip([v, down]) {
                w.quantize(t);
            }
            l.out_proj_mut().quantize(o);
            l.matrices_mut().into_iter().for_each(|w| w.quantize(ty));
        }
        let outer = match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 => GgmlType::Q8_0,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::IQ4_NL
            | GgmlType::IQ4_XS => GgmlType::Q6_K,
            t => t,
        };
        self.embed.quantize(outer);
        if let Some(h) = &mut self.lm_head {
            h.quantize(outer);
        }
    }

    /// Writes the input embedding of `id` into `dst` (length `hidden_size`).
    pub fn embed_row(&self, id: usize, dst: &mut [f32]) {
        self.embed.row_into(id, dst);
    }

    /// The output layer (the embedding when tied): drafters that share the target's LM head
    /// (DFlash, DART) score with it.
    pub fn output_head(&self) -> &Matrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Weights of the final RMSNorm before the output layer.
    pub fn output_norm(&self) -> &[f32] {
        &self.output_norm
    }

    /// The input embedding matrix.
    pub fn embedding(&self) -> &Matrix {
        &self.embed
    }

    /// Chooses f32 activations for quantized matmuls (slower; the reference for the int8 path).
    /// The reference path also keeps its KV cache in f32.
    pub fn set_exact(&mut self, exact: bool) {
        self.exact = exact;
        self.kv_dtype = if exact { KvDtype::F32 } else { KvDtype::F16 };
    }

    /// The element type of KV caches made from now on (default f16; f32 on the exact path).
    pub fn set_kv_dtype(&mut self, dtype: KvDtype) {
        self.kv_dtype = dtype;
    }

    /// The element type of the K/V caches it makes.
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    /// A pool of `pages` KV pages (16 slots each) for this model's paged caches
    /// ([`KvCache::paged`]).
    pub fn new_kv_pool(&self, pages: usize) -> Result<std::sync::Arc<PagePool>> {
        let c = &self.config;
        PagePool::new(c.n_layers, c.n_kv_heads, c.head_dim, pages, self.kv_dtype)
    }

    /// A KV cache for this model holding `capacity` slots.
    pub fn new_kv(&self, capacity: usize) -> KvCache {
        let c = &self.config;
        KvCache::with_dtype(
            c.n_layers,
            c.n_kv_heads,
            c.head_dim,
            capacity,
            self.kv_dtype,
        )
    }

    /// Total bytes of weights (what one forward with full logits streams).
    pub fn weight_bytes(&self) -> usize {
        let l: usize = self.layers.iter().map(Layer::weight_bytes).sum();
        l + self.output_head().nbytes()
    }

    /// Bytes one greedy decode step streams: the output layer's 4-bit screen stands in for the
    /// output layer (plus the few rows re-scored exactly).
    pub fn argmax_weight_bytes(&self) -> usize {
        match &self.screen {
            Some(sc) if !self.exact => {
                self.weight_bytes() - self.output_head().nbytes() + sc.nbytes()
            }
            _ => self.weight_bytes(),
        }
    }

    fn validate(&self, kv: &KvCache, b: &Batch, spec: &OutputSpec) -> Result<()> {
        self.validate_seq(kv, b)?;
        self.validate_spec(b.tokens.len(), spec)
    }

    fn validate_seq(&self, kv: &KvCache, b: &Batch) -> Result<()> {
        let n = b.tokens.len();
        let bad = |m: String| Err(Error::BadRequest(m));
        if n == 0 {
            return bad("no tokens".into());
        }
        if b.positions.len() != n {
            return bad(format!("{n} tokens but {} positions", b.positions.len()));
        }
        if let Some(t) = b.tokens.iter().find(|t| t.idx() >= self.config.vocab_size) {
            return bad(format!(
                "token id {} is outside the vocabulary ({})",
                t.0, self.config.vocab_size
            ));
        }
        if let Some(m) = b.mask {
            if m.len() != n {
                return bad(format!("mask is {}×{0} for {n} tokens", m.len()));
            }
        }
        if kv.len() + n > kv.capacity() {
            return Err(Error::ContextOverflow {
                needed: kv.len() + n,
                capacity: kv.capacity(),
            });
        }
        let c = &self.config;
        if kv.geometry() != (c.n_layers, c.n_kv_heads, c.head_dim) {
            return bad(format!(
                "KV cache of {:?} (layers, KV heads, head dim) for a model of {:?}",
                kv.geometry(),
                (c.n_layers, c.n_kv_heads, c.head_dim)
            ));
        }
        Ok(())
    }

    fn validate_spec(&self, n: usize, spec: &OutputSpec) -> Result<()> {
        if let Some(&t) = spec.taps.iter().find(|&&t| t >= self.config.n_layers) {
            return Err(Error::BadRequest(format!(
                "tap layer {t} does not exist ({} layers)",
                self.config.n_layers
            )));
        }
        if let Rows::Some(r) = &spec.rows {
            if let Some(&i) = r.iter().find(|&&i| i >= n) {
                return Err(Error::BadRequest(format!(
                    "output row {i} is outside the batch of {n}"
                )));
            }
        }
        Ok(())
    }

    /// Runs the new tokens through the model, appending their K/V to `kv`; results land in
    /// `scratch.out`.
    pub fn forward<'s>(
        &self,
        kv: &mut KvCache,
        b: &Batch,
        spec: &OutputSpec,
        s: &'s mut Scratch,
    ) -> Result<&'s Output> {
        self.validate(kv, b, spec)?;
        self.forward_seqs(&mut [(kv, *b)], spec, s)
    }

    /// One forward over the new tokens of several sequences, each with its own KV cache (a
    /// continuous-batching step): their rows are concatenated for the matmuls, norms and MLP,
    /// and each attends over its own cache only. `spec.rows` and the outputs index the
    /// concatenated rows, sequence after sequence. Each row's results equal those of a forward
    /// of its sequence alone.
    pub fn forward_multi<'s>(
        &self,
        seqs: &mut [(&mut KvCache, Batch)],
        spec: &OutputSpec,
        s: &'s mut Scratch,
    ) -> Result<&'s Output> {
        if seqs.is_empty() {
            return Err(Error::BadRequest("no sequences".into()));
        }
        for (kv, b) in seqs.iter() {
            self.validate_seq(kv, b)?;
            if kv.dtype() != seqs[0].0.dtype() {
                return Err(Error::BadRequest(
                    "the KV caches of one forward must share an element type".into(),
                ));
            }
        }
        let n = seqs.iter().map(|(_, b)| b.tokens.len()).sum();
        self.validate_spec(n, spec)?;
        self.forward_seqs(seqs, spec, s)
    }

    /// The output layer again over the rows of the last forward in `s` (their final states are
    /// kept there), with another spec (its taps are ignored; the tapped states stay): a batch
    /// whose rows need different outputs (argmaxes for some, full logits for others) runs the
    /// layers once. Each row's results are those the forward would have given it.
    pub fn output_again<'s>(&self, spec: &OutputSpec, s: &'s mut Scratch) -> Result<&'s Output> {
        let n = s.positions.len();
        if n == 0 {
            return Err(Error::BadRequest("no forward to take outputs from".into()));
        }
        self.validate_spec(
            n,
            &OutputSpec {
                taps: vec![],
                ..spec.clone()
            },
        )?;
        self.output_layer(n, spec, s);
        Ok(&s.out)
    }

    /// The exact logit of `t` at output row `i` of the last output layer run on `s` (a
    /// forward's or [`Model::output_again`]'s): what the re-scoring of the ids near a row's
    /// top computes, soft-capped as the rows handed out are.
    pub fn rescore(&self, s: &Scratch, i: usize, t: TokenId) -> f32 {
        let h = self.config.hidden_size;
        let x = &s.rows_x[i * h..(i + 1) * h];
        let l = ROW.with_borrow_mut(|(tmp, _)| {
            tmp.resize(h, 0.0);
            self.output_head().row_dot(t.idx(), x, tmp)
        });
        self.config
            .extras
            .final_softcap
            .map_or(l, |c| ops::softcap(l, c))
    }

    /// Below the best score a row's exact argmax may lie when the row came back as `logits`
    /// (int8 activations: [`REFINE`]; the 4-bit screen: [`SCREEN_MARGIN`]; exact: 0).
    pub fn rescore_margin(&self, logits: Logits) -> f32 {
        match logits {
            _ if self.exact => 0.0,
            Logits::Screened if self.screen.is_some() => SCREEN_MARGIN,
            _ => REFINE,
        }
    }

    fn forward_seqs<'s>(
        &self,
        seqs: &mut [(&mut KvCache, Batch)],
        spec: &OutputSpec,
        s: &'s mut Scratch,
    ) -> Result<&'s Output> {
        let c = &self.config;
        let n: usize = seqs.iter().map(|(_, b)| b.tokens.len()).sum();
        let h = c.hidden_size;
        let x = sized(&mut s.l.x, n * h);
        let mut t = 0;
        for (_, b) in seqs.iter() {
            for tok in b.tokens {
                let row = &mut x[t * h..(t + 1) * h];
                self.embed.row_into(tok.idx(), row);
                if let Some(k) = c.extras.embed_scale {
                    row.iter_mut().for_each(|v| *v *= k);
                }
                t += 1;
            }
        }
        s.positions.clear();
        s.l.rope.clear();
        for (kv, b) in seqs.iter() {
            s.positions.extend_from_slice(b.positions);
            // LongRoPE: a context larger than the original length takes the long factors, for
            // every token in it (llama.cpp's rule), so a cache's keys never mix the two.
            let f = match &self.inv_freq_long {
                Some((orig, long)) if kv.capacity() > *orig => long,
                _ => &self.inv_freq,
            };
            rope_rows(f, b.positions, self.rope_scale, &mut s.l.rope);
        }
        if let Some(f) = &self.inv_freq_local {
            rope_table(f, &s.positions, &mut s.l.rope_local);
        }
        let mut att = Vec::with_capacity(seqs.len());
        for (kv, b) in seqs.iter_mut() {
            let (prefix, n_new) = (kv.len(), b.tokens.len());
            let slot0 = kv.reserve(n_new)?;
            att.push(SeqAttn {
                kv,
                slot0,
                shape: AttnShape {
                    n_heads: c.n_heads,
                    n_kv_heads: c.n_kv_heads,
                    head_dim: c.head_dim,
                    prefix,
                    n_new,
                },
                vis: match b.mask {
                    Some(m) => Visibility::Mask(m.bits()),
                    None => Visibility::Causal,
                },
                positions: b.positions,
            });
        }
        let n_taps = spec.taps.len();
        s.out.hidden.clear();
        s.out.hidden.resize(n * n_taps * h, 0.0);
        for (li, l) in self.layers.iter().enumerate() {
            l.forward(c, li, &mut att, &mut s.l, self.exact);
            for (ti, _) in spec.taps.iter().enumerate().filter(|(_, &t)| t == li) {
                for t in 0..n {
                    let dst = (t * n_taps + ti) * h;
                    s.out.hidden[dst..dst + h].copy_from_slice(&s.l.x[t * h..(t + 1) * h]);
                }
            }
        }
        self.output_layer(n, spec, s);
        Ok(&s.out)
    }

    fn output_layer(&self, n: usize, spec: &OutputSpec, s: &mut Scratch) {
        let c = &self.config;
        let (h, vocab) = (c.hidden_size, c.vocab_size);
        let out = &mut s.out;
        out.vocab = vocab;
        out.rows.clear();
        if !spec.logits.full_rows() {
            out.logits.clear();
        }
        out.argmax.clear();
        out.top.clear();
        if spec.logits == Logits::None {
            return;
        }
        match &spec.rows {
            Rows::All => out.rows.extend(0..n),
            Rows::Last => out.rows.push(n - 1),
            Rows::Some(r) => out.rows.extend_from_slice(r),
        }
        let m = out.rows.len();
        let xs = sized(&mut s.rows_x, m * h);
        for (i, &r) in out.rows.iter().enumerate() {
            ops::rms_norm(
                &s.l.x[r * h..(r + 1) * h],
                &self.output_norm,
                c.rms_eps,
                &mut xs[i * h..(i + 1) * h],
            );
        }
        let head = self.output_head();
        // Argmax and top-k screen the vocabulary with the 4-bit copy; the ids near the top are
        // then re-scored exactly with the stored weights.
        let screen = match spec.logits {
            Logits::Argmax | Logits::ArgmaxTop(_) | Logits::TopK(_) | Logits::Screened
                if !self.exact =>
            {
                self.screen.as_ref()
            }
            _ => None,
        };
        let fast = screen.unwrap_or(head);
        let margin = if screen.is_some() {
            SCREEN_MARGIN
        } else {
            REFINE
        };
        let logits = if spec.logits.full_rows() {
            // Kept between calls: every element is overwritten below (no memset of a
            // rows × vocabulary buffer per forward).
            out.logits.resize(m * vocab, 0.0);
            &mut out.logits[..]
        } else {
            sized(&mut s.logits, m * vocab)
        };
        prep(&mut s.l.qa, &[fast], xs, self.exact);
        fast.matmul(xs, &s.l.qa, logits);
        let keep = match spec.logits {
            Logits::TopK(k) => k.max(1),
            _ => 1,
        };
        let (xs, approx) = (&*xs, s.l.qa.n > 0);
        let softcap = c.extras.final_softcap;
        match spec.logits {
            Logits::Argmax => out.argmax.resize(m, TokenId(0)),
            Logits::TopK(_) => out.top.resize(m, Vec::new()),
            Logits::ArgmaxTop(_) => {
                out.argmax.resize(m, TokenId(0));
                out.top.resize(m, Vec::new());
            }
            _ => {}
        }
        let (lp, ap, tp) = (
            SendPtr(logits.as_mut_ptr()),
            SendPtr(out.argmax.as_mut_ptr()),
            SendPtr(out.top.as_mut_ptr()),
        );
        pool::run(m, |i| {
            // SAFETY: task i alone touches row i of the logits and entry i of the results.
            let row = unsafe { std::slice::from_raw_parts_mut(lp.get().add(i * vocab), vocab) };
            let x = &xs[i * h..(i + 1) * h];
            // Screened rows are re-scored by their reader, where its choice needs it.
            if approx && spec.logits != Logits::Screened {
                ROW.with_borrow_mut(|(tmp, cand)| {
                    tmp.resize(h, 0.0);
                    refine_top(row, keep, margin, |id, t| head.row_dot(id, x, t), tmp, cand);
                });
            }
            // A soft-cap is monotonic: ids are chosen on the raw scores and only the values
            // handed out are capped (every logit of a full row, the k of a top-k).
            let cap = |x: f32| softcap.map_or(x, |c| ops::softcap(x, c));
            let top = |row: &[f32], k: usize| {
                let mut t = ops::top_k(row, k);
                t.iter_mut().for_each(|e| e.1 = cap(e.1));
                t
            };
            match spec.logits {
                Logits::Argmax => unsafe { *ap.get().add(i) = ops::argmax(row) },
                Logits::TopK(k) => unsafe { *tp.get().add(i) = top(row, k) },
                // The argmax as `Argmax` finds it (refined with keep = 1), then the row's top
                // k as it stands.
                Logits::ArgmaxTop(k) => unsafe {
                    *ap.get().add(i) = ops::argmax(row);
                    *tp.get().add(i) = top(row, k.max(1));
                },
                Logits::Full | Logits::Screened if softcap.is_some() => {
                    row.iter_mut().for_each(|x| *x = cap(*x))
                }
                Logits::Full | Logits::Screened | Logits::None => {}
            }
        });
    }
}

thread_local! {
    /// Per-thread buffers of the exact re-scoring: a dequantised row, candidate ids.
    static ROW: RefCell<(Vec<f32>, Vec<u32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Re-scores with f32 activations the ids whose fast score (int8 activations, or the 4-bit
/// screen) lies within `margin` of the `keep`-th largest (at most [`REFINE_CAP`] of them, the
/// largest first), so greedy and top-k choices are those of exact arithmetic. The row's result depends on the row alone,
/// never on the batch it came in.
fn refine_top(
    row: &mut [f32],
    keep: usize,
    margin: f32,
    exact: impl Fn(usize, &mut [f32]) -> f32,
    tmp: &mut [f32],
    cand: &mut Vec<u32>,
) {
    let kth = if keep == 1 {
        ops::max_value(row)
    } else {
        ops::top_k(row, keep)
            .last()
            .map_or(f32::NEG_INFINITY, |e| e.1)
    };
    let cut = kth - margin;
    cand.clear();
    ops::indices_at_least(row, cut, cand);
    if cand.len() > REFINE_CAP.max(keep) {
        let cap = REFINE_CAP.max(keep);
        cand.select_nth_unstable_by(cap - 1, |&a, &b| {
            row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b))
        });
        cand.truncate(cap);
    }
    for &id in cand.iter() {
        row[id as usize] = exact(id as usize, tmp);
    }
}

/// Most ids re-scored per row (a flat distribution can put thousands within the margin).
const REFINE_CAP: usize = 64;

/// Margin within which int8-activation logits are re-scored exactly. The int8 error of
/// SmolLM2's logits is about 0.2 on average and well under 1 at worst.
const REFINE: f32 = 2.0;

/// Margin within which the 4-bit screen's scores are re-scored exactly (at most
/// [`REFINE_CAP`] ids, the best-screened first). Measured on SmolLM2 over 596 greedy steps of
/// four prompts (story, math, code, list; the `screen_margin_on_smollm2` test): the exact
/// argmax was never more than 1.27 below the screen's top score and never ranked below 7th by
/// the screen, while single screen scores err by up to 5.1 (ids within the margin: median 3,
/// 90th percentile 21).
const SCREEN_MARGIN: f32 = 4.0;

/// The 4-bit screen of an output layer stored in Q8_0 or f32 (for a 4-bit layer there is
/// nothing to save).
fn screen_of(head: &Matrix) -> Option<Matrix> {
    let screen_bytes = head.rows * GgmlType::Q4_1.row_bytes(head.cols);
    if !head.cols.is_multiple_of(crate::runtime::quant::QK) || head.nbytes() <= screen_bytes {
        return None;
    }
    // Rows in parallel on the pool: on one thread this took half of loading SmolLM2-135M
    // (2-vCPU Zen 5, `perf`: ~0.2 s of its Q8_0 embedding's 49,152 rows).
    let rb = GgmlType::Q4_1.row_bytes(head.cols);
    let mut bytes = vec![0u8; screen_bytes];
    let out = SendPtr(bytes.as_mut_ptr());
    crate::runtime::pool::par_ranges(head.rows, |r0, r1| {
        let mut w = vec![0f32; head.cols];
        for r in r0..r1 {
            head.row_into(r, &mut w);
            // SAFETY: each task writes only its own rows' bytes, `rb` per row, within `bytes`.
            let q = unsafe { std::slice::from_raw_parts_mut(out.get().add(r * rb), rb) };
            quantize_q4_1_into(&w, q);
        }
    });
    Some(Matrix::from_bytes(
        GgmlType::Q4_1,
        head.rows,
        head.cols,
        &bytes,
    ))
}

/// The types llama-quantize's mix for `ty` gives the value, attention-output and (dense) down
/// projections of layer `i` of `n` (`gqa`: query heads per KV head); the other matrices take
/// `ty`. `Q4_K_M` / `Q5_K_M`: value and down Q6_K in the first and last eighth of the layers and
/// every third layer between. `Q3_K_M`: value Q5_K in the first two layers and Q4_K after, the
/// attention output Q4_K, down Q5_K in the first sixteenth and Q4_K after. `Q2_K`: value Q3_K
/// (Q4_K with four or more query heads per KV head), attention output and down Q3_K. `IQ4_NL`
/// and `IQ4_XS` (no importance matrix): value Q5_K with four or more query heads per KV head,
/// down Q5_K in the first eighth.
fn k_mix(
    ty: crate::runtime::quant::GgmlType,
    i: usize,
    n: usize,
    gqa: usize,
) -> [crate::runtime::quant::GgmlType; 3] {
    use crate::runtime::quant::GgmlType::{IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K};
    let more_bits = i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
    match ty {
        Q4_K | Q5_K if more_bits => [Q6_K, ty, Q6_K],
        Q3_K => [
            if i < 2 { Q5_K } else { Q4_K },
            Q4_K,
            if i < n / 16 { Q5_K } else { Q4_K },
        ],
        Q2_K => [if gqa >= 4 { Q4_K } else { Q3_K }, Q3_K, Q3_K],
        IQ4_NL | IQ4_XS => [
            if gqa >= 4 { Q5_K } else { ty },
            ty,
            if i < n / 8 { Q5_K } else { ty },
        ],
        _ => [ty; 3],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{generate, GenerateParams};
    use crate::model::Message;
    use crate::runtime::qmatmul::QActs;
    use crate::types::Pos;

    /// `q4_k` and `q5_k` are the `Q4_K_M` and `Q5_K_M` mixes: on the tiny Llama (3 layers, 64
    /// and 128 wide, so every K-quant falls back) layers 0 and 1 are Q5_0 (Q5_1) throughout,
    /// layer 2 (the last eighth) keeps
    /// its value and down projections in Q6_K's fallback Q8_0, the embedding too.
    #[test]
    fn q4_k_and_q5_k_are_the_k_m_mixes() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/llama");
        // Rows of 64 and 128 are not whole 256-blocks: the fallbacks llama-quantize takes.
        for (ty, base) in [
            (GgmlType::Q4_K, GgmlType::Q5_0),
            (GgmlType::Q5_K, GgmlType::Q5_1),
        ] {
            let mut lm = crate::model::load(&path).unwrap();
            lm.model.quantize_dense(ty);
            let m = &mut lm.model;
            let types = |l: &mut crate::model::layer::Layer| {
                let wide: Vec<GgmlType> = l.v_and_down_mut().iter().map(|w| w.ty()).collect();
                let all: Vec<GgmlType> = l.matrices_mut().iter().map(|w| w.ty()).collect();
                (wide, all)
            };
            for i in 0..2 {
                let (wide, all) = types(&mut m.layers[i]);
                assert_eq!(wide, [base; 2], "{ty:?} layer {i}");
                assert!(all.iter().all(|&t| t == base), "layer {i}: {all:?}");
            }
            let (wide, all) = types(&mut m.layers[2]);
            assert_eq!(wide, [GgmlType::Q8_0; 2], "{ty:?}");
            assert_eq!(all.iter().filter(|&&t| t == base).count(), all.len() - 2);
            assert_eq!(m.embed.ty(), GgmlType::Q8_0, "{ty:?}");
        }
    }

    /// `q3_k` and `q2_k` are the `Q3_K_M` and `Q2_K` mixes, on the tiny Llama (3 layers, 4 query
    /// heads over 2 KV heads; rows of 64 and 128, so every K-quant falls back as llama-quantize's
    /// does: Q2_K / Q3_K to Q4_0, Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0), and a layer of
    /// `n` gets the types the mix gives it.
    #[test]
    fn q3_k_and_q2_k_are_llama_quantize_mixes() {
        use GgmlType::{Q2_K, Q3_K, Q4_0, Q4_K, Q5_0, Q5_1, Q5_K, Q8_0};
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/llama");
        // (value, attention output, down) per layer, then the rest.
        for (ty, want) in [
            (
                Q3_K,
                [[Q5_1, Q5_0, Q5_0], [Q5_1, Q5_0, Q5_0], [Q5_0, Q5_0, Q5_0]],
            ),
            (Q2_K, [[Q4_0; 3]; 3]),
        ] {
            let mut lm = crate::model::load(&path).unwrap();
            lm.model.quantize_dense(ty);
            for (i, l) in lm.model.layers.iter_mut().enumerate() {
                let vd: Vec<GgmlType> = l.v_and_down_mut().iter().map(|w| w.ty()).collect();
                assert_eq!(
                    [vd[0], l.out_proj_mut().ty(), vd[1]],
                    want[i],
                    "{ty:?} layer {i}"
                );
                let all: Vec<GgmlType> = l.matrices_mut().iter().map(|w| w.ty()).collect();
                // wq, wk, gate, up: the base type's fallback.
                for k in [0, 1, 4, 5] {
                    assert_eq!(all[k], Q4_0, "{ty:?} layer {i} matrix {k}");
                }
            }
            assert_eq!(lm.model.embed.ty(), Q8_0, "{ty:?}");
        }
        // At 32 layers (whole 256-blocks): Q3_K_M's value Q5_K in layers 0-1, down Q5_K in 0-1;
        // Q2_K's value Q4_K at 4 query heads a KV head.
        assert_eq!(k_mix(Q3_K, 1, 32, 1), [Q5_K, Q4_K, Q5_K]);
        assert_eq!(k_mix(Q3_K, 2, 32, 1), [Q4_K, Q4_K, Q4_K]);
        assert_eq!(k_mix(Q2_K, 5, 32, 4), [Q4_K, Q3_K, Q3_K]);
        assert_eq!(k_mix(Q2_K, 5, 32, 1), [Q3_K, Q3_K, Q3_K]);
        use GgmlType::IQ4_XS;
        assert_eq!(k_mix(IQ4_XS, 3, 32, 4), [Q5_K, IQ4_XS, Q5_K]);
        assert_eq!(k_mix(IQ4_XS, 4, 32, 1), [IQ4_XS; 3]);
    }

    /// Measures the 4-bit screen against exact logits on SmolLM2 at every greedy decode step of
    /// four prompts (the numbers behind [`SCREEN_MARGIN`]), and checks that the exact argmax
    /// stays well inside the margin. Slow (every step scores the whole vocabulary exactly):
    /// `cargo test --release -p paradraft --lib screen_margin -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn screen_margin_on_smollm2() {
        let path = crate::fetch::ensure_default_model().expect("default model");
        let lm = crate::model::load(&path).unwrap();
        let (m, tok) = (&lm.model, &lm.tokenizer);
        let (screen, head) = (m.screen.as_ref().expect("a Q8_0 head"), m.output_head());
        let (h, vocab, last) = (
            m.config.hidden_size,
            m.config.vocab_size,
            m.config.n_layers - 1,
        );
        let prompts = [
            (
                "Write a short story about a robot learning to paint, with vivid details.",
                true,
                200,
            ),
            (
                "Solve: if 3x + 7 = 22, what is x? Explain step by step.",
                true,
                150,
            ),
            ("def fibonacci(n):", false, 150),
            ("List ten countries and their capitals.", true, 150),
        ];
        let (mut worst, mut gaps, mut ranks, mut within) = (0f32, vec![], vec![], vec![]);
        for (text, chat, n) in prompts {
            let text = if chat {
                tok.apply_chat_template(&[Message::new("user", text)], true)
                    .unwrap()
            } else {
                text.to_string()
            };
            let prompt = tok.encode(&text).unwrap();
            let params = GenerateParams {
                max_new_tokens: n,
                sampling: Default::default(),
                stop_strings: vec![],
                ..Default::default()
            };
            let mut kv = m.new_kv(prompt.len() + n + 1);
            let gen = generate(m, tok, &mut kv, &prompt, &params, |_| {}).unwrap();
            // The greedy steps ran the generated tokens but the last; teacher-force them to get
            // the same final hidden states (batched forwards reproduce decoding bit for bit).
            let seq: Vec<TokenId> = prompt.iter().chain(&gen.token_ids).copied().collect();
            let steps = prompt.len()..seq.len() - 1;
            let pos: Vec<Pos> = (0..seq.len() as u32).map(Pos).collect();
            let (mut kv, mut s) = (m.new_kv(seq.len()), Scratch::default());
            let spec = OutputSpec {
                rows: Rows::Last,
                logits: Logits::None,
                taps: vec![last],
            };
            let b = Batch {
                tokens: &seq,
                positions: &pos,
                mask: None,
            };
            let out = m.forward(&mut kv, &b, &spec, &mut s).unwrap();
            let (mut x, mut tmp, mut qa) = (vec![0f32; h], vec![0f32; h], QActs::default());
            let mut row = vec![0f32; vocab];
            for t in steps {
                ops::rms_norm(
                    &out.hidden[t * h..(t + 1) * h],
                    &m.output_norm,
                    m.config.rms_eps,
                    &mut x,
                );
                qa.quantize(&x, h);
                screen.matmul(&x, &qa, &mut row);
                let exact: Vec<f32> = (0..vocab)
                    .map(|id| head.row_dot(id, &x, &mut tmp))
                    .collect();
                for (a, b) in row.iter().zip(&exact) {
                    worst = worst.max((a - b).abs());
                }
                let best = ops::argmax(&exact).idx();
                let top = ops::max_value(&row);
                gaps.push(top - row[best]);
                ranks.push(row.iter().filter(|&&v| v > row[best]).count());
                within.push(row.iter().filter(|&&v| v >= top - SCREEN_MARGIN).count());
            }
        }
        gaps.sort_by(f32::total_cmp);
        ranks.sort();
        within.sort();
        let q = |v: usize, p: f64| ((v - 1) as f64 * p) as usize;
        let n = gaps.len();
        eprintln!(
            "{n} greedy steps: worst |screen − exact| {worst:.2}; exact argmax below the screen's \
             top by at most {:.2} (p99 {:.2}), ranked at worst {} (p99 {}) by the screen; ids \
             within the margin: median {}, p90 {}, max {}",
            gaps[n - 1],
            gaps[q(n, 0.99)],
            ranks[n - 1],
            ranks[q(n, 0.99)],
            within[n / 2],
            within[q(n, 0.9)],
            within[n - 1]
        );
        assert!(n > 400);
        assert!(
            gaps[n - 1] < SCREEN_MARGIN / 2.0,
            "exact argmax too close to the margin"
        );
        assert!(ranks[n - 1] < REFINE_CAP / 4);
    }
}
