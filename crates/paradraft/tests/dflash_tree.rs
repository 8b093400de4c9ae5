//! DFlash-tree: the DFlash block's per-slot distributions searched into a tree by DART's
//! continuity-aware pruning (with and without an n-gram trie) verify losslessly — token-identical
//! to AR greedy on the tiny model and on SmolLM2 with the committed drafter — and the trees
//! commit more tokens per target pass than the block's chain.

mod common;

use common::load_tiny;
use paradraft::drafters::dflash::{Dflash, DflashModel};
use paradraft::drafters::parts::{BlockDrafter, Selection};
use paradraft::generate::{generate, GenerateParams};
use paradraft::model::Loaded;
use paradraft::ngram::{self, NgramTrie, TrieBuilder};
use paradraft::sample::SamplingParams;
use paradraft::speculative::tree_search::{TreeDrafting, TreeSearchParams};
use paradraft::speculative::{speculative_generate, SpecGeneration, Speculation};
use paradraft::types::TokenId;
use std::sync::Arc;

fn greedy(max_new_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_new_tokens,
        sampling: SamplingParams::default(),
        stop_strings: vec![],
        ..Default::default()
    }
}

fn tiny_trie(lm: &Loaded) -> Arc<NgramTrie> {
    let mut b = TrieBuilder::new(3).unwrap();
    for text in [
        "the quick brown fox jumps over the lazy dog",
        "the lazy dog sleeps and the quick fox runs over the hill",
        "over the hill and far away the brown fox jumps",
    ] {
        b.add_document(&lm.tokenizer.encode(text).unwrap());
    }
    Arc::new(b.finish(ngram::stamp_of(&lm.tokenizer)).unwrap())
}

fn run(
    lm: &Loaded,
    d: &mut Dflash,
    prompt: &[TokenId],
    params: &GenerateParams,
    budget: usize,
    ctx: usize,
) -> SpecGeneration {
    let mut kv = lm.model.new_kv(ctx);
    speculative_generate(
        &lm.model,
        &lm.tokenizer,
        &mut kv,
        prompt,
        params,
        Speculation {
            drafter: Box::new(d),
            max_draft: budget,
            sizer: None,
            rule: Default::default(),
        },
        |_| {},
    )
    .unwrap()
}

#[test]
fn dflash_tree_is_token_identical_to_ar_on_the_tiny_model() {
    let lm = load_tiny("qwen3");
    let cfg = common::tiny_dflash_config(&lm, 1, &[0, 2], 6);
    let dir = common::tiny_dflash_dir(&lm, &cfg, true);
    let params = greedy(40);
    let trie = tiny_trie(&lm);
    let mut trees = 0;
    for text in ["the quick brown fox jumps over", "over the hill", "a"] {
        let prompt = lm.tokenizer.encode(text).unwrap();
        let mut kv = lm.model.new_kv(200);
        let ar = generate(&lm.model, &lm.tokenizer, &mut kv, &prompt, &params, |_| {}).unwrap();
        for ng in [None, Some(trie.clone())] {
            for budget in [1, 3, 12, 40] {
                let m = DflashModel::load(dir.path()).unwrap();
                let stop = lm.tokenizer.stop_tokens.iter().copied().collect();
                let tree = TreeDrafting::new(TreeSearchParams::default(), ng.clone(), stop);
                let mut d = Dflash::new(m, &lm.model, 200, None, params.sampling)
                    .unwrap()
                    .with_selection(Selection::Tree(tree));
                let sp = run(&lm, &mut d, &prompt, &params, budget, 200);
                assert_eq!(
                    sp.out.token_ids,
                    ar.token_ids,
                    "{text:?}, budget {budget}, n-gram {}",
                    ng.is_some()
                );
                assert!(sp.rounds.iter().all(|r| r.drafted <= budget));
                trees += sp.rounds.iter().filter(|r| r.drafted > 5).count();
            }
        }
    }
    // block 6 drafts at most 5 deep: more nodes than that means branching trees were verified
    assert!(trees > 0, "no branching tree was ever proposed");
}

#[test]
fn dflash_tree_on_smollm2_is_lossless_and_beats_the_chain() {
    let (lm, trie, prompts) = common::smollm2_with_trie_and_prompts();
    let drafter = common::committed_drafter("smollm2-135m-dflash");
    let params = greedy(48);
    let (mut chain, mut tree) = ((0usize, 0usize), (0usize, 0usize));
    for (id, prompt) in &prompts {
        let mut kv = lm.model.new_kv(1024);
        let ar = generate(&lm.model, &lm.tokenizer, &mut kv, prompt, &params, |_| {}).unwrap();
        for with_tree in [false, true] {
            let m = DflashModel::load(&drafter).unwrap();
            let selection = if with_tree {
                let stop = lm.tokenizer.stop_tokens.iter().copied().collect();
                Selection::Tree(TreeDrafting::new(
                    TreeSearchParams::default(),
                    Some(trie.clone()),
                    stop,
                ))
            } else {
                Selection::Greedy
            };
            let mut d = Dflash::new(m, &lm.model, 1024, None, params.sampling)
                .unwrap()
                .with_selection(selection);
            let sp = run(&lm, &mut d, prompt, &params, 24, 1024);
            assert_eq!(sp.out.token_ids, ar.token_ids, "{id} tree={with_tree}");
            let acc = if with_tree { &mut tree } else { &mut chain };
            acc.0 += sp.rounds.len();
            acc.1 += sp.rounds.iter().map(|r| r.accepted + 1).sum::<usize>();
        }
    }
    let tau = |(r, c): (usize, usize)| c as f64 / r as f64;
    eprintln!("τ chain {:.3}, tree {:.3}", tau(chain), tau(tree));
    // Deterministic at T = 0: the 24-node trees must commit more per pass than the chain.
    assert!(
        tau(tree) > tau(chain) + 0.2,
        "τ chain {:.3}, tree {:.3}",
        tau(chain),
        tau(tree)
    );
}
