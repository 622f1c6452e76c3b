//! The GGML tensor types: their ids as ggml numbers them, their names, and
//! how many elements a block holds and how many bytes it takes.
//!
//! The table is gguf-py 0.19.0's `GGMLQuantizationType` and
//! `GGML_QUANT_SIZES` (gguf/constants.py). An id the table does not know is
//! still a [`GgmlType`]: the reader keeps it, `inspect` shows it, and its
//! size is unknown. Which types can be dequantized is the cast stage's
//! business (`crate::cast::gguf`), not this table's.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A GGML tensor type id, known or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GgmlType(pub u32);

/// Elements a block holds and bytes it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockLayout {
    pub block: u64,
    pub bytes: u64,
}

/// (id, name, elements a block, bytes a block), as gguf-py 0.19.0.
const TABLE: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
];

impl GgmlType {
    pub const F32: GgmlType = GgmlType(0);
    pub const F16: GgmlType = GgmlType(1);
    pub const Q4_0: GgmlType = GgmlType(2);
    pub const Q4_1: GgmlType = GgmlType(3);
    pub const Q5_0: GgmlType = GgmlType(6);
    pub const Q5_1: GgmlType = GgmlType(7);
    pub const Q8_0: GgmlType = GgmlType(8);
    pub const Q8_1: GgmlType = GgmlType(9);
    pub const Q2_K: GgmlType = GgmlType(10);
    pub const Q3_K: GgmlType = GgmlType(11);
    pub const Q4_K: GgmlType = GgmlType(12);
    pub const Q5_K: GgmlType = GgmlType(13);
    pub const Q6_K: GgmlType = GgmlType(14);
    pub const BF16: GgmlType = GgmlType(30);
    pub const MXFP4: GgmlType = GgmlType(39);

    fn entry(self) -> Option<&'static (u32, &'static str, u64, u64)> {
        TABLE.iter().find(|e| e.0 == self.0)
    }

    /// The type's ggml name (`Q4_K`), or `None` for an unknown id.
    pub fn name(self) -> Option<&'static str> {
        self.entry().map(|e| e.1)
    }

    /// Elements a block and bytes a block, or `None` for an unknown id.
    pub fn layout(self) -> Option<BlockLayout> {
        self.entry().map(|e| BlockLayout {
            block: e.2,
            bytes: e.3,
        })
    }

    /// Every type the table knows, in id order.
    pub fn known() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|e| GgmlType(e.0))
    }

    /// The type named `name` (`"Q8_0"`), if the table knows it.
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TABLE.iter().find(|e| e.1 == name).map(|e| GgmlType(e.0))
    }
}

impl BlockLayout {
    /// Bytes `numel` elements take, or `None` when `numel` is not a whole
    /// number of blocks or the product overflows.
    pub fn byte_len(self, numel: u64) -> Option<u64> {
        if self.block == 0 || !numel.is_multiple_of(self.block) {
            return None;
        }
        (numel / self.block).checked_mul(self.bytes)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "type {}", self.0),
        }
    }
}

impl Serialize for GgmlType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GgmlType {
    /// The name [`Serialize`] writes: a known type's (`"Q8_0"`) or
    /// `"type N"` for an id the table does not know.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        GgmlType::from_name(&name)
            .or_else(|| name.strip_prefix("type ")?.parse().ok().map(GgmlType))
            .ok_or_else(|| serde::de::Error::custom(format!("unknown GGML type {name:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_sizes_are_ggmls() {
        assert_eq!(GgmlType::Q4_K.name(), Some("Q4_K"));
        assert_eq!(GgmlType::MXFP4.layout().unwrap().bytes, 17);
        assert_eq!(GgmlType(5).name(), None);
        assert_eq!(GgmlType(5).to_string(), "type 5");
        assert_eq!(GgmlType::from_name("BF16"), Some(GgmlType(30)));
        for ty in [GgmlType::Q4_K, GgmlType(5)] {
            let json = serde_json::to_string(&ty).unwrap();
            assert_eq!(serde_json::from_str::<GgmlType>(&json).unwrap(), ty);
        }
        assert!(serde_json::from_str::<GgmlType>("\"Q9_9\"").is_err());
        let q6 = GgmlType::Q6_K.layout().unwrap();
        assert_eq!(q6.byte_len(512), Some(420));
        assert_eq!(q6.byte_len(100), None);
        assert_eq!(
            BlockLayout { block: 1, bytes: 8 }.byte_len(u64::MAX / 4),
            None
        );
    }
}
