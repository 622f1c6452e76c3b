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
//! The plain FP8 targets F8_E4M3 and F8_E5M2 (`--quantize fp8` and
//! `fp8-e5m2`, chosen by the planner, never by [`target_for`]) follow
//! torch's `x.clamp(-max, max).to(float8_*)` instead: out-of-range values
//! and infinities saturate whatever the policy and are counted as
//! `overflow`; NaN stays NaN with its sign.
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
mod generic;
pub mod gguf;
mod kernels;
mod policy;
pub mod quantize;
mod simd;
mod slice;
#[cfg(test)]
mod tests;

use crate::format::Dtype;

pub use config::{rewrite_config_dtype, torch_name};
pub use policy::{CastError, CastStats, OverflowPolicy, TARGETS};
pub use slice::{cast_parallel, cast_slice, supports};

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
