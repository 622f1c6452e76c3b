//! The arithmetic of the scaled FP8 schemes, one element at a time, each
//! bit for bit as its reference quantizer computes it in torch on the CPU.
//!
//! Every recipe works on the tensor's values in its *working dtype* (F32,
//! F16 or BF16: the dtype the tensor would be written in without
//! `--quantize`), so rounding happens where the reference rounds:
//!
//! - [`Recipe::PerTensor`], comfy-kitchen's `TensorCoreFP8Layout.quantize`
//!   (what ComfyUI's `fp8-scaled` files hold): `scale =
//!   (amax(|x|) / 448)` rounded to the working dtype, then kept as f32;
//!   `codes = fp8(clamp(x * w(1 / scale)))`, the reciprocal computed in
//!   f32 and rounded to the working dtype `w`, the product rounded to it
//!   too.
//! - [`Recipe::PerChannel`], compressed-tensors' `calculate_qparams` and
//!   `quantize` (llm-compressor's `FP8_DYNAMIC` weights): per output row,
//!   `scale = w(amax / 448)` stored in the working dtype, a zero scale
//!   replaced by the dtype's epsilon; `codes = fp8(clamp(w(x / scale) +
//!   0))`: compressed-tensors adds its zero point (0) before the clamp,
//!   which turns -0.0 into +0.0 (code 0x00; the other schemes keep 0x80).
//! - [`Recipe::Block`], transformers' FineGrainedFP8 quantizer (the
//!   DeepSeek layout), all in f32: per block `s = 448 / amax` (1 for an
//!   all-zero block; computed as torch computes a scalar divided by a
//!   tensor, `(1 / amax) * 448`, two roundings), `codes = fp8(clamp(x * s))`, and the stored
//!   `weight_scale_inv = 1 / s`. Edge blocks that do not fill the block
//!   size are quantized over the values they have (transformers' own
//!   quantizer leaves such tensors unquantized; its loader reads them).
//!
//! Deviations, each on inputs the references turn into NaN: a per-tensor
//! scale that would be zero (an all-zero tensor) is 1, so the codes are
//! zeros rather than `0 * inf`; NaN values are left out of the absmax (they
//! stay NaN in the codes) rather than making every code NaN. Values that
//! are infinite in the working dtype (an `inf` in the source, or a finite
//! value past the working dtype's range) would make the references' scale
//! infinite and every code NaN: the stream refuses them under
//! `--on-overflow error` and otherwise leaves them out of the absmax, so
//! their codes clamp to ±448 ([`finite_abs_max`]).

use serde::{Deserialize, Serialize};

use super::super::f8::{e4m3_to_f32, f32_to_e4m3};
use super::super::kernels::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, f64_to_f32};
use crate::format::Dtype;

/// The largest finite F8_E4M3 value.
pub const E4M3_MAX: f32 = 448.0;

/// How scales are derived and applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Recipe {
    /// One f32 scale for the whole tensor (comfy-kitchen).
    PerTensor,
    /// One scale per output row, in the working dtype (compressed-tensors).
    PerChannel,
    /// One f32 inverse scale per `rows x cols` block (FineGrainedFP8).
    Block { rows: u64, cols: u64 },
}

impl Recipe {
    /// Rows and columns of one scale's block for a `[rows, cols]` weight.
    pub fn block(self, rows: u64, cols: u64) -> (u64, u64) {
        match self {
            Recipe::PerTensor => (rows.max(1), cols.max(1)),
            Recipe::PerChannel => (1, cols.max(1)),
            Recipe::Block { rows, cols } => (rows.max(1), cols.max(1)),
        }
    }

    /// The shape of the scale tensor of a `[rows, cols]` weight.
    pub fn scale_shape(self, rows: u64, cols: u64) -> Vec<u64> {
        match self {
            Recipe::PerTensor => Vec::new(),
            Recipe::PerChannel => vec![rows, 1],
            Recipe::Block { .. } => {
                let (br, bc) = self.block(rows, cols);
                vec![rows.div_ceil(br), cols.div_ceil(bc)]
            }
        }
    }

    /// The dtype the scales are stored in, for working dtype `work`.
    pub fn scale_dtype(self, work: Dtype) -> Dtype {
        match self {
            Recipe::PerChannel => work,
            Recipe::PerTensor | Recipe::Block { .. } => Dtype::F32,
        }
    }
}

/// The working dtype of a tensor written as `planned` without `--quantize`:
/// F64 works in F32 (torch's f64 -> fp8 conversion goes through f32 too).
pub fn working_dtype(planned: Dtype) -> Dtype {
    match planned {
        Dtype::F16 => Dtype::F16,
        Dtype::BF16 => Dtype::BF16,
        _ => Dtype::F32,
    }
}

