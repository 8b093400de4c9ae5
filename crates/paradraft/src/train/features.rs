//! Cached target features (docs/dflash.md: "target hidden features for the whole clean sequence,
//! online or cached"): the outputs of the tapped target layers at every position of every
//! sample, as f16, in sample order. The cache is resumable and memory-mapped for training.
//!
//! File layout (`features-<taps>.f16`): the samples' rows back to back, `width` f16 per token
//! (`width` = taps × hidden), no header; the sample token counts locate each sample.
//!
//! Trainers read a sample's rows through [`TapSource`]: from such a cache, or computed online
//! by the target's own forward inside the training step (no store, so no cap on the data).

use crate::error::{Error, Result};
use crate::model::{Batch, Logits, Model, OutputSpec, Rows, Scratch};
use crate::types::Pos;
use crate::types::Sample;
use half::f16;
use memmap2::Mmap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub struct FeatureCache {
    map: Mmap,
    /// f16 per token.
    pub width: usize,
    /// The leading f16 of each row that are the drafter's context features (the rest, if any,
    /// are further taps such as the target's last layer; see [`FeatureCache::tail_rows_into`]).
    pub ctx: usize,
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
    let (done, bytes) = covered(path, samples, width);
    let mut fa = FeatureAppender::at(path, bytes, width)?;
    let longest = samples.iter().map(|s| s.tokens.len()).max().unwrap_or(1);
    let mut kv = model.new_kv(longest);
    let mut scratch = Scratch::default();
    let spec = OutputSpec {
        rows: Rows::Last,
        logits: Logits::None,
        taps: taps.to_vec(),
    };
    let mut rows = Vec::new();
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
        rows.clear();
        rows.extend(out.hidden.iter().map(|&v| f16::from_f32(v)));
        fa.append(s.tokens.len(), &rows)?;
        progress(i + 1, samples.len());
    }
    drop(fa);
    open(path, samples, width)
}

/// How many whole samples, from the first, the file at `path` holds rows for, and their bytes
/// (a torn or extra tail beyond them is not counted).
fn covered(path: &Path, samples: &[Sample], width: usize) -> (usize, usize) {
    let have = std::fs::metadata(path)
        .map(|m| m.len() as usize)
        .unwrap_or(0);
    let (mut done, mut bytes) = (0, 0);
    for s in samples {
        let b = s.tokens.len() * width * 2;
        if bytes + b > have {
            break;
        }
        bytes += b;
        done += 1;
    }
    (done, bytes)
}

/// Appends features to the cache in step with the sample file: sample i's rows follow
/// sample i − 1's. Used by the feature stage and by self-distillation, which captures the rows
/// while generating (`crate::batch` taps).
pub struct FeatureAppender {
    file: std::fs::File,
    path: PathBuf,
    width: usize,
}

impl FeatureAppender {
    /// Opens `path` for appending when it holds the rows of all of `samples` (rows past them,
    /// left by a run killed between a sample's rows and its record, are cut off); `None` when
    /// rows are missing, in which case the feature stage computes them later.
    pub fn open(path: &Path, samples: &[Sample], width: usize) -> Result<Option<Self>> {
        let (done, bytes) = covered(path, samples, width);
        if done < samples.len() {
            return Ok(None);
        }
        Self::at(path, bytes, width).map(Some)
    }

    /// Opens `path` for appending after its first `bytes` (anything past them is cut off).
    fn at(path: &Path, bytes: usize, width: usize) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        file.set_len(bytes as u64).map_err(|e| Error::io(path, e))?;
        Ok(FeatureAppender {
            file,
            path: path.to_path_buf(),
            width,
        })
    }

    /// Appends one sample's rows: `rows` holds its first rows (f16, `width` each); rows up to
    /// `n_tokens` that were never computed (a final token nothing was generated from) are
    /// written as zeros, since no anchor's context reaches them.
    pub fn append(&mut self, n_tokens: usize, rows: &[f16]) -> Result<()> {
        let have = rows.len() / self.width;
        if !rows.len().is_multiple_of(self.width) || have > n_tokens || n_tokens - have > 1 {
            return Err(Error::BadRequest(format!(
                "feature rows for {} of {n_tokens} tokens",
                rows.len() as f64 / self.width as f64
            )));
        }
        let mut buf = Vec::with_capacity(n_tokens * self.width * 2);
        for v in rows {
            buf.extend_from_slice(&v.to_le_bytes());
        }
        buf.resize(n_tokens * self.width * 2, 0);
        self.file
            .write_all(&buf)
            .and_then(|_| self.file.flush())
            .map_err(|e| Error::io(&self.path, e))
    }
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
        ctx: width,
        offsets,
    })
}

impl FeatureCache {
    /// The first `ctx` f16 of each row are context features; the rest is the tail.
    pub fn with_context_width(mut self, ctx: usize) -> Self {
        self.ctx = ctx.min(self.width);
        self
    }

    fn row(&self, i: usize, r: usize) -> &[u8] {
        let start = (self.offsets[i] + r) * self.width * 2;
        &self.map[start..start + self.width * 2]
    }

    /// Appends the context features of sample `i`'s first `n` rows as f32 to `dst`.
    pub fn rows_into(&self, i: usize, n: usize, dst: &mut Vec<f32>) {
        dst.reserve(n * self.ctx);
        for r in 0..n {
            widen(&self.row(i, r)[..self.ctx * 2], dst);
        }
    }

