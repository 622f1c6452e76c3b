//! Quantization, one home for both directions: which scheme a checkpoint
//! uses and which scale belongs to which weight ([`detect`]), what a
//! quantization config says ([`config`]), and the plan data of a quantized
//! weight ([`scheme`]).
//!
//! It sits after `format` (it reads headers and small config files through
//! it) and before `cast` and `plan`, which use its data. It does no
//! arithmetic: the kernels that decode and encode codes are
//! [`crate::cast::dequant`]'s.

pub(crate) mod config;
pub(crate) mod detect;
pub(crate) mod error;
pub(crate) mod scheme;

pub use self::detect::{detect, QuantError, QuantFormat, QuantWeight, Quantization};
pub use self::scheme::Scheme;
