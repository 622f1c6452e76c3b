//! `convert --quantize fp8-scaled|fp8-scaled-legacy|fp8-channel|fp8-block`:
//! codes and scales byte-identical to each scheme's reference quantizer
//! (comfy-kitchen, compressed-tensors, transformers: tests/cli/
//! quantize_oracle.py), outputs that load in those libraries exactly as
//! reshard dequantizes them, `validate --against` that recomputes them and
//! fails on one flipped byte, and the all-zero weight case.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::common::*;

const SCHEMES: [&str; 4] = [
    "fp8-scaled",
    "fp8-scaled-legacy",
    "fp8-channel",
    "fp8-block",
];

fn oracle_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cli/quantize_oracle.py")
}

fn oracle_python() -> Option<PathBuf> {
    python_with("torch, transformers, comfy_kitchen, compressed_tensors")
}

/// Runs the oracle script with `args`; its JSON summary.
fn oracle(python: &Path, args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let out = run_python(python, Program::Script(&oracle_script()), args);
    serde_json::from_str(out.lines().last().unwrap_or("")).unwrap()
}

fn validate_against(dst: &Path, src: &Path) -> assert_cmd::assert::Assert {
    reshard()
        .arg("validate")
        .arg(dst)
        .arg("--against")
        .arg(src)
        .assert()
}

fn stdout_of(out: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&out.get_output().stdout).into_owned()
}

