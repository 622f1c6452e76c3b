//! Casting whole slices of elements between dtypes: which pairs have a
//! kernel ([`supports`]), one slice on this thread ([`cast_slice`]) and a
//! large one across rayon workers ([`cast_parallel`]).

use rayon::prelude::*;

use super::generic::elem_size;
use super::policy::{CastStats, OverflowPolicy, TARGETS};
use super::simd;
use crate::format::Dtype;

/// True when [`cast_slice`] has a kernel for `from` -> `to`: every pair
/// among F64, F32, F16, BF16 (a dtype to itself included), F8_E4M3 or
/// F8_E5M2 to any of those four, and any of those four to F8_E4M3 or
/// F8_E5M2 (the plain FP8 encoding of `--quantize fp8`, clamped to the
/// largest finite value whatever the policy; see `f8.rs`).
///
/// F8 to F8 is not a kernel: E4M3 -> E5M2 would round, and a plan never
/// asks for it.
pub fn supports(from: Dtype, to: Dtype) -> bool {
    let f8 = |d: Dtype| matches!(d, Dtype::F8_E4M3 | Dtype::F8_E5M2);
    (TARGETS.contains(&to) && (TARGETS.contains(&from) || f8(from)))
        || (TARGETS.contains(&from) && f8(to))
}

/// Casts whole elements from `input` (dtype `from`) into `output` (dtype
/// `to`), little-endian, slices of any alignment. With
/// [`OverflowPolicy::Error`] the output is as with `Inf` and the overflows
/// are counted for the caller to act on. F8 targets ignore the policy: they
/// always clamp to the largest finite value (torch's `clamp(-max,
/// max).to(float8_*)`) and count the clamped values, infinities included,
/// as `overflow`.
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
pub(super) const PARALLEL_CHUNK: usize = 1 << 20;

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
