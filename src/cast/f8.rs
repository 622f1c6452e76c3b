//! The two 8-bit float formats reshard reads and writes: decoding them
//! (upcasts) and the plain, scale-free encoding of `--quantize fp8` and
//! `fp8-e5m2` (issue 26).
//!
//! This module owns the bit layouts of F8_E4M3 (the "fn" variant: no
//! infinities, NaN is S.1111.111, largest finite 448) and F8_E5M2 (the top
//! byte of an IEEE f16, with infinities and NaNs). Decoding turns all 256
//! values into a lookup table of target bits; every F8 value is exactly
//! representable in f16, bf16, f32 and f64, so the upcasts never round.
//!
//! Encoding is torch's `x.clamp(-max, max).to(float8_*)`, bit for bit:
//! values beyond the largest finite value (448, or 57344), infinities
//! included, are clamped to it with their sign whatever the
//! [`super::OverflowPolicy`] (the clamp is the scheme's rule, never an
//! error) and counted as `overflow`; the rest round to nearest, ties to
//! even, subnormals included (a non-zero value that becomes zero counts as
//! `underflow`); -0.0 stays -0.0; NaN becomes S.1111.111 with its sign kept,
//! which is the code torch's conversion writes. bf16 and f16 widen exactly
//! to f32 first, as in torch; f64 is rounded to f32 first, as torch does
//! (so an f64 input rounds twice, like the reference).
//!
//! It does not handle F8_E8M0, the FNUZ variants, F4 or F6: those are
//! quantisation payloads and are written unchanged.

use super::kernels::{self, Flags};

/// F8_E4M3 bits -> f32 bits.
pub(super) fn e4m3_to_f32(b: u8) -> u32 {
    let sign = u32::from(b & 0x80) << 24;
    let exp = u32::from((b >> 3) & 0xf);
    let mant = u32::from(b & 0x7);
    let abs = match (exp, mant) {
        (0xf, 0x7) => 0x7fc0_0000,
        // Subnormal: mant * 2^-9, exact in f32.
        (0, _) => (mant as f32 * f32::from_bits((127 - 9) << 23)).to_bits(),
        // Rebias 7 -> 127 and move the 3 mantissa bits to the top of 23.
        _ => ((exp + 120) << 23) | (mant << 20),
    };
    sign | abs
}

/// F8_E5M2 bits -> f16 bits (E5M2 is f16 with the low 8 bits dropped).
pub(super) fn e5m2_to_f16(b: u8) -> u16 {
    u16::from(b) << 8
}

/// F8_E5M2 bits -> f32 bits.
pub(super) fn e5m2_to_f32(b: u8) -> u32 {
    kernels::f16_to_f32(e5m2_to_f16(b)).0
}

/// One F8 format's encoding constants, for [`encode`].
struct Format {
    /// f32 bits of the largest finite value.
    max: u32,
    /// f32 bits of the smallest normal value.
    min_normal: u32,
    /// f32 exponent bias minus the format's (shifted to the exponent field).
    rebias: u32,
    /// Mantissa bits f32 has beyond the format's.
    drop: u32,
    /// f32 bits of the power of two whose ulp is the format's subnormal step.
    magic: u32,
}

/// F8_E4M3 (fn): bias 7, 3 mantissa bits, max 448, subnormal step 2^-9.
const E4M3: Format = Format {
    max: 0x43e0_0000,
    min_normal: (127 - 6) << 23,
    rebias: (127 - 7) << 23,
    drop: 20,
    magic: (127 + 14) << 23,
};

/// F8_E5M2: bias 15, 2 mantissa bits, max 57344, subnormal step 2^-16.
const E5M2: Format = Format {
    max: 0x4760_0000,
    min_normal: (127 - 14) << 23,
    rebias: (127 - 15) << 23,
    drop: 21,
    magic: (127 + 7) << 23,
};

