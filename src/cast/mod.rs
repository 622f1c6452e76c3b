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
mod generic;
pub mod gguf;
mod kernels;
mod policy;
mod simd;
#[cfg(test)]
mod tests;

use rayon::prelude::*;

use crate::format::Dtype;

pub use config::{rewrite_config_dtype, torch_name};
use generic::elem_size;
pub use policy::{CastError, CastStats, OverflowPolicy, TARGETS};

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
