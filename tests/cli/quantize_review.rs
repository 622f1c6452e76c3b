//! Regressions of `convert --quantize` and `validate --against` found in
//! review (issue 26): values infinite in the working dtype follow
//! `--on-overflow`, -0.0 gets each reference's code, validate uses the
//! recorded `--quantize-only`, `--keep` and `--block` and requires every
//! companion, config and header entry; sources with unscaled FP8 weights
//! or stray companions are refused with advice that works, and a stale
//! `_quantization_metadata` is not carried over.

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

/// Rewrites `dst`'s single shard without the tensors in `drop` and the
/// `__metadata__` keys in `drop_meta`, with `add` appended, and removes
/// reshard.json (so only `--against` judges it).
fn rewrite(dst: &Path, drop: &[&str], drop_meta: &[&str], add: &[(&str, &str, Vec<u64>, Vec<u8>)]) {
    let shard = dst.join("model.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let old: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, v) in &old {
        if drop.contains(&name.as_str()) {
            continue;
        }
        if name == "__metadata__" {
            let mut meta = v.as_object().unwrap().clone();
            for k in drop_meta {
                meta.remove(*k);
            }
            header.insert(name.clone(), serde_json::Value::Object(meta));
            continue;
        }
        let [a, b] = [0, 1].map(|i| v["data_offsets"][i].as_u64().unwrap() as usize);
        let start = data.len();
        data.extend(&bytes[8 + n + a..8 + n + b]);
        header.insert(
            name.clone(),
            json!({"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [start, data.len()]}),
        );
    }
    for (name, dt, shape, b) in add {
        let start = data.len();
        data.extend(b);
        header.insert(
            name.to_string(),
            json!({"dtype": dt, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    write_safetensors(&shard, &serde_json::Value::Object(header), &data);
    let _ = std::fs::remove_file(dst.join("reshard.json"));
}

fn validate_against(dst: &Path, src: &Path) -> assert_cmd::assert::Assert {
    reshard()
        .arg("validate")
        .arg(dst)
        .arg("--against")
        .arg(src)
        .assert()
}

#[test]
fn validate_against_quantizes_again_with_the_recorded_options() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    // A Linear outside the blocks: quantized only when --quantize-only
    // names it.
    let outside: Vec<u8> = (0..32 * 64u32)
        .map(|i| ((((i % 17) as f32 - 8.0) / 8.0).to_bits() >> 16) as u16)
        .flat_map(u16::to_le_bytes)
        .collect();
    model(
        &src,
        "BF16",
        0.5,
        &[("proj_out.weight", "BF16", vec![32, 64], outside)],
    );
    let cases: [(&str, &[&str]); 5] = [
        ("fp8-channel", &["--quantize-only", "proj_out.*"]),
        (
            "fp8-scaled",
            &[
                "--quantize-only",
                "proj_out.*",
                "--quantize-only",
                "*.up_proj.*",
            ],
        ),
        ("fp8-scaled", &["--keep", "*.down_proj.*"]),
        ("fp8-block", &["--block", "4x8"]),
        (
            "fp8-block",
            &["--block", "4x8", "--quantize-only", "*.down_proj.*"],
        ),
    ];
    for (n, (scheme, flags)) in cases.iter().enumerate() {
        let dst = dir.path().join(format!("{scheme}-{n}"));
        let mut args = vec!["--quantize", scheme];
        args.extend(flags.iter());
        convert(&src, &dst, &args).success();
        let out = validate_against(&dst, &src).success();
        assert!(
            stdout_of(&out).contains("compared with the source quantized again"),
            "{scheme} {flags:?}: {}",
            stdout_of(&out)
        );
    }
}

#[test]
fn a_stray_comfy_quant_does_not_make_a_legacy_output_fp8_scaled() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    model(&src, "BF16", 0.5, &[]);
    let dst = dir.path().join("legacy");
    convert(&src, &dst, &["--quantize", "fp8-scaled-legacy"]).success();
    // The same stray tensor in the source and (passed through) the output.
    let stray = (
        "model.layers.0.input_layernorm.comfy_quant",
        "U8",
        vec![2],
        vec![b'{', b'}'],
    );
    let src2 = dir.path().join("src2");
    model(&src2, "BF16", 0.5, std::slice::from_ref(&stray));
    rewrite(&dst, &[], &[], &[stray]);
    // Read as legacy, every code and scale matches; the one problem is
    // that convert now refuses such a source.
    let out = stdout_of(&validate_against(&dst, &src2).code(1));
    assert!(out.contains("FAILED: 1 problem"), "{out}");
    assert!(
        out.contains("cannot be planned with --quantize fp8-scaled-legacy")
            && out.contains("beside no quantized weight"),
        "{out}"
    );
}

#[test]
fn validate_against_requires_every_companion_config_and_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    model(&src, "BF16", 0.5, &[]);
    let stem = "model.layers.0.mlp.up_proj";
    let comfy = format!("{stem}.comfy_quant");
    let cases: [(&str, &[&str], &[&str], &str); 3] = [
        ("fp8-scaled", &[comfy.as_str()], &[], comfy.as_str()),
        ("fp8-scaled-legacy", &["scaled_fp8"], &[], "scaled_fp8"),
        (
            "fp8-scaled",
            &[],
            &["_quantization_metadata"],
            "_quantization_metadata",
        ),
    ];
    for (n, (scheme, drop, drop_meta, says)) in cases.iter().enumerate() {
        let dst = dir.path().join(format!("{scheme}-{n}"));
        convert(&src, &dst, &["--quantize", scheme]).success();
        rewrite(&dst, drop, drop_meta, &[]);
        let out = stdout_of(&validate_against(&dst, &src).code(1));
        assert!(out.contains(says), "{scheme}: {out}");
    }
    // A quantization_config other than the plan's.
    let dst = dir.path().join("channel");
    convert(&src, &dst, &["--quantize", "fp8-channel"]).success();
    let path = dst.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["quantization_config"]["ignore"] = json!(["lm_head", "model.layers.0.mlp.up_proj"]);
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    std::fs::remove_file(dst.join("reshard.json")).unwrap();
    let out = stdout_of(&validate_against(&dst, &src).code(1));
    assert!(
        out.contains("config.json") && out.contains("quantization_config"),
        "{out}"
    );
}

#[test]
fn sources_with_unscaled_fp8_weights_or_stray_companions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fp8 = (
        "model.layers.0.self_attn.q_proj.weight",
        "F8_E4M3",
        vec![64, 32],
        vec![0x38; 2048],
    );
    let bf16 = [0x80u8, 0x3f].repeat(64);
    let scale = (
        "model.layers.0.mlp.up_proj.weight_scale",
        "BF16",
        vec![64, 1],
        bf16,
    );
    let comfy = (
        "model.layers.0.mlp.up_proj.comfy_quant",
        "U8",
        vec![2],
        b"{}".to_vec(),
    );
    let marker = ("scaled_fp8", "F8_E4M3", vec![0], Vec::new());
    let cases = [
        (fp8, "is already F8_E4M3 without a scale", &SCALED[..]),
        (
            scale,
            "beside no quantized weight",
            &["fp8", "fp8-channel", "fp8-scaled"][..],
        ),
        (
            comfy,
            "beside no quantized weight",
            &["fp8-scaled-legacy"][..],
        ),
        (marker, "beside no quantized weight", &["fp8-scaled"][..]),
    ];
    for (n, (extra, says, schemes)) in cases.into_iter().enumerate() {
        let src = dir.path().join(format!("src-{n}"));
        let name = extra.0;
        model(&src, "BF16", 0.5, &[extra]);
        for scheme in schemes {
            let dst = dir.path().join(format!("{scheme}-{n}"));
            let err = stderr_of(&convert(&src, &dst, &["--quantize", scheme]).code(2));
            assert!(
                err.contains("model.safetensors") && err.contains(name) && err.contains(says),
                "{scheme} {name}: {err}"
            );
            // Never the advice that cannot work for a dense weight.
            assert!(!err.contains("already quantized"), "{scheme} {name}: {err}");
            assert!(!dst.join("reshard.json").exists());
        }
    }
}

#[test]
fn a_stale_quantization_metadata_is_not_carried_into_a_quantized_output() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    model(&src, "BF16", 0.5, &[]);
    // The source's header claims a layer list of its own.
    let shard = src.join("model.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let stale =
        r#"{"format_version": "1.0", "layers": {"old.layer": {"format": "float8_e4m3fn"}}}"#;
    header["__metadata__"] = json!({"format": "pt", "_quantization_metadata": stale});
    write_safetensors(&shard, &header, &bytes[8 + n..]);
    for scheme in [
        "fp8",
        "fp8-scaled",
        "fp8-scaled-legacy",
        "fp8-channel",
        "fp8-block",
    ] {
        let dst = dir.path().join(scheme);
        convert(&src, &dst, &["--quantize", scheme]).success();
        let bytes = std::fs::read(dst.join("model.safetensors")).unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        let value = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get("_quantization_metadata").cloned());
        match scheme {
            "fp8-scaled" => {
                let v: serde_json::Value = serde_json::from_str(&value.unwrap()).unwrap();
                assert!(v["layers"].get("old.layer").is_none(), "{v}");
                assert!(
                    v["layers"].get("model.layers.0.mlp.up_proj").is_some(),
                    "{v}"
                );
            }
            _ => assert_eq!(value, None, "{scheme}"),
        }
        if scheme != "fp8" {
            validate_against(&dst, &src).success();
        }
    }
}

#[test]
fn quantizing_nothing_writes_no_quantization_config() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    model(&src, "BF16", 0.5, &[]);
    for scheme in ["fp8-channel", "fp8-block"] {
        let dst = dir.path().join(scheme);
        convert(&src, &dst, &["--quantize", scheme, "--keep", "*"]).success();
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dst.join("config.json")).unwrap()).unwrap();
        assert!(
            config.get("quantization_config").is_none(),
            "{scheme}: {config}"
        );
        let (dtype, _) = tensor_bytes(&dst, WEIGHT);
        assert_eq!(dtype, "BF16");
    }
}