/// f32 bits -> F8 bits of `f`, clamped, rounded to nearest even; branchless
/// so [`kernels::drive`] vectorizes it.
#[inline(always)]
fn encode(f: &Format, x: u32) -> (u8, Flags) {
    let sign = (x >> 24) & 0x80;
    let abs = x & 0x7fff_ffff;
    let nan = abs > 0x7f80_0000;
    let clamped = !nan & (abs > f.max);
    let a = if clamped { f.max } else { abs };
    // Normal results: rebias the exponent and round the dropped bits to
    // nearest even. `a` <= max, so the carry never passes the largest
    // finite code.
    let half = (1 << (f.drop - 1)) - 1;
    let normal = a
        .wrapping_sub(f.rebias)
        .wrapping_add(half + ((a >> f.drop) & 1))
        >> f.drop;
    // Subnormal results: adding `magic` (whose ulp is the subnormal step)
    // rounds to a multiple of the step in hardware, ties to even; the low
    // bits of the sum are the code (the smallest normal's code when it
    // rounds up, which is also right).
    let m = f32::from_bits(f.magic);
    let sub = (f32::from_bits(a) + m).to_bits().wrapping_sub(f.magic);
    let r = if a < f.min_normal { sub } else { normal };
    let underflow = (abs != 0) & (r == 0) & !nan;
    let r = if nan { 0x7f } else { r };
    let flags = Flags {
        overflow: clamped,
        underflow,
        nan,
    };
    ((r | sign) as u8, flags)
}

/// f32 bits -> F8_E4M3 bits, as `clamp(-448, 448).to(float8_e4m3fn)`.
#[inline(always)]
pub(super) fn f32_to_e4m3(x: u32) -> (u8, Flags) {
    encode(&E4M3, x)
}

/// f32 bits -> F8_E5M2 bits, as `clamp(-57344, 57344).to(float8_e5m2)`.
#[inline(always)]
pub(super) fn f32_to_e5m2(x: u32) -> (u8, Flags) {
    encode(&E5M2, x)
}

/// f64 bits -> F8 bits through f32, as torch rounds it; the flags are the
/// f64 value's (a value just above the maximum that rounds to it in f32 is
/// still counted as clamped, one that rounds to zero in f32 as underflow).
#[inline(always)]
pub(super) fn f64_via_f32(x: u64, to_f8: impl Fn(u32) -> (u8, Flags), max: f64) -> (u8, Flags) {
    let v = f64::from_bits(x);
    let (r, flags) = to_f8((v as f32).to_bits());
    let abs = v.abs();
    let flags = Flags {
        overflow: abs > max,
        underflow: (abs != 0.0) & (r & 0x7f == 0),
        nan: flags.nan,
    };
    (r, flags)
}

/// The largest finite F8_E4M3 value.
pub(super) const E4M3_MAX: f64 = 448.0;
/// The largest finite F8_E5M2 value.
pub(super) const E5M2_MAX: f64 = 57344.0;

/// A 256-entry table from F8 bits to target bits, with a NaN flag per entry.
pub(super) struct Table<T> {
    bits: [T; 256],
    nan: [bool; 256],
}

impl<T: Copy + Default> Table<T> {
    /// Builds the table by decoding each byte to f32 and casting that
    /// (exactly) to the target with `to_target`.
    pub(super) fn new(decode: fn(u8) -> u32, to_target: impl Fn(u32) -> (T, Flags)) -> Self {
        let mut bits = [T::default(); 256];
        let mut nan = [false; 256];
        for b in 0..=255u8 {
            let f = decode(b);
            bits[usize::from(b)] = to_target(f).0;
            nan[usize::from(b)] = f32::from_bits(f).is_nan();
        }
        Table { bits, nan }
    }

