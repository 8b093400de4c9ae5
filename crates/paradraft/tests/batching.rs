//! Multi-sequence forward and continuous batching: every row of a forward over several
//! sequences (each with its own cache, prefills mixed with decode steps) equals the forward of
//! its sequence alone, bit for bit; batched greedy generation reproduces single-stream greedy
//! generation token for token, on tiny models and on SmolLM2.

mod common;
use common::*;
use paradraft::batch::{generate_batched, BatchGenerator, Request};
use paradraft::generate::{generate, GenerateParams};
use paradraft::model::{Batch, Loaded, Logits, OutputSpec, Rows, Scratch};
use paradraft::sample::SamplingParams;
use paradraft::types::TokenId;

fn toks(n: usize, seed: u32, vocab: usize) -> Vec<TokenId> {
    (0..n as u32)
        .map(|i| TokenId((i.wrapping_mul(2654435761).wrapping_add(seed * 97)) % vocab as u32))
        .collect()
}

#[test]
fn multi_sequence_forward_equals_each_sequence_alone() {
    for name in ["llama", "qwen3", "qwen2"] {
        let lm = load_tiny(name);
        let v = lm.model.config.vocab_size;
        // Three sequences with different cached prefixes and new-token counts.
        let pre = [toks(5, 1, v), toks(0, 2, v), toks(9, 3, v)];
        let new = [toks(1, 4, v), toks(7, 5, v), toks(3, 6, v)];
        let taps = vec![0, lm.model.config.n_layers - 1];
        let spec = OutputSpec {
            rows: Rows::All,
            logits: Logits::Full,
            taps: taps.clone(),
        };
        let mut alone = vec![];
        let mut caches = vec![];
        for (p, n) in pre.iter().zip(&new) {
            let mut kv = lm.model.new_kv(32);
            let mut s = Scratch::default();
            if !p.is_empty() {
                let pos = seq_positions(0, p.len());
                let b = Batch {
                    tokens: p,
                    positions: &pos,
                    mask: None,
                };
                lm.model.forward(&mut kv, &b, &spec, &mut s).unwrap();
            }
            caches.push(kv.clone());
            let pos = seq_positions(p.len(), n.len());
            let b = Batch {
                tokens: n,
                positions: &pos,
                mask: None,
            };
            alone.push(
                lm.model
                    .forward(&mut kv, &b, &spec, &mut s)
                    .unwrap()
                    .clone(),
            );
        }
        let pos: Vec<_> = pre
            .iter()
            .zip(&new)
            .map(|(p, n)| seq_positions(p.len(), n.len()))
            .collect();
        let mut seqs: Vec<_> = caches
            .iter_mut()
            .zip(&new)
            .zip(&pos)
            .map(|((kv, n), pos)| {
                (
                    kv,
                    Batch {
                        tokens: n,
                        positions: pos,
                        mask: None,
                    },
                )
            })
            .collect();
        let mut s = Scratch::default();
        let out = lm.model.forward_multi(&mut seqs, &spec, &mut s).unwrap();
        let w = taps.len() * lm.model.config.hidden_size;
        let mut r = 0;
        for (i, a) in alone.iter().enumerate() {
            for j in 0..new[i].len() {
                assert_eq!(out.logits_row(r), a.logits_row(j), "{name} seq {i} row {j}");
                assert_eq!(
                    &out.hidden[r * w..(r + 1) * w],
                    &a.hidden[j * w..(j + 1) * w],
                    "{name} taps seq {i} row {j}"
                );
                r += 1;
            }
        }
        // The caches hold what each sequence's own forward wrote.
        for (i, kv) in caches.iter().enumerate() {
            assert_eq!(kv.len(), pre[i].len() + new[i].len());
        }
    }
}

