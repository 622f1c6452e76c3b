//! The cast policy and its bookkeeping: what happens to values too large
//! for the target ([`OverflowPolicy`]), the counts a cast keeps
//! ([`CastStats`]), the dense targets ([`TARGETS`]) and why a cast is
//! refused ([`CastError`]).

use serde::{Deserialize, Serialize};

use crate::format::Dtype;

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
    /// value (written as infinity, or saturated). For the F8 targets: the
    /// inputs the clamp changed (beyond ±448 or ±57344, infinities
    /// included), which are saturated under every policy.
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
    /// `config.json` could not be read as a config.
    #[error(transparent)]
    Config(#[from] crate::format::config::ConfigError),
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
        Dtype::F8_E4M3 => "448",
        Dtype::F8_E5M2 => "57344",
        _ => "unknown",
    }
}

/// The dtypes reshard casts to.
pub const TARGETS: [Dtype; 4] = [Dtype::F64, Dtype::F32, Dtype::F16, Dtype::BF16];
