//! The serving engine without HTTP: the scheduler thread, admission from the KV page pool,
//! cancellation and the 429 cap, on a tiny model. Every request's tokens equal AR decoding of
//! it alone, however the scheduler batched it.

mod common;
use common::*;
use paradraft::drafters::speculative_config::{DrafterConfig, Method};
use paradraft::engine::{Engine, EngineConfig, Event, Finished, Rejected, Request};
use paradraft::generate::{generate, GenerateParams, Generation};
use paradraft::model::Loaded;
use paradraft::sample::SamplingParams;
use paradraft::types::TokenId;
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

fn toks(n: usize, seed: u32, vocab: usize) -> Vec<TokenId> {
    (0..n as u32)
        .map(|i| TokenId((i.wrapping_mul(2654435761).wrapping_add(seed * 97)) % vocab as u32))
        .collect()
}

fn start(method: Method, cfg: EngineConfig) -> Engine {
    let path = fixtures().join("tiny").join("llama");
    let lm = Arc::new(paradraft::model::load(&path).unwrap());
    let d = DrafterConfig {
        method,
        // auto: the sources a tiny model has (no trie or drafter of its own).
        sources: ["pld", "suffix", "recycle"].map(String::from).to_vec(),
        ..Default::default()
    };
    Engine::start(lm, path, d, cfg).unwrap()
}

fn params(i: usize) -> GenerateParams {
    GenerateParams {
        max_new_tokens: 10 + i % 7,
        sampling: SamplingParams {
            temperature: if i.is_multiple_of(3) { 0.7 } else { 0.0 },
            seed: i as u64,
            ..Default::default()
        },
        stop_strings: vec![],
        ..Default::default()
    }
}

/// What AR generation alone gives for `prompt` with `p` (a cache of `ctx` slots).
fn ar(lm: &Loaded, prompt: &[TokenId], p: &GenerateParams, ctx: usize) -> Generation {
    let mut kv = lm.model.new_kv(ctx);
    generate(&lm.model, &lm.tokenizer, &mut kv, prompt, p, |_| {}).unwrap()
}

/// Waits for the request's end: its streamed text and summary.
fn collect(mut rx: UnboundedReceiver<Event>) -> (String, Finished) {
    let mut text = String::new();
    loop {
        match rx.blocking_recv().expect("an event") {
            Event::Text(t) => text.push_str(&t),
            Event::Logprobs(_) => {}
            Event::Done(f) => return (text, f),
            Event::Error(e) => panic!("{e}"),
        }
    }
}

/// Submits request i with `prompts[i]` and `params(i)`; their receivers, in order.
fn submit_all(e: &Engine, prompts: &[Vec<TokenId>]) -> Vec<UnboundedReceiver<Event>> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (tx, rx) = unbounded_channel();
            e.submit(Request {
                prompt: p.clone(),
                params: params(i),
                events: tx,
                max_draft: None,
            })
            .unwrap();
            rx
        })
        .collect()
}

#[test]
fn requests_equal_ar_alone_under_a_small_batch_and_pool() {
    // auto with recycled candidates: greedy rows ask the batch's forward for their top ids
    // while sampling rows in the same forward take full logits.
    let auto = Method::named("auto").unwrap();
    for method in [Method::none(), Method::named("pld").unwrap(), auto] {
        // Three at a time, and a pool that holds only two requests of 64 tokens (4 pages
        // each): admission waits for pages.
        let cfg = EngineConfig {
            ctx: 64,
            max_running: 3,
            max_queue: 32,
            kv_pages: 8,
            prefill_chunk: 5,
            ..Default::default()
        };
        let e = start(method, cfg);
        let lm = e.loaded();
        let v = lm.model.config.vocab_size;
        let prompts: Vec<Vec<TokenId>> = (0..16).map(|i| toks(3 + i % 9, i as u32, v)).collect();
        let rxs = submit_all(&e, &prompts);
        for (i, rx) in rxs.into_iter().enumerate() {
            let (text, f) = collect(rx);
            let ar = ar(lm, &prompts[i], &params(i), 64);
            assert_eq!(f.token_ids, ar.token_ids, "{method:?} request {i}");
            assert_eq!(text, ar.text, "{method:?} request {i}");
            assert_eq!(f.prompt_tokens, prompts[i].len());
        }
        let m = e.metrics().render();
        assert!(
            m.contains("paradraft_requests_total{outcome=\"finished\"} 16"),
            "{m}"
        );
        if !method.is_none() {
            // Undrafted rounds are counted by reason: a speed guard starts with an AR probe.
            let probe = "paradraft_undrafted_rounds_total{drafter=";
            assert!(
                m.lines()
                    .any(|l| l.starts_with(probe) && l.contains("reason=\"probe\"")),
                "{m}"
            );
        }
        e.shutdown();
    }
}

