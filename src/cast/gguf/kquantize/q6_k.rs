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
pub(super) const SUB: usize = 16;
pub(super) const NMAX: i32 = 32;
/// ggml's GROUP_MAX_EPS: a sub-block (or block) whose largest magnitude is
/// under this is all zeros.
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// The signed code of `x` at reciprocal scale `iscale`.
#[inline(always)]
pub(super) fn code(iscale: f32, x: f32) -> i32 {
    nearest_int(iscale * x).clamp(-NMAX, NMAX - 1)
}

/// Sub-blocks per block: the search runs on all sixteen at once, one lane
/// each, every lane doing the scalar search's operations in its order
/// (tests.rs keeps the scalar `make_qx_quants` and compares).
pub(super) const LANES: usize = 16;
pub(super) type Lanes = [f32; LANES];

/// `f(k)` for every lane.
#[inline(always)]
fn each<T>(f: impl FnMut(usize) -> T) -> [T; LANES] {
    std::array::from_fn(f)
}

/// `make_qx_quants(16, 32, x, l, 1, NULL)` on the sixteen sub-blocks at
/// once: `x[i][k]` is value `i` of sub-block `k`. Fills `l` with codes + 32
/// and returns each sub-block's (signed) scale.
pub(super) fn fit_sub_blocks(x: &[Lanes; SUB], l: &mut [[u8; LANES]; SUB]) -> Lanes {
    let (mut max, mut amax) = ([0.0f32; LANES], [0.0f32; LANES]);
    for xi in x {
        for k in 0..LANES {
            let big = xi[k].abs() > amax[k];
            amax[k] = if big { xi[k].abs() } else { amax[k] };
            max[k] = if big { xi[k] } else { max[k] };
        }
    }
    // One candidate: its codes into `laux`, and `(sum w x l, sum w l^2)`
    // with `w = x^2`.
    let candidate = |iscale: &Lanes, laux: &mut [[u8; LANES]; SUB]| {
        let (mut sumlx, mut suml2) = ([0.0f32; LANES], [0.0f32; LANES]);
        for i in 0..SUB {
            for k in 0..LANES {
                let c = code(iscale[k], x[i][k]);
                laux[i][k] = (c + NMAX) as u8;
                let (v, lf) = (x[i][k], c as f32);
                let w = v * v;
                sumlx[k] += w * v * lf;
                suml2[k] += w * lf * lf;
            }
        }
        (sumlx, suml2)
    };
    let iscale = each(|k| -(NMAX as f32) / max[k]);
    let (sumlx, suml2) = candidate(&iscale, l);
    // C's `suml2 ? a : b`: NaN counts as true.
    let mut scale = each(|k| {
        if suml2[k] != 0.0 {
            sumlx[k] / suml2[k]
        } else {
            0.0
        }
    });
    let mut best = each(|k| scale[k] * sumlx[k]);
    let mut laux = [[0u8; LANES]; SUB];
    for is in (-9..=9).filter(|&is| is != 0) {
        let step = -(NMAX as f32 + 0.1 * is as f32);
        let iscale = each(|k| step / max[k]);
        let (sumlx, suml2) = candidate(&iscale, &mut laux);
        let take = each(|k| suml2[k] > 0.0 && sumlx[k] * sumlx[k] > best[k] * suml2[k]);
        for i in 0..SUB {
            for k in 0..LANES {
                l[i][k] = if take[k] { laux[i][k] } else { l[i][k] };
            }
        }
        for k in 0..LANES {
            if take[k] {
                scale[k] = sumlx[k] / suml2[k];
                best[k] = scale[k] * sumlx[k];
            }
        }
    }
    // An all-zero sub-block returned early in the scalar search.
    for k in 0..LANES {
        if amax[k] < GROUP_MAX_EPS {
            scale[k] = 0.0;
            for li in l.iter_mut() {
                li[k] = 0;
            }
        }
    }
    scale
}

/// Quantizes 256 values into one 210-byte block: 128 bytes of low nibbles,
/// 64 bytes of high crumbs, 16 int8 scales, then the f16 `d`.
pub(super) fn block(x: &[f32; 256], out: &mut [u8; 210]) {
    let xt: [Lanes; SUB] = std::array::from_fn(|i| each(|k| x[SUB * k + i]));
    let mut lt = [[0u8; LANES]; SUB];
    let scales = fit_sub_blocks(&xt, &mut lt);
    let mut l: [u8; 256] = std::array::from_fn(|j| lt[j % SUB][j / SUB]);
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for s in scales {
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
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
