//! The benchmark prompt sets vendored in `data/bench/` (provenance in `data/README.md`) and the
//! prompt templates the papers' code applies (DFlash `benchmark.py`).

use crate::error::{Error, Result};
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dataset {
    MtBench,
    HumanEval,
    Gsm8k,
    Math500,
    Mbpp,
    Alpaca,
    /// Alpaca records that rewrite, summarise or extract from a given text (copy-heavy).
    Copy,
}

pub const ALL: [Dataset; 7] = [
    Dataset::MtBench,
    Dataset::HumanEval,
    Dataset::Gsm8k,
    Dataset::Math500,
    Dataset::Mbpp,
    Dataset::Alpaca,
    Dataset::Copy,
];

/// One benchmark item: the user turns, in order (MT-Bench has two), after an optional system
/// message.
#[derive(Clone, Debug)]
pub struct Item {
    pub id: String,
    pub system: Option<String>,
    pub turns: Vec<String>,
}

/// A named prompt set: a vendored dataset, or one category of a user's prompt file.
#[derive(Clone, Debug)]
pub struct PromptSet {
    pub name: String,
    pub items: Vec<Item>,
}

impl Dataset {
    pub fn name(self) -> &'static str {
        match self {
            Dataset::MtBench => "mt_bench",
            Dataset::HumanEval => "humaneval",
            Dataset::Gsm8k => "gsm8k",
            Dataset::Math500 => "math500",
            Dataset::Mbpp => "mbpp",
            Dataset::Alpaca => "alpaca",
            Dataset::Copy => "copy",
        }
    }

    pub fn from_name(s: &str) -> Option<Dataset> {
        ALL.into_iter().find(|d| d.name() == s)
    }

    fn file(self) -> &'static str {
        match self {
            Dataset::MtBench => "mt_bench.jsonl",
            Dataset::HumanEval => "humaneval.jsonl",
            Dataset::Gsm8k => "gsm8k_test.jsonl",
            Dataset::Math500 => "math500.jsonl",
            Dataset::Mbpp => "mbpp_sanitized.jsonl",
            Dataset::Alpaca => "alpaca_200.jsonl",
            Dataset::Copy => "alpaca_copy.jsonl",
        }
    }

    /// Applies the dataset's prompt template to one raw turn.
    fn template(self, v: &serde_json::Value, turn: &str) -> String {
        const BOXED: &str =
            "\nPlease reason step by step, and put your final answer within \\boxed{}.";
        match self {
            Dataset::Gsm8k | Dataset::Math500 => format!("{turn}{BOXED}"),
            Dataset::HumanEval => format!(
                "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{turn}\n```"
            ),
            Dataset::Alpaca | Dataset::Copy => match v["input"].as_str() {
                Some(i) if !i.is_empty() => format!("{}\n\nInput:\n{i}", v["instruction"].as_str().unwrap_or(turn)),
                _ => v["instruction"].as_str().unwrap_or(turn).to_string(),
            },
            Dataset::MtBench | Dataset::Mbpp => turn.to_string(),
        }
    }

    /// Loads up to `n` items from `dir` (MBPP: the test split only).
    pub fn load(self, dir: &Path, n: usize) -> Result<Vec<Item>> {
        let path = dir.join(self.file());
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let mut items = Vec::new();
        for line in text.lines() {
            if items.len() >= n {
                break;
            }
            let v: serde_json::Value = serde_json::from_str(line)
                .map_err(|e| Error::BadRequest(format!("{}: {e}", path.display())))?;
            if self == Dataset::Mbpp && v["split"].as_str() != Some("test") {
                continue;
            }
            let turns = v["turns"]
                .as_array()
                .map(|t| {
                    t.iter()
                        .filter_map(|x| x.as_str())
                        .map(|t| self.template(&v, t))
                        .collect()
                })
                .unwrap_or_default();
            items.push(Item {
                id: v["id"].as_str().unwrap_or("").to_string(),
                system: None,
                turns,
            });
        }
        Ok(items)
    }
}

/// `$PARADRAFT_DATA/bench`, else `data/bench` where [`crate::fetch::resource`] finds it.
pub fn default_dir() -> std::path::PathBuf {
    match std::env::var_os("PARADRAFT_DATA") {
        Some(d) => std::path::PathBuf::from(d).join("bench"),
        None => crate::fetch::resource_path("data/bench"),
    }
}
