//! Bad input gets a clear error, never a panic: missing, truncated or corrupt model files,
//! unsupported architectures and tensor types, models that do not match their config, prompts
//! longer than the context, invalid sampling parameters and malformed forward requests.

mod common;
use common::*;
use paradraft::generate::{generate, GenerateParams};
use paradraft::model::{self, Batch, OutputSpec, Scratch, TreeMask};
use paradraft::sample::SamplingParams;
use paradraft::types::{Pos, TokenId};
use paradraft::Error;
use std::path::{Path, PathBuf};

fn load_err(p: &Path) -> Error {
    match model::load(p) {
        Ok(_) => panic!("{} loaded but should not", p.display()),
        Err(e) => e,
    }
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
}

/// A copy of a tiny HF model with its config.json edited.
fn edited_tiny(
    name: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> (tempfile::TempDir, PathBuf) {
    let td = tempfile::tempdir().unwrap();
    let dir = td.path().join(name);
    copy_dir(&fixtures().join("tiny").join(name), &dir);
    let cp = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cp).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&cp, serde_json::to_string(&v).unwrap()).unwrap();
    (td, dir)
}

/// A minimal GGUF v3 with string metadata and tensors given as (name, dims, ggml type, data).
fn write_gguf(path: &Path, kv: &[(&str, &str)], tensors: &[(&str, Vec<u64>, u32, Vec<u8>)]) {
    let mut b = Vec::new();
    let s = |b: &mut Vec<u8>, x: &str| {
        b.extend((x.len() as u64).to_le_bytes());
        b.extend(x.as_bytes());
    };
    b.extend(b"GGUF");
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((kv.len() as u64).to_le_bytes());
    for (k, v) in kv {
        s(&mut b, k);
        b.extend(8u32.to_le_bytes());
        s(&mut b, v);
    }
    let mut off = 0u64;
    for (name, dims, ty, data) in tensors {
        s(&mut b, name);
        b.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            b.extend(d.to_le_bytes());
        }
        b.extend(ty.to_le_bytes());
        b.extend(off.to_le_bytes());
        off += (data.len() as u64).div_ceil(32) * 32;
    }
    while b.len() % 32 != 0 {
        b.push(0);
    }
    for (_, _, _, data) in tensors {
        b.extend(data);
        while b.len() % 32 != 0 {
            b.push(0);
        }
    }
    std::fs::write(path, b).unwrap();
}

#[test]
fn missing_model_path() {
    let e = load_err(Path::new("/nonexistent/model.gguf"));
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert!(e.to_string().contains("/nonexistent/model.gguf"));
}

#[test]
fn truncated_gguf() {
    let src = std::fs::read(fixtures().join("tiny/llama-quant.gguf")).unwrap();
    let td = tempfile::tempdir().unwrap();
    for frac in [0.02, 0.3, 0.9, 0.999] {
        let p = td.path().join("t.gguf");
        std::fs::write(&p, &src[..(src.len() as f64 * frac) as usize]).unwrap();
        let e = load_err(&p);
        assert!(matches!(e, Error::BadModelFile { .. }), "{frac}: {e}");
    }
    let p = td.path().join("empty.gguf");
    std::fs::write(&p, b"").unwrap();
    assert!(matches!(load_err(&p), Error::BadModelFile { .. }));
}

#[test]
fn corrupt_gguf() {
    let td = tempfile::tempdir().unwrap();
    let p = td.path().join("c.gguf");
    std::fs::write(&p, b"this is not a model file at all, just some text").unwrap();
    let e = load_err(&p);
    assert!(e.to_string().contains("magic"), "{e}");
    // A huge string length in the header must not allocate or panic.
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend(1u64.to_le_bytes());
    b.extend(u64::MAX.to_le_bytes());
    std::fs::write(&p, b).unwrap();
    assert!(matches!(load_err(&p), Error::BadModelFile { .. }));
}

