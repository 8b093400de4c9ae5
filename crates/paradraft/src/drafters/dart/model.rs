//! The DART draft network at inference (DART §3.1, docs/dart.md): one LLaMA-style layer over
//! `[input_norm(embedding of the next token) ; hidden_norm(fc(taps))]` (width 2H) for real
//! slots and the learned `mask_rep` (bypassing both norms) for the mask slots, causal over
//! [cached real slots, new real slots, masks]; its own KV cache keeps only real slots. Deeper
//! drafters (`num_hidden_layers` > 1, ours) run plain LLaMA layers over the first one's output.

use super::config::DartConfig;
use crate::drafters::parts::{DraftHead, TapFusion};
use crate::drafters::vocab::DraftVocab;
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::layer::{rope_table, Layer, LayerScratch, SeqAttn};
use crate::model::source::{SafetensorsSource, TensorSource};
use crate::model::Model;
use crate::runtime::attention::{AttnShape, Visibility};
use crate::runtime::ops;
use crate::types::{Pos, TokenId};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::thread::JoinHandle;

/// Loads started by [`prefetch`], by directory, for [`load_prefetched`] to take up.
type Ahead = (PathBuf, JoinHandle<Result<(DartModel, DraftHead)>>);
static AHEAD: Mutex<Vec<Ahead>> = Mutex::new(Vec::new());

/// Starts [`DartModel::load`] of `dir` (quantized) on a thread of its own (nothing when the
/// thread cannot be made: the load then happens when asked).
pub fn prefetch(dir: &Path) {
    let d = dir.to_path_buf();
    let started = std::thread::Builder::new()
        .name("paradraft-prefetch".into())
        .spawn(move || DartModel::load(&d, true));
    if let Ok(h) = started {
        AHEAD
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((dir.to_path_buf(), h));
    }
}

/// [`DartModel::load`] of `dir`, quantized: what a [`prefetch`] of the same directory loaded
/// (its error as much as its weights), else loaded now.
pub fn load_prefetched(dir: &Path) -> Result<(DartModel, DraftHead)> {
    let ahead = {
        let mut a = AHEAD.lock().unwrap_or_else(|e| e.into_inner());
        a.iter()
            .position(|(d, _)| d == dir)
            .map(|i| a.swap_remove(i).1)
    };
    match ahead.map(JoinHandle::join) {
        Some(Ok(loaded)) => loaded,
        // Not prefetched, or its thread panicked: load here.
        _ => DartModel::load(dir, true),
    }
}

pub struct DartModel {
    pub config: DartConfig,
    /// `g = fc(taps)` (the real slots' residual) and `hidden_norm(g)` (their attention input).
    fusion: TapFusion,
    layer: Layer,
    /// Layers 1.. (plain, over the hidden width), when the drafter has more than one.
    deeper: Vec<Layer>,
    /// The mask slots' attention input (2H); its first half is their residual.
    mask_rep: Vec<f32>,
    norm: Vec<f32>,
    inv_freq: Vec<f32>,
}

/// Reusable buffers.
#[derive(Default)]
pub struct Scratch {
    /// The calls' features, concatenated.
    f: Vec<f32>,
    g: Vec<f32>,
    /// Attention inputs, `rows × 2H`.
    u: Vec<f32>,
    e: Vec<f32>,
    once: Vec<f32>,
    l: LayerScratch,
    positions: Vec<Pos>,
}

