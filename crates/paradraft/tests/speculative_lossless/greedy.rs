//! Greedy decoding: token-identical to AR on the tiny models and on SmolLM2.

use super::*;

/// AR greedy, then each drafter (the built-in ones, `auto`'s and `extra`); all outputs must
/// be identical, and so must their log-probabilities when `params` asks for them.
fn check_greedy(
    lm: &Loaded,
    prompt: &[TokenId],
    params: &GenerateParams,
    seed: u64,
    extra: &mut dyn Drafter,
    auto: &DrafterSet,
) -> f64 {
    let max_new = params.max_new_tokens;
    let mut kv = lm.model.new_kv(prompt.len() + max_new + 40);
    let ar = generate(&lm.model, &lm.tokenizer, &mut kv, prompt, params, |_| {}).unwrap();
    let truth = ar.token_ids.clone();
    let vocab = lm.model.config.vocab_size as u32;
    let n0 = prompt.len();
    let mut pld = PromptLookup::default();
    let mut rng = Lcg(seed);
    let mut trees = Replay::new(|c: &[TokenId], max: usize| {
        let done = c.len() - n0; // committed output tokens, the root included
        random_tree(&mut rng, truth.get(done..).unwrap_or(&[]), vocab, max)
    });
    let mut chain = Replay::new(|c: &[TokenId], max: usize| {
        let done = c.len() - n0;
        DraftTree::chain(
            &truth.get(done..).unwrap_or(&[])[..(truth.len().saturating_sub(done)).min(max).min(5)],
        )
    });
    let mut auto = auto.create(SamplingParams::default()).unwrap();
    let drafters: [&mut dyn Drafter; 5] = [&mut pld, &mut trees, &mut chain, extra, auto.as_mut()];
    let mut tau = 0.0f64;
    for d in drafters {
        let name = d.name().to_string();
        let sp = speculative_generate(
            &lm.model,
            &lm.tokenizer,
            &mut kv,
            prompt,
            params,
            Speculation {
                drafter: Box::new(d),
                max_draft: 12,
                sizer: None,
                rule: Default::default(),
            },
            |_| {},
        )
        .unwrap();
        assert_eq!(
            sp.out.token_ids, ar.token_ids,
            "{name}: greedy output differs"
        );
        assert_eq!(sp.out.stop_reason, ar.stop_reason, "{name}");
        assert_eq!(sp.out.text, ar.text, "{name}");
        assert_eq!(
            sp.out.logprobs, ar.logprobs,
            "{name}: log-probabilities differ"
        );
        if name == "replay" {
            tau = tau.max(sp.tau);
        }
    }
    // Adaptive sizing only changes how much is drafted, never what is committed.
    let curve = CostCurve {
        points: vec![
            (1, 5.0),
            (2, 5.3),
            (4, 6.0),
            (8, 8.0),
            (16, 13.0),
            (32, 25.0),
        ],
    };
    let sizer = Sizer::new(curve);
    let mut pld = PromptLookup::default();
    let sp = speculative_generate(
        &lm.model,
        &lm.tokenizer,
        &mut kv,
        prompt,
        params,
        Speculation {
            drafter: Box::new(&mut pld),
            max_draft: 12,
            sizer: Some(sizer),
            rule: Default::default(),
        },
        |_| {},
    )
    .unwrap();
    assert_eq!(sp.out.token_ids, ar.token_ids, "pld with adaptive sizing");
    tau
}

