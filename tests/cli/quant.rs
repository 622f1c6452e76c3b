//! Quantized checkpoints: `convert --dtype` dequantizes FP8 (block, channel,
//! tensor scales) and MXFP4 bit for bit, the output loads as a plain model,
//! a missing scale is refused, inspect names what is wrong, scales travel
//! with their weights when nothing is dequantized, `validate --against`
//! compares through the dequantization, and memory stays in the window.
//!
//! The Python test builds its checkpoints with torch (tests/cli/quant.py)
//! and checks the outputs against torch, transformers' MXFP4 code and
//! ml_dtypes; the others hand-encode their bytes.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;

/// A Python with torch and transformers.
fn torch_python() -> Option<PathBuf> {
    python_with("torch, transformers, ml_dtypes")
}

fn quant_py(python: &Path, step: &str, dir: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cli/quant.py");
    let stdout = run_python(
        python,
        Program::Script(&script),
        &[OsStr::new(step), dir.as_os_str()],
    );
    eprint!("{stdout}");
}

#[test]
fn every_format_dequantizes_like_torch_and_loads_in_transformers() {
    let Some(python) = torch_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    quant_py(&python, "build", root);
    let cases: [(&str, &str, &[&str]); 8] = [
        ("fp8-block", "fp8-block-out", &["--dtype", "bf16"]),
        ("fp8-block", "fp8-block-f16-out", &["--dtype", "f16"]),
        ("compressed", "compressed-out", &["--dtype", "bf16"]),
        ("modelopt", "modelopt-out", &["--dtype", "bf16"]),
        ("mxfp4", "mxfp4-out", &["--dtype", "bf16"]),
        (
            "mxfp4-all",
            "mxfp4-all-out",
            &["--dtype", "bf16", "--on-overflow", "inf"],
        ),
        (
            "scaled/model.safetensors",
            "scaled-out",
            &["--dtype", "bf16"],
        ),
        (
            "scaled/model.safetensors",
            "scaled-f32-out",
            &["--dtype", "f32"],
        ),
    ];
    for (src, dst, extra) in cases {
        convert(&root.join(src), &root.join(dst), extra).success();
        let mut validate = reshard();
        validate
            .arg("validate")
            .arg(root.join(dst))
            .arg("--against")
            .arg(root.join(src));
        let out = validate.assert().success();
        let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
        assert!(text.contains("through dequantization"), "{src}: {text}");
    }
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(root.join("fp8-block-out/reshard.json")).unwrap())
            .unwrap();
    let q = &manifest["quantization"];
    assert_eq!(q["format"], "fp8");
    assert_eq!(q["config"]["weight_block_size"], json!([32, 32]));
    assert_eq!(q["dequantized"], true);
    assert_eq!(q["tensors"].as_array().unwrap().len(), 14);
    assert!(q["dropped"]
        .as_array()
        .unwrap()
        .contains(&json!("model.layers.0.mlp.down_proj.weight_scale_inv")));
    // Scales sat in the other shard than their weights for layer 0, and
    // without --dtype each lands in its weight's shard.
    let kept = root.join("fp8-block-kept");
    convert(&root.join("fp8-block"), &kept, &["--max-shard-size", "6KB"]).success();
    assert_scales_with_weights(&kept, "_scale_inv");
    let config = std::fs::read_to_string(kept.join("config.json")).unwrap();
    assert!(
        config.contains("quantization_config"),
        "kept as is: {config}"
    );
    quant_py(&python, "check", root);
}

