//! Exhaustive scalar checks against values derived here from the format
//! definitions (not from the decoders under test), and the block walk on
//! shapes that are not block multiples.

use super::fp8::{code_table, run};
use super::mxfp4::power_of_two;
use super::*;
use crate::cast::OverflowPolicy;
use crate::format::Dtype;

/// sign * 2^exp * (1 + mant / 2^mbits), or the subnormal, from first principles.
fn reference_minifloat(b: u8, ebits: u32, mbits: u32, bias: i32) -> f64 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((b >> mbits) & ((1 << ebits) - 1) as u8);
    let m = f64::from(b & ((1 << mbits) - 1) as u8);
    let scale = f64::from(1u32 << mbits);
    if e == 0 {
        sign * (m / scale) * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + m / scale) * 2f64.powi(e - bias)
    }
}

#[test]
fn all_256_e4m3_codes() {
    let t = code_table(Dtype::F8_E4M3);
    for b in 0..=255u8 {
        let got = t[usize::from(b)];
        if b & 0x7f == 0x7f {
            assert!(got.is_nan(), "{b:#04x}");
        } else {
            assert_eq!(f64::from(got), reference_minifloat(b, 4, 3, 7), "{b:#04x}");
            assert_eq!(got.is_sign_negative(), b & 0x80 != 0, "{b:#04x}");
        }
    }
    assert_eq!(t[0x7e], 448.0);
}

#[test]
fn all_256_e5m2_codes() {
    let t = code_table(Dtype::F8_E5M2);
    for b in 0..=255u8 {
        let got = t[usize::from(b)];
        match b & 0x7f {
            0x7c => assert_eq!(got.abs(), f32::INFINITY, "{b:#04x}"),
            0x7d..=0x7f => assert!(got.is_nan(), "{b:#04x}"),
            _ => assert_eq!(f64::from(got), reference_minifloat(b, 5, 2, 15), "{b:#04x}"),
        }
    }
    assert_eq!(t[0x7b], 57344.0);
}

#[test]
fn all_16_e2m1_codes() {
    for c in 0..16u8 {
        // E2M1 is S.EE.M, bias 1: the same formula on the code moved to the
        // top of a byte (sign at bit 7, exponent and mantissa under it).
        let want = reference_minifloat(((c & 8) << 4) | (c & 7), 2, 1, 1);
        assert_eq!(f64::from(E2M1_VALUES[usize::from(c)]), want, "code {c}");
        assert_eq!(E2M1_VALUES[usize::from(c)].is_sign_negative(), c >= 8);
    }
}

#[test]
fn all_256_e8m0_exponents() {
    for e in 0..=255u8 {
        let got = e8m0_to_f32(e);
        let want = 2f64.powi(i32::from(e) - 127);
        // MXFP4 scales: 2^(e - 127) for all 256, as torch.ldexp.
        assert_eq!(power_of_two(e), want, "exponent {e}");
        if e == 255 {
            assert!(got.is_nan(), "F8_E8M0 255 is NaN");
        } else {
            assert_eq!(f64::from(got), want, "exponent {e}");
        }
    }
}

/// round-to-nearest-even of an f64 (exact here: products of an f8 and an
/// f32 power of two or small scale) to bf16 bits, independent of the kernels.
fn bf16_of(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return 0x7fc0 | ((bits >> 16) as u16 & 0x8000);
    }
    let lower = bits & 0xffff;
    let mut upper = bits >> 16;
    if lower > 0x8000 || (lower == 0x8000 && upper & 1 == 1) {
        upper += 1;
    }
    upper as u16
}

#[test]
fn a_run_multiplies_in_f32_and_rounds_to_nearest_even() {
    let table = code_table(Dtype::F8_E4M3);
    let codes: Vec<u8> = (0..=255u8).collect();
    for s in [1.0f32, 0.013_671_875, 3.3e-5, 1.7e37, 7.1] {
        let mut out = vec![0u8; 512];
        let stats = run(
            &table,
            s,
            Dtype::BF16,
            OverflowPolicy::Inf,
            &codes,
            &mut out,
        );
        for (b, o) in codes.iter().zip(out.chunks_exact(2)) {
            let want = bf16_of(table[usize::from(*b)] * s);
            let got = u16::from_le_bytes([o[0], o[1]]);
            assert_eq!(got, want, "code {b:#04x} scale {s}");
        }
        assert_eq!(stats.nan, 2);
        if s == 1.7e37 {
            assert!(stats.overflow > 0, "448 * 1.7e37 is past f32");
        }
    }
}

#[test]
fn saturation_clamps_products_past_f32() {
    let table = code_table(Dtype::F8_E4M3);
    let mut out = [0u8; 2];
    let stats = run(
        &table,
        1e38,
        Dtype::BF16,
        OverflowPolicy::Saturate,
        &[0x7e],
        &mut out,
    );
    assert_eq!(u16::from_le_bytes(out), 0x7f7f);
    assert_eq!(stats.overflow, 1);
}

#[test]
fn scale_dtypes_decode_exactly() {
    let (n, d) = fp8::scale_decoder(Dtype::BF16).unwrap();
    assert_eq!((n, d(&[0x80, 0x3f])), (2, 1.0));
    let (n, d) = fp8::scale_decoder(Dtype::F8_E8M0).unwrap();
    assert_eq!((n, d(&[126])), (1, 0.5));
    let (_, d) = fp8::scale_decoder(Dtype::F16).unwrap();
    assert_eq!(d(&[0x00, 0x3c]), 1.0);
    assert!(fp8::scale_decoder(Dtype::I32).is_none());
}
