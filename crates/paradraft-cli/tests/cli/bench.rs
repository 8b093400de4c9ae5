//! `bench`, its options at their extremes, and `ngram arpa`.

use super::*;

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
/// `bench --prompts FILE` (#58): a Spec-Bench `question.jsonl` (two categories, one two-turn
/// question) and a chat line with a system message, reported per category; a bad line and a
/// prompt longer than the context are refused before anything runs, naming the line or prompt.
#[test]
fn bench_runs_a_users_prompt_file_per_category() {
    let m = tiny("qwen3");
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("question.jsonl");
    let lines = [
        r#"{"question_id": 1, "category": "writing", "turns": ["Write a line.", "Another."]}"#,
        r#"{"question_id": 2, "category": "math_reasoning", "turns": ["What is 2+3?"]}"#,
        r#"{"question_id": 3, "category": "math_reasoning", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "And 4+4?"}]}"#,
    ];
    std::fs::write(&f, lines.join("\n") + "\n").unwrap();
    let out = dir.path().join("out");
    let (fs, os) = (f.display().to_string(), out.display().to_string());
    let args = |file: &str, extra: &[&str]| {
        let mut v = vec![
            "bench",
            "--model",
            &m,
            "--methods",
            "pld",
            "--prompts",
            file,
            "--max-new-tokens",
            "6",
            "--out",
            &os,
            "--threads",
            "1",
        ];
        v.extend_from_slice(extra);
        v.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let a = args(&fs, &[]);
    let r = run(&a.iter().map(|s| s.as_str()).collect::<Vec<_>>());
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let rows = summary["summaries"].as_array().unwrap();
    let sets: Vec<(&str, &str, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["dataset"].as_str().unwrap(),
                r["method"].as_str().unwrap(),
                r["runs"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        sets,
        [
            ("writing", "ar", 2),
            ("writing", "pld", 2),
            ("math_reasoning", "ar", 2),
            ("math_reasoning", "pld", 2)
        ],
        "two turns of the writing question, one each of the two math ones"
    );
    assert!(rows.iter().all(|r| r["ar_mismatches"] == 0));
    assert_eq!(summary["header"]["prompt_file"].as_str(), Some(fs.as_str()));
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(md.contains("per category"), "{md}");
    // A bad line: refused with its file and line before the model loads.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, format!("{}\n{{\"turns\": []}}\n", lines[0])).unwrap();
    let a = args(&bad.display().to_string(), &[]);
    let r = run(&a.iter().map(|s| s.as_str()).collect::<Vec<_>>());
    assert_refused(&r, "bad.jsonl:2: no user turn");
    // A prompt that cannot fit the context with its new tokens.
    let long = dir.path().join("long.jsonl");
    let text = "word ".repeat(400);
    std::fs::write(&long, format!("{{\"prompt\": \"{text}\"}}\n")).unwrap();
    let a = args(&long.display().to_string(), &["--ctx-size", "256"]);
    let r = run(&a.iter().map(|s| s.as_str()).collect::<Vec<_>>());
    assert_refused(&r, "do not fit the 256-token context");
    // --prompts replaces the datasets; --category-field needs it.
    let a = args(&fs, &["--datasets", "gsm8k"]);
    let r = run(&a.iter().map(|s| s.as_str()).collect::<Vec<_>>());
    assert!(!r.status.success());
    let r = run(&["bench", "--category-field", "task"]);
    assert!(!r.status.success());
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
