//! GGUF dequantizers: whole GGML blocks to f32, bit for bit as gguf-py
//! 0.19.0's `gguf.quants.dequantize`; and the way back for the GGUF
//! writer (`quantize`, `kquantize`, the `EncodeStream` of a tensor).
//!
//! This module owns the arithmetic of each supported type ([`supports`]):
//! F32, F16, BF16, the 32-element legacy quants and MXFP4 in `legacy`, the
//! 256-element K-quants in `kquants`. It does not read files, know tensor
//! names or round to the output dtype: a caller feeds it whole blocks (a
//! window of rows) and casts the f32 it gets back like any other f32.
//!
//! Bit-exactness follows numpy's float32 evaluation: every product and sum
//! is one rounded f32 operation, in the order gguf-py writes them (for
//! example Q4_K is `(d * sc) * q - (dmin * m)`, never fused), and f16 is
//! widened exactly as numpy does (NaN payloads kept). In every type here the
//! products are exact in f32 (an 11-bit f16 significand times a scale and a
//! code needs at most 11 + 7 + 5 = 23 significant bits, Q6_K's worst case,
//! and MXFP4's scale is a power of two), so the only rounding is the final `+ m` or
//! `- dmin * m`: what the fixtures catch is a wrong bit layout, not a
//! reordered product. A NaN result's payload is not promised to match
//! numpy's (the fixtures hold no NaN).

mod blocks;
mod encode;
mod f16;
pub mod kquantize;
mod kquants;
mod legacy;
mod permute;
pub mod quantize;
mod stream;
#[cfg(test)]
mod tests;

pub use self::blocks::{dequantize_blocks, supports, DequantError, SUPPORTED};
pub use self::encode::{EncodeStream, StackStream};
pub use self::f16::f16_to_f32;
pub use self::permute::{permute_heads, permuted_row};
pub use self::stream::{ggml_type_of, unpermuted_row, GgufStream, RowOrder, SCRATCH_VALUES};
