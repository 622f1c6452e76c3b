//! Why a plan cannot be made.

use crate::cast::CastError;
use crate::quant::QuantError;

/// Why a plan cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("--max-shard-size must be at least 1 byte")]
    ZeroShardSize,
    #[error("invalid --keep-dtype glob {glob:?}")]
    BadGlob {
        glob: String,
        #[source]
        source: globset::Error,
    },
    #[error(transparent)]
    Cast(#[from] CastError),
    #[error(transparent)]
    Quant(#[from] QuantError),
    /// Boxed: a format error is large, and a plan error travels in every
    /// convert and batch result.
    #[error(transparent)]
    Read(Box<crate::format::FormatError>),
    #[error("{file}: quantized weight {tensor:?} has no scale; its values would be wrong by the missing factor (pass --allow-unscaled to write its codes unscaled)")]
    MissingScale { file: String, tensor: String },
    #[error("{file}: scale {tensor:?} of weight {weight:?} has a shape that does not fit the weight and the block size (see reshard inspect)")]
    BadScale {
        file: String,
        tensor: String,
        weight: String,
    },
    #[error("{file}: quantized weight {tensor:?} is {dtype}; its codes must be {expected}")]
    CodesDtype {
        file: String,
        tensor: String,
        dtype: String,
        expected: String,
    },
    #[error("--keep-dtype matches quantized weight {tensor:?}; a dequantized output cannot keep some weights quantized")]
    KeepQuantized { tensor: String },
    #[error(
        "quantized weight {tensor:?} would be written as {name:?}, which another tensor already is"
    )]
    DenseNameTaken { tensor: String, name: String },
    #[error("{file}: tensor {tensor:?} is {ty}; give --dtype bf16, f16 or f32 to dequantize it (safetensors has no {ty})")]
    GgufNeedsDtype {
        file: String,
        tensor: String,
        ty: crate::format::gguf::ggml::GgmlType,
    },
    #[error("{file}: tensor {tensor:?} is {ty}, which reshard cannot dequantize (it reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to Q6_K and MXFP4)")]
    GgufUnsupported {
        file: String,
        tensor: String,
        ty: crate::format::gguf::ggml::GgmlType,
    },
    #[error("GGUF tensor {tensor:?} has no name in transformers' {architecture}; pass --keep-gguf-names to write the tensors under their GGUF names")]
    GgufUnknownTensor {
        tensor: String,
        architecture: &'static str,
    },
    #[error(transparent)]
    GgufHf(#[from] crate::plan::gguf::GgufHfError),
    /// Boxed: it holds `to_gguf`'s errors.
    #[error(transparent)]
    GgufOut(Box<super::gguf_out_record::GgufOutError>),
    #[error("{file}: tensor {tensor:?}: {reason}")]
    GgufShape {
        file: String,
        tensor: String,
        reason: String,
    },
    #[error("--quantize {scheme}: the source is already quantized ({what}); convert it with --dtype first, then quantize that")]
    QuantizeQuantized { scheme: &'static str, what: String },
    #[error("{file}: --quantize {scheme}: tensor {tensor:?} is a quantization companion (a scale or marker) beside no quantized weight; loaders would read it as part of the quantized output: remove it from the source first")]
    QuantizeStrayCompanion {
        scheme: &'static str,
        file: String,
        tensor: String,
    },
    #[error("{file}: --quantize {scheme}: tensor {tensor:?} is already {dtype} without a scale, which {scheme} loaders misread; convert the source with --dtype bf16 first (its codes cast as they are), then quantize that")]
    QuantizeUnscaledFp8 {
        scheme: &'static str,
        file: String,
        tensor: String,
        dtype: crate::format::Dtype,
    },
    #[error(
        "--block is the block size of --quantize fp8-block; --quantize {scheme} has no blocks"
    )]
    BlockWithoutBlockScheme { scheme: &'static str },
    #[error("--block: a block size of 0 rows or columns holds no values")]
    ZeroBlock,
    #[error("--quantize {scheme}: tensor {tensor:?} would get the scale or marker {name:?}, which the source already has")]
    QuantizeNameTaken {
        scheme: &'static str,
        tensor: String,
        name: String,
    },
    #[error("--quantize fp8-block: tensor {tensor:?} has {cols} columns, {scales} block scales in one block row (at most {max}); use wider blocks")]
    BlockRowTooWide {
        tensor: String,
        cols: u64,
        scales: u64,
        max: u64,
    },
    #[error("{file}: tensor {tensor:?} would be written as {name:?}: {reason}")]
    BadOutputName {
        file: String,
        tensor: String,
        name: String,
        reason: &'static str,
    },
    #[error("{file}: tensors {first:?} and {second:?} would both be written as {name:?}; a header holds each name once")]
    OutputNameTwice {
        file: String,
        first: String,
        second: String,
        name: String,
    },
    #[error("invalid --keep or --quantize-only glob {glob:?}")]
    BadQuantizeGlob {
        glob: String,
        #[source]
        source: globset::Error,
    },
    #[error("tensor {tensor:?}: its {bytes}-byte header entry makes the shard header larger than safetensors allows")]
    HeaderTooLarge { tensor: String, bytes: u64 },
    #[error("{file}: tensor {tensor:?} is an expanded view: {bytes} bytes of output from {stored} bytes stored, more than {MAX_EXPANSION} times; pass --allow-expanded to write it anyway")]
    ExpandedView {
        file: String,
        tensor: String,
        bytes: u64,
        stored: u64,
    },
}

/// Most output bytes a tensor may have per byte of storage it reads
/// (`convert` without `--allow-expanded`). A transpose or slice reads each
/// element once (1x); only a view whose elements repeat (`expand`, stride
/// 0) goes past it, and torch writes such views only when a user saves
/// one.
pub const MAX_EXPANSION: u64 = 16;

/// Expanded views of at most 16 MiB of output pass whatever their ratio:
/// they cost nothing worth refusing.
pub const EXPANSION_FLOOR: u64 = 16 << 20;

impl From<crate::format::FormatError> for PlanError {
    fn from(e: crate::format::FormatError) -> PlanError {
        PlanError::Read(Box::new(e))
    }
}
