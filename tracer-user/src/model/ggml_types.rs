//! ggml tensor types: id → name, block size and bytes per block.
//!
//! The table mirrors `GGML_QUANT_SIZES` of the PyPI `gguf` 0.19 package (and
//! ggml's `type_traits`). Ids that ggml has retired (4, 5, 31–33, 36–38) or not
//! yet assigned are unknown: their sizes cannot be known, so reading a tensor
//! of such a type is an error rather than a guess.

use serde::{Serialize, Serializer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType {
    pub id: u32,
    pub name: &'static str,
    /// Elements per block.
    pub block: u32,
    /// Bytes per block.
    pub block_bytes: u32,
}

const fn t(id: u32, name: &'static str, block: u32, block_bytes: u32) -> GgmlType {
    GgmlType { id, name, block, block_bytes }
}

/// Every type id ggml currently assigns, in id order.
pub const GGML_TYPES: &[GgmlType] = &[
    t(0, "F32", 1, 4),
    t(1, "F16", 1, 2),
    t(2, "Q4_0", 32, 18),
    t(3, "Q4_1", 32, 20),
    t(6, "Q5_0", 32, 22),
    t(7, "Q5_1", 32, 24),
    t(8, "Q8_0", 32, 34),
    t(9, "Q8_1", 32, 40),
    t(10, "Q2_K", 256, 84),
    t(11, "Q3_K", 256, 110),
    t(12, "Q4_K", 256, 144),
    t(13, "Q5_K", 256, 176),
    t(14, "Q6_K", 256, 210),
    t(15, "Q8_K", 256, 292),
    t(16, "IQ2_XXS", 256, 66),
    t(17, "IQ2_XS", 256, 74),
    t(18, "IQ3_XXS", 256, 98),
    t(19, "IQ1_S", 256, 50),
    t(20, "IQ4_NL", 32, 18),
    t(21, "IQ3_S", 256, 110),
    t(22, "IQ2_S", 256, 82),
    t(23, "IQ4_XS", 256, 136),
    t(24, "I8", 1, 1),
    t(25, "I16", 1, 2),
    t(26, "I32", 1, 4),
    t(27, "I64", 1, 8),
    t(28, "F64", 1, 8),
    t(29, "IQ1_M", 256, 56),
    t(30, "BF16", 1, 2),
    t(34, "TQ1_0", 256, 54),
    t(35, "TQ2_0", 256, 66),
    t(39, "MXFP4", 32, 17),
    t(40, "NVFP4", 64, 36),
    t(41, "Q1_0", 128, 18),
];

/// `GGML_TYPES`' position + 1 of each id below 64 (0: unknown), so that
/// `from_id`, asked for every source of every op a trace holds, is one load.
const POSITION_OF_ID: [u8; 64] = {
    let mut table = [0u8; 64];
    let mut i = 0;
    while i < GGML_TYPES.len() {
        assert!(GGML_TYPES[i].id < 64 && GGML_TYPES.len() < 255);
        table[GGML_TYPES[i].id as usize] = i as u8 + 1;
        i += 1;
    }
    table
};

impl GgmlType {
    pub fn from_id(id: u32) -> Option<GgmlType> {
        let at = *POSITION_OF_ID.get(id as usize)?;
        (at > 0).then(|| GGML_TYPES[at as usize - 1])
    }

    pub fn from_name(name: &str) -> Option<GgmlType> {
        GGML_TYPES.iter().copied().find(|t| t.name.eq_ignore_ascii_case(name))
    }

    /// Bytes of one row of `ne0` elements, or None if `ne0` is not a whole
    /// number of blocks or the product overflows.
    pub fn row_bytes(&self, ne0: u64) -> Option<u64> {
        if !ne0.is_multiple_of(u64::from(self.block)) {
            return None;
        }
        (ne0 / u64::from(self.block)).checked_mul(u64::from(self.block_bytes))
    }
}

impl Serialize for GgmlType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_matches_the_notes() {
        assert!(GGML_TYPES.windows(2).all(|w| w[0].id < w[1].id));
        for (id, block, bytes) in [(0, 1, 4), (2, 32, 18), (8, 32, 34), (12, 256, 144), (23, 256, 136), (39, 32, 17)] {
            let t = GgmlType::from_id(id).unwrap();
            assert_eq!((t.block, t.block_bytes), (block, bytes), "{}", t.name);
        }
        assert!(GgmlType::from_id(4).is_none());
        assert!(GgmlType::from_id(u32::MAX).is_none());
    }

    #[test]
    fn row_bytes_needs_whole_blocks() {
        let q8 = GgmlType::from_name("q8_0").unwrap();
        assert_eq!(q8.row_bytes(64), Some(68));
        assert_eq!(q8.row_bytes(33), None);
        assert_eq!(GgmlType::from_id(0).unwrap().row_bytes(u64::MAX), None);
    }
}
