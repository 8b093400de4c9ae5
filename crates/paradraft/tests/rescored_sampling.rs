//! Sampling from the 4-bit screen's rows, re-scored near the top (`Sampler::sample_rescored`,
//! what a round at T > 0 does since 2026-12-02), against Gumbel-max over exact rows: on
//! SmolLM2 (a Q8_0 output layer, so a real screen), every step of two sampled answers, 24
//! seeds each, five samplers (plain T = 1 and 0.7, top-k, min-p, llama.cpp's defaults), the
//! token drawn must be the exact row's. The old draw (full rows of int8-activation logits,
//! exact only near the argmax) is counted beside it, and a margin of zero must miss some
//! draws (so the comparison can fail).

use paradraft::generate::{generate, GenerateParams};
use paradraft::model::{Batch, Logits, Message, OutputSpec, Rows, Scratch};
use paradraft::sample::{Sampler, SamplingParams, RESCORED_MIN_T};
use paradraft::types::{Pos, TokenId};

/// (temperature, top-k, top-p, min-p): plain sampling at 1 and 0.7, llama.cpp's defaults
/// (0.8, 40, 0.95, 0.05), a top-k alone, a min-p alone at a low temperature.
const SAMPLERS: &[(f32, usize, f32, f32)] = &[
    (1.0, 0, 1.0, 0.0),
    (0.7, 0, 1.0, 0.0),
    (0.8, 40, 0.95, 0.05),
    (1.0, 50, 1.0, 0.0),
    (0.3, 0, 1.0, 0.1),
];

#[test]
fn rescored_screen_draws_equal_exact_gumbel_max_on_smollm2() {
    let path = paradraft::fetch::ensure_default_model().expect("default model");
    let lm = paradraft::model::load(&path).unwrap();
    let (m, tok) = (&lm.model, &lm.tokenizer);
    let vocab = m.config.vocab_size;
    let margin = m.rescore_margin(Logits::Screened);
    let texts = [
        "Write a short story about a lighthouse keeper and a storm.",
        "Explain how a hash map works, with an example in Python.",
    ];
    let (mut draws, mut old_misses, mut zero_misses) = (0usize, 0usize, 0usize);
    for (k, text) in texts.iter().enumerate() {
        let chat = tok
            .apply_chat_template(&[Message::new("user", text)], true)
            .unwrap();
        let prompt = tok.encode(&chat).unwrap();
        let params = GenerateParams {
            max_new_tokens: 48,
            sampling: SamplingParams {
                temperature: 1.0,
                seed: k as u64,
                ..Default::default()
            },
            stop_strings: vec![],
            ..Default::default()
        };
        let mut kv = m.new_kv(prompt.len() + 49);
        let gen = generate(m, tok, &mut kv, &prompt, &params, |_| {}).unwrap();
        let seq: Vec<TokenId> = prompt.iter().chain(&gen.token_ids).copied().collect();
        let steps: Vec<usize> = (prompt.len() - 1..seq.len() - 1).collect();
        let pos: Vec<Pos> = (0..seq.len() as u32).map(Pos).collect();
        let b = Batch {
            tokens: &seq,
            positions: &pos,
            mask: None,
        };
        let rows = |logits| {
            let (mut kv, mut s) = (m.new_kv(seq.len()), Scratch::default());
            let spec = OutputSpec {
                rows: Rows::Some(steps.clone()),
                logits,
                taps: vec![],
            };
            m.forward(&mut kv, &b, &spec, &mut s).unwrap();
            s
        };
        let screened = rows(Logits::Screened);
        let exact: Vec<Vec<f32>> = (0..steps.len())
            .map(|i| {
                (0..vocab as u32)
                    .map(|t| m.rescore(&screened, i, TokenId(t)))
                    .collect()
            })
            .collect();
        let full = rows(Logits::Full);
        for (i, &step) in steps.iter().enumerate() {
            let row = screened.out.logits_row(i);
            let rescore = |t| m.rescore(&screened, i, t);
            for seed in 0..24 {
                for &(temperature, top_k, top_p, min_p) in SAMPLERS {
                    let s = Sampler::new(SamplingParams {
                        temperature,
                        top_k,
                        top_p,
                        min_p,
                        seed,
                    })
                    .unwrap();
                    assert!(s.rescores());
                    let p = step + 1;
                    let want = s.sample_at(&exact[i], p);
                    let got = s.sample_rescored(row, p, rescore, margin);
                    assert_eq!(got, want, "step {step}, seed {seed}, {:?}", s.params);
                    old_misses += usize::from(s.sample_at(full.out.logits_row(i), p) != want);
                    zero_misses += usize::from(s.sample_rescored(row, p, rescore, 0.0) != want);
                    draws += 1;
                }
            }
        }
    }
    eprintln!(
        "{draws} draws: re-scored screen = exact in all; full int8 rows missed {old_misses}, \
         the screen with margin 0 missed {zero_misses}"
    );
    assert!(zero_misses > 0, "a margin of 0 should miss some draws");
}

/// Plain temperature sampling re-scores from [`RESCORED_MIN_T`] up; top-k and min-p at any
/// temperature (they keep a few ids near the top); top-p alone never (it reads every
/// probability), nor greedy decoding.
#[test]
fn which_samplers_rescore() {
    let s = |temperature, top_k, top_p, min_p| {
        Sampler::new(SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            seed: 0,
        })
        .unwrap()
        .rescores()
    };
    assert!(s(1.0, 0, 1.0, 0.0));
    assert!(s(RESCORED_MIN_T, 0, 1.0, 0.0));
    assert!(!s(0.0, 0, 1.0, 0.0));
    assert!(!s(0.0, 40, 1.0, 0.0));
    assert!(!s(0.3, 0, 1.0, 0.0));
    assert!(s(0.3, 40, 1.0, 0.0));
    assert!(s(1.0, 40, 0.95, 0.0));
    assert!(s(0.2, 0, 1.0, 0.05));
    assert!(!s(1.0, 0, 0.9, 0.0));
}