#[test]
fn cancelled_requests_free_their_pages_and_the_cap_refuses() {
    let cfg = EngineConfig {
        ctx: 256,
        max_running: 1,
        max_queue: 1,
        kv_pages: 16,
        ..Default::default()
    };
    let e = start(Method::none(), cfg);
    let long = |tx| Request {
        prompt: vec![TokenId(1), TokenId(2)],
        params: GenerateParams {
            max_new_tokens: 250,
            sampling: Default::default(),
            stop_strings: vec![],
            ..Default::default()
        },
        events: tx,
        max_draft: None,
    };
    let (tx1, rx1) = unbounded_channel();
    let (tx2, rx2) = unbounded_channel();
    let (tx3, _rx3) = unbounded_channel();
    e.submit(long(tx1)).unwrap();
    e.submit(long(tx2)).unwrap();
    // Two in flight (one running, one queued): the third is refused.
    assert!(matches!(e.submit(long(tx3)), Err(Rejected::Busy(2))));
    // Dropping the receivers cancels both.
    drop(rx1);
    drop(rx2);
    let t = std::time::Instant::now();
    while e.in_flight() > 0 {
        assert!(t.elapsed().as_secs() < 30, "cancelled requests linger");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let m = e.metrics().render();
    assert!(
        m.contains("paradraft_requests_total{outcome=\"cancelled\"} 2"),
        "{m}"
    );
    // The pages are back: a new request runs.
    let (tx, rx) = unbounded_channel();
    e.submit(long(tx)).unwrap();
    let (_, f) = collect(rx);
    assert!(!f.token_ids.is_empty());
}

#[test]
fn bad_engine_settings_are_refused() {
    let path = fixtures().join("tiny").join("llama");
    let lm = Arc::new(paradraft::model::load(&path).unwrap());
    let d = DrafterConfig::default();
    for cfg in [
        EngineConfig {
            max_running: 0,
            ..Default::default()
        },
        EngineConfig {
            ctx: 4096,
            kv_pages: 10,
            ..Default::default()
        },
        EngineConfig {
            conservativeness: -1.0,
            ..Default::default()
        },
        EngineConfig {
            conservativeness: f64::NAN,
            ..Default::default()
        },
    ] {
        assert!(Engine::start(lm.clone(), path.clone(), d.clone(), cfg).is_err());
    }
    // `--drafter none` is called so (not "ar") in the log and /v1/models.
    let e = Engine::start(lm.clone(), path.clone(), d, EngineConfig::default()).unwrap();
    assert_eq!(e.drafter(), "none");
    drop(e);
    let bad = DrafterConfig {
        method: Method::named("dflash").unwrap(),
        draft_model: Some(path.join("nope")),
        ..Default::default()
    };
    let err = Engine::start(lm, path, bad, EngineConfig::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("DFlash"), "{err}");
}

/// Tiny Qwen3 with a tiny DFlash drafter (one layer, taps at the first and last layers,
/// blocks of 4): the model, its path, the drafter's directory (kept while in use) and the
/// drafter settings.
fn tiny_dflash_setup() -> (Arc<Loaded>, std::path::PathBuf, impl Sized, DrafterConfig) {
    let path = fixtures().join("tiny").join("qwen3");
    let lm = Arc::new(paradraft::model::load(&path).unwrap());
    let n = lm.model.config.n_layers;
    let dir = tiny_dflash_dir(&lm, &tiny_dflash_config(&lm, 1, &[0, n - 1], 4), false);
    let d = DrafterConfig {
        method: Method::named("dflash").unwrap(),
        draft_model: Some(dir.path().to_path_buf()),
        ..Default::default()
    };
    (lm, path, dir, d)
}

/// A drafter's own cache (DFlash's context K/V) is sized to each request and counted in the
/// KV pool: a pool that holds one full-context request of the target alone but not its drafter
/// is refused at start, naming the drafter; with room for both, requests still equal AR, and
/// each keeps to its own draft limit.
#[test]
fn drafter_caches_are_counted_in_the_pool() {
    let (lm, path, _dir, mut d) = tiny_dflash_setup();
    d.draft_length = paradraft::drafters::speculative_config::DraftLength::Fixed;
    let cfg = |kv_pages| EngineConfig {
        ctx: 64,
        max_running: 2,
        kv_pages,
        ..Default::default()
    };
    // The target alone needs 4 pages for 64 tokens; its drafter's cache needs more.
    let err = Engine::start(lm.clone(), path.clone(), d.clone(), cfg(4))
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("dflash") && err.contains("own cache"), "{err}");
    let e = Engine::start(lm.clone(), path.clone(), d, cfg(32)).unwrap();
    let v = lm.model.config.vocab_size;
    // Per request (#61): the drafter's own limit (3 a round, drafted in full: fixed sizing),
    // none at all, or at most 2.
    for (i, cap) in [None, Some(0), Some(2), None].into_iter().enumerate() {
        let prompt = toks(5 + i, i as u32, v);
        let p = GenerateParams {
            sampling: Default::default(),
            ..params(i)
        };
        let (tx, rx) = unbounded_channel();
        e.submit(Request {
            prompt: prompt.clone(),
            params: p.clone(),
            events: tx,
            max_draft: cap,
        })
        .unwrap();
        let (_, fin) = collect(rx);
        let ar = ar(&lm, &prompt, &p, 64);
        assert_eq!(fin.token_ids, ar.token_ids, "request {i}");
        assert!(fin.rounds > 0 && fin.accepted <= fin.drafted, "request {i}");
        let most = cap.unwrap_or(3);
        assert!(fin.drafted <= most * fin.rounds, "request {i}: {fin:?}");
        assert_eq!(fin.drafted == 0, most == 0, "request {i}: {fin:?}");
    }
    e.shutdown();
}

