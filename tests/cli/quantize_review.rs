//! Regressions of `convert --quantize` and `validate --against` found in
//! review (issue 26): values infinite in the working dtype follow
//! `--on-overflow`, -0.0 gets each reference's code, validate uses the
//! recorded `--quantize-only`, `--keep` and `--block`, and sources that
//! already carry quantization companions are refused with advice that works.

use std::path::Path;

use serde_json::json;

use crate::common::*;

const SCALED: [&str; 4] = [
    "fp8-scaled",
    "fp8-scaled-legacy",
    "fp8-channel",
    "fp8-block",
];

const WEIGHT: &str = "model.layers.0.mlp.up_proj.weight";

fn stderr_of(out: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&out.get_output().stderr).into_owned()
}

fn stdout_of(out: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&out.get_output().stdout).into_owned()
}

/// A one-layer model folder of `dtype` ("BF16", "F32", "F64"): `WEIGHT`
/// `[64, 32]` whose element 5 is `special` (the others small values), a
/// second Linear weight and a norm. `extra` adds tensors (name, dtype,
/// shape, bytes).
fn model(dir: &Path, dtype: &str, special: f64, extra: &[(&str, &str, Vec<u64>, Vec<u8>)]) {
    std::fs::create_dir_all(dir).unwrap();
    let encode = |v: f64| -> Vec<u8> {
        match dtype {
            "BF16" => (((v as f32).to_bits() >> 16) as u16).to_le_bytes().to_vec(),
            "F32" => (v as f32).to_le_bytes().to_vec(),
            _ => v.to_le_bytes().to_vec(),
        }
    };
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    let tensors: [(&str, [u64; 2]); 3] = [
        (WEIGHT, [64, 32]),
        ("model.layers.0.mlp.down_proj.weight", [32, 64]),
        ("model.layers.0.input_layernorm.weight", [1, 32]),
    ];
    let mut seed = 3u32;
    for (name, shape) in tensors {
        let start = data.len();
        for i in 0..shape[0] * shape[1] {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let v = ((seed >> 8) as f64 / f64::from(1u32 << 24) - 0.5) * 2.0;
            let v = if name == WEIGHT && i == 5 { special } else { v };
            data.extend(encode(v));
        }
        header.insert(
            name.into(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    for (name, dt, shape, bytes) in extra {
        let start = data.len();
        data.extend(bytes);
        header.insert(
            name.to_string(),
            json!({"dtype": dt, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    write_safetensors(
        &dir.join("model.safetensors"),
        &serde_json::Value::Object(header),
        &data,
    );
    std::fs::write(dir.join("config.json"), "{\"model_type\": \"llama\"}\n").unwrap();
}

/// The bytes of `tensor` in `dst`'s single shard.
fn tensor_bytes(dst: &Path, tensor: &str) -> (String, Vec<u8>) {
    let bytes = std::fs::read(dst.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(tensor).unwrap();
    (format!("{:?}", t.dtype()), t.data().to_vec())
}

#[test]
fn values_infinite_in_the_working_dtype_follow_on_overflow() {
    let dir = tempfile::tempdir().unwrap();
    // An inf in bf16, a finite bf16 value past f16 under --dtype f16, and
    // an f64 value past f32 (the working dtype of f64).
    let cases: [(&str, f64, &[&str]); 3] = [
        ("BF16", f64::INFINITY, &[]),
        ("BF16", 70000.0, &["--dtype", "f16"]),
        ("F64", 1e300, &[]),
    ];
    for (n, (dtype, special, flags)) in cases.iter().enumerate() {
        let src = dir.path().join(format!("src-{n}"));
        model(&src, dtype, *special, &[]);
        for scheme in SCALED {
            let dst = dir.path().join(format!("{scheme}-{n}"));
            let mut args = vec!["--quantize", scheme];
            args.extend(flags.iter());
            let err = stderr_of(&convert(&src, &dst, &args).code(2));
            assert!(
                err.contains("model.safetensors") && err.contains(WEIGHT),
                "{scheme} {n}: {err}"
            );
            assert!(err.contains("--on-overflow"), "{scheme} {n}: {err}");
            assert!(!dst.join("reshard.json").exists(), "{scheme} {n}");
            for policy in ["saturate", "inf"] {
                let dst = dir.path().join(format!("{scheme}-{n}-{policy}"));
                let mut args = args.clone();
                args.extend(["--on-overflow", policy]);
                let out = stdout_of(&convert(&src, &dst, &args).success());
                let (dt, codes) = tensor_bytes(&dst, WEIGHT);
                assert_eq!(dt, "F8_E4M3");
                // The value clamps to the largest code; no code is NaN and
                // the rest of its row or block still carries its values.
                let sign = if *special < 0.0 { 0x80 } else { 0 };
                assert_eq!(codes[5], 0x7e | sign, "{scheme} {n} {policy}");
                assert!(
                    codes.iter().all(|&c| c & 0x7f != 0x7f),
                    "{scheme} {n} {policy}: NaN codes"
                );
                let zeros = codes[..32].iter().filter(|&&c| c & 0x7f == 0).count();
                assert!(zeros < 8, "{scheme} {n} {policy}: row 0 is {zeros} zeros");
                if special.is_infinite() {
                    assert!(out.contains("1 not finite"), "{scheme} {n}: {out}");
                }
                assert!(!out.contains("all zeros"), "{scheme} {n}: {out}");
                let mut validate = reshard();
                validate
                    .arg("validate")
                    .arg(&dst)
                    .arg("--against")
                    .arg(&src);
                validate.assert().success();
            }
        }
    }
}

#[test]
fn negative_zero_gets_each_references_code() {
    // compressed-tensors adds its zero point after dividing, so -0.0 is
    // code 0x00 there; comfy-kitchen and transformers keep 0x80 (checked
    // against the references themselves in quantize_scaled.rs).
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    model(&src, "BF16", -0.0, &[]);
    for (scheme, want) in [
        ("fp8-scaled", 0x80u8),
        ("fp8-scaled-legacy", 0x80),
        ("fp8-channel", 0x00),
        ("fp8-block", 0x80),
        ("fp8", 0x80),
    ] {
        let dst = dir.path().join(scheme);
        convert(&src, &dst, &["--quantize", scheme]).success();
        let (_, codes) = tensor_bytes(&dst, WEIGHT);
        assert_eq!(codes[5], want, "{scheme}");
    }
}
