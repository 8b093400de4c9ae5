//! Cached target features (spec §3.3: "target hidden features for the whole clean sequence,
//! online or cached"): the outputs of the tapped target layers at every position of every
//! sample, as f16, in sample order. The cache is resumable and memory-mapped for training.
//!
//! File layout (`features-<taps>.f16`): the samples' rows back to back, `width` f16 per token
//! (`width` = taps × hidden), no header; the sample token counts locate each sample.

use super::data::Sample;
use crate::error::{Error, Result};
use crate::model::{Batch, Logits, Model, OutputSpec, Rows, Scratch};
use crate::types::Pos;
use half::f16;
use memmap2::Mmap;
use std::io::Write;
use std::path::{Path, PathBuf};

pub struct FeatureCache {
    map: Mmap,
    /// f16 per token.
    pub width: usize,
    /// Token offset of each sample.
    offsets: Vec<usize>,
}

/// The cache file for these taps inside `dir`.
pub fn cache_path(dir: &Path, taps: &[usize]) -> PathBuf {
    let t: Vec<String> = taps.iter().map(|t| t.to_string()).collect();
    dir.join(format!("features-{}.f16", t.join("_")))
}

/// Computes the features of every sample not yet in the cache, then maps it.
/// `progress(done, total)` is called per sample.
pub fn build(
    model: &Model,
    samples: &[Sample],
    taps: &[usize],
    path: &Path,
    mut progress: impl FnMut(usize, usize),
) -> Result<FeatureCache> {
    let width = taps.len() * model.config.hidden_size;
    let row_bytes = 2 * width;
    let have = std::fs::metadata(path)
        .map(|m| m.len() as usize)
        .unwrap_or(0);
    // Whole samples present; a torn tail is cut off.
    let (mut done, mut bytes) = (0, 0);
    for s in samples {
        let b = s.tokens.len() * row_bytes;
        if bytes + b > have {
            break;
        }
        bytes += b;
        done += 1;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    f.set_len(bytes as u64).map_err(|e| Error::io(path, e))?;
    let longest = samples.iter().map(|s| s.tokens.len()).max().unwrap_or(1);
    let mut kv = model.new_kv(longest);
    let mut scratch = Scratch::default();
    let spec = OutputSpec {
        rows: Rows::Last,
        logits: Logits::None,
        taps: taps.to_vec(),
    };
    let mut buf = Vec::new();
    progress(done, samples.len());
    for (i, s) in samples.iter().enumerate().skip(done) {
        kv.clear();
        let pos: Vec<Pos> = (0..s.tokens.len() as u32).map(Pos).collect();
        let out = model.forward(
            &mut kv,
            &Batch {
                tokens: &s.tokens,
                positions: &pos,
                mask: None,
            },
            &spec,
            &mut scratch,
        )?;
        buf.clear();
        for v in &out.hidden {
            buf.extend_from_slice(&f16::from_f32(*v).to_le_bytes());
        }
        f.write_all(&buf).map_err(|e| Error::io(path, e))?;
        progress(i + 1, samples.len());
    }
    f.flush().map_err(|e| Error::io(path, e))?;
    drop(f);
    open(path, samples, width)
}

/// Maps an existing complete cache.
pub fn open(path: &Path, samples: &[Sample], width: usize) -> Result<FeatureCache> {
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: read-only map of a file nobody writes while training runs.
    let map = unsafe { Mmap::map(&f) }.map_err(|e| Error::io(path, e))?;
    let mut offsets = Vec::with_capacity(samples.len());
    let mut t = 0;
    for s in samples {
        offsets.push(t);
        t += s.tokens.len();
    }
    if map.len() != t * width * 2 {
        return Err(Error::BadModelFile {
            path: path.to_path_buf(),
            format: "feature cache",
            reason: format!(
                "{} bytes, expected {} for {} tokens of width {width}",
                map.len(),
                t * width * 2,
                t
            ),
        });
    }
    Ok(FeatureCache {
        map,
        width,
        offsets,
    })
}

impl FeatureCache {
    /// Appends sample `i`'s first `n` rows as f32 to `dst`.
    pub fn rows_into(&self, i: usize, n: usize, dst: &mut Vec<f32>) {
        let start = self.offsets[i] * self.width * 2;
        let bytes = &self.map[start..start + n * self.width * 2];
        dst.extend(
            bytes
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()),
        );
    }
}
