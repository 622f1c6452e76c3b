//! One Q4_K super-block (256 values, 144 bytes) as ggml's
//! `quantize_row_q4_K_ref`: eight 32-value sub-blocks, each fitted with a
//! scale and a min by a 21-step search over the reciprocal scale
//! (`make_qkx2_quants` with rmin -1, rdelta 0.1, squared error weighted by
//! `rms + |x|`), then both quantized to 6 bits against the block's largest,
//! and the 4-bit codes recomputed from the stored f16 scales.
//!
//! Bit-exactness: every sum runs in ggml's order, one f32 rounding per C
//! operation (`w * l * x` is `(w * l) * x`), no fused multiply-add (ggml's
//! ggml-base is built for baseline x86-64, which has none). Comparisons keep
//! C's NaN behaviour (`d == 0` is false for NaN, as `!d` is in C).

use super::round::{nearest_int, to_f16};

/// Values per sub-block, and the largest 4-bit code.
const SUB: usize = 32;
const NMAX: u8 = 15;
/// The search: `nstep + 1` reciprocal scales `(rmin + rdelta * is + nmax) /
/// (max - min)`, as quantize_row_q4_K_ref passes them.
const RMIN: f32 = -1.0;
const RDELTA: f32 = 0.1;
const NSTEP: i32 = 20;

/// The 4-bit code of `x` at reciprocal scale `iscale` above `min`.
#[inline(always)]
fn code(iscale: f32, x: f32, min: f32) -> u8 {
    nearest_int(iscale * (x - min)).clamp(0, i32::from(NMAX)) as u8
}

/// `make_qkx2_quants` for one sub-block: fills `l` with codes and returns
/// `(scale, -min)`, `min <= 0` the offset the codes start from.
fn fit_sub_block(x: &[f32; SUB], w: &[f32; SUB], l: &mut [u8; SUB]) -> (f32, f32) {
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..SUB {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        *l = [0; SUB];
        return (0.0, -min);
    }
    let nmax = f32::from(NMAX);
    let iscale = nmax / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..SUB {
        l[i] = code(iscale, x[i], min);
        let diff = scale * f32::from(l[i]) + min - x[i];
        best_error += w[i] * (diff * diff);
    }
    let mut laux = [0u8; SUB];
    for is in 0..=NSTEP {
        let iscale = (RMIN + RDELTA * is as f32 + nmax) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..SUB {
            laux[i] = code(iscale, x[i], min);
            let lf = f32::from(laux[i]);
            sum_l += w[i] * lf;
            sum_l2 += w[i] * lf * lf;
            sum_xl += w[i] * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..SUB {
                let diff = this_scale * f32::from(laux[i]) + this_min - x[i];
                cur_error += w[i] * (diff * diff);
            }
            if cur_error < best_error {
                *l = laux;
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Quantizes 256 values into one 144-byte block: f16 `d` and `dmin`, twelve
/// bytes of packed 6-bit scales and mins, then 128 bytes of nibbles (byte
/// `32 * c + i` holds values `64 * c + i` low and `64 * c + 32 + i` high).
pub(super) fn block(x: &[f32; 256], out: &mut [u8; 144]) {
    let mut l = [0u8; 256];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs: &[f32; SUB] = x[SUB * j..SUB * (j + 1)].try_into().unwrap();
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / SUB as f32).sqrt();
        let w: [f32; SUB] = std::array::from_fn(|i| av_x + xs[i].abs());
        let ls: &mut [u8; SUB] = (&mut l[SUB * j..SUB * (j + 1)]).try_into().unwrap();
        (scales[j], mins[j]) = fit_sub_block(xs, &w, ls);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    // ggml stores nearest_int into a uint8_t (wrapping) before MIN(63, _).
    let six = |v: f32| (nearest_int(v) as u8).min(63);
    let ls: [u8; 8] = std::array::from_fn(|j| six(inv_scale * scales[j]));
    let lm: [u8; 8] = std::array::from_fn(|j| six(inv_min * mins[j]));
    let (d_bits, d) = to_f16(max_scale / 63.0);
    let (dmin_bits, dmin) = to_f16(max_min / 63.0);
    out[0..2].copy_from_slice(&d_bits.to_le_bytes());
    out[2..4].copy_from_slice(&dmin_bits.to_le_bytes());
    pack_scales(&ls, &lm, &mut out[4..16]);
    for j in 0..8 {
        let dl = d * f32::from(ls[j]);
        if dl == 0.0 {
            continue; // the search's codes stay, as in ggml
        }
        let ml = dmin * f32::from(lm[j]);
        for (i, c) in l[SUB * j..SUB * (j + 1)].iter_mut().enumerate() {
            *c = nearest_int((x[SUB * j + i] + ml) / dl).clamp(0, i32::from(NMAX)) as u8;
        }
    }
    let qs = &mut out[16..144];
    for c in 0..4 {
        for i in 0..32 {
            qs[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
        }
    }
}

/// The 12-byte scale field (the inverse of the dequantizer's `scale_min`):
/// sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins);
/// sub-blocks 4-7 as nibbles in bytes 8-11, their top two bits in the top
/// two bits of bytes 0-7.
fn pack_scales(ls: &[u8; 8], lm: &[u8; 8], s: &mut [u8]) {
    for j in 0..4 {
        s[j] = ls[j] | ((ls[j + 4] >> 4) << 6);
        s[j + 4] = lm[j] | ((lm[j + 4] >> 4) << 6);
        s[j + 8] = (ls[j + 4] & 0x0f) | ((lm[j + 4] & 0x0f) << 4);
    }
}
