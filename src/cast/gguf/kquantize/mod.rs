//! GGUF K-quant quantizers: f32 rows to Q4_K and Q6_K blocks, bit for bit
//! as ggml's reference routines `quantize_row_q4_K_ref` and
//! `quantize_row_q6_K_ref` (what `ggml_quantize_chunk` runs without an
//! importance matrix, and what llama.cpp's `llama-quantize` writes then).
//!
//! This module owns the arithmetic of the two quantizers and the checks on
//! lengths. It does not write files, pick a type per tensor, or take an
//! importance matrix (ggml's `_impl` variants). The dequantizers beside it
//! (`cast::gguf::dequantize_blocks`) read what it writes.
//!
//! Bit-exactness rests on three things, each in `round`, `q4_k` or `q6_k`:
//! ggml's `nearest_int` (adding 1.5 * 2^23, so ties go to even, unlike
//! `roundf`), f16 fields rounded to nearest even and read back before the
//! codes are recomputed, and every f32 operation in ggml's order without
//! fused multiply-adds. The proof is the oracle test against libggml
//! (tests/cli/kquant.rs); the unit tests check the round trip and the edges.
//!
//! A block is quantized on the stack (no allocation). The scale searches,
//! ggml's slow part, run on every sub-block of a block at once, one lane
//! each, with the scalar searches kept in `scalar_tests` as the reference
//! they match bit for bit: about 2.5x (Q4_K) and 2.2x (Q6_K) the scalar
//! speed, about 150 and 260 MB/s of f32 per core (`cargo run --release
//! --example kquant_throughput`). Rows are independent, so callers
//! parallelize over rows.

mod error;
mod q4_k;
mod q6_k;
mod round;
#[cfg(test)]
mod scalar_tests;
#[cfg(test)]
mod tests;

pub use self::error::KQuantError;
use crate::format::gguf::ggml::GgmlType;

/// Values per K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of one Q4_K block and of one Q6_K block.
pub const Q4_K_BYTES: usize = 144;
pub const Q6_K_BYTES: usize = 210;

/// Quantizes `row` (a multiple of 256 values) into Q4_K blocks, 144 bytes
/// per 256 values, as ggml's `quantize_row_q4_K_ref`. `out` must hold
/// exactly those bytes.
///
/// ```
/// use reshard::cast::gguf::kquantize::quantize_q4_k;
///
/// let row: Vec<f32> = (0..256).map(|i| i as f32 / 16.0).collect();
/// let mut out = [0u8; 144];
/// quantize_q4_k(&row, &mut out).unwrap();
/// assert!(quantize_q4_k(&row[..100], &mut out).is_err());
/// ```
pub fn quantize_q4_k(row: &[f32], out: &mut [u8]) -> Result<(), KQuantError> {
    quantize_rows(GgmlType::Q4_K, row, out, q4_k::block)
}

/// Quantizes `row` (a multiple of 256 values) into Q6_K blocks, 210 bytes
/// per 256 values, as ggml's `quantize_row_q6_K_ref`. `out` must hold
/// exactly those bytes.
pub fn quantize_q6_k(row: &[f32], out: &mut [u8]) -> Result<(), KQuantError> {
    quantize_rows(GgmlType::Q6_K, row, out, q6_k::block)
}

/// Checks the lengths, then runs `block` on each 256 values and its
/// `N`-byte block.
fn quantize_rows<const N: usize>(
    ty: GgmlType,
    row: &[f32],
    out: &mut [u8],
    block: fn(&[f32; QK_K], &mut [u8; N]),
) -> Result<(), KQuantError> {
    if !row.len().is_multiple_of(QK_K) {
        return Err(KQuantError::PartialBlock {
            ty,
            values: row.len(),
        });
    }
    let bytes = row.len() / QK_K * N;
    if out.len() != bytes {
        return Err(KQuantError::OutputLength {
            ty,
            values: row.len(),
            bytes,
            room: out.len(),
        });
    }
    for (x, o) in row.chunks_exact(QK_K).zip(out.chunks_exact_mut(N)) {
        // Both conversions hold: chunks_exact gives exactly these lengths.
        block(x.try_into().unwrap(), o.try_into().unwrap());
    }
    Ok(())
}
