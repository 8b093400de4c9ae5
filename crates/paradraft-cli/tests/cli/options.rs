//! Prompts from anywhere, options at their extremes, options never silently ignored, the README's drafters.

use super::*;

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
    let (ar, _) = gen(&["--drafter", "none"]);
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
        "auto",
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

/// `--drafter auto` with its default sources and with each alone gives AR's tokens at T = 0 and
/// AR's own samples at T > 0 (coupled rule); a source that is not one, one listed twice, two
/// model sources, a source's drafter or trie that cannot be read are refused naming the
/// source; `--sources` without auto is refused.
#[test]
fn auto_matches_ar_and_names_the_source_it_refuses() {
    let model = paradraft::fetch::ensure_default_model().unwrap();
    let m = model.to_str().unwrap();
    let ar = json_of(&gen16(m, &[]))["token_ids"].clone();
    let sampled = |extra: &[&str]| {
        let mut a = vec!["--temperature", "0.9", "--seed", "4"];
        a.extend_from_slice(extra);
        json_of(&gen16(m, &a))["token_ids"].clone()
    };
    let ar_t = sampled(&[]);
    for sources in [
        "pld,suffix,trie,dart",
        "pld",
        "trie",
        "dart",
        "suffix",
        "recycle",
        "pld,suffix,trie,recycle,dart",
    ] {
        let extra = ["--drafter", "auto", "--sources", sources];
        assert_eq!(json_of(&gen16(m, &extra))["token_ids"], ar, "{sources}");
        assert_eq!(sampled(&extra), ar_t, "{sources} at T 0.9");
    }
    let dir = tempfile::tempdir().unwrap();
    let bad_trie = dir.path().join("bad.trie");
    std::fs::write(&bad_trie, b"not a trie").unwrap();
    let bad_trie = bad_trie.to_str().unwrap();
    let missing = dir.path().join("missing");
    let missing = missing.to_str().unwrap();
    for (extra, want) in [
        (vec!["--sources", "pld,bogus"], "auto's source \"bogus\""),
        (vec!["--sources", "pld,pld"], "listed twice"),
        (vec!["--sources", "none"], "is not a model drafter"),
        (vec!["--sources", "dart,pard"], "one model drafter"),
        (
            vec!["--sources", "pld,trie", "--ngram", bad_trie],
            "auto's source trie",
        ),
        (
            vec!["--sources", "dart", "--draft-model", missing],
            "auto's source dart",
        ),
        (vec!["--sources", ""], "auto's source \"\""),
        (
            vec![
                "--speculative-config",
                r#"{"method": "auto", "sources": []}"#,
            ],
            "at least one source",
        ),
    ] {
        let mut a = vec!["--drafter", "auto"];
        a.extend_from_slice(&extra);
        assert_refused(&gen16(m, &a), want);
    }
    assert_refused(
        &gen16(m, &["--drafter", "pld", "--sources", "pld"]),
        "--sources has no effect with pld",
    );
}
