//! The dequantize stage: quantized codes (F8_E4M3, F8_E5M2, MXFP4) times
//! their scales, rounded to a dense dtype, streamed chunk by chunk.
//!
//! This module owns the arithmetic and the streaming of one quantized
//! weight ([`DequantStream`]): each code is decoded to f32 exactly, multiplied
//! once by the f32 value of its block's (channel's, tensor's) scale, and
//! rounded to the target with round-to-nearest-even by the same kernels as
//! the casts. The plan data that says how ([`Scheme`], and the plan's
//! `TensorInput::Dequantized`) and which tensors are quantized, with which scale, are
//! [`crate::quant`]'s.
//!
//! The weight's codes and its scales are read as two sequential streams in
//! row order, so a scale in another shard costs one more open file, never a
//! whole-shard read. Only one row of block scales (FP8) or one expert's
//! scales (MXFP4, inside the caller's buffer) is held at a time.

mod fp8;
mod mxfp4;
#[cfg(test)]
mod tests;

use super::{CastStats, OverflowPolicy};
use crate::format::read::{SourceReader, TensorBytes};
use crate::format::{Dtype, FormatError, Tensor};
use crate::quant::Scheme;

pub use self::fp8::e8m0_to_f32;
pub use self::mxfp4::E2M1_VALUES;

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
    #[error("tensor {tensor:?}: {from} codes cannot be dequantized to {to}")]
    Unsupported {
        tensor: String,
        from: Dtype,
        to: Dtype,
    },
}

/// The output chunk [`DequantStream::fill`] wrote: `buf[start..start + len]`,
/// from `read` bytes of the weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub start: usize,
    pub len: usize,
    pub read: u64,
}

/// One quantized weight being dequantized, chunk after chunk.
pub struct DequantStream<'a> {
    reader: &'a SourceReader,
    weight: &'a Tensor,
    scale: &'a Tensor,
    weights: TensorBytes,
    scales: TensorBytes,
    scheme: Scheme,
    to: Dtype,
    policy: OverflowPolicy,
    /// Elements (FP8) or experts (MXFP4) done.
    done: u64,
    /// FP8: the scale row `row` as f32.
    row: Option<u64>,
    row_values: Vec<f32>,
    stats: CastStats,
}

impl<'a> DequantStream<'a> {
    /// Starts dequantizing `weight` with `scale` into `to` (BF16, F16, F32 or
    /// F64). Fails on a dtype pair this stage has no kernel for.
    pub fn open(
        reader: &'a SourceReader,
        weight: &'a Tensor,
        scale: &'a Tensor,
        scheme: &Scheme,
        to: Dtype,
        policy: OverflowPolicy,
    ) -> Result<Self, DequantError> {
        let codes_ok = match scheme {
            Scheme::Blocks { .. } => matches!(weight.dtype, Dtype::F8_E4M3 | Dtype::F8_E5M2),
            Scheme::Mxfp4 { .. } => weight.dtype == Dtype::U8,
        };
        if !codes_ok || !super::TARGETS.contains(&to) {
            return Err(DequantError::Unsupported {
                tensor: weight.name.clone(),
                from: weight.dtype,
                to,
            });
        }
        let scale_ok = match scheme {
            Scheme::Blocks { .. } => fp8::scale_decoder(scale.dtype).is_some(),
            Scheme::Mxfp4 { .. } => matches!(scale.dtype, Dtype::U8 | Dtype::F8_E8M0),
        };
        if !scale_ok {
            return Err(DequantError::ScaleDtype {
                tensor: weight.name.clone(),
                scale: scale.name.clone(),
                dtype: scale.dtype,
            });
        }
        Ok(DequantStream {
            reader,
            weight,
            scale,
            weights: reader.tensor_bytes_gathered(weight, 0),
            scales: reader.tensor_bytes_gathered(scale, 0),
            scheme: scheme.clone(),
            to,
            policy,
            done: 0,
            row: None,
            row_values: Vec::new(),
            stats: CastStats::default(),
        })
    }

    /// True once every element has been written.
    pub fn is_done(&self) -> bool {
        self.done >= self.units()
    }

    /// Counts so far (overflow, underflow, NaN), as for a cast.
    pub fn stats(&self) -> CastStats {
        self.stats
    }

    /// The smallest buffer [`DequantStream::fill`] accepts.
    pub fn min_buffer(&self) -> u64 {
        self.scheme.min_buffer(self.to)
    }

    fn units(&self) -> u64 {
        match self.scheme {
            Scheme::Blocks { rows, cols, .. } => rows.saturating_mul(cols),
            // An expert of no values has nothing to write: a `[1, 2^62, 0,
            // 16]` weight is done at once, not after 2^62 empty rows.
            Scheme::Mxfp4 {
                experts,
                rows,
                groups,
            } if rows.saturating_mul(groups) > 0 => experts,
            Scheme::Mxfp4 { .. } => 0,
        }
    }

    /// Reads the next chunk of the weight into the front of `buf` and
    /// writes its dequantized values after it.
    pub fn fill(&mut self, buf: &mut [u8]) -> Result<Chunk, DequantError> {
        let need = self.min_buffer();
        if (buf.len() as u64) < need {
            return Err(DequantError::BufferTooSmall {
                tensor: self.weight.name.clone(),
                needed: need,
                have: buf.len() as u64,
            });
        }
        match self.scheme {
            Scheme::Blocks { .. } => self.fill_fp8(buf),
            Scheme::Mxfp4 { .. } => self.fill_mxfp4(buf),
        }
    }

    /// Reads `n` scale values' bytes (sequentially) into `out`.
    fn read_scales(&mut self, out: &mut [u8]) -> Result<(), DequantError> {
        self.reader
            .read_chunk(self.scale, &mut self.scales, out)
            .map_err(DequantError::from)
    }
}
