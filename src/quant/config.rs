//! What a quantization config says: which schemes `convert --dtype`
//! dequantizes (and so removes from a dense output's `config.json`), and
//! the keys such a config sits under. Reading the file is
//! [`crate::format::config`]'s.

use serde_json::Value;

/// The keys a quantization config may sit under.
pub const QUANT_KEYS: [&str; 2] = ["quantization_config", "compression_config"];

/// Whether a `quantization_config` names a scheme that `convert --dtype`
/// dequantizes (see [`super::detect`]): FP8 (`fp8`, compressed-tensors
/// float 8-bit, ModelOpt `FP8`) and `mxfp4`. Those configs are removed from a
/// dequantized output; any other (GPTQ, AWQ, bitsandbytes, ...) is kept.
pub fn is_dequantized_scheme(qc: &Value) -> bool {
    let method = qc.get("quant_method").and_then(Value::as_str).unwrap_or("");
    match method.to_ascii_lowercase().as_str() {
        "fp8" | "mxfp4" => true,
        "modelopt" => qc
            .get("quant_algo")
            .and_then(Value::as_str)
            .is_some_and(|a| a.eq_ignore_ascii_case("fp8")),
        "compressed-tensors" => is_compressed_fp8(qc),
        _ => false,
    }
}

/// A compressed-tensors config of FP8 weights (`float-quantized` or
/// `naive-quantized`, 8-bit float weights).
pub fn is_compressed_fp8(qc: &Value) -> bool {
    let format = qc.get("format").and_then(Value::as_str).unwrap_or("");
    let float_weights = qc
        .get("config_groups")
        .and_then(Value::as_object)
        .is_some_and(|groups| {
            groups.values().any(|g| {
                let w = g.get("weights");
                w.and_then(|w| w.get("type")).and_then(Value::as_str) == Some("float")
                    && w.and_then(|w| w.get("num_bits")).and_then(Value::as_u64) == Some(8)
            })
        });
    matches!(format, "float-quantized" | "naive-quantized") && float_weights
}
