//! The training graph against the runtime, gradients, batches, resuming, distillation, initialisation from target layers.

use super::*;

#[test]
fn training_graph_matches_the_inference_runtime() {
    for tiny in ["qwen3", "llama"] {
        let lm = load_tiny(tiny);
        let cfg = config(&lm, 2);
        let net = Net::init(cfg.clone(), 7).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let vocab = DraftVocab::full(lm.model.config.vocab_size);
        export(
            &net,
            &vocab,
            lm.model.config.vocab_size,
            dir.path(),
            DType::F32,
        )
        .unwrap();
        let m = DflashModel::load_with(dir.path(), false).unwrap();
        let mq = DflashModel::load(dir.path()).unwrap();
        let toks = tokens(40, lm.model.config.vocab_size);
        let feats = features(&lm, &toks);
        let anchors = [5usize, 17, 30];
        let b = packed(&lm, &toks, &feats, &anchors, TokenId(cfg.mask_token_id));
        let hid = net.forward(&b).unwrap().to_vec2::<f32>().unwrap();
        let h = lm.model.config.hidden_size;
        let (mut worst, mut worst_q) = (0f32, 0f32);
        for (j, &a) in anchors.iter().enumerate() {
            let r = runtime_block(&lm, &m, &toks, &feats, a);
            let rq = runtime_block(&lm, &mq, &toks, &feats, a);
            for k in 0..BLOCK {
                for i in 0..h {
                    worst = worst.max((hid[j * BLOCK + k][i] - r[k * h + i]).abs());
                    worst_q = worst_q.max((rq[k * h + i] - r[k * h + i]).abs());
                }
            }
        }
        assert!(
            worst < 2e-4,
            "{tiny}: training graph vs runtime max |Δ| {worst}"
        );
        // Q8_0 weights with int8 activations (the default); outputs are RMS-normed (order 1).
        assert!(
            worst_q < 0.05 && worst_q > 0.0,
            "{tiny}: Q8_0 runtime vs f32 max |Δ| {worst_q}"
        );
    }
}

/// A freshly initialised drafter of `layers` layers on the tiny Qwen3, its frozen head and one
/// labelled batch of 32 tokens with blocks at `anchors`.
fn training_setup(
    layers: usize,
    seed: u64,
    anchors: &[usize],
    gamma: f32,
) -> (Net, FrozenHead, Labeled) {
    let lm = load_tiny("qwen3");
    let cfg = config(&lm, layers);
    let net = Net::init(cfg.clone(), seed).unwrap();
    let vocab = DraftVocab::full(lm.model.config.vocab_size);
    let head = frozen_head(&lm.model, &vocab).unwrap();
    let toks = tokens(32, lm.model.config.vocab_size);
    let feats = features(&lm, &toks);
    let mask = TokenId(cfg.mask_token_id);
    let lb = labeled(&lm, &toks, &feats, anchors, mask, gamma);
    (net, head, lb)
}

#[test]
fn every_trainable_tensor_gets_a_gradient() {
    let (net, head, lb) = training_setup(2, 3, &[4, 20], 7.0);
    let (l, _) = loss(&net, &head, &lb, 0.0).unwrap().unwrap();
    assert!(l.to_scalar::<f32>().unwrap().is_finite());
    let g = l.backward().unwrap();
    common::assert_every_var_has_a_gradient(&net.vars, &g);
}

#[test]
fn a_few_steps_of_training_lower_the_loss() {
    let (net, head, lb) = training_setup(1, 1, &[3, 9, 15, 21], f32::INFINITY);
    let mut opt = paradraft::train::optim::AdamW::new(&net.vars, 0.0).unwrap();
    let first = loss(&net, &head, &lb, 0.0)
        .unwrap()
        .unwrap()
        .0
        .to_scalar::<f32>()
        .unwrap();
    for _ in 0..30 {
        let (l, _) = loss(&net, &head, &lb, 0.0).unwrap().unwrap();
        let g = l.backward().unwrap();
        opt.step(&net.vars, &g, 3e-3, 1.0).unwrap();
    }
    let last = loss(&net, &head, &lb, 0.0)
        .unwrap()
        .unwrap()
        .0
        .to_scalar::<f32>()
        .unwrap();
    assert!(last < 0.5 * first, "loss {first} → {last}");
}

