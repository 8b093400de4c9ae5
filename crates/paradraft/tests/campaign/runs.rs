//! Campaigns run end to end: resume, DFlash, self-distillation, stops, refusals, committed data.

use super::*;

struct Fixture {
    method: CampaignMethod,
    dir: tempfile::TempDir,
    drafter: tempfile::TempDir,
    seed: std::path::PathBuf,
    prompts: std::path::PathBuf,
    corpus: std::path::PathBuf,
}

/// A campaign directory, its data and a start drafter of `method`.
fn fixture(lm: &Loaded, method: CampaignMethod) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let seed = data.path().join("seed.bin");
    let (mut w, _) = SampleWriter::open(&seed).unwrap();
    // PARD's held-out chains need K + 1 answer tokens: its fixture leaves out answers the tiny
    // target ended sooner (it still has 20 samples, the last held out).
    let long =
        |s: &Sample| method != CampaignMethod::Pard || s.tokens.len() >= s.prompt_len as usize + 8;
    let samples: Vec<Sample> = greedy_samples(lm, 24, 10)
        .into_iter()
        .filter(long)
        .collect();
    for s in &samples[..20] {
        w.append(s).unwrap();
    }
    drop(w);
    let prompts = data.path().join("prompts.jsonl");
    let mut f = std::fs::File::create(&prompts).unwrap();
    for i in 0..40 {
        let v = serde_json::json!({"id": format!("p/{i}"), "prompt": prompt_text(i)});
        writeln!(f, "{v}").unwrap();
    }
    let corpus = data.path().join("corpus.jsonl");
    let mut f = std::fs::File::create(&corpus).unwrap();
    // p/19 is held out (the last 5 % of 20 samples): its answer must not be trained on.
    for (id, text) in [
        (
            "p/3",
            "the answer to question three is a long one with many words in it",
        ),
        (
            "p/19",
            "held out answer text that must never be seen by the trainer at all",
        ),
        (
            "doc/1",
            "plain document text with no prompt, cut into pieces of some tokens each one",
        ),
    ] {
        writeln!(f, "{}", serde_json::json!({"id": id, "text": text})).unwrap();
    }
    let drafter = match method {
        CampaignMethod::Dart => tiny_dart_dir(lm, 3, 9),
        CampaignMethod::Dflash => tiny_dflash_dir(lm, &tiny_dflash_config(lm, 1, &[0, 1], 4), true),
        CampaignMethod::Pard => {
            let n = lm.model.config.vocab_size;
            let vocab = paradraft::drafters::vocab::DraftVocab::full(n);
            common::tiny_pard_dir(lm, 1, &vocab, n as u32 - 1).0
        }
    };
    std::mem::forget(data);
    Fixture {
        method,
        dir,
        drafter,
        seed,
        prompts,
        corpus,
    }
}

fn params() -> Params {
    Params {
        batch_seqs: 2,
        anchors: 4,
        eval_every: 2,
        round_s: 1e9,
        distill_share: 0.0,
        gen_seqs: 4,
        max_new_tokens: 6,
        corpus_share: 0.5,
        ..Params::default()
    }
}

/// [`params`] with a self-distillation round after every step (rounds of 0 s).
fn distilling_params() -> Params {
    Params {
        round_s: 0.0,
        distill_share: 0.5,
        eval_every: 1000,
        ..params()
    }
}

/// Runs the campaign in `fx` until step `until`; returns its notes.
fn run_until(
    lm: &Loaded,
    fx: &Fixture,
    p: &Params,
    until: usize,
) -> (campaign::Progress, Vec<String>) {
    run_while(lm, fx, p, |pr| pr.step >= until)
}

/// Runs the campaign in `fx` until `stop` says so; returns its notes.
fn run_while(
    lm: &Loaded,
    fx: &Fixture,
    p: &Params,
    stop: impl FnMut(&campaign::Progress) -> bool,
) -> (campaign::Progress, Vec<String>) {
    let (net0, vocab) = fx.method.load(fx.drafter.path(), &lm.model).unwrap();
    let shape = net0.shape();
    campaign::check_stamp(fx.dir.path(), &Stamp::new(lm, &shape, &vocab), p).unwrap();
    let src = Sources {
        seed: fx.seed.clone(),
        more: None,
        sampled: None,
        prompts: fx.prompts.clone(),
        corpus: vec![fx.corpus.clone()],
        corpus_max_len: 8,
    };
    let mut notes = vec![];
    let prep = campaign::prepare(fx.dir.path(), lm, &src, |n| notes.push(n)).unwrap();
    let (from, method) = (fx.drafter.path().to_path_buf(), fx.method);
    let target = &lm.model;
    let start = move || Ok(method.load(&from, target)?.0);
    let setup = Setup {
        dir: fx.dir.path(),
        lm,
        vocab: &vocab,
        shape: &shape,
        held_out: prep.held_out.clone(),
        corpus: prep.corpus.clone(),
        prompts: &prep.prompts,
        start: &start,
    };
    assert_eq!(prep.held_out, vec![19]);
    let pr = campaign::run(&setup, p, stop, |e| {
        if let Event::Note(n) = e {
            notes.push(n)
        }
    })
    .unwrap();
    (pr, notes)
}

