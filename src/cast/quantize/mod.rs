//! The quantize stage: dense weights to scaled FP8 (`--quantize
//! fp8-scaled`, `fp8-scaled-legacy`, `fp8-channel`, `fp8-block`), streamed
//! chunk by chunk, each scheme bit for bit as its reference quantizer.
//!
//! This module owns the arithmetic ([`recipe`]: how a scale is derived
//! from a block's absmax and how codes are made with it, and the error
//! figures of the quality report) and the streaming of one weight's codes
//! or scales ([`QuantizeStream`]), the scales one stream of a weight derived
//! kept for the other ([`ScaleMemo`]). Which tensors are quantized, and under
//! which names their scales are written, is the planner's
//! (`crate::plan::quantize`). Plain scale-free FP8 (`--quantize fp8`) is a
//! cast ([`super::f8`]).

mod memo;
mod recipe;
mod report;
mod stream;

pub use self::memo::{MemoKey, ScaleMemo, MEMO_SCALES};

pub use self::recipe::{
    code, dequantized, round_to, working_dtype, QuantQuality, Recipe, Scale, E4M3_MAX,
};
pub use self::report::{QualityReport, TensorQuality, WORST};
pub use self::stream::{Part, QuantizeStream, MAX_ROW_SCALES};
