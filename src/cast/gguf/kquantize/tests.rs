//! The quantizers against reshard's own dequantizer (round trips within
//! the error a 4- or 6-bit code allows), the edge blocks, the length
//! checks and `nearest_int`. The bit-exact proof against libggml is the
//! oracle test (tests/cli/kquant.rs).

use super::round::nearest_int;
use super::*;
use crate::cast::gguf::dequantize_blocks;

/// Deterministic normal-ish values (xorshift, sum of four uniforms).
pub(super) fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed | 1;
    let mut uniform = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    (0..n)
        .map(|_| scale * (uniform() + uniform() + uniform() + uniform()) * 1.7)
        .collect()
}

fn q4(row: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; row.len() / QK_K * Q4_K_BYTES];
    quantize_q4_k(row, &mut out).unwrap();
    out
}

fn q6(row: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; row.len() / QK_K * Q6_K_BYTES];
    quantize_q6_k(row, &mut out).unwrap();
    out
}

fn round_trip(ty: GgmlType, row: &[f32]) -> Vec<f32> {
    let bytes = if ty == GgmlType::Q4_K {
        q4(row)
    } else {
        q6(row)
    };
    let mut back = vec![0f32; row.len()];
    dequantize_blocks(ty, &bytes, &mut back).unwrap();
    back
}

/// The largest error over each `sub`-value sub-block, relative to that
/// sub-block's spread (`max - min(min, 0)` for Q4_K's asymmetric codes,
/// `max |x|` for Q6_K's symmetric ones), and the RMS error relative to the
/// row's RMS.
fn errors(row: &[f32], back: &[f32], sub: usize, symmetric: bool) -> (f32, f32) {
    let mut worst = 0f32;
    for (x, y) in row.chunks(sub).zip(back.chunks(sub)) {
        let max = x.iter().copied().fold(f32::MIN, f32::max);
        let min = x.iter().copied().fold(f32::MAX, f32::min).min(0.0);
        let spread = if symmetric {
            x.iter().fold(0f32, |a, v| a.max(v.abs()))
        } else {
            max - min
        };
        let err = x.iter().zip(y).fold(0f32, |a, (p, q)| a.max((p - q).abs()));
        if spread > 0.0 {
            worst = worst.max(err / spread);
        }
    }
    let sq = |v: &mut dyn Iterator<Item = f32>| {
        (v.map(|e| e * e).sum::<f32>() / row.len() as f32).sqrt()
    };
    let rms_err = sq(&mut row.iter().zip(back).map(|(p, q)| p - q));
    let rms = sq(&mut row.iter().copied());
    (worst, rms_err / rms)
}

#[test]
fn q4_k_round_trip_is_within_a_code_step() {
    for (seed, scale) in [(1, 1.0), (2, 0.1), (3, 300.0), (4, 1e4)] {
        let row = values(16 * QK_K, seed, scale);
        let back = round_trip(GgmlType::Q4_K, &row);
        let (worst, rel_rms) = errors(&row, &back, 32, false);
        // 15 steps span a sub-block; the 6-bit scale and min and the f16
        // super-scales can shift the grid, but never by a whole range.
        assert!(worst < 0.12, "seed {seed}: worst {worst}");
        assert!(rel_rms < 0.1, "seed {seed}: rms {rel_rms}");
    }
}

#[test]
fn q6_k_round_trip_is_within_a_code_step() {
    for (seed, scale) in [(5, 1.0), (6, 0.1), (7, 300.0), (8, 1e4)] {
        let row = values(16 * QK_K, seed, scale);
        let back = round_trip(GgmlType::Q6_K, &row);
        let (worst, rel_rms) = errors(&row, &back, 16, true);
        // 32 steps from 0 to the largest magnitude: half a step is 1/64.
        assert!(worst < 0.03, "seed {seed}: worst {worst}");
        assert!(rel_rms < 0.02, "seed {seed}: rms {rel_rms}");
    }
}

#[test]
fn outliers_cost_their_block_precision_but_never_its_range() {
    let mut row = values(4 * QK_K, 9, 0.05);
    row[3] = 40.0; // one outlier in sub-block 0 of block 0
    row[700] = -25.0; // and one in block 2
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        let sub = if ty == GgmlType::Q4_K { 32 } else { 16 };
        let back = round_trip(ty, &row);
        let (worst, _) = errors(&row, &back, sub, ty == GgmlType::Q6_K);
        // The sub-block scales are quantized relative to the outlier's
        // (6 bits for Q4_K, int8 for Q6_K): a quiet sub-block of the same
        // block, 800x smaller, gets scale 0 and comes back as its min (Q4_K)
        // or 0 (Q6_K), as in ggml: off by about its spread, never more.
        assert!(worst < 1.05, "{ty}: worst {worst}");
        assert!((back[3] - 40.0).abs() < 40.0 / 15.0, "{ty}: {}", back[3]);
        assert!(
            (back[700] + 25.0).abs() < 25.0 / 15.0,
            "{ty}: {}",
            back[700]
        );
        // The block without an outlier keeps its precision.
        let (quiet, _) = errors(
            &row[QK_K..2 * QK_K],
            &back[QK_K..2 * QK_K],
            sub,
            ty == GgmlType::Q6_K,
        );
        assert!(quiet < 0.12, "{ty}: quiet block {quiet}");
    }
}

