//! GGML tensor types: what a GGUF tensor's type id means and how big its blocks are (the
//! block layouts and (de)quantisation are in [`super::quant`] and [`super::blocks`]), in the
//! manner of llama.cpp's type-traits table: one row per type.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
}

/// Elements per block of the legacy quantized types.
pub const QK: usize = 32;
/// Elements per super-block of the K-quants and IQ4_XS.
pub const QK_K: usize = 256;

/// One row of the type table: GGML id, name, elements per block, bytes per block.
struct Traits {
    ty: GgmlType,
    id: u32,
    name: &'static str,
    block_len: usize,
    block_bytes: usize,
}

#[rustfmt::skip]
const TABLE: [Traits; 15] = [
    Traits { ty: GgmlType::F32, id: 0, name: "F32", block_len: 1, block_bytes: 4 },
    Traits { ty: GgmlType::F16, id: 1, name: "F16", block_len: 1, block_bytes: 2 },
    Traits { ty: GgmlType::Q4_0, id: 2, name: "Q4_0", block_len: QK, block_bytes: 18 },
    Traits { ty: GgmlType::Q4_1, id: 3, name: "Q4_1", block_len: QK, block_bytes: 20 },
    Traits { ty: GgmlType::Q5_0, id: 6, name: "Q5_0", block_len: QK, block_bytes: 22 },
    Traits { ty: GgmlType::Q5_1, id: 7, name: "Q5_1", block_len: QK, block_bytes: 24 },
    Traits { ty: GgmlType::Q8_0, id: 8, name: "Q8_0", block_len: QK, block_bytes: 34 },
    Traits { ty: GgmlType::Q2_K, id: 10, name: "Q2_K", block_len: QK_K, block_bytes: 84 },
    Traits { ty: GgmlType::Q3_K, id: 11, name: "Q3_K", block_len: QK_K, block_bytes: 110 },
    Traits { ty: GgmlType::Q4_K, id: 12, name: "Q4_K", block_len: QK_K, block_bytes: 144 },
    Traits { ty: GgmlType::Q5_K, id: 13, name: "Q5_K", block_len: QK_K, block_bytes: 176 },
    Traits { ty: GgmlType::Q6_K, id: 14, name: "Q6_K", block_len: QK_K, block_bytes: 210 },
    Traits { ty: GgmlType::IQ4_NL, id: 20, name: "IQ4_NL", block_len: QK, block_bytes: 18 },
    Traits { ty: GgmlType::IQ4_XS, id: 23, name: "IQ4_XS", block_len: QK_K, block_bytes: 136 },
    Traits { ty: GgmlType::BF16, id: 30, name: "BF16", block_len: 1, block_bytes: 2 },
];

/// GGML types that exist but that paradraft does not load, by id (for the error message).
const KNOWN_UNSUPPORTED: [(u32, &str); 15] = [
    (9, "Q8_1"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (34, "TQ1_0"),
];

impl GgmlType {
    pub const ALL: [GgmlType; 15] = {
        let mut all = [GgmlType::F32; 15];
        let mut i = 0;
        while i < TABLE.len() {
            all[i] = TABLE[i].ty;
            i += 1;
        }
        all
    };

    fn traits(self) -> &'static Traits {
        TABLE
            .iter()
            .find(|t| t.ty == self)
            .expect("every type has a row")
    }

    pub fn from_u32(t: u32) -> Option<Self> {
        TABLE.iter().find(|r| r.id == t).map(|r| r.ty)
    }

    /// GGML's id of this type.
    pub fn id(self) -> u32 {
        self.traits().id
    }

    /// GGML's name of this type ("Q4_K").
    pub fn name(self) -> &'static str {
        self.traits().name
    }

    /// Why type id `t` cannot be loaded: its name where GGML has one, and what can be.
    pub fn unsupported_reason(t: u32) -> String {
        let name = KNOWN_UNSUPPORTED
            .iter()
            .find(|(id, _)| *id == t)
            .map(|(_, n)| format!("{n} (GGML type {t})"))
            .unwrap_or_else(|| format!("GGML type {t} (not a type this version knows)"));
        let supported: Vec<&str> = TABLE.iter().map(|r| r.name).collect();
        format!(
            "{name}, which paradraft does not support (supported: {})",
            supported.join(", ")
        )
    }

    /// Elements per block.
    pub fn block_len(self) -> usize {
        self.traits().block_len
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.traits().block_bytes
    }

    pub fn row_bytes(self, n: usize) -> usize {
        n / self.block_len() * self.block_bytes()
    }

    /// A dense type (one element per block), widened to f32 at load.
    pub fn is_dense(self) -> bool {
        self.block_len() == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_round_trips_ids_and_names() {
        for ty in GgmlType::ALL {
            assert_eq!(GgmlType::from_u32(ty.id()), Some(ty));
            assert_eq!(format!("{ty:?}"), ty.name());
        }
        for (id, name) in KNOWN_UNSUPPORTED {
            assert_eq!(GgmlType::from_u32(id), None);
            assert!(GgmlType::unsupported_reason(id).starts_with(name));
        }
        assert!(GgmlType::unsupported_reason(999).contains("Q4_K"));
    }
}
