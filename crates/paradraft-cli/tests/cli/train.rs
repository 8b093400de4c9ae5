//! `train dart|pard|dlm` end to end on tiny models, and the data and checkpoints they refuse.

use super::*;

/// Training on a device that is not there, or with a malformed prompt file, fails with a clear
/// error before anything is written.
#[test]
fn train_refuses_missing_devices_and_bad_prompts() {
    let m = tiny("llama");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let bad = dir.path().join("prompts.jsonl");
    std::fs::write(&bad, "{\"id\": 1\n").unwrap();
    assert_refused(&train(&m, &out, &["--device", "cuda"]), "cuda");
    assert_refused(
        &train(&m, &out, &["--device", "tpu"]),
        "want cpu, cuda or cuda:N",
    );
    assert_refused(
        &train(&m, &out, &["--prompts", bad.to_str().unwrap()]),
        "line 1",
    );
    assert!(
        !out.join("samples.bin").exists(),
        "nothing written for a refused run"
    );
}

/// `train campaign` refuses settings its drafter cannot train with before it loads anything or
/// writes its directory: a DART chain decay above 1.
#[test]
fn train_campaign_refuses_settings_its_drafter_cannot_use() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("campaign");
    let ds = d.to_str().unwrap();
    let args = |extra: &[&str]| {
        let mut v = vec!["train", "campaign", "--dir", ds];
        v.extend_from_slice(extra);
        run(&v)
    };
    assert_refused(&args(&["--gamma", "7"]), "DART's gamma must be in (0, 1]");
    assert!(!d.exists(), "nothing written for a refused run");
}

/// An empty prompt file and a truncated checkpoint are refused with clear errors; the broken
/// checkpoint is left as it was.
#[test]
fn train_refuses_empty_data_and_broken_checkpoints() {
    let m = tiny("llama");
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let r = train(
        &m,
        &dir.path().join("a"),
        &["--prompts", empty.to_str().unwrap()],
    );
    assert_refused(&r, "need at least 2");
    // A run with a few samples, then its checkpoint cut short.
    let prompts = four_prompts(dir.path());
    let out = dir.path().join("b");
    let p = prompts.to_str().unwrap();
    // A tiny run's options, then `extra`.
    let tiny_run = |dir: &std::path::Path, extra: &[&str]| {
        let mut args = vec![
            "--prompts",
            p,
            "--samples",
            "4",
            "--max-new-tokens",
            "12",
            "--draft-vocab",
            "0",
            "--anchors",
            "2",
            "--batch-seqs",
            "2",
            "--until",
            "train",
        ];
        args.extend_from_slice(extra);
        train(&m, dir, &args)
    };
    let small = |steps: &'static str| tiny_run(&out, &["--block-size", "4", "--max-steps", steps]);
    let r = small("1");
    assert_eq!(
        r.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let ck = out.join("checkpoint/state.safetensors");
    let bytes = std::fs::read(&ck).unwrap();
    std::fs::write(&ck, &bytes[..bytes.len() / 2]).unwrap();
    assert_refused(&small("2"), "training checkpoint");
    assert_eq!(
        std::fs::read(&ck).unwrap().len(),
        bytes.len() / 2,
        "left as it was"
    );
    // Fine-tuning the drafter the first run exported: its shape (block 4) is taken over, and
    // the two initialisations exclude each other.
    let drafter = out.join("drafter");
    let d = drafter.to_str().unwrap();
    let c = dir.path().join("c");
    let r = tiny_run(&c, &["--max-steps", "1", "--init-from", d]);
    assert_eq!(
        r.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let tp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.join("train_params.json")).unwrap())
            .unwrap();
    assert_eq!(tp["params"]["block_size"], 4);
    assert!(tp["params"]["init_from"]
        .as_str()
        .unwrap()
        .ends_with("drafter"));
    assert_refused(
        &train(&m, &c, &["--init-from", d, "--init-from-target"]),
        "exclude each other",
    );
}

