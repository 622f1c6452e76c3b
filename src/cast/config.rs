//! The `config.json` side of a cast: torch's dtype names and the rewrite of
//! the dtype fields.
//!
//! This module owns which keys of a transformers config name the weights'
//! dtype (`torch_dtype` in transformers 4, `dtype` in transformers 5, at the
//! top level and in nested sub-configs such as `text_config`) and how they
//! are rewritten. It does not read or write files.

use super::CastError;
use crate::format::config::{parse_config, ConfigError};
use crate::format::json_edit;
use crate::format::Dtype;
use crate::quant::config::{is_dequantized_scheme, QUANT_KEYS};

/// torch's name for a dtype (`"bfloat16"` ...), `None` for dtypes torch has
/// no name for (F4 and the F6 types, which torch only knows packed).
pub fn torch_name(d: Dtype) -> Option<&'static str> {
    Some(match d {
        Dtype::BOOL => "bool",
        Dtype::U8 => "uint8",
        Dtype::I8 => "int8",
        Dtype::F8_E5M2 => "float8_e5m2",
        Dtype::F8_E4M3 => "float8_e4m3fn",
        Dtype::F8_E8M0 => "float8_e8m0fnu",
        Dtype::F8_E4M3FNUZ => "float8_e4m3fnuz",
        Dtype::F8_E5M2FNUZ => "float8_e5m2fnuz",
        Dtype::I16 => "int16",
        Dtype::U16 => "uint16",
        Dtype::F16 => "float16",
        Dtype::BF16 => "bfloat16",
        Dtype::I32 => "int32",
        Dtype::U32 => "uint32",
        Dtype::F32 => "float32",
        Dtype::F64 => "float64",
        Dtype::I64 => "int64",
        Dtype::U64 => "uint64",
        Dtype::C64 => "complex64",
        Dtype::F4 | Dtype::F6_E2M3 | Dtype::F6_E3M2 => return None,
    })
}

/// The keys that hold the weights' dtype.
const DTYPE_KEYS: [&str; 2] = ["torch_dtype", "dtype"];

/// Nested objects whose `dtype`-like keys mean something else (the compute
/// or storage dtype of a quantisation scheme) and are left alone.
const SKIP_NESTED: [&str; 2] = ["quantization_config", "compression_config"];

