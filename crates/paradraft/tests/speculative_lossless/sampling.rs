//! Sampling: AR's first token follows the target's softmax; the coupled and rejection rules give AR's distribution.

use super::*;

/// Proposes a chain of `len` tokens sampled from a fixed q (over a few ids), attaching q.
struct QChain {
    q: paradraft::sample::Dist,
    rng: Lcg,
    len: usize,
}

impl Drafter for QChain {
    fn name(&self) -> &str {
        "q-chain"
    }
    fn begin(&mut self, _: &[TokenId], _: Hidden) -> paradraft::Result<()> {
        Ok(())
    }
    fn propose(&mut self, _: &[TokenId], max: usize) -> paradraft::Result<DraftTree> {
        let mut t = DraftTree::new();
        let mut parent = None;
        for _ in 0..self.len.min(max) {
            let u = self.rng.next_u32() as f32 / (1u64 << 31) as f32; // next_u32 gives 31 bits
            let mut acc = 0.0;
            let mut x = self.q.entries[0].0;
            for &(tok, p) in &self.q.entries {
                acc += p;
                if u < acc {
                    x = tok;
                    break;
                }
            }
            parent = Some(t.push(parent, x, Some(self.q.clone()))?);
        }
        Ok(t)
    }
    fn observe(&mut self, _: &paradraft::speculative::Outcome, _: Hidden) -> paradraft::Result<()> {
        Ok(())
    }
}

thread_local! {
    /// The seed of the request `spec_ids` runs next (what `PerRequest` makes its drafter with).
    static REQUEST_SEED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A drafter made afresh for each request with that request's sampling (its seed), as the
/// engine makes them (`DrafterSet::create`): drafts sampled with the request's noise vary from
/// seed to seed, so the χ² test sees the rule applied to drafts drawn from q, not to one fixed
/// draft per context.
struct PerRequest<'a> {
    make: Box<dyn Fn(u64) -> Box<dyn Drafter + 'a> + 'a>,
    inner: Box<dyn Drafter + 'a>,
}

impl<'a> PerRequest<'a> {
    fn new(make: impl Fn(u64) -> Box<dyn Drafter + 'a> + 'a) -> Self {
        let inner = make(0);
        PerRequest {
            make: Box::new(make),
            inner,
        }
    }
}

impl Drafter for PerRequest<'_> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn taps(&self) -> &[usize] {
        self.inner.taps()
    }
    fn begin(
        &mut self,
        prompt: &[TokenId],
        hidden: paradraft::speculative::Hidden,
    ) -> paradraft::error::Result<()> {
        self.inner = (self.make)(REQUEST_SEED.with(|s| s.get()));
        self.inner.begin(prompt, hidden)
    }
    fn propose(
        &mut self,
        committed: &[TokenId],
        max: usize,
    ) -> paradraft::error::Result<paradraft::speculative::DraftTree> {
        self.inner.propose(committed, max)
    }
    fn observe(
        &mut self,
        o: &paradraft::speculative::Outcome,
        hidden: paradraft::speculative::Hidden,
    ) -> paradraft::error::Result<()> {
        self.inner.observe(o, hidden)
    }
    fn node_confidence(&self) -> Option<&[f32]> {
        self.inner.node_confidence()
    }
    fn selection_ms(&self) -> f64 {
        self.inner.selection_ms()
    }
    fn candidates(&self) -> usize {
        self.inner.candidates()
    }
}

/// Two-sample chi-square statistic over categories with enough mass; returns (χ², dof).
fn chi_square(
    a: &std::collections::HashMap<u32, usize>,
    b: &std::collections::HashMap<u32, usize>,
    na: usize,
    nb: usize,
) -> (f64, usize) {
    let mut keys: Vec<u32> = a.keys().chain(b.keys()).copied().collect();
    keys.sort();
    keys.dedup();
    let (mut chi, mut dof) = (0.0, 0usize);
    let (mut ra, mut rb) = (0usize, 0usize); // pooled rare categories
    let mut add = |x: usize, y: usize| {
        let (x, y) = (x as f64, y as f64);
        let (na, nb) = (na as f64, nb as f64);
        let ea = (x + y) * na / (na + nb);
        let eb = (x + y) * nb / (na + nb);
        chi += (x - ea).powi(2) / ea + (y - eb).powi(2) / eb;
        dof += 1;
    };
    for k in keys {
        let (x, y) = (*a.get(&k).unwrap_or(&0), *b.get(&k).unwrap_or(&0));
        if x + y < 40 {
            ra += x;
            rb += y;
        } else {
            add(x, y);
        }
    }
    if ra + rb > 0 {
        add(ra, rb);
    }
    (chi, dof.saturating_sub(1))
}