#[test]
fn greedy_is_token_identical_on_tiny_models() {
    one_thread();
    let ps = prompts();
    assert!(ps.len() >= 200);
    let paths = [
        "tiny/llama",
        "tiny/qwen2",
        "tiny/qwen3",
        "tiny/llama-quant.gguf",
        "quants/tiny-kquant.gguf",
        // Sliding-window layers (window 8) under trees and chains far longer than the window,
        // and fused projections: every third prompt (≥ 67 each).
        "tiny/gemma3",
        "tiny/gemma3.gguf",
        "tiny/gemma2.gguf",
        "tiny/phi3.gguf",
        "tiny/phi3-longrope.gguf",
        "tiny/phi4-mini",
        "tiny/qwen2-window",
        // Mixtures of experts: a token's experts do not depend on its batch or tree.
        "tiny/qwen3moe",
        "tiny/mixtral.gguf",
        "tiny/qwen2moe.gguf",
        "quants/tiny-moe-kquant.gguf",
    ]
    .map(|p| fixtures().join(p));
    for (m, path) in paths.iter().enumerate() {
        let stride = if m < 5 { 1 } else { 3 };
        let lm = model::load(path).unwrap();
        let mut sd = self_draft(path, &lm, 1, SamplingParams::default());
        // Prompt lookup, a suffix cache that fills with the earlier prompts' text and the
        // candidates recycled from every verify forward.
        let auto = auto(path, &lm, &["pld", "suffix", "recycle"], 160, |_| {});
        for (i, p) in ps.iter().enumerate().step_by(stride) {
            let ids = encode(&lm, p, 96);
            check_greedy(
                &lm,
                &ids,
                &greedy(24),
                (m * 1000 + i) as u64,
                &mut sd,
                &auto,
            );
        }
    }
}

#[test]
fn greedy_is_token_identical_on_smollm2() {
    one_thread();
    let path = paradraft::fetch::ensure_default_model().unwrap();
    let lm = model::load(&path).unwrap();
    let mut sd = self_draft(&path, &lm, 8, SamplingParams::default());
    // Every default source: prompt lookup, the suffix cache, the trie, the committed DART.
    let defaults = DrafterConfig::default().sources;
    let sources: Vec<&str> = defaults.iter().map(|s| s.as_str()).collect();
    let auto = auto(&path, &lm, &sources, 340, |_| {});
    let ps = prompts();
    let mut taus = vec![];
    for i in (0..ps.len()).step_by(21) {
        let ids = encode(&lm, &ps[i], 256);
        taus.push(check_greedy(
            &lm,
            &ids,
            &greedy(40),
            i as u64,
            &mut sd,
            &auto,
        ));
    }
    eprintln!("{}", auto.report().unwrap_or_default());
    // The chain drafter follows the true continuation, so it must be accepted in full.
    assert!(taus.iter().all(|&t| t > 2.0), "{taus:?}");
}

/// With a q8_0 KV cache (#64) every drafter still commits AR's tokens (AR on the same cache
/// type): a slot's int8 blocks and scales depend on its own K/V row alone, so chains, trees and
/// compaction read what token-by-token decoding reads. Tiny Llama (head size 16, one short
/// block) and SmolLM2 (64, two blocks).
#[test]
fn greedy_with_a_q8_0_kv_cache_is_token_identical() {
    one_thread();
    let ps = prompts();
    let tiny = fixtures().join("tiny/llama");
    let smollm2 = paradraft::fetch::ensure_default_model().unwrap();
    for (path, layers, stride, len) in [(tiny, 1, 9, 96), (smollm2, 8, 29, 256)] {
        let mut lm = model::load(&path).unwrap();
        lm.model.set_kv_dtype(paradraft::kv::KvDtype::Q8_0);
        let mut sd = self_draft(&path, &lm, layers, SamplingParams::default());
        let auto = auto(&path, &lm, &["pld", "suffix", "recycle"], 340, |_| {});
        for (i, p) in ps.iter().enumerate().step_by(stride) {
            let ids = encode(&lm, p, len);
            check_greedy(&lm, &ids, &greedy(24), i as u64, &mut sd, &auto);
        }
    }
}

