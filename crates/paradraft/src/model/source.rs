//! Where weights come from: a GGUF file or HF safetensors (single file or sharded with an
//! index). Tensors are requested by their GGUF names; the safetensors source maps them to HF
//! names. Shapes are checked against what the architecture expects.

use super::gguf::GgufFile;
use crate::error::{Error, Result};
use crate::runtime::quant::{dequantize, GgmlType, Matrix};
use memmap2::Mmap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub trait TensorSource {
    fn describe(&self) -> String;
    /// Shape in row-major (PyTorch) order: `[rows, cols]` for a matrix.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;
    /// Type and raw bytes of a tensor.
    fn raw(&self, name: &str) -> Option<(GgmlType, &[u8])>;

    fn has(&self, name: &str) -> bool {
        self.shape(name).is_some()
    }

    fn missing(&self, name: &str) -> Error {
        Error::BadModelFile {
            path: PathBuf::from(self.describe()),
            format: "model",
            reason: format!("tensor {name} is missing"),
        }
    }

    fn check_shape(&self, name: &str, want: &[usize]) -> Result<()> {
        let got = self.shape(name).ok_or_else(|| self.missing(name))?;
        if got != want {
            return Err(Error::BadModelFile {
                path: PathBuf::from(self.describe()),
                format: "model",
                reason: format!("tensor {name} has shape {got:?}, expected {want:?}"),
            });
        }
        Ok(())
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        self.check_shape(name, &[rows, cols])?;
        let (ty, bytes) = self.raw(name).ok_or_else(|| self.missing(name))?;
        Ok(Matrix::from_bytes(ty, rows, cols, bytes))
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.f32_tensor(name, &[len])
    }

    /// Any float tensor of shape `shape`, dequantized, flattened.
    fn f32_tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.check_shape(name, shape)?;
        let (ty, bytes) = self.raw(name).ok_or_else(|| self.missing(name))?;
        let mut v = vec![0f32; shape.iter().product()];
        dequantize(ty, bytes, &mut v);
        Ok(v)
    }

    fn opt_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        if self.has(name) {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }
}

impl TensorSource for GgufFile {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors
            .get(name)
            .map(|t| t.dims.iter().rev().copied().collect())
    }
    fn raw(&self, name: &str) -> Option<(GgmlType, &[u8])> {
        self.tensors.get(name).map(|t| (t.dtype, self.data(t)))
    }
}

struct StEntry {
    file: usize,
    ty: GgmlType,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// HF safetensors weights, memory-mapped.
pub struct SafetensorsSource {
    dir: PathBuf,
    maps: Vec<Mmap>,
    entries: HashMap<String, StEntry>,
    /// Integer tensors: (file, bytes per element, start, end).
    ints: HashMap<String, (usize, usize, usize, usize)>,
}

impl SafetensorsSource {
    pub fn open(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| Error::BadModelFile {
                    path: index.clone(),
                    format: "safetensors index",
                    reason: e.to_string(),
                })?;
            let map = v["weight_map"]
                .as_object()
                .ok_or_else(|| Error::BadModelFile {
                    path: index.clone(),
                    format: "safetensors index",
                    reason: "no weight_map object".into(),
                })?;
            let mut names: Vec<String> = map
                .values()
                .filter_map(|f| f.as_str().map(String::from))
                .collect();
            names.sort();
            names.dedup();
            names.into_iter().map(|n| dir.join(n)).collect()
        } else if dir.join("model.safetensors").exists() {
            vec![dir.join("model.safetensors")]
        } else {
            let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|e| Error::io(dir, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            v.sort();
            v
        };
        if files.is_empty() {
            return Err(Error::BadModelFile {
                path: dir.to_path_buf(),
                format: "HF model directory",
                reason: "no *.safetensors files".into(),
            });
        }
        let mut maps = Vec::new();
        let mut entries = HashMap::new();
        let mut ints = HashMap::new();
        for (fi, path) in files.iter().enumerate() {
            let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
            // SAFETY: read-only map of a file we do not modify.
            let map = unsafe { Mmap::map(&f) }.map_err(|e| Error::io(path, e))?;
            let bad = |reason: String| Error::BadModelFile {
                path: path.clone(),
                format: "safetensors",
                reason,
            };
            let (hlen, meta) = safetensors::SafeTensors::read_metadata(&map[..])
                .map_err(|e| bad(format!("{e:?}")))?;
            let base = 8 + hlen;
            for (name, info) in meta.tensors() {
                let (s, e) = info.data_offsets;
                if base + e > map.len() {
                    return Err(bad(format!("tensor {name} ends past the end of the file")));
                }
                // Integer and boolean tensors (DART's `t2d` mask is BOOL) are read as i64.
                let int_bytes = match info.dtype {
                    safetensors::Dtype::I64 => Some(8),
                    safetensors::Dtype::I32 => Some(4),
                    safetensors::Dtype::BOOL | safetensors::Dtype::U8 => Some(1),
                    _ => None,
                };
                if let Some(w) = int_bytes {
                    ints.insert(name.clone(), (fi, w, base + s, base + e));
                    continue;
                }
                let ty = match info.dtype {
                    safetensors::Dtype::F32 => GgmlType::F32,
                    safetensors::Dtype::F16 => GgmlType::F16,
                    safetensors::Dtype::BF16 => GgmlType::BF16,
                    d => {
                        return Err(Error::Unsupported(format!(
                        "tensor {name} in {} has dtype {d:?} (supported: F32, F16, BF16, I32, I64)",
                        path.display()
                    )))
                    }
                };
                entries.insert(
                    name.clone(),
                    StEntry {
                        file: fi,
                        ty,
                        shape: info.shape.clone(),
                        start: base + s,
                        end: base + e,
                    },
                );
            }
            maps.push(map);
        }
        Ok(SafetensorsSource {
            dir: dir.to_path_buf(),
            maps,
            entries,
            ints,
        })
    }

