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
    // AR unless the extras name a drafter (`generate` drafts with `auto` by default).
    if !extra
        .iter()
        .any(|a| *a == "--drafter" || *a == "--speculative-config")
    {
        args.extend(["--drafter", "none"]);
    }
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

mod bench;
mod generate;
mod options;
mod train;