#[test]
fn the_default_block_spelled_out_is_the_same_plan() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    model(&src, "BF16", 0.5, &[]);
    let id = |dst: &Path| -> serde_json::Value {
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dst.join("reshard.json")).unwrap()).unwrap();
        m["plan_id"].clone()
    };
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    convert(&src, &a, &["--quantize", "fp8-block"]).success();
    convert(&src, &b, &["--quantize", "fp8-block", "--block", "128x128"]).success();
    assert_eq!(id(&a), id(&b));
    assert!(id(&a).is_string());
}

#[test]
fn validate_against_compares_plain_fp8_outputs_with_their_quantization() {
    // A plain `--quantize fp8` output was refused as "F8_E4M3 but the
    // source's is BF16, which reshard does not cast".
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    model(&src, "BF16", 1000.0, &[]);
    for (scheme, dtype) in [("fp8", "F8_E4M3"), ("fp8-e5m2", "F8_E5M2")] {
        for single_file in [false, true] {
            let dst = match single_file {
                true => dir.path().join(format!("{scheme}.safetensors")),
                false => dir.path().join(scheme),
            };
            convert(&src, &dst, &["--quantize", scheme]).success();
            let out = stdout_of(&validate_against(&dst, &src).success());
            assert!(
                out.contains(&format!("2 of them compared with the source quantized again ({scheme}: codes, clamped and rounded, no scales)")),
                "{scheme}: {out}"
            );
            assert!(out.contains("relative RMS"), "{scheme}: {out}");
            // One code changed: validate names the weight and element.
            let shard = match single_file {
                true => dst.clone(),
                false => dst.join("model.safetensors"),
            };
            let bytes = std::fs::read(&shard).unwrap();
            let (_, codes) = if single_file {
                let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
                let t = st.tensor(WEIGHT).unwrap();
                assert_eq!(format!("{:?}", t.dtype()), dtype);
                (String::new(), t.data().to_vec())
            } else {
                tensor_bytes(&dst, WEIGHT)
            };
            let at = bytes
                .windows(codes.len())
                .position(|w| w == codes.as_slice())
                .unwrap()
                + 7;
            let mut bytes = bytes;
            bytes[at] ^= 0x01;
            std::fs::write(&shard, &bytes).unwrap();
            let _ = std::fs::remove_file(dst.join("reshard.json"));
            let out = stdout_of(&validate_against(&dst, &src).code(1));
            assert!(
                out.contains(WEIGHT) && out.contains(&format!("quantized to {dtype} at element 7")),
                "{scheme}: {out}"
            );
        }
    }
}

