//! The speculative decode loop (gpt-fast style: the whole algorithm on one screen).
//!
//! Invariant between rounds: the KV cache holds every committed token but the last one (the
//! root), whose position is `kv.len()`. A round verifies [root, draft nodes] in one target
//! forward, keeps the KV rows of the root and the accepted path, and commits the accepted
//! tokens plus the target's bonus token, which becomes the next root.

use super::sizing::Sizer;
use super::tree::NodeId;
use super::verify::{row_of, verify, Outcome, VerifyRule};
use super::{Drafter, Hidden};
use crate::error::Result;
use crate::generate::{check_prompt, Emitter, GenerateParams, Generation, Stats, StopReason};
use crate::kv::KvCache;
use crate::model::{Batch, Logits, Model, OutputSpec, Rows, Scratch, Tokenizer};
use crate::sample::Sampler;
use crate::types::{Pos, SlotId, TokenId};
use serde::Serialize;
use std::time::Instant;

/// Telemetry of one round.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RoundStats {
    pub drafted: usize,
    pub accepted: usize,
    pub draft_ms: f64,
    /// Linearising the tree (positions, ancestor mask).
    pub tree_ms: f64,
    pub verify_ms: f64,
    pub commit_ms: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SpecGeneration {
    /// What AR generation reports too.
    #[serde(flatten)]
    pub out: Generation,
    /// Target forwards after the prefill.
    pub rounds: Vec<RoundStats>,
    /// Tokens committed per target pass, bonus included (prefill's token not counted).
    pub tau: f64,
}

/// The drafter of a speculative run, the most nodes it may propose per round, optionally a
/// [`Sizer`] that picks each round's budget from measured costs and acceptance, and the rule
/// that verifies drafts at temperature > 0.
pub struct Speculation<'a> {
    pub drafter: &'a mut dyn Drafter,
    pub max_draft: usize,
    pub sizer: Option<&'a mut Sizer>,
    pub rule: VerifyRule,
}

