//! The dense types (F32, F16, BF16), the 32-element legacy quants (Q4_0,
//! Q4_1, Q5_0, Q5_1, Q8_0) and MXFP4, one block at a time, each written as
//! gguf-py's `dequantize_blocks` evaluates it.
//!
//! In a 32-element block with 16 bytes of nibbles, element `j < 16` is the
//! low nibble of byte `j` and element `j + 16` its high nibble; Q5's fifth
//! bit of element `j` is bit `j` of the little-endian `u32` `qh`.

use super::f16::{f16_at, f16_to_f32};

pub(super) fn f32s(b: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

/// Every f16 widened, built once (256 KiB): a lookup beats the branches.
fn f16_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(f16_to_f32).collect())
}

pub(super) fn f16s(b: &[u8], out: &mut [f32]) {
    let table = f16_table();
    for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
        *o = table[usize::from(u16::from_le_bytes([c[0], c[1]]))];
    }
}

/// `(int16 as int32) << 16`, reinterpreted: exact.
pub(super) fn bf16s(b: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
        *o = f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16);
    }
}

/// The 4-bit code of element `j` of a 16-byte nibble array.
#[inline(always)]
fn nibble(qs: &[u8], j: usize) -> u8 {
    (qs[j % 16] >> (4 * (j / 16))) & 0x0f
}

/// `d * (q - 8)`.
pub(super) fn q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(&b[0..2]);
    let qs = &b[2..18];
    for (j, o) in out.iter_mut().enumerate() {
        let q = nibble(qs, j) as i8 - 8;
        *o = d * f32::from(q);
    }
}

/// `d * q + m`.
pub(super) fn q4_1(b: &[u8], out: &mut [f32]) {
    let d = f16_at(&b[0..2]);
    let m = f16_at(&b[2..4]);
    let qs = &b[4..20];
    for (j, o) in out.iter_mut().enumerate() {
        *o = d * f32::from(nibble(qs, j)) + m;
    }
}

/// `d * (q - 16)`, five bits a code.
pub(super) fn q5_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(&b[0..2]);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for (j, o) in out.iter_mut().enumerate() {
        let q = (nibble(qs, j) | ((((qh >> j) & 1) as u8) << 4)) as i8 - 16;
        *o = d * f32::from(q);
    }
}

/// `d * q + m`, five bits a code.
pub(super) fn q5_1(b: &[u8], out: &mut [f32]) {
    let d = f16_at(&b[0..2]);
    let m = f16_at(&b[2..4]);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for (j, o) in out.iter_mut().enumerate() {
        let q = nibble(qs, j) | ((((qh >> j) & 1) as u8) << 4);
        *o = d * f32::from(q) + m;
    }
}

/// `q * d`, int8 codes.
pub(super) fn q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(&b[0..2]);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = f32::from(q as i8) * d;
    }
}

/// [`q8_0`] over whole blocks, each value written as its little-endian
/// f32 bytes: the same values, without a pass through an `f32` slice (the
/// cast kernels read bytes). `out` holds 128 bytes a block.
pub(super) fn q8_0_le_bytes(src: &[u8], out: &mut [u8]) {
    for (b, o) in src.chunks_exact(34).zip(out.chunks_exact_mut(128)) {
        let d = f16_at(&b[0..2]);
        for (o, &q) in o.chunks_exact_mut(4).zip(&b[2..34]) {
            o.copy_from_slice(&(f32::from(q as i8) * d).to_le_bytes());
        }
    }
}

/// E2M1 values doubled, as gguf-py's `MXFP4.kvalues`.
const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half of `2^(e - 127)`, as ggml's `ggml_e8m0_to_fp32_half`: exact, a
/// subnormal for `e < 2`.
pub(super) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// `d * kvalue`: one E8M0 scale byte then 16 bytes of E2M1 nibbles.
pub(super) fn mxfp4(b: &[u8], out: &mut [f32]) {
    let d = e8m0_half(b[0]);
    let qs = &b[1..17];
    for (j, o) in out.iter_mut().enumerate() {
        *o = d * f32::from(KVALUES[usize::from(nibble(qs, j))]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte path writes what the f32 kernel computes, bit for bit, for
    /// every code and for scales of every kind (zero, subnormal, normal,
    /// the largest, infinite, NaN).
    #[test]
    fn q8_0_le_bytes_equals_q8_0() {
        let scales = [
            0x0000u16, 0x8000, 0x0001, 0x03ff, 0x2e66, 0x3c00, 0xbc00, 0x7bff, 0x7c00, 0xfc00,
            0x7e01,
        ];
        let mut src = Vec::new();
        for (i, s) in scales.iter().enumerate() {
            for half in 0..8u8 {
                src.extend(s.to_le_bytes());
                src.extend(
                    (0..32u8).map(|j| j.wrapping_mul(8).wrapping_add(half).wrapping_add(i as u8)),
                );
            }
        }
        let blocks = src.len() / 34;
        let mut want = vec![0f32; blocks * 32];
        for (b, o) in src.chunks_exact(34).zip(want.chunks_exact_mut(32)) {
            q8_0(b, o);
        }
        let mut got = vec![0u8; blocks * 128];
        q8_0_le_bytes(&src, &mut got);
        let got: Vec<u32> = got
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want);
    }
}