#[test]
fn unsupported_architecture() {
    let td = tempfile::tempdir().unwrap();
    let p = td.path().join("a.gguf");
    write_gguf(&p, &[("general.architecture", "falcon")], &[]);
    let e = load_err(&p);
    assert!(
        matches!(e, Error::Unsupported(_)) && e.to_string().contains("falcon"),
        "{e}"
    );
    // A mixture-of-experts architecture without its expert keys.
    write_gguf(&p, &[("general.architecture", "qwen2moe")], &[]);
    let e = load_err(&p);
    assert!(e.to_string().contains("qwen2moe.expert_count"), "{e}");
    // A Mixtral-style file: Llama architecture, routed experts.
    write_gguf(
        &p,
        &[("general.architecture", "llama")],
        &[("blk.0.ffn_gate_inp.weight", vec![4, 8], 0, vec![0; 128])],
    );
    let e = load_err(&p);
    assert!(e.to_string().contains("mixture of experts"), "{e}");
    // Mixtures this engine does not run are named: Qwen3-MoE with dense layers among the
    // sparse ones.
    let (_td, dir) = edited_tiny("qwen3moe", |v| {
        v["mlp_only_layers"] = serde_json::json!([1])
    });
    let e = load_err(&dir);
    assert!(
        matches!(e, Error::Unsupported(_)) && e.to_string().contains("mlp_only_layers"),
        "{e}"
    );
    // Qwen2-MoE without its shared expert's width.
    let (_td, dir) = edited_tiny("qwen2moe", |v| {
        v.as_object_mut()
            .unwrap()
            .remove("shared_expert_intermediate_size");
    });
    let e = load_err(&dir);
    assert!(
        e.to_string().contains("shared_expert_intermediate_size"),
        "{e}"
    );
    // More experts per token than there are.
    let (_td, dir) = edited_tiny("qwen3moe", |v| v["num_experts_per_tok"] = 9.into());
    let e = load_err(&dir);
    assert!(
        matches!(e, Error::Unsupported(_)) && e.to_string().contains("9 of 8 experts"),
        "{e}"
    );
    let (_td, dir) = edited_tiny("llama", |v| v["model_type"] = "gpt_neox".into());
    let e = load_err(&dir);
    assert!(
        matches!(e, Error::Unsupported(_)) && e.to_string().contains("gpt_neox"),
        "{e}"
    );
}

#[test]
fn unsupported_tensor_type() {
    let td = tempfile::tempdir().unwrap();
    let p = td.path().join("iq2.gguf");
    // GGML type 16 is IQ2_XXS (66 bytes per 256 values), which paradraft does not load.
    write_gguf(
        &p,
        &[("general.architecture", "llama")],
        &[("token_embd.weight", vec![256, 4], 16, vec![0u8; 4 * 66])],
    );
    let e = load_err(&p);
    let msg = e.to_string();
    assert!(
        matches!(e, Error::Unsupported(_))
            && msg.contains("IQ2_XXS (GGML type 16)")
            && msg.contains("Q4_K")
            && msg.contains("token_embd.weight"),
        "{e}"
    );
    // An id GGML does not have at all.
    write_gguf(
        &p,
        &[("general.architecture", "llama")],
        &[("token_embd.weight", vec![256, 4], 77, vec![0u8; 4 * 66])],
    );
    let e = load_err(&p);
    assert!(e.to_string().contains("GGML type 77"), "{e}");
}

#[test]
fn k_quant_tensor_that_does_not_fit_its_blocks() {
    let td = tempfile::tempdir().unwrap();
    let p = td.path().join("q4k.gguf");
    // Q4_K rows hold whole super-blocks of 256 values.
    write_gguf(
        &p,
        &[("general.architecture", "llama")],
        &[("token_embd.weight", vec![288, 4], 12, vec![0u8; 4 * 144])],
    );
    let e = load_err(&p);
    assert!(
        e.to_string().contains("not a multiple of the Q4_K block"),
        "{e}"
    );
    // A file cut short inside a Q6_K tensor.
    write_gguf(
        &p,
        &[("general.architecture", "llama")],
        &[("token_embd.weight", vec![256, 4], 14, vec![0u8; 3 * 210])],
    );
    let e = load_err(&p);
    assert!(e.to_string().contains("truncated"), "{e}");
}

#[test]
fn gguf_missing_metadata_and_tensors() {
    let td = tempfile::tempdir().unwrap();
    let p = td.path().join("m.gguf");
    write_gguf(&p, &[("general.architecture", "llama")], &[]);
    let e = load_err(&p);
    assert!(matches!(e, Error::BadModelFile { .. }), "{e}");
}