    /// The kernel for [`kernels::drive`].
    #[inline(always)]
    pub(super) fn lookup(&self, b: u8) -> (T, Flags) {
        let i = usize::from(b);
        let flags = Flags {
            overflow: false,
            underflow: false,
            nan: self.nan[i],
        };
        (self.bits[i], flags)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn e4m3(v: f32) -> u8 {
        f32_to_e4m3(v.to_bits()).0
    }

    fn e5m2(v: f32) -> u8 {
        f32_to_e5m2(v.to_bits()).0
    }

    #[test]
    fn signed_zero_nan_and_infinity() {
        assert_eq!((e4m3(0.0), e4m3(-0.0)), (0x00, 0x80));
        assert_eq!((e5m2(0.0), e5m2(-0.0)), (0x00, 0x80));
        for (nan, code) in [(f32::NAN, 0x7f), (-f32::NAN, 0xff)] {
            let payload = f32::from_bits(nan.to_bits() | 0x1234);
            for v in [nan, payload] {
                let (b, flags) = f32_to_e4m3(v.to_bits());
                assert_eq!(b, code, "{:#x}", v.to_bits());
                assert!(flags.nan && !flags.overflow && !flags.underflow);
                assert_eq!(f32_to_e5m2(v.to_bits()).0, code);
            }
        }
        for (inf, e4, e5) in [(f32::INFINITY, 0x7e, 0x7b), (f32::NEG_INFINITY, 0xfe, 0xfb)] {
            let (b, flags) = f32_to_e4m3(inf.to_bits());
            assert_eq!(b, e4);
            assert!(flags.overflow && !flags.nan);
            assert_eq!(f32_to_e5m2(inf.to_bits()).0, e5);
        }
    }

    #[test]
    fn clamps_to_the_largest_finite_value() {
        for v in [448.0, 449.0, 464.0, 480.0, 1e30, f32::MAX] {
            assert_eq!(e4m3(v), 0x7e, "{v}");
            assert_eq!(e4m3(-v), 0xfe, "{v}");
            assert_eq!(f32_to_e4m3(v.to_bits()).1.overflow, v > 448.0);
        }
        for v in [57344.0, 61440.0, 65504.0, 1e30] {
            assert_eq!(e5m2(v), 0x7b, "{v}");
            assert_eq!(e5m2(-v), 0xfb, "{v}");
        }
        assert_eq!(e4m3(447.0), 0x7e, "rounds up to 448 without clamping");
        assert!(!f32_to_e4m3(447.0f32.to_bits()).1.overflow);
    }

    #[test]
    fn halfway_cases_round_to_even() {
        // E4M3 near 1: codes 0x38 (1.0), 0x39 (1.125), 0x3a (1.25).
        assert_eq!(e4m3(1.0625), 0x38);
        assert_eq!(e4m3(1.1875), 0x3a);
        assert_eq!(e4m3(f32::from_bits(1.0625f32.to_bits() + 1)), 0x39);
        assert_eq!(e4m3(f32::from_bits(1.1875f32.to_bits() - 1)), 0x39);
        // 240 = 0x77, 256 = 0x78: 248 is a tie going to even 0x78.
        assert_eq!(e4m3(248.0), 0x78);
        assert_eq!(e4m3(232.0), 0x76);
        // Subnormals, step 2^-9: half a step is a tie to zero, 1.5 to 2.
        let step = 2f32.powi(-9);
        assert_eq!(e4m3(step), 0x01);
        let (b, flags) = f32_to_e4m3((step / 2.0).to_bits());
        assert!(b == 0 && flags.underflow);
        assert_eq!(e4m3(-step / 2.0), 0x80, "underflow keeps the sign");
        assert_eq!(e4m3(1.5 * step), 0x02);
        assert_eq!(e4m3(2.5 * step), 0x02);
        assert_eq!(e4m3(7.5 * step), 0x08, "rounds up to the smallest normal");
        assert_eq!(e4m3(2f32.powi(-6)), 0x08);
        // E5M2: 1.125 is a tie between 1.0 (0x3c) and 1.25 (0x3d).
        assert_eq!(e5m2(1.125), 0x3c);
        assert_eq!(e5m2(1.375), 0x3e);
        assert_eq!(e5m2(2f32.powi(-16)), 0x01);
        assert_eq!(e5m2(2f32.powi(-17)), 0x00);
        assert_eq!(e5m2(3.0 * 2f32.powi(-17)), 0x02);
        assert_eq!(e5m2(2f32.powi(-14)), 0x04);
    }

    #[test]
    fn f64_rounds_through_f32_as_torch_does() {
        // Just above the 1.0 / 1.125 midpoint: f32 rounds it onto the tie,
        // which goes to even (torch gives 0x38 too).
        let x = 1.0 + 2f64.powi(-4) + 2f64.powi(-30);
        assert_eq!(f64_via_f32(x.to_bits(), f32_to_e4m3, E4M3_MAX).0, 0x38);
        let (b, flags) = f64_via_f32((448.0 + 1e-9f64).to_bits(), f32_to_e4m3, E4M3_MAX);
        assert!(b == 0x7e && flags.overflow);
        let (b, flags) = f64_via_f32(1e-60f64.to_bits(), f32_to_e5m2, E5M2_MAX);
        assert!(b == 0 && flags.underflow);
    }

    /// The nearest code by search, ties to the even code: an oracle that
    /// shares nothing with `encode` but the decoders.
    fn nearest(v: f32, decode: fn(u8) -> u32, max: f32) -> u8 {
        let c = v.clamp(-max, max);
        let mut best: Option<(f64, u8)> = None;
        for b in 0..=255u8 {
            let d = f32::from_bits(decode(b));
            if !d.is_finite() || d.is_sign_negative() != c.is_sign_negative() {
                continue;
            }
            let err = (f64::from(d) - f64::from(c)).abs();
            best = match best {
                Some((e, k)) if e < err || (e == err && k & 1 == 0) => Some((e, k)),
                _ => Some((err, b)),
            };
        }
        best.unwrap().1
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn encodes_to_the_nearest_code(bits in any::<u32>(), scale in -24i32..=18) {
            // Half random bit patterns, half values inside the fp8 ranges.
            let v = if bits & 1 == 0 {
                f32::from_bits(bits)
            } else {
                f32::from_bits((bits >> 9) | 0x3f80_0000) * 2f32.powi(scale)
                    * if bits & 2 == 0 { 1.0 } else { -1.0 }
            };
            prop_assume!(!v.is_nan());
            prop_assert_eq!(e4m3(v), nearest(v, e4m3_to_f32, 448.0), "{:e}", v);
            prop_assert_eq!(e5m2(v), nearest(v, e5m2_to_f32, 57344.0), "{:e}", v);
        }
    }

    #[test]
    fn e4m3_landmarks() {
        assert_eq!(f32::from_bits(e4m3_to_f32(0x7e)), 448.0);
        assert_eq!(f32::from_bits(e4m3_to_f32(0xfe)), -448.0);
        assert_eq!(f32::from_bits(e4m3_to_f32(0x01)), 2f32.powi(-9));
        assert_eq!(f32::from_bits(e4m3_to_f32(0x08)), 2f32.powi(-6));
        assert_eq!(f32::from_bits(e4m3_to_f32(0x38)), 1.0);
        assert!(f32::from_bits(e4m3_to_f32(0x7f)).is_nan());
        assert!(f32::from_bits(e4m3_to_f32(0xff)).is_nan());
        assert_eq!(e4m3_to_f32(0x80), 0x8000_0000);
    }

    #[test]
    fn e5m2_landmarks() {
        assert_eq!(f32::from_bits(e5m2_to_f32(0x7b)), 57344.0);
        assert_eq!(f32::from_bits(e5m2_to_f32(0x7c)), f32::INFINITY);
        assert_eq!(f32::from_bits(e5m2_to_f32(0xfc)), f32::NEG_INFINITY);
        assert!(f32::from_bits(e5m2_to_f32(0x7d)).is_nan());
        assert_eq!(f32::from_bits(e5m2_to_f32(0x01)), 2f32.powi(-16));
    }
}