/// `x` rounded to `work` (nearest, ties to even, overflow to infinity as
/// torch does), as f32.
#[inline(always)]
pub fn round_to(work: Dtype, x: f32) -> f32 {
    match work {
        Dtype::BF16 => f32::from_bits(bf16_to_f32(f32_to_bf16::<false>(x.to_bits()).0).0),
        Dtype::F16 => f32::from_bits(f16_to_f32(f32_to_f16::<false>(x.to_bits()).0).0),
        _ => x,
    }
}

/// Element `i` of `bytes` (little-endian `from` values) as f32, and as the
/// f64 reference value the error is measured against.
#[inline(always)]
pub fn source_value(from: Dtype, bytes: &[u8], i: usize) -> (f32, f64) {
    match from {
        Dtype::F32 => {
            let v = f32::from_le_bytes([
                bytes[4 * i],
                bytes[4 * i + 1],
                bytes[4 * i + 2],
                bytes[4 * i + 3],
            ]);
            (v, f64::from(v))
        }
        Dtype::F16 | Dtype::BF16 => {
            let h = u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]);
            let bits = match from {
                Dtype::F16 => f16_to_f32(h).0,
                _ => bf16_to_f32(h).0,
            };
            let v = f32::from_bits(bits);
            (v, f64::from(v))
        }
        _ => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[8 * i..8 * i + 8]);
            let bits = u64::from_le_bytes(b);
            (
                f32::from_bits(f64_to_f32::<false>(bits).0),
                f64::from_bits(bits),
            )
        }
    }
}

/// The largest magnitude of the little-endian `from` values in `bytes`,
/// NaN left out, as f32 (an F64 source's values rounded to f32 first).
/// Rounding to the working dtype is monotonic, so the working-dtype absmax
/// is `round_to(work, abs_max(..))`.
#[inline(always)]
pub fn abs_max(from: Dtype, bytes: &[u8]) -> f32 {
    // For values that are not NaN, magnitudes order as their sign-cleared
    // bit patterns do, and NaN patterns are the largest: an integer max
    // over the patterns up to infinity's (which vectorizes) is the absmax.
    match from {
        Dtype::F32 => {
            // `as_chunks`: whole elements, one plain load each, so the
            // fold vectorizes (`chunks_exact` does not).
            let bits = bytes
                .as_chunks::<4>()
                .0
                .iter()
                .map(|c| u32::from_le_bytes(*c) & 0x7fff_ffff)
                .map(|b| if b > 0x7f80_0000 { 0 } else { b })
                .fold(0, u32::max);
            f32::from_bits(bits)
        }
        Dtype::BF16 | Dtype::F16 => {
            let inf: u16 = if from == Dtype::BF16 { 0x7f80 } else { 0x7c00 };
            let bits = bytes
                .as_chunks::<2>()
                .0
                .iter()
                .map(|c| u16::from_le_bytes(*c) & 0x7fff)
                .map(|b| if b > inf { 0 } else { b })
                .fold(0, u16::max);
            match from {
                Dtype::BF16 => f32::from_bits(u32::from(bits) << 16),
                _ => f32::from_bits(f16_to_f32(bits).0),
            }
        }
        _ => (0..bytes.len() / 8)
            .map(|i| source_value(from, bytes, i).0.abs())
            .fold(0.0, f32::max),
    }
}

/// The largest magnitude of the values in `bytes` that stay finite in
/// `work`, and how many become infinite there (NaN is neither): the slow
/// path of [`abs_max`], for the rare run whose absmax does not.
pub fn finite_abs_max(from: Dtype, work: Dtype, bytes: &[u8]) -> (f32, u64) {
    let n = bytes.len() / (from.bits() / 8) as usize;
    let (mut amax, mut infinite) = (0f32, 0u64);
    for i in 0..n {
        let v = source_value(from, bytes, i).0.abs();
        if round_to(work, v).is_infinite() {
            infinite += 1;
        } else if !v.is_nan() {
            amax = amax.max(v);
        }
    }
    (amax, infinite)
}

/// One block's scale, as the codes are made with it and as it is stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scale {
    /// PerTensor: the working-dtype reciprocal multiplied in; PerChannel:
    /// the divisor; Block: the f32 factor multiplied in.
    pub apply: f32,
    /// The value a loader multiplies codes by (the stored scale).
    pub stored: f32,
}