    /// Appends the tail (the columns after the context features) of sample `i`'s rows `rows`
    /// as f32 to `dst`.
    pub fn tail_rows_into(&self, i: usize, rows: &[usize], dst: &mut Vec<f32>) {
        dst.reserve(rows.len() * (self.width - self.ctx));
        for &r in rows {
            widen(&self.row(i, r)[self.ctx * 2..], dst);
        }
    }
}

/// Little-endian f16 bytes as f32, appended to `dst`.
fn widen(bytes: &[u8], dst: &mut Vec<f32>) {
    dst.extend(
        bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()),
    );
}

/// One sample's tap rows as f32, `width` per token: the drafter's context columns (`ctx`)
/// first, then the tail (the target's last layer, when kept).
pub struct SampleTaps {
    rows: Vec<f32>,
    width: usize,
    ctx: usize,
}

impl SampleTaps {
    /// Rows held (one per token of the sample).
    pub fn len(&self) -> usize {
        self.rows.len() / self.width.max(1)
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Appends the context columns of the first `n` rows to `dst`.
    pub fn rows_into(&self, n: usize, dst: &mut Vec<f32>) {
        dst.reserve(n * self.ctx);
        for r in self.rows.chunks_exact(self.width).take(n) {
            dst.extend_from_slice(&r[..self.ctx]);
        }
    }

    /// Appends the tail columns of rows `rows` to `dst`.
    pub fn tail_rows_into(&self, rows: &[usize], dst: &mut Vec<f32>) {
        dst.reserve(rows.len() * (self.width - self.ctx));
        for &r in rows {
            dst.extend_from_slice(&self.rows[r * self.width + self.ctx..(r + 1) * self.width]);
        }
    }
}

/// Where a trainer gets the target's taps: a stored cache, or the target's forward run on each
/// sample as the step needs it (online teacher forcing).
pub enum TapSource {
    Cached(FeatureCache),
    Online(OnlineTaps),
}

impl From<FeatureCache> for TapSource {
    fn from(c: FeatureCache) -> Self {
        TapSource::Cached(c)
    }
}

impl TapSource {
    /// f32 per row (context then tail).
    pub fn width(&self) -> usize {
        match self {
            TapSource::Cached(c) => c.width,
            TapSource::Online(o) => o.width,
        }
    }

    /// The leading columns that are the drafter's context features.
    pub fn ctx(&self) -> usize {
        match self {
            TapSource::Cached(c) => c.ctx,
            TapSource::Online(o) => o.ctx,
        }
    }

    /// Every row of sample `si` (`s`, a sample of the data this source was made for).
    pub fn sample(&self, target: &Model, si: usize, s: &Sample) -> Result<SampleTaps> {
        let (width, ctx) = (self.width(), self.ctx());
        let rows = match self {
            TapSource::Cached(c) => {
                if si >= c.offsets.len() {
                    return Err(Error::BadRequest(format!(
                        "feature cache: sample {si} of {}",
                        c.offsets.len()
                    )));
                }
                let mut v = Vec::with_capacity(s.tokens.len() * width);
                for r in 0..s.tokens.len() {
                    widen(c.row(si, r), &mut v);
                }
                v
            }
            TapSource::Online(o) => o.compute(target, &s.tokens)?,
        };
        Ok(SampleTaps { rows, width, ctx })
    }
}

/// The target's taps computed on demand: one prefill of the sample with the engine's forward
/// (its quantised kernels), every row kept. The K/V cache and scratch are reused across calls.
pub struct OnlineTaps {
    taps: Vec<usize>,
    width: usize,
    ctx: usize,
    state: Mutex<Box<(Option<crate::kv::KvCache>, Scratch)>>,
}

impl OnlineTaps {
    /// Taps `taps` of `target`, the first `ctx` columns of each row being the context.
    pub fn new(target: &Model, taps: &[usize], ctx: usize) -> Result<Self> {
        let n = target.config.n_layers;
        if let Some(t) = taps.iter().find(|&&t| t >= n) {
            return Err(Error::BadRequest(format!(
                "tap of target layer {t}: the target has {n} layers"
            )));
        }
        let width = taps.len() * target.config.hidden_size;
        Ok(OnlineTaps {
            taps: taps.to_vec(),
            width,
            ctx: ctx.min(width),
            state: Mutex::new(Box::new((None, Scratch::default()))),
        })
    }

    fn compute(&self, target: &Model, tokens: &[crate::types::TokenId]) -> Result<Vec<f32>> {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (kv, scratch) = &mut **guard;
        let kv = match kv {
            Some(k) if k.capacity() >= tokens.len() => k,
            _ => kv.insert(target.new_kv(tokens.len().max(512))),
        };
        kv.clear();
        let pos: Vec<Pos> = (0..tokens.len() as u32).map(Pos).collect();
        let spec = OutputSpec {
            rows: Rows::Last,
            logits: Logits::None,
            taps: self.taps.clone(),
        };
        let out = target.forward(
            kv,
            &Batch {
                tokens,
                positions: &pos,
                mask: None,
            },
            &spec,
            scratch,
        )?;
        Ok(out.hidden.clone())
    }
}