#[test]
fn a_null_quantization_config_is_replaced_not_refused() {
    // transformers writes `"quantization_config": null` for a model that
    // is not quantized; it was refused as "already has one".
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    model(&src, "BF16", 0.5, &[]);
    std::fs::write(
        src.join("config.json"),
        "{\n  \"model_type\": \"llama\",\n  \"quantization_config\": null,\n  \"rope_theta\": 500000.0\n}\n",
    )
    .unwrap();
    for scheme in ["fp8-channel", "fp8-block"] {
        let dst = dir.path().join(scheme);
        convert(&src, &dst, &["--quantize", scheme]).success();
        let text = std::fs::read_to_string(dst.join("config.json")).unwrap();
        assert_eq!(text.matches("quantization_config").count(), 1, "{text}");
        assert!(text.contains("\"rope_theta\": 500000.0"), "{text}");
        let config: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(config["quantization_config"].is_object(), "{text}");
        validate_against(&dst, &src).success();
    }
    // A real one is still refused.
    std::fs::write(
        src.join("config.json"),
        "{\"model_type\": \"llama\", \"quantization_config\": {\"quant_method\": \"fp8\"}}",
    )
    .unwrap();
    let dst = dir.path().join("again");
    let out = convert(&src, &dst, &["--quantize", "fp8-channel"]).code(2);
    assert!(stderr_of(&out).contains("already has a quantization_config"));
    assert!(!dst.exists());
}

