//! The K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): 256-element super-blocks
//! of 16 or 8 sub-blocks with their own 4- or 6-bit scales, one block at a
//! time, each written as gguf-py's `dequantize_blocks` evaluates it.
//!
//! Element `j` of a super-block: its low bits come from a packed array read
//! in 32-element runs (`half = j / 128`, `run = (j % 128) / 32` for 2-bit
//! fields, `j / 64` and `(j % 64) / 32` for nibbles); high bits from bit
//! `j / 32` of byte `j % 32` of a 32-byte mask. The sub-block scale is
//! multiplied by the f16 super-scale first, then by the code, as numpy does.

use super::f16::f16_at;

/// The 2-bit field of element `j` in a 64-byte array (Q2_K, Q3_K, Q6_K's
/// high bits).
#[inline(always)]
fn crumb(qs: &[u8], j: usize) -> u8 {
    let (half, run, l) = (j / 128, (j % 128) / 32, j % 32);
    (qs[half * 32 + l] >> (2 * run)) & 3
}

/// The nibble of element `j` in a 128-byte array (Q4_K, Q5_K).
#[inline(always)]
fn nibble(qs: &[u8], j: usize) -> u8 {
    let (chunk, hi, l) = (j / 64, (j % 64) / 32, j % 32);
    (qs[chunk * 32 + l] >> (4 * hi)) & 0x0f
}

/// Bit `j / 32` of `mask[j % 32]`.
#[inline(always)]
fn mask_bit(mask: &[u8], j: usize) -> u8 {
    (mask[j % 32] >> (j / 32)) & 1
}

/// `dl * q - ml` with `dl = d * (scale & 15)`, `ml = dmin * (scale >> 4)`
/// per 16 elements.
pub(super) fn q2_k(b: &[u8], out: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = f16_at(&b[80..82]);
    let dmin = f16_at(&b[82..84]);
    let dl: [f32; 16] = std::array::from_fn(|g| d * f32::from(scales[g] & 0x0f));
    let ml: [f32; 16] = std::array::from_fn(|g| dmin * f32::from(scales[g] >> 4));
    for (j, o) in out.iter_mut().enumerate() {
        *o = dl[j / 16] * f32::from(crumb(qs, j)) - ml[j / 16];
    }
}

/// `(d * (scale - 32)) * (q - 4 * !hbit)` with 6-bit scales per 16.
pub(super) fn q3_k(b: &[u8], out: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let sc = &b[96..108];
    let d = f16_at(&b[108..110]);
    let dl: [f32; 16] = std::array::from_fn(|g| {
        let low = (sc[g % 8] >> (4 * (g / 8))) & 0x0f;
        let high = (sc[8 + g % 4] >> (2 * (g / 4))) & 0x03;
        d * f32::from((low | (high << 4)) as i8 - 32)
    });
    for (j, o) in out.iter_mut().enumerate() {
        let q = crumb(qs, j) as i8 - (((mask_bit(hmask, j) ^ 1) << 2) as i8);
        *o = dl[j / 16] * f32::from(q);
    }
}

/// The 6-bit scale and min of sub-block `g` (0..8), as gguf-py's
/// `Q4_K.get_scale_min`.
#[inline(always)]
fn scale_min(s: &[u8], g: usize) -> (u8, u8) {
    if g < 4 {
        (s[g] & 0x3f, s[g + 4] & 0x3f)
    } else {
        let i = g - 4;
        (
            (s[8 + i] & 0x0f) | ((s[i] >> 2) & 0x30),
            (s[8 + i] >> 4) | ((s[4 + i] >> 2) & 0x30),
        )
    }
}

/// `d * sc` and `dmin * m` of each of the 8 sub-blocks (Q4_K, Q5_K).
fn sub_scales(b: &[u8]) -> ([f32; 8], [f32; 8]) {
    let d = f16_at(&b[0..2]);
    let dmin = f16_at(&b[2..4]);
    let scales = &b[4..16];
    let dl = std::array::from_fn(|g| d * f32::from(scale_min(scales, g).0));
    let ml = std::array::from_fn(|g| dmin * f32::from(scale_min(scales, g).1));
    (dl, ml)
}

/// `(d * sc) * q - (dmin * m)` per 32 elements, 4-bit codes.
pub(super) fn q4_k(b: &[u8], out: &mut [f32]) {
    let (dl, ml) = sub_scales(b);
    let qs = &b[16..144];
    for (j, o) in out.iter_mut().enumerate() {
        *o = dl[j / 32] * f32::from(nibble(qs, j)) - ml[j / 32];
    }
}

/// As Q4_K with a fifth bit from `qh`.
pub(super) fn q5_k(b: &[u8], out: &mut [f32]) {
    let (dl, ml) = sub_scales(b);
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (j, o) in out.iter_mut().enumerate() {
        let q = nibble(qs, j) | (mask_bit(qh, j) << 4);
        *o = dl[j / 32] * f32::from(q) - ml[j / 32];
    }
}

/// `(d * scale) * (q - 32)`, int8 scales per 16, 6-bit codes.
pub(super) fn q6_k(b: &[u8], out: &mut [f32]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let scales = &b[192..208];
    let d = f16_at(&b[208..210]);
    let dl: [f32; 16] = std::array::from_fn(|g| d * f32::from(scales[g] as i8));
    for (j, o) in out.iter_mut().enumerate() {
        let (half, hi, l) = (j / 128, (j % 128) / 64, j % 64);
        let low = (ql[half * 64 + l] >> (4 * hi)) & 0x0f;
        let q = (low | (crumb(qh, j) << 4)) as i8 - 32;
        *o = dl[j / 16] * f32::from(q);
    }
}