/// Greedy decoding with a bias, the three penalties and log-probabilities (#61): each row of a
/// verify forward processed over its own path, so every drafter still commits AR's tokens, and
/// reports AR's log-probabilities, on the tiny models and on SmolLM2.
#[test]
fn greedy_with_bias_penalties_and_logprobs_is_token_identical() {
    one_thread();
    let ps = prompts();
    let processed = |lm: &Loaded, max_new: usize, seed: u64| {
        let v = lm.model.config.vocab_size as u64;
        GenerateParams {
            processing: Processing {
                logit_bias: vec![
                    (TokenId((seed * 31 % v) as u32), 4.0),
                    (TokenId(((seed * 7 + 3) % v) as u32), -100.0),
                ],
                presence_penalty: 0.8,
                frequency_penalty: 0.4,
                repetition_penalty: 1.15,
                // Without log-probabilities the verify rows come from the 4-bit screen
                // (`Logits::Screened`), each row's choice re-scored exactly.
                logprobs: seed.is_multiple_of(2).then_some(2),
                grammar: None,
            },
            ..greedy(max_new)
        }
    };
    let tiny = ["tiny/qwen3", "tiny/llama-quant.gguf", "tiny/gemma3.gguf"];
    for (m, path) in tiny.iter().map(|p| fixtures().join(p)).enumerate() {
        let lm = model::load(&path).unwrap();
        let mut sd = self_draft(&path, &lm, 1, SamplingParams::default());
        let auto = auto(&path, &lm, &["pld", "suffix", "recycle"], 160, |_| {});
        for (i, p) in ps.iter().enumerate().step_by(9) {
            let ids = encode(&lm, p, 96);
            let seed = (m * 1000 + i) as u64;
            check_greedy(&lm, &ids, &processed(&lm, 24, seed), seed, &mut sd, &auto);
        }
    }
    let path = paradraft::fetch::ensure_default_model().unwrap();
    let lm = model::load(&path).unwrap();
    let mut sd = self_draft(&path, &lm, 8, SamplingParams::default());
    let defaults = DrafterConfig::default().sources;
    let sources: Vec<&str> = defaults.iter().map(|s| s.as_str()).collect();
    let auto = auto(&path, &lm, &sources, 340, |_| {});
    for i in (0..ps.len()).step_by(42) {
        let ids = encode(&lm, &ps[i], 256);
        let params = processed(&lm, 40, i as u64);
        check_greedy(&lm, &ids, &params, i as u64, &mut sd, &auto);
    }
}

/// The grammars the structured-output tests run: any JSON object, a schema, a regex and a Lark
/// grammar.
fn grammars() -> Vec<Grammar> {
    vec![
        Grammar::JsonObject,
        Grammar::JsonSchema(serde_json::json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            },
            "required": ["name", "age"],
            "additionalProperties": false,
        })),
        Grammar::Regex("[A-Za-z ,]{1,60}\\.".into()),
        Grammar::Lark("start: item (\", \" item)*\nitem: /[a-z]+/ | /[0-9]{1,3}/".into()),
    ]
}

