//! The two roundings the K-quant search relies on, as ggml evaluates them:
//! `nearest_int` (the float magic-number trick, not `roundf`) and the f16
//! fields of a block (round to nearest even, then widened back exactly).

use crate::cast::gguf::f16_to_f32;
use crate::cast::kernels::f32_to_f16;

/// 1.5 * 2^23: adding it to |x| < 2^22 leaves round-half-even(x) in the low
/// 23 bits of the sum, offset by 2^22.
const MAGIC: f32 = 12_582_912.0;

/// ggml's `nearest_int`: `x` rounded to the nearest integer, ties to even
/// (the addition rounds, not `f32::round`, which ties away from zero).
/// Outside |x| < 2^22 (where ggml only asserts in debug builds) the result
/// is the same wrapped value ggml computes, so huge or NaN inputs quantize
/// exactly as ggml's release build quantizes them.
#[inline(always)]
pub(super) fn nearest_int(x: f32) -> i32 {
    let sum = x + MAGIC;
    (sum.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// The f16 bits ggml's `GGML_FP32_TO_FP16` stores for `x` (nearest even;
/// overflow to infinity, NaN to a quiet NaN), and their exact f32 value,
/// which is what every later step of the block reads back.
#[inline(always)]
pub(super) fn to_f16(x: f32) -> (u16, f32) {
    let h = f32_to_f16::<false>(x.to_bits()).0;
    (h, f16_to_f32(h))
}