#[test]
fn multi_sequence_forward_refuses_bad_input() {
    let lm = load_tiny("llama");
    let mut s = Scratch::default();
    let spec = OutputSpec::last_full();
    assert!(lm.model.forward_multi(&mut [], &spec, &mut s).is_err());
    let t = toks(4, 1, 10);
    let pos = seq_positions(0, 4);
    let mut small = lm.model.new_kv(2);
    let r = lm.model.forward_multi(
        &mut [(
            &mut small,
            Batch {
                tokens: &t,
                positions: &pos,
                mask: None,
            },
        )],
        &spec,
        &mut s,
    );
    assert!(r.is_err(), "a sequence that overflows its cache is refused");
    assert_eq!(small.len(), 0, "nothing written");
    // Caches of different element types cannot share a forward.
    let (mut a, mut b) = (lm.model.new_kv(8), lm.model.new_kv(8));
    let mut f32_model = load_tiny("llama");
    f32_model.model.set_kv_dtype(paradraft::kv::KvDtype::F32);
    let mut c = f32_model.model.new_kv(8);
    let batch = |t: &'static [TokenId]| Batch {
        tokens: t,
        positions: &[paradraft::types::Pos(0)],
        mask: None,
    };
    const ONE: [TokenId; 1] = [TokenId(1)];
    let mixed = lm.model.forward_multi(
        &mut [(&mut a, batch(&ONE)), (&mut c, batch(&ONE))],
        &spec,
        &mut s,
    );
    assert!(mixed.is_err(), "mixed KV element types are refused");
    let same = lm.model.forward_multi(
        &mut [(&mut a, batch(&ONE)), (&mut b, batch(&ONE))],
        &spec,
        &mut s,
    );
    assert!(same.is_ok());
}

fn single_stream(lm: &Loaded, prompt: &[TokenId], max_new: usize, ctx: usize) -> Vec<TokenId> {
    single_stream_sampled(lm, prompt, max_new, ctx, Default::default())
}

fn single_stream_sampled(
    lm: &Loaded,
    prompt: &[TokenId],
    max_new: usize,
    ctx: usize,
    sampling: SamplingParams,
) -> Vec<TokenId> {
    let mut kv = lm.model.new_kv(ctx);
    let p = GenerateParams {
        max_new_tokens: max_new,
        sampling,
        stop_strings: vec![],
        ..Default::default()
    };
    generate(&lm.model, &lm.tokenizer, &mut kv, prompt, &p, |_| {})
        .unwrap()
        .token_ids
}

fn check_batched_equals_single(lm: &Loaded, prompts: &[Vec<TokenId>], max_new: usize) {
    let ctx = prompts.iter().map(|p| p.len()).max().unwrap() + max_new + 1;
    let want: Vec<_> = prompts
        .iter()
        .map(|p| single_stream(lm, p, max_new, ctx))
        .collect();
    // Fewer slots than requests: later requests join as earlier ones finish, and their
    // prefills share forwards with the others' decode steps.
    let mut got = vec![None; prompts.len()];
    let reqs = prompts.iter().enumerate().map(|(i, p)| Request {
        id: i as u64,
        prompt: p.clone(),
        max_new_tokens: max_new - (i % 3) * 5,
        ..Default::default()
    });
    generate_batched(&lm.model, &lm.tokenizer, &[], reqs, 3, ctx, |f| {
        got[f.id as usize] = Some(f.tokens);
        Ok(())
    })
    .unwrap();
    for (i, w) in want.iter().enumerate() {
        let g = got[i].as_ref().expect("every request finishes");
        let n = max_new - (i % 3) * 5;
        assert_eq!(g[..], w[..w.len().min(n)], "request {i}");
    }
}

#[test]
fn batched_greedy_generation_equals_single_stream_tiny() {
    for name in ["llama", "qwen3"] {
        let lm = load_tiny(name);
        let v = lm.model.config.vocab_size;
        let prompts: Vec<_> = (0..7).map(|i| toks(3 + 2 * i, i as u32, v)).collect();
        check_batched_equals_single(&lm, &prompts, 20);
    }
}

/// Sampled requests (self-distillation at a temperature) in a batch give each request the
/// tokens its seed gives it alone, and different seeds give different samples.
#[test]
fn batched_sampling_equals_single_stream_with_the_same_seed() {
    let lm = load_tiny("llama");
    let v = lm.model.config.vocab_size;
    let prompts: Vec<_> = (0..6).map(|i| toks(3 + i, 5 + i as u32, v)).collect();
    let max_new = 24;
    let ctx = 64;
    let sampling = |i: usize| SamplingParams {
        temperature: 0.9,
        seed: 1000 + i as u64 % 3,
        ..Default::default()
    };
    let want: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| single_stream_sampled(&lm, p, max_new, ctx, sampling(i)))
        .collect();
    let greedy: Vec<_> = prompts
        .iter()
        .map(|p| single_stream(&lm, p, max_new, ctx))
        .collect();
    assert_ne!(want, greedy, "a temperature of 0.9 samples");
    let mut got = vec![None; prompts.len()];
    let reqs = prompts.iter().enumerate().map(|(i, p)| Request {
        id: i as u64,
        prompt: p.clone(),
        max_new_tokens: max_new,
        sampling: sampling(i),
    });
    generate_batched(&lm.model, &lm.tokenizer, &[], reqs, 4, ctx, |f| {
        got[f.id as usize] = Some(f.tokens);
        Ok(())
    })
    .unwrap();
    for (i, w) in want.iter().enumerate() {
        assert_eq!(got[i].as_ref(), Some(w), "request {i}");
    }
}

