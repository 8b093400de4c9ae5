//! DiffuSpec's draft selection (DiffuSpec §3.2–3.3, docs/diffuspec.md), for any drafter that
//! scores a block of slots in one pass (a diffusion LM, DFlash, PARD):
//!
//! - [`Lattice`] (§4.2): per slot the full-vocabulary log-softmax, the top `M_max` tokens,
//!   mass-adaptive pruning (the fewest whose probability reaches `τ_mass`), and EOS retention
//!   — the reading implemented: when a stop token is not among a slot's kept tokens it is added
//!   with its own log-probability (the spec's recommended reading; the alternative keeps it only
//!   when it is in the top `M_max`). The raw per-slot argmax draft is kept for ADL.
//! - [`Cps`] (§4.3): causal-consistency path search — a left-to-right beam search (width `B`)
//!   scoring each token λ·ℓ_dlm + (1 − λ)·ℓ_ng, natural logs, ℓ_ng the n-gram proxy's
//!   per-token conditional given the two tokens before it; a beam that places a stop token is
//!   finished and keeps its frozen score (raw-sum comparison with longer beams); the best beam
//!   of the last step is the draft.
//! - [`Adl`] (§4.5): adaptive draft length from EMAs of the draft's length before its first
//!   EOS and of the accepted length. As a sizing policy any drafter can use, it reads the draft
//!   that was verified (for CPS, the chosen path; the paper reads the raw argmax draft, which
//!   only block drafters have: [`Lattice::raw`]).

use crate::ngram::arpa::ArpaLm;
use crate::types::TokenId;

/// Lattice settings (paper: `M_max` 15, `τ_mass` 0.8).
#[derive(Clone, Copy, Debug)]
pub struct LatticeParams {
    pub m_max: usize,
    pub tau_mass: f32,
}

impl Default for LatticeParams {
    fn default() -> Self {
        LatticeParams {
            m_max: 15,
            tau_mass: 0.8,
        }
    }
}

/// The pruned candidates of every slot: (target token, natural-log probability), best first.
#[derive(Clone, Debug, Default)]
pub struct Lattice {
    pub slots: Vec<Vec<(TokenId, f32)>>,
    /// The per-slot argmax (the raw draft).
    pub raw: Vec<TokenId>,
}

impl Lattice {
    /// From `rows × v` logits (slot i predicting the i-th token of the block) over a
    /// vocabulary that `to_target` maps to target ids (`from_target` back, None outside it);
    /// `stop` are the EOS tokens.
    pub fn from_logits(
        logits: &[f32],
        v: usize,
        to_target: impl Fn(usize) -> TokenId,
        from_target: impl Fn(TokenId) -> Option<usize>,
        stop: &[TokenId],
        p: &LatticeParams,
    ) -> Lattice {
        let mut out = Lattice::default();
        for row in logits.chunks_exact(v.max(1)) {
            let lse = crate::runtime::ops::log_sum_exp(row);
            let top = crate::runtime::ops::top_k(row, p.m_max.max(1).min(v));
            let mut kept = vec![];
            let mut mass = 0f32;
            for &(id, l) in &top {
                let lp = l - lse;
                kept.push((to_target(id.idx()), lp));
                mass += lp.exp();
                if mass >= p.tau_mass {
                    break;
                }
            }
            out.raw.push(kept[0].0);
            for &s in stop {
                if kept.iter().all(|k| k.0 != s) {
                    if let Some(i) = from_target(s).filter(|&i| i < v) {
                        kept.push((s, row[i] - lse));
                    }
                }
            }
            out.slots.push(kept);
        }
        out
    }
}

/// CPS settings (paper: B 3, λ 0.5).
#[derive(Clone, Copy, Debug)]
pub struct CpsParams {
    pub beam: usize,
    pub lambda: f32,
}

impl Default for CpsParams {
    fn default() -> Self {
        CpsParams {
            beam: 3,
            lambda: 0.5,
        }
    }
}

#[derive(Clone, Debug)]
struct Beam {
    path: Vec<TokenId>,
    score: f32,
    done: bool,
}

/// Causal-consistency path search over a [`Lattice`].
#[derive(Clone, Debug, Default)]
pub struct Cps {
    pub params: CpsParams,
}

