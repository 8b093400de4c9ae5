//! What a speculative generation reports as a whole: the round totals beside the AR fields,
//! and why rounds drafted nothing (`generate --json`, the stats line).

use super::sizing::{CostCurve, UndraftedCounts};
use crate::request::Generation;
use serde::Serialize;
use serde_json::{json, Value};

/// Telemetry of one round.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RoundStats {
    pub drafted: usize,
    pub accepted: usize,
    pub draft_ms: f64,
    /// Of `draft_ms`: choosing the draft from the drafter's distributions (path or tree
    /// search).
    pub select_ms: f64,
    /// Linearising the tree (positions, ancestor mask).
    pub tree_ms: f64,
    pub verify_ms: f64,
    pub commit_ms: f64,
    /// Nodes the drafter proposed before the sizer's cut (`drafted` were kept).
    pub proposed: usize,
    /// Σ of the kept nodes' path probabilities as the drafter (or `auto`'s calibration) gave
    /// them, before the sizer's calibration κ: what the cut expected to be accepted, over κ
    /// (trees only; 0 otherwise).
    pub predicted: f64,
    /// The kept nodes' path probabilities, in node order (trees only): with `path`, what any
    /// smaller cut of this round would have had accepted (every prefix of a tree in score
    /// order is a tree), for calibrating the cut offline.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conf: Vec<f32>,
    /// The accepted nodes' ids, root to leaf.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<u32>,
    /// Why a sized round verified no draft (absent when it did, or when nothing sizes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub undrafted: Option<super::sizing::Undrafted>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SpecGeneration {
    /// What AR generation reports too.
    #[serde(flatten)]
    pub out: Generation,
    /// Target forwards after the prefill.
    pub rounds: Vec<RoundStats>,
    /// Tokens committed per target pass, bonus included (prefill's token not counted).
    pub tau: f64,
}

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