#[test]
fn batches_label_slot_k_with_the_token_k_after_the_anchor() {
    use paradraft::train::data::Sample;
    use paradraft::train::dflash::batch::build;
    use paradraft::train::features;
    let lm = load_tiny("qwen3");
    let n = lm.model.config.vocab_size;
    let toks = tokens(30, n);
    let s = Sample {
        prompt_index: 0,
        prompt_len: 10,
        tokens: toks.clone(),
    };
    let dir = tempfile::tempdir().unwrap();
    let p = features::cache_path(dir.path(), &TAPS);
    let samples = vec![s];
    let fc = features::build(&lm.model, &samples, &TAPS, &p, |_, _| {}).unwrap();
    // Resuming finds everything cached and returns the same bytes.
    let again = features::build(&lm.model, &samples, &TAPS, &p, |_, _| {}).unwrap();
    let (mut a, mut b) = (vec![], vec![]);
    fc.rows_into(0, 30, &mut a);
    again.rows_into(0, 30, &mut b);
    assert_eq!(a, b);
    assert_eq!(a.len(), 30 * TAPS.len() * lm.model.config.hidden_size);
    // The cached rows are the target's taps (f16-rounded).
    let f = features(&lm, &toks);
    let worst = a
        .iter()
        .zip(&f)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
        .fold(0f32, f32::max);
    assert!(worst < 1e-3, "{worst}");
    // Vocabulary without token toks[12]: its label gets weight 0.
    let vocab = DraftVocab::from_d2t((0..n as u32).filter(|&i| i != toks[12].0).collect(), n);
    let lb = build(
        &lm.model,
        &samples,
        &fc.into(),
        &[(0, vec![10, 26])],
        BLOCK,
        TokenId(5),
        &vocab,
        7.0,
        usize::MAX,
    )
    .unwrap();
    assert_eq!(lb.batches.len(), 1);
    let bt = &lb.batches[0];
    assert_eq!(bt.ctx_pos, (0..26).collect::<Vec<u32>>());
    assert_eq!(bt.block_pos[..BLOCK], (10..16).collect::<Vec<u32>>()[..]);
    assert_eq!(bt.visible(), vec![10, 26], "anchor a sees 0..a");
    for k in 1..BLOCK {
        let i = k - 1;
        let want = vocab.draft_id(toks[10 + k]);
        if 10 + k == 12 {
            assert_eq!(lb.weights[i], 0.0);
        } else {
            assert_eq!(Some(lb.labels[i]), want);
            assert!((lb.weights[i] - (-((k - 1) as f32) / 7.0).exp()).abs() < 1e-6);
        }
    }
    // Anchor 26: slots past the sequence end (30) carry no loss.
    for k in 1..BLOCK {
        let w = lb.weights[(BLOCK - 1) + k - 1];
        assert_eq!(w > 0.0, 26 + k < 30, "slot {k}");
    }
}