#[test]
fn config_schemes_into_one_file_say_the_file_is_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    model(&src, "BF16", 0.5, &[]);
    for scheme in ["fp8-channel", "fp8-block"] {
        let dst = dir.path().join(format!("{scheme}.safetensors"));
        let out = convert(&src, &dst, &["--quantize", scheme]).code(2);
        let err = stderr_of(&out);
        assert!(
            err.contains("a DST ending in .safetensors holds the weights only")
                && err.contains("name a folder as DST")
                && !err.contains("not part of the source"),
            "{scheme}: {err}"
        );
        assert!(!dst.exists());
        assert!(!dir
            .path()
            .join(format!(".{scheme}.safetensors.reshard"))
            .exists());
    }
}

#[test]
fn quantizing_nothing_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    model(&src, "BF16", 0.5, &[]);
    let warning = "warning: --quantize fp8-scaled quantizes no weight";
    let dst = dir.path().join("dry");
    let out = convert(
        &src,
        &dst,
        &["--quantize", "fp8-scaled", "--keep", "*", "--dry-run"],
    );
    assert!(stdout_of(&out.success()).contains(warning));
    let dst = dir.path().join("out");
    let out = convert(&src, &dst, &["--quantize", "fp8-scaled", "--keep", "*"]).success();
    assert!(stderr_of(&out).contains(warning), "{}", stderr_of(&out));
    let out = convert(
        &src,
        &dir.path().join("some"),
        &["--quantize", "fp8-scaled"],
    )
    .success();
    assert!(!stderr_of(&out).contains("warning:"), "{}", stderr_of(&out));
}