#[test]
fn all_zero_blocks_are_all_zero_bytes() {
    let row = vec![0f32; 2 * QK_K];
    assert!(q4(&row).iter().all(|&b| b == 0));
    assert!(q6(&row).iter().all(|&b| b == 0));
    let neg = vec![-0f32; QK_K];
    assert!(q6(&neg).iter().all(|&b| b == 0));
}

#[test]
fn constant_blocks_come_back_within_f16_and_code_precision() {
    for c in [3.0f32, -2.0, 0.05, -700.0] {
        let row = vec![c; QK_K];
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let back = round_trip(ty, &row);
            for &y in &back {
                // f16's 11 bits times a 6-bit code: a few parts per thousand.
                assert!((y - c).abs() <= c.abs() * 5e-3, "{ty} {c}: {y}");
            }
        }
    }
}

#[test]
fn negative_only_blocks_use_the_min() {
    let row: Vec<f32> = values(QK_K, 10, 1.0)
        .iter()
        .map(|v| -v.abs() - 1.0)
        .collect();
    let back = round_trip(GgmlType::Q4_K, &row);
    let (worst, _) = errors(&row, &back, 32, false);
    assert!(worst < 0.12, "worst {worst}");
    assert!(back.iter().all(|&y| y < 0.0));
    let back = round_trip(GgmlType::Q6_K, &row);
    let (worst, _) = errors(&row, &back, 16, true);
    assert!(worst < 0.03, "worst {worst}");
}

#[test]
fn small_scales_lose_precision_to_f16_subnormals_as_in_ggml() {
    // At 1e-3 the super-scale d (about amax / 500 for Q4_K, amax / 4000
    // for Q6_K) is an f16 subnormal: fewer significant bits, a coarser
    // grid, yet still well under one code step of the sub-block's range.
    let row = values(8 * QK_K, 13, 1e-3);
    let (worst4, _) = errors(&row, &round_trip(GgmlType::Q4_K, &row), 32, false);
    let (worst6, _) = errors(&row, &round_trip(GgmlType::Q6_K, &row), 16, true);
    assert!(
        worst4 < 1.0 / 15.0 && worst6 < 1.0 / 16.0,
        "{worst4} {worst6}"
    );
}

#[test]
fn tiny_and_subnormal_blocks_flush_to_zero() {
    for v in [
        1e-30f32,
        f32::from_bits(1),
        f32::from_bits(0x007f_ffff),
        -1e-38,
    ] {
        let row: Vec<f32> = (0..QK_K).map(|i| if i % 3 == 0 { v } else { -v }).collect();
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let back = round_trip(ty, &row);
            // The f16 super-scale underflows: every value comes back 0.
            assert!(back.iter().all(|&y| y == 0.0), "{ty} {v:e}");
        }
    }
    // Q6_K's all-zero shortcut: under ggml's 1e-15 every byte is 0.
    assert!(q6(&vec![1e-16f32; QK_K]).iter().all(|&b| b == 0));
}

#[test]
fn huge_blocks_saturate_without_panicking() {
    // x * x overflows f32, so ggml's search sees infinities and NaNs and
    // stores an infinite or NaN f16 scale; the oracle test checks that we
    // write the same bytes. Here: no panic, and the same bytes twice.
    let row: Vec<f32> = values(QK_K, 11, 1e30);
    assert_eq!(q4(&row), q4(&row));
    assert_eq!(q6(&row), q6(&row));
    // Large but f16-representable scales still round trip.
    let row = values(QK_K, 12, 1e5);
    let back = round_trip(GgmlType::Q6_K, &row);
    assert!(errors(&row, &back, 16, true).0 < 0.03);
}

#[test]
fn lengths_are_checked() {
    let mut out = vec![0u8; Q4_K_BYTES];
    assert_eq!(
        quantize_q4_k(&[0.0; 100], &mut out),
        Err(KQuantError::PartialBlock {
            ty: GgmlType::Q4_K,
            values: 100
        })
    );
    let err = quantize_q6_k(&[0.0; 512], &mut out).unwrap_err();
    assert_eq!(
        err.to_string(),
        "512 values make 420 bytes of Q6_K, but the output has 144"
    );
    assert!(quantize_q4_k(&[0.0; 256], &mut out[..143]).is_err());
    assert_eq!(quantize_q4_k(&[], &mut []), Ok(()));
}

#[test]
fn nearest_int_rounds_ties_to_even_unlike_round() {
    assert_eq!(nearest_int(2.5), 2);
    assert_eq!(nearest_int(3.5), 4);
    assert_eq!(nearest_int(-2.5), -2);
    assert_eq!(nearest_int(-0.49), 0);
    for i in -70_000..70_000 {
        let x = i as f32 / 7.0;
        assert_eq!(nearest_int(x), x.round_ties_even() as i32, "{x}");
    }
    // Past 2^22 ggml's trick wraps (it only asserts in debug builds).
    assert_eq!(nearest_int(4_194_304.0), -4_194_304);
}
