//! The CLI's JSON output is a contract that tests and benchmarks rely on; errors exit non-zero
//! with a message, never a panic.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_paradraft"))
        .args(args)
        .output()
        .unwrap()
}

/// [`run`] with owned arguments.
fn run_owned(args: &[String]) -> Output {
    run(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn json_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

fn tiny(name: &str) -> String {
    fixtures().join("tiny").join(name).display().to_string()
}

#[test]
fn generate_json_contract() {
    let m = tiny("qwen3");
    let out = run(&[
        "generate",
        "--model",
        &m,
        "--prompt",
        "hello there",
        "--max-new-tokens",
        "6",
        "--json",
        "--threads",
        "1",
    ]);
    let v = json_of(&out);
    assert!(v["text"].is_string());
    assert!(v["prompt_token_ids"].as_array().unwrap().len() > 3);
    let n = v["token_ids"].as_array().unwrap().len();
    assert!(n <= 6);
    assert!(v["stats"]["prefill_tok_s"].as_f64().unwrap() > 0.0);
    assert!(v["stats"]["decode_tok_s"].is_number());
    assert!(v["stop_reason"].is_string());
}

#[test]
fn greedy_is_deterministic_and_sampling_is_seeded() {
    let m = tiny("llama");
    let base = [
        "generate",
        "--model",
        &m,
        "--prompt",
        "hi",
        "--max-new-tokens",
        "12",
        "--json",
    ];
    let a = json_of(&run(&base));
    let b = json_of(&run(&base));
    assert_eq!(a["token_ids"], b["token_ids"]);
    let sampled = |seed: &str| {
        let mut args = base.to_vec();
        args.extend(["--temperature", "1.5", "--seed", seed]);
        json_of(&run(&args))["token_ids"].clone()
    };
    assert_eq!(sampled("7"), sampled("7"));
    let seeds: Vec<Value> = ["1", "2", "3", "4"].iter().map(|s| sampled(s)).collect();
    assert!(
        seeds.iter().any(|s| *s != seeds[0]),
        "different seeds should give different samples"
    );
}

#[test]
fn logits_json_contract() {
    let m = tiny("qwen2");
    let v = json_of(&run(&[
        "logits",
        "--model",
        &m,
        "--token-ids",
        "5,6,7,8",
        "--top-k",
        "3",
        "--json",
    ]));
    assert_eq!(v["token_ids"], serde_json::json!([5, 6, 7, 8]));
    let pos = v["positions"].as_array().unwrap();
    assert_eq!(pos.len(), 4);
    for p in pos {
        let top = p["top"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert!(top[0][1].as_f64().unwrap() >= top[1][1].as_f64().unwrap());
    }
    let v = json_of(&run(&[
        "logits", "--model", &m, "--prompt", "hello", "--chat", "--json",
    ]));
    assert_eq!(
        v["positions"].as_array().unwrap().len(),
        v["token_ids"].as_array().unwrap().len()
    );
}

#[test]
fn errors_exit_nonzero_without_panicking() {
    let m = tiny("llama");
    let cases: Vec<Vec<&str>> = vec![
        vec!["generate", "--model", "/nonexistent.gguf", "--prompt", "x"],
        vec![
            "generate",
            "--model",
            &m,
            "--prompt",
            "x",
            "--temperature=-1",
        ],
        vec!["generate", "--model", &m, "--prompt", "x", "--top-p", "2"],
        vec![
            "generate",
            "--model",
            &m,
            "--prompt",
            "a long prompt that will not fit",
            "--ctx-size",
            "4",
        ],
        vec!["logits", "--model", &m, "--token-ids", "1,2,99999"],
        vec!["logits", "--model", &m],
    ];
    for args in cases {
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.starts_with("error:"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// Top-20 logits of the real model at every position, on the kernel family `isa`.
fn real_model_logits(isa: &str) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_paradraft"))
        .args([
            "logits",
            "--prompt",
            "Explain why the sky is blue, in one sentence.",
            "--chat",
            "--json",
            "--threads",
            "2",
        ])
        .env("PARADRAFT_ISA", isa)
        .output()
        .unwrap();
    json_of(&out)
}

#[test]
fn kernel_families_agree_on_the_real_model() {
    // The AVX-512 VNNI, AVX2 and portable kernels run the same int8 arithmetic (kernel tests
    // check them against each other to f32 rounding). Through 30 layers, rounding differences
    // move some activations across an int8 quantization step, so whole-model logits differ like
    // two int8 runs do: compare with the foundation's parity bar (mean |Δlogit| ≤ 0.3), and
    // allow an argmax to differ only at a near-tie of the reference (top-2 margin < 0.5).
    let best_isa = paradraft::runtime::isa::detect();
    let best = real_model_logits(best_isa.name());
    let others = paradraft::runtime::isa::Isa::ALL
        .into_iter()
        .filter(|&i| i < best_isa)
        .map(|i| i.name());
    for isa in others {
        let other = real_model_logits(isa);
        assert_eq!(best["token_ids"], other["token_ids"]);
        let (a, b) = (
            best["positions"].as_array().unwrap(),
            other["positions"].as_array().unwrap(),
        );
        let (mut sum, mut n) = (0f64, 0usize);
        for (pa, pb) in a.iter().zip(b) {
            let (ta, tb) = (pa["top"].as_array().unwrap(), pb["top"].as_array().unwrap());
            let logit = |e: &Value| e[1].as_f64().unwrap();
            if ta[0][0] != tb[0][0] {
                let margin = logit(&ta[0]) - logit(&ta[1]);
                assert!(
                    margin < 0.5,
                    "{isa}: argmax differs at a margin of {margin}"
                );
            }
            for x in ta {
                if let Some(y) = tb.iter().find(|y| y[0] == x[0]) {
                    sum += (logit(x) - logit(y)).abs();
                    n += 1;
                }
            }
        }
        let mean = sum / n as f64;
        assert!(mean <= 0.3, "{isa}: mean |Δlogit| {mean}");
    }
}

#[test]
fn speculative_generation_matches_ar_and_reports_rounds() {
    let m = tiny("qwen3");
    let base = [
        "generate",
        "--model",
        &m,
        "--prompt",
        "count: 1 2 3 1 2 3 1 2 3",
        "--max-new-tokens",
        "20",
        "--json",
    ];
    let ar = json_of(&run(&base));
    let with = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        json_of(&run(&args))
    };
    for extra in [
        vec!["--drafter", "pld"],
        vec![
            "--drafter",
            "draft-model",
            "--draft-layers",
            "1",
            "--num-speculative-tokens",
            "3",
        ],
        vec![
            "--speculative-config",
            r#"{"method": "pld", "num_speculative_tokens": 4, "prompt_lookup_max": 2}"#,
        ],
    ] {
        let v = with(&extra);
        assert_eq!(v["token_ids"], ar["token_ids"], "{extra:?}");
        let st = &v["stats"];
        assert!(st["rounds"].as_u64().unwrap() >= 1);
        assert!(st["tau"].as_f64().unwrap() >= 1.0);
        for k in ["draft_ms", "verify_ms", "commit_ms"] {
            assert!(st[k].as_f64().is_some(), "{k}");
        }
        assert_eq!(
            v["rounds_detail"].as_array().unwrap().len() as u64,
            st["rounds"].as_u64().unwrap()
        );
    }
}

#[test]
fn bad_speculative_configs_are_refused() {
    let m = tiny("qwen3");
    for cfg in [
        r#"{"method": "eagle"}"#,
        r#"{"method": "pld", "k": 3}"#,
        "not json",
        r#"{"method": "draft_model"}"#,
        r#"{"method": "pld", "num_speculative_tokens": 0}"#,
    ] {
        let out = run(&[
            "generate",
            "--model",
            &m,
            "--prompt",
            "x",
            "--speculative-config",
            cfg,
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cfg}: {err}");
        assert!(
            err.starts_with("error:") && !err.contains("panicked"),
            "{cfg}: {err}"
        );
    }
}

#[test]
fn bench_harness_writes_reports() {
    let m = tiny("qwen3");
    let out = std::env::temp_dir().join(format!("paradraft-bench-{}", std::process::id()));
    let o = out.display().to_string();
    let r = run(&[
        "bench",
        "--model",
        &m,
        "--methods",
        "pld,draft-model",
        "--draft-layers",
        "1",
        "--datasets",
        "mt_bench,gsm8k",
        "--num-prompts",
        "2",
        "--max-new-tokens",
        "8",
        "--out",
        &o,
        "--threads",
        "1",
        "--ctx-size",
        "2048",
        // The tiny model's trained context is 256 tokens; MT-Bench's second turns need more.
        "--force-ctx-size",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let h = &summary["header"];
    assert_eq!(h["threads"], 1);
    // An HF directory: config.json and each safetensors file by its sha256.
    let sha = h["model_sha256"].as_str().unwrap();
    assert!(
        sha.contains("config.json:") && sha.contains("model.safetensors:"),
        "{h}"
    );
    for k in ["cpu", "date", "commit", "verify_rule"] {
        assert!(!h[k].as_str().unwrap().is_empty(), "{k}");
    }
    let rows = summary["summaries"].as_array().unwrap();
    assert_eq!(rows.len(), 2 * 3, "2 datasets × (ar, pld, self-draft)");
    for row in rows {
        assert!(row["tok_s"].as_f64().unwrap() > 0.0);
        assert!(row["tau_micro"].as_f64().unwrap() >= 1.0);
        let sp: Vec<f64> = serde_json::from_value(row["speedup_spread"].clone()).unwrap();
        assert!(sp[0] <= sp[1] && sp[1] <= sp[2] && sp[0] > 0.0, "{sp:?}");
        // T = 0: every method must reproduce AR, and did.
        assert_eq!(row["ar_mismatches"], 0, "{row}");
        if row["method"] == "ar" {
            assert_eq!(row["speedup"].as_f64().unwrap(), 1.0);
        }
    }
    // MT-Bench items have two turns: 2 items × 2 turns × 3 methods, plus 2 GSM8K items × 3.
    let runs = std::fs::read_to_string(out.join("runs.jsonl")).unwrap();
    assert_eq!(runs.lines().count(), 2 * 2 * 3 + 2 * 3);
    for line in runs.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        assert_eq!(
            r["token_ids"].as_array().unwrap().len() as u64,
            r["generated"].as_u64().unwrap()
        );
    }
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        md.contains("sha256") && md.contains("threads") && !md.contains("ERROR"),
        "{md}"
    );
    for f in ["summary.md", "speedup.svg", "latency.svg", "tau_hist.svg"] {
        let text = std::fs::read_to_string(out.join(f)).unwrap();
        assert!(text.len() > 200, "{f}");
    }
    let latency = std::fs::read_to_string(out.join("latency.svg")).unwrap();
    assert!(latency.contains("per generated token"));
    let _ = std::fs::remove_dir_all(&out);
}

/// `paradraft train dflash --model M --out OUT EXTRA…`.
fn train(m: &str, out: &std::path::Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "train",
        "dflash",
        "--model",
        m,
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run(&args)
}

/// `paradraft generate --model M --prompt "count to 3" --max-new-tokens 16 --json EXTRA…`.
fn gen16(m: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "generate",
        "--model",
        m,
        "--prompt",
        "count to 3",
        "--max-new-tokens",
        "16",
        "--json",
    ];
    args.extend_from_slice(extra);
    run(&args)
}

/// Each of `extras` decodes successfully to AR's tokens ([`gen16`]).
fn assert_each_matches_ar(m: &str, extras: &[&[&str]]) {
    let ar = json_of(&gen16(m, &[]));
    for extra in extras {
        let sp = gen16(m, extra);
        assert!(
            sp.status.success(),
            "{}",
            String::from_utf8_lossy(&sp.stderr)
        );
        assert_eq!(json_of(&sp)["token_ids"], ar["token_ids"], "{extra:?}");
    }
}

/// [`gen16`]'s tokens at T 0.8, seed 3.
fn sampled16(m: &str, extra: &[&str]) -> Value {
    let mut a = vec!["--temperature", "0.8", "--seed", "3"];
    a.extend_from_slice(extra);
    json_of(&gen16(m, &a))["token_ids"].clone()
}

/// `train pard|dlm` on a tiny model: 4 samples, a 100-token draft vocabulary, 1 layer, K 4,
/// 2 steps of 2 sequences.
fn mask_train_args(method: &str, model: &str, out: &str, prompts: &str) -> Vec<String> {
    [
        "train",
        method,
        "--model",
        model,
        "--out",
        out,
        "--prompts",
        prompts,
        "--samples",
        "4",
        "--max-new-tokens",
        "12",
        "--draft-vocab",
        "100",
        "--draft-layers",
        "1",
        "--k",
        "4",
        "--batch-seqs",
        "2",
        "--max-steps",
        "2",
    ]
    .map(String::from)
    .to_vec()
}

/// A prompt file of four short training prompts in `dir`.
fn four_prompts(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("p.jsonl");
    let lines: Vec<String> = (0..4)
        .map(|i| format!("{{\"id\": \"p{i}\", \"prompt\": \"count to {i}\"}}"))
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

/// A refused command: exit code 1 and an error that says `want`, no panic.
fn assert_refused(r: &Output, want: &str) {
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{err}");
    assert!(err.contains(want), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

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

/// Prompts come from --prompt, --prompt-file or standard input (`--prompt -`) alike.
#[test]
fn prompts_from_files_and_stdin() {
    let m = tiny("llama");
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("p.txt");
    std::fs::write(&f, "count to three").unwrap();
    let base = ["generate", "--model", &m, "--max-new-tokens", "6", "--json"];
    let direct = json_of(&run(&[&base[..], &["--prompt", "count to three"]].concat()));
    let file = json_of(&run(
        &[&base[..], &["--prompt-file", f.to_str().unwrap()]].concat()
    ));
    assert_eq!(direct["token_ids"], file["token_ids"]);
    assert_eq!(direct["prompt_token_ids"], file["prompt_token_ids"]);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_paradraft"))
        .args([&base[..], &["--prompt", "-"]].concat())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"count to three")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(json_of(&out)["token_ids"], direct["token_ids"]);
    let missing = run(&[&base[..], &["--prompt-file", "/nonexistent/p.txt"]].concat());
    assert_refused(&missing, "--prompt-file");
}

/// Every numeric option at its extremes: a result or a clear error (exit 1 or clap's 2), never
/// a panic or an abort; thread counts and contexts beyond what is sane are refused.
#[test]
fn numeric_options_at_their_extremes_never_panic() {
    let m = tiny("llama");
    let huge = u64::MAX.to_string();
    let cases: Vec<Vec<&str>> = vec![
        vec!["--threads", "0"],
        vec!["--threads", "100000"],
        vec!["--threads", &huge],
        vec!["--ctx-size", "0"],
        vec!["--ctx-size", "100000000"],
        vec!["--ctx-size", &huge, "--force-ctx-size"],
        vec!["--ctx-size", "1"],
        vec!["--max-new-tokens", "0"],
        vec!["--max-new-tokens", &huge, "--ctx-size", "64"],
        vec!["--temperature", "-1"],
        vec!["--temperature", "1e30"],
        vec!["--temperature", "NaN"],
        vec!["--temperature", "1", "--top-k", &huge],
        vec!["--temperature", "1", "--top-p", "0"],
        vec!["--temperature", "1", "--top-p", "2"],
        vec!["--temperature", "1", "--seed", &huge],
        vec!["--drafter", "pld", "--num-speculative-tokens", "0"],
        vec!["--drafter", "pld", "--num-speculative-tokens", &huge],
        vec!["--drafter", "pld", "--prompt-lookup-max", &huge],
        vec!["--drafter", "draft-model", "--draft-layers", "0"],
        vec!["--drafter", "draft-model", "--draft-layers", &huge],
    ];
    for extra in cases {
        let mut args = vec!["generate", "--model", &m, "--prompt", "count"];
        args.extend_from_slice(&extra);
        if !extra.contains(&"--max-new-tokens") {
            args.extend_from_slice(&["--max-new-tokens", "4"]);
        }
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        assert!(
            matches!(code, Some(0..=2)) && !err.contains("panicked"),
            "{extra:?}: exit {code:?}: {err}"
        );
    }
    let r = run(&[
        "generate",
        "--model",
        &m,
        "--prompt",
        "x",
        "--threads",
        "100000",
    ]);
    assert_refused(&r, "--threads");
    let r = run(&[
        "generate",
        "--model",
        &m,
        "--prompt",
        "x",
        "--ctx-size",
        "100000",
    ]);
    assert_refused(&r, "trained context");
}

/// Options that the chosen drafter (or bench's methods) would not use are errors, not silently
/// ignored; so are `bench --drafter`, `bench --num-prompts 0` and an unknown `PARADRAFT_ISA`.
#[test]
fn options_are_never_silently_ignored() {
    let m = tiny("llama");
    let gen = |extra: &[&str]| {
        let mut a = vec![
            "generate",
            "--model",
            &m,
            "--prompt",
            "x",
            "--max-new-tokens",
            "2",
        ];
        a.extend_from_slice(extra);
        run(&a)
    };
    assert_refused(
        &gen(&["--drafter", "pld", "--draft-model", "/tmp"]),
        "no effect",
    );
    assert_refused(
        &gen(&["--draft-layers", "2"]),
        "--draft-layers has no effect",
    );
    assert_refused(
        &gen(&["--drafter", "pld", "--block-size", "4"]),
        "--block-size",
    );
    assert_refused(&gen(&["--no-ngram"]), "--no-ngram");
    assert_refused(
        &gen(&[
            "--speculative-config",
            r#"{"method": "pld", "model": "/tmp"}"#,
        ]),
        "no effect",
    );
    let bench = |extra: &[&str]| {
        let mut a = vec!["bench", "--model", &m, "--methods", "pld"];
        a.extend_from_slice(extra);
        run(&a)
    };
    assert_refused(&bench(&["--drafter", "pld"]), "--methods");
    assert_refused(&bench(&["--num-prompts", "0"]), "--num-prompts");
    assert_refused(&bench(&["--draft-layers", "2"]), "--draft-layers");
    let isa = std::process::Command::new(env!("CARGO_BIN_EXE_paradraft"))
        .args([
            "generate",
            "--model",
            &m,
            "--prompt",
            "x",
            "--max-new-tokens",
            "1",
        ])
        .env("PARADRAFT_ISA", "foo")
        .output()
        .unwrap();
    assert_refused(&isa, "PARADRAFT_ISA");
}

/// The text stats line names the stop reason as the JSON does.
#[test]
fn text_and_json_name_the_stop_reason_alike() {
    let m = tiny("llama");
    let args = [
        "generate",
        "--model",
        &m,
        "--prompt",
        "count",
        "--max-new-tokens",
        "3",
    ];
    let text = run(&args);
    let json = json_of(&run(&[&args[..], &["--json"]].concat()));
    let reason = json["stop_reason"].as_str().unwrap().to_string();
    let err = String::from_utf8_lossy(&text.stderr);
    assert!(
        err.contains(&format!("stop: {reason}]")),
        "{err} vs {reason}"
    );
}

/// A missing model file is reported once, with its reason once.
#[test]
fn io_errors_name_their_reason_once() {
    let r = run(&[
        "generate",
        "--model",
        "/nonexistent/model.gguf",
        "--prompt",
        "x",
    ]);
    let err = String::from_utf8_lossy(&r.stderr).to_lowercase();
    assert_eq!(r.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("no such file").count(), 1, "{err}");
}

/// `logits` in text prints the top-k it was asked for at every position.
#[test]
fn logits_text_prints_the_requested_top_k() {
    let m = tiny("llama");
    let r = run(&["logits", "--model", &m, "--prompt", "a b c", "--top-k", "4"]);
    let out = String::from_utf8_lossy(&r.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert!(!lines.is_empty());
    for l in lines {
        // position, token, then 4 entries
        assert_eq!(l.split('\t').count(), 6, "{l}");
    }
}

#[test]
fn a_seed_means_one_output_across_drafters_sizes_and_threads() {
    // The issue's command: four runs once gave four texts. Sampling at T > 0 is keyed by
    // (seed, position) and verified by the coupled rule, so every drafter, draft size and thread
    // count gives AR's own sample for the seed.
    let base = [
        "generate",
        "--prompt",
        "List ten common kitchen utensils, one per line, numbered.",
        "--temperature",
        "0.8",
        "--max-new-tokens",
        "40",
        "--json",
    ];
    let ids = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        json_of(&run(&args))["token_ids"].clone()
    };
    let ar = ids(&["--seed", "7", "--threads", "2"]);
    // Seed 7 runs to the token limit on every kernel family, so drafts are tested over 40
    // tokens (another seed may sample the end of the reply sooner: seed 8 does on AVX2).
    assert_eq!(ar.as_array().unwrap().len(), 40);
    assert_eq!(ar, ids(&["--seed", "7", "--threads", "1"]), "AR, 1 thread");
    assert_ne!(ar, ids(&["--seed", "8"]), "another seed, another sample");
    for extra in [
        &["--drafter", "pld"][..],
        &["--drafter", "dflash-sample"],
        &["--drafter", "dflash-sample", "--threads", "1"],
        &[
            "--drafter",
            "dflash-sample",
            "--fixed-draft",
            "--block-size",
            "4",
        ],
        &["--drafter", "dflash", "--fixed-draft"],
        // Trees without the n-gram trie (a clean checkout has none; `ngram build` makes it).
        &[
            "--drafter",
            "dflash-tree",
            "--tree-budget",
            "12",
            "--no-ngram",
        ],
        &["--drafter", "dart", "--no-ngram"],
        &[
            "--drafter",
            "dart",
            "--fixed-draft",
            "--tree-budget",
            "6",
            "--no-ngram",
        ],
        &[
            "--drafter",
            "draft-model",
            "--draft-layers",
            "6",
            "--fixed-draft",
            "--num-speculative-tokens",
            "3",
        ],
    ] {
        let mut args = vec!["--seed", "7"];
        args.extend_from_slice(extra);
        assert_eq!(ids(&args), ar, "{extra:?}");
    }
}

#[test]
fn bench_and_train_options_at_their_extremes_never_panic() {
    let m = tiny("llama");
    let dir = tempfile::tempdir().unwrap();
    let prompts = four_prompts(dir.path());
    let huge = u64::MAX.to_string();
    let ok_or_refused = |args: &[&str], what: &str| {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        assert!(
            matches!(code, Some(0..=2)) && !err.contains("panicked"),
            "{what}: exit {code:?}: {err}"
        );
    };
    let bench_cases: Vec<Vec<&str>> = vec![
        vec![
            "--num-prompts",
            &huge,
            "--datasets",
            "gsm8k",
            "--max-new-tokens",
            "1",
        ],
        vec!["--max-new-tokens", "0"],
        vec!["--max-new-tokens", &huge],
        vec!["--temperature", "NaN"],
        vec!["--temperature", "1e30"],
        vec!["--temperature", "1", "--top-k", &huge, "--seed", &huge],
        vec!["--num-speculative-tokens", "0"],
        vec!["--num-speculative-tokens", &huge],
        vec!["--methods", "dart", "--tree-budget", "0"],
        vec!["--methods", "dart", "--tree-budget", &huge],
        vec!["--methods", "dflash", "--block-size", "0"],
        vec!["--methods", "dflash", "--block-size", &huge],
        vec!["--methods", "draft-model", "--draft-layers", &huge],
        vec!["--threads", &huge],
        vec!["--ctx-size", "1"],
        vec!["--ctx-size", &huge, "--force-ctx-size"],
    ];
    for (i, extra) in bench_cases.iter().enumerate() {
        let out = dir.path().join(format!("bench{i}"));
        let mut args = vec![
            "bench",
            "--model",
            &m,
            "--out",
            out.to_str().unwrap(),
            "--threads",
            "1",
        ];
        if !extra.contains(&"--datasets") {
            args.extend_from_slice(&["--datasets", "gsm8k", "--num-prompts", "1"]);
        }
        if !extra.contains(&"--max-new-tokens") {
            args.extend_from_slice(&["--max-new-tokens", "4"]);
        }
        args.extend_from_slice(extra);
        ok_or_refused(&args, &format!("bench {extra:?}"));
    }
    let p = prompts.to_str().unwrap();
    let common = ["--prompts", p, "--max-new-tokens", "8", "--threads", "1"];
    let train_cases: Vec<(&str, Vec<&str>)> = vec![
        ("dflash", vec!["--block-size", "0"]),
        ("dflash", vec!["--block-size", &huge]),
        ("dflash", vec!["--draft-layers", "0"]),
        ("dflash", vec!["--draft-layers", &huge]),
        ("dflash", vec!["--num-features", "0"]),
        ("dflash", vec!["--target-layers", &huge]),
        ("dflash", vec!["--mask-token-id", &huge]),
        ("dflash", vec!["--anchors", "0"]),
        ("dflash", vec!["--anchors", &huge, "--max-steps", "1"]),
        ("dflash", vec!["--batch-seqs", "0"]),
        ("dflash", vec!["--lr", "NaN"]),
        ("dflash", vec!["--lr", "-1"]),
        ("dflash", vec!["--kl-weight", "NaN"]),
        ("dflash", vec!["--epochs", "0"]),
        ("dflash", vec!["--samples", "0"]),
        ("dflash", vec!["--samples", &huge, "--max-steps", "1"]),
        ("dflash", vec!["--draft-vocab", &huge, "--max-steps", "1"]),
        ("dflash", vec!["--gen-seqs", "0"]),
        ("dflash", vec!["--max-new-tokens", "0"]),
        ("dflash", vec!["--bench", &huge, "--max-steps", "1"]),
        ("dart", vec!["--draft-length", "0"]),
        ("dart", vec!["--draft-length", &huge]),
        ("dart", vec!["--anchors", "0"]),
        ("dart", vec!["--gamma", "NaN"]),
        ("dart", vec!["--gamma", "-1"]),
        ("dart", vec!["--batch-seqs", "0"]),
        ("dart", vec!["--lr", "1e30", "--max-steps", "1"]),
        ("dart", vec!["--save-every", "0", "--max-steps", "1"]),
    ];
    for (i, (method, extra)) in train_cases.iter().enumerate() {
        let out = dir.path().join(format!("train{i}"));
        let mut args = vec![
            "train",
            method,
            "--model",
            &m,
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(&common);
        args.extend_from_slice(extra);
        ok_or_refused(&args, &format!("train {method} {extra:?}"));
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

/// `ngram arpa` builds DiffuSpec's token-level 3-gram from a JSON Lines corpus, stamped with
/// the tokenizer, and reads it back; a malformed corpus line is refused with its line number.
#[test]
fn ngram_arpa_builds_a_stamped_model() {
    let m = tiny("llama");
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    let docs: Vec<String> = (0..30)
        .map(|i| format!("{{\"text\": \"the ship {i} sails on the sea and the sea is calm {i}\"}}"))
        .collect();
    std::fs::write(&corpus, docs.join("\n")).unwrap();
    let out = dir.path().join("lm.arpa");
    let r = run(&[
        "ngram",
        "arpa",
        "--model",
        &m,
        "--corpus",
        corpus.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--text",
        corpus.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        text.starts_with("# paradraft tokenizer="),
        "{}",
        &text[..80]
    );
    assert!(text.contains("\\3-grams:") && text.trim_end().ends_with("\\end\\"));
    assert!(String::from_utf8_lossy(&r.stdout).contains("ns per query"));
    std::fs::write(&corpus, "{\"text\": \"fine\"}\n{\"txt\": 1}\n").unwrap();
    let r = run(&[
        "ngram",
        "arpa",
        "--model",
        &m,
        "--corpus",
        corpus.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_refused(&r, "line 2");
}

/// A user's first minutes (issue #27): every `--drafter` of the README, from a clean
/// `$PARADRAFT_HOME` (no n-gram models anywhere, only what the repository ships), generates AR's tokens
/// at T = 0 on SmolLM2 with its committed drafter; the first tree drafter builds the default
/// trie with a notice, the first `diffuspec` the ARPA model, and later runs reuse them.
#[test]
fn every_readme_drafter_matches_ar_from_a_clean_cache() {
    let model = paradraft::fetch::ensure_default_model().unwrap();
    let m = model.to_str().unwrap();
    let home = tempfile::tempdir().unwrap();
    let gen = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            m,
            "--prompt",
            "What is 12 times 7? Answer briefly.",
            "--max-new-tokens",
            "24",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_paradraft"))
            .args(&args)
            .env("PARADRAFT_HOME", home.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (json_of(&out)["token_ids"].clone(), err)
    };
    let (ar, _) = gen(&[]);
    let mut built = vec![];
    for d in [
        "pld",
        "draft-model",
        "dflash",
        "dflash-sample",
        "dflash-tree",
        "dart",
        "pard",
        "pard-sample",
        "pard-tree",
        "diffuspec",
    ] {
        let mut extra = vec!["--drafter", d, "--draft-length", "fixed"];
        if d == "draft-model" {
            extra.extend(["--draft-layers", "6", "--num-speculative-tokens", "3"]);
        }
        let (ids, err) = gen(&extra);
        assert_eq!(ids, ar, "--drafter {d}: {err}");
        if err.contains("paradraft: building the default") {
            built.push((d, err));
        }
    }
    let which: Vec<&str> = built.iter().map(|b| b.0).collect();
    assert_eq!(which, ["dflash-tree", "diffuspec"], "{built:?}");
    assert!(built[0].1.contains("n-gram trie") && built[1].1.contains("3-gram ARPA model"));
    assert!(home.path().join("ngram").read_dir().unwrap().count() == 2);
}

/// `generate` refuses what the server refuses, through the same validation, naming the flag
/// and its range; negative numbers reach that validation instead of clap's "unexpected
/// argument"; library errors carry no doubled or misleading "invalid request" prefix (#27).
#[test]
fn generate_refuses_what_the_server_refuses_naming_the_flag() {
    let m = tiny("llama");
    for (extra, want) in [
        (
            &["--stop", ""][..],
            "--stop: stop sequences must not be empty",
        ),
        (
            &["--max-new-tokens", "0"],
            "--max-new-tokens: max_tokens must be at least 1, got 0",
        ),
        (
            &["--max-new-tokens", "-1"],
            "--max-new-tokens: max_tokens must be at least 1, got -1",
        ),
        (
            &["--temperature", "5"],
            "--temperature: temperature must be between 0 and 2, got 5",
        ),
        (
            &["--temperature", "-1"],
            "--temperature: temperature must be between 0 and 2, got -1",
        ),
        (
            &["--top-k", "-3"],
            "--top-k: top_k must be -1, 0 (off) or positive, got -3",
        ),
        (&["--top-p", "0"], "--top-p: top_p must be in (0, 1], got 0"),
        (
            &[
                "--stop", "a", "--stop", "b", "--stop", "c", "--stop", "d", "--stop", "e",
            ],
            "--stop: at most 4 stop sequences, got 5",
        ),
        (
            &["--speculative-config", r#"{"method": "foo"}"#],
            "error: speculative config: unknown drafter \"foo\"",
        ),
    ] {
        let mut args = vec!["generate", "--model", &m, "--prompt", "count to 3"];
        args.extend_from_slice(extra);
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} was accepted");
        assert!(err.contains(want), "{extra:?}: {err}");
        assert!(!err.contains("invalid request"), "{extra:?}: {err}");
    }
    let out = run(&["generate", "--model", &m, "--prompt", ""]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--prompt: the prompt is empty"), "{err}");
    // In range: accepted (top-k -1 is "off", as in the API).
    assert!(gen16(&m, &["--top-k", "-1", "--temperature", "2"])
        .status
        .success());
}