impl DartModel {
    /// Loads `config.json` + `model.safetensors` (weights Q8_0 when `quantize`) and the head
    /// with its draft vocabulary.
    pub fn load(dir: &Path, quantize: bool) -> Result<(Self, DraftHead)> {
        if !dir.is_dir() {
            return Err(Error::io(
                dir,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "not a DART drafter directory (config.json + model.safetensors)",
                ),
            ));
        }
        let config = DartConfig::load(dir)?;
        let src = SafetensorsSource::open(dir)?;
        let (mut m, mut head) = Self::from_source(config, &src)?;
        if quantize {
            m.fusion.quantize();
            std::iter::once(&mut m.layer)
                .chain(&mut m.deeper)
                .flat_map(|l| l.matrices_mut())
                .for_each(|w| w.quantize_q8_0());
            head.quantize();
        }
        Ok((m, head))
    }

    pub fn from_source(config: DartConfig, src: &SafetensorsSource) -> Result<(Self, DraftHead)> {
        config.layer.validate()?;
        let c = &config.layer;
        let h = c.hidden_size;
        let fusion = TapFusion::load(
            src,
            "fc.weight",
            "midlayer.hidden_norm.weight",
            h,
            3 * config.target_hidden_size,
            c.rms_eps,
        )?;
        let layer = Layer::load_wide(src, c, false, 2 * h, |s| {
            let hf = SafetensorsSource::hf_name(&format!("blk.0.{s}"));
            hf.replacen("model.layers.0.", "midlayer.", 1)
        })?;
        let deeper = (1..c.n_layers)
            .map(|i| {
                Layer::load(src, c, false, |s| {
                    let hf = SafetensorsSource::hf_name(&format!("blk.{i}.{s}"));
                    hf.replacen("model.layers.", "layers.", 1)
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let vocab = DraftVocab::load(
            src,
            Some(config.draft_vocab_size),
            c.vocab_size,
            "DART drafter",
        )?;
        if let Some(t2d) = src.int_tensor("t2d") {
            // The published boolean mask must agree with d2t (we only need d2t).
            let ok = t2d.len() == c.vocab_size
                && t2d
                    .iter()
                    .enumerate()
                    .all(|(t, &b)| (b != 0) == vocab.draft_id(TokenId(t as u32)).is_some());
            if !ok {
                return Err(Error::BadModelFile {
                    path: src.describe().into(),
                    format: "DART drafter",
                    reason: "t2d disagrees with d2t".into(),
                });
            }
        }
        let head = DraftHead::own(
            src.matrix("lm_head.weight", config.draft_vocab_size, h)?,
            vocab,
        );
        let inv_freq = c.inv_freqs();
        Ok((
            DartModel {
                fusion,
                layer,
                deeper,
                mask_rep: src.vector("midlayer.mask_rep", 2 * h)?,
                norm: src.vector("norm.weight", h)?,
                inv_freq,
                config,
            },
            head,
        ))
    }

    /// Floats of tapped features per position.
    pub fn feature_width(&self) -> usize {
        self.fusion.width()
    }

    pub fn new_kv(&self, capacity: usize) -> KvCache {
        let c = &self.config.layer;
        KvCache::new(c.n_layers, c.n_kv_heads, c.head_dim, capacity)
    }

    /// One drafting call (docs/dart.md steps 1–7). Real slots: `features` (`m × width`) of the
    /// positions `kv.len()..` with `next[i]`, the token one to the right of slot i; then
    /// `masks` mask slots. Leaves in `out` the final hidden rows of the last `masks + 1` slots
    /// (depths 1..=masks + 1), normed twice as the reference code does before its LM head.
    /// The cache keeps the real slots only.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        target: &Model,
        kv: &mut KvCache,
        features: &[f32],
        next: &[TokenId],
        masks: usize,
        s: &mut Scratch,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let mut one = [Call {
            kv,
            features,
            next,
            masks,
        }];
        self.forward_many(target, &mut one, s, out)
    }

    /// Several requests' drafting calls in one pass (batched drafting): each call's rows over
    /// its own cache, every matrix read once for all of them. `out` holds each call's
    /// `masks + 1` depth rows, in call order. A call's rows are those it gets alone (the
    /// forward is batch-invariant). On an error no cache has changed.
    pub fn forward_many(
        &self,
        target: &Model,
        calls: &mut [Call],
        s: &mut Scratch,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let c = &self.config.layer;
        let (h, w) = (c.hidden_size, self.feature_width());
        for call in calls.iter() {
            let m = call.next.len();
            if m == 0 || call.features.len() != m * w {
                return Err(Error::BadRequest(format!(
                    "DART call: {} feature floats for {m} real slots of width {w}",
                    call.features.len(),
                )));
            }
        }
        // (first cached position, first slot) per call; a call that does not fit gives the
        // slots already reserved back.
        let mut at = Vec::with_capacity(calls.len());
        for i in 0..calls.len() {
            let n = calls[i].next.len() + calls[i].masks;
            let p0 = calls[i].kv.len();
            match calls[i].kv.reserve(n) {
                Ok(slot0) => at.push((p0, slot0)),
                Err(e) => {
                    for (call, &(p0, _)) in calls.iter_mut().zip(&at) {
                        call.kv.truncate(p0);
                    }
                    return Err(e);
                }
            }
        }
        // Residuals: g for real slots, mask_rep[..H] for masks. Inputs: [norm(e) ; norm(g)].
        s.f.clear();
        for call in calls.iter() {
            s.f.extend_from_slice(call.features);
        }
        self.fusion.project(&s.f, &mut s.l.qa, &mut s.g);
        let rows: usize = calls.iter().map(|c| c.next.len() + c.masks).sum();
        s.l.x.clear();
        s.u.resize(rows * 2 * h, 0.0);
        s.e.resize(h, 0.0);
        s.positions.clear();
        let (mut row, mut real) = (0, 0);
        for (call, &(p0, _)) in calls.iter().zip(&at) {
            let m = call.next.len();
            for (i, t) in call.next.iter().enumerate() {
                let g = &s.g[(real + i) * h..(real + i + 1) * h];
                s.l.x.extend_from_slice(g);
                target.embed_row(t.idx(), &mut s.e);
                let (ue, ug) = s.u[(row + i) * 2 * h..(row + i + 1) * 2 * h].split_at_mut(h);
                ops::rms_norm(&s.e, self.layer.attn_norm(), c.rms_eps, ue);
                self.fusion.norm(g, ug);
            }
            for i in row + m..row + m + call.masks {
                s.u[i * 2 * h..(i + 1) * 2 * h].copy_from_slice(&self.mask_rep);
                s.l.x.extend_from_slice(&self.mask_rep[..h]);
            }
            s.positions
                .extend((p0..p0 + m + call.masks).map(|p| Pos(p as u32)));
            (row, real) = (row + m + call.masks, real + m);
        }
        rope_table(&self.inv_freq, &s.positions, &mut s.l.rope);
        // Only each call's last real slot and its masks leave the last layer (their outputs
        // are the depths); every slot goes through the layers before it (the next one's K/V).
        let mut keep = Vec::with_capacity(calls.len());
        let mut seqs = Vec::with_capacity(calls.len());
        let mut row = 0;
        for (call, &(p0, slot0)) in calls.iter_mut().zip(&at) {
            let n = call.next.len() + call.masks;
            keep.push(row + n - (call.masks + 1)..row + n);
            seqs.push(SeqAttn {
                kv: &mut *call.kv,
                slot0,
                shape: AttnShape {
                    n_heads: c.n_heads,
                    n_kv_heads: c.n_kv_heads,
                    head_dim: c.head_dim,
                    prefix: p0,
                    n_new: n,
                },
                vis: Visibility::Causal,
                positions: &s.positions[row..row + n],
            });
            row += n;
        }
        for (li, layer) in std::iter::once(&self.layer).chain(&self.deeper).enumerate() {
            // The first layer attends over [norm(e) ; norm(g)] / mask_rep, the others over
            // the input norm of the residual stream.
            let input = (li == 0).then_some(&s.u[..]);
            layer.attend(c, li, &mut seqs, &mut s.l, false, input);
            if li + 1 == c.n_layers {
                s.l.keep_rows(&keep, h);
            }
            layer.mlp(c, &mut s.l, false);
        }
        drop(seqs);
        for (call, &(p0, _)) in calls.iter_mut().zip(&at) {
            call.kv.truncate(p0 + call.next.len()); // the masks' K/V are dropped
        }
        let rows: usize = keep.iter().map(|r| r.len()).sum();
        s.once.resize(rows * h, 0.0);
        out.resize(rows * h, 0.0);
        for r in 0..rows {
            let span = r * h..(r + 1) * h;
            ops::rms_norm(
                &s.l.x[span.clone()],
                &self.norm,
                c.rms_eps,
                &mut s.once[span.clone()],
            );
            // The reference applies `norm` inside the forward and again before `lm_head`
            // (RMSNorm is not idempotent when its weight ≠ 1); we reproduce it.
            ops::rms_norm(&s.once[span.clone()], &self.norm, c.rms_eps, &mut out[span]);
        }
        Ok(())
    }
}

/// One request's drafting call in [`DartModel::forward_many`]: its cache, the target states
/// of its new real slots (`next.len() × width`), the tokens to their right and its mask slots.
pub struct Call<'a> {
    pub kv: &'a mut KvCache,
    pub features: &'a [f32],
    pub next: &'a [TokenId],
    pub masks: usize,
}
