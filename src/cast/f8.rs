//! Decoding the two 8-bit float formats that reshard upcasts.
//!
//! This module owns the bit layouts of F8_E4M3 (the "fn" variant: no
//! infinities, NaN is S.1111.111, largest finite 448) and F8_E5M2 (the top
//! byte of an IEEE f16, with infinities and NaNs), and turns all 256 values
//! into a lookup table of target bits. Every F8 value is exactly
//! representable in f16, bf16, f32 and f64, so the upcasts never round.
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
    use super::*;

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