fn steps_logged(dir: &Path, file: &str) -> Vec<u64> {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

#[test]
fn a_campaign_resumes_from_its_last_good_checkpoint() {
    let lm = load_tiny("llama");
    let fx = fixture(&lm, CampaignMethod::Dart);
    let p = params();
    let (pr, notes) = run_until(&lm, &fx, &p, 3);
    assert_eq!(pr.step, 3);
    assert!(pr.positions > 0 && pr.cpu_s > 0.0);
    assert!(
        notes
            .iter()
            .any(|n| n.contains("starting from the drafter")),
        "{notes:?}"
    );
    let d = fx.dir.path();
    assert_eq!(steps_logged(d, "train_log.jsonl"), vec![1, 2, 3]);
    assert_eq!(steps_logged(d, "curve.jsonl"), vec![0, 2]);
    assert!(d.join("best/model.safetensors").exists());
    // The weights' moving average (what is evaluated and exported) is kept with the weights.
    assert!(d.join("ckpt/step-00000003/ema.safetensors").exists());
    assert!(d.join("latest/eval.json").exists());
    // The corpus left the held-out prompt's answer out.
    let cache = std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("corpus-"))
        .unwrap()
        .path();
    let (corpus, _) = read_samples(&cache).unwrap();
    assert!(
        corpus.iter().any(|s| s.prompt_len > 0),
        "p/3 is templated as an answer"
    );
    assert!(
        corpus.iter().any(|s| s.prompt_len == 0),
        "doc/1 is raw text"
    );
    assert!(
        corpus.iter().all(|s| s.prompt_index != 1),
        "p/19 (record 1) is held out"
    );

    let (pr, notes) = run_until(&lm, &fx, &p, 5);
    assert_eq!(pr.step, 5);
    assert!(
        notes.iter().any(|n| n.contains("resumed at step 3")),
        "{notes:?}"
    );
    assert_eq!(steps_logged(d, "train_log.jsonl"), vec![1, 2, 3, 4, 5]);
    assert_eq!(steps_logged(d, "curve.jsonl"), vec![0, 2, 4]);

    // A broken newest checkpoint is skipped, the older one used; the log and curve are cut
    // back to it.
    let newest = d.join("ckpt/step-00000005/state.safetensors");
    let len = std::fs::metadata(&newest).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&newest)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let (pr, notes) = run_until(&lm, &fx, &p, 4);
    assert!(
        notes.iter().any(|n| n.contains("skipping checkpoint")),
        "{notes:?}"
    );
    assert!(
        notes.iter().any(|n| n.contains("resumed at step 3")),
        "{notes:?}"
    );
    assert_eq!(pr.step, 4);
    assert_eq!(steps_logged(d, "train_log.jsonl"), vec![1, 2, 3, 4]);
    assert_eq!(steps_logged(d, "curve.jsonl"), vec![0, 2, 4]);
}

/// DFlash on the same pipeline (#23 item 5): a campaign from a DFlash drafter trains on online
/// taps, greedy answers and teacher-forced corpus text alike (#57), evaluates its block drafts
/// on the held-out split, exports a drafter the engine loads and resumes from its checkpoint.
#[test]
fn a_dflash_campaign_trains_evaluates_exports_and_resumes() {
    let lm = load_tiny("llama");
    let d = CampaignMethod::Dflash.params();
    let p = Params {
        lr: d.lr,
        gamma: d.gamma,
        sample_temp: d.sample_temp,
        ..params()
    };
    trains_evaluates_exports_and_resumes(&lm, CampaignMethod::Dflash, &p, "tiny/llama", 4);
}