/// Every `X<suffix>` of the output's index is in the same file as `X`.
fn assert_scales_with_weights(dir: &Path, suffix: &str) {
    let index: Value =
        serde_json::from_slice(&std::fs::read(dir.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let map = index["weight_map"].as_object().unwrap();
    let files: std::collections::BTreeSet<&str> =
        map.values().map(|v| v.as_str().unwrap()).collect();
    assert!(files.len() > 2, "small shards: {files:?}");
    let mut pairs = 0;
    for (name, file) in map {
        if let Some(weight) = name.strip_suffix(suffix) {
            assert_eq!(map[weight], *file, "{name} is not with {weight}");
            pairs += 1;
        }
    }
    assert!(pairs > 0);
}

/// E4M3 codes of 1.0, 1.5, 2.0, -0.5, 448, 0.
const ONE: u8 = 0x38;
const ONE_HALF: u8 = 0x3c;
const TWO: u8 = 0x40;
const MINUS_HALF: u8 = 0xb0;

/// A 3x5 F8_E4M3 weight with 2x2 block scales ([2, 3], partial edges) in
/// F32 in a second shard, a norm in BF16, an index and an fp8 config.
fn block_checkpoint(dir: &Path, with_scale: bool) -> PathBuf {
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let codes: Vec<u8> = [
        ONE, ONE_HALF, TWO, MINUS_HALF, ONE, //
        TWO, ONE, ONE, ONE, 0x7e, //
        ONE_HALF, MINUS_HALF, 0, ONE, TWO,
    ]
    .to_vec();
    let mut a = codes.clone();
    a.extend([0u8; 1]);
    a.extend([0x80, 0x3f, 0x80, 0x3f]); // norm: bf16 1.0, 1.0
    let header = json!({
        "__metadata__": {"format": "pt"},
        "model.layers.0.mlp.down_proj.weight": {"dtype": "F8_E4M3", "shape": [3, 5], "data_offsets": [0, 15]},
        "pad": {"dtype": "U8", "shape": [1], "data_offsets": [15, 16]},
        "model.norm.weight": {"dtype": "BF16", "shape": [2], "data_offsets": [16, 20]},
    });
    write_safetensors(&src.join("model-00001-of-00002.safetensors"), &header, &a);
    let scales: Vec<u8> = [0.5f32, 2.0, 0.25, 4.0, 1.0, 0.125]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut map = json!({
        "model.layers.0.mlp.down_proj.weight": "model-00001-of-00002.safetensors",
        "pad": "model-00001-of-00002.safetensors",
        "model.norm.weight": "model-00001-of-00002.safetensors",
    });
    let mut header = json!({"__metadata__": {"format": "pt"}});
    if with_scale {
        header["model.layers.0.mlp.down_proj.weight_scale_inv"] =
            json!({"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]});
        map["model.layers.0.mlp.down_proj.weight_scale_inv"] =
            json!("model-00002-of-00002.safetensors");
    }
    let at = if with_scale { 24 } else { 0 };
    header["orphan.weight_scale_inv"] =
        json!({"dtype": "F32", "shape": [1], "data_offsets": [at, at + 4]});
    map["orphan.weight_scale_inv"] = json!("model-00002-of-00002.safetensors");
    let mut b = if with_scale { scales } else { Vec::new() };
    b.extend(1.0f32.to_le_bytes());
    write_safetensors(&src.join("model-00002-of-00002.safetensors"), &header, &b);
    let total = 24 + if with_scale { 24 } else { 0 };
    let index = json!({"metadata": {"total_size": total}, "weight_map": map});
    std::fs::write(src.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let config = json!({
        "model_type": "llama",
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [2, 2], "activation_scheme": "dynamic"},
    });
    std::fs::write(src.join("config.json"), config.to_string()).unwrap();
    src
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn read_tensor(dir: &Path, name: &str) -> (String, Vec<u64>, Vec<u8>) {
    use std::io::Read;
    let ck = reshard::format::open(dir).unwrap();
    let reader = reshard::format::read::SourceReader::open(&ck).unwrap();
    let t = ck.tensors.iter().find(|t| t.name == name).unwrap();
    let mut bytes = Vec::new();
    reader.tensor_bytes(t).read_to_end(&mut bytes).unwrap();
    (t.dtype.name().to_string(), t.shape.clone(), bytes)
}

#[test]
fn partial_edge_blocks_use_their_own_scale_from_another_shard() {
    let tmp = tempfile::tempdir().unwrap();
    let src = block_checkpoint(tmp.path(), true);
    let dst = tmp.path().join("dst");
    convert(&src, &dst, &["--dtype", "f32"]).success();
    let (dtype, shape, bytes) = read_tensor(&dst, "model.layers.0.mlp.down_proj.weight");
    assert_eq!((dtype.as_str(), shape), ("F32", vec![3, 5]));
    // Row r, column c uses scale [r / 2][c / 2]: rows 0-1 (0.5, 2, 0.25),
    // row 2 (4, 1, 0.125); column 4 is the partial edge block.
    let want = [
        0.5, 0.75, 4.0, -1.0, 0.25, //
        1.0, 0.5, 2.0, 2.0, 112.0, //
        6.0, -2.0, 0.0, 1.0, 0.25,
    ];
    assert_eq!(f32s(&bytes), want);
    // A 16-byte window: chunks of 1 element (F8 in, F32 out), so chunks
    // end inside rows and blocks; the scale stream still lines up.
    let tiny = tmp.path().join("tiny");
    convert(
        &src,
        &tiny,
        &["--dtype", "f32", "--window", "16", "--threads", "1"],
    )
    .success();
    let (_, _, small) = read_tensor(&tiny, "model.layers.0.mlp.down_proj.weight");
    assert_eq!(f32s(&small), want);
    let names: Vec<String> = read_all(&dst).into_keys().collect();
    assert!(
        !names
            .iter()
            .any(|n| n.ends_with("down_proj.weight_scale_inv")),
        "{names:?}"
    );
    let config: Value =
        serde_json::from_slice(&std::fs::read(dst.join("config.json")).unwrap()).unwrap();
    assert!(config.get("quantization_config").is_none(), "{config}");
    assert_eq!(config["torch_dtype"], "float32");
    let mut validate = reshard();
    validate
        .arg("validate")
        .arg(&dst)
        .arg("--against")
        .arg(&src);
    validate
        .assert()
        .success()
        .stdout(predicates::str::contains("1 through dequantization"));
}

#[test]
fn compressed_tensors_block_strategy_reads_its_block_structure() {
    let tmp = tempfile::tempdir().unwrap();
    let src = block_checkpoint(tmp.path(), true);
    // The same scales under compressed-tensors' name, the block size from
    // config_groups.*.weights.block_structure, and an input_scale.
    let shard = src.join("model-00002-of-00002.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    let mut data = bytes[bytes.len() - 28..bytes.len() - 4].to_vec();
    data.extend(0.02f32.to_le_bytes());
    let header = json!({
        "__metadata__": {"format": "pt"},
        "model.layers.0.mlp.down_proj.weight_scale": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "model.layers.0.mlp.down_proj.input_scale": {"dtype": "F32", "shape": [1], "data_offsets": [24, 28]},
    });
    write_safetensors(&shard, &header, &data);
    let index = json!({"metadata": {"total_size": 48}, "weight_map": {
        "model.layers.0.mlp.down_proj.weight": "model-00001-of-00002.safetensors",
        "pad": "model-00001-of-00002.safetensors",
        "model.norm.weight": "model-00001-of-00002.safetensors",
        "model.layers.0.mlp.down_proj.weight_scale": "model-00002-of-00002.safetensors",
        "model.layers.0.mlp.down_proj.input_scale": "model-00002-of-00002.safetensors",
    }});
    std::fs::write(src.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let weights =
        json!({"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [2, 2]});
    let config = json!({"quantization_config": {"quant_method": "compressed-tensors",
        "format": "float-quantized", "config_groups": {"group_0": {"weights": weights}}}});
    std::fs::write(src.join("config.json"), config.to_string()).unwrap();
    let dst = tmp.path().join("dst");
    convert(&src, &dst, &["--dtype", "f32"]).success();
    let (_, _, bytes) = read_tensor(&dst, "model.layers.0.mlp.down_proj.weight");
    assert_eq!(f32s(&bytes)[..5], [0.5, 0.75, 4.0, -1.0, 0.25]);
    assert_eq!(f32s(&bytes)[10..], [6.0, -2.0, 0.0, 1.0, 0.25]);
    let names: Vec<String> = read_all(&dst).into_keys().collect();
    assert_eq!(
        names,
        [
            "model.layers.0.mlp.down_proj.weight",
            "model.norm.weight",
            "pad"
        ]
    );
}

#[test]
fn a_dequantized_tensor_that_differs_fails_validate_against() {
    let tmp = tempfile::tempdir().unwrap();
    let src = block_checkpoint(tmp.path(), true);
    let dst = tmp.path().join("dst");
    convert(&src, &dst, &["--dtype", "f32"]).success();
    // The same bytes with the scale of the edge block doubled.
    let other = tmp.path().join("other");
    copy_dir(&src, &other);
    let shard = other.join("model-00002-of-00002.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let at = bytes.len() - 4 - 24 + 8; // scale [0][2] = 0.25
    bytes[at..at + 4].copy_from_slice(&0.5f32.to_le_bytes());
    std::fs::write(&shard, bytes).unwrap();
    let mut validate = reshard();
    validate
        .arg("validate")
        .arg(&dst)
        .arg("--against")
        .arg(&other);
    validate.assert().code(1).stdout(predicates::str::contains(
        "differs from the dequantized model.layers.0.mlp.down_proj.weight times model.layers.0.mlp.down_proj.weight_scale_inv at element 4",
    ));
}

#[test]
fn a_weight_without_its_scale_is_refused_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let src = block_checkpoint(tmp.path(), false);
    let out = convert(&src, &tmp.path().join("dst"), &["--dtype", "bf16"]).code(2);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(
        stderr.contains("quantized weight \"model.layers.0.mlp.down_proj.weight\" has no scale")
            && stderr.contains("--allow-unscaled"),
        "{stderr}"
    );
    // Resharding as is refuses too: the output would carry the same hole.
    convert(&src, &tmp.path().join("kept"), &[]).code(2);
    let dst = tmp.path().join("unscaled");
    convert(&src, &dst, &["--dtype", "f32", "--allow-unscaled"]).success();
    let (_, _, bytes) = read_tensor(&dst, "model.layers.0.mlp.down_proj.weight");
    assert_eq!(f32s(&bytes)[..3], [1.0, 1.5, 2.0], "plain codes");
}

#[test]
fn inspect_names_the_quantization_and_what_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    let src = block_checkpoint(tmp.path(), false);
    let out = reshard().arg("inspect").arg(&src).assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(text.contains("quantized     fp8"), "{text}");
    assert!(text.contains("quantized weight \"model.layers.0.mlp.down_proj.weight\" in model-00001-of-00002.safetensors has no scale"), "{text}");
    assert!(
        text.contains("scale \"orphan.weight_scale_inv\" in model-00002-of-00002.safetensors has no quantized weight"),
        "{text}"
    );
    reshard()
        .args(["inspect", "--strict"])
        .arg(&src)
        .assert()
        .code(1);

    // A scale of the wrong shape: a finding, and convert refuses it.
    let src = block_checkpoint(&tmp.path().join("shape"), true);
    let shard = src.join("model-00002-of-00002.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    let header = json!({
        "__metadata__": {"format": "pt"},
        "model.layers.0.mlp.down_proj.weight_scale_inv": {"dtype": "F32", "shape": [3, 2], "data_offsets": [0, 24]},
        "orphan.weight_scale_inv": {"dtype": "F32", "shape": [1], "data_offsets": [24, 28]},
    });
    write_safetensors(&shard, &header, &bytes[bytes.len() - 28..]);
    let out = reshard()
        .args(["inspect", "--json"])
        .arg(&src)
        .assert()
        .success();
    let report: Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    let findings = report["findings"].as_array().unwrap();
    assert!(
        findings.iter().any(|f| f["kind"] == "quant_scale_shape"
            && f["tensor"] == "model.layers.0.mlp.down_proj.weight_scale_inv"
            && f["expected"].as_str().unwrap().contains("[2, 3]")),
        "{findings:?}"
    );
    assert_eq!(report["quantization"]["format"], "fp8");
    assert_eq!(report["quantization"]["scaled"], 0);
    convert(&src, &tmp.path().join("dst"), &["--dtype", "bf16"])
        .code(2)
        .stderr(predicates::str::contains("does not fit the weight"));
}

#[test]
fn an_unclear_quantization_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let src = block_checkpoint(tmp.path(), true);
    // weight_scale_inv names with a config that says compressed-tensors.
    let config = json!({"quantization_config": {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}}}});
    std::fs::write(src.join("config.json"), config.to_string()).unwrap();
    convert(&src, &tmp.path().join("dst"), &["--dtype", "bf16"])
        .code(2)
        .stderr(predicates::str::contains("ambiguous quantization"));
}

/// An MXFP4 weight of no values but 2^62 rows (`[1, 2^62, 0, 16]`, which
/// the header allows: zero bytes) is written at once; it once looped over
/// its 2^62 empty rows and never finished.
#[test]
fn an_mxfp4_weight_of_no_values_does_not_hang() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let rows = 1u64 << 62;
    write_safetensors(
        &src.join("model.safetensors"),
        &json!({
            "e_blocks": {"dtype": "U8", "shape": [1, rows, 0, 16], "data_offsets": [0, 0]},
            "e_scales": {"dtype": "U8", "shape": [1, rows, 0], "data_offsets": [0, 0]},
        }),
        &[],
    );
    let config = json!({"quantization_config": {"quant_method": "mxfp4"}});
    std::fs::write(src.join("config.json"), config.to_string()).unwrap();
    let dst = tmp.path().join("dst");
    reshard()
        .args(["convert", "--no-progress", "--dtype", "bf16"])
        .arg(&src)
        .arg(&dst)
        .timeout(Duration::from_secs(60))
        .assert()
        .success();
    let (dtype, shape, bytes) = read_tensor(&dst, "e");
    assert_eq!(
        (dtype.as_str(), shape, bytes.len()),
        ("BF16", vec![1, 0, rows], 0)
    );
}

/// FP8 -> bf16 of a 64 MiB weight (128 MiB out) within a 16 MiB window.
#[test]
fn dequantizing_stays_within_the_window() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("big");
    std::fs::create_dir_all(&src).unwrap();
    let (rows, cols) = (8192u64, 8192u64);
    let scales = rows.div_ceil(128) * cols.div_ceil(128);
    let codes = rows * cols;
    let header = json!({
        "__metadata__": {"format": "pt"},
        "model.layers.0.mlp.up_proj.weight": {"dtype": "F8_E4M3", "shape": [rows, cols], "data_offsets": [0, codes]},
        "model.layers.0.mlp.up_proj.weight_scale_inv": {"dtype": "F32", "shape": [rows / 128, cols / 128], "data_offsets": [codes, codes + 4 * scales]},
    });
    let mut data = vec![ONE; codes as usize];
    data.extend((0..scales).flat_map(|_| 0.5f32.to_le_bytes()));
    write_safetensors(&src.join("model.safetensors"), &header, &data);
    drop(data);
    let config =
        json!({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}});
    std::fs::write(src.join("config.json"), config.to_string()).unwrap();
    let dst = tmp.path().join("dst");
    let args: Vec<&OsStr> = [
        src.as_os_str(),
        dst.as_os_str(),
        OsStr::new("--no-progress"),
        OsStr::new("--dtype"),
        OsStr::new("bf16"),
        OsStr::new("--window"),
        OsStr::new("16MiB"),
    ]
    .to_vec();
    let mut full = vec![OsStr::new("convert")];
    full.extend(args);
    let Some((out, peak_kib)) = run_measured(&full, Duration::from_secs(300)) else {
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bound = (16 + 64) * 1024;
    assert!(
        peak_kib < bound,
        "peak RSS {peak_kib} KiB, over --window + 64 MiB ({bound} KiB)"
    );
    eprintln!("fp8 -> bf16 of 64 MiB in a 16 MiB window: peak RSS {peak_kib} KiB");
    let size = std::fs::metadata(dst.join("model.safetensors"))
        .unwrap()
        .len();
    assert!(size > 2 * codes, "{size}");
}