impl Scale {
    /// The scale of a block whose largest magnitude is `amax` (NaN left
    /// out), for `recipe` in working dtype `work`.
    pub fn of(recipe: Recipe, work: Dtype, amax: f32) -> Scale {
        match recipe {
            Recipe::PerTensor => {
                let mut s = round_to(work, amax / E4M3_MAX);
                if s == 0.0 {
                    s = 1.0;
                }
                Scale {
                    apply: round_to(work, 1.0 / s),
                    stored: s,
                }
            }
            Recipe::PerChannel => {
                let mut s = round_to(work, amax / round_to(work, E4M3_MAX));
                if s == 0.0 {
                    s = epsilon(work);
                }
                Scale {
                    apply: s,
                    stored: s,
                }
            }
            Recipe::Block { .. } => {
                // torch evaluates `448.0 / tensor` as `reciprocal(tensor) *
                // 448.0`: two roundings, which transformers' quantizer has.
                let s = if amax > 0.0 {
                    (1.0 / amax) * E4M3_MAX
                } else {
                    1.0
                };
                Scale {
                    apply: s,
                    stored: 1.0 / s,
                }
            }
        }
    }

    /// The stored bytes of this scale in `dtype` (F32, or the working
    /// dtype of a per-channel scale, which holds it exactly).
    pub fn stored_bytes(&self, dtype: Dtype, out: &mut Vec<u8>) {
        let bits = self.stored.to_bits();
        match dtype {
            Dtype::BF16 => out.extend_from_slice(&f32_to_bf16::<false>(bits).0.to_le_bytes()),
            Dtype::F16 => out.extend_from_slice(&f32_to_f16::<false>(bits).0.to_le_bytes()),
            _ => out.extend_from_slice(&bits.to_le_bytes()),
        }
    }
}

/// `torch.finfo(dtype).eps`, compressed-tensors' replacement for a zero
/// scale.
fn epsilon(work: Dtype) -> f32 {
    match work {
        Dtype::BF16 => 2f32.powi(-7),
        Dtype::F16 => 2f32.powi(-10),
        _ => f32::EPSILON,
    }
}

/// The F8_E4M3 code of working-dtype value `x` under `scale`.
#[inline(always)]
pub fn code(recipe: Recipe, work: Dtype, x: f32, scale: &Scale) -> u8 {
    let t = match recipe {
        Recipe::PerTensor => round_to(work, x * scale.apply),
        Recipe::PerChannel => round_to(work, x / scale.apply) + 0.0,
        Recipe::Block { .. } => x * scale.apply,
    };
    e4m3_code(t)
}

/// The F8_E4M3 code of `t`: clamped to ±448, nearest even, NaN kept.
#[inline(always)]
pub fn e4m3_code(t: f32) -> u8 {
    f32_to_e4m3(t.to_bits()).0
}

/// The value a loader reads back for `code` under `scale` (exact in f64).
#[inline(always)]
pub fn dequantized(code: u8, scale: &Scale) -> f64 {
    f64::from(f32::from_bits(e4m3_to_f32(code))) * f64::from(scale.stored)
}

/// Every F8_E4M3 code's value (NaN for the two NaN codes).
pub fn e4m3_values() -> &'static [f32; 256] {
    static VALUES: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    VALUES.get_or_init(|| std::array::from_fn(|c| f32::from_bits(e4m3_to_f32(c as u8))))
}

/// How far a quantized tensor is from its source: sums that add up over
/// chunks and tensors, and the figures derived from them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct QuantQuality {
    /// Finite elements measured.
    pub elements: u64,
    /// Elements not measured: a NaN or infinite source value, or a NaN
    /// code (reported, never taken for zeros).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_finite: u64,
    /// Largest |source - dequantized|.
    pub max_abs_error: f64,
    /// Sum of source squared, and of the error squared.
    pub sum_sq_source: f64,
    pub sum_sq_error: f64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

// The fields are never NaN: non-finite elements are not measured.
impl Eq for QuantQuality {}

impl QuantQuality {
    /// Adds one element: source value `x`, read back as `y`.
    #[inline(always)]
    pub fn add(&mut self, x: f64, y: f64) {
        // Both finite exactly when their difference is (values come from
        // f32s, so a finite difference cannot overflow): one test, and no
        // branch, so the loop around it vectorizes.
        let e = x - y;
        let finite = e.is_finite();
        let (x, e) = if finite { (x, e) } else { (0.0, 0.0) };
        self.elements += u64::from(finite);
        self.not_finite += u64::from(!finite);
        self.max_abs_error = self.max_abs_error.max(e.abs());
        self.sum_sq_source += x * x;
        self.sum_sq_error += e * e;
    }

