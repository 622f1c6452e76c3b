//! GGUF encoders: f32 values to the bytes of one GGML type, the reverse
//! of [`super::dequantize_blocks`].
//!
//! This module owns the element arithmetic of every type the GGUF writer
//! emits: F32, F16 and BF16 as gguf-py 0.19.0 casts them (numpy's
//! `astype(float16)`, gguf-py's own BF16 rounding), Q8_0 and Q4_0 as
//! gguf-py's `Q8_0.quantize_blocks` / `Q4_0.quantize_blocks` (the same
//! values as ggml's `quantize_row_q8_0_ref` / `quantize_row_q4_0_ref`),
//! and the K-quants through [`super::kquantize`]. It knows nothing of
//! tensors, rows or files: [`quantize_blocks`] takes whole blocks.
//!
//! Bit-exactness rests on evaluating each step as numpy does: Q8_0's
//! `d = amax / 127` and `id = 1 / d` in f32, `x * id` in f32, then
//! `np_roundf` (half away from zero, which is `f32::round`); Q4_0's
//! `(f64(x) * f64(id)) + 8.5` in f64, truncated, then clipped to 15 (the
//! FMA-free rounding gguf-py pins).

use super::super::kernels::f32_to_f16;
use super::kquantize::{quantize_q4_k, quantize_q6_k, KQuantError};
use crate::format::gguf::ggml::GgmlType;

/// The types [`quantize_blocks`] writes.
pub const ENCODABLE: [GgmlType; 7] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// Why values could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("reshard does not write GGML type {ty}")]
    Unsupported { ty: GgmlType },
    #[error("{values} values are not whole {ty} blocks of {block}, or {bytes} output bytes are not their blocks")]
    Length {
        ty: GgmlType,
        values: usize,
        block: u64,
        bytes: usize,
    },
    #[error(transparent)]
    KQuant(#[from] KQuantError),
}

/// Counts of what encoding did to the values, as a cast counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EncodeStats {
    /// Finite values that became infinite (F16, BF16).
    pub overflow: u64,
    /// NaN or infinite values in a block type (Q8_0, Q4_0, Q4_K, Q6_K):
    /// each spoils its block's scale, so the other values of that block
    /// decode as NaN (Q8_0, Q4_0, Q4_K) or as zeros (Q6_K's 16-value
    /// sub-block). gguf-py writes such blocks; reshard does too, and the
    /// caller decides whether to allow it.
    pub not_finite: u64,
    /// Blocks of finite values whose F16 scale came out infinite (values
    /// past what the type's scale can step through: beyond about 524,000
    /// for Q4_0, 8.3 million for Q8_0): every value of such a block
    /// decodes as infinity or NaN.
    pub scale_overflow: u64,
}

