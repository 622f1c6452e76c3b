//! FP8 codes times block, channel or tensor scales.
//!
//! The weight is walked in row-major order in runs that share one scale
//! (at most one block wide); each run goes through [`scaled_run`], which
//! decodes the F8 code through a 256-entry f32 table, multiplies by the
//! scale in f32 and rounds with the cast kernels.

use crate::cast::f8;
use crate::cast::kernels::{self as k, drive, Flags};
use crate::cast::policy::{CastStats, OverflowPolicy};
use crate::format::Dtype;

/// F8_E8M0 (UE8M0) bits -> f32: `2^(e - 127)`, 255 is NaN. Exponent 0 is
/// 2^-127, an f32 subnormal, exact.
pub fn e8m0_to_f32(e: u8) -> f32 {
    match e {
        255 => f32::NAN,
        0 => f32::from_bits(0x0040_0000),
        e => f32::from_bits(u32::from(e) << 23),
    }
}

/// Bytes per scale element, and its decoder from little-endian bytes.
pub(super) type ScaleDecoder = (usize, fn(&[u8]) -> f32);

/// The [`ScaleDecoder`] of a scale dtype.
pub(super) fn scale_decoder(d: Dtype) -> Option<ScaleDecoder> {
    fn f32le(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    fn bf16le(b: &[u8]) -> f32 {
        f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
    }
    fn f16le(b: &[u8]) -> f32 {
        f32::from_bits(k::f16_to_f32(u16::from_le_bytes([b[0], b[1]])).0)
    }
    fn e8m0(b: &[u8]) -> f32 {
        e8m0_to_f32(b[0])
    }
    Some(match d {
        Dtype::F32 => (4, f32le as fn(&[u8]) -> f32),
        Dtype::BF16 => (2, bf16le),
        Dtype::F16 => (2, f16le),
        Dtype::F8_E8M0 => (1, e8m0),
        _ => return None,
    })
}

/// The f32 value of every F8 code.
pub(super) fn code_table(d: Dtype) -> [f32; 256] {
    let decode = if d == Dtype::F8_E5M2 {
        f8::e5m2_to_f32
    } else {
        f8::e4m3_to_f32
    };
    let mut t = [0f32; 256];
    for (b, v) in (0..=255u8).zip(t.iter_mut()) {
        *v = f32::from_bits(decode(b));
    }
    t
}

/// `w * s` in f32, with a finite product too large for f32 counted as an
/// overflow (and clamped under saturation, so the target saturates too).
#[inline(always)]
pub(super) fn product<const SAT: bool>(w: f32, s: f32) -> (u32, bool) {
    let p = w * s;
    let overflow = p.is_infinite() & w.is_finite() & s.is_finite();
    let p = if SAT && overflow {
        f32::MAX.copysign(p)
    } else {
        p
    };
    (p.to_bits(), overflow)
}

#[inline(always)]
pub(super) fn with_overflow<T>((bits, mut f): (T, Flags), overflow: bool) -> (T, Flags) {
    f.overflow |= overflow;
    (bits, f)
}

/// Dequantizes one run of codes sharing scale `s` into `to`.
pub(super) fn scaled_run<const SAT: bool>(
    table: &[f32; 256],
    s: f32,
    to: Dtype,
    input: &[u8],
    out: &mut [u8],
) -> CastStats {
    let code = |b: u8| product::<SAT>(table[usize::from(b)], s);
    match to {
        Dtype::BF16 => drive(input, out, |b: u8| {
            let (p, o) = code(b);
            with_overflow(k::f32_to_bf16::<SAT>(p), o)
        }),
        Dtype::F16 => drive(input, out, |b: u8| {
            let (p, o) = code(b);
            with_overflow(k::f32_to_f16::<SAT>(p), o)
        }),
        Dtype::F64 => drive(input, out, |b: u8| {
            let (p, o) = code(b);
            with_overflow(k::f32_to_f64(p), o)
        }),
        _ => drive(input, out, |b: u8| {
            let (p, o) = code(b);
            with_overflow(k::same_f32(p), o)
        }),
    }
}

/// Dispatches [`scaled_run`] on the overflow policy.
pub(super) fn run(
    table: &[f32; 256],
    s: f32,
    to: Dtype,
    policy: OverflowPolicy,
    input: &[u8],
    out: &mut [u8],
) -> CastStats {
    match policy {
        OverflowPolicy::Saturate => scaled_run::<true>(table, s, to, input, out),
        OverflowPolicy::Error | OverflowPolicy::Inf => {
            scaled_run::<false>(table, s, to, input, out)
        }
    }
}