#[test]
fn config_that_does_not_match_weights() {
    let (_td, dir) = edited_tiny("qwen3", |v| v["num_hidden_layers"] = 4.into());
    let e = load_err(&dir);
    assert!(e.to_string().contains("model.layers.3"), "{e}");
    let (_td, dir) = edited_tiny("qwen3", |v| v["intermediate_size"] = 96.into());
    let e = load_err(&dir);
    assert!(e.to_string().contains("shape"), "{e}");
    let (_td, dir) = edited_tiny("llama", |v| v["num_key_value_heads"] = 3.into());
    assert!(matches!(load_err(&dir), Error::Unsupported(_)));
}

#[test]
fn broken_hf_directory() {
    let (td, dir) = edited_tiny("llama", |_| {});
    std::fs::write(dir.join("config.json"), "{ not json").unwrap();
    assert!(matches!(load_err(&dir), Error::BadModelFile { .. }));
    drop(td);
    let (_td, dir) = edited_tiny("llama", |_| {});
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    assert!(load_err(&dir).to_string().contains("tokenizer.json"));
    let (_td, dir) = edited_tiny("llama", |_| {});
    let st = dir.join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() / 2]).unwrap();
    assert!(matches!(load_err(&dir), Error::BadModelFile { .. }));
}

#[test]
fn prompt_longer_than_context() {
    let lm = load_tiny("llama");
    let prompt: Vec<TokenId> = (10..40).map(TokenId).collect();
    let mut kv = lm.model.new_kv(16);
    let params = GenerateParams {
        max_new_tokens: 4,
        sampling: SamplingParams::default(),
        stop_strings: vec![],
        ..Default::default()
    };
    let e = generate(&lm.model, &lm.tokenizer, &mut kv, &prompt, &params, |_| {}).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ContextOverflow {
                needed: 31,
                capacity: 16
            }
        ),
        "{e}"
    );
    // A forward past capacity is refused and leaves the cache as it was.
    let mut s = Scratch::default();
    let pos: Vec<Pos> = (0..20).map(Pos).collect();
    let e = lm.model.forward(
        &mut kv,
        &Batch {
            tokens: &prompt[..20],
            positions: &pos,
            mask: None,
        },
        &OutputSpec::last_full(),
        &mut s,
    );
    assert!(matches!(e, Err(Error::ContextOverflow { .. })));
    assert_eq!(kv.len(), 0);
}

#[test]
fn invalid_sampling_parameters() {
    let lm = load_tiny("llama");
    let mut kv = lm.model.new_kv(16);
    for sampling in [
        SamplingParams {
            temperature: -0.5,
            ..Default::default()
        },
        SamplingParams {
            temperature: f32::INFINITY,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.0,
            top_p: 0.0,
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.0,
            top_p: 1.01,
            ..Default::default()
        },
    ] {
        let params = GenerateParams {
            max_new_tokens: 4,
            sampling,
            stop_strings: vec![],
            ..Default::default()
        };
        let e = generate(
            &lm.model,
            &lm.tokenizer,
            &mut kv,
            &[TokenId(5)],
            &params,
            |_| {},
        )
        .unwrap_err();
        assert!(matches!(e, Error::BadSampling(_)), "{e}");
    }
}

#[test]
fn malformed_forward_requests() {
    let lm = load_tiny("llama");
    let mut kv = lm.model.new_kv(16);
    let mut s = Scratch::default();
    let spec = OutputSpec::last_full();
    let f = |kv: &mut paradraft::kv::KvCache, s: &mut Scratch, b: Batch, spec: &OutputSpec| {
        lm.model.forward(kv, &b, spec, s).map(|_| ()).unwrap_err()
    };
    let t = [TokenId(1), TokenId(2)];
    let p = [Pos(0), Pos(1)];
    assert!(matches!(
        f(
            &mut kv,
            &mut s,
            Batch {
                tokens: &[],
                positions: &[],
                mask: None
            },
            &spec
        ),
        Error::BadRequest(_)
    ));
    assert!(matches!(
        f(
            &mut kv,
            &mut s,
            Batch {
                tokens: &t,
                positions: &p[..1],
                mask: None
            },
            &spec
        ),
        Error::BadRequest(_)
    ));
    assert!(matches!(
        f(
            &mut kv,
            &mut s,
            Batch {
                tokens: &[TokenId(100_000)],
                positions: &p[..1],
                mask: None
            },
            &spec
        ),
        Error::BadRequest(_)
    ));
    let m3 = TreeMask::causal(3);
    assert!(matches!(
        f(
            &mut kv,
            &mut s,
            Batch {
                tokens: &t,
                positions: &p,
                mask: Some(&m3)
            },
            &spec
        ),
        Error::BadRequest(_)
    ));
    let taps = OutputSpec {
        taps: vec![99],
        ..OutputSpec::last_full()
    };
    assert!(matches!(
        f(
            &mut kv,
            &mut s,
            Batch {
                tokens: &t,
                positions: &p,
                mask: None
            },
            &taps
        ),
        Error::BadRequest(_)
    ));
    assert!(TreeMask::from_parents(&[None, Some(2), Some(0)]).is_err());
    assert!(TreeMask::from_bits(2, vec![true, false, false, false]).is_err());
    assert_eq!(kv.len(), 0, "refused requests leave the cache untouched");
}

