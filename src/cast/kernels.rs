//! Element kernels for the float casts, and the loop that drives them.
//!
//! This module owns the bit-level arithmetic: one branchless function per
//! (source, target) pair that turns one element's bits into the target's
//! bits plus three flags (overflow, underflow, NaN input), and [`drive`], which
//! runs such a function over two little-endian byte slices of any alignment.
//! It does not choose kernels (that is `cast/mod.rs`) and knows nothing of
//! tensors or threads.
//!
//! Every narrowing kernel rounds to nearest, ties to even, keeps the sign of
//! zero, keeps infinities, turns NaN into a quiet NaN and handles subnormals
//! exactly, which is what torch's `Tensor.to` does. The kernels are written
//! with selects rather than branches so the compiler can vectorize the loop.

use super::CastStats;

/// What happened to one element.
#[derive(Clone, Copy)]
pub(super) struct Flags {
    /// A finite input became infinite (or was saturated).
    pub overflow: bool,
    /// A non-zero finite input became zero.
    pub underflow: bool,
    /// The input was NaN.
    pub nan: bool,
}

impl Flags {
    #[inline(always)]
    fn nan_only(nan: bool) -> Flags {
        Flags {
            overflow: false,
            underflow: false,
            nan,
        }
    }
}

/// An unsigned integer that holds one element's bits, stored little-endian.
pub(super) trait Lane: Copy {
    /// One element's bytes.
    type Bytes: Copy;
    /// `bytes` as whole elements, and what is left over.
    fn elems(bytes: &[u8]) -> (&[Self::Bytes], &[u8]);
    /// `bytes` as whole elements to write, and what is left over.
    fn elems_mut(bytes: &mut [u8]) -> (&mut [Self::Bytes], &mut [u8]);
    /// Reads one element.
    fn load(bytes: Self::Bytes) -> Self;
    /// One element's bytes.
    fn store(self) -> Self::Bytes;
}

macro_rules! lane {
    ($t:ty, $n:expr) => {
        impl Lane for $t {
            type Bytes = [u8; $n];
            #[inline(always)]
            fn elems(bytes: &[u8]) -> (&[[u8; $n]], &[u8]) {
                bytes.as_chunks::<$n>()
            }
            #[inline(always)]
            fn elems_mut(bytes: &mut [u8]) -> (&mut [[u8; $n]], &mut [u8]) {
                bytes.as_chunks_mut::<$n>()
            }
            #[inline(always)]
            fn load(bytes: [u8; $n]) -> Self {
                <$t>::from_le_bytes(bytes)
            }
            #[inline(always)]
            fn store(self) -> [u8; $n] {
                self.to_le_bytes()
            }
        }
    };
}
lane!(u8, 1);
lane!(u16, 2);
lane!(u32, 4);
lane!(u64, 8);

/// Elements per block; the per-block counters are u32 and cannot overflow.
const BLOCK: usize = 4096;

/// Runs `kernel` over every element of `input`, writing `output`.
///
/// The caller has checked that both slices hold the same number of elements
/// (bytes past the last whole element are left alone). The slices are seen
/// as arrays of element bytes (`as_chunks`), so each element is one plain
/// load and one plain store and the loop vectorizes at any alignment.
/// Counters are kept as u32 per block so the loop stays vectorizable.
#[inline(always)]
pub(super) fn drive<I: Lane, O: Lane>(
    input: &[u8],
    output: &mut [u8],
    kernel: impl Fn(I) -> (O, Flags),
) -> CastStats {
    let mut stats = CastStats::default();
    let (input, _) = I::elems(input);
    let (output, _) = O::elems_mut(output);
    for (ib, ob) in input.chunks(BLOCK).zip(output.chunks_mut(BLOCK)) {
        let mut counts = [0u32; 3];
        for (x, y) in ib.iter().zip(ob.iter_mut()) {
            let (bits, flags) = kernel(I::load(*x));
            *y = bits.store();
            count(&mut counts, flags);
        }
        stats.overflow += u64::from(counts[0]);
        stats.underflow += u64::from(counts[1]);
        stats.nan += u64::from(counts[2]);
    }
    stats
}

