//! Runtime dispatch of the cast kernels to an AVX2 build of the same code.
//!
//! This module owns the one place the cast stage uses `unsafe`: calling a
//! copy of [`super::cast_generic`] compiled with `#[target_feature(enable =
//! "avx2")]` after checking that the CPU has AVX2. The kernels are plain
//! branchless integer code; a default release build targets SSE2 (4 lanes),
//! the AVX2 copy vectorizes the same loops 8 lanes wide. There are no
//! intrinsics here and no other precondition than the CPU feature.

#![allow(unsafe_code)]

use super::CastStats;
use crate::format::Dtype;

/// [`super::cast_generic`], on the widest vector unit this CPU has.
pub(super) fn cast_with<const SAT: bool>(
    from: Dtype,
    to: Dtype,
    i: &[u8],
    o: &mut [u8],
) -> CastStats {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: `cast_avx2` only requires the AVX2 instructions it was
            // compiled for, and the CPU has just been seen to support them.
            return unsafe { cast_avx2::<SAT>(from, to, i, o) };
        }
    }
    super::cast_generic::<SAT>(from, to, i, o)
}

/// The same code as [`super::cast_generic`], compiled for AVX2.
///
/// # Safety
///
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn cast_avx2<const SAT: bool>(from: Dtype, to: Dtype, i: &[u8], o: &mut [u8]) -> CastStats {
    super::cast_generic::<SAT>(from, to, i, o)
}