/// `train dart` end to end on a tiny model (data, taps, two steps, export, held-out
/// evaluation), then decoding with the exported drafter matches AR; tree budgets of 0 or
/// beyond the context are refused.
#[test]
fn train_dart_exports_a_drafter_that_decodes_losslessly() {
    let m = tiny("llama");
    let dir = tempfile::tempdir().unwrap();
    let prompts = four_prompts(dir.path());
    let out = dir.path().join("run");
    let r = run(&[
        "train",
        "dart",
        "--model",
        &m,
        "--out",
        out.to_str().unwrap(),
        "--prompts",
        prompts.to_str().unwrap(),
        "--samples",
        "4",
        "--max-new-tokens",
        "12",
        "--draft-vocab",
        "100",
        "--draft-length",
        "3",
        "--anchors",
        "2",
        "--batch-seqs",
        "2",
        "--max-steps",
        "2",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let drafter = out.join("dart-drafter");
    for f in ["config.json", "model.safetensors"] {
        assert!(drafter.join(f).exists(), "{f}");
    }
    assert!(out.join("dart/eval.json").exists() && out.join("dart/loss.svg").exists());
    let gen = |extra: &[&str]| gen16(&m, extra);
    let ar = json_of(&gen(&[]));
    let d = drafter.to_str().unwrap();
    let sp = gen(&["--drafter", "dart", "--draft-model", d, "--no-ngram"]);
    assert!(
        sp.status.success(),
        "{}",
        String::from_utf8_lossy(&sp.stderr)
    );
    assert_eq!(json_of(&sp)["token_ids"], ar["token_ids"]);
    for budget in ["0", "100000"] {
        let r = gen(&[
            "--drafter",
            "dart",
            "--draft-model",
            d,
            "--no-ngram",
            "--tree-budget",
            budget,
        ]);
        assert_refused(&r, "--tree-budget");
    }
}
/// `train dlm` end to end on a tiny model, adapting a PARD drafter further (`--init`, its mask
/// kept): masked-diffusion training, export (`dlm_attention: "block"`), held-out evaluation;
/// then decoding with `--drafter diffuspec` — raw chain, CPS with a 3-gram model, faithful
/// mode, S = 2, ADL — matches AR at T = 0 and under the coupled rule at T > 0; a PARD drafter
/// is refused as a DLM, and `--ngram-arpa` without CPS is refused.
#[test]
fn train_dlm_exports_a_drafter_that_decodes_losslessly() {
    let m = tiny("qwen3");
    let dir = tempfile::tempdir().unwrap();
    let prompts = four_prompts(dir.path());
    let out = dir.path().join("run");
    let o = out.to_str().unwrap();
    let p = prompts.to_str().unwrap();
    let base = |method: &str| mask_train_args(method, &m, o, p);
    let r = run_owned(&base("pard"));
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let pard = out.join("pard-drafter");
    let mut args = base("dlm");
    args.extend(["--init", pard.to_str().unwrap(), "--eta-min", "0.2"].map(String::from));
    let r = run_owned(&args);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let drafter = out.join("dlm-drafter");
    assert!(out.join("dlm/eval.json").exists() && out.join("dlm/loss.svg").exists());
    let cfg = |d: &std::path::Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(d.join("config.json")).unwrap()).unwrap()
    };
    let (c, cp) = (cfg(&drafter), cfg(&pard));
    assert_eq!(
        (c["dlm_attention"].as_str(), c["dlm_block_size"].as_u64()),
        (Some("block"), Some(4))
    );
    assert_eq!(c["mask_token_id"], cp["pard_token"]);
    let d = drafter.to_str().unwrap();
    let mut ev = base("dlm");
    ev.extend(["--evaluate", d].map(String::from));
    let r = run_owned(&ev);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(json_of(&r)["expected_tau"].as_f64().unwrap() >= 1.0);
    // A 3-gram model with the target's tokenizer.
    let corpus = dir.path().join("c.jsonl");
    let docs: Vec<String> = (0..20)
        .map(|i| format!("{{\"text\": \"count to {i}: one two three and so on {i}\"}}"))
        .collect();
    std::fs::write(&corpus, docs.join("\n")).unwrap();
    let arpa = dir.path().join("lm.arpa");
    let c = corpus.to_str().unwrap();
    let r = run(&[
        "ngram",
        "arpa",
        "--model",
        &m,
        "--corpus",
        c,
        "--out",
        arpa.to_str().unwrap(),
        "--text",
        c,
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let a = arpa.to_str().unwrap();
    let gen = |extra: &[&str]| gen16(&m, extra);
    let ds = ["--drafter", "diffuspec", "--draft-model", d];
    fn cat<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<&'a str> {
        [a, b].concat()
    }
    assert_each_matches_ar(
        &m,
        &[
            &cat(&ds, &["--no-cps"]),
            &cat(&ds, &["--ngram-arpa", a]),
            &cat(
                &ds,
                &[
                    "--ngram-arpa",
                    a,
                    "--dlm-steps",
                    "2",
                    "--draft-length",
                    "adl",
                ],
            ),
            &cat(
                &ds,
                &["--no-cps", "--dlm-mode", "faithful", "--fixed-draft"],
            ),
        ],
    );
    assert_eq!(
        sampled16(&m, &cat(&ds, &["--ngram-arpa", a])),
        sampled16(&m, &[])
    );
    assert_refused(
        &gen(&[
            "--drafter",
            "diffuspec",
            "--draft-model",
            pard.to_str().unwrap(),
            "--no-cps",
        ]),
        "not a diffusion drafter",
    );
    let mut args = ds.to_vec();
    args.extend(["--no-cps", "--ngram-arpa", a]);
    assert_refused(&gen(&args), "--no-cps");
    assert_refused(&gen(&["--drafter", "pard", "--no-cps"]), "--no-cps");
    assert_refused(
        &gen(&[
            "--drafter",
            "diffuspec",
            "--draft-model",
            d,
            "--dlm-mode",
            "slow",
        ]),
        "DLM mode",
    );
}

/// `train pard` end to end on a tiny model (data, COD training, export, held-out evaluation,
/// re-evaluation of the export), then decoding with the exported drafter — chain, sampled and
/// tree, K beyond the trained one — matches AR; K 0 is refused, and so is a target the trainer
/// cannot adapt (RoPE scaling).
#[test]
fn train_pard_exports_a_drafter_that_decodes_losslessly() {
    let m = tiny("qwen3");
    let dir = tempfile::tempdir().unwrap();
    let prompts = four_prompts(dir.path());
    let out = dir.path().join("run");
    let base =
        |model: &str, out: &str| mask_train_args("pard", model, out, prompts.to_str().unwrap());
    let args = base(&m, out.to_str().unwrap());
    let r = run_owned(&args);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let drafter = out.join("pard-drafter");
    for f in ["config.json", "model.safetensors"] {
        assert!(drafter.join(f).exists(), "{f}");
    }
    assert!(out.join("pard/eval.json").exists() && out.join("pard/loss.svg").exists());
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(drafter.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(
        (cfg["spd_type"].as_str(), cfg["pard_k"].as_u64()),
        (Some("pard"), Some(4))
    );
    let d = drafter.to_str().unwrap();
    let mut ev = args.clone();
    ev.extend(["--evaluate".to_string(), d.to_string()]);
    let r = run_owned(&ev);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(json_of(&r)["expected_tau"].as_f64().unwrap() >= 1.0);
    let gen = |extra: &[&str]| gen16(&m, extra);
    assert_each_matches_ar(
        &m,
        &[
            &["--drafter", "pard", "--draft-model", d][..],
            &[
                "--drafter",
                "pard",
                "--draft-model",
                d,
                "--num-speculative-tokens",
                "6",
            ],
            &["--drafter", "pard-tree", "--draft-model", d, "--no-ngram"],
            &[
                "--drafter",
                "pard",
                "--draft-model",
                d,
                "--draft-length",
                "adl",
            ],
            &["--drafter", "pard", "--draft-model", d, "--cps"],
        ],
    );
    assert_eq!(
        sampled16(&m, &["--drafter", "pard-sample", "--draft-model", d]),
        sampled16(&m, &[])
    );
    assert_refused(
        &gen(&[
            "--drafter",
            "pard",
            "--draft-model",
            d,
            "--num-speculative-tokens",
            "0",
        ]),
        "num_speculative_tokens",
    );
    assert_refused(
        &gen(&[
            "--drafter",
            "pard",
            "--draft-model",
            d,
            "--fixed-draft",
            "--draft-length",
            "adl",
        ]),
        "exclude each other",
    );
    assert_refused(&gen(&["--drafter", "pld", "--cps"]), "--cps");
    let llama = tiny("llama");
    let other = dir.path().join("llama-run");
    let args = base(&llama, other.to_str().unwrap());
    assert_refused(&run_owned(&args), "RoPE scaling");
}