impl Cps {
    /// The best path through `lat` after `committed` (its last two tokens are the n-gram
    /// context of the first slot); without an n-gram model the score is the drafter's alone.
    pub fn search(
        &self,
        lat: &Lattice,
        committed: &[TokenId],
        ngram: Option<&ArpaLm>,
        stop: &[TokenId],
    ) -> Vec<TokenId> {
        let lambda = if ngram.is_some() {
            self.params.lambda
        } else {
            1.0
        };
        let mut beams = vec![Beam {
            path: vec![],
            score: 0.0,
            done: false,
        }];
        let mut ctx: Vec<TokenId> = Vec::with_capacity(2);
        for slot in &lat.slots {
            if beams.iter().all(|b| b.done) {
                break;
            }
            // Candidates as (score, beam, token): paths are built for the survivors only.
            let mut cand: Vec<(f32, usize, Option<TokenId>)> = vec![];
            for (bi, b) in beams.iter().enumerate() {
                if b.done {
                    cand.push((b.score, bi, None));
                    continue;
                }
                ctx.clear();
                let need = 2usize.saturating_sub(b.path.len());
                ctx.extend_from_slice(&committed[committed.len().saturating_sub(need)..]);
                ctx.extend_from_slice(&b.path[b.path.len().saturating_sub(2)..]);
                let resolved = ngram.map(|m| m.token_context(&ctx));
                for &(t, ld) in slot {
                    let ng = match (ngram, &resolved) {
                        (Some(m), Some(c)) => m.ln_next_token(c, t),
                        _ => 0.0,
                    };
                    cand.push((b.score + lambda * ld + (1.0 - lambda) * ng, bi, Some(t)));
                }
            }
            // Stable: equal scores keep beam, then lattice order.
            cand.sort_by(|a, b| b.0.total_cmp(&a.0));
            cand.truncate(self.params.beam.max(1));
            beams = cand
                .into_iter()
                .map(|(score, bi, t)| {
                    let b = &beams[bi];
                    match t {
                        None => b.clone(),
                        Some(t) => {
                            let mut path = b.path.clone();
                            path.push(t);
                            Beam {
                                path,
                                score,
                                done: stop.contains(&t),
                            }
                        }
                    }
                })
                .collect();
        }
        beams
            .into_iter()
            .max_by(|a, b| a.score.total_cmp(&b.score))
            .map(|b| b.path)
            .unwrap_or_default()
    }
}

/// ADL settings (paper: ρ 0.5, δ 10, k_min 20, k_max 30).
#[derive(Clone, Copy, Debug)]
pub struct AdlParams {
    pub rho: f64,
    pub delta: f64,
    pub k_min: usize,
    pub k_max: usize,
}

impl Default for AdlParams {
    fn default() -> Self {
        AdlParams {
            rho: 0.5,
            delta: 10.0,
            k_min: 20,
            k_max: 30,
        }
    }
}

impl AdlParams {
    /// The paper's settings scaled to a drafter whose block holds at most `k_max` drafts:
    /// k_min = ⌈2/3 · k_max⌉ and δ = k_max / 3 (the paper's 20/30 and 10/30).
    pub fn for_block(k_max: usize) -> Self {
        let k_max = k_max.max(1);
        AdlParams {
            rho: 0.5,
            delta: k_max as f64 / 3.0,
            k_min: (2 * k_max).div_ceil(3),
            k_max,
        }
    }
}

/// Adaptive draft length (§4.5): the next round's k from EMAs of the generated length (the raw
/// draft before its first EOS) and the accepted length.
#[derive(Clone, Debug)]
pub struct Adl {
    pub params: AdlParams,
    gen: f64,
    acc: f64,
    k: usize,
}

impl Adl {
    pub fn new(params: AdlParams) -> Self {
        Adl {
            params,
            gen: 0.0,
            acc: 0.0,
            k: params.k_max,
        }
    }

    /// This round's draft length.
    pub fn k(&self) -> usize {
        self.k
    }

