//! Fit: will a checkpoint load on a given machine with a given loader, and
//! what conversion would make it?
//!
//! This module compares each loader's predicted peaks ([`loader`]) with the
//! machine's budget ([`machine`]) for the checkpoint as it is, for a
//! what-if conversion, and for a few candidate conversions it searches to
//! recommend one. It reads headers only (through the [`Checkpoint`] and the
//! [`Plan`]s it builds), except for the error estimate of `fit --for`,
//! which quantizes a small sample of the weights ([`sample`]); it returns
//! plain reports and never prints.

mod conversion;
pub mod device_map;
mod judge;
pub mod loader;
pub mod machine;
pub mod make;
pub mod program;
mod rows;
pub mod sample;

pub use self::judge::*;
pub use self::loader::{DEFAULT_BASELINE, DEFAULT_CUDA_OVERHEAD, DEFAULT_WINDOW};
