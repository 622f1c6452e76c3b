//! The dtype-cast stage: which tensors change dtype, and the kernels that
//! change them.
//!
//! This module owns the cast policy ([`target_for`], [`OverflowPolicy`]), the
//! byte-slice casts the executor calls per tensor or per chunk
//! ([`cast_slice`], [`cast_parallel`]) and the `config.json` rewrite that goes
//! with a cast ([`rewrite_config_dtype`]). It does not read files, choose
//! which tensors to keep (that is `--keep-dtype`, resolved by the planner), or
//! fail tensors: it counts overflows and the executor decides, building
//! [`CastError::Overflow`] with the tensor's name.
//!
//! Rules, bit for bit as torch's `Tensor.to`: narrowing rounds to nearest,
//! ties to even; NaN stays NaN; infinities and signed zeros are kept;
//! subnormals are exact both ways; widening is exact.
//!
//! ```
//! use reshard::cast::{cast_slice, OverflowPolicy};
//! use reshard::format::Dtype;
//!
//! let input: Vec<u8> = [1.0f32, 70000.0].iter().flat_map(|v| v.to_le_bytes()).collect();
//! let mut out = vec![0u8; 4];
//! let stats = cast_slice(Dtype::F32, Dtype::F16, &input, &mut out, OverflowPolicy::Saturate);
//! assert_eq!(out, [0x00, 0x3c, 0xff, 0x7b]); // 1.0, 65504
//! assert_eq!(stats.overflow, 1);
//! ```

mod config;
pub mod dequant;
mod f8;
pub mod gguf;
mod kernels;
mod simd;
#[cfg(test)]
mod tests;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::format::Dtype;
use kernels::{drive, then};

pub use config::{
    is_compressed_fp8, is_dequantized_scheme, parse_config, rewrite_config_dtype, torch_name,
    MAX_CONFIG,
};

/// What to do with finite values too large for the target dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OverflowPolicy {
    /// Write infinity (as torch does), count it, and let the caller fail the
    /// tensor.
    #[default]
    Error,
    /// Write the largest finite value of the target, with the input's sign.
    Saturate,
    /// Write infinity with the input's sign, as torch does.
    Inf,
}

/// Counts for one tensor (or one chunk; they add up with `+=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CastStats {
    /// Finite inputs whose rounded value exceeds the target's largest finite
    /// value (written as infinity, or saturated).
    pub overflow: u64,
    /// Non-zero finite inputs that became zero.
    pub underflow: u64,
    /// NaN inputs.
    pub nan: u64,
}

impl std::ops::AddAssign for CastStats {
    fn add_assign(&mut self, rhs: CastStats) {
        self.overflow += rhs.overflow;
        self.underflow += rhs.underflow;
        self.nan += rhs.nan;
    }
}

/// Errors of the cast stage.
#[derive(Debug, thiserror::Error)]
pub enum CastError {
    /// The requested dtype is not one reshard casts to.
    #[error("casting to {to}{} is not supported; choose bf16, f16, f32 or f64", needs_scales(*.to))]
    UnsupportedTarget { to: Dtype },
    /// [`cast_slice`] has no kernel for this pair.
    #[error("casting {from} to {to} is not supported")]
    UnsupportedPair { from: Dtype, to: Dtype },
    /// A tensor had finite values too large for the target and the policy
    /// was [`OverflowPolicy::Error`]. Built by the executor from
    /// [`CastStats::overflow`].
    #[error(
        "tensor {tensor:?}: {count} {from} {} {to} (largest finite {to} is {}); use --on-overflow saturate or inf",
        if *.count == 1 { "value overflows" } else { "values overflow" },
        max_finite_text(*.to)
    )]
    Overflow {
        tensor: String,
        from: Dtype,
        to: Dtype,
        count: u64,
    },
    /// `config.json` did not parse.
    #[error("config.json is not valid json")]
    ConfigJson(#[source] serde_json::Error),
    /// `config.json` parsed, but is not a JSON object.
    #[error("config.json is not a json object")]
    ConfigNotObject,
    /// `config.json` holds more values than any real config.
    #[error("config.json holds more than {max} json values; no real config has that many")]
    ConfigTooLarge { max: usize },
}

