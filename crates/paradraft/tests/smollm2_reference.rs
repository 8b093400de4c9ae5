//! The real model (SmolLM2-135M-Instruct Q4_1 GGUF) against reference logits from HF
//! transformers on the same file dequantised to f32 (fixtures/smollm2_reference.json, written by
//! scripts/make_fixtures.py). The model is fetched into the cache on first use.

mod common;
use common::*;
use paradraft::model::{self, Batch, Logits, Message, OutputSpec, Rows, Scratch};
use paradraft::types::TokenId;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::OnceLock;

fn fixture() -> &'static Value {
    static F: OnceLock<Value> = OnceLock::new();
    F.get_or_init(|| {
        let p = fixtures().join("smollm2_reference.json");
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    })
}

fn smollm2() -> &'static model::Loaded {
    static M: OnceLock<model::Loaded> = OnceLock::new();
    M.get_or_init(|| {
        let path = paradraft::fetch::ensure_default_model().expect("default model available");
        model::load(&path).expect("SmolLM2 loads")
    })
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn logits_match_transformers_reference() {
    let lm = smollm2();
    let (mut agree, mut total) = (0usize, 0usize);
    let (mut dsum, mut dn) = (0f64, 0usize);
    let mut long_prompt = false;
    for p in fixture()["prompts"].as_array().unwrap() {
        let ids: Vec<TokenId> = u32s(&p["token_ids"]).into_iter().map(TokenId).collect();
        long_prompt |= ids.len() > 100;
        let mut kv = lm.model.new_kv(ids.len());
        let mut s = Scratch::default();
        let pos = seq_positions(0, ids.len());
        let spec = OutputSpec {
            rows: Rows::All,
            logits: Logits::TopK(20),
            taps: vec![],
        };
        let out = lm
            .model
            .forward(
                &mut kv,
                &Batch {
                    tokens: &ids,
                    positions: &pos,
                    mask: None,
                },
                &spec,
                &mut s,
            )
            .unwrap();
        for (t, want) in p["top"].as_array().unwrap().iter().enumerate() {
            let want: Vec<(u32, f64)> = want
                .as_array()
                .unwrap()
                .iter()
                .map(|e| (e[0].as_u64().unwrap() as u32, e[1].as_f64().unwrap()))
                .collect();
            let got: HashMap<u32, f32> = out.top[t].iter().map(|(i, l)| (i.0, *l)).collect();
            total += 1;
            agree += (out.top[t][0].0 .0 == want[0].0) as usize;
            for (id, l) in &want {
                if let Some(g) = got.get(id) {
                    dsum += (*g as f64 - l).abs();
                    dn += 1;
                }
            }
        }
    }
    assert!(
        long_prompt,
        "the fixture must hold a prompt over 100 tokens"
    );
    let top1 = agree as f64 / total as f64;
    let mean = dsum / dn as f64;
    eprintln!("SmolLM2 parity: top-1 agreement {top1:.4} over {total} positions, mean |Δlogit| {mean:.4} over {dn} shared ids");
    assert!(top1 >= 0.97, "top-1 agreement {top1}");
    assert!(mean <= 0.3, "mean |Δlogit| {mean}");
}

#[test]
fn chat_template_and_tokenizer_match_reference() {
    let lm = smollm2();
    let tok = &lm.tokenizer;
    for p in fixture()["prompts"].as_array().unwrap() {
        let msgs: Vec<Message> = p["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let text = tok.apply_chat_template(&msgs, true).unwrap();
        assert_eq!(text, p["text"].as_str().unwrap());
        let ids: Vec<u32> = tok.encode(&text).unwrap().iter().map(|t| t.0).collect();
        assert_eq!(ids, u32s(&p["token_ids"]));
    }
    for s in fixture()["tokenize"].as_array().unwrap() {
        let text = s["text"].as_str().unwrap();
        let ids: Vec<u32> = tok.encode(text).unwrap().iter().map(|t| t.0).collect();
        assert_eq!(ids, u32s(&s["token_ids"]), "tokenizing {text:?}");
    }
    // <|im_end|> (the EOS) ends generation
    let im_end = tok.encode("<|im_end|>").unwrap();
    assert_eq!(im_end.len(), 1);
    assert!(tok.stop_tokens.contains(&im_end[0]));
}
