//! What a benchmark ran on and with: the header of every report, so that two reports can be
//! compared (or not) at a glance.

use crate::drafters::speculative_config::DraftLength;
use crate::sample::SamplingParams;
use crate::speculative::VerifyRule;
use serde::Serialize;
use std::path::Path;

#[derive(Clone, Debug, Serialize)]
pub struct Header {
    pub model: String,
    pub model_sha256: String,
    pub threads: usize,
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub seed: u64,
    pub verify_rule: VerifyRule,
    /// The sizing policy really used (`--draft-length auto|fixed|adl`, `--fixed-draft`).
    pub sizing: DraftLength,
    /// `sizing` is `fixed` (kept for scripts that read it).
    pub fixed_draft: bool,
    pub max_new_tokens: usize,
    /// Items per set asked for (`None`: all of the prompt file's).
    pub prompts_per_dataset: Option<usize>,
    /// The user's prompt file (`None`: the vendored datasets).
    pub prompt_file: Option<String>,
    pub cpu: String,
    /// UTC, ISO 8601.
    pub date: String,
    /// The commit the binary was built from (`-dirty`: with uncommitted changes).
    pub commit: String,
}

/// What a header needs beyond the sampling parameters.
pub struct Setup<'a> {
    pub model: &'a Path,
    pub threads: usize,
    pub rule: VerifyRule,
    pub sizing: DraftLength,
    pub max_new_tokens: usize,
    pub prompts_per_dataset: Option<usize>,
    pub prompt_file: Option<&'a Path>,
    pub commit: &'a str,
}

impl Header {
    pub fn collect(s: &Setup, sampling: &SamplingParams) -> Header {
        Header {
            model: s.model.display().to_string(),
            model_sha256: model_sha256(s.model),
            threads: s.threads,
            temperature: sampling.temperature,
            top_k: sampling.top_k,
            top_p: sampling.top_p,
            seed: sampling.seed,
            verify_rule: s.rule,
            sizing: s.sizing,
            fixed_draft: s.sizing == DraftLength::Fixed,
            max_new_tokens: s.max_new_tokens,
            prompts_per_dataset: s.prompts_per_dataset,
            prompt_file: s.prompt_file.map(|p| p.display().to_string()),
            cpu: cpu_model(),
            date: utc_now(),
            commit: s.commit.to_string(),
        }
    }

    /// The header as markdown lines.
    pub fn markdown(&self) -> String {
        format!(
            "- model: `{}` (sha256 `{}`)\n- sampling: temperature {}, top-k {}, top-p {}, seed {}, \
             verify rule {}, {} drafts\n- {} new tokens, {}\n- machine: {} \
             with {} threads\n- date: {}; commit: {}\n",
            self.model,
            self.model_sha256,
            self.temperature,
            self.top_k,
            self.top_p,
            self.seed,
            match self.verify_rule {
                VerifyRule::Coupled => "coupled",
                VerifyRule::Rejection => "rejection",
            },
            match self.sizing {
                DraftLength::Fixed => "fixed",
                DraftLength::Auto => "cost-sized",
                DraftLength::Adl => "ADL-sized",
            },
            self.max_new_tokens,
            match (&self.prompt_file, self.prompts_per_dataset) {
                (Some(f), Some(n)) => format!("prompts from `{f}`, at most {n} per category"),
                (Some(f), None) => format!("every prompt of `{f}`, per category"),
                (None, n) => format!("{} prompts per dataset", n.unwrap_or(0)),
            },
            self.cpu,
            self.threads,
            self.date,
            self.commit
        )
    }
}

/// sha256 of a model file; of `config.json` + the safetensors files for an HF directory.
fn model_sha256(p: &Path) -> String {
    let hash = |f: &Path| crate::fetch::sha256_file(f).unwrap_or_else(|e| format!("({e})"));
    if p.is_file() {
        return hash(p);
    }
    let mut files: Vec<_> = std::fs::read_dir(p)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|f| {
        let n = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
        n == "config.json" || n.ends_with(".safetensors")
    });
    files.sort();
    files
        .iter()
        .map(|f| {
            format!(
                "{}:{}",
                f.file_name().unwrap_or_default().to_string_lossy(),
                hash(f)
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The CPU's model name (Linux), or the architecture.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc_of(secs)
}

/// Civil date from days since 1970-01-01 (Hinnant's algorithm).
fn utc_of(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn civil_dates() {
        assert_eq!(super::utc_of(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::utc_of(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(super::utc_of(1_795_305_600 + 3_723), "2026-11-22T01:02:03Z");
    }
}
