//! The scalar searches ggml writes (`make_qkx2_quants` for Q4_K,
//! `make_qx_quants` for Q6_K), one sub-block at a time, kept as the
//! references the lane-parallel searches of `q4_k` and `q6_k` must match
//! bit for bit (scale, min and every code), on ordinary and edge blocks.

use super::tests::values;
use super::{q4_k, q6_k};

mod q4 {
    use super::q4_k::{code, NMAX, NSTEP, RDELTA, RMIN, SUB};

    /// The scalar `make_qkx2_quants` the lanes of `q4_k::fit_sub_blocks`
    /// must reproduce, written as ggml's loop over one sub-block: fills `l` with codes and returns
    /// `(scale, -min)`, `min <= 0` the offset the codes start from.
    pub(super) fn fit_sub_block(x: &[f32; SUB], w: &[f32; SUB], l: &mut [u8; SUB]) -> (f32, f32) {
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
}

mod q6 {
    use super::q6_k::{code, GROUP_MAX_EPS, NMAX, SUB};

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

    /// The scalar `make_qx_quants(16, 32, x, l, 1, NULL)` the lanes of
    /// `q6_k::fit_sub_blocks` must reproduce: fills `l` with codes + 32 and
    /// returns the sub-block's (signed) scale.
    pub(super) fn fit_sub_block(x: &[f32; SUB], l: &mut [u8]) -> f32 {
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
}

#[test]
fn q4_k_lanes_match_the_scalar_search_bit_for_bit() {
    use q4_k::{LANES, SUB};
    for (b, x) in blocks(64, SUB).iter().enumerate() {
        let xt: [q4_k::Lanes; SUB] =
            std::array::from_fn(|i| std::array::from_fn(|k| x[SUB * k + i]));
        let w: [q4_k::Lanes; SUB] = std::array::from_fn(|i| {
            std::array::from_fn(|k| {
                let sub = &x[SUB * k..SUB * (k + 1)];
                let av = (sub.iter().fold(0f32, |a, v| a + v * v) / SUB as f32).sqrt();
                av + xt[i][k].abs()
            })
        });
        let mut lt = [[0u8; LANES]; SUB];
        let (scales, mins) = q4_k::fit_sub_blocks(&xt, &w, &mut lt);
        for k in 0..LANES {
            let xs: [f32; SUB] = std::array::from_fn(|i| xt[i][k]);
            let ws: [f32; SUB] = std::array::from_fn(|i| w[i][k]);
            let mut l = [0u8; SUB];
            let (scale, min) = q4::fit_sub_block(&xs, &ws, &mut l);
            let theirs = (scales[k].to_bits(), mins[k].to_bits());
            assert_eq!(
                (scale.to_bits(), min.to_bits()),
                theirs,
                "block {b} sub-block {k}"
            );
            assert_eq!(
                l,
                std::array::from_fn(|i| lt[i][k]),
                "block {b} sub-block {k}"
            );
        }
    }
}

/// Edge blocks for both searches: normal rows at many scales, then flat,
/// zero, constant (min clamps to 0), huge (infinities and NaNs in the
/// sums) and tiny sub-blocks.
fn blocks(n: usize, sub: usize) -> Vec<Vec<f32>> {
    let mut out: Vec<Vec<f32>> = (0..n)
        .map(|s| values(256, 300 + s as u64, 10f32.powi(s as i32 % 9 - 4)))
        .collect();
    let mut edge = values(256, 299, 1.0);
    edge[..sub].fill(-3.0);
    edge[sub..2 * sub].fill(0.0);
    edge[2 * sub..3 * sub].fill(5.0);
    edge[3 * sub..4 * sub].iter_mut().for_each(|v| *v *= 1e30);
    edge[4 * sub..5 * sub].iter_mut().for_each(|v| *v *= 1e-20);
    out.push(edge);
    out
}

#[test]
fn q6_k_lanes_match_the_scalar_search_bit_for_bit() {
    use q6_k::{LANES, SUB};
    for (b, x) in blocks(64, SUB).iter().enumerate() {
        let xt: [q6_k::Lanes; SUB] =
            std::array::from_fn(|i| std::array::from_fn(|k| x[SUB * k + i]));
        let mut lt = [[0u8; LANES]; SUB];
        let scales = q6_k::fit_sub_blocks(&xt, &mut lt);
        for k in 0..LANES {
            let xs: [f32; SUB] = std::array::from_fn(|i| xt[i][k]);
            let mut l = [0u8; SUB];
            let scale = q6::fit_sub_block(&xs, &mut l);
            assert_eq!(
                scale.to_bits(),
                scales[k].to_bits(),
                "block {b} sub-block {k}"
            );
            assert_eq!(
                l,
                std::array::from_fn(|i| lt[i][k]),
                "block {b} sub-block {k}"
            );
        }
    }
}
