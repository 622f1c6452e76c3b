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
    #[error("tensor {tensor:?}: {from} codes cannot be dequantized to {to}")]
    Unsupported {
        tensor: String,
        from: Dtype,
        to: Dtype,
    },
}