/// PARD on the same pipeline (#57): a campaign from a PARD drafter trains COD layouts on
/// greedy answers and on target-labelled corpus text, evaluates its chain of K drafts on the
/// held-out split, exports a drafter the engine loads and resumes from its checkpoint.
#[test]
fn a_pard_campaign_trains_evaluates_exports_and_resumes() {
    // PARD trains targets without RoPE scaling (the tiny Llama has Llama 3's).
    let lm = load_tiny("qwen3");
    let p = Params {
        lr: CampaignMethod::Pard.params().lr,
        ..params()
    };
    trains_evaluates_exports_and_resumes(&lm, CampaignMethod::Pard, &p, "tiny/qwen3", 4);
}

/// Three steps of a `method` campaign on half corpus text: every step logged with a finite
/// positive loss, held-out evaluations of `k` drafts at steps 0 and 2, the best weights a
/// drafter the engine loads for the target at `target` (under fixtures/), then a resumed step.
fn trains_evaluates_exports_and_resumes(
    lm: &Loaded,
    method: CampaignMethod,
    p: &Params,
    target: &str,
    k: usize,
) {
    let fx = fixture(lm, method);
    assert!(p.corpus_share > 0.0, "half the sequences are corpus text");
    let (pr, notes) = run_until(lm, &fx, p, 3);
    assert_eq!(pr.step, 3);
    assert!(pr.positions > 0, "{notes:?}");
    let d = fx.dir.path();
    assert_eq!(steps_logged(d, "train_log.jsonl"), vec![1, 2, 3]);
    assert_eq!(steps_logged(d, "curve.jsonl"), vec![0, 2]);
    let curve = campaign::read_curve(d).unwrap();
    assert_eq!(curve[0].eval.block_size, k, "{method:?} drafts");
    assert!(curve.iter().all(|c| c.eval.blocks > 0));
    let log = std::fs::read_to_string(d.join("train_log.jsonl")).unwrap();
    for line in log.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let loss = v["loss"].as_f64().unwrap();
        assert!(loss > 0.0 && loss.is_finite(), "{v}");
    }
    // The best weights are a drafter in the published layout.
    let cfg = paradraft::drafters::speculative_config::DrafterConfig {
        method: paradraft::drafters::speculative_config::Method::named(method.name()).unwrap(),
        draft_model: Some(d.join("best")),
        ..Default::default()
    };
    if let Err(e) = cfg.load(&common::fixtures().join(target), lm, 128) {
        panic!("the exported {method:?} drafter does not load: {e}");
    }
    let (pr, notes) = run_until(lm, &fx, p, 4);
    assert_eq!(pr.step, 4);
    assert!(
        notes.iter().any(|n| n.contains("resumed at step 3")),
        "{notes:?}"
    );
}

#[test]
fn a_campaign_grows_its_data_by_self_distillation() {
    let lm = load_tiny("llama");
    let fx = fixture(&lm, CampaignMethod::Dart);
    let p = distilling_params();
    // A round per step: the first answers 8 prompts, the next one each (the measured rate
    // times a round of 0 s), until all 40 are answered; then the rounds sample.
    let (pr, notes) = run_until(&lm, &fx, &p, 18);
    assert_eq!(pr.step, 18);
    let (samples, _) = read_samples(&fx.dir.path().join("samples.bin")).unwrap();
    assert_eq!(samples.len(), 40, "{notes:?}");
    let (seed, _) = read_samples(&fx.seed).unwrap();
    assert_eq!(samples[..20], seed[..]);
    let mut seen: Vec<u32> = samples.iter().map(|s| s.prompt_index).collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), samples.len(), "each prompt answered once");
    // The last rounds answered training prompts again at a temperature: never a held-out
    // prompt (19), and not (all) the greedy answer.
    let (sampled, _) = read_samples(&fx.dir.path().join("sampled.bin")).unwrap();
    assert!(!sampled.is_empty(), "{notes:?}");
    let greedy: std::collections::HashMap<u32, &Sample> =
        samples.iter().map(|s| (s.prompt_index, s)).collect();
    let mut differs = false;
    for x in &sampled {
        assert_ne!(x.prompt_index, 19, "a held-out prompt was sampled");
        let g = greedy.get(&x.prompt_index).expect("a training prompt");
        assert_eq!(x.prompt_len, g.prompt_len);
        assert_eq!(
            x.tokens[..x.prompt_len as usize],
            g.tokens[..g.prompt_len as usize]
        );
        differs |= x.tokens != g.tokens;
    }
    assert!(differs, "sampling at 0.8 changed no answer");
    assert!(
        notes.iter().any(|n| n.contains("sampled samples")),
        "{notes:?}"
    );
    // Training draws from them (all of them with a share of 1) and goes on.
    let p = Params {
        sampled_share: Some(1.0),
        corpus_share: 0.0,
        ..p
    };
    let (pr, _) = run_until(&lm, &fx, &p, 19);
    assert_eq!(pr.step, 19);
}