#[inline(always)]
fn count(counts: &mut [u32; 3], flags: Flags) {
    counts[0] += u32::from(flags.overflow);
    counts[1] += u32::from(flags.underflow);
    counts[2] += u32::from(flags.nan);
}

// ---------------------------------------------------------------- narrowing

/// f32 -> bf16. `SAT` turns overflow into the largest finite value.
#[inline(always)]
pub(super) fn f32_to_bf16<const SAT: bool>(x: u32) -> (u16, Flags) {
    let sign = (x >> 16) & 0x8000;
    let abs = x & 0x7fff_ffff;
    let nan = abs > 0x7f80_0000;
    let finite = abs < 0x7f80_0000;
    // Adding 0x7fff plus the lowest kept bit rounds to nearest even; a carry
    // out of the mantissa bumps the exponent, and out of the largest finite
    // value lands exactly on infinity. abs + 0x8000 cannot wrap.
    let mut r = (abs + 0x7fff + ((abs >> 16) & 1)) >> 16;
    let overflow = finite & (r == 0x7f80);
    let underflow = (abs != 0) & (r == 0);
    if SAT {
        r = if overflow { 0x7f7f } else { r };
    }
    r = if nan { 0x7fc0 } else { r };
    let flags = Flags {
        overflow,
        underflow,
        nan,
    };
    ((r | sign) as u16, flags)
}

/// f32 -> f16. `SAT` turns overflow into +-65504.
#[inline(always)]
pub(super) fn f32_to_f16<const SAT: bool>(x: u32) -> (u16, Flags) {
    let sign = (x >> 16) & 0x8000;
    let abs = x & 0x7fff_ffff;
    let nan = abs > 0x7f80_0000;
    let finite = abs < 0x7f80_0000;
    // Normal results (|x| >= 2^-14): rebias the exponent and round the 13
    // dropped bits to nearest even; a carry into exponent 31 gives infinity.
    let normal = abs
        .wrapping_sub(112 << 23)
        .wrapping_add(0xfff + ((abs >> 13) & 1))
        >> 13;
    // Subnormal results: adding 0.5 (ulp 2^-24, the f16 subnormal step)
    // rounds |x| to a multiple of 2^-24 in hardware, to nearest even; the low
    // bits of the sum are then the f16 bits (0x400 when it rounds up to the
    // smallest normal, which is also right).
    let half = f32::from_bits(126 << 23);
    let sub = (f32::from_bits(abs) + half)
        .to_bits()
        .wrapping_sub(126 << 23);
    let mut r = if abs < (113 << 23) { sub } else { normal };
    // |x| >= 65536 (and inf) would carry past the exponent: infinity.
    r = if abs >= (143 << 23) { 0x7c00 } else { r };
    let overflow = finite & (r == 0x7c00);
    let underflow = (abs != 0) & (r == 0);
    if SAT {
        r = if overflow { 0x7bff } else { r };
    }
    r = if nan { 0x7e00 } else { r };
    let flags = Flags {
        overflow,
        underflow,
        nan,
    };
    ((r | sign) as u16, flags)
}

/// f64 -> f32, by the hardware conversion (round to nearest even).
#[inline(always)]
pub(super) fn f64_to_f32<const SAT: bool>(x: u64) -> (u32, Flags) {
    let abs = x & 0x7fff_ffff_ffff_ffff;
    let nan = abs > 0x7ff0_0000_0000_0000;
    let finite = abs < 0x7ff0_0000_0000_0000;
    let mut r = (f64::from_bits(x) as f32).to_bits();
    let rabs = r & 0x7fff_ffff;
    let overflow = finite & (rabs == 0x7f80_0000);
    let underflow = (abs != 0) & (rabs == 0);
    if SAT {
        r = if overflow {
            (r & 0x8000_0000) | 0x7f7f_ffff
        } else {
            r
        };
    }
    let flags = Flags {
        overflow,
        underflow,
        nan,
    };
    (r, flags)
}

