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
pub(super) const SUB: usize = 32;
pub(super) const NMAX: u8 = 15;
/// The search: `nstep + 1` reciprocal scales `(rmin + rdelta * is + nmax) /
/// (max - min)`, as quantize_row_q4_K_ref passes them.
pub(super) const RMIN: f32 = -1.0;
pub(super) const RDELTA: f32 = 0.1;
pub(super) const NSTEP: i32 = 20;

/// The 4-bit code of `x` at reciprocal scale `iscale` above `min`.
#[inline(always)]
pub(super) fn code(iscale: f32, x: f32, min: f32) -> u8 {
    nearest_int(iscale * (x - min)).clamp(0, i32::from(NMAX)) as u8
}

/// Sub-blocks per block: the search runs on all eight at once, one lane
/// each (`[f32; LANES]` arrays the compiler turns into vector registers).
/// Each lane does exactly the scalar search's operations in its order, so
/// the result is the same bit for bit (tests.rs keeps the scalar
/// `make_qkx2_quants` and compares); only the branches become selects.
pub(super) const LANES: usize = 8;
pub(super) type Lanes = [f32; LANES];

/// `f(k)` for every lane.
#[inline(always)]
fn each<T>(f: impl FnMut(usize) -> T) -> [T; LANES] {
    std::array::from_fn(f)
}

/// `make_qkx2_quants` on the eight sub-blocks at once: `x[i][k]` is value
/// `i` of sub-block `k`, `w` its weight. Fills `l` the same way with codes
/// and returns each sub-block's `(scale, -min)`.
pub(super) fn fit_sub_blocks(
    x: &[Lanes; SUB],
    w: &[Lanes; SUB],
    l: &mut [[u8; LANES]; SUB],
) -> (Lanes, Lanes) {
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = w[0];
    let mut sum_x = each(|k| sum_w[k] * x[0][k]);
    for i in 1..SUB {
        for k in 0..LANES {
            min[k] = if x[i][k] < min[k] { x[i][k] } else { min[k] };
            max[k] = if x[i][k] > max[k] { x[i][k] } else { max[k] };
            sum_w[k] += w[i][k];
            sum_x[k] += w[i][k] * x[i][k];
        }
    }
    let mut min = each(|k| if min[k] > 0.0 { 0.0 } else { min[k] });
    let (flat, flat_min) = (each(|k| max[k] == min[k]), min);
    let nmax = f32::from(NMAX);
    let iscale = each(|k| nmax / (max[k] - min[k]));
    let mut scale = each(|k| 1.0 / iscale[k]);
    let mut best_error = [0.0f32; LANES];
    for i in 0..SUB {
        for k in 0..LANES {
            l[i][k] = code(iscale[k], x[i][k], min[k]);
            let diff = scale[k] * f32::from(l[i][k]) + min[k] - x[i][k];
            best_error[k] += w[i][k] * (diff * diff);
        }
    }
    let mut laux = [[0u8; LANES]; SUB];
    for is in 0..=NSTEP {
        let step = RMIN + RDELTA * is as f32 + nmax;
        // `min` moves when a candidate wins, as in ggml: so does the range.
        let iscale = each(|k| step / (max[k] - min[k]));
        let (mut sum_l, mut sum_l2, mut sum_xl) =
            ([0.0f32; LANES], [0.0f32; LANES], [0.0f32; LANES]);
        for i in 0..SUB {
            for k in 0..LANES {
                laux[i][k] = code(iscale[k], x[i][k], min[k]);
                let lf = f32::from(laux[i][k]);
                sum_l[k] += w[i][k] * lf;
                sum_l2[k] += w[i][k] * lf * lf;
                sum_xl[k] += w[i][k] * lf * x[i][k];
            }
        }
        let det = each(|k| sum_w[k] * sum_l2[k] - sum_l[k] * sum_l[k]);
        let fit_min = each(|k| (sum_l2[k] * sum_x[k] - sum_l[k] * sum_xl[k]) / det[k]);
        let this_min = each(|k| if fit_min[k] > 0.0 { 0.0 } else { fit_min[k] });
        let this_scale = each(|k| {
            if fit_min[k] > 0.0 {
                sum_xl[k] / sum_l2[k]
            } else {
                (sum_w[k] * sum_xl[k] - sum_x[k] * sum_l[k]) / det[k]
            }
        });
        let mut cur_error = [0.0f32; LANES];
        for i in 0..SUB {
            for k in 0..LANES {
                let diff = this_scale[k] * f32::from(laux[i][k]) + this_min[k] - x[i][k];
                cur_error[k] += w[i][k] * (diff * diff);
            }
        }
        // A lane takes the candidate where the scalar search would have.
        let take = each(|k| det[k] > 0.0 && cur_error[k] < best_error[k]);
        for i in 0..SUB {
            for k in 0..LANES {
                l[i][k] = if take[k] { laux[i][k] } else { l[i][k] };
            }
        }
        for k in 0..LANES {
            if take[k] {
                best_error[k] = cur_error[k];
                scale[k] = this_scale[k];
                min[k] = this_min[k];
            }
        }
    }
    // A flat sub-block returned early in the scalar search: codes 0, scale 0.
    for k in 0..LANES {
        if flat[k] {
            scale[k] = 0.0;
            min[k] = flat_min[k];
            for li in l.iter_mut() {
                li[k] = 0;
            }
        }
    }
    (scale, each(|k| -min[k]))
}

/// Quantizes 256 values into one 144-byte block: f16 `d` and `dmin`, twelve
/// bytes of packed 6-bit scales and mins, then 128 bytes of nibbles (byte
/// `32 * c + i` holds values `64 * c + i` low and `64 * c + 32 + i` high).
pub(super) fn block(x: &[f32; 256], out: &mut [u8; 144]) {
    let xt: [Lanes; SUB] = std::array::from_fn(|i| each(|k| x[SUB * k + i]));
    let mut sum_x2 = [0.0f32; LANES];
    for xi in &xt {
        for k in 0..LANES {
            sum_x2[k] += xi[k] * xi[k];
        }
    }
    let av_x = each(|k| (sum_x2[k] / SUB as f32).sqrt());
    let w: [Lanes; SUB] = std::array::from_fn(|i| each(|k| av_x[k] + xt[i][k].abs()));
    let mut lt = [[0u8; LANES]; SUB];
    let (scales, mins) = fit_sub_blocks(&xt, &w, &mut lt);
    let mut l: [u8; 256] = std::array::from_fn(|j| lt[j % SUB][j / SUB]);
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
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