/// Encodes `values` (whole blocks of `ty`) into `out` (exactly their
/// bytes).
///
/// ```
/// use reshard::cast::gguf::quantize::quantize_blocks;
/// use reshard::format::gguf::ggml::GgmlType;
///
/// let values: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
/// let mut out = [0u8; 34];
/// quantize_blocks(GgmlType::Q8_0, &values, &mut out).unwrap();
/// // d = 16 / 127 as f16, then codes -127 ..= 119.
/// assert_eq!(out[2] as i8, -127);
/// ```
pub fn quantize_blocks(
    ty: GgmlType,
    values: &[f32],
    out: &mut [u8],
) -> Result<EncodeStats, EncodeError> {
    let layout = match ty.layout() {
        Some(l) if ENCODABLE.contains(&ty) => l,
        _ => return Err(EncodeError::Unsupported { ty }),
    };
    let blocks = values.len() as u64 / layout.block;
    if !(values.len() as u64).is_multiple_of(layout.block)
        || blocks.checked_mul(layout.bytes) != Some(out.len() as u64)
    {
        return Err(EncodeError::Length {
            ty,
            values: values.len(),
            block: layout.block,
            bytes: out.len(),
        });
    }
    let mut stats = EncodeStats::default();
    // Q8_0's kernel counts its blocks' non-finite values and spoiled
    // scales itself, from the magnitudes it already has (a pass of its own
    // over every value cost a tenth of a Q8_0 conversion).
    if !matches!(
        ty,
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q8_0
    ) {
        stats.not_finite = values.iter().filter(|v| !v.is_finite()).count() as u64;
    }
    match ty {
        GgmlType::F32 => {
            for (x, o) in values.iter().zip(out.chunks_exact_mut(4)) {
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (x, o) in values.iter().zip(out.chunks_exact_mut(2)) {
                let (h, flags) = f32_to_f16::<false>(x.to_bits());
                stats.overflow += u64::from(flags.overflow);
                o.copy_from_slice(&h.to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (x, o) in values.iter().zip(out.chunks_exact_mut(2)) {
                let h = bf16_of(*x);
                stats.overflow += u64::from(x.is_finite() && (h & 0x7fff) == 0x7f80);
                o.copy_from_slice(&h.to_le_bytes());
            }
        }
        GgmlType::Q8_0 => {
            let counted = crate::cast::simd::vectorized(Q8Blocks { values, out });
            stats.not_finite = counted.not_finite;
            stats.scale_overflow = counted.scale_overflow;
        }
        GgmlType::Q4_0 => {
            for (x, o) in values.chunks_exact(32).zip(out.chunks_exact_mut(18)) {
                q4_0_block(x, o);
            }
        }
        GgmlType::Q4_K => quantize_q4_k(values, out)?,
        GgmlType::Q6_K => quantize_q6_k(values, out)?,
        _ => return Err(EncodeError::Unsupported { ty }),
    }
    let scales = scale_offsets(ty);
    if !scales.is_empty() {
        let per = layout.block as usize;
        for (x, b) in values
            .chunks_exact(per)
            .zip(out.chunks_exact(layout.bytes as usize))
        {
            let spoiled = scales
                .iter()
                .any(|&at| u16::from_le_bytes([b[at], b[at + 1]]) & 0x7c00 == 0x7c00);
            if spoiled && x.iter().all(|v| v.is_finite()) {
                stats.scale_overflow += 1;
            }
        }
    }
    Ok(stats)
}

/// Where a block of `ty` keeps its F16 scales (`d`, and Q4_K's `dmin`),
/// for the check of spoiled scales (Q8_0's kernel checks its own).
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 => &[0],
        GgmlType::Q4_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[],
    }
}

/// gguf-py's `__compute_fp32_to_bf16`: a NaN made quiet (its top bits
/// kept, bit 6 of the result set), everything else rounded to nearest
/// even, overflowing to infinity.
pub fn bf16_of(x: f32) -> u16 {
    let n = x.to_bits();
    let n = if n & 0x7fff_ffff > 0x7f80_0000 {
        (n & 0xffff_0000) | (64 << 16)
    } else {
        n
    };
    ((u64::from(n) + (0x7fff + u64::from((n >> 16) & 1))) >> 16) as u16
}

/// numpy's `astype(np.float16)` of `x`, as bits.
fn f16_bits(x: f32) -> [u8; 2] {
    f32_to_f16::<false>(x.to_bits()).0.to_le_bytes()
}

/// Q8_0 blocks of `values` into `out`, for [`crate::cast::simd::vectorized`]:
/// the same bytes as [`q8_0_block`] (its scalar reference, which the tests
/// compare it with), in branchless loops each build vectorizes.
struct Q8Blocks<'a> {
    values: &'a [f32],
    out: &'a mut [u8],
}

impl crate::cast::simd::Vectorized for Q8Blocks<'_> {
    type Output = EncodeStats;
    #[inline(always)]
    fn run(self) -> EncodeStats {
        let mut stats = EncodeStats::default();
        for (x, o) in self
            .values
            .chunks_exact(32)
            .zip(self.out.chunks_exact_mut(34))
        {
            let x: &[f32; 32] = x.try_into().expect("32 values");
            // The magnitudes' bits order as the magnitudes do, and every
            // NaN's lie above infinity's: an integer max (which vectorizes
            // as a float max with NaN does not) finds amax, and a NaN
            // anywhere (numpy's max propagates it) makes it NaN.
            let mut bits = 0u32;
            for &v in x {
                bits = bits.max(v.to_bits() & 0x7fff_ffff);
            }
            let amax = if bits > 0x7f80_0000 {
                f32::NAN
            } else {
                f32::from_bits(bits)
            };
            let d = amax / 127.0;
            let id = if d == 0.0 { 0.0 } else { 1.0 / d };
            let d16 = f16_bits(d);
            o[..2].copy_from_slice(&d16);
            let codes: &mut [u8; 32] = (&mut o[2..]).try_into().expect("32 codes");
            for (v, c) in x.iter().zip(codes.iter_mut()) {
                *c = round_half_away(v * id) as u8;
            }
            if bits >= 0x7f80_0000 {
                // Rare: the block holds a NaN or an infinity.
                stats.not_finite += x.iter().filter(|v| !v.is_finite()).count() as u64;
            } else if u16::from_le_bytes(d16) & 0x7c00 == 0x7c00 {
                stats.scale_overflow += 1;
            }
        }
        stats
    }
}