/// Taps two layers and drafts nothing: what a drafter that reads the prompt's states sees.
struct Taps(Vec<usize>);

impl paradraft::speculative::Drafter for Taps {
    fn name(&self) -> &str {
        "taps"
    }
    fn taps(&self) -> &[usize] {
        &self.0
    }
    fn begin(&mut self, _: &[TokenId], _: paradraft::speculative::Hidden) -> paradraft::Result<()> {
        Ok(())
    }
    fn propose(
        &mut self,
        _: &[TokenId],
        _: usize,
    ) -> paradraft::Result<paradraft::speculative::DraftTree> {
        Ok(Default::default())
    }
    fn observe(
        &mut self,
        _: &paradraft::speculative::Outcome,
        _: paradraft::speculative::Hidden,
    ) -> paradraft::Result<()> {
        Ok(())
    }
}

/// A prompt that begins with a cached one's tokens (#64: shared-prefix cache) gets the K/V and
/// tapped states a full prefill gives, bit for bit, and the same output; prefilled at once or
/// in chunks of 7.
#[test]
fn a_cached_prefix_gives_what_a_full_prefill_gives() {
    use paradraft::engine::prefix::PrefixCache;
    use paradraft::speculative::step::{Member, Stepper};
    use paradraft::speculative::{Session, Speculation};
    let lm = load_tiny("qwen3");
    let (v, n) = (lm.model.config.vocab_size, lm.model.config.n_layers);
    let p = toks(30, 1, v);
    let mut q = p[..20].to_vec();
    q.extend(toks(7, 9, v));
    let params = params(0);
    // (prompt states, output, cached tokens used)
    let run = |prompt: &[TokenId], cache: &mut PrefixCache, chunk: usize| {
        let mut kv = lm.model.new_kv(80);
        let sp = Speculation {
            drafter: Box::new(Taps(vec![0, n - 1])),
            max_draft: 0,
            sizer: None,
            rule: Default::default(),
        };
        let mut s = Session::new(
            &lm.tokenizer,
            &mut kv,
            prompt,
            &params,
            sp,
            &lm.model.config,
        )
        .unwrap();
        let mut hit = 0;
        if let Some(h) = cache.lookup(prompt, s.width()) {
            kv.copy_from(h.kv, h.tokens).unwrap();
            s.skip_prefill(&kv, h.tokens, h.hidden).unwrap();
            hit = h.tokens;
        }
        let (mut stepper, mut states) = (Stepper::default(), None);
        loop {
            let mut sink = |_: &str| {};
            let mut m = [Member {
                kv: &mut kv,
                session: &mut s,
                on_text: &mut sink,
            }];
            let rows = stepper.step(&lm.model, &mut m, chunk).unwrap().rows;
            if let (None, Some(h)) = (&states, s.prompt_states()) {
                states = Some(h.to_vec());
                cache.insert(prompt, &kv, h);
            }
            if rows == 0 {
                break;
            }
        }
        (states.unwrap(), s.finish(&mut |_| {}).out.token_ids, hit)
    };
    for chunk in [usize::MAX, 7] {
        let mut off = PrefixCache::new(0);
        let (full_states, full_out, none) = run(&q, &mut off, chunk);
        assert_eq!(none, 0);
        let mut cache = PrefixCache::new(64 << 20);
        run(&p, &mut cache, chunk);
        let (states, out, hit) = run(&q, &mut cache, chunk);
        assert_eq!(hit, 20, "the shared prefix");
        assert_eq!(states, full_states, "tapped states, chunk {chunk}");
        assert_eq!(out, full_out, "output, chunk {chunk}");
        assert!(!out.is_empty());
    }
}

