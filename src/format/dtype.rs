//! Element types as safetensors names them, with their sizes.
//!
//! This module owns the list of dtypes reshard understands and the byte-size
//! arithmetic on them. It knows nothing of files or casting.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Every dtype of safetensors 0.8, named exactly as in a safetensors header.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Dtype {
    BOOL,
    U8,
    I8,
    F8_E5M2,
    F8_E4M3,
    F8_E8M0,
    F8_E4M3FNUZ,
    F8_E5M2FNUZ,
    F4,
    F6_E2M3,
    F6_E3M2,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    F64,
    I64,
    U64,
    C64,
}

impl Dtype {
    /// All dtypes, in the order of the enum.
    pub const ALL: [Dtype; 22] = [
        Dtype::BOOL,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8_E5M2,
        Dtype::F8_E4M3,
        Dtype::F8_E8M0,
        Dtype::F8_E4M3FNUZ,
        Dtype::F8_E5M2FNUZ,
        Dtype::F4,
        Dtype::F6_E2M3,
        Dtype::F6_E3M2,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
        Dtype::C64,
    ];

    /// The name used in safetensors headers (`"BF16"`).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::BOOL => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8_E5M2 => "F8_E5M2",
            Dtype::F8_E4M3 => "F8_E4M3",
            Dtype::F8_E8M0 => "F8_E8M0",
            Dtype::F8_E4M3FNUZ => "F8_E4M3FNUZ",
            Dtype::F8_E5M2FNUZ => "F8_E5M2FNUZ",
            Dtype::F4 => "F4",
            Dtype::F6_E2M3 => "F6_E2M3",
            Dtype::F6_E3M2 => "F6_E3M2",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
            Dtype::C64 => "C64",
        }
    }

    /// Size of one element in bits (4 for F4, 6 for the F6 types).
    pub fn bits(self) -> u64 {
        match self {
            Dtype::F4 => 4,
            Dtype::F6_E2M3 | Dtype::F6_E3M2 => 6,
            Dtype::BOOL
            | Dtype::U8
            | Dtype::I8
            | Dtype::F8_E5M2
            | Dtype::F8_E4M3
            | Dtype::F8_E8M0
            | Dtype::F8_E4M3FNUZ
            | Dtype::F8_E5M2FNUZ => 8,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 16,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 32,
            Dtype::F64 | Dtype::I64 | Dtype::U64 | Dtype::C64 => 64,
        }
    }

    /// Alignment, in bytes, that a tensor of this dtype should start at.
    ///
    /// Sub-byte types pack across bytes and need no alignment. C64 holds two
    /// f32 parts, so 4 bytes is enough for it, but 8 keeps numpy's complex64
    /// views aligned, so we ask for 8.
    pub fn alignment(self) -> u64 {
        (self.bits() / 8).max(1)
    }

    /// True for the floating-point types a cast can read or write.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            Dtype::F64
                | Dtype::F32
                | Dtype::F16
                | Dtype::BF16
                | Dtype::F8_E4M3
                | Dtype::F8_E5M2
                | Dtype::F8_E8M0
                | Dtype::F8_E4M3FNUZ
                | Dtype::F8_E5M2FNUZ
                | Dtype::F4
                | Dtype::F6_E2M3
                | Dtype::F6_E3M2
        )
    }

    /// Byte length of `numel` elements, or `None` on overflow or when the
    /// bits do not fill whole bytes.
    pub fn byte_len(self, numel: u64) -> Option<u64> {
        let bits = numel.checked_mul(self.bits())?;
        (bits % 8 == 0).then_some(bits / 8)
    }

    /// The same dtype in the safetensors crate, for writing headers.
    pub fn to_safetensors(self) -> safetensors::Dtype {
        use safetensors::Dtype as S;
        match self {
            Dtype::BOOL => S::BOOL,
            Dtype::U8 => S::U8,
            Dtype::I8 => S::I8,
            Dtype::F8_E5M2 => S::F8_E5M2,
            Dtype::F8_E4M3 => S::F8_E4M3,
            Dtype::F8_E8M0 => S::F8_E8M0,
            Dtype::F8_E4M3FNUZ => S::F8_E4M3FNUZ,
            Dtype::F8_E5M2FNUZ => S::F8_E5M2FNUZ,
            Dtype::F4 => S::F4,
            Dtype::F6_E2M3 => S::F6_E2M3,
            Dtype::F6_E3M2 => S::F6_E3M2,
            Dtype::I16 => S::I16,
            Dtype::U16 => S::U16,
            Dtype::F16 => S::F16,
            Dtype::BF16 => S::BF16,
            Dtype::I32 => S::I32,
            Dtype::U32 => S::U32,
            Dtype::F32 => S::F32,
            Dtype::F64 => S::F64,
            Dtype::I64 => S::I64,
            Dtype::U64 => S::U64,
            Dtype::C64 => S::C64,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error for a dtype name that safetensors does not define.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dtype {0:?}")]
pub struct UnknownDtype(pub String);

impl FromStr for Dtype {
    type Err = UnknownDtype;

    /// Parses a safetensors name (`BF16`) or a common short name
    /// (`bf16`, `f16`, `fp16`, `float32`, ...), case-insensitively.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let upper = s.to_ascii_uppercase();
        if let Some(d) = Dtype::ALL.iter().find(|d| d.name() == upper) {
            return Ok(*d);
        }
        let alias = match upper.as_str() {
            "BFLOAT16" => Dtype::BF16,
            "FP16" | "HALF" | "FLOAT16" => Dtype::F16,
            "FP32" | "FLOAT" | "FLOAT32" => Dtype::F32,
            "FP64" | "DOUBLE" | "FLOAT64" => Dtype::F64,
            _ => return Err(UnknownDtype(s.to_string())),
        };
        Ok(alias)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_match_the_safetensors_crate() {
        for d in Dtype::ALL {
            assert_eq!(d.name().parse::<Dtype>().unwrap(), d);
            let st = d.to_safetensors();
            assert_eq!(st.bitsize() as u64, d.bits(), "{d}");
            assert_eq!(format!("{st:?}"), d.name());
        }
    }

    #[test]
    fn short_names_parse() {
        assert_eq!("bf16".parse::<Dtype>().unwrap(), Dtype::BF16);
        assert_eq!("fp16".parse::<Dtype>().unwrap(), Dtype::F16);
        assert_eq!("float32".parse::<Dtype>().unwrap(), Dtype::F32);
        assert!("f12".parse::<Dtype>().is_err());
    }

    #[test]
    fn byte_len_is_checked() {
        assert_eq!(Dtype::BF16.byte_len(3), Some(6));
        assert_eq!(Dtype::F4.byte_len(4), Some(2));
        assert_eq!(Dtype::F4.byte_len(3), None);
        assert_eq!(Dtype::F6_E2M3.byte_len(4), Some(3));
        assert_eq!(Dtype::F64.byte_len(u64::MAX), None);
    }
}