/// f64 -> f16 in one rounding (going through f32 would round twice).
#[inline(always)]
pub(super) fn f64_to_f16<const SAT: bool>(x: u64) -> (u16, Flags) {
    let sign = ((x >> 48) & 0x8000) as u32;
    let abs = x & 0x7fff_ffff_ffff_ffff;
    let nan = abs > 0x7ff0_0000_0000_0000;
    let finite = abs < 0x7ff0_0000_0000_0000;
    let normal = (abs
        .wrapping_sub(1008 << 52)
        .wrapping_add((1 << 41) - 1 + ((abs >> 42) & 1))
        >> 42) as u32;
    // 2^28 has an ulp of 2^-24, the f16 subnormal step.
    let magic = f64::from_bits((1023 + 28) << 52);
    let sub = (f64::from_bits(abs) + magic)
        .to_bits()
        .wrapping_sub(magic.to_bits()) as u32;
    let mut r = if abs < ((1023 - 14) << 52) {
        sub
    } else {
        normal
    };
    r = if abs >= ((1023 + 16) << 52) {
        0x7c00
    } else {
        r
    };
    let overflow = finite & (r == 0x7c00);
    let underflow = (abs != 0) & (r == 0);
    if SAT {
        r = if overflow { 0x7bff } else { r };
    }
    r = if nan { 0x7e00 } else { r };
    let flags = Flags {
        overflow,
        underflow,
        nan,
    };
    ((r | sign) as u16, flags)
}

/// f64 -> bf16 in one rounding.
#[inline(always)]
pub(super) fn f64_to_bf16<const SAT: bool>(x: u64) -> (u16, Flags) {
    let sign = ((x >> 48) & 0x8000) as u32;
    let abs = x & 0x7fff_ffff_ffff_ffff;
    let nan = abs > 0x7ff0_0000_0000_0000;
    let finite = abs < 0x7ff0_0000_0000_0000;
    let normal = (abs
        .wrapping_sub(896 << 52)
        .wrapping_add((1 << 44) - 1 + ((abs >> 45) & 1))
        >> 45) as u32;
    // 2^-81 has an ulp of 2^-133, the bf16 subnormal step.
    let magic = f64::from_bits((1023 - 81) << 52);
    let sub = (f64::from_bits(abs) + magic)
        .to_bits()
        .wrapping_sub(magic.to_bits()) as u32;
    let mut r = if abs < ((1023 - 126) << 52) {
        sub
    } else {
        normal
    };
    r = if abs >= ((1023 + 128) << 52) {
        0x7f80
    } else {
        r
    };
    let overflow = finite & (r == 0x7f80);
    let underflow = (abs != 0) & (r == 0);
    if SAT {
        r = if overflow { 0x7f7f } else { r };
    }
    r = if nan { 0x7fc0 } else { r };
    let flags = Flags {
        overflow,
        underflow,
        nan,
    };
    ((r | sign) as u16, flags)
}

// ---------------------------------------------------------------- widening

/// bf16 -> f32: exact, the bits move up (NaN made quiet).
#[inline(always)]
pub(super) fn bf16_to_f32(x: u16) -> (u32, Flags) {
    let nan = (x & 0x7fff) > 0x7f80;
    let r = (u32::from(x) << 16) | if nan { 0x0040_0000 } else { 0 };
    (r, Flags::nan_only(nan))
}

/// f16 -> f32: exact.
#[inline(always)]
pub(super) fn f16_to_f32(x: u16) -> (u32, Flags) {
    let h = u32::from(x);
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    let nan = em > 0x7c00;
    let normal = (em << 13) + (112 << 23);
    let special = (em << 13) | 0x7f80_0000 | if nan { 0x0040_0000 } else { 0 };
    // A subnormal is em * 2^-24; em < 1024 so the product is exact.
    let sub = (em as f32 * f32::from_bits(103 << 23)).to_bits();
    let mut r = if em < 0x400 { sub } else { normal };
    r = if em >= 0x7c00 { special } else { r };
    (r | sign, Flags::nan_only(nan))
}