/// A stop asked for during self-distillation starts no new answer: the answers under way finish
/// and the campaign checkpoints before its next step, the distillation's CPU time counted.
#[test]
fn a_stop_during_self_distillation_checkpoints_after_the_answers_under_way() {
    let lm = load_tiny("llama");
    let fx = fixture(&lm, CampaignMethod::Dart);
    let p = Params {
        gen_seqs: 1,
        ..distilling_params()
    };
    // Asked once before step 1, then before each prompt of the first distillation round (it
    // wants 2 × gen_seqs = 2): yes from the second prompt on, so one answer is started.
    let mut asked = 0;
    let (pr, notes) = run_while(&lm, &fx, &p, |_| {
        asked += 1;
        asked > 2
    });
    assert_eq!(pr.step, 1, "{notes:?}");
    let (samples, _) = read_samples(&fx.dir.path().join("samples.bin")).unwrap();
    let (seed, _) = read_samples(&fx.seed).unwrap();
    assert_eq!(samples.len(), seed.len() + 1, "{notes:?}");
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("self-distilled 1 greedy")),
        "{notes:?}"
    );
    // The checkpoint holds that step and resumes there.
    let (pr, notes) = run_until(&lm, &fx, &p, 2);
    assert_eq!(pr.step, 2);
    assert!(
        notes.iter().any(|n| n.starts_with("resumed at step 1")),
        "{notes:?}"
    );
}

#[test]
fn a_directory_of_another_drafter_or_a_bad_corpus_is_refused() {
    let lm = load_tiny("llama");
    let fx = fixture(&lm, CampaignMethod::Dart);
    let (net, vocab) = dart::load_exported(fx.drafter.path()).unwrap();
    let p = params();
    let stamp = Stamp::new(&lm, &campaign::Shape::Dart(net.config), &vocab);
    campaign::check_stamp(fx.dir.path(), &stamp, &p).unwrap();
    campaign::check_stamp(fx.dir.path(), &stamp, &p).unwrap();
    let mut other = stamp.clone();
    other.tokenizer_fingerprint = "0123456789abcdef".into();
    let e = campaign::check_stamp(fx.dir.path(), &other, &p)
        .unwrap_err()
        .to_string();
    assert!(e.contains("another target, tokenizer or drafter"), "{e}");
    let bad = fx.dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"id\": \"x\", \"text\": \"fine\"}\nnot json\n").unwrap();
    let e = campaign::corpus_samples(&lm, &bad, &[], &Default::default(), 64)
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2"), "{e}");
    // A samples file that no longer starts with the seed is refused, not overwritten.
    let src = Sources {
        seed: fx.seed.clone(),
        more: None,
        sampled: None,
        prompts: fx.prompts.clone(),
        corpus: vec![],
        corpus_max_len: 8,
    };
    campaign::prepare(fx.dir.path(), &lm, &src, |_| {}).unwrap();
    let sp = fx.dir.path().join("samples.bin");
    std::fs::write(&sp, b"PDTK0001").unwrap();
    let e = campaign::prepare(fx.dir.path(), &lm, &src, |_| {})
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("does not start with"), "{e}");
    assert_eq!(std::fs::read(&sp).unwrap(), b"PDTK0001");
}

/// Committed samples from earlier campaigns join a new campaign's data after the seed (compressed
/// or not), except those of a held-out prompt, of a prompt already answered or of no prompt; the
/// held-out split stays the seed's, and an existing campaign's data is left as it is.
#[test]
fn committed_samples_join_a_new_campaign_but_never_held_out_ones() {
    let lm = load_tiny("llama");
    let fx = fixture(&lm, CampaignMethod::Dart);
    let sample = |i: u32| Sample {
        prompt_index: i,
        prompt_len: 2,
        tokens: vec![paradraft::types::TokenId(1 + i); 5],
    };
    // p/19 is held out, p/3 is answered by the seed, prompt 99 does not exist; 25 twice.
    let plain = fx.dir.path().join("more.bin");
    let (mut w, _) = SampleWriter::open(&plain).unwrap();
    for i in [19, 3, 25, 99, 26, 25] {
        w.append(&sample(i)).unwrap();
    }
    drop(w);
    let gz = fx.dir.path().join("more.bin.gz");
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(&gz).unwrap(),
        flate2::Compression::default(),
    );
    enc.write_all(&std::fs::read(&plain).unwrap()).unwrap();
    enc.finish().unwrap();
    let (seed, _) = read_samples(&fx.seed).unwrap();
    for more in [plain, gz] {
        let dir = tempfile::tempdir().unwrap();
        let src = Sources {
            seed: fx.seed.clone(),
            more: Some(more.clone()),
            sampled: None,
            prompts: fx.prompts.clone(),
            corpus: vec![],
            corpus_max_len: 8,
        };
        let mut notes = vec![];
        let prep = campaign::prepare(dir.path(), &lm, &src, |n| notes.push(n)).unwrap();
        assert_eq!(prep.held_out, vec![19]);
        let sp = dir.path().join("samples.bin");
        let (have, _) = read_samples(&sp).unwrap();
        assert_eq!(have.len(), seed.len() + 2, "{notes:?}");
        assert_eq!(have[..seed.len()], seed[..]);
        assert_eq!(have[seed.len()..], [sample(25), sample(26)]);
        assert!(
            notes.iter().any(|n| n.starts_with("2 committed samples")),
            "{notes:?}"
        );
        assert!(!dir.path().join("samples.tmp").exists());
        // Resumed: nothing is added twice.
        campaign::prepare(dir.path(), &lm, &src, |_| {}).unwrap();
        assert_eq!(read_samples(&sp).unwrap().0.len(), seed.len() + 2);
    }
}

