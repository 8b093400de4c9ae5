//! Writing a trained drafter: `model.safetensors` (the weights in f16, bf16 or f32, with the
//! draft vocabulary's `d2t` offsets as I64 and `t2d` mask as BOOL when it has one) and its
//! `config.json`. Shared by the trainers whose drafters ship in a published layout.

use crate::drafters::vocab::DraftVocab;
use crate::error::{Error, Result};
use crate::train::run::{cerr, Vars};
use candle_core::{DType, Device};
use std::path::Path;

/// Writes `vars` (by their names) and the vocabulary maps into `dir/model.safetensors`, and
/// `config` into `dir/config.json`.
pub fn write_drafter(
    vars: &Vars,
    vocab: Option<&DraftVocab>,
    config: &serde_json::Value,
    dir: &Path,
    dtype: DType,
) -> Result<()> {
    use safetensors::Dtype as St;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let st = match dtype {
        DType::F16 => St::F16,
        DType::BF16 => St::BF16,
        DType::F32 => St::F32,
        d => return Err(Error::BadRequest(format!("export dtype {d:?}"))),
    };
    let mut out: Vec<(String, Raw)> = vec![];
    for (k, v) in vars {
        let x = v
            .as_tensor()
            .to_device(&Device::Cpu)
            .and_then(|x| x.to_dtype(dtype))
            .and_then(|x| x.flatten_all())
            .map_err(cerr)?;
        let data = match dtype {
            DType::F16 => x
                .to_vec1::<half::f16>()
                .map(|v| bytes_of(&v, |a| a.to_le_bytes())),
            DType::BF16 => x
                .to_vec1::<half::bf16>()
                .map(|v| bytes_of(&v, |a| a.to_le_bytes())),
            _ => x
                .to_vec1::<f32>()
                .map(|v| bytes_of(&v, |a| a.to_le_bytes())),
        }
        .map_err(cerr)?;
        out.push((k.clone(), Raw(st, v.dims().to_vec(), data)));
    }
    if let Some(vocab) = vocab {
        let d2t = bytes_of(&vocab.offsets(), |a| a.to_le_bytes());
        out.push(("d2t".into(), Raw(St::I64, vec![vocab.len()], d2t)));
        let t2d = (0..vocab.target_len())
            .map(|t| vocab.draft_id(crate::types::TokenId(t as u32)).is_some() as u8)
            .collect();
        out.push(("t2d".into(), Raw(St::BOOL, vec![vocab.target_len()], t2d)));
    }
    // Each file is written beside its final name and renamed over it when complete.
    let path = dir.join("model.safetensors");
    let tmp = dir.join("model.safetensors.tmp");
    safetensors::serialize_to_file(out, None, &tmp)
        .map_err(|e| Error::BadRequest(format!("writing {}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
    let js = serde_json::to_string_pretty(config).expect("config serialises");
    let (cp, ctmp) = (dir.join("config.json"), dir.join("config.json.tmp"));
    std::fs::write(&ctmp, js + "\n").map_err(|e| Error::io(&ctmp, e))?;
    std::fs::rename(&ctmp, &cp).map_err(|e| Error::io(&cp, e))
}

fn bytes_of<T, const N: usize>(v: &[T], le: impl Fn(&T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(le).collect()
}

/// A tensor's dtype, shape and little-endian bytes, for `safetensors`.
struct Raw(safetensors::Dtype, Vec<usize>, Vec<u8>);

impl safetensors::View for Raw {
    fn dtype(&self) -> safetensors::Dtype {
        self.0
    }
    fn shape(&self) -> &[usize] {
        &self.1
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.2)
    }
    fn data_len(&self) -> usize {
        self.2.len()
    }
}
