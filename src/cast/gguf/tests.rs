//! Hand-built blocks with values worked out on paper, and the f16 widening
//! against the `half` crate. The bit-exact proof against gguf-py is the
//! fixture test (tests/cli/gguf.rs).

use super::*;
use crate::format::gguf::ggml::GgmlType;

fn dq(ty: GgmlType, b: &[u8]) -> Vec<f32> {
    let n = (b.len() as u64 / ty.layout().unwrap().bytes * ty.layout().unwrap().block) as usize;
    let mut out = vec![0f32; n];
    dequantize_blocks(ty, b, &mut out).unwrap();
    out
}

#[test]
fn f16_widening_is_exact_and_keeps_nan_payloads() {
    for h in 0..=u16::MAX {
        let ours = f16_to_f32(h);
        let theirs = half::f16::from_bits(h).to_f32();
        if theirs.is_nan() {
            assert!(ours.is_nan());
            assert_eq!(
                ours.to_bits() & 0x007f_e000,
                u32::from(h & 0x3ff) << 13,
                "{h:#x}"
            );
        } else {
            assert_eq!(ours.to_bits(), theirs.to_bits(), "{h:#x}");
        }
    }
}

#[test]
fn legacy_blocks_decode_as_worked_out() {
    // Q4_0, d = 2.0 (0x4000): low nibbles 0..16 -> (q - 8) * 2.
    let mut b = vec![0x00, 0x40];
    b.extend((0..16u8).map(|i| i | (15 - i) << 4));
    let v = dq(GgmlType::Q4_0, &b);
    assert_eq!((v[0], v[15], v[16], v[31]), (-16.0, 14.0, 14.0, -16.0));
    // Q4_1: d = 1, m = -0.5.
    let mut b = vec![0x00, 0x3c, 0x00, 0xb8];
    b.extend([0x21u8; 16]);
    let v = dq(GgmlType::Q4_1, &b);
    assert_eq!((v[0], v[16]), (0.5, 1.5));
    // Q5_0: the fifth bit of element 3 set: (3 | 16) - 16 = 3; others -13.
    let mut b = vec![0x00, 0x3c];
    b.extend(8u32.to_le_bytes());
    b.extend([0x33u8; 16]);
    let v = dq(GgmlType::Q5_0, &b);
    assert_eq!((v[3], v[4]), (3.0, -13.0));
    // Q5_1 with m = 1: element 31's fifth bit: 16 + 3 + 1.
    let mut b = vec![0x00, 0x3c, 0x00, 0x3c];
    b.extend((1u32 << 31).to_le_bytes());
    b.extend([0x33u8; 16]);
    let v = dq(GgmlType::Q5_1, &b);
    assert_eq!((v[30], v[31]), (4.0, 20.0));
    // MXFP4: e = 128 -> half scale 1.0 (2^1 / 2); code 7 = 6.0 doubled = 12; code 9 = -0.5 doubled.
    let mut b = vec![128u8];
    b.extend([0x97u8; 16]);
    let v = dq(GgmlType::MXFP4, &b);
    assert_eq!((v[0], v[16]), (12.0, -1.0));
    // e = 255 and code 7 overflow f32 as numpy does.
    let mut b = vec![255u8];
    b.extend([0x07u8; 16]);
    assert_eq!(dq(GgmlType::MXFP4, &b)[0], f32::INFINITY);
    assert_eq!(legacy::e8m0_half(0).to_bits(), 0x0020_0000);
    assert_eq!(dq(GgmlType::BF16, &[0x80, 0x3f]), [1.0]);
    assert_eq!(dq(GgmlType::F32, &1.5f32.to_le_bytes()), [1.5]);
}