#[test]
fn batched_greedy_generation_equals_single_stream_smollm2() {
    let path = paradraft::fetch::ensure_default_model().expect("default model");
    let lm = paradraft::model::load(&path).unwrap();
    let texts = [
        "What is the capital of France?",
        "Write a Python function that reverses a list.",
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?",
        "Give me three tips for sleeping better.",
        "Explain recursion to a child.",
    ];
    let prompts: Vec<_> = texts
        .iter()
        .map(|t| {
            let s = lm
                .tokenizer
                .apply_chat_template(&[paradraft::model::Message::new("user", t)], true)
                .unwrap();
            lm.tokenizer.encode(&s).unwrap()
        })
        .collect();
    check_batched_equals_single(&lm, &prompts, 48);
}

#[test]
fn batch_generator_refuses_requests_it_cannot_hold() {
    let lm = load_tiny("llama");
    let mut g = BatchGenerator::new(&lm.model, &lm.tokenizer, 1, 8);
    let long = Request {
        id: 0,
        prompt: toks(8, 1, 10),
        max_new_tokens: 4,
        ..Default::default()
    };
    assert!(g.admit(long).is_err());
    let empty = Request {
        id: 1,
        prompt: vec![],
        max_new_tokens: 4,
        ..Default::default()
    };
    assert!(g.admit(empty).is_err());
    let ok = Request {
        id: 2,
        prompt: toks(3, 1, 10),
        max_new_tokens: 4,
        ..Default::default()
    };
    assert!(g.admit(ok.clone()).unwrap().is_none());
    // One slot only: the next request is handed back untouched.
    let back = g.admit(Request { id: 3, ..ok }).unwrap();
    assert_eq!(back.map(|r| r.id), Some(3));
    // A cache of 8 with a 3-token prompt ends on a full context.
    let mut done = vec![];
    while g.active() > 0 {
        done.extend(g.step().unwrap());
    }
    assert_eq!(done.len(), 1);
    assert!(done[0].tokens.len() <= 5);
}

#[test]
fn captured_features_equal_a_prefill_of_the_sample() {
    use paradraft::model::OutputSpec;
    for name in ["llama", "qwen3"] {
        let lm = load_tiny(name);
        let v = lm.model.config.vocab_size;
        let taps = vec![0, lm.model.config.n_layers - 1];
        let w = taps.len() * lm.model.config.hidden_size;
        let prompts: Vec<_> = (0..5).map(|i| toks(4 + 3 * i, 7 + i as u32, v)).collect();
        let reqs = prompts.iter().enumerate().map(|(i, p)| Request {
            id: i as u64,
            prompt: p.clone(),
            max_new_tokens: 12,
            ..Default::default()
        });
        let mut done = vec![];
        generate_batched(&lm.model, &lm.tokenizer, &taps, reqs, 2, 40, |f| {
            done.push(f);
            Ok(())
        })
        .unwrap();
        assert_eq!(done.len(), prompts.len());
        for f in &done {
            let seq: Vec<TokenId> = f.prompt.iter().chain(&f.tokens).copied().collect();
            let out = run_forward(
                &lm,
                &seq,
                &OutputSpec {
                    rows: Rows::Last,
                    logits: Logits::None,
                    taps: taps.clone(),
                },
            );
            // Every token went through the model but the last one of a token-budget stop
            // (after a stop token, the last kept token was fed to produce it).
            let fed = match f.stop_reason {
                paradraft::generate::StopReason::StopToken => seq.len(),
                _ => seq.len() - 1,
            };
            assert_eq!(f.features.len(), fed * w, "{name} {:?}", f.stop_reason);
            for (i, (a, b)) in f.features.iter().zip(&out.hidden).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    half::f16::from_f32(*b).to_bits(),
                    "{name} request {} value {i}",
                    f.id
                );
            }
        }
    }
}

