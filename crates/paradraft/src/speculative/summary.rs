//! What a speculative generation reports as a whole: the round totals beside the AR fields,
//! and why rounds drafted nothing (`generate --json`, the stats line).

use super::sizing::{CostCurve, UndraftedCounts};
use super::{RoundStats, SpecGeneration};
use serde_json::{json, Value};

impl SpecGeneration {
    /// The generation as JSON: the AR fields, `stats` with the round totals (rounds, τ, ms
    /// per phase, rounds without a draft and why), the rounds as `rounds_detail`. `curve`:
    /// the verify costs sizing used, to explain rounds the cost model left undrafted.
    pub fn summary_json(&self, curve: Option<&CostCurve>) -> Value {
        let sum = |f: fn(&RoundStats) -> f64| self.rounds.iter().map(f).sum::<f64>();
        let mut v = serde_json::to_value(self).unwrap_or_default();
        let st = &mut v["stats"];
        st["rounds"] = json!(self.rounds.len());
        st["tau"] = json!(self.tau);
        st["draft_ms"] = json!(sum(|r| r.draft_ms));
        st["tree_ms"] = json!(sum(|r| r.tree_ms));
        st["verify_ms"] = json!(sum(|r| r.verify_ms));
        st["commit_ms"] = json!(sum(|r| r.commit_ms));
        let off = UndraftedCounts::of(self.rounds.iter().map(|r| r.undrafted));
        st["undrafted"] = json!(off);
        st["undrafted_reason"] = json!(off.explain(self.rounds.len(), curve));
        v["rounds_detail"] = v["rounds"].take();
        v.as_object_mut().map(|o| o.remove("rounds"));
        v
    }

    /// The speculative part of the stats line: drafter prefill, rounds, τ and why rounds did
    /// not draft.
    pub fn summary_line(&self, curve: Option<&CostCurve>) -> String {
        let off = UndraftedCounts::of(self.rounds.iter().map(|r| r.undrafted));
        let why = off.explain(self.rounds.len(), curve);
        format!(
            " | drafter prefill {:.0} ms, {} rounds, tau {:.2}{}",
            self.out.stats.draft_prefill_ms,
            self.rounds.len(),
            self.tau,
            if why.is_empty() {
                String::new()
            } else {
                format!(" ({why})")
            }
        )
    }
}