/// `q.round() as i8` (half away from zero, NaN to 0, saturating) without
/// a call to `roundf`: clamp to i8's range (an infinite `q`, from a block
/// of subnormals whose `1 / d` overflows, saturates as `as` does), then
/// truncate and step away from zero when the dropped part is at least one
/// half (exact: `q - trunc(q)` loses nothing at these magnitudes).
#[inline(always)]
fn round_half_away(q: f32) -> i8 {
    let q = q.clamp(-128.0, 127.0); // NaN stays NaN
    let t = q as i32; // NaN -> 0
    let frac = q - t as f32;
    (t + i32::from(frac >= 0.5) - i32::from(frac <= -0.5)) as i8
}

/// One Q8_0 block: f16 `d = amax / 127`, then 32 int8 `round(x * (1 / d))`.
/// The scalar reference of [`Q8Blocks`].
#[cfg(test)]
fn q8_0_block(x: &[f32], out: &mut [u8]) {
    let amax = x.iter().fold(0f32, |m, v| {
        // numpy's max propagates NaN.
        if v.is_nan() || m.is_nan() {
            f32::NAN
        } else {
            m.max(v.abs())
        }
    });
    let d = amax / 127.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    out[..2].copy_from_slice(&f16_bits(d));
    for (v, o) in x.iter().zip(&mut out[2..]) {
        // numpy's float -> int8 cast of a value within range; NaN (only
        // with a NaN in the block) is 0 as the x86 conversion gives.
        *o = ((v * id).round() as i8) as u8;
    }
}