/// Speculative sessions stepped together (`speculative::step`): one shared forward per step
/// over every live session's rows (prompt chunks of at most `prefill` tokens in all, and
/// [root, draft] rounds, each with its own cache and tree mask), greedy and sampled requests in
/// the same forward, requests joining while others decode.
fn stepped_sessions(
    lm: &Loaded,
    prompts: &[Vec<TokenId>],
    params: &[GenerateParams],
    prefill: usize,
) -> Vec<Vec<TokenId>> {
    use common::replay::{random_tree, Lcg, Replay};
    use paradraft::drafters::pld::PromptLookup;
    use paradraft::drafters::NoDraft;
    use paradraft::speculative::{Drafter, Session, Speculation, VerifyRule};
    let vocab = lm.model.config.vocab_size as u32;
    let mut kvs: Vec<_> = prompts.iter().map(|_| lm.model.new_kv(256)).collect();
    let mut sessions: Vec<Session> = prompts
        .iter()
        .zip(kvs.iter_mut())
        .zip(params)
        .enumerate()
        .map(|(i, ((p, kv), params))| {
            let drafter: Box<dyn Drafter> = match i % 3 {
                0 => Box::new(PromptLookup::default()),
                1 => {
                    let mut rng = Lcg(i as u64 + 1);
                    Box::new(Replay::new(move |_: &[TokenId], max: usize| {
                        random_tree(&mut rng, &[], vocab.min(40), max)
                    }))
                }
                _ => Box::new(NoDraft),
            };
            let sp = Speculation {
                drafter,
                max_draft: 6,
                sizer: None,
                rule: VerifyRule::Coupled,
            };
            Session::new(&lm.tokenizer, kv, p, params, sp, &lm.model.config).unwrap()
        })
        .collect();
    // Request i joins at step 2·i.
    common::stepping::step_all(&lm.model, &mut kvs, &mut sessions, prefill, |i| 2 * i);
    sessions
        .into_iter()
        .map(|s| s.finish(&mut |_| {}).out.token_ids)
        .collect()
}

/// Request `i` of a mixed batch: greedy when `i` is even, sampled at `temperature` when odd,
/// seeded `seed + i`.
fn alternating(
    i: usize,
    max_new_tokens: usize,
    temperature: f32,
    seed: u64,
    processing: paradraft::process::Processing,
) -> GenerateParams {
    GenerateParams {
        max_new_tokens,
        sampling: SamplingParams {
            temperature: if i.is_multiple_of(2) {
                0.0
            } else {
                temperature
            },
            seed: seed + i as u64,
            ..Default::default()
        },
        processing,
        stop_strings: vec![],
    }
}

#[test]
fn speculative_sessions_share_one_forward() {
    for (lm, name) in [(load_tiny("qwen3"), "qwen3"), (load_tiny("llama"), "llama")] {
        let v = lm.model.config.vocab_size;
        let prompts: Vec<Vec<TokenId>> = (0..6).map(|i| toks(6 + 3 * i, i as u32 + 1, v)).collect();
        // Greedy and sampled requests in the same forwards.
        let params: Vec<GenerateParams> = (0..prompts.len())
            .map(|i| alternating(i, 24, 0.8, 5, Default::default()))
            .collect();
        for prefill in [usize::MAX, 7] {
            let got = stepped_sessions(&lm, &prompts, &params, prefill);
            for ((p, g), params) in prompts.iter().zip(&got).zip(&params) {
                let mut kv = lm.model.new_kv(256);
                let ar = generate(&lm.model, &lm.tokenizer, &mut kv, p, params, |_| {}).unwrap();
                assert_eq!(
                    g, &ar.token_ids,
                    "{name}, T = {}, prefill chunks of {prefill}",
                    params.sampling.temperature
                );
            }
        }
    }
}

/// A greedy session with a grammar and no log-probabilities takes its rows from the 4-bit
/// screen when it is alone (`Logits::Screened`) and exact full rows when a sampled session
/// shares the forward; its choices are re-scored exactly either way, so its tokens are the
/// same batched as alone.
#[test]
fn grammar_rows_choose_alike_screened_or_exact() {
    use paradraft::grammar::Grammar;
    use paradraft::process::Processing;
    let lm = load_tiny("qwen3");
    let v = lm.model.config.vocab_size;
    let prompts: Vec<Vec<TokenId>> = (0..6).map(|i| toks(5 + 2 * i, i as u32 + 11, v)).collect();
    let params: Vec<GenerateParams> = (0..prompts.len())
        .map(|i| {
            let grammar = (i % 2 == 0).then_some(Grammar::JsonObject);
            alternating(
                i,
                20,
                0.9,
                3,
                Processing {
                    grammar,
                    ..Default::default()
                },
            )
        })
        .collect();
    let got = stepped_sessions(&lm, &prompts, &params, usize::MAX);
    for (i, ((p, g), params)) in prompts.iter().zip(&got).zip(&params).enumerate() {
        let mut kv = lm.model.new_kv(256);
        let ar = generate(&lm.model, &lm.tokenizer, &mut kv, p, params, |_| {}).unwrap();
        assert_eq!(g, &ar.token_ids, "session {i}");
    }
}
