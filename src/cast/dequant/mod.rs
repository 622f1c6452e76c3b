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

mod error;
mod fp8;
mod mxfp4;
mod stream;
#[cfg(test)]
mod tests;

pub use self::error::DequantError;
pub use self::fp8::e8m0_to_f32;
pub use self::mxfp4::E2M1_VALUES;
pub use self::stream::{Chunk, ChunkStream, DequantStream};
