//! What the decode loop hands drafters (the target's hidden states) and stop strings.

use super::*;

/// Records the hidden states it is given; drafts random trees so that compaction happens.
struct TapRecorder {
    taps: Vec<usize>,
    rows: Vec<f32>,
    width: usize,
    rng: Lcg,
    vocab: u32,
}

impl Drafter for TapRecorder {
    fn name(&self) -> &str {
        "tap-recorder"
    }
    fn taps(&self) -> &[usize] {
        &self.taps
    }
    fn begin(&mut self, _: &[TokenId], h: Hidden) -> paradraft::Result<()> {
        self.width = h.width;
        self.rows = h.rows.to_vec();
        Ok(())
    }
    fn propose(&mut self, _: &[TokenId], max: usize) -> paradraft::Result<DraftTree> {
        Ok(random_tree(&mut self.rng, &[], self.vocab, max))
    }
    fn observe(&mut self, _: &paradraft::speculative::Outcome, h: Hidden) -> paradraft::Result<()> {
        assert_eq!(h.width, self.width);
        self.rows.extend_from_slice(h.rows);
        Ok(())
    }
}

#[test]
fn drafters_receive_the_targets_hidden_states_of_committed_positions() {
    one_thread();
    use paradraft::model::{Batch, Logits, OutputSpec, Rows, Scratch};
    let lm = load(&fixtures().join("tiny/llama-quant.gguf"));
    let prompt = encode(&lm, "count: 1 2 3 1 2 3 1 2 3 1 2", 64);
    let mut rec = TapRecorder {
        taps: vec![2, 0],
        rows: vec![],
        width: 0,
        rng: Lcg(5),
        vocab: 24,
    };
    let mut kv = lm.model.new_kv(256);
    let g = speculative_generate(
        &lm.model,
        &lm.tokenizer,
        &mut kv,
        &prompt,
        &greedy(30),
        Speculation {
            drafter: Box::new(&mut rec),
            max_draft: 6,
            sizer: None,
            rule: Default::default(),
        },
        |_| {},
    )
    .unwrap();
    // Every committed position except the last root has been reported, in order.
    let mut seq = prompt.clone();
    seq.extend(&g.out.token_ids);
    let n = prompt.len() + g.rounds.len();
    assert_eq!(rec.rows.len(), n * rec.width);
    let mut s = Scratch::default();
    let mut kv = lm.model.new_kv(256);
    let pos = seq_positions(0, n);
    let spec = OutputSpec {
        rows: Rows::Last,
        logits: Logits::None,
        taps: vec![2, 0],
    };
    let out = lm
        .model
        .forward(
            &mut kv,
            &Batch {
                tokens: &seq[..n],
                positions: &pos,
                mask: None,
            },
            &spec,
            &mut s,
        )
        .unwrap();
    assert_eq!(
        out.hidden, rec.rows,
        "taps differ from a fresh forward over the committed tokens"
    );
}

fn load(p: &std::path::Path) -> Loaded {
    model::load(p).unwrap()
}

#[test]
fn stop_strings_cut_at_their_first_occurrence() {
    one_thread();
    // Stop strings spanning several tokens, found wherever they end (the emitter searches only
    // the tail each token), with and without a drafter.
    let lm = load(&fixtures().join("tiny/qwen3"));
    let prompt = encode(&lm, "count: 1 2 3 1 2 3 1 2 3 1 2", 64);
    let mut kv = lm.model.new_kv(256);
    let free = generate(
        &lm.model,
        &lm.tokenizer,
        &mut kv,
        &prompt,
        &greedy(40),
        |_| {},
    )
    .unwrap();
    let text = free.text.clone();
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    assert!(chars.len() > 20, "{text:?}");
    for (a, b) in [(2, 9), (10, 16), (chars.len() - 6, chars.len())] {
        let stop = text[chars[a].0..chars.get(b).map_or(text.len(), |c| c.0)].to_string();
        let first = text.find(&stop).unwrap();
        let params = GenerateParams {
            stop_strings: vec!["never appears ∅".into(), stop.clone()],
            ..greedy(40)
        };
        let mut streamed = String::new();
        let ar = generate(&lm.model, &lm.tokenizer, &mut kv, &prompt, &params, |t| {
            streamed.push_str(t)
        })
        .unwrap();
        assert_eq!(ar.text, text[..first], "stop {stop:?}");
        assert_eq!(streamed, ar.text);
        assert_eq!(ar.stop_reason, paradraft::generate::StopReason::StopString);
        let mut pld = PromptLookup::default();
        let sp = Speculation {
            drafter: Box::new(&mut pld),
            max_draft: 6,
            sizer: None,
            rule: VerifyRule::Coupled,
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
        assert_eq!(g.out.text, ar.text, "pld, stop {stop:?}");
    }
}
