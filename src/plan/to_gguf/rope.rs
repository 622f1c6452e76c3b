//! Llama 3 rope scaling: the `rope_freqs.weight` factors that
//! `LlamaModel.generate_extra_tensors` computes from `rope_parameters`,
//! one per rotary frequency.
//!
//! The converter computes in torch float32 with Python floats as scalars;
//! this follows it operation by operation (each a rounded f32 operation,
//! `a / t` as torch's `t.reciprocal() * a`, the Python scalars rounded to
//! f32 where they meet a tensor) so the factors come out as its bits.

use serde_json::Value as Json;

use super::error::ToGgufError;
use super::hparams::{bad, to_f32, Arch, Hparams};

/// The factors, or `None` when the model has no Llama 3 rope scaling.
pub(super) fn llama3_factors(hp: &Hparams) -> Result<Option<Vec<f32>>, ToGgufError> {
    if hp.arch != Arch::Llama {
        return Ok(None);
    }
    let rp = hp.rope_parameters();
    let params = match rp.get("full_attention") {
        Some(Json::Object(m)) => m.clone(),
        _ => rp,
    };
    let is_llama3 = params
        .get("rope_type")
        .and_then(Json::as_str)
        .is_some_and(|t| t.eq_ignore_ascii_case("llama3"));
    if params.is_empty() || !is_llama3 {
        return Ok(None);
    }
    let num = |k: &str, default: f64| -> Result<f64, ToGgufError> {
        match params.get(k).filter(|v| !v.is_null()) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| bad(k, format!("{v} is not a number"))),
        }
    };
    let base = num("rope_theta", 10000.0)?;
    let dim = hp.head_dim()?;
    if dim == 0 {
        return Err(bad("head_dim", "is 0".into()));
    }
    let factor = num("factor", 8.0)?;
    let low = num("low_freq_factor", 1.0)?;
    let high = num("high_freq_factor", 4.0)?;
    let old = num("original_max_position_embeddings", 8192.0)?;
    // A non-finite factor would be written as is; refuse it instead.
    to_f32("factor", &serde_json::json!(factor))?;
    Ok(Some(factors(base, dim, factor, low, high, old)))
}

/// `rope_factors` of the converter, element by element.
fn factors(base: f64, dim: u32, factor: f64, low: f64, high: f64, old: f64) -> Vec<f32> {
    let low_wavelen = old / low;
    let high_wavelen = old / high;
    let two_pi = (2.0 * std::f64::consts::PI) as f32;
    (0..dim)
        .step_by(2)
        .map(|k| {
            // torch.arange(0, dim, 2, dtype=float32) / dim, then base ** that.
            let exponent = k as f32 / dim as f32;
            let freq = 1.0 / (base as f32).powf(exponent);
            let wavelen = (1.0 / freq) * two_pi;
            if wavelen < high_wavelen as f32 {
                1.0
            } else if wavelen > low_wavelen as f32 {
                factor as f32
            } else {
                let smooth = ((1.0 / wavelen) * old as f32 - low as f32) / (high - low) as f32;
                1.0 / ((1.0 - smooth) / factor as f32 + smooth)
            }
        })
        .collect()
}