/// One Q4_0 block: `d = max / -8` of the value of largest magnitude (the
/// first one), then 32 4-bit codes `trunc(x * id + 8.5)` clipped to 15,
/// low nibbles the first 16 values.
fn q4_0_block(x: &[f32], out: &mut [u8]) {
    let mut max = 0f32;
    let mut amax = -1f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    out[..2].copy_from_slice(&f16_bits(d));
    let code = |v: f32| -> u8 {
        let q = (f64::from(v) * f64::from(id) + 8.5).trunc() as f32;
        (q as u8).min(15)
    };
    for j in 0..16 {
        out[2 + j] = code(x[j]) | (code(x[16 + j]) << 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cast::gguf::dequantize_blocks;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
            })
            .collect()
    }

    #[test]
    fn the_vectorized_q8_0_blocks_are_the_scalar_references_bytes() {
        let mut x = values(32 * 64, 7);
        // Ties, values past the scale, subnormals, zeros, NaN and infinity,
        // each in a block of its own.
        let specials: [&[f32]; 7] = [
            &[2.5, -2.5, 0.5, -0.5, 126.5, -127.0, 1.5, 63.5],
            &[1.0e-40, -1.0e-40, 3.0e-41],
            &[0.0, -0.0],
            &[f32::NAN, 1.0],
            &[f32::INFINITY, 2.0],
            &[f32::NEG_INFINITY, -3.0],
            &[1.0e38, -1.0e38, 1.0],
        ];
        for (b, s) in specials.iter().enumerate() {
            let block = &mut x[b * 32..(b + 1) * 32];
            block.fill(if b == 1 { 1.0e-40 } else { 0.0 });
            block[..s.len()].copy_from_slice(s);
        }
        let blocks = x.len() / 32;
        let mut want = vec![0u8; blocks * 34];
        for (v, o) in x.chunks_exact(32).zip(want.chunks_exact_mut(34)) {
            q8_0_block(v, o);
        }
        let builds = crate::cast::simd::vectorized_builds::<Q8Blocks<'_>>();
        let mut outs = vec![vec![0u8; blocks * 34]; builds.len()];
        let mut names = Vec::new();
        for ((name, build), got) in builds.into_iter().zip(outs.iter_mut()) {
            let stats = build(Q8Blocks {
                values: &x,
                out: got,
            });
            // NaN, +inf, -inf; and the 1e38 block's d, past F16.
            assert_eq!((stats.not_finite, stats.scale_overflow), (3, 1), "{name}");
            names.push(name);
        }
        for (name, got) in names.iter().zip(&outs) {
            assert_eq!(got, &want, "{name}");
        }
    }

    #[test]
    fn non_finite_values_are_counted_for_block_types_only() {
        let mut v = vec![0.5f32; 256];
        v[7] = f32::NAN;
        v[100] = f32::NEG_INFINITY;
        for (ty, bytes, counted) in [
            (GgmlType::Q8_0, 8 * 34, 2),
            (GgmlType::Q4_0, 8 * 18, 2),
            (GgmlType::Q4_K, 144, 2),
            (GgmlType::Q6_K, 210, 2),
            (GgmlType::F16, 512, 0),
            (GgmlType::BF16, 512, 0),
        ] {
            let mut out = vec![0u8; bytes];
            let stats = quantize_blocks(ty, &v, &mut out).unwrap();
            assert_eq!(stats.not_finite, counted, "{ty}");
            assert_eq!(stats.scale_overflow, 0, "{ty}");
        }
    }

    #[test]
    fn a_finite_block_whose_f16_scale_overflows_is_counted() {
        // Q4_0's d = max / -8 passes F16's 65504 from 524,032 up; Q8_0's
        // d = amax / 127 stays finite there.
        let mut v = vec![0.5f32; 64];
        v[40] = 1.0e6;
        let mut q4 = vec![0u8; 2 * 18];
        assert_eq!(
            quantize_blocks(GgmlType::Q4_0, &v, &mut q4)
                .unwrap()
                .scale_overflow,
            1
        );
        let mut q8 = vec![0u8; 2 * 34];
        assert_eq!(
            quantize_blocks(GgmlType::Q8_0, &v, &mut q8)
                .unwrap()
                .scale_overflow,
            0
        );
        v[40] = 1.0e7;
        assert_eq!(
            quantize_blocks(GgmlType::Q8_0, &v, &mut q8)
                .unwrap()
                .scale_overflow,
            1
        );
    }

    #[test]
    fn q8_0_round_trips_within_half_a_step() {
        let x = values(256, 1);
        let mut out = vec![0u8; 8 * 34];
        quantize_blocks(GgmlType::Q8_0, &x, &mut out).unwrap();
        let mut back = vec![0f32; 256];
        dequantize_blocks(GgmlType::Q8_0, &out, &mut back).unwrap();
        for (b, block) in x.chunks(32).enumerate() {
            let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, v) in block.iter().enumerate() {
                let err = (back[b * 32 + i] - v).abs();
                assert!(err <= amax / 127.0 * 0.51 + 1e-3 * amax, "{v} {err}");
            }
        }
    }

    #[test]
    fn q4_0_codes_and_scale_by_hand() {
        // max = -16 at index 0: d = 2, id = 0.5, code(x) = trunc(x / 2 + 8.5).
        let mut x = [0f32; 32];
        x[0] = -16.0;
        x[1] = 3.0;
        x[16] = 15.0;
        let mut out = [0u8; 18];
        quantize_blocks(GgmlType::Q4_0, &x, &mut out).unwrap();
        assert_eq!(u16::from_le_bytes([out[0], out[1]]), 0x4000); // 2.0
        assert_eq!(out[2] & 0x0f, 0); // trunc(-8 + 8.5)
        assert_eq!(out[2] >> 4, 15); // trunc(7.5 + 8.5) = 16, clipped
        assert_eq!(out[3] & 0x0f, 10); // trunc(1.5 + 8.5)
        assert_eq!(out[4], 8 | (8 << 4)); // zeros
    }

    #[test]
    fn zero_blocks_and_float_types() {
        let mut out = [0xffu8; 34];
        quantize_blocks(GgmlType::Q8_0, &[0.0; 32], &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0));
        let mut out = [0u8; 4];
        let s = quantize_blocks(GgmlType::F16, &[1.0, 1e6], &mut out).unwrap();
        assert_eq!(out, [0x00, 0x3c, 0x00, 0x7c]);
        assert_eq!(s.overflow, 1);
        quantize_blocks(GgmlType::BF16, &[1.0, -2.0], &mut out).unwrap();
        assert_eq!(out, [0x80, 0x3f, 0x00, 0xc0]);
        assert_eq!(bf16_of(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(bf16_of(f32::from_bits(0x3f80_8000)), 0x3f80, "tie to even");
        assert_eq!(bf16_of(f32::from_bits(0x3f81_8000)), 0x3f82, "tie to even");
    }

    #[test]
    fn lengths_are_checked() {
        let mut out = [0u8; 34];
        assert!(matches!(
            quantize_blocks(GgmlType::Q8_0, &[0.0; 31], &mut out),
            Err(EncodeError::Length { .. })
        ));
        assert!(matches!(
            quantize_blocks(GgmlType::Q5_0, &[0.0; 32], &mut out),
            Err(EncodeError::Unsupported { .. })
        ));
    }
}