    /// Relative RMS error, sqrt(sum err^2 / sum x^2); `None` for a source
    /// of zeros.
    pub fn relative_rms(&self) -> Option<f64> {
        (self.sum_sq_source > 0.0).then(|| (self.sum_sq_error / self.sum_sq_source).sqrt())
    }

    /// Signal-to-noise ratio in dB; `None` when there is no signal, or no
    /// noise (exact).
    pub fn snr_db(&self) -> Option<f64> {
        (self.sum_sq_source > 0.0 && self.sum_sq_error > 0.0)
            .then(|| 10.0 * (self.sum_sq_source / self.sum_sq_error).log10())
    }
}

impl std::ops::AddAssign for QuantQuality {
    fn add_assign(&mut self, rhs: QuantQuality) {
        self.elements += rhs.elements;
        self.not_finite += rhs.not_finite;
        self.max_abs_error = self.max_abs_error.max(rhs.max_abs_error);
        self.sum_sq_source += rhs.sum_sq_source;
        self.sum_sq_error += rhs.sum_sq_error;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_tensor_scale_rounds_in_the_working_dtype() {
        // 1.0 / 448 in bf16 is 0.002227783203125; in f32 0.002232142...
        let s = Scale::of(Recipe::PerTensor, Dtype::BF16, 1.0);
        assert_eq!(s.stored, 0.002_227_783_2);
        let f = Scale::of(Recipe::PerTensor, Dtype::F32, 1.0);
        assert_eq!(f.stored, 1.0 / 448.0);
        assert_eq!(code(Recipe::PerTensor, Dtype::F32, 1.0, &f), 0x7e); // 448
    }

    #[test]
    fn zero_blocks_get_a_usable_scale() {
        assert_eq!(Scale::of(Recipe::PerTensor, Dtype::BF16, 0.0).stored, 1.0);
        assert_eq!(
            Scale::of(Recipe::PerChannel, Dtype::BF16, 0.0).stored,
            0.0078125
        );
        let b = Scale::of(Recipe::Block { rows: 2, cols: 2 }, Dtype::F32, 0.0);
        assert_eq!((b.apply, b.stored), (1.0, 1.0));
        for r in [
            Recipe::PerTensor,
            Recipe::PerChannel,
            Recipe::Block { rows: 1, cols: 1 },
        ] {
            let s = Scale::of(r, Dtype::BF16, 0.0);
            assert_eq!(code(r, Dtype::BF16, 0.0, &s), 0);
        }
    }

    #[test]
    fn the_largest_value_becomes_the_largest_code() {
        for r in [
            Recipe::PerTensor,
            Recipe::PerChannel,
            Recipe::Block { rows: 1, cols: 1 },
        ] {
            for work in [Dtype::F32, Dtype::F16, Dtype::BF16] {
                let amax = round_to(work, 3.7);
                let s = Scale::of(r, work, amax);
                let c = code(r, work, amax, &s);
                // 448 or the code just below it, by the scale's rounding.
                assert!(c == 0x7e || c == 0x7d, "{r:?} {work}: {c:#x}");
                let back = dequantized(c, &s);
                assert!((back - f64::from(amax)).abs() / f64::from(amax) < 0.07);
            }
        }
    }

    #[test]
    fn negative_zero_keeps_its_sign_except_per_channel() {
        // torch keeps -0.0's sign through `x * s` and `.to(float8)`;
        // compressed-tensors adds its zero point (0) after the division,
        // which makes it +0.0. A negative value that rounds to zero in FP8
        // is -0.0 under every scheme.
        for work in [Dtype::F32, Dtype::F16, Dtype::BF16] {
            for (r, want) in [
                (Recipe::PerTensor, 0x80),
                (Recipe::PerChannel, 0x00),
                (Recipe::Block { rows: 1, cols: 1 }, 0x80),
            ] {
                let s = Scale::of(r, work, 1.0);
                assert_eq!(code(r, work, -0.0, &s), want, "{r:?} {work}");
                let tiny = round_to(work, -1e-7);
                assert_eq!(code(r, work, tiny, &s), 0x80, "{r:?} {work}");
            }
        }
    }

    #[test]
    fn quality_sums_add_up() {
        let mut q = QuantQuality::default();
        q.add(1.0, 0.5);
        q.add(-2.0, -2.0);
        q.add(f64::NAN, 0.0);
        assert_eq!(q.elements, 2);
        assert_eq!(q.not_finite, 1);
        assert_eq!(q.max_abs_error, 0.5);
        assert_eq!(q.relative_rms(), Some((0.25f64 / 5.0).sqrt()));
        assert!((q.snr_db().unwrap() - 10.0 * 20f64.log10()).abs() < 1e-12);
        assert_eq!(QuantQuality::default().relative_rms(), None);
    }
}
