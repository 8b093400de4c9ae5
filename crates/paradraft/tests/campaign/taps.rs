//! Online taps and teacher-forced labels.

use super::*;

#[test]
fn online_taps_equal_the_stored_cache() {
    let lm = load_tiny("llama");
    let samples = greedy_samples(&lm, 3, 12);
    let taps = dart::stored_taps(&lm.model).unwrap();
    let h = lm.model.config.hidden_size;
    let dir = tempfile::tempdir().unwrap();
    let path = features::cache_path(dir.path(), &taps);
    let cached: TapSource = features::build(&lm.model, &samples, &taps, &path, |_, _| {})
        .unwrap()
        .with_context_width(3 * h)
        .into();
    let online = TapSource::Online(OnlineTaps::new(&lm.model, &taps, 3 * h).unwrap());
    assert_eq!(
        (cached.width(), cached.ctx()),
        (online.width(), online.ctx())
    );
    // Twice in a different order: the reused cache and scratch leave nothing behind.
    for si in [2, 0, 1, 2] {
        let s = &samples[si];
        let (a, b) = (
            cached.sample(&lm.model, si, s).unwrap(),
            online.sample(&lm.model, si, s).unwrap(),
        );
        assert_eq!(a.len(), s.tokens.len());
        assert_eq!(b.len(), s.tokens.len());
        let (mut x, mut y) = (vec![], vec![]);
        a.rows_into(s.tokens.len(), &mut x);
        b.rows_into(s.tokens.len(), &mut y);
        let rows: Vec<usize> = (0..s.tokens.len()).collect();
        a.tail_rows_into(&rows, &mut x);
        b.tail_rows_into(&rows, &mut y);
        assert_eq!(x.len(), y.len());
        for (i, (p, q)) in x.iter().zip(&y).enumerate() {
            // The cache holds f16: its rounding is the only difference.
            assert!(
                (p - q).abs() <= 1e-3 * q.abs().max(1.0),
                "sample {si} value {i}: cached {p} online {q}"
            );
        }
    }
    assert!(OnlineTaps::new(&lm.model, &[lm.model.config.n_layers], h).is_err());
}

#[test]
fn teacher_labels_on_the_targets_own_greedy_text_give_the_distilled_loss() {
    let lm = load_tiny("llama");
    let samples = greedy_samples(&lm, 2, 24);
    let n = lm.model.config.vocab_size;
    let vocab = paradraft::drafters::vocab::DraftVocab::full(n);
    let mut c = dart::config_for(&lm.model, 3, n);
    c.layer.n_heads = 4;
    c.layer.n_kv_heads = 2;
    c.layer.head_dim = 16;
    c.layer.intermediate_size = 96;
    let net = Net::init(c, 5, None).unwrap();
    let taps = dart::stored_taps(&lm.model).unwrap();
    let h = lm.model.config.hidden_size;
    let source = TapSource::Online(OnlineTaps::new(&lm.model, &taps, 3 * h).unwrap());
    let head = paradraft::train::dflash::frozen_head(&lm.model, &vocab).unwrap();
    let data = |teacher_from| Data {
        target: &lm.model,
        samples: &samples,
        features: &source,
        train: vec![0, 1],
        vocab: &vocab,
        device: candle_core::Device::Cpu,
        teacher_from,
    };
    let (distilled, teacher) = (data(2), data(0));
    for (si, sample) in samples.iter().enumerate() {
        let anchors: Vec<usize> = dart::valid_prefixes(sample).step_by(3).collect();
        let a = dart::build(&distilled, si, &anchors, 3, 0.6)
            .unwrap()
            .unwrap();
        let b = dart::build(&teacher, si, &anchors, 3, 0.6)
            .unwrap()
            .unwrap();
        assert!(!a.teacher && b.teacher);
        assert_eq!(a.batch.out, b.batch.out, "same rows scored");
        let (la, wa, ha, ca) = dart::sequence_loss(&net, &head, &a, 1.0).unwrap();
        let (lb, wb, hb, cb) = dart::sequence_loss(&net, &head, &b, 1.0).unwrap();
        let (la, lb) = (
            la.to_scalar::<f32>().unwrap(),
            lb.to_scalar::<f32>().unwrap(),
        );
        assert!((la - lb).abs() <= 1e-4 * la.abs(), "{la} vs {lb}");
        assert_eq!((wa, ha, ca), (wb, hb, cb));
        // Text that is not the target's greedy answer is labelled by the target, not by it.
        let mut other = sample.clone();
        let p = other.prompt_len as usize;
        for t in &mut other.tokens[p + 1..] {
            *t = paradraft::types::TokenId((t.0 + 1) % n as u32);
        }
        let all = [other.clone()];
        let d = Data {
            samples: &all,
            teacher_from: 0,
            ..data(0)
        };
        let c = dart::build(&d, 0, &anchors, 3, 0.6).unwrap().unwrap();
        assert_eq!(c.batch.out, a.batch.out);
    }
}

