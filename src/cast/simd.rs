//! Runtime dispatch of the cast kernels to an AVX-512 or AVX2 build of the
//! same code.
//!
//! This module owns the one place the cast stage uses `unsafe`: calling a
//! copy of [`super::generic::cast_generic`] compiled with `#[target_feature]` after
//! checking that the CPU has the features. The kernels are plain branchless
//! integer code; a default release build targets SSE2 (4 lanes), the AVX2
//! copy vectorizes the same loops 8 lanes wide and the AVX-512 copy 16
//! wide, with masked compares for the flags and one narrowing store
//! (`vpmovdw`) per 16 elements (f32 -> bf16 runs about twice as fast from
//! cache as on AVX2, `cargo bench --bench cast`). There are no intrinsics
//! here and no other precondition than the CPU features.
//!
//! [`vectorized`] does the same for any other loop of the cast stage (the
//! quantize kernels): a [`Vectorized`] job whose `run` is inlined into each
//! build.

#![allow(unsafe_code)]

use super::policy::CastStats;
use crate::format::Dtype;

/// [`super::generic::cast_generic`], on the widest vector unit this CPU has.
pub(super) fn cast_with<const SAT: bool>(
    from: Dtype,
    to: Dtype,
    i: &[u8],
    o: &mut [u8],
) -> CastStats {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
        {
            // SAFETY: `cast_avx512` only requires the AVX-512 F, BW and VL
            // instructions it was compiled for, and the CPU has just been
            // seen to support them.
            return unsafe { cast_avx512::<SAT>(from, to, i, o) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: `cast_avx2` only requires the AVX2 instructions it was
            // compiled for, and the CPU has just been seen to support them.
            return unsafe { cast_avx2::<SAT>(from, to, i, o) };
        }
    }
    super::generic::cast_generic::<SAT>(from, to, i, o)
}

/// The same code as [`super::generic::cast_generic`], compiled for AVX2.
///
/// # Safety
///
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn cast_avx2<const SAT: bool>(from: Dtype, to: Dtype, i: &[u8], o: &mut [u8]) -> CastStats {
    super::generic::cast_generic::<SAT>(from, to, i, o)
}

/// The same code as [`super::generic::cast_generic`], compiled for AVX-512 (F, BW,
/// VL): 16 lanes of 32 bits.
///
/// # Safety
///
/// The CPU must support AVX-512 F, BW and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn cast_avx512<const SAT: bool>(
    from: Dtype,
    to: Dtype,
    i: &[u8],
    o: &mut [u8],
) -> CastStats {
    super::generic::cast_generic::<SAT>(from, to, i, o)
}

/// A loop to run on the widest vector unit, by [`vectorized`]. Its `run`
/// must be `#[inline(always)]` (and so must what it calls), so that each
/// build compiles its own copy for its features.
pub(super) trait Vectorized {
    type Output;
    fn run(self) -> Self::Output;
}

/// Runs `job` compiled for the widest vector unit this CPU has (the same
/// code, so the same results: Rust never contracts or reorders float
/// arithmetic, whatever the features).
pub(super) fn vectorized<V: Vectorized>(job: V) -> V::Output {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
        {
            // SAFETY: `run_avx512` only requires the AVX-512 F, BW and VL
            // instructions it was compiled for, and the CPU has just been
            // seen to support them.
            return unsafe { run_avx512(job) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: `run_avx2` only requires AVX2, which the CPU has.
            return unsafe { run_avx2(job) };
        }
    }
    job.run()
}

/// `job.run()` compiled for AVX2.
///
/// # Safety
///
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn run_avx2<V: Vectorized>(job: V) -> V::Output {
    job.run()
}

/// `job.run()` compiled for AVX-512 (F, BW, VL).
///
/// # Safety
///
/// The CPU must support AVX-512 F, BW and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn run_avx512<V: Vectorized>(job: V) -> V::Output {
    job.run()
}

/// One build of [`vectorized`], by name.
#[cfg(test)]
pub(super) type VectorBuild<V> = (&'static str, fn(V) -> <V as Vectorized>::Output);

/// Every build of [`vectorized`] this CPU can run, for tests.
#[cfg(test)]
pub(super) fn vectorized_builds<V: Vectorized>() -> Vec<VectorBuild<V>> {
    let mut builds: Vec<VectorBuild<V>> = vec![("baseline", V::run)];
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: as in `vectorized`: the CPU has AVX2.
            builds.push(("avx2", |j| unsafe { run_avx2(j) }));
        }
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
        {
            // SAFETY: as in `vectorized`: the CPU has AVX-512 F, BW and VL.
            builds.push(("avx512", |j| unsafe { run_avx512(j) }));
        }
    }
    builds
}

/// A build of the kernels, as a plain function.
#[cfg(test)]
pub(super) type Build = fn(Dtype, Dtype, &[u8], &mut [u8]) -> CastStats;

/// Every build this CPU can run, by name, so tests can compare them: the
/// dispatch picks only the widest, which would leave the others untested.
#[cfg(test)]
pub(super) fn builds<const SAT: bool>() -> Vec<(&'static str, Build)> {
    let mut builds: Vec<(&'static str, Build)> =
        vec![("baseline", super::generic::cast_generic::<SAT>)];
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: as in `cast_with`: the CPU has AVX2.
            builds.push(("avx2", |f, t, i, o| unsafe { cast_avx2::<SAT>(f, t, i, o) }));
        }
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
        {
            // SAFETY: as in `cast_with`: the CPU has AVX-512 F, BW and VL.
            builds.push(("avx512", |f, t, i, o| unsafe {
                cast_avx512::<SAT>(f, t, i, o)
            }));
        }
    }
    builds
}