/// config.json rewrite when casting: set `torch_dtype` (transformers 4)
/// and/or `dtype` (transformers 5) to torch's name for `to`, updating
/// whichever are present and adding `dtype` if neither is; nested
/// sub-configs (`text_config`, `vision_config`, ...) get their existing
/// dtype keys updated, and the `quantization_config` of a scheme the cast
/// dequantizes is dropped. Every other byte stays as written (numbers past
/// u64, `1e-05`, the author's indentation: [`json_edit`]), with a trailing
/// newline.
pub fn rewrite_config_dtype(config_json: &str, to: Dtype) -> Result<String, CastError> {
    let name = match torch_name(to) {
        Some(name) if super::TARGETS.contains(&to) => name,
        _ => return Err(CastError::UnsupportedTarget { to }),
    };
    // The parse checks the text (valid, an object, within the budget) and
    // decides which quantization configs go; the edits are made on the text.
    let value = parse_config(config_json)?;
    let root = value
        .as_object()
        .expect("parse_config returns objects only");
    let scanned =
        |text: &str| json_edit::members(text).ok_or(CastError::Config(ConfigError::NotObject));
    let quoted = serde_json::to_string(name).expect("a string serializes");
    let mut edits = Vec::new();
    dtype_edits(&scanned(config_json)?, config_json, &quoted, &mut edits);
    let text = json_edit::splice(config_json, edits);
    // The weights are dense now: a loader that saw the config would expect
    // codes and scales.
    let dropped = |m: &json_edit::Member| {
        QUANT_KEYS.contains(&m.key.as_str()) && root.get(&m.key).is_some_and(is_dequantized_scheme)
    };
    let text = json_edit::without_members(&text, &scanned(&text)?, dropped);
    let members = scanned(&text)?;
    let mut out = match members.iter().any(|m| DTYPE_KEYS.contains(&m.key.as_str())) {
        true => text,
        false => json_edit::with_member(&text, &members, "dtype", &quoted),
    };
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

/// The value edits that set every dtype key of an object (`members` of
/// `text`) holding a string or null, recursing into nested objects (except
/// quantisation configs).
fn dtype_edits(
    members: &[json_edit::Member],
    text: &str,
    quoted: &str,
    edits: &mut Vec<(std::ops::Range<usize>, String)>,
) {
    for m in members {
        let value = &text[m.value.clone()];
        if DTYPE_KEYS.contains(&m.key.as_str()) && (value.starts_with('"') || value == "null") {
            edits.push((m.value.clone(), quoted.to_string()));
        } else if let Some(inner) = &m.object {
            if !SKIP_NESTED.contains(&m.key.as_str()) {
                dtype_edits(inner, text, quoted, edits);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn keys(json: &str) -> Vec<String> {
        let v: Value = serde_json::from_str(json).unwrap();
        v.as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn updates_torch_dtype_in_place_and_keeps_order() {
        let src = r#"{"zeta": 1, "torch_dtype": "float32", "alpha": [1, 2], "beta": 1e-05}"#;
        let out = rewrite_config_dtype(src, Dtype::BF16).unwrap();
        assert_eq!(keys(&out), ["zeta", "torch_dtype", "alpha", "beta"]);
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["torch_dtype"], "bfloat16");
        assert_eq!(v["beta"], 1e-05);
        assert_eq!(
            out,
            r#"{"zeta": 1, "torch_dtype": "bfloat16", "alpha": [1, 2], "beta": 1e-05}"#.to_string()
                + "\n",
            "every other byte as written"
        );
    }

    #[test]
    fn numbers_past_u64_and_the_authors_layout_survive() {
        let src = "{\n    \"big\": 123456789012345678901234567890,\n    \"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]},\n    \"rms_norm_eps\": 1e-05,\n    \"text_config\": {\"dtype\": null}\n}";
        let out = rewrite_config_dtype(src, Dtype::BF16).unwrap();
        assert_eq!(
            out,
            "{\n    \"big\": 123456789012345678901234567890,\n    \"rms_norm_eps\": 1e-05,\n    \"text_config\": {\"dtype\": \"bfloat16\"},\n    \"dtype\": \"bfloat16\"\n}\n"
        );
    }

    #[test]
    fn updates_both_keys_when_both_present() {
        let src = r#"{"dtype": "float32", "a": 1, "torch_dtype": "float32"}"#;
        let out = rewrite_config_dtype(src, Dtype::F16).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["dtype"], "float16");
        assert_eq!(v["torch_dtype"], "float16");
        assert_eq!(keys(&out), ["dtype", "a", "torch_dtype"]);
    }

    #[test]
    fn adds_dtype_at_the_end_when_absent() {
        let out = rewrite_config_dtype(r#"{"b": 1, "a": 2}"#, Dtype::F32).unwrap();
        assert_eq!(keys(&out), ["b", "a", "dtype"]);
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["dtype"], "float32");
    }

    #[test]
    fn rewrites_nested_sub_configs_but_not_quantization_config() {
        let src = r#"{
          "text_config": {"torch_dtype": "float32", "hidden_size": 8},
          "thinker_config": {"text_config": {"dtype": "float32"}},
          "vision_config": {"hidden_size": 4},
          "quantization_config": {"dtype": "float8"},
          "torch_dtype": "float32"
        }"#;
        let out = rewrite_config_dtype(src, Dtype::BF16).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["text_config"]["torch_dtype"], "bfloat16");
        assert_eq!(v["thinker_config"]["text_config"]["dtype"], "bfloat16");
        assert!(
            v["vision_config"].get("dtype").is_none(),
            "nested keys are not added"
        );
        assert_eq!(v["quantization_config"]["dtype"], "float8");
        assert!(v.get("dtype").is_none());
    }

    #[test]
    fn drops_the_quantization_config_of_schemes_it_dequantizes() {
        let fp8 = r#"{"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}, "torch_dtype": "bfloat16", "a": 1}"#;
        let v: Value =
            serde_json::from_str(&rewrite_config_dtype(fp8, Dtype::BF16).unwrap()).unwrap();
        assert!(v.get("quantization_config").is_none());
        assert_eq!(v["torch_dtype"], "bfloat16");
        assert_eq!(keys(&v.to_string()), ["torch_dtype", "a"]);
        let gptq = r#"{"quantization_config": {"quant_method": "gptq", "bits": 4}}"#;
        let v: Value =
            serde_json::from_str(&rewrite_config_dtype(gptq, Dtype::F16).unwrap()).unwrap();
        assert_eq!(
            v["quantization_config"]["bits"], 4,
            "not a scheme reshard dequantizes"
        );
        let ct = r#"{"quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized",
            "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}}}}"#;
        let v: Value =
            serde_json::from_str(&rewrite_config_dtype(ct, Dtype::F16).unwrap()).unwrap();
        assert!(v.get("quantization_config").is_none());
        let int8 = ct.replace("float-quantized", "int-quantized");
        assert!(!is_dequantized_scheme(
            &serde_json::from_str::<Value>(&int8).unwrap()["quantization_config"]
        ));
    }

    #[test]
    fn rejects_non_objects_and_bad_json() {
        assert!(matches!(
            rewrite_config_dtype("[1, 2]", Dtype::F16),
            Err(CastError::Config(ConfigError::NotObject))
        ));
        let err = rewrite_config_dtype("{", Dtype::F16).unwrap_err();
        assert!(matches!(err, CastError::Config(ConfigError::Json(_))));
        assert_eq!(err.to_string(), "config.json is not valid json");
    }

    #[test]
    fn configs_with_more_values_than_any_real_one_are_refused_before_parsing() {
        let huge = format!(
            "{{\"torch_dtype\": \"float32\", \"pad\": [{}]}}",
            "0,".repeat(300_000) + "0"
        );
        assert!(matches!(
            rewrite_config_dtype(&huge, Dtype::BF16),
            Err(CastError::Config(ConfigError::TooLarge { .. }))
        ));
        let labels: Vec<String> = (0..20_000)
            .map(|i| format!("\"{i}\": \"class {i}\""))
            .collect();
        let real = format!(
            "{{\"torch_dtype\": \"float32\", \"id2label\": {{{}}}}}",
            labels.join(", ")
        );
        assert!(rewrite_config_dtype(&real, Dtype::BF16).is_ok());
    }

    #[test]
    fn torch_names() {
        assert_eq!(torch_name(Dtype::BF16), Some("bfloat16"));
        assert_eq!(torch_name(Dtype::F16), Some("float16"));
        assert_eq!(torch_name(Dtype::F32), Some("float32"));
        assert_eq!(torch_name(Dtype::F64), Some("float64"));
        assert_eq!(torch_name(Dtype::F8_E4M3), Some("float8_e4m3fn"));
        assert_eq!(torch_name(Dtype::F4), None);
    }
}