/// Requests that arrive together with one long prompt beginning (a burst with one system
/// prompt) prefill it once: the first computes it, the others wait for it and copy it. Their
/// outputs are AR's.
#[test]
fn a_burst_with_one_prompt_beginning_prefills_it_once() {
    let cfg = EngineConfig {
        ctx: 96,
        max_running: 8,
        ..Default::default()
    };
    let e = start(Method::named("pld").unwrap(), cfg);
    let lm = e.loaded();
    let v = lm.model.config.vocab_size;
    let shared = toks(40, 5, v);
    let prompts: Vec<Vec<TokenId>> = (0..4)
        .map(|i| {
            let mut p = shared.clone();
            p.extend(toks(3 + i, 50 + i as u32, v));
            p
        })
        .collect();
    let rxs = submit_all(&e, &prompts);
    for (i, rx) in rxs.into_iter().enumerate() {
        let (_, f) = collect(rx);
        let ar = ar(lm, &prompts[i], &params(i), 96);
        assert_eq!(f.token_ids, ar.token_ids, "request {i}");
    }
    let m = e.metrics().render();
    assert!(m.contains("paradraft_prefix_cache_hits_total 3"), "{m}");
    assert!(
        m.contains("paradraft_prefix_cache_hit_tokens_total 120"),
        "{m}"
    );
    e.shutdown();
}

/// A cached prefix lends its pages: in a pool of 12 pages, where a request of 75–78 slots
/// alone takes 5, four requests that reuse a 63-token cached prefix (its 4 pages) are admitted for
/// only the 2 pages each writes (the prefix's partial page, copied, and its own tokens'), so
/// all four are admitted with the prefix still cached (without lending: two at a time, the
/// entry evicted); each equals AR alone, and nothing stays reserved.
#[test]
fn a_cached_prefix_lends_its_pages() {
    let cfg = EngineConfig {
        ctx: 96,
        max_running: 4,
        kv_pages: 12,
        ..Default::default()
    };
    let e = start(Method::none(), cfg);
    let lm = e.loaded();
    let v = lm.model.config.vocab_size;
    let shared = toks(63, 7, v);
    let prompts: Vec<Vec<TokenId>> = (0..4)
        .map(|i| {
            let mut p = shared.clone();
            p.extend(toks(1, 60 + i as u32, v));
            p
        })
        .collect();
    let check = |i: usize, rx| {
        let (_, f) = collect(rx);
        let ar = ar(lm, &prompts[i], &params(i), 96);
        assert_eq!(f.token_ids, ar.token_ids, "request {i}");
    };
    // The first fills the cache; the other three reuse 63 tokens of it.
    let mut rxs = submit_all(&e, &prompts[..1]);
    check(0, rxs.remove(0));
    let rxs = submit_all(&e, &prompts);
    for (i, rx) in rxs.into_iter().enumerate() {
        check(i, rx);
    }
    let m = e.metrics().render();
    assert!(m.contains("paradraft_prefix_cache_hits_total 4"), "{m}");
    assert!(
        m.contains("paradraft_prefix_cache_evictions_total 0"),
        "{m}"
    );
    assert!(m.contains("paradraft_kv_pages_used 0"), "{m}");
    e.shutdown();
}

/// The value of the metric line that begins with `name ` in `m`.
fn metric(m: &str, name: &str) -> f64 {
    m.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {m}"))
}

