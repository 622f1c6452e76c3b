//! Why a dequantization stopped. Each names the tensor.

use crate::format::{Dtype, FormatError};

/// Why a dequantization stopped. Each names the tensor.
#[derive(Debug, thiserror::Error)]
pub enum DequantError {
    #[error(transparent)]
    Read(#[from] FormatError),
    #[error("tensor {tensor:?}: dequantizing needs a buffer of at least {needed} bytes and has {have}; raise --window (or lower --threads)")]
    BufferTooSmall {
        tensor: String,
        needed: u64,
        have: u64,
    },
    #[error("tensor {tensor:?}: its scale {scale:?} is {dtype}; scales must be F32, BF16, F16 or F8_E8M0 (U8 for mxfp4)")]
    ScaleDtype {
        tensor: String,
        scale: String,
        dtype: Dtype,
    },
    #[error("tensor {tensor:?} cannot be decoded")]
    Blocks {
        tensor: String,
        #[source]
        source: crate::cast::gguf::DequantError,
    },
    #[error("tensor {tensor:?}: its rows cannot be put back in Hugging Face order: {reason}")]
    Rows { tensor: String, reason: String },
    #[error("{file}: tensor {tensor:?}: {count} {} infinite in {work} (inf in the source, or past {work}'s range), which no FP8 scale holds; use --on-overflow saturate or inf to clamp {} to the largest code", if *.count == 1 { "value is" } else { "values are" }, if *.count == 1 { "it" } else { "them" })]
    NotFinite {
        file: String,
        tensor: String,
        count: u64,
        work: Dtype,
    },
    #[error("tensor {tensor:?}: {from} codes cannot be dequantized to {to}")]
    Unsupported {
        tensor: String,
        from: Dtype,
        to: Dtype,
    },
}
