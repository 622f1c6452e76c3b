//! MXFP4 (gpt-oss): E2M1 codes, two a byte, times an E8M0 power of two per
//! 32 values, written in transformers' dense layout.
//!
//! As transformers' `convert_moe_packed_tensors`: the low nibble is the
//! even element, the high nibble the odd one; the value is the E2M1 code's
//! value times `2^(scale - 127)`, exact (in f64; scale 255 is 2^128, not
//! infinity, so `0.5 * 2^128` is the finite 2^127, as `torch.ldexp` gives),
//! rounded once to the target; the
//! `[experts, rows, groups * 32]` result is transposed to `[experts, groups *
//! 32, rows]`. One expert is done per chunk: its codes, its scales and its
//! output all sit in the caller's buffer.

use crate::cast::kernels as k;
use crate::cast::policy::CastStats;
use crate::format::Dtype;

/// The value of each E2M1 code (sign, 2 exponent bits, 1 mantissa bit), as
/// transformers' `FP4_VALUES`.
pub const E2M1_VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// `2^(e - 127)`, exact in f64 for every exponent (255 included).
pub(super) fn power_of_two(e: u8) -> f64 {
    f64::from_bits((u64::from(e) + 1023 - 127) << 52)
}

/// One value: code `c` (0..16) times `2^(e - 127)`, rounded to `to`, its
/// little-endian bytes written to `out`.
#[inline(always)]
fn one<const SAT: bool>(c: u8, p2: f64, to: Dtype, out: &mut [u8], stats: &mut CastStats) {
    let p = (f64::from(E2M1_VALUES[usize::from(c & 15)]) * p2).to_bits();
    let flags = match to {
        Dtype::BF16 => {
            let (b, f) = k::f64_to_bf16::<SAT>(p);
            out.copy_from_slice(&b.to_le_bytes());
            f
        }
        Dtype::F16 => {
            let (b, f) = k::f64_to_f16::<SAT>(p);
            out.copy_from_slice(&b.to_le_bytes());
            f
        }
        Dtype::F64 => {
            let (b, f) = k::same_f64(p);
            out.copy_from_slice(&b.to_le_bytes());
            f
        }
        _ => {
            let (b, f) = k::f64_to_f32::<SAT>(p);
            out.copy_from_slice(&b.to_le_bytes());
            f
        }
    };
    stats.overflow += u64::from(flags.overflow);
    stats.underflow += u64::from(flags.underflow);
    stats.nan += u64::from(flags.nan);
}

/// Dequantizes one expert: `codes` `[rows, groups, 16]`, `scales` `[rows,
/// groups]`, into `out` `[groups * 32, rows]` of `to`.
pub(super) fn expert<const SAT: bool>(
    codes: &[u8],
    scales: &[u8],
    rows: usize,
    groups: usize,
    to: Dtype,
    out: &mut [u8],
) -> CastStats {
    let osz = (to.bits() / 8) as usize;
    let mut stats = CastStats::default();
    for r in 0..rows {
        for g in 0..groups {
            let cell = r * groups + g;
            let p2 = power_of_two(scales[cell]);
            for (j, &byte) in codes[cell * 16..cell * 16 + 16].iter().enumerate() {
                let h = g * 32 + 2 * j;
                let lo = (h * rows + r) * osz;
                let hi = ((h + 1) * rows + r) * osz;
                one::<SAT>(byte & 15, p2, to, &mut out[lo..lo + osz], &mut stats);
                one::<SAT>(byte >> 4, p2, to, &mut out[hi..hi + osz], &mut stats);
            }
        }
    }
    stats
}