/// Teacher-forced text that leaves the target's greedy path: a mask row is trained on only
/// where every token between its block's prefix and its label is the target's argmax (checked
/// against the argmax of a plain forward over the text); clean rows always are.
#[test]
fn teacher_mask_rows_are_trained_only_along_the_targets_greedy_chain() {
    use candle_core::D;
    let lm = load_tiny("llama");
    let samples = greedy_samples(&lm, 1, 40);
    let n = lm.model.config.vocab_size;
    let vocab = paradraft::drafters::vocab::DraftVocab::full(n);
    let taps = dart::stored_taps(&lm.model).unwrap();
    let h = lm.model.config.hidden_size;
    let source = TapSource::Online(OnlineTaps::new(&lm.model, &taps, 3 * h).unwrap());
    let head = paradraft::train::dflash::frozen_head(&lm.model, &vocab).unwrap();
    // Every fifth response token replaced: chains through it leave the greedy path.
    let mut text = samples[0].clone();
    let p = text.prompt_len as usize;
    for t in text.tokens[p..].iter_mut().step_by(5) {
        *t = paradraft::types::TokenId((t.0 + 3) % n as u32);
    }
    let all = [text.clone()];
    let data = Data {
        target: &lm.model,
        samples: &all,
        features: &source,
        train: vec![0],
        vocab: &vocab,
        device: candle_core::Device::Cpu,
        teacher_from: 0,
    };
    let masks = 3;
    let anchors: Vec<usize> = dart::valid_prefixes(&text).collect();
    let lb = dart::build(&data, 0, &anchors, masks, 0.6)
        .unwrap()
        .unwrap();
    let th = lb.target_hidden.as_ref().unwrap();
    let labels: Vec<u32> = head
        .target_logits(th)
        .and_then(|l| l.argmax(D::Minus1))
        .and_then(|a| a.to_vec1())
        .unwrap();
    let w = lb.chain_weights(&labels);
    // The reference: the target's argmax at every position from one causal forward.
    let logits = common::run_logits(&lm, &text.tokens);
    let greedy = |q: usize| {
        let row = &logits[q - 1];
        let best = (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b });
        best as u32 == text.tokens[q].0
    };
    let (mut kept, mut cut) = (0, 0);
    for (r, &d) in lb.depth.iter().enumerate() {
        let (lo, hi) = lb.chain[r];
        assert_eq!(hi - lo, d as u32 - 1, "row {r}: depth {d}");
        let want = if (lo as usize..hi as usize).all(greedy) {
            lb.weights[r]
        } else {
            0.0
        };
        assert_eq!(w[r], want, "row {r} depth {d} chain {lo}..{hi}");
        if d > 1 {
            if want > 0.0 {
                kept += 1;
            } else {
                cut += 1;
            }
        }
    }
    assert!(kept > 0 && cut > 0, "kept {kept} cut {cut}");
    // Distilled text (not teacher-forced) keeps every weight.
    let distilled = Data {
        samples: &samples,
        teacher_from: 1,
        ..data
    };
    let a = dart::build(&distilled, 0, &anchors, masks, 0.6)
        .unwrap()
        .unwrap();
    assert_eq!(a.chain_weights(&a.labels), a.weights);
}
