//! The DART training campaign (issue #23): online taps equal the stored feature cache; corpus
//! text is labelled by the target (on the target's own greedy text the teacher-forced loss
//! equals the distilled one); a campaign resumes where its last good checkpoint left it, skips
//! a broken one, keeps its log and curve consistent, grows its data by self-distillation and
//! refuses a directory made for another target or a corpus that is not JSON Lines.

#[path = "../common/mod.rs"]
mod common;
mod runs;
mod taps;

use common::{load_tiny, tiny_dart_dir, tiny_dflash_config, tiny_dflash_dir};
use paradraft::generate::{generate, GenerateParams};
use paradraft::model::{Loaded, Message};
use paradraft::sample::SamplingParams;
use paradraft::train::campaign::{self, CampaignMethod, Event, Params, Setup, Sources, Stamp};
use paradraft::train::dart::{self, net::Net};
use paradraft::train::data::{read_samples, Sample, SampleWriter};
use paradraft::train::features::{self, OnlineTaps, TapSource};
use paradraft::train::run::Data;
use std::io::Write;
use std::path::Path;

/// Greedy answers of the tiny target to `n` short prompts, as samples (prompt index i).
fn greedy_samples(lm: &Loaded, n: usize, new_tokens: usize) -> Vec<Sample> {
    let mut kv = lm.model.new_kv(256);
    (0..n)
        .map(|i| {
            let prompt = lm
                .tokenizer
                .encode_chat(&[Message::new("user", &prompt_text(i))], true)
                .unwrap();
            let params = GenerateParams {
                max_new_tokens: new_tokens,
                sampling: SamplingParams::default(),
                stop_strings: vec![],
                ..Default::default()
            };
            let out =
                generate(&lm.model, &lm.tokenizer, &mut kv, &prompt, &params, |_| {}).unwrap();
            let mut tokens = prompt.clone();
            tokens.extend_from_slice(&out.token_ids);
            Sample {
                prompt_index: i as u32,
                prompt_len: prompt.len() as u32,
                tokens,
            }
        })
        .collect()
}

fn prompt_text(i: usize) -> String {
    format!("question number {i}: tell me about the number {}", i * 7)
}
