//! One Q6_K super-block (256 values, 210 bytes) as ggml's
//! `quantize_row_q6_K_ref`: sixteen 16-value sub-blocks, each given a
//! symmetric scale by a 19-candidate search weighted by `x^2`
//! (`make_qx_quants` with rmse_type 1), the scales quantized to int8
//! against the largest in magnitude, and the 6-bit codes recomputed from
//! the stored f16 scale.
//!
//! As in `q4_k`: ggml's operation order, one rounding per C operation, C's
//! NaN behaviour in every comparison.

use super::round::{nearest_int, to_f16};

/// Values per sub-block, and the code offset (codes are -32..=31, stored +32).
const SUB: usize = 16;
const NMAX: i32 = 32;
/// ggml's GROUP_MAX_EPS: a sub-block (or block) whose largest magnitude is
/// under this is all zeros.
const GROUP_MAX_EPS: f32 = 1e-15;

/// The signed code of `x` at reciprocal scale `iscale`.
#[inline(always)]
fn code(iscale: f32, x: f32) -> i32 {
    nearest_int(iscale * x).clamp(-NMAX, NMAX - 1)
}

/// The weighted sums of one candidate reciprocal scale: `(sum w x l,
/// sum w l^2)` with `w = x^2`.
#[inline(always)]
fn sums(iscale: f32, x: &[f32; SUB]) -> (f32, f32) {
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for &v in x {
        let l = code(iscale, v) as f32;
        let w = v * v;
        sumlx += w * v * l;
        suml2 += w * l * l;
    }
    (sumlx, suml2)
}

/// `make_qx_quants(16, 32, x, l, 1, NULL)`: fills `l` with codes + 32 and
/// returns the sub-block's (signed) scale.
fn fit_sub_block(x: &[f32; SUB], l: &mut [u8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let fill = |l: &mut [u8], iscale: f32| {
        for (c, &v) in l.iter_mut().zip(x) {
            *c = (code(iscale, v) + NMAX) as u8;
        }
    };
    let iscale = -(NMAX as f32) / max;
    fill(l, iscale);
    let (sumlx, suml2) = sums(iscale, x);
    // C's `suml2 ? a : b`: NaN counts as true.
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(NMAX as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale, x);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            fill(l, iscale);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Quantizes 256 values into one 210-byte block: 128 bytes of low nibbles,
/// 64 bytes of high crumbs, 16 int8 scales, then the f16 `d`.
pub(super) fn block(x: &[f32; 256], out: &mut [u8; 210]) {
    let mut l = [0u8; 256];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for (ib, s) in scales.iter_mut().enumerate() {
        let xs: &[f32; SUB] = x[SUB * ib..SUB * (ib + 1)].try_into().unwrap();
        *s = fit_sub_block(xs, &mut l[SUB * ib..SUB * (ib + 1)]);
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = *s;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        out.fill(0); // f16 +0 is all zero bits
        return;
    }
    let iscale = -128.0 / max_scale;
    let (d_bits, d) = to_f16(1.0 / iscale);
    // ggml stores MIN(127, nearest_int(..)) into an int8_t (wrapping).
    let sc: [i8; 16] = std::array::from_fn(|ib| nearest_int(iscale * scales[ib]).min(127) as i8);
    for (j, &s) in sc.iter().enumerate() {
        let dl = d * f32::from(s);
        if dl == 0.0 {
            continue; // the search's codes stay, as in ggml
        }
        for (i, c) in l[SUB * j..SUB * (j + 1)].iter_mut().enumerate() {
            *c = (nearest_int(x[SUB * j + i] / dl).clamp(-32, 31) + 32) as u8;
        }
    }
    let (ql, rest) = out.split_at_mut(128);
    let (qh, rest) = rest.split_at_mut(64);
    for (k, &s) in sc.iter().enumerate() {
        rest[k] = s as u8;
    }
    rest[16..18].copy_from_slice(&d_bits.to_le_bytes());
    for h in 0..2 {
        let (ql, qh, l) = (&mut ql[64 * h..], &mut qh[32 * h..], &l[128 * h..]);
        for i in 0..32 {
            let q = [l[i], l[i + 32], l[i + 64], l[i + 96]];
            ql[i] = (q[0] & 0x0f) | ((q[2] & 0x0f) << 4);
            ql[i + 32] = (q[1] & 0x0f) | ((q[3] & 0x0f) << 4);
            qh[i] = (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
        }
    }
}