/// Committed sampled answers become a new campaign's `sampled.bin`, less those of held-out
/// prompts; a campaign that has its own keeps them; an answer to a prompt that does not exist
/// is refused with the file named, and no half-written data is left.
#[test]
fn committed_sampled_answers_seed_a_new_campaign_but_never_held_out_ones() {
    let lm = load_tiny("llama");
    let fx = fixture(&lm, CampaignMethod::Dart);
    let sample = |i: u32, t: u32| Sample {
        prompt_index: i,
        prompt_len: 2,
        tokens: vec![paradraft::types::TokenId(1 + t); 6],
    };
    let write = |path: &std::path::Path, xs: &[Sample]| {
        let (mut w, _) = SampleWriter::open(path).unwrap();
        for x in xs {
            w.append(x).unwrap();
        }
    };
    // p/19 is held out; p/3 (answered greedily by the seed) may have sampled answers too.
    let good = fx.dir.path().join("sampled-good.bin");
    write(
        &good,
        &[sample(3, 1), sample(19, 2), sample(25, 3), sample(3, 4)],
    );
    let src = |f: &std::path::Path| Sources {
        seed: fx.seed.clone(),
        more: None,
        sampled: Some(f.to_path_buf()),
        prompts: fx.prompts.clone(),
        corpus: vec![],
        corpus_max_len: 8,
    };
    let dir = tempfile::tempdir().unwrap();
    let mut notes = vec![];
    campaign::prepare(dir.path(), &lm, &src(&good), |n| notes.push(n)).unwrap();
    let sp = dir.path().join("sampled.bin");
    let (have, _) = read_samples(&sp).unwrap();
    assert_eq!(
        have,
        [sample(3, 1), sample(25, 3), sample(3, 4)],
        "{notes:?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("3 committed sampled answers")),
        "{notes:?}"
    );
    // Its own answers grown (appended), then resumed: they stay as they are.
    write(&sp, &[sample(26, 5)]);
    campaign::prepare(dir.path(), &lm, &src(&good), |_| {}).unwrap();
    let want = [sample(3, 1), sample(25, 3), sample(3, 4), sample(26, 5)];
    assert_eq!(read_samples(&sp).unwrap().0, want);
    // A new directory that already holds sampled answers (copied in by hand, or left by a
    // start that failed before its samples were in place) keeps them.
    let dir = tempfile::tempdir().unwrap();
    let own = dir.path().join("sampled.bin");
    write(&own, &[sample(26, 5)]);
    let mut notes = vec![];
    campaign::prepare(dir.path(), &lm, &src(&good), |n| notes.push(n)).unwrap();
    assert_eq!(read_samples(&own).unwrap().0, [sample(26, 5)]);
    assert!(
        !notes.iter().any(|n| n.contains("sampled answers")),
        "{notes:?}"
    );
    // An answer to prompt 99 of the fixture's few: refused, naming the file; nothing written.
    let bad = fx.dir.path().join("sampled-bad.bin");
    write(&bad, &[sample(25, 1), sample(99, 2)]);
    let dir = tempfile::tempdir().unwrap();
    let e = campaign::prepare(dir.path(), &lm, &src(&bad), |_| {})
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("sampled-bad.bin") && e.contains("prompt 99"),
        "{e}"
    );
    assert!(!dir.path().join("sampled.bin").exists());
}
