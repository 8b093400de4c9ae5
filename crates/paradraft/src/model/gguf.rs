//! A GGUF (v2/v3) reader over a memory map: metadata key/values and tensor descriptors whose
//! data is borrowed from the map, never copied. Every offset and size is checked against the
//! file so that truncated or corrupt files give an error, not a panic.

use crate::error::{Error, Result};
use crate::runtime::quant::GgmlType;
use memmap2::Mmap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const MAGIC: u32 = 0x4655_4747; // "GGUF" little-endian
const MAX_STRING: u64 = 1 << 28;
const MAX_ARRAY: u64 = 1 << 28;

#[derive(Clone, Debug)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) if v >= 0 => Some(v as u64),
            Value::I16(v) if v >= 0 => Some(v as u64),
            Value::I32(v) if v >= 0 => Some(v as u64),
            Value::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor's descriptor. `dims` are in GGUF order: `dims[0]` is the contiguous (row) length.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<usize>,
    pub dtype: GgmlType,
    /// Byte range inside the file.
    pub start: usize,
    pub len: usize,
}

pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: HashMap<String, Value>,
    pub tensors: HashMap<String, TensorInfo>,
    mmap: Mmap,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                format!(
                    "unexpected end of file at byte {} (wanted {n} more)",
                    self.pos
                )
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self) -> std::result::Result<[u8; N], String> {
        Ok(self.take(N)?.try_into().expect("length checked"))
    }
    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    fn string(&mut self) -> std::result::Result<String, String> {
        let n = self.u64()?;
        if n > MAX_STRING {
            return Err(format!("string length {n} is implausible"));
        }
        let b = self.take(n as usize)?;
        String::from_utf8(b.to_vec()).map_err(|_| "string is not UTF-8".to_string())
    }
    fn value(&mut self, ty: u32, depth: u32) -> std::result::Result<Value, String> {
        Ok(match ty {
            0 => Value::U8(self.arr::<1>()?[0]),
            1 => Value::I8(self.arr::<1>()?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.arr()?)),
            3 => Value::I16(i16::from_le_bytes(self.arr()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.arr()?)),
            6 => Value::F32(f32::from_le_bytes(self.arr()?)),
            7 => Value::Bool(self.arr::<1>()?[0] != 0),
            8 => Value::String(self.string()?),
            9 => {
                if depth > 4 {
                    return Err("arrays nested too deeply".into());
                }
                let ety = self.u32()?;
                let n = self.u64()?;
                if n > MAX_ARRAY {
                    return Err(format!("array length {n} is implausible"));
                }
                let mut v = Vec::with_capacity((n as usize).min(1 << 20));
                for _ in 0..n {
                    v.push(self.value(ety, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.arr()?)),
            12 => Value::F64(f64::from_le_bytes(self.arr()?)),
            t => return Err(format!("unknown metadata value type {t}")),
        })
    }
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the map is read-only; a file modified while mapped is outside our contract.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let bad = |reason: String| Error::BadModelFile {
            path: path.to_path_buf(),
            format: "GGUF",
            reason,
        };
        let mut r = Reader { buf: &mmap, pos: 0 };
        let magic = r.u32().map_err(bad)?;
        if magic != MAGIC {
            return Err(bad(format!("bad magic {magic:#010x}, expected \"GGUF\"")));
        }
        let version = r.u32().map_err(bad)?;
        if !(2..=3).contains(&version) {
            return Err(bad(format!("unsupported GGUF version {version}")));
        }
        let n_tensors = r.u64().map_err(bad)?;
        let n_kv = r.u64().map_err(bad)?;
        if n_tensors > 1 << 20 || n_kv > 1 << 20 {
            return Err(bad(format!(
                "implausible counts: {n_tensors} tensors, {n_kv} keys"
            )));
        }
        let mut metadata = HashMap::new();
        for _ in 0..n_kv {
            let key = r.string().map_err(bad)?;
            let ty = r.u32().map_err(bad)?;
            let v = r.value(ty, 0).map_err(|e| bad(format!("key {key}: {e}")))?;
            metadata.insert(key, v);
        }
        let mut infos = Vec::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let name = r.string().map_err(bad)?;
            let nd = r.u32().map_err(bad)?;
            if nd == 0 || nd > 4 {
                return Err(bad(format!("tensor {name} has {nd} dimensions")));
            }
            let mut dims = Vec::with_capacity(nd as usize);
            for _ in 0..nd {
                dims.push(r.u64().map_err(bad)? as usize);
            }
            let ty = r.u32().map_err(bad)?;
            let off = r.u64().map_err(bad)? as usize;
            infos.push((name, dims, ty, off));
        }
        let align = metadata
            .get("general.alignment")
            .and_then(Value::as_u64)
            .unwrap_or(32) as usize;
        if align == 0 || !align.is_power_of_two() {
            return Err(bad(format!("bad alignment {align}")));
        }
        let data_start = r.pos.div_ceil(align) * align;
        let mut tensors = HashMap::new();
        for (name, dims, ty, off) in infos {
            let dtype = GgmlType::from_u32(ty).ok_or_else(|| {
                Error::Unsupported(format!(
                    "tensor {name} has type {}",
                    GgmlType::unsupported_reason(ty)
                ))
            })?;
            let n: usize = dims
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or_else(|| bad(format!("tensor {name} size overflows")))?;
            if dims[0] % dtype.block_len() != 0 {
                return Err(bad(format!(
                    "tensor {name}: row length {} is not a multiple of the {dtype:?} block",
                    dims[0]
                )));
            }
            let len = n / dtype.block_len() * dtype.block_bytes();
            let start = data_start
                .checked_add(off)
                .ok_or_else(|| bad(format!("tensor {name} offset overflows")))?;
            if start.checked_add(len).is_none_or(|e| e > mmap.len()) {
                return Err(bad(format!(
                    "tensor {name} ends past the end of the file ({} bytes): the file is truncated",
                    mmap.len()
                )));
            }
            tensors.insert(
                name.clone(),
                TensorInfo {
                    name,
                    dims,
                    dtype,
                    start,
                    len,
                },
            );
        }
        Ok(GgufFile {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            mmap,
        })
    }

    pub fn data(&self, t: &TensorInfo) -> &[u8] {
        &self.mmap[t.start..t.start + t.len]
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    pub fn u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }

    pub fn f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(Value::as_f64)
    }

    pub fn req_u64(&self, key: &str) -> Result<u64> {
        self.u64(key).ok_or_else(|| Error::BadModelFile {
            path: self.path.clone(),
            format: "GGUF",
            reason: format!("missing metadata key {key}"),
        })
    }
}
