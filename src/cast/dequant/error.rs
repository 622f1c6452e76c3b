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
    #[error(
        "{file}: tensor {tensor:?} holds NaN or infinite values ({count} in the part read \
         before reshard stopped), and in {ty} each spoils the other values of the block of \
         {block} it sits in (they decode as NaN, or as zeros); fix the source, or use \
         --on-overflow inf (or saturate) to write such blocks as gguf-py and llama.cpp's \
         converter do"
    )]
    NotFiniteInBlocks {
        file: String,
        tensor: String,
        count: u64,
        ty: String,
        block: u64,
    },
    #[error(
        "{file}: tensor {tensor:?}: {count} {ty} {} values too large for an F16 block scale, \
         so {} would decode as infinity or NaN; use a type whose scale steps finer (q8_0 \
         holds values up to about 8.3e6, f16 up to 65504), or --on-overflow inf (or \
         saturate) to write {} as gguf-py does",
        if *.count == 1 { "block holds" } else { "blocks hold" },
        if *.count == 1 { "it" } else { "they" },
        if *.count == 1 { "it" } else { "them" }
    )]
    ScaleOverflow {
        file: String,
        tensor: String,
        count: u64,
        ty: String,
    },
    #[error("tensor {tensor:?}: {from} codes cannot be dequantized to {to}")]
    Unsupported {
        tensor: String,
        from: Dtype,
        to: Dtype,
    },
}