fn needs_scales(to: Dtype) -> &'static str {
    if to.is_float() && to.bits() <= 8 {
        " needs scales and"
    } else {
        ""
    }
}

fn max_finite_text(d: Dtype) -> &'static str {
    match d {
        Dtype::F16 => "65504",
        Dtype::BF16 => "3.3895e38",
        Dtype::F32 => "3.4028e38",
        Dtype::F64 => "1.7977e308",
        _ => "unknown",
    }
}

/// The dtypes reshard casts to.
pub const TARGETS: [Dtype; 4] = [Dtype::F64, Dtype::F32, Dtype::F16, Dtype::BF16];

/// The dtype a tensor of dtype `from` is written as when the user asked for `to`:
/// `Ok(None)` = written unchanged (integers, BOOL, C64, already `to`, and
/// quantisation payloads F8_E8M0 / F8_*FNUZ / F4 / F6_* which are kept as
/// they are), `Ok(Some(to))` = cast. Err for a target that is not one of
/// F64, F32, F16, BF16.
///
/// Whenever this returns `Ok(Some(to))`, [`supports`]`(from, to)` is true.
pub fn target_for(from: Dtype, to: Dtype) -> Result<Option<Dtype>, CastError> {
    if !TARGETS.contains(&to) {
        return Err(CastError::UnsupportedTarget { to });
    }
    if from == to {
        return Ok(None);
    }
    Ok(match from {
        Dtype::F64 | Dtype::F32 | Dtype::F16 | Dtype::BF16 | Dtype::F8_E4M3 | Dtype::F8_E5M2 => {
            Some(to)
        }
        _ => None,
    })
}

/// True when [`cast_slice`] has a kernel for `from` -> `to`: every pair
/// among F64, F32, F16, BF16 (a dtype to itself included), and F8_E4M3 or
/// F8_E5M2 to any of those four.
pub fn supports(from: Dtype, to: Dtype) -> bool {
    TARGETS.contains(&to)
        && (TARGETS.contains(&from) || matches!(from, Dtype::F8_E4M3 | Dtype::F8_E5M2))
}

/// Casts whole elements from `input` (dtype `from`) into `output` (dtype
/// `to`), little-endian, slices of any alignment. With
/// [`OverflowPolicy::Error`] the output is as with `Inf` and the overflows
/// are counted for the caller to act on.
///
/// # Panics
///
/// When the pair is not [`supports`]ed, when `input.len()` is not a multiple
/// of `from`'s element size, or when `output.len()` is not the same number of
/// `to` elements. These are caller bugs, not properties of the input data.
pub fn cast_slice(
    from: Dtype,
    to: Dtype,
    input: &[u8],
    output: &mut [u8],
    policy: OverflowPolicy,
) -> CastStats {
    assert!(supports(from, to), "cast_slice: cannot cast {from} to {to}");
    let (isz, osz) = (elem_size(from), elem_size(to));
    assert!(
        input.len().is_multiple_of(isz) && output.len() == input.len() / isz * osz,
        "cast_slice: {} bytes of {from} do not fill {} bytes of {to}",
        input.len(),
        output.len()
    );
    match policy {
        OverflowPolicy::Saturate => simd::cast_with::<true>(from, to, input, output),
        OverflowPolicy::Error | OverflowPolicy::Inf => {
            simd::cast_with::<false>(from, to, input, output)
        }
    }
}

/// Input bytes per rayon task in [`cast_parallel`].
const PARALLEL_CHUNK: usize = 1 << 20;