/// Submits `prompts[i]` with `p(i)` and checks each output against AR alone (a cache of
/// `ctx`); the engine's metrics after.
fn run_against_ar(
    e: &Engine,
    prompts: &[Vec<TokenId>],
    p: impl Fn(usize) -> GenerateParams,
    ctx: usize,
    what: &str,
) -> String {
    let rxs: Vec<_> = (0..prompts.len())
        .map(|i| {
            let (tx, rx) = unbounded_channel();
            e.submit(Request {
                prompt: prompts[i].clone(),
                params: p(i),
                events: tx,
                max_draft: None,
            })
            .unwrap();
            rx
        })
        .collect();
    for (i, rx) in rxs.into_iter().enumerate() {
        let (text, f) = collect(rx);
        let ar = ar(e.loaded(), &prompts[i], &p(i), ctx);
        assert_eq!(f.token_ids, ar.token_ids, "{what} request {i}");
        assert_eq!(text, ar.text, "{what} request {i}");
    }
    e.metrics().render()
}

/// Greedy for even `i`, sampled (seeded) for odd, `max_new_tokens` from `most` down.
fn mixed(most: usize) -> impl Fn(usize) -> GenerateParams {
    move |i| GenerateParams {
        max_new_tokens: most - 3 * i,
        sampling: SamplingParams {
            temperature: if i % 2 == 1 { 0.8 } else { 0.0 },
            seed: 7 + i as u64,
            ..Default::default()
        },
        stop_strings: vec![],
        ..Default::default()
    }
}

/// Preemption (#64): a pool of 10 pages (160 slots) for four running requests that grow to
/// ~90 slots each. Each is admitted for its prompt and a round; when the pool runs out the
/// latest arrivals are preempted (pages given back) and resumed later, rebuilding their caches
/// from their tokens. Every output equals AR alone, greedy and sampled (seeded), for AR,
/// prompt lookup and `auto`; nothing stays held or parked. The same with prompts that share
/// their first 40 tokens (cached prefixes lent and evicted around the preemptions).
#[test]
fn preempted_requests_resume_and_equal_ar_alone() {
    // Admission for a prompt and a round alone (the most preemptions).
    let cfg = |kv_pages| EngineConfig {
        ctx: 128,
        max_running: 4,
        max_queue: 32,
        kv_pages,
        prefill_chunk: 16,
        conservativeness: 0.0,
        ..Default::default()
    };
    for method in [
        Method::none(),
        Method::named("pld").unwrap(),
        Method::auto(),
    ] {
        let e = start(method, cfg(10));
        let v = e.loaded().model.config.vocab_size;
        let n = 8;
        let prompts: Vec<Vec<TokenId>> = (0..n)
            .map(|i| toks(6 + (i * 7) % 20, 40 + i as u32, v))
            .collect();
        let m = run_against_ar(&e, &prompts, mixed(90), 128, &format!("{method:?}"));
        assert!(
            metric(&m, "paradraft_preemptions_total") > 0.0,
            "{method:?}: {m}"
        );
        assert_eq!(metric(&m, "paradraft_preempted_requests"), 0.0);
        assert_eq!(metric(&m, "paradraft_kv_pages_used"), 0.0);
        assert!(
            m.contains(&format!(
                "paradraft_requests_total{{outcome=\"finished\"}} {n}"
            )),
            "{m}"
        );
        e.shutdown();
    }
    let e = start(Method::none(), cfg(11));
    let v = e.loaded().model.config.vocab_size;
    let shared = toks(40, 5, v);
    let prompts: Vec<Vec<TokenId>> = (0..6)
        .map(|i| [shared.clone(), toks(3 + i, 60 + i as u32, v)].concat())
        .collect();
    let m = run_against_ar(&e, &prompts, mixed(80), 128, "shared prefix");
    assert!(metric(&m, "paradraft_preemptions_total") > 0.0, "{m}");
    e.shutdown();
    // Whole runs set aside: no preemption, the same outputs.
    let e = start(
        Method::none(),
        EngineConfig {
            conservativeness: 10.0,
            ..cfg(11)
        },
    );
    let m = run_against_ar(&e, &prompts, mixed(80), 128, "whole runs");
    assert_eq!(metric(&m, "paradraft_preemptions_total"), 0.0, "{m}");
    e.shutdown();
}