/// XORs one bit of byte `at` of `tensor`'s data in the single shard of
/// `dst`, and drops reshard.json so only `--against` can notice.
fn flip(dst: &Path, tensor: &str, at: u64) {
    let shard = dst.join("model.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n as usize]).unwrap();
    let start = header[tensor]["data_offsets"][0].as_u64().unwrap();
    bytes[(8 + n + start + at) as usize] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    std::fs::remove_file(dst.join("reshard.json")).unwrap();
}

#[test]
fn every_scaled_scheme_is_byte_identical_to_its_reference_quantizer() {
    let Some(python) = oracle_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let llama = fixture("tiny-llama");
    let f32_sharded = fixture("tiny-llama-f32-sharded");
    // bf16, f16 (by --dtype: the cast is quantized, as the references see
    // it) and f32 sources; 4x4 blocks divide every tiny-llama dimension,
    // so transformers' quantizer (which refuses partial blocks) is the
    // oracle for every weight.
    let cases: [(&Path, &[&str], &[&str]); 3] = [
        (&llama, &[], &[]),
        (&llama, &["--dtype", "f16"], &["--dtype", "f16"]),
        (&f32_sharded, &[], &[]),
    ];
    for (n, (src, flags, oracle_flags)) in cases.iter().enumerate() {
        for scheme in SCHEMES {
            let dst = dir.path().join(format!("{scheme}-{n}"));
            let mut args = vec!["--quantize", scheme];
            let mut extra: Vec<&str> = oracle_flags.to_vec();
            if scheme == "fp8-block" {
                args.extend(["--block", "4x4"]);
                extra.extend(["--block", "4", "4"]);
            }
            args.extend(flags.iter());
            convert(src, &dst, &args).success();
            let mut oracle_args = vec![scheme.as_ref(), src.as_os_str(), dst.as_os_str()];
            oracle_args.extend(extra.iter().map(std::ffi::OsStr::new));
            let summary = oracle(&python, &oracle_args);
            assert_eq!(summary["quantized"], 14, "{scheme} {n}: {summary}");
            assert_eq!(summary["kept"], 7, "{scheme} {n}: {summary}");
            let ok = validate_against(&dst, src).success();
            assert!(
                stdout_of(&ok).contains("compared with the source quantized again"),
                "{}",
                stdout_of(&ok)
            );
        }
    }
}

#[test]
fn validate_against_fails_on_one_flipped_code_scale_or_companion() {
    let dir = tempfile::tempdir().unwrap();
    let llama = fixture("tiny-llama");
    let cases = [
        ("fp8-channel", "model.layers.0.mlp.up_proj.weight", 5),
        ("fp8-channel", "model.layers.1.mlp.up_proj.weight_scale", 1),
        (
            "fp8-block",
            "model.layers.0.self_attn.q_proj.weight_scale_inv",
            2,
        ),
        (
            "fp8-scaled",
            "model.layers.1.self_attn.o_proj.comfy_quant",
            3,
        ),
        (
            "fp8-scaled-legacy",
            "model.layers.0.self_attn.k_proj.scale_weight",
            0,
        ),
    ];
    for (scheme, tensor, at) in cases {
        let dst = dir.path().join(format!("{scheme}-{at}"));
        convert(&llama, &dst, &["--quantize", scheme]).success();
        validate_against(&dst, &llama).success();
        flip(&dst, tensor, at);
        let failed = validate_against(&dst, &llama).code(1);
        let out = stdout_of(&failed);
        assert!(
            out.contains(&format!("tensor {tensor:?}: differs")),
            "{scheme}: {out}"
        );
        assert!(out.contains("FAILED: 1 problem"), "{scheme}: {out}");
    }
}

/// `src` quantized with `scheme` into `dir/SCHEME`, and that output
/// dequantized by reshard into `dir/SCHEME-dense` (bf16).
fn quantized_and_dense(dir: &Path, src: &Path, scheme: &str) -> (PathBuf, PathBuf) {
    let dst = dir.join(scheme);
    let dense = dir.join(format!("{scheme}-dense"));
    convert(src, &dst, &["--quantize", scheme]).success();
    convert(&dst, &dense, &["--dtype", "bf16"]).success();
    (dst, dense)
}

#[test]
fn fp8_channel_and_fp8_block_load_in_transformers_as_reshard_dequantizes_them() {
    let Some(python) = oracle_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let llama = fixture("tiny-llama");
    for scheme in ["fp8-channel", "fp8-block"] {
        let (dst, dense) = quantized_and_dense(dir.path(), &llama, scheme);
        let summary = oracle(
            &python,
            &[
                "load".as_ref(),
                dst.as_os_str(),
                dense.as_os_str(),
                llama.as_os_str(),
            ],
        );
        // Every weight the loader holds equals reshard's dequantization
        // (checked in the script). FineGrainedFP8 with dequantize=True runs
        // those very bf16 weights: identical logits. compressed-tensors'
        // FP8_DYNAMIC also quantizes each token's activations to FP8 at run
        // time (3 mantissa bits: up to 1/16 relative per value), so its
        // logits move by a few percent of their range; 10% bounds that with
        // room while a misread scale (off by a factor) moves them by far
        // more.
        let vs_dense = summary["logits_vs_dequantized"].as_f64().unwrap();
        let vs_source = summary["logits_vs_source"].as_f64().unwrap();
        match scheme {
            "fp8-block" => assert_eq!(vs_dense, 0.0, "{summary}"),
            _ => assert!(vs_dense < 0.1, "{summary}"),
        }
        assert!(vs_source < 0.1, "{summary}");
    }
}

#[test]
fn fp8_scaled_outputs_dequantize_in_comfy_kitchen_as_in_reshard() {
    let Some(python) = oracle_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let llama = fixture("tiny-llama");
    for scheme in ["fp8-scaled", "fp8-scaled-legacy"] {
        let (dst, dense) = quantized_and_dense(dir.path(), &llama, scheme);
        let summary = oracle(
            &python,
            &["comfy".as_ref(), dst.as_os_str(), dense.as_os_str()],
        );
        assert_eq!(summary["dequantized"], 14, "{summary}");
        // The dense output is plain: no companions, no layer list that
        // would tell ComfyUI its bf16 weights are FP8.
        let got = read_all(&dense);
        assert!(got
            .keys()
            .all(|k| !k.ends_with("comfy_quant") && !k.ends_with("scaled_fp8")));
        let ck = reshard::format::open(&dense).unwrap();
        assert!(!ck.metadata.contains_key("_quantization_metadata"));
        assert_eq!(read_all(&llama).len(), got.len());
    }
}

/// A FLUX-shaped file (real key names, small dims), one weight all zeros.
fn flux_with_a_zero_weight(path: &Path) {
    let names: [(&str, [u64; 2]); 6] = [
        ("img_in.weight", [64, 32]),
        ("final_layer.linear.weight", [64, 64]),
        ("double_blocks.0.img_attn.qkv.weight", [96, 64]),
        ("double_blocks.0.img_mlp.0.weight", [128, 64]),
        ("double_blocks.0.img_mlp.2.weight", [64, 128]),
        ("single_blocks.0.linear1.weight", [96, 64]),
    ];
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    let mut seed = 7u32;
    for (name, shape) in &names {
        let start = data.len();
        for _ in 0..shape[0] * shape[1] {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let v = if name.contains("img_mlp.2") {
                0.0f32
            } else {
                ((seed >> 8) as f32 / (1 << 24) as f32 - 0.5) * 3.0
            };
            data.extend(&((v.to_bits() >> 16) as u16).to_le_bytes());
        }
        header.insert(
            name.to_string(),
            json!({"dtype": "BF16", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    write_safetensors(path, &serde_json::Value::Object(header), &data);
}

#[test]
fn a_flux_file_keeps_its_family_list_and_an_all_zero_weight_gets_the_reference_scale() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("flux.safetensors");
    flux_with_a_zero_weight(&src);
    let zero = "double_blocks.0.img_mlp.2";
    // The scale each reference gives an all-zero weight: transformers 1
    // (448 / amax with amax replaced by 1), compressed-tensors the dtype's
    // epsilon (bf16: 2^-7), comfy-kitchen 0 with NaN codes (0 * inf),
    // where reshard writes 1 and zero codes instead.
    let cases = [
        ("fp8-scaled", "weight_scale", "F32", 1.0f32),
        ("fp8-scaled-legacy", "scale_weight", "F32", 1.0),
        ("fp8-channel", "weight_scale", "BF16", 2f32.powi(-7)),
        ("fp8-block", "weight_scale_inv", "F32", 1.0),
    ];
    // fp8-channel and fp8-block describe themselves in config.json: a
    // one-file source is refused for them, a folder with a config is not.
    let folder = dir.path().join("flux");
    std::fs::create_dir(&folder).unwrap();
    std::fs::copy(&src, folder.join("model.safetensors")).unwrap();
    std::fs::write(folder.join("config.json"), "{\"model_type\": \"flux\"}\n").unwrap();
    let before = read_all(&src);
    for (scheme, suffix, dtype, expected) in cases {
        let dst = dir.path().join(scheme);
        let src = if scheme.starts_with("fp8-scaled") {
            src.clone()
        } else {
            let refused = convert(&src, &dst, &["--quantize", scheme]).code(2);
            let err = String::from_utf8_lossy(&refused.get_output().stderr).into_owned();
            assert!(err.contains("use --quantize fp8-scaled"), "{err}");
            assert!(!dst.exists(), "{scheme}: nothing written");
            folder.clone()
        };
        convert(&src, &dst, &["--quantize", scheme]).success();
        let got = read_all(&dst);
        for kept in ["img_in.weight", "final_layer.linear.weight"] {
            assert_eq!(got[kept], before[kept], "{scheme}: {kept} kept as it was");
            let stem = kept.trim_end_matches(".weight");
            assert!(!got.contains_key(&format!("{stem}.{suffix}")), "{scheme}");
        }
        for q in [
            "double_blocks.0.img_attn.qkv",
            "single_blocks.0.linear1",
            zero,
        ] {
            assert_eq!(got[&format!("{q}.weight")].0, "F8_E4M3", "{scheme}: {q}");
            assert_eq!(got[&format!("{q}.{suffix}")].0, dtype, "{scheme}: {q}");
        }
        let ck = reshard::format::open(&dst).unwrap();
        let reader = reshard::format::read::SourceReader::open(&ck).unwrap();
        let bytes_of = |name: &str| {
            let t = ck.tensors.iter().find(|t| t.name == name).unwrap();
            let mut stream = reader.tensor_bytes(t);
            let mut out = vec![0u8; t.len as usize];
            reader.read_chunk(t, &mut stream, &mut out).unwrap();
            out
        };
        assert!(
            bytes_of(&format!("{zero}.weight")).iter().all(|&b| b == 0),
            "{scheme}"
        );
        let scales = bytes_of(&format!("{zero}.{suffix}"));
        let values: Vec<f32> = match dtype {
            "BF16" => scales
                .chunks(2)
                .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
                .collect(),
            _ => scales
                .chunks(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        };
        assert!(
            !values.is_empty() && values.iter().all(|&v| v == expected),
            "{scheme}: {values:?}"
        );
        if scheme == "fp8-scaled" {
            let layers: serde_json::Value =
                serde_json::from_str(&ck.metadata["_quantization_metadata"]).unwrap();
            let mut listed: Vec<&String> = layers["layers"].as_object().unwrap().keys().collect();
            listed.sort();
            assert_eq!(
                listed,
                [
                    "double_blocks.0.img_attn.qkv",
                    "double_blocks.0.img_mlp.0",
                    zero,
                    "single_blocks.0.linear1"
                ]
            );
        }
        if scheme == "fp8-scaled-legacy" {
            assert_eq!(got["scaled_fp8"].0, "F8_E4M3");
        }
        validate_against(&dst, &src).success();
    }
}

#[test]
fn fit_quantize_predicts_the_bytes_convert_writes() {
    let dir = tempfile::tempdir().unwrap();
    let llama = fixture("tiny-llama");
    for scheme in SCHEMES {
        let out = reshard()
            .args(["fit", "--json", "--quantize", scheme])
            .arg(&llama)
            .output()
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let what_if = &report["what_if"];
        assert_eq!(what_if["quantize"], scheme);
        let dst = dir.path().join(scheme);
        convert(&llama, &dst, &["--quantize", scheme]).success();
        let ck = reshard::format::open(&dst).unwrap();
        let written: u64 = ck.tensors.iter().map(|t| t.len).sum();
        let shard = std::fs::metadata(dst.join("model.safetensors"))
            .unwrap()
            .len();
        assert_eq!(what_if["tensor_sum"], written, "{scheme}");
        assert_eq!(what_if["shard_sum"], shard, "{scheme}");
        assert!(
            written < report["today"]["tensor_sum"].as_u64().unwrap(),
            "{scheme}"
        );
    }
}

/// A folder whose weights span many lead reads and rayon tasks: one weight
/// wider than a lead read (`[8, 40000]`), one of many short rows
/// (`[300, 1000]`), in f32.
fn wide_model(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let names: [(&str, [u64; 2]); 3] = [
        ("model.layers.0.mlp.up_proj.weight", [8, 40000]),
        ("model.layers.0.mlp.down_proj.weight", [300, 1000]),
        ("model.layers.0.input_layernorm.weight", [1, 64]),
    ];
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    let mut seed = 11u32;
    for (name, shape) in &names {
        let start = data.len();
        for i in 0..shape[0] * shape[1] {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
            // Outliers every 9973 values, so blocks and rows differ.
            let big = if i % 9973 == 0 { 40.0 } else { 1.0 };
            let v = ((seed >> 8) as f32 / (1 << 24) as f32 - 0.5) * big;
            // -0.0 now and then, and a whole row of it: compressed-tensors
            // writes code 0x00 for it, the other references 0x80.
            let v = if i % 997 == 3 || (shape[0] == 300 && i / shape[1] == 7) {
                -0.0
            } else {
                v
            };
            data.extend(&v.to_le_bytes());
        }
        header.insert(
            name.to_string(),
            json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    write_safetensors(
        &dir.join("model.safetensors"),
        &serde_json::Value::Object(header),
        &data,
    );
    std::fs::write(dir.join("config.json"), "{\"model_type\": \"llama\"}\n").unwrap();
}

#[test]
fn weights_wider_than_a_lead_read_match_the_references_at_any_window() {
    let Some(python) = oracle_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("wide");
    wide_model(&src);
    for scheme in SCHEMES {
        for window in ["64KiB", "16MiB"] {
            let dst = dir.path().join(format!("{scheme}-{window}"));
            let mut args = vec!["--quantize", scheme, "--window", window, "--dtype", "bf16"];
            let os = std::ffi::OsStr::new;
            let mut oracle_args = vec![
                os(scheme),
                src.as_os_str(),
                dst.as_os_str(),
                os("--dtype"),
                os("bf16"),
            ];
            if scheme == "fp8-block" {
                args.extend(["--block", "4x8"]);
                oracle_args.extend([os("--block"), os("4"), os("8")]);
            }
            convert(&src, &dst, &args).success();
            let summary = oracle(&python, &oracle_args);
            assert_eq!(summary["quantized"], 2, "{scheme} {window}: {summary}");
        }
    }
}

#[test]
fn bad_scaled_flags_are_refused_with_exit_2_and_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("out");
    let llama = fixture("tiny-llama");
    let cases: [(&[&str], &str); 4] = [
        (&["--quantize", "fp8-block", "--block", "0x128"], "0"),
        (&["--quantize", "fp8-scaled", "--block", "64x64"], "--block"),
        (&["--dtype", "fp8"], "--quantize"),
        (&["--quantize", "fp8-blocks"], "fp8-block"),
    ];
    for (args, says) in cases {
        let out = convert(&llama, &dst, args).code(2);
        let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!dst.exists(), "{args:?}");
    }
}