/// [`cast_slice`] split across rayon workers in chunks of 1 MiB of input,
/// stats summed. Same contract and panics as [`cast_slice`].
pub fn cast_parallel(
    from: Dtype,
    to: Dtype,
    input: &[u8],
    output: &mut [u8],
    policy: OverflowPolicy,
) -> CastStats {
    assert!(
        supports(from, to),
        "cast_parallel: cannot cast {from} to {to}"
    );
    let (isz, osz) = (elem_size(from), elem_size(to));
    let elems = PARALLEL_CHUNK / isz;
    if input.len() <= PARALLEL_CHUNK {
        return cast_slice(from, to, input, output, policy);
    }
    input
        .par_chunks(elems * isz)
        .zip(output.par_chunks_mut(elems * osz))
        .map(|(i, o)| cast_slice(from, to, i, o, policy))
        .reduce(CastStats::default, |mut a, b| {
            a += b;
            a
        })
}

/// Bytes per element of a dtype [`cast_slice`] handles (all whole bytes).
fn elem_size(d: Dtype) -> usize {
    (d.bits() / 8).max(1) as usize
}

/// The kernel table. `SAT` selects saturation; the caller checked the pair.
/// Inlined into each of `simd`'s builds (baseline and AVX2).
#[inline(always)]
fn cast_generic<const SAT: bool>(from: Dtype, to: Dtype, i: &[u8], o: &mut [u8]) -> CastStats {
    use kernels as k;
    use Dtype::*;
    match (from, to) {
        (F32, BF16) => drive(i, o, k::f32_to_bf16::<SAT>),
        (F32, F16) => drive(i, o, k::f32_to_f16::<SAT>),
        (F32, F64) => drive(i, o, k::f32_to_f64),
        (F64, F32) => drive(i, o, k::f64_to_f32::<SAT>),
        (F64, F16) => drive(i, o, k::f64_to_f16::<SAT>),
        (F64, BF16) => drive(i, o, k::f64_to_bf16::<SAT>),
        (F16, F32) => drive(i, o, k::f16_to_f32),
        (F16, F64) => drive(i, o, then(k::f16_to_f32, k::f32_to_f64)),
        (F16, BF16) => drive(i, o, then(k::f16_to_f32, k::f32_to_bf16::<SAT>)),
        (BF16, F32) => drive(i, o, k::bf16_to_f32),
        (BF16, F64) => drive(i, o, then(k::bf16_to_f32, k::f32_to_f64)),
        (BF16, F16) => drive(i, o, then(k::bf16_to_f32, k::f32_to_f16::<SAT>)),
        (F16, F16) => drive(i, o, k::same_f16),
        (BF16, BF16) => drive(i, o, k::same_bf16),
        (F32, F32) => drive(i, o, k::same_f32),
        (F64, F64) => drive(i, o, k::same_f64),
        (F8_E4M3 | F8_E5M2, _) => cast_f8(from, to, i, o),
        _ => unreachable!("cast_slice checked the pair {from} -> {to}"),
    }
}

/// F8 sources: decode through a 256-entry table of target bits (exact).
#[inline(always)]
fn cast_f8(from: Dtype, to: Dtype, i: &[u8], o: &mut [u8]) -> CastStats {
    use kernels as k;
    let decode = if from == Dtype::F8_E4M3 {
        f8::e4m3_to_f32
    } else {
        f8::e5m2_to_f32
    };
    match to {
        Dtype::F32 => {
            let t = f8::Table::new(decode, k::same_f32);
            drive(i, o, |b: u8| t.lookup(b))
        }
        Dtype::F64 => {
            let t = f8::Table::new(decode, k::f32_to_f64);
            drive(i, o, |b: u8| t.lookup(b))
        }
        Dtype::F16 => {
            let t = f8::Table::new(decode, k::f32_to_f16::<false>);
            drive(i, o, |b: u8| t.lookup(b))
        }
        _ => {
            let t = f8::Table::new(decode, k::f32_to_bf16::<false>);
            drive(i, o, |b: u8| t.lookup(b))
        }
    }
}