#[test]
fn k_quant_blocks_decode_as_worked_out() {
    // Q6_K, d = 1, scale of group 0 = -2, codes 0: (0 - 32) * -2 = 64.
    let mut b = vec![0u8; 210];
    b[192] = (-2i8) as u8;
    b[208..210].copy_from_slice(&[0x00, 0x3c]);
    let v = dq(GgmlType::Q6_K, &b);
    assert_eq!((v[0], v[16]), (64.0, -0.0));
    // Q4_K, d = 1, dmin = 1, sub-block 5's scale 3 and min 2 (high part).
    let mut b = vec![0u8; 144];
    b[0..4].copy_from_slice(&[0x00, 0x3c, 0x00, 0x3c]);
    b[4 + 9] = 0x23; // byte 9 of scales: sc[5] low = 3, m[5] low = 2
    b[16 + 64 + 1] = 0xf0; // element 161: chunk 2, high nibble, l 1 = 15
    let v = dq(GgmlType::Q4_K, &b);
    assert_eq!((v[160], v[161]), (-2.0, 43.0));
    // Q3_K: hmask bit set means no -4 offset; all scales 0 -> -32.
    let mut b = vec![0u8; 110];
    b[0] = 1; // element 0: hbit 1
    b[32] = 3; // element 0: low bits 3
    b[108..110].copy_from_slice(&[0x00, 0x3c]);
    let v = dq(GgmlType::Q3_K, &b);
    assert_eq!((v[0], v[1]), (-96.0, 128.0));
    // Q2_K: scale byte 0x21 for group 0: dl = 1, ml = 2; code 3 at element 32.
    let mut b = vec![0u8; 84];
    b[0] = 0x21;
    b[2] = 0x21;
    b[16] = 3 << 2; // element 32: half 0, run 1, l 0
    b[80..84].copy_from_slice(&[0x00, 0x3c, 0x00, 0x3c]);
    let v = dq(GgmlType::Q2_K, &b);
    assert_eq!((v[0], v[32]), (-2.0, 1.0));
    // Q5_K: the fifth bit of element 64 (bit 2 of qh[0]).
    let mut b = vec![0u8; 176];
    b[0..2].copy_from_slice(&[0x00, 0x3c]);
    b[4 + 2] = 1; // sc[2] = 1
    b[16] = 4;
    let v = dq(GgmlType::Q5_K, &b);
    assert_eq!((v[64], v[65]), (16.0, 0.0));
}

#[test]
fn wrong_lengths_and_types_are_errors() {
    let mut out = [0f32; 32];
    assert!(matches!(
        dequantize_blocks(GgmlType::Q8_0, &[0; 33], &mut out),
        Err(DequantError::PartialBlock { .. })
    ));
    assert!(matches!(
        dequantize_blocks(GgmlType::Q8_0, &[0; 68], &mut out),
        Err(DequantError::OutputLength { .. })
    ));
    assert!(matches!(
        dequantize_blocks(GgmlType(16), &[0; 66], &mut out),
        Err(DequantError::Unsupported { .. })
    ));
    assert!(!supports(GgmlType(99)) && supports(GgmlType::Q6_K));
}

/// llama.cpp's `LlamaModel.permute` as numpy runs it:
/// `w.reshape(heads, 2, d // 2, ...).swapaxes(1, 2).reshape(w.shape)`;
/// returns, for each stored row, the Hugging Face row it holds.
fn llama_permute(rows: u64, heads: u64) -> Vec<u64> {
    let d = rows / heads;
    let mut stored = vec![0; rows as usize];
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..d / 2 {
                // Element [h, j, i] of the reshape moves to [h, i, j].
                stored[(h * d + i * 2 + j) as usize] = h * d + j * (d / 2) + i;
            }
        }
    }
    stored
}

#[test]
fn unpermuting_undoes_llama_cpps_permute() {
    use super::unpermuted_row;
    for (rows, heads) in [(8, 1), (8, 2), (12, 3), (64, 4), (128, 8)] {
        let stored = llama_permute(rows, heads);
        let d = rows / heads;
        for hf_row in 0..rows {
            let (h, r) = (hf_row / d, hf_row % d);
            let from = h * d + unpermuted_row(r, d);
            assert_eq!(stored[from as usize], hf_row, "{rows} rows, {heads} heads");
        }
    }
    // Two heads of four rows, by hand: HF rows 0 1 | 2 3 are stored 0 2 1 3.
    assert_eq!(llama_permute(8, 2), [0, 2, 1, 3, 4, 6, 5, 7]);
}