    /// After a round of `k` drafts whose raw draft first placed EOS at 1-based index `eos`
    /// (None: nowhere) and of which `accepted` were accepted.
    pub fn observe(&mut self, eos: Option<usize>, accepted: usize) {
        let p = &self.params;
        let l_gen = eos.map_or(self.k, |s| (s - 1).min(self.k));
        self.gen = (1.0 - p.rho) * self.gen + p.rho * l_gen as f64;
        self.acc = (1.0 - p.rho) * self.acc + p.rho * accepted as f64;
        let bonus = if self.acc >= self.gen { p.delta } else { 0.0 };
        self.k = ((self.gen + bonus).ceil() as usize).clamp(p.k_min, p.k_max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(i: u32) -> TokenId {
        TokenId(i)
    }

    /// Mass-adaptive pruning keeps the fewest tokens reaching τ_mass, at most M_max, and a
    /// stop token that missed the cut comes back with its own log-probability.
    #[test]
    fn the_lattice_prunes_by_mass_and_keeps_eos() {
        // Slot 0: one token holds ~0.9. Slot 1: flat over 20 tokens. Stop token: 19.
        let v = 20;
        let mut logits = vec![0f32; 2 * v];
        logits[3] = 5.0;
        for i in 0..v {
            logits[v + i] = -0.01 * i as f32;
        }
        let lat = Lattice::from_logits(
            &logits,
            v,
            |i| t(i as u32),
            |x| Some(x.idx()),
            &[t(19)],
            &Default::default(),
        );
        assert_eq!(lat.raw, vec![t(3), t(0)]);
        assert_eq!(lat.slots[0].len(), 2, "{:?}", lat.slots[0]);
        assert_eq!(lat.slots[0][0].0, t(3));
        assert_eq!(lat.slots[0][1].0, t(19));
        let lse0 = 5f32 + (1.0 + 19.0 * (-5f32).exp()).ln();
        assert!((lat.slots[0][1].1 - (0.0 - lse0)).abs() < 1e-5);
        // Nearly flat: 16 tokens would be needed for 0.8, M_max caps at 15; 19 comes back.
        assert_eq!(lat.slots[1].len(), 16);
        assert!(lat.slots[1].iter().any(|k| k.0 == t(19)));
    }

    /// The n-gram proxy changes the path where the drafter is unsure, and a beam that places
    /// EOS stops growing but can still win on its frozen score.
    #[test]
    fn cps_follows_the_ngram_where_the_drafter_is_unsure() {
        // Drafter: slot 0 sure of 5; slot 1 split between 6 (0.55) and 7 (0.45).
        let lat = Lattice {
            slots: vec![
                vec![(t(5), (0.95f32).ln())],
                vec![(t(6), (0.55f32).ln()), (t(7), (0.45f32).ln())],
            ],
            raw: vec![t(5), t(6)],
        };
        let cps = Cps::default();
        assert_eq!(cps.search(&lat, &[t(1), t(2)], None, &[]), vec![t(5), t(6)]);
        // An n-gram model that has seen "… 5 7" often and never "5 6".
        let mut b = crate::ngram::arpa::ArpaBuilder::new();
        for _ in 0..20 {
            b.add_document(&[t(1), t(2), t(5), t(7), t(8)]);
        }
        b.add_document(&[t(6), t(9)]);
        let lm = b.finish().unwrap();
        assert_eq!(
            cps.search(&lat, &[t(1), t(2)], Some(&lm), &[]),
            vec![t(5), t(7)]
        );
        // EOS: a finished beam keeps its score and wins over weaker continuations.
        let eos = t(2);
        let lat = Lattice {
            slots: vec![
                vec![(eos, (0.9f32).ln()), (t(4), (0.1f32).ln())],
                vec![(t(4), (0.3f32).ln())],
            ],
            raw: vec![eos, t(4)],
        };
        assert_eq!(cps.search(&lat, &[t(1)], None, &[eos]), vec![eos]);
    }

    /// ADL (§4.5): k starts at k_max, settles at k_min when acceptance lags generation, jumps
    /// back when acceptance catches up, and an early EOS pushes it to the floor.
    #[test]
    fn adl_follows_generation_and_acceptance() {
        let mut a = Adl::new(AdlParams::default());
        assert_eq!(a.k(), 30);
        for _ in 0..10 {
            a.observe(None, 3);
        }
        assert_eq!(a.k(), 20);
        // Acceptance equal to generation catches up with the generation EMA only in the limit
        // (the spec's "rarely"): here after enough rounds for the EMA to round to it.
        for _ in 0..60 {
            let k = a.k();
            a.observe(None, k);
        }
        assert_eq!(a.k(), 30);
        for _ in 0..10 {
            a.observe(Some(2), 1);
        }
        assert_eq!(a.k(), 20);
        let s = AdlParams::for_block(15);
        assert_eq!((s.k_min, s.k_max, s.delta), (10, 15, 5.0));
    }
}