#[test]
fn zero_new_tokens_generates_nothing() {
    use paradraft::drafters::pld::PromptLookup;
    use paradraft::speculative::{speculative_generate, Speculation};
    let lm = load_tiny("qwen3");
    let mut kv = lm.model.new_kv(64);
    let params = GenerateParams {
        max_new_tokens: 0,
        sampling: SamplingParams::default(),
        stop_strings: vec![],
        ..Default::default()
    };
    let prompt: Vec<TokenId> = (10..20).map(TokenId).collect();
    let g = generate(&lm.model, &lm.tokenizer, &mut kv, &prompt, &params, |_| {}).unwrap();
    assert!(g.token_ids.is_empty() && g.text.is_empty());
    let mut d = PromptLookup::default();
    let sp = Speculation {
        drafter: Box::new(&mut d),
        max_draft: 4,
        sizer: None,
        rule: Default::default(),
    };
    let g = speculative_generate(
        &lm.model,
        &lm.tokenizer,
        &mut kv,
        &prompt,
        &params,
        sp,
        |_| {},
    )
    .unwrap();
    assert!(g.out.token_ids.is_empty());
}

/// An edit of a config.json.
type ConfigEdit = fn(&mut serde_json::Value);

/// Gemma options the family does not have, or that disagree with the model, are refused before
/// any forward, naming what is wrong.
#[test]
fn bad_gemma3_configs() {
    let cases: [(&str, ConfigEdit); 4] = [
        ("soft-capping", |v| {
            v["attn_logit_softcapping"] = 50.0.into()
        }),
        ("activation", |v| v["hidden_activation"] = "relu".into()),
        ("layer flags", |v| {
            v["layer_types"] = serde_json::json!(["sliding_attention", "full_attention"])
        }),
        ("layer type", |v| {
            v["layer_types"] = serde_json::json!(["sliding", "full", "full", "full"])
        }),
    ];
    for (what, edit) in cases {
        let (_td, dir) = edited_tiny("gemma3", edit);
        let e = load_err(&dir);
        assert!(matches!(e, Error::Unsupported(_)), "{what}: {e}");
        eprintln!("{what}: {e}");
    }
    let (_td, dir) = edited_tiny("gemma3", |v| v["model_type"] = "gemma3".into());
    assert!(load_err(&dir).to_string().contains("gemma3_text"));
}

/// Phi-3 settings this engine cannot run are refused by name: LongRoPE without usable
/// factors, a partial rotary share (in either place transformers writes it) that is odd or
/// larger than the head.
#[test]
fn unsupported_phi3_variants() {
    let cases: [(&str, ConfigEdit); 4] = [
        (
            "LongRoPE",
            |v| v["rope_scaling"] = serde_json::json!({"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}),
        ),
        (
            "LongRoPE",
            |v| {
                v["rope_parameters"] =
                    serde_json::json!({"rope_type": "longrope", "rope_theta": 10000.0})
            },
        ),
        // Partial rotary embeddings run (Phi-4-mini); an odd or oversized share is refused.
        ("partial rotary", |v| {
            v["partial_rotary_factor"] = 0.5625.into() // 9 of 16
        }),
        (
            "partial rotary",
            |v| v["rope_parameters"] = serde_json::json!({"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.5}),
        ),
    ];
    for (what, edit) in cases {
        let (_td, dir) = edited_tiny("phi3", edit);
        let e = load_err(&dir);
        assert!(
            matches!(e, Error::Unsupported(_)) && e.to_string().contains(what),
            "{what}: {e}"
        );
    }
}