    /// An integer or boolean tensor (I32, I64, U8 or BOOL), flattened, by its exact name.
    pub fn int_tensor(&self, name: &str) -> Option<Vec<i64>> {
        let &(f, w, s, e) = self.ints.get(name)?;
        let b = &self.maps[f][s..e];
        Some(match w {
            8 => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            4 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
                .collect(),
            _ => b.iter().map(|&x| x as i64).collect(),
        })
    }

    /// A float tensor by its HF name (as a checkpoint of ours names it), dequantized.
    pub fn f32_by_hf_name(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let e = self.entries.get(name).ok_or_else(|| Error::BadModelFile {
            path: self.dir.clone(),
            format: "safetensors",
            reason: format!("tensor {name} is missing"),
        })?;
        if e.shape != shape {
            return Err(Error::BadModelFile {
                path: self.dir.clone(),
                format: "safetensors",
                reason: format!("tensor {name} has shape {:?}, expected {shape:?}", e.shape),
            });
        }
        let mut v = vec![0f32; shape.iter().product()];
        dequantize(e.ty, &self.maps[e.file][e.start..e.end], &mut v);
        Ok(v)
    }

    /// Maps a GGUF tensor name to its HF name.
    pub(crate) fn hf_name(name: &str) -> String {
        let fixed = match name {
            "token_embd.weight" => Some("model.embed_tokens.weight"),
            "output_norm.weight" => Some("model.norm.weight"),
            "output.weight" => Some("lm_head.weight"),
            _ => None,
        };
        if let Some(f) = fixed {
            return f.to_string();
        }
        let Some(rest) = name.strip_prefix("blk.") else {
            return name.to_string();
        };
        let (layer, tail) = rest.split_once('.').unwrap_or((rest, ""));
        let (part, suffix) = tail.rsplit_once('.').unwrap_or((tail, ""));
        // One expert of a mixture (`ffn_gate_exps.E`): Qwen3-MoE's names (Mixtral's in `entry`).
        if let Some((kind, e)) = part.split_once('.') {
            let proj = match kind {
                "ffn_gate_exps" => "gate_proj",
                "ffn_up_exps" => "up_proj",
                "ffn_down_exps" => "down_proj",
                _ => "",
            };
            if !proj.is_empty() {
                return format!("model.layers.{layer}.mlp.experts.{e}.{proj}.{suffix}");
            }
        }
        let hf = match part {
            "attn_norm" => "input_layernorm",
            "attn_q" => "self_attn.q_proj",
            "attn_k" => "self_attn.k_proj",
            "attn_v" => "self_attn.v_proj",
            "attn_output" => "self_attn.o_proj",
            "attn_qkv" => "self_attn.qkv_proj",
            "ffn_gate_up" => "mlp.gate_up_proj",
            "attn_q_norm" => "self_attn.q_norm",
            "attn_k_norm" => "self_attn.k_norm",
            // Llama's MLP input norm; Gemma's is `pre_feedforward_layernorm` (see `entry`) and
            // its `post_attention_layernorm` is the attention's output norm.
            "ffn_norm" => "post_attention_layernorm",
            "post_attention_norm" => "post_attention_layernorm",
            "post_ffw_norm" => "post_feedforward_layernorm",
            "ffn_gate" => "mlp.gate_proj",
            "ffn_up" => "mlp.up_proj",
            "ffn_down" => "mlp.down_proj",
            "ffn_gate_inp" => "mlp.gate",
            "ffn_gate_shexp" => "mlp.shared_expert.gate_proj",
            "ffn_up_shexp" => "mlp.shared_expert.up_proj",
            "ffn_down_shexp" => "mlp.shared_expert.down_proj",
            "ffn_gate_inp_shexp" => "mlp.shared_expert_gate",
            other => other,
        };
        format!("model.layers.{layer}.{hf}.{suffix}")
    }