/// Generates a continuation of `prompt`, drafting with `sp.drafter` and verifying each draft
/// in one target forward.
pub fn speculative_generate(
    model: &Model,
    tok: &Tokenizer,
    kv: &mut KvCache,
    prompt: &[TokenId],
    params: &GenerateParams,
    sp: Speculation,
    mut on_text: impl FnMut(&str),
) -> Result<SpecGeneration> {
    let Speculation {
        drafter,
        max_draft,
        mut sizer,
        rule,
    } = sp;
    let sampler = Sampler::new(params.sampling)?;
    check_prompt(prompt, kv.capacity())?;
    let greedy = params.sampling.is_greedy();
    let mut s = Scratch::default();
    kv.clear();
    let taps = drafter.taps().to_vec();
    let width = taps.len() * model.config.hidden_size;
    let t0 = Instant::now();
    let pos: Vec<Pos> = (0..prompt.len() as u32).map(Pos).collect();
    let spec = OutputSpec {
        taps: taps.clone(),
        ..OutputSpec::last_full()
    };
    let out = model.forward(
        kv,
        &Batch {
            tokens: prompt,
            positions: &pos,
            mask: None,
        },
        &spec,
        &mut s,
    )?;
    let mut root = sampler.sample_at(out.logits_row(0), prompt.len());
    let prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    drafter.begin(
        prompt,
        Hidden {
            width,
            rows: &out.hidden,
        },
    )?;
    let draft_prefill_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut hidden = Vec::new();
    // Every verification forward: all rows, argmaxes (greedy) or full rows (sampling), the taps.
    let logits = if greedy { Logits::Argmax } else { Logits::Full };
    let verify_spec = OutputSpec {
        rows: Rows::All,
        logits,
        taps,
    };

    let t1 = Instant::now();
    let mut committed = prompt.to_vec();
    let mut em = Emitter::new(tok, params);
    let mut rounds = Vec::new();
    let mut stop = em.push(root, &mut on_text)?;
    committed.push(root);
    while stop.is_none() {
        let base = kv.len(); // the root's slot and position
        let room = kv.capacity().saturating_sub(base + 1);
        if kv.capacity() <= base {
            stop = Some(StopReason::ContextFull);
            break;
        }
        let mut st = RoundStats::default();
        let trees = drafter.node_confidence().is_some();
        let budget = match sizer.as_deref() {
            Some(s) if trees => s.choose_tree(max_draft),
            Some(s) => s.choose(max_draft),
            None => max_draft,
        }
        .min(room);
        let t = Instant::now();
        let mut tree = drafter.propose(&committed, budget)?;
        st.draft_ms = t.elapsed().as_secs_f64() * 1e3;
        // Trees: cut where nodes stop paying; `predicted` = Σ path probability of those kept.
        let mut predicted = 0.0;
        if let (Some(s), Some(conf)) = (sizer.as_deref(), drafter.node_confidence()) {
            let keep = s.cut(conf, st.draft_ms).min(budget);
            predicted = conf[..keep.min(conf.len())].iter().map(|&p| p as f64).sum();
            tree.truncate(keep);
        }
        tree.truncate(budget);

        // Verify: one forward over [root, nodes].
        let t = Instant::now();
        let lin = tree.linearise(root, base);
        st.tree_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let out = model.forward(
            kv,
            &Batch {
                tokens: &lin.tokens,
                positions: &lin.positions,
                mask: Some(&lin.mask),
            },
            &verify_spec,
            &mut s,
        )?;
        let outcome: Outcome = verify(
            rule,
            &tree,
            &out.argmax,
            |r| out.logits_row(r),
            &sampler,
            base,
        );
        st.verify_ms = t.elapsed().as_secs_f64() * 1e3;

        // Commit: keep the root's slot and the accepted path's, contiguously.
        let t = Instant::now();
        let slots: Vec<SlotId> = outcome
            .accepted
            .iter()
            .map(|&n: &NodeId| SlotId((base + row_of(Some(n))) as u32))
            .collect();
        kv.compact(base + 1, &slots)?;
        for t in outcome.committed() {
            committed.push(t);
            if stop.is_none() {
                stop = em.push(t, &mut on_text)?;
            }
        }
        root = outcome.bonus;
        // Hidden states of the rows now committed: the root (row 0) and the accepted nodes.
        hidden.clear();
        for row in std::iter::once(0).chain(outcome.accepted.iter().map(|&n| row_of(Some(n)))) {
            hidden.extend_from_slice(&out.hidden[row * width..(row + 1) * width]);
        }
        drafter.observe(
            &outcome,
            Hidden {
                width,
                rows: &hidden,
            },
        )?;
        match sizer.as_deref_mut() {
            Some(s) if trees => {
                s.observe_tree(tree.len(), predicted, outcome.accepted.len(), st.draft_ms)
            }
            Some(s) => s.observe(
                tree.max_depth() as usize,
                outcome.accepted.len(),
                st.draft_ms,
                tree.len(),
            ),
            None => {}
        }
        st.drafted = outcome.drafted;
        st.accepted = outcome.accepted.len();
        st.commit_ms = t.elapsed().as_secs_f64() * 1e3;
        rounds.push(st);
    }
    let decode_ms = t1.elapsed().as_secs_f64() * 1e3;
    let (text, ids) = em.finish(&mut on_text);
    let tau = if rounds.is_empty() {
        0.0
    } else {
        rounds.iter().map(|r| r.accepted as f64 + 1.0).sum::<f64>() / rounds.len() as f64
    };
    Ok(SpecGeneration {
        out: Generation {
            text,
            prompt_token_ids: prompt.to_vec(),
            stop_reason: stop.unwrap_or(StopReason::MaxTokens),
            stats: Stats::new(
                prompt.len(),
                ids.len(),
                prefill_ms,
                draft_prefill_ms,
                decode_ms,
            ),
            token_ids: ids,
        },
        rounds,
        tau,
    })
}