/// f32 -> f64: exact.
#[inline(always)]
pub(super) fn f32_to_f64(x: u32) -> (u64, Flags) {
    let v = f32::from_bits(x);
    ((v as f64).to_bits(), Flags::nan_only(v.is_nan()))
}

/// Any -> the same dtype: a copy that counts NaN.
#[inline(always)]
pub(super) fn same_f16(x: u16) -> (u16, Flags) {
    (x, Flags::nan_only((x & 0x7fff) > 0x7c00))
}

/// bf16 -> bf16.
#[inline(always)]
pub(super) fn same_bf16(x: u16) -> (u16, Flags) {
    (x, Flags::nan_only((x & 0x7fff) > 0x7f80))
}

/// f32 -> f32.
#[inline(always)]
pub(super) fn same_f32(x: u32) -> (u32, Flags) {
    (x, Flags::nan_only((x & 0x7fff_ffff) > 0x7f80_0000))
}

/// f64 -> f64.
#[inline(always)]
pub(super) fn same_f64(x: u64) -> (u64, Flags) {
    (
        x,
        Flags::nan_only((x & 0x7fff_ffff_ffff_ffff) > 0x7ff0_0000_0000_0000),
    )
}

/// Applies `second` after `first`, keeping `first`'s NaN flag (both see the
/// same NaN) and `second`'s overflow and underflow (`first` is exact).
#[inline(always)]
pub(super) fn then<A, B, C>(
    first: impl Fn(A) -> (B, Flags),
    second: impl Fn(B) -> (C, Flags),
) -> impl Fn(A) -> (C, Flags) {
    move |x| {
        let (y, f1) = first(x);
        let (z, f2) = second(y);
        (
            z,
            Flags {
                overflow: f2.overflow,
                underflow: f2.underflow,
                nan: f1.nan,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_of(v: f32) -> u16 {
        f32_to_f16::<false>(v.to_bits()).0
    }

    #[test]
    fn f32_to_f16_edges() {
        assert_eq!(f16_of(65504.0), 0x7bff);
        assert_eq!(f16_of(65519.99), 0x7bff);
        assert_eq!(f16_of(65520.0), 0x7c00);
        assert_eq!(f16_of(-0.0), 0x8000);
        assert_eq!(f16_of(2f32.powi(-24)), 0x0001);
        assert_eq!(f16_of(2f32.powi(-25)), 0x0000, "tie goes to even zero");
        assert_eq!(f16_of(3.0 * 2f32.powi(-25)), 0x0002, "tie goes to even 2");
        assert_eq!(f16_of(f32::INFINITY), 0x7c00);
        assert_eq!(f16_of(f32::NEG_INFINITY), 0xfc00);
        let (bits, flags) = f32_to_f16::<true>(1e6f32.to_bits());
        assert_eq!(bits, 0x7bff);
        assert!(flags.overflow);
    }

    #[test]
    fn f64_to_f16_rounds_once() {
        // 1 + 2^-11 + 2^-40: rounding through f32 gives the tie 1 + 2^-11,
        // which goes to even (1.0); the true nearest is 1 + 2^-10.
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(f64_to_f16::<false>(x.to_bits()).0, 0x3c01);
    }

    #[test]
    fn f64_to_bf16_subnormal_and_overflow() {
        let min_sub = 2f64.powi(-133);
        assert_eq!(f64_to_bf16::<false>(min_sub.to_bits()).0, 0x0001);
        let (bits, flags) = f64_to_bf16::<false>(1e39f64.to_bits());
        assert_eq!(bits, 0x7f80);
        assert!(flags.overflow);
        let (bits, flags) = f64_to_bf16::<false>(1e-50f64.to_bits());
        assert_eq!(bits, 0);
        assert!(flags.underflow);
    }
}