    fn entry(&self, name: &str) -> Option<&StEntry> {
        if let Some(layer) = name
            .strip_prefix("blk.")
            .and_then(|r| r.strip_suffix(".ffn_norm.weight"))
        {
            let gemma = format!("model.layers.{layer}.pre_feedforward_layernorm.weight");
            if let Some(e) = self.entries.get(&gemma) {
                return Some(e);
            }
        }
        let hf = Self::hf_name(name);
        self.entries
            .get(&hf)
            .or_else(|| self.entries.get(&mixtral_name(&hf)?))
    }
}

/// Mixtral's name of a mixture-of-experts tensor named as Qwen3-MoE's (`mlp.gate` →
/// `block_sparse_moe.gate`, `mlp.experts.E.gate_proj` / `up_proj` / `down_proj` →
/// `block_sparse_moe.experts.E.w1` / `w3` / `w2`).
fn mixtral_name(hf: &str) -> Option<String> {
    let (head, tail) = hf.split_once(".mlp.")?;
    let tail = match tail.strip_prefix("experts.") {
        None => tail.strip_prefix("gate.").map(|s| format!("gate.{s}"))?,
        Some(rest) => {
            let (e, rest) = rest.split_once('.')?;
            let (proj, suffix) = rest.split_once('.')?;
            let w = match proj {
                "gate_proj" => "w1",
                "down_proj" => "w2",
                "up_proj" => "w3",
                _ => return None,
            };
            format!("experts.{e}.{w}.{suffix}")
        }
    };
    Some(format!("{head}.block_sparse_moe.{tail}"))
}

impl TensorSource for SafetensorsSource {
    fn describe(&self) -> String {
        self.dir.display().to_string()
    }
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.entry(name).map(|e| e.shape.clone())
    }
    fn raw(&self, name: &str) -> Option<(GgmlType, &[u8])> {
        self.entry(name)
            .map(|e| (e.ty, &self.maps[e.file][e.start..e.end]))
    }
    fn missing(&self, name: &str) -> Error {
        Error::BadModelFile {
            path: self.dir.clone(),
            format: "safetensors",
            reason: format!("tensor {} is missing", Self::hf_name(name)),
        }
    }
}

/// Tensors from `top`, and the ones it lacks from `base`: a drafter checkpoint that keeps only
/// its own layers and takes the rest (the embedding, a tied LM head) from its target.
pub struct Overlay<'a> {
    pub top: &'a dyn TensorSource,
    pub base: &'a dyn TensorSource,
}

impl Overlay<'_> {
    fn pick(&self, name: &str) -> &dyn TensorSource {
        if self.top.has(name) {
            self.top
        } else {
            self.base
        }
    }
}

impl TensorSource for Overlay<'_> {
    fn describe(&self) -> String {
        self.top.describe()
    }
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.pick(name).shape(name)
    }
    fn raw(&self, name: &str) -> Option<(GgmlType, &[u8])> {
        self.pick(name).raw(name)
    }
    fn missing(&self, name: &str) -> Error {
        self.top.missing(name)
    }
}

/// The tensors of a model file or HF directory, opened (memory-mapped) without building a
/// model.
pub fn open(path: &Path) -> Result<Box<dyn TensorSource>> {
    Ok(if path.is_dir() {
        Box::new(SafetensorsSource::open(path)?)
    } else {
        Box::new(GgufFile::open(path)?)
    })
}