/// Upper 0.1 % point of χ² with `dof` degrees of freedom (Wilson–Hilferty).
fn chi_crit(dof: usize) -> f64 {
    let k = dof.max(1) as f64;
    let z = 3.09;
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

/// The drafters of the χ² check, in three groups so that the cores share the work (each test
/// samples its own AR reference; the groups take about the same time).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Group {
    /// Drafts of known q (random trees, q chains), and AR itself against the softmax.
    Known,
    /// `auto`, DiffuSpec and DART.
    AutoDiffuSpecDart,
    /// PARD and DFlash.
    PardDflash,
}

#[test]
fn sampling_matches_ar_distribution() {
    check_sampling(Group::Known);
}

#[test]
fn sampling_matches_ar_distribution_auto_diffuspec_dart() {
    check_sampling(Group::AutoDiffuSpecDart);
}

#[test]
fn sampling_matches_ar_distribution_pard_dflash() {
    check_sampling(Group::PardDflash);
}

/// Under the coupled rule every drafter of `group` gives AR's own tokens for 1,000 seeds;
/// under the rejection rule the first three tokens of 12,000 seeds follow AR's distribution
/// (two-sample χ² at p = 0.001 per token). The sampler truncates by top-k and min-p (#61:
/// min-p while speculating, which vLLM refuses).
fn check_sampling(group: Group) {
    use std::collections::HashMap;
    one_thread();
    let t_start = std::time::Instant::now();
    let lm = load_tiny("qwen3");
    let prompt = encode(&lm, "Tell me a story about the sea.", 64);
    let n = 12_000;
    let sampling = |seed| SamplingParams {
        temperature: 1.0,
        top_k: 12,
        top_p: 1.0,
        min_p: 0.02,
        seed,
    };
    let mut kv = lm.model.new_kv(128);
    let count = |runs: &mut dyn FnMut(u64) -> Vec<TokenId>| {
        let mut hist: Vec<HashMap<u32, usize>> = vec![HashMap::new(); 3];
        for seed in 0..n as u64 {
            let ids = runs(seed);
            for (pos, h) in hist.iter_mut().enumerate() {
                *h.entry(ids.get(pos).map_or(u32::MAX, |t| t.0)).or_default() += 1;
            }
        }
        hist
    };
    // Presence and frequency penalties (#61): the second and third tokens' distributions depend
    // on the path before them, which every verify row must take from its own node; they leave
    // the first token's distribution alone (checked against the softmax below).
    let params = |seed| GenerateParams {
        max_new_tokens: 3,
        sampling: sampling(seed),
        stop_strings: vec![],
        processing: Processing {
            presence_penalty: 1.0,
            frequency_penalty: 0.5,
            logprobs: Some(2),
            ..Default::default()
        },
    };
    let mut ar_ids = Vec::new();
    let ar = count(&mut |seed| {
        let g = generate(
            &lm.model,
            &lm.tokenizer,
            &mut kv,
            &prompt,
            &params(seed),
            |_| {},
        )
        .unwrap();
        ar_ids.push((g.token_ids.clone(), g.logprobs));
        g.token_ids
    });
    // AR sampling itself follows the target: its first token against the exact top-12
    // softmax of the prompt's logits.
    if group == Group::Known {
        let mut scratch = paradraft::model::Scratch::default();
        kv.clear();
        let out = lm
            .model
            .forward(
                &mut kv,
                &paradraft::model::Batch {
                    tokens: &prompt,
                    positions: &seq_positions(0, prompt.len()),
                    mask: None,
                },
                &paradraft::model::OutputSpec::last_full(),
                &mut scratch,
            )
            .unwrap();
        let p = paradraft::sample::Sampler::new(sampling(0))
            .unwrap()
            .dist(out.logits_row(0));
        let (mut chi, mut dof) = (0.0, 0usize);
        for &(t, pt) in &p.entries {
            let e = pt as f64 * n as f64;
            if e >= 5.0 {
                let o = *ar[0].get(&t.0).unwrap_or(&0) as f64;
                chi += (o - e).powi(2) / e;
                dof += 1;
            }
        }
        let dof = dof.saturating_sub(1);
        assert!(
            chi < chi_crit(dof),
            "AR first token vs softmax: χ² = {chi:.1} with {dof} dof"
        );
    }
    // T > 0 must sample: many distinct first tokens, not one greedy answer.
    assert!(ar[0].len() > 3, "AR sampling looks greedy: {:?}", ar[0]);
    let vocab = lm.model.config.vocab_size as u32;
    let top: Vec<TokenId> = {
        let mut v: Vec<(u32, usize)> = ar[1].iter().map(|(k, c)| (*k, *c)).collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.1));
        v.iter().take(6).map(|e| TokenId(e.0)).collect()
    };
    let q = paradraft::sample::Dist {
        entries: top
            .iter()
            .enumerate()
            .map(|(i, &t)| (t, [0.4, 0.2, 0.15, 0.1, 0.1, 0.05][i]))
            .collect(),
    };
    // DFlash drafts (an untrained drafter over a reduced vocabulary): greedy drafts checked by
    // the one-hot rule, sampled drafts by the known-q rule.
    let dflash_dir =
        common::tiny_dflash_dir(&lm, &common::tiny_dflash_config(&lm, 1, &[0, 2], 4), true);
    let dflash_model = std::sync::Arc::new(DflashModel::load(dflash_dir.path()).unwrap());
    let dflash = |mode: fn() -> Selection| -> Box<dyn Drafter + '_> {
        let (m, lm) = (dflash_model.clone(), &lm);
        Box::new(PerRequest::new(move |seed| {
            let d = Dflash::new(m.clone(), &lm.model, 128, None, sampling(seed)).unwrap();
            Box::new(d.with_selection(mode()))
        }))
    };
    // DFlash-tree: deterministic searched trees (one-hot q over siblings), n-gram scored.
    let trie = {
        let mut b = paradraft::ngram::TrieBuilder::new(3).unwrap();
        b.add_document(&encode(
            &lm,
            "Tell me a story about the sea and the ships on it.",
            64,
        ));
        std::sync::Arc::new(b.finish(paradraft::ngram::stamp_of(&lm.tokenizer)).unwrap())
    };
    let dflash_tree = {
        let m = DflashModel::load(dflash_dir.path()).unwrap();
        let d = Dflash::new(m, &lm.model, 128, None, sampling(7)).unwrap();
        let tree = paradraft::speculative::tree_search::TreeDrafting::new(
            Default::default(),
            Some(trie.clone()),
            lm.tokenizer.stop_tokens.iter().copied().collect(),
        );
        Box::new(d.with_selection(Selection::Tree(tree))) as Box<dyn Drafter + '_>
    };
    let dflash_trie = Some(trie);
    // DART: deterministic searched trees over its shifted slots, n-gram scored.
    let dart_dir = common::tiny_dart_dir(&lm, 3, 5);
    let dart = {
        let (m, head) = paradraft::drafters::dart::DartModel::load(dart_dir.path(), true).unwrap();
        let td = paradraft::speculative::tree_search::TreeDrafting::new(
            Default::default(),
            dflash_trie.clone(),
            lm.tokenizer.stop_tokens.iter().copied().collect(),
        );
        let d = paradraft::drafters::dart::Dart::new(m, head, &lm.model, 128, None, td).unwrap();
        Box::new(d) as Box<dyn Drafter + '_>
    };
    // dart-sample: each slot sampled from its distribution, q attached (the per-request
    // drafter is a fork with the request's sampling, as the engine makes it).
    let dart_sample = {
        let (m, head) = paradraft::drafters::dart::DartModel::load(dart_dir.path(), true).unwrap();
        let d =
            paradraft::drafters::dart::Dart::new(m, head, &lm.model, 128, None, Selection::Sample)
                .unwrap();
        Box::new(PerRequest::new(move |seed| {
            Box::new(d.fork(128, sampling(seed)).unwrap()) as Box<dyn Drafter + '_>
        })) as Box<dyn Drafter + '_>
    };
    // PARD: an untrained drafter (the target's first layer, perturbed) over a reduced
    // vocabulary; greedy drafts by the one-hot rule, sampled drafts by the known-q rule.
    let pard_vocab = paradraft::drafters::vocab::DraftVocab::from_d2t(
        (0..vocab).filter(|i| i % 4 != 1).collect(),
        vocab as usize,
    );
    let (pard_dir, _) = common::tiny_pard_dir(&lm, 1, &pard_vocab, 5);
    let pard_model = std::sync::Arc::new(
        paradraft::drafters::mask_lm::MaskLm::load(
            pard_dir.path(),
            &common::fixtures().join("tiny/qwen3"),
            &lm,
            "PARD",
        )
        .unwrap(),
    );
    let pard = |mode: fn() -> Selection| -> Box<dyn Drafter + '_> {
        let m = pard_model.clone();
        Box::new(PerRequest::new(move |seed| {
            let d =
                paradraft::drafters::pard::Pard::new(m.clone(), 128, 4, sampling(seed)).unwrap();
            Box::new(d.with_selection(mode()))
        }))
    };
    // DiffuSpec: an untrained block-diffusion drafter, two refinement steps, the chain chosen
    // by CPS with a 3-gram proxy — a deterministic draft verified with a one-hot q.
    let (dlm_dir, _) = common::tiny_mask_dir(
        &lm,
        1,
        &pard_vocab,
        5,
        &paradraft::train::dlm::Diffusion {
            k: 4,
            ..Default::default()
        },
    );
    let dlm_model = std::sync::Arc::new(
        paradraft::drafters::mask_lm::MaskLm::load(
            dlm_dir.path(),
            &common::fixtures().join("tiny/qwen3"),
            &lm,
            "DiffuSpec",
        )
        .unwrap(),
    );
    let arpa = {
        let mut b = paradraft::ngram::arpa::ArpaBuilder::new();
        b.add_document(&encode(
            &lm,
            "Tell me a story about the sea and the ships on it.",
            64,
        ));
        std::sync::Arc::new(b.finish().unwrap())
    };
    let diffuspec: Box<dyn Drafter + '_> = Box::new(PerRequest::new({
        let m = dlm_model.clone();
        let stop: Vec<TokenId> = lm.tokenizer.stop_tokens.iter().copied().collect();
        move |seed| {
            let d = paradraft::drafters::diffuspec::DiffuSpec::new(
                m.clone(),
                128,
                4,
                2,
                Default::default(),
                sampling(seed),
            )
            .unwrap();
            Box::new(
                d.with_selection(Selection::Cps(paradraft::drafters::parts::CpsDrafting {
                    lattice: Default::default(),
                    cps: Default::default(),
                    ngram: Some(arpa.clone()),
                    stop: stop.clone(),
                })),
            )
        }
    }));
    // auto: every source, DART as its model; the suffix cache fills with the earlier seeds'
    // outputs of this prompt and the recycled candidates with their verify rows', so its trees
    // branch where the samples did.
    let trie_dir = tempfile::tempdir().unwrap();
    let trie_path = trie_dir.path().join("tiny.trie");
    dflash_trie.as_ref().unwrap().write(&trie_path).unwrap();
    let tiny = common::fixtures().join("tiny/qwen3");
    let auto_set = auto(
        &tiny,
        &lm,
        &["pld", "suffix", "trie", "recycle", "dart"],
        128,
        |c| {
            c.ngram = Some(trie_path.clone());
            c.draft_model = Some(dart_dir.path().to_path_buf());
        },
    );
    let auto: Box<dyn Drafter + '_> = Box::new(PerRequest::new(|seed| {
        auto_set.create(sampling(seed)).unwrap()
    }));
    use Group::*;
    let mut cases: Vec<(Group, &str, Box<dyn Drafter + '_>)> = vec![
        (
            AutoDiffuSpecDart,
            "auto (pld, suffix, trie, recycle, dart)",
            auto,
        ),
        (
            AutoDiffuSpecDart,
            "diffuspec, CPS chain (one-hot q)",
            diffuspec,
        ),
        (AutoDiffuSpecDart, "dart", dart),
        (AutoDiffuSpecDart, "dart, sampled drafts", dart_sample),
        (
            PardDflash,
            "pard, greedy drafts",
            pard(|| Selection::Greedy),
        ),
        (
            PardDflash,
            "pard, sampled drafts",
            pard(|| Selection::Sample),
        ),
        (PardDflash, "dflash-tree", dflash_tree),
        (
            PardDflash,
            "dflash, greedy drafts",
            dflash(|| Selection::Greedy),
        ),
        (
            PardDflash,
            "dflash, sampled drafts",
            dflash(|| Selection::Sample),
        ),
        (
            Known,
            "random trees",
            Box::new(Replay::new({
                let mut rng = Lcg(9);
                move |_: &[TokenId], max: usize| random_tree(&mut rng, &[], vocab.min(24), max)
            })),
        ),
        (
            Known,
            "q chain",
            Box::new(QChain {
                q: q.clone(),
                rng: Lcg(11),
                len: 3,
            }),
        ),
        (
            Known,
            "q chain, other q",
            Box::new(QChain {
                q: paradraft::sample::Dist {
                    entries: vec![(top[0], 0.9), (top[1], 0.1)],
                },
                rng: Lcg(12),
                len: 2,
            }),
        ),
    ];
    let mut spec_ids = |d: &mut dyn Drafter, seed: u64, rule: VerifyRule| {
        REQUEST_SEED.with(|s| s.set(seed));
        let sp = Speculation {
            drafter: Box::new(d),
            max_draft: 6,
            sizer: None,
            rule,
        };
        let g = speculative_generate(
            &lm.model,
            &lm.tokenizer,
            &mut kv,
            &prompt,
            &params(seed),
            sp,
            |_| {},
        )
        .unwrap()
        .out;
        (g.token_ids, g.logprobs)
    };
    cases.retain(|c| c.0 == group);
    assert!(!cases.is_empty());
    eprintln!("setup + AR: {:.1} s", t_start.elapsed().as_secs_f64());
    for (_, name, d) in cases.iter_mut() {
        let t_case = std::time::Instant::now();
        // Coupled rule: every seed gives AR's own tokens and log-probabilities, whatever was
        // drafted.
        for seed in 0..1_000u64 {
            let got = spec_ids(d.as_mut(), seed, VerifyRule::Coupled);
            assert_eq!(
                got, ar_ids[seed as usize],
                "{name}, coupled rule, seed {seed}"
            );
        }
        // Rejection rule: the same distribution, checked by χ².
        let sp = count(&mut |seed| spec_ids(d.as_mut(), seed, VerifyRule::Rejection).0);
        for pos in 0..3 {
            let (chi, dof) = chi_square(&ar[pos], &sp[pos], n, n);
            if chi >= chi_crit(dof) {
                let mut v: Vec<_> = ar[pos]
                    .iter()
                    .map(|(k, c)| (*k, *c, *sp[pos].get(k).unwrap_or(&0)))
                    .collect();
                v.sort_by_key(|e| std::cmp::Reverse(e.1));
                eprintln!(
                    "{name} pos {pos} q={:?}: (id, ar, spec) {:?}",
                    q.entries,
                    &v[..v.len().min(12)]
                );
            }
            assert!(
                chi < chi_crit(dof),
                "{name}, token {pos}: χ² = {chi:.1} with {dof} dof (limit {:.1})",
                chi_crit(dof)
            );
        }
        eprintln!("{name}: {:.1} s", t_case.elapsed().as_secs_f64());
    }
}
