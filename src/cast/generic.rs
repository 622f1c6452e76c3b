//! The scalar cast of any supported pair, element by element: the
//! reference every vectorized kernel ([`super::simd`], [`super::kernels`])
//! is checked against and falls back to.

use super::f8;
use super::kernels::{self, drive, then};
use super::policy::CastStats;
use crate::format::Dtype;

/// Bytes per element of a dtype [`cast_slice`] handles (all whole bytes).
pub(super) fn elem_size(d: Dtype) -> usize {
    (d.bits() / 8).max(1) as usize
}

/// The kernel table. `SAT` selects saturation; the caller checked the pair.
/// Inlined into each of `simd`'s builds (baseline and AVX2).
#[inline(always)]
pub(super) fn cast_generic<const SAT: bool>(
    from: Dtype,
    to: Dtype,
    i: &[u8],
    o: &mut [u8],
) -> CastStats {
    use kernels as k;
    use Dtype::*;
    match (from, to) {
        (F32, BF16) => drive(i, o, k::f32_to_bf16::<SAT>),
        (F32, F16) => drive(i, o, k::f32_to_f16::<SAT>),
        (F32, F64) => drive(i, o, k::f32_to_f64),
        (F64, F32) => drive(i, o, k::f64_to_f32::<SAT>),
        (F64, F16) => drive(i, o, k::f64_to_f16::<SAT>),
        (F64, BF16) => drive(i, o, k::f64_to_bf16::<SAT>),
        (F16, F32) => drive(i, o, k::f16_to_f32),
        (F16, F64) => drive(i, o, then(k::f16_to_f32, k::f32_to_f64)),
        (F16, BF16) => drive(i, o, then(k::f16_to_f32, k::f32_to_bf16::<SAT>)),
        (BF16, F32) => drive(i, o, k::bf16_to_f32),
        (BF16, F64) => drive(i, o, then(k::bf16_to_f32, k::f32_to_f64)),
        (BF16, F16) => drive(i, o, then(k::bf16_to_f32, k::f32_to_f16::<SAT>)),
        (F16, F16) => drive(i, o, k::same_f16),
        (BF16, BF16) => drive(i, o, k::same_bf16),
        (F32, F32) => drive(i, o, k::same_f32),
        (F64, F64) => drive(i, o, k::same_f64),
        (F8_E4M3 | F8_E5M2, _) => cast_f8(from, to, i, o),
        (_, F8_E4M3 | F8_E5M2) => encode_f8(from, to, i, o),
        _ => unreachable!("cast_slice checked the pair {from} -> {to}"),
    }
}

/// F8 targets (`--quantize fp8`): 16-bit sources widen exactly to f32,
/// f64 rounds to f32 as torch does, then [`f8`] encodes with its clamp.
#[inline(always)]
pub(super) fn encode_f8(from: Dtype, to: Dtype, i: &[u8], o: &mut [u8]) -> CastStats {
    use kernels as k;
    use Dtype::*;
    match (from, to) {
        (F32, F8_E4M3) => drive(i, o, f8::f32_to_e4m3),
        (F32, _) => drive(i, o, f8::f32_to_e5m2),
        (BF16, F8_E4M3) => drive(i, o, then(k::bf16_to_f32, f8::f32_to_e4m3)),
        (BF16, _) => drive(i, o, then(k::bf16_to_f32, f8::f32_to_e5m2)),
        (F16, F8_E4M3) => drive(i, o, then(k::f16_to_f32, f8::f32_to_e4m3)),
        (F16, _) => drive(i, o, then(k::f16_to_f32, f8::f32_to_e5m2)),
        (_, F8_E4M3) => drive(i, o, |x: u64| {
            f8::f64_via_f32(x, f8::f32_to_e4m3, f8::E4M3_MAX)
        }),
        _ => drive(i, o, |x: u64| {
            f8::f64_via_f32(x, f8::f32_to_e5m2, f8::E5M2_MAX)
        }),
    }
}

/// F8 sources: decode through a 256-entry table of target bits (exact).
#[inline(always)]
pub(super) fn cast_f8(from: Dtype, to: Dtype, i: &[u8], o: &mut [u8]) -> CastStats {
    use kernels as k;
    let decode = if from == Dtype::F8_E4M3 {
        f8::e4m3_to_f32
    } else {
        f8::e5m2_to_f32
    };
    match to {
        Dtype::F32 => {
            let t = f8::Table::new(decode, k::same_f32);
            drive(i, o, |b: u8| t.lookup(b))
        }
        Dtype::F64 => {
            let t = f8::Table::new(decode, k::f32_to_f64);
            drive(i, o, |b: u8| t.lookup(b))
        }
        Dtype::F16 => {
            let t = f8::Table::new(decode, k::f32_to_f16::<false>);
            drive(i, o, |b: u8| t.lookup(b))
        }
        _ => {
            let t = f8::Table::new(decode, k::f32_to_bf16::<false>);
            drive(i, o, |b: u8| t.lookup(b))
        }
    }
}