/// A session preempted at any step — mid-prompt, right after it, mid-decode, twice — and
/// resumed rebuilds its cache from its tokens (whole, or after a cached prefix of them) and
/// gives the output it gives unpreempted, greedy and sampled.
#[test]
fn a_preempted_session_rebuilds_its_cache_exactly() {
    use paradraft::engine::prefix::PrefixCache;
    use paradraft::speculative::step::{Member, Stepper};
    use paradraft::speculative::{Session, Speculation};
    let lm = load_tiny("qwen3");
    let (v, n) = (lm.model.config.vocab_size, lm.model.config.n_layers);
    let prompt = toks(30, 3, v);
    // A cached entry holding the prompt's first 20 tokens (and their states).
    let mut cache = PrefixCache::new(64 << 20);
    let taps = || Speculation {
        drafter: Box::new(Taps(vec![0, n - 1])),
        max_draft: 0,
        sizer: None,
        rule: Default::default(),
    };
    {
        let mut kv = lm.model.new_kv(32);
        let head = &prompt[..20];
        let p = params(0);
        let mut s =
            Session::new(&lm.tokenizer, &mut kv, head, &p, taps(), &lm.model.config).unwrap();
        let mut m = [Member {
            kv: &mut kv,
            session: &mut s,
            on_text: &mut |_: &str| {},
        }];
        Stepper::default().step(&lm.model, &mut m, 64).unwrap();
        cache.insert(head, &kv, s.prompt_states().unwrap());
    }
    let mut run = |params: &GenerateParams, preempt_at: &[usize], reuse: bool| {
        let mut kv = lm.model.new_kv(80);
        let mut s = Session::new(
            &lm.tokenizer,
            &mut kv,
            &prompt,
            params,
            taps(),
            &lm.model.config,
        )
        .unwrap();
        let mut stepper = Stepper::default();
        for step in 0.. {
            if preempt_at.contains(&step) {
                s.preempt(&mut kv).unwrap();
                assert!(kv.is_empty() && s.prefilling(), "step {step}");
                if reuse {
                    let fill = s.to_fill().to_vec();
                    if let Some(h) = cache.lookup(&fill, s.width()) {
                        kv.copy_from(h.kv, h.tokens).unwrap();
                        s.skip_prefill(&kv, h.tokens, h.hidden).unwrap();
                    }
                }
            }
            let mut sink = |_: &str| {};
            let mut m = [Member {
                kv: &mut kv,
                session: &mut s,
                on_text: &mut sink,
            }];
            if stepper.step(&lm.model, &mut m, 7).unwrap().rows == 0 {
                break;
            }
        }
        s.finish(&mut |_| {}).out.token_ids
    };
    for t in [0.0, 0.8] {
        let params = GenerateParams {
            max_new_tokens: 30,
            sampling: SamplingParams {
                temperature: t,
                seed: 11,
                ..Default::default()
            },
            stop_strings: vec![],
            ..Default::default()
        };
        let alone = run(&params, &[], false);
        assert_eq!(alone.len(), 30);
        for at in [vec![2], vec![5], vec![9, 10], vec![12, 20]] {
            for reuse in [false, true] {
                let out = run(&params, &at, reuse);
                assert_eq!(
                    out, alone,
                    "T {t}, preempted at steps {at:?}, reuse {reuse}"
                );
            }
        }
    }
}

/// Preemption with a drafter that keeps a cache of its own (DFlash's context K/V, counted in
/// the pool and kept while its request waits): outputs still equal AR alone, greedy and
/// sampled.
#[test]
fn preempted_dflash_requests_keep_their_drafter_and_equal_ar() {
    let (lm, path, _dir, d) = tiny_dflash_setup();
    // 4 pages hold one request's 64 target slots; its drafter's cache is counted beside them.
    let cfg = EngineConfig {
        ctx: 64,
        max_running: 3,
        kv_pages: 12,
        prefill_chunk: 8,
        conservativeness: 0.0,
        ..Default::default()
    };
    let e = Engine::start(lm.clone(), path, d, cfg).unwrap();
    let v = lm.model.config.vocab_size;
    let prompts: Vec<Vec<TokenId>> = (0..6).map(|i| toks(5 + i, 90 + i as u32, v)).collect();
    let m = run_against_ar(&e, &prompts, mixed(50), 64, "dflash");
    assert!(metric(&m, "paradraft_preemptions_total") > 0.0, "{m}");
    assert_eq!(metric(&m, "paradraft_kv_pages_used"), 0.0);
    e.shutdown();
}