/// Structured output (#61): every verify row masked after its own draft path, so with a
/// grammar every drafter still commits AR's tokens — greedy on SmolLM2 (byte-level BPE) and on
/// tiny models with byte-level and SentencePiece vocabularies.
#[test]
fn greedy_with_a_grammar_is_token_identical() {
    one_thread();
    let ps = prompts();
    // With log-probabilities the rows are exact full rows; without, greedy rows come from
    // the 4-bit screen (`Logits::Screened`) and each choice is re-scored exactly.
    let with_logprobs = |g: &Grammar, max_new: usize, logprobs: Option<usize>| GenerateParams {
        processing: Processing {
            grammar: Some(g.clone()),
            logprobs,
            ..Default::default()
        },
        ..greedy(max_new)
    };
    let with = |g: &Grammar, max_new: usize| with_logprobs(g, max_new, Some(1));
    for path in ["tiny/qwen3", "tiny/gemma3.gguf", "tiny/phi3.gguf"].map(|p| fixtures().join(p)) {
        let lm = model::load(&path).unwrap();
        let mut sd = self_draft(&path, &lm, 1, SamplingParams::default());
        let auto = auto(&path, &lm, &["pld", "suffix", "recycle"], 160, |_| {});
        for (i, p) in ps.iter().enumerate().step_by(23) {
            let g = &grammars()[i % 4];
            let ids = encode(&lm, p, 96);
            check_greedy(&lm, &ids, &with(g, 24), i as u64, &mut sd, &auto);
        }
    }
    let path = paradraft::fetch::ensure_default_model().unwrap();
    let lm = model::load(&path).unwrap();
    let mut sd = self_draft(&path, &lm, 8, SamplingParams::default());
    let defaults = DrafterConfig::default().sources;
    let sources: Vec<&str> = defaults.iter().map(|s| s.as_str()).collect();
    let auto = auto(&path, &lm, &sources, 340, |_| {});
    for (k, i) in (0..ps.len()).step_by(35).enumerate() {
        let g = &grammars()[k % 4];
        let ids = encode(&lm, &ps[i], 256);
        check_greedy(&lm, &ids, &with(g, 48), i as u64, &mut sd, &auto);
        // Without log-probabilities: rows from the 4-bit screen, choices re-scored exactly;
        // the same choices as with them (exact full rows, masked whole).
        let screened = with_logprobs(g, 48, None);
        check_greedy(&lm, &ids, &screened, i as u64, &mut sd, &auto);
        let tokens = |params: &GenerateParams| {
            let mut kv = lm.model.new_kv(ids.len() + 100);
            let out = generate(&lm.model, &lm.tokenizer, &mut kv, &ids, params, |_| {});
            out.unwrap().token_ids
        };
        assert_eq!(
            tokens(&screened),
            tokens(&with(g, 48)),
            "prompt {i}, grammar {}",
            k % 4
        );
    }
}

/// With a grammar at T > 0, the coupled rule still gives AR's own tokens for every seed, for
/// random trees (mostly tokens the grammar forbids), prompt lookup and `auto`.
#[test]
fn sampling_with_a_grammar_keeps_the_coupled_identity() {
    one_thread();
    let lm = load_tiny("qwen3");
    let path = fixtures().join("tiny/qwen3");
    let auto_set = auto(&path, &lm, &["pld", "suffix", "recycle"], 160, |_| {});
    let prompt = encode(&lm, "Describe a person as JSON.", 64);
    let vocab = lm.model.config.vocab_size as u32;
    let mut kv = lm.model.new_kv(160);
    for (gi, g) in grammars().iter().enumerate() {
        for seed in 0..60u64 {
            let params = GenerateParams {
                max_new_tokens: 20,
                sampling: SamplingParams {
                    temperature: 0.9,
                    top_k: 40,
                    seed,
                    ..Default::default()
                },
                stop_strings: vec![],
                processing: Processing {
                    grammar: Some(g.clone()),
                    ..Default::default()
                },
            };
            let ar = generate(&lm.model, &lm.tokenizer, &mut kv, &prompt, &params, |_| {}).unwrap();
            let mut rng = Lcg(seed * 31 + gi as u64);
            let mut trees = Replay::new(move |_: &[TokenId], max: usize| {
                random_tree(&mut rng, &[], vocab, max)
            });
            let mut pld = PromptLookup::default();
            let mut au = auto_set.create(params.sampling).unwrap();
            let drafters: [&mut dyn Drafter; 3] = [&mut trees, &mut pld, au.as_mut()];
            for d in drafters {
                let name = d.name().to_string();
                let sp = speculative_generate(
                    &lm.model,
                    &lm.tokenizer,
                    &mut kv,
                    &prompt,
                    &params,
                    Speculation {
                        drafter: Box::new(d),
                        max_draft: 8,
                        sizer: None,
                        rule: VerifyRule::Coupled,
                    },
                    |_| {},
                )
                .unwrap();
                assert_eq!(sp.out.token_ids, ar.token_ids, "{name}, {g:?}, seed {seed}");
            }
        }
    }
}