#[test]
fn training_resumes_from_its_checkpoint_bit_for_bit() {
    use paradraft::train::data::Sample;
    use paradraft::train::dflash::{train, Data, TrainParams};
    use paradraft::train::features;
    let lm = load_tiny("qwen3");
    let n = lm.model.config.vocab_size;
    let samples: Vec<Sample> = (0..6)
        .map(|i| Sample {
            prompt_index: i,
            prompt_len: 6,
            tokens: tokens(24 + i as usize, n)
                .into_iter()
                .map(|t| TokenId((t.0 + i * 3) % n as u32))
                .collect(),
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let p = features::cache_path(dir.path(), &TAPS);
    let fc: features::TapSource = features::build(&lm.model, &samples, &TAPS, &p, |_, _| {})
        .unwrap()
        .into();
    let vocab = DraftVocab::most_frequent(&samples, n, 100);
    let data = Data {
        target: &lm.model,
        samples: &samples,
        features: &fc,
        train: (0..6).collect(),
        vocab: &vocab,
        device: Device::Cpu,
        teacher_from: samples.len(),
    };
    let cfg = config(&lm, 1);
    let params = TrainParams {
        block_size: BLOCK,
        anchors: 4,
        batch_seqs: 2,
        epochs: 2,
        save_every: 100,
        ..TrainParams::default()
    };
    let straight = tempfile::tempdir().unwrap();
    let a = train(&cfg, &data, &params, straight.path(), |_| {}).unwrap();
    let resumed = tempfile::tempdir().unwrap();
    let mut steps = vec![];
    let paused = TrainParams {
        pause_at: 2,
        ..params.clone()
    };
    train(&cfg, &data, &paused, resumed.path(), |l| steps.push(l.step)).unwrap();
    assert_eq!(steps, [1, 2], "the first run pauses after step 2");
    let b = train(&cfg, &data, &params, resumed.path(), |l| steps.push(l.step)).unwrap();
    assert_eq!(steps, (1..=6).collect::<Vec<_>>());
    for (name, v) in &a.vars {
        let x = v
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let y = b.vars[name]
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(x, y, "{name} differs after resuming");
    }
}

/// Blocks at `anchors` of sample 0, its taps cached with the target's last layer after them
/// (what the distillation and teacher labels read); samples from `teacher_from` on are
/// teacher-forced.
fn blocks_with_target_rows(
    lm: &Loaded,
    samples: &[paradraft::train::data::Sample],
    anchors: &[usize],
    vocab: &DraftVocab,
    teacher_from: usize,
) -> Labeled {
    use paradraft::train::features;
    let stored = [TAPS[0], TAPS[1], lm.model.config.n_layers - 1];
    let dir = tempfile::tempdir().unwrap();
    let p = features::cache_path(dir.path(), &stored);
    let fc = features::build(&lm.model, samples, &stored, &p, |_, _| {})
        .unwrap()
        .with_context_width(TAPS.len() * lm.model.config.hidden_size)
        .into();
    paradraft::train::dflash::batch::build(
        &lm.model,
        samples,
        &fc,
        &[(0, anchors.to_vec())],
        BLOCK,
        TokenId(5),
        vocab,
        7.0,
        teacher_from,
    )
    .unwrap()
}

/// The distillation term: with the target's last-layer outputs kept in the feature cache, the
/// loss adds `kl` × the KL divergence from the target's next-token distribution at the
/// position before each label (restricted to the draft vocabulary) to the drafter's; checked
/// against the target's own logits computed by the runtime, and it carries gradients.
#[test]
fn distillation_loss_matches_the_targets_distribution() {
    use paradraft::train::data::Sample;
    let mut lm = load_tiny("qwen3");
    lm.model.set_exact(true);
    let n = lm.model.config.vocab_size;
    let toks = tokens(30, n);
    let samples = vec![Sample {
        prompt_index: 0,
        prompt_len: 8,
        tokens: toks.clone(),
    }];
    // A reduced vocabulary: the distribution is renormalised over it.
    let vocab = DraftVocab::from_d2t((0..n as u32).filter(|i| i % 4 != 3).collect(), n);
    let anchors = vec![9, 17];
    let lb = blocks_with_target_rows(&lm, &samples, &anchors, &vocab, usize::MAX);
    assert!(lb.target_hidden.is_some());
    let cfg = config(&lm, 1);
    let net = Net::init(cfg, 4).unwrap();
    let head = frozen_head(&lm.model, &vocab).unwrap();
    let ce = loss(&net, &head, &lb, 0.0).unwrap().unwrap().0;
    let both = loss(&net, &head, &lb, 0.5).unwrap().unwrap().0;
    let kl_loss = ((&both - &ce).unwrap() * 2.0).unwrap();
    // Reference: the drafter's log-probabilities from its hidden states, the target's from the
    // runtime's full logits, both over the draft vocabulary.
    let hidden = net.forward(&lb.batches[0]).unwrap();
    let dl: Vec<Vec<f32>> = head.forward(&hidden).unwrap().to_vec2().unwrap();
    let full = common::run_logits(&lm, &toks);
    let log_softmax = |v: &[f64]| {
        let m = v.iter().cloned().fold(f64::MIN, f64::max);
        let z = v.iter().map(|x| (x - m).exp()).sum::<f64>().ln() + m;
        v.iter().map(|x| x - z).collect::<Vec<f64>>()
    };
    let (mut num, mut den) = (0f64, 0f64);
    for (j, &a) in anchors.iter().enumerate() {
        for k in 1..BLOCK {
            let i = j * (BLOCK - 1) + k - 1;
            let w = lb.weights[i] as f64;
            if w == 0.0 {
                continue;
            }
            let pos = a + k;
            let t: Vec<f64> = vocab
                .d2t
                .iter()
                .map(|&id| full[pos - 1][id as usize] as f64)
                .collect();
            let q: Vec<f64> = dl[j * BLOCK + k].iter().map(|&x| x as f64).collect();
            let (lp, lq) = (log_softmax(&t), log_softmax(&q));
            let kl: f64 = lp.iter().zip(&lq).map(|(p, q)| p.exp() * (p - q)).sum();
            num += w * kl;
            den += w;
        }
    }
    let want = num / den;
    let got = kl_loss.to_scalar::<f32>().unwrap() as f64;
    assert!(
        (got - want).abs() < 2e-3 * want.max(1.0),
        "KL term {got} vs reference {want}"
    );
    let g = both.backward().unwrap();
    for (name, v) in &net.vars {
        assert!(g.get(v.as_tensor()).is_some(), "{name} gets no gradient");
    }
}

/// Teacher-forced text (#57): slot k of a block is labelled with the target's argmax after
/// x_{a+k−1} and trained only while x_{a+1}..x_{a+k−1} are each the target's argmax; the text
/// below follows the target greedily except at one position. The loss relabels the same way.
#[test]
fn teacher_forced_blocks_follow_the_targets_greedy_path() {
    use paradraft::train::data::Sample;
    let mut lm = load_tiny("qwen3");
    lm.model.set_exact(true);
    let n = lm.model.config.vocab_size;
    let argmax = |v: &[f32]| (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap() as u32;
    // A prompt of 6 tokens, then the target's greedy continuation with position 14 replaced.
    let (len, off_path) = (24, 14);
    let mut toks = tokens(6, n);
    while toks.len() < len {
        let l = common::run_logits(&lm, &toks);
        let mut next = argmax(&l[toks.len() - 1]);
        if toks.len() == off_path {
            next = (next + 1) % n as u32;
        }
        toks.push(TokenId(next));
    }
    let full = common::run_logits(&lm, &toks);
    let am_ref: Vec<u32> = full.iter().map(|r| argmax(r)).collect();
    let greedy = |q: usize| toks[q].0 == am_ref[q - 1];
    assert!((7..len).all(|q| greedy(q) == (q != off_path)));
    let samples = vec![Sample {
        prompt_index: 0,
        prompt_len: 6,
        tokens: toks.clone(),
    }];
    let vocab = DraftVocab::full(n);
    let anchors = vec![6, 10, 14, 20];
    let lb = blocks_with_target_rows(&lm, &samples, &anchors, &vocab, 0);
    assert!(lb.has_teacher());
    let pos = |i: usize| anchors[i / (BLOCK - 1)] + i % (BLOCK - 1) + 1;
    let (labels, weights) = lb.relabel(BLOCK, |i| am_ref.get(pos(i) - 1).copied());
    let mut trained = 0;
    for i in 0..labels.len() {
        let (p, a) = (pos(i), anchors[i / (BLOCK - 1)]);
        let want = p < len && (a + 1..p).all(greedy);
        assert_eq!(weights[i] > 0.0, want, "slot at {p} of anchor {a}");
        if want {
            assert_eq!(labels[i], am_ref[p - 1], "label at {p}");
            trained += 1;
        }
    }
    // Anchor 10's slots past 14 and anchor 6's past 14 are off the path; 14 itself anchors a
    // block whose slots all follow the target again; 20's last slots run past the end.
    assert_eq!(trained, 5 + 4 + 5 + 3, "{weights:?}");
    // The loss forms its labels from the stored last-layer rows (f16) the same way and trains
    // on those rows only.
    let net = Net::init(config(&lm, 1), 4).unwrap();
    let head = frozen_head(&lm.model, &vocab).unwrap();
    let (l, acc1) = loss(&net, &head, &lb, 0.0).unwrap().unwrap();
    assert!(l.to_scalar::<f32>().unwrap().is_finite() && (0.0..=1.0).contains(&acc1));
    let th = head
        .target_logits(lb.target_hidden.as_ref().unwrap())
        .unwrap();
    let am_stored: Vec<u32> = th
        .argmax(candle_core::D::Minus1)
        .unwrap()
        .to_vec1()
        .unwrap();
    let (labels, weights) = lb.relabel(BLOCK, |i| Some(am_stored[i]));
    assert_eq!(
        weights.iter().filter(|&&w| w > 0.0).count(),
        trained,
        "the stored rows give the same path"
    );
    let rows: Vec<usize> = (0..labels.len()).filter(|&i| weights[i] > 0.0).collect();
    let hidden = net.forward(&lb.batches[0]).unwrap();
    let logits: Vec<Vec<f32>> = head.forward(&hidden).unwrap().to_vec2().unwrap();
    let (mut num, mut den) = (0f64, 0f64);
    for &i in &rows {
        let (j, k) = (i / (BLOCK - 1), i % (BLOCK - 1) + 1);
        let r = &logits[j * BLOCK + k];
        let m = r.iter().cloned().fold(f32::MIN, f32::max) as f64;
        let z = r.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m;
        num += weights[i] as f64 * (z - r[labels[i] as usize] as f64);
        den += weights[i] as f64;
    }
    let got = l.to_scalar::<f32>().unwrap() as f64;
    assert!(
        (got - num / den).abs() < 1e-3 * (num / den).max(1.0),
        "teacher loss {got} vs reference {}",
        num / den
    );
}

/// Drafter layers initialised from target layers get the target's weights under HF names, with
/// the q/k rows of a GGUF Llama (permuted for interleaved RoPE) put back in rotate-half order:
/// the GGUF copy of the tiny Llama (quantized) matches its HF original row for row.
#[test]
fn target_layer_weights_come_back_in_hf_order() {
    let hf = load_tiny("llama");
    let gg = paradraft::model::load(&common::fixtures().join("tiny/llama-quant.gguf")).unwrap();
    let a = hf.model.layer_weights_f32(0).unwrap();
    let b = gg.model.layer_weights_f32(0).unwrap();
    assert_eq!(a.len(), b.len());
    for ((na, sa, va), (nb, sb, vb)) in a.iter().zip(&b) {
        assert_eq!((na, sa), (nb, sb));
        let err = va
            .iter()
            .zip(vb)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        let scale = va.iter().map(|x| x.abs()).fold(0f32, f32::max);
        assert!(err <= 0.15 * scale, "{na}: max |Δ| {err} of {scale}");
    }
    assert!(gg.model.layer_weights_f32(99).is_none());
    // A drafter of the tiny Llama's shape takes them.
    let mut cfg = common::tiny_dflash_config(&hf, 1, &TAPS, BLOCK);
    cfg.layers = hf.model.config.clone();
    cfg.layers.n_layers = 1;
    cfg.layers.arch = paradraft::model::Arch::Qwen3;
    let (net, copied) = Net::init_from_target(cfg, 0, &gg.model, &[1]).unwrap();
    assert!(copied.contains(&"layers.0.self_attn.q_proj.weight".to_string()));
    assert!(copied.contains(&"norm.weight".to_string()));
    let q: Vec<Vec<f32>> = net.vars["layers.0.self_attn.q_proj.weight"]
        .as_tensor()
        .to_vec2()
        .unwrap();
    let want = &gg.model.layer_weights_f32(1).unwrap()[0].2;
    assert_eq!(q.concat(), *want);
}

/// Features captured while self-distilling go to the cache in step with the samples: a run
/// killed between a sample's rows and its record leaves rows the next run cuts off, and a
/// cache missing rows is not appended to (the feature stage fills it in).
#[test]
fn feature_appender_stays_in_step_with_the_samples() {
    use half::f16;
    use paradraft::train::data::Sample;
    use paradraft::train::features::{self, FeatureAppender};
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f.f16");
    let s = |n: usize| Sample {
        prompt_index: 0,
        prompt_len: 1,
        tokens: vec![TokenId(1); n],
    };
    let width = 4;
    let mut fa = FeatureAppender::open(&p, &[], width).unwrap().unwrap();
    // 3 tokens, the last never computed: written as zeros.
    let rows: Vec<f16> = (0..8).map(|i| f16::from_f32(i as f32)).collect();
    fa.append(3, &rows).unwrap();
    assert!(fa.append(5, &rows).is_err(), "two rows short is refused");
    // A second sample's rows without its record (killed in between).
    fa.append(2, &rows).unwrap();
    drop(fa);
    let samples = vec![s(3)];
    let again = FeatureAppender::open(&p, &samples, width).unwrap();
    assert!(again.is_some());
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 3 * 4 * 2);
    let fc = features::open(&p, &samples, width).unwrap();
    let mut v = vec![];
    fc.rows_into(0, 3, &mut v);
    assert_eq!(v, [0., 1., 2., 3., 4., 5., 6., 7., 0., 0., 0., 0.]);
    // Rows missing: no appending.
    assert!(FeatureAppender::open(&p, &[s(3), s(2)], width)
        .unwrap()
        .is_none());
}
