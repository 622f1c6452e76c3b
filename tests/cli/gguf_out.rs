//! `reshard convert SRC out.gguf`: the GGUF writer (issue 28).
//!
//! Without Python: the tiny Llama and Qwen2 give the same bytes as
//! llama.cpp's convert_hf_to_gguf.py (the committed fixtures it wrote);
//! a FLUX-shaped model built here round-trips through reshard's own GGUF
//! reader (exact for F32, the f16 rounding for F16, within half a step for
//! Q8_0); a split set reads back as one model; the K-quant tensors are the
//! bytes of `reshard::cast::gguf::kquantize`; bad requests exit 2 with
//! nothing written. With `RESHARD_TEST_PYTHON`: gguf-py's `GGUFReader`
//! reads every file, and its `gguf.quants.quantize` gives the same Q8_0,
//! Q4_0, F16 and BF16 bytes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use reshard::cast::gguf::kquantize::{quantize_q4_k, quantize_q6_k};
use reshard::format::gguf::ggml::GgmlType;
use reshard::format::gguf::value::Value;

use crate::common::*;

/// Deterministic values in about [-2, 2) with a few larger ones.
pub(crate) fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|i| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let v = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0;
            if i % 97 == 5 {
                v * 8.0
            } else {
                v
            }
        })
        .collect()
}

/// The FLUX-shaped source: (name, shape). Rows of 256 (every scheme), of
/// 96 (Q8_0 and Q4_0, not K-quants), of 40 (no scheme: F16), a 1-D bias
/// and a tiny matrix (F32 whatever the scheme), and `img_in`.
const FLUX: &[(&str, &[u64])] = &[
    ("double_blocks.0.img_attn.proj.weight", &[64, 256]),
    ("double_blocks.0.img_attn.proj.bias", &[64]),
    ("double_blocks.0.img_mlp.0.weight", &[48, 96]),
    ("double_blocks.1.img_mlp.0.weight", &[40, 40]),
    ("img_in.weight", &[32, 64]),
    ("final_layer.linear.weight", &[16, 16]),
];

/// Writes FLUX as F32 safetensors at `path`; returns each tensor's values.
pub(crate) fn write_flux(path: &Path) -> BTreeMap<String, Vec<f32>> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    let mut out = BTreeMap::new();
    for (i, (name, shape)) in FLUX.iter().enumerate() {
        let n: u64 = shape.iter().product();
        let v = values(n as usize, i as u64 + 1);
        let start = data.len();
        data.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        header.insert(
            (*name).into(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
        out.insert((*name).to_string(), v);
    }
    write_safetensors(path, &serde_json::Value::Object(header), &data);
    out
}

/// Every tensor of a safetensors file as f32 values.
fn read_f32(path: &Path) -> BTreeMap<String, Vec<f32>> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
            let v = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            (name, v)
        })
        .collect()
}

/// The header of a GGUF file reshard wrote, read by reshard's reader.
pub(crate) fn header(path: &Path) -> reshard::format::gguf::GgufFile {
    reshard::format::gguf::read_header(path).unwrap()
}

fn types(path: &Path) -> BTreeMap<String, GgmlType> {
    header(path)
        .tensors
        .iter()
        .map(|t| (t.name.clone(), t.ggml_type))
        .collect()
}

/// Converts `src` into `dst` with `args`, expecting success.
fn to_gguf(src: &Path, dst: &Path, args: &[&str]) {
    convert(src, dst, &[&["-q"], args].concat()).success();
}

/// The GGUF `gguf` converted back to f32 safetensors by reshard.
fn back(gguf: &Path, dir: &Path) -> BTreeMap<String, Vec<f32>> {
    // A folder (a name ending in .gguf would ask for GGUF again).
    let out = dir.join(format!(
        "back-{}",
        gguf.file_stem().unwrap().to_string_lossy()
    ));
    convert(gguf, &out, &["-q", "--dtype", "f32"]).success();
    read_f32(&out.join("model.safetensors"))
}

#[test]
fn gguf_out_llms_are_the_bytes_convert_hf_to_gguf_writes() {
    let dir = tempfile::tempdir().unwrap();
    for (model, args, oracle) in [
        ("llama", &["--quantize", "q8_0"][..], "llama-q8_0.gguf"),
        ("llama", &["--dtype", "f16"][..], "llama-f16.gguf"),
        ("qwen2", &["--quantize", "q8_0"][..], "qwen2-q8_0.gguf"),
    ] {
        let out = dir.path().join(oracle);
        to_gguf(&fixture(&format!("gguf/llm/{model}")), &out, args);
        let ours = std::fs::read(&out).unwrap();
        let theirs = std::fs::read(fixture(&format!("gguf/llm/{oracle}"))).unwrap();
        assert_eq!(ours.len(), theirs.len(), "{oracle}: length");
        let first = ours.iter().zip(&theirs).position(|(a, b)| a != b);
        assert_eq!(first, None, "{oracle}: first differing byte");
    }
}

#[test]
fn gguf_out_round_trips_through_reshards_reader() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("flux.safetensors");
    let source = write_flux(&src);

    // F32 source, no --dtype: every tensor F32, values exact.
    let f32_out = dir.path().join("f32.gguf");
    to_gguf(&src, &f32_out, &[]);
    assert!(types(&f32_out).values().all(|&t| t == GgmlType::F32));
    assert_eq!(back(&f32_out, dir.path()), source);
    let h = header(&f32_out);
    assert_eq!(h.metadata.get_str("general.architecture"), Some("flux"));
    assert_eq!(
        h.metadata.get("general.file_type"),
        Some(&Value::U32(0)),
        "ALL_F32"
    );

    // --dtype f16: matrices F16 (values rounded to f16), 1-D and tiny F32.
    let f16_out = dir.path().join("f16.gguf");
    to_gguf(&src, &f16_out, &["--dtype", "f16"]);
    let t = types(&f16_out);
    assert_eq!(t["double_blocks.0.img_attn.proj.bias"], GgmlType::F32);
    assert_eq!(t["final_layer.linear.weight"], GgmlType::F32);
    assert_eq!(t["double_blocks.0.img_mlp.0.weight"], GgmlType::F16);
    for (name, got) in back(&f16_out, dir.path()) {
        let want = &source[&name];
        let rounded = t[&name] == GgmlType::F16;
        for (g, w) in got.iter().zip(want) {
            let w = if rounded {
                half::f16::from_f32(*w).to_f32()
            } else {
                *w
            };
            assert_eq!(g.to_bits(), w.to_bits(), "{name}");
        }
    }

    // --quantize q8_0: rows of 256 and 96 quantized, rows of 40 F16.
    let q8 = dir.path().join("q8.gguf");
    to_gguf(&src, &q8, &["--quantize", "q8_0"]);
    let t = types(&q8);
    assert_eq!(t["double_blocks.0.img_attn.proj.weight"], GgmlType::Q8_0);
    assert_eq!(t["double_blocks.0.img_mlp.0.weight"], GgmlType::Q8_0);
    assert_eq!(t["double_blocks.1.img_mlp.0.weight"], GgmlType::F16);
    assert_eq!(t["double_blocks.0.img_attn.proj.bias"], GgmlType::F32);
    assert_eq!(
        header(&q8).metadata.get("general.file_type"),
        Some(&Value::U32(7))
    );
    let got = back(&q8, dir.path());
    for (name, ty) in &t {
        if *ty != GgmlType::Q8_0 {
            continue;
        }
        for (g, w) in got[name].chunks(32).zip(source[name].chunks(32)) {
            let d = w.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
            let d16 = half::f16::from_f32(d).to_f32();
            for (a, b) in g.iter().zip(w) {
                // Half a step of the stored scale, plus the scale's own
                // f16 rounding over at most 127 steps.
                let bound = d16 / 2.0 + 127.0 * (d16 - d).abs() + 1e-6;
                assert!((a - b).abs() <= bound, "{name}: {a} vs {b} (bound {bound})");
            }
        }
    }
}

#[test]
fn gguf_out_split_set_reads_back_as_one_model_with_metadata_first() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("flux.safetensors");
    let source = write_flux(&src);
    let set = dir.path().join("set.gguf");
    to_gguf(&src, &set, &["--max-shard-size", "40KB"]);
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    files.sort();
    let count = files.len();
    assert!(count >= 2, "{files:?}");
    assert!(!set.exists(), "a split set has no NAME.gguf");
    let mut tensors = 0;
    for (n, f) in files.iter().enumerate() {
        assert_eq!(
            f.file_name().unwrap().to_string_lossy(),
            format!("set-{:05}-of-{count:05}.gguf", n + 1)
        );
        let h = header(f);
        assert_eq!(h.metadata.get("split.no"), Some(&Value::U16(n as u16)));
        assert_eq!(
            h.metadata.get("split.count"),
            Some(&Value::U16(count as u16))
        );
        assert_eq!(
            h.metadata.get("split.tensors.count"),
            Some(&Value::I32(FLUX.len() as i32))
        );
        let arch = h.metadata.get_str("general.architecture");
        assert_eq!(arch.is_some(), n == 0, "{}", f.display());
        tensors += h.tensors.len();
    }
    assert_eq!(tensors, FLUX.len());
    assert_eq!(back(&files[0], dir.path()), source);
    // No staging folder is left behind.
    assert!(!dir.path().join(".set.gguf.reshard").exists());
}

#[test]
fn gguf_out_kquants_are_the_kquantize_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("flux.safetensors");
    let source = write_flux(&src);
    let name = "double_blocks.0.img_attn.proj.weight";
    for (scheme, ty, quantize, bytes) in [
        (
            "q4_k",
            GgmlType::Q4_K,
            quantize_q4_k as fn(&[f32], &mut [u8]) -> _,
            144,
        ),
        ("q6_k", GgmlType::Q6_K, quantize_q6_k, 210),
    ] {
        let out = dir.path().join(format!("{scheme}.gguf"));
        to_gguf(&src, &out, &["--quantize", scheme]);
        let h = header(&out);
        let t = h.tensors.iter().find(|t| t.name == name).unwrap();
        assert_eq!(t.ggml_type, ty);
        // Rows of 96 and 40 do not divide into 256: F16.
        assert_eq!(
            types(&out)["double_blocks.0.img_mlp.0.weight"],
            GgmlType::F16
        );
        let file = std::fs::read(&out).unwrap();
        let ours = &file[t.offset as usize..][..t.len.unwrap() as usize];
        let mut want = vec![0u8; 64 * bytes];
        quantize(&source[name], &mut want).unwrap();
        assert_eq!(ours, &want[..], "{scheme}");
    }
}

#[test]
fn gguf_out_validate_reads_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("flux.safetensors");
    write_flux(&src);
    let out = dir.path().join("q8.gguf");
    to_gguf(&src, &out, &["--quantize", "q8_0"]);
    reshard().arg("validate").arg(&out).assert().success();
    // convert --validate reads a file, or a split set from its first file.
    for extra in [&[][..], &["--max-shard-size", "20KB"][..]] {
        let out = dir.path().join(format!("v{}.gguf", extra.len()));
        let args = [
            &["-q", "--quantize", "q8_0", "--validate", "--device", "cpu"][..],
            extra,
        ]
        .concat();
        convert(&src, &out, &args).success();
    }
    // --against compares it with the source converted again (see
    // gguf_against.rs for what it catches).
    reshard()
        .arg("validate")
        .arg(&out)
        .arg("--against")
        .arg(&src)
        .assert()
        .success();
}

/// Runs a conversion that must fail with exit 2, naming `needle`, and
/// leave `dir` as it was.
fn refused(dir: &Path, src: &Path, dst: &Path, args: &[&str], needle: &str) {
    let before = tree_hashes(dir);
    let out = convert(src, dst, args).code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(err.contains(needle), "{args:?}: {err}");
    assert_eq!(tree_hashes(dir), before, "{args:?} wrote something");
}

#[test]
fn gguf_out_bad_requests_exit_2_with_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("flux.safetensors");
    write_flux(&src);
    let d = dir.path();
    let gguf = d.join("o.gguf");
    refused(
        d,
        &src,
        &d.join("out"),
        &["--quantize", "q8_0"],
        "name a NAME.gguf file",
    );
    refused(
        d,
        &src,
        &d.join("o.safetensors"),
        &["--quantize", "q4_k"],
        "writes GGUF blocks",
    );
    refused(
        d,
        &src,
        &gguf,
        &["--quantize", "fp8"],
        "FP8 safetensors scheme",
    );
    refused(
        d,
        &src,
        &gguf,
        &["--dtype", "f64"],
        "GGUF stores F32, F16 or BF16",
    );

    // K-quants on a model none of whose rows divide into 256.
    let narrow = d.join("narrow.safetensors");
    let v = values(48 * 96, 3);
    let data: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    write_safetensors(
        &narrow,
        &serde_json::json!({
            "double_blocks.0.img_attn.proj.weight": {"dtype": "F32", "shape": [48, 96], "data_offsets": [0, data.len()]}
        }),
        &data,
    );
    refused(
        d,
        &narrow,
        &gguf,
        &["--quantize", "q4_k"],
        "no tensor has rows that divide into 256-value blocks",
    );

    // Neither a diffusion family nor a supported LLM.
    let unknown = d.join("unknown.safetensors");
    write_safetensors(
        &unknown,
        &serde_json::json!({"encoder.weight": {"dtype": "F32", "shape": [4, 8], "data_offsets": [0, 128]}}),
        &[0u8; 128],
    );
    refused(d, &unknown, &gguf, &[], "cannot tell which model this is");

    // An LLM whose tokenizer is missing.
    let llm = d.join("llama");
    std::fs::create_dir(&llm).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture(&format!("gguf/llm/llama/{f}")), llm.join(f)).unwrap();
    }
    refused(d, &llm, &gguf, &["--quantize", "q8_0"], "tokenizer.json");
}

/// gguf-py's reader and quantizers on every file reshard writes here.
const ORACLE: &str = r#"
import sys, numpy as np
from gguf import GGUFReader, GGMLQuantizationType as T, GGUFValueType as V, quants
from safetensors.numpy import load_file
src = load_file(sys.argv[1])
checked = 0
for path in sys.argv[2:]:
    r = GGUFReader(path)
    kinds = {k: f.types[0] for k, f in r.fields.items() if f.types}
    for key, want in [("split.no", V.UINT16), ("split.count", V.UINT16),
                      ("split.tensors.count", V.INT32), ("general.alignment", V.UINT32),
                      ("general.file_type", V.UINT32), ("general.quantization_version", V.UINT32),
                      ("general.architecture", V.STRING)]:
        assert kinds.get(key, want) == want, (path, key, kinds.get(key))
    for t in r.tensors:
        x = src[t.name]
        assert tuple(int(d) for d in reversed(t.shape)) == x.shape, (path, t.name, t.shape)
        ours = np.asarray(t.data).view(np.uint8).reshape(-1)
        if t.tensor_type in (T.Q8_0, T.Q4_0, T.F16, T.BF16, T.F32):
            want = quants.quantize(x.astype(np.float32), t.tensor_type).view(np.uint8).reshape(-1)
            assert np.array_equal(ours, want), (path, t.name, t.tensor_type.name)
            checked += 1
print("checked", checked)
"#;

#[test]
fn gguf_out_matches_gguf_py() {
    let Some(python) = python_with("gguf, numpy, safetensors") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("flux.safetensors");
    write_flux(&src);
    let mut files = Vec::new();
    for (name, args) in [
        ("f32.gguf", &[][..]),
        ("f16.gguf", &["--dtype", "f16"][..]),
        ("bf16.gguf", &["--dtype", "bf16"][..]),
        ("q8_0.gguf", &["--quantize", "q8_0"][..]),
        ("q4_0.gguf", &["--quantize", "q4_0"][..]),
        ("q6_k.gguf", &["--quantize", "q6_k"][..]),
    ] {
        let out = dir.path().join(name);
        to_gguf(&src, &out, args);
        files.push(out);
    }
    let split = dir.path().join("split").join("s.gguf");
    std::fs::create_dir(split.parent().unwrap()).unwrap();
    to_gguf(
        &src,
        &split,
        &["--quantize", "q8_0", "--max-shard-size", "20KB"],
    );
    for e in std::fs::read_dir(split.parent().unwrap()).unwrap() {
        files.push(e.unwrap().path());
    }
    let mut args = vec![src.clone()];
    args.extend(files);
    let out = run_python(&python, Program::Code(ORACLE), &args);
    let checked: usize = out
        .trim()
        .strip_prefix("checked ")
        .unwrap()
        .parse()
        .unwrap();
    // Every tensor of the first five files, and the F32/F16 of the K-quant
    // and split files.
    assert!(checked >= 5 * FLUX.len(), "{out}");
}

#[test]
fn gguf_out_stacks_moe_experts_as_the_concatenation_of_their_blocks() {
    // A tiny Mixtral: the sources of tests/fixtures/gguf/llm/to_gguf
    // (whose names, shapes and metadata the to_gguf unit tests check
    // against the converter), with values made here.
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("mixtral");
    std::fs::create_dir(&model).unwrap();
    let llm = fixture("gguf/llm");
    std::fs::copy(
        llm.join("to_gguf/mixtral.config.json"),
        model.join("config.json"),
    )
    .unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(llm.join("llama").join(f), model.join(f)).unwrap();
    }
    let view: serde_json::Value =
        serde_json::from_slice(&std::fs::read(llm.join("to_gguf/mixtral.json")).unwrap()).unwrap();
    let mut json = serde_json::Map::new();
    let mut data = Vec::new();
    let mut source = BTreeMap::new();
    for (i, s) in view["sources"].as_array().unwrap().iter().enumerate() {
        let name = s[0].as_str().unwrap().to_string();
        let shape: Vec<u64> = s[1]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        let v = values(shape.iter().product::<u64>() as usize, 100 + i as u64);
        let start = data.len();
        data.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        json.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
        source.insert(name, v);
    }
    write_safetensors(
        &model.join("model.safetensors"),
        &serde_json::Value::Object(json),
        &data,
    );
    let out = dir.path().join("mixtral.gguf");
    to_gguf(&model, &out, &["--quantize", "q8_0"]);
    let h = header(&out);
    let file = std::fs::read(&out).unwrap();
    let mut stacked = 0;
    for (gguf, proj) in [
        ("ffn_gate_exps", "w1"),
        ("ffn_down_exps", "w2"),
        ("ffn_up_exps", "w3"),
    ] {
        for block in 0..2 {
            let name = format!("blk.{block}.{gguf}.weight");
            let t = h.tensors.iter().find(|t| t.name == name).unwrap();
            assert_eq!(t.ggml_type, GgmlType::Q8_0, "{name}");
            assert_eq!(t.shape[0], 4, "{name}");
            let mut want = Vec::new();
            for e in 0..4 {
                let x = &source
                    [&format!("model.layers.{block}.block_sparse_moe.experts.{e}.{proj}.weight")];
                let mut q = vec![0u8; x.len() / 32 * 34];
                reshard::cast::gguf::quantize::quantize_blocks(GgmlType::Q8_0, x, &mut q).unwrap();
                want.extend(q);
            }
            assert_eq!(
                &file[t.offset as usize..][..want.len()],
                &want[..],
                "{name}"
            );
            stacked += 1;
        }
    }
    assert_eq!(stacked, 6);
    // The router stays F32.
    let gate = h
        .tensors
        .iter()
        .find(|t| t.name == "blk.0.ffn_gate_inp.weight")
        .unwrap();
    assert_eq!(gate.ggml_type, GgmlType::F32);
    // validate --against stacks the experts again, and measures each
    // stacked tensor against its four sources in order.
    let run = reshard()
        .args(["validate", "--no-progress", "--against"])
        .arg(&model)
        .arg(&out)
        .assert()
        .success();
    let text = String::from_utf8_lossy(&run.get_output().stdout).into_owned();
    assert!(text.contains("Q8_0: names, rows, blocks"), "{text}");
    // Q8_0's error (about 0.5%), not that of experts measured against
    // each other's values (above 100%).
    let rms: f64 = text
        .lines()
        .find(|l| l.starts_with("  error over "))
        .and_then(|l| l.split("relative RMS ").nth(1))
        .and_then(|r| r.split('%').next())
        .and_then(|r| r.parse().ok())
        .unwrap_or(f64::MAX);
    assert!(rms < 2.0, "{text}");
}

#[test]
fn gguf_out_diffusion_wrapper_is_stripped_and_the_rest_left_out() {
    // A one-file SDXL checkpoint: the UNet under model.diffusion_model.,
    // a VAE tensor outside it (left out, as ComfyUI-GGUF's converter does).
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("sdxl.safetensors");
    let names = [
        (
            "model.diffusion_model.label_emb.0.0.weight",
            vec![64u64, 64],
        ),
        (
            "model.diffusion_model.input_blocks.1.0.in_layers.2.weight",
            vec![64, 64, 3, 3],
        ),
        ("model.diffusion_model.out.2.bias", vec![4]),
        ("first_stage_model.decoder.conv_in.weight", vec![8, 4, 3, 3]),
    ];
    let mut json = serde_json::Map::new();
    let mut data = Vec::new();
    for (i, (name, shape)) in names.iter().enumerate() {
        let v = values(shape.iter().product::<u64>() as usize, i as u64);
        let start = data.len();
        data.extend(
            v.iter()
                .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()),
        );
        json.insert(
            (*name).into(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    write_safetensors(&src, &serde_json::Value::Object(json), &data);
    let out = dir.path().join("sdxl.gguf");
    let run = convert(&src, &out, &["--quantize", "q8_0", "--dry-run"]).success();
    let text = String::from_utf8_lossy(&run.get_output().stdout).into_owned();
    assert!(
        text.contains("gguf: architecture sdxl (diffusion)"),
        "{text}"
    );
    assert!(text.contains("left out: 1 tensors"), "{text}");
    to_gguf(&src, &out, &["--quantize", "q8_0"]);
    let h = header(&out);
    assert_eq!(h.metadata.get_str("general.architecture"), Some("sdxl"));
    let t = types(&out);
    let want: BTreeMap<String, GgmlType> = [
        ("label_emb.0.0.weight", GgmlType::Q8_0),
        // Rows of 3 (a 3x3 convolution's last axis): F16, as llama.cpp.
        ("input_blocks.1.0.in_layers.2.weight", GgmlType::F16),
        // 1-D from BF16: F32.
        ("out.2.bias", GgmlType::F32),
    ]
    .into_iter()
    .map(|(n, t)| (n.to_string(), t))
    .collect();
    assert_eq!(t, want);
}

#[test]
fn gguf_out_keep_quantize_only_and_keep_dtype_select_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("flux.safetensors");
    write_flux(&src);
    let out = dir.path().join("k.gguf");
    to_gguf(&src, &out, &["--quantize", "q8_0", "--keep", "*img_mlp*"]);
    let t = types(&out);
    assert_eq!(t["double_blocks.0.img_attn.proj.weight"], GgmlType::Q8_0);
    assert_eq!(t["double_blocks.0.img_mlp.0.weight"], GgmlType::F32);
    let out = dir.path().join("o.gguf");
    let args = [
        "--quantize",
        "q8_0",
        "--quantize-only",
        "*img_mlp*",
        "--dtype",
        "f16",
        "--keep-dtype",
        "img_in*",
    ];
    to_gguf(&src, &out, &args);
    let t = types(&out);
    assert_eq!(t["double_blocks.0.img_attn.proj.weight"], GgmlType::F16);
    assert_eq!(t["double_blocks.0.img_mlp.0.weight"], GgmlType::Q8_0);
    assert_eq!(t["img_in.weight"], GgmlType::F32);
}

#[test]
fn gguf_out_split_rerun_replaces_members_an_earlier_run_moved_out() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("flux.safetensors");
    let source = write_flux(&src);
    let set = dir.path().join("set.gguf");
    to_gguf(&src, &set, &["--max-shard-size", "40KB"]);
    let mut members: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".gguf"))
        .collect();
    members.sort();
    assert!(members.len() >= 2, "{members:?}");
    let (first, last) = (members[0].clone(), members[members.len() - 1].clone());
    // A run stopped between its renames: the later members are in place,
    // the first (renamed last) is not. The rerun finishes the set without
    // --overwrite, since what it replaces holds the same bytes.
    std::fs::remove_file(&first).unwrap();
    to_gguf(&src, &set, &["--max-shard-size", "40KB"]);
    assert_eq!(back(&first, dir.path()), source);
    assert!(!dir.path().join(".set.gguf.reshard").exists());
    // A member with other bytes is the user's: still refused.
    std::fs::write(&last, b"the user's").unwrap();
    std::fs::remove_file(&first).unwrap();
    let out = convert(&src, &set, &["--max-shard-size", "40KB"]).code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(err.contains("pass --overwrite"), "{err}");
    assert_eq!(std::fs::read(&last).unwrap(), b"the user's");
    assert!(!first.exists());
}

/// A FLUX-shaped model with one more F32 tensor named `name`.
fn write_flux_with(path: &Path, name: &str) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (i, (n, shape)) in FLUX
        .iter()
        .copied()
        .chain([(name, &[4u64, 32][..])])
        .enumerate()
    {
        let count: u64 = shape.iter().product();
        let start = data.len();
        data.extend(
            values(count as usize, i as u64 + 1)
                .iter()
                .flat_map(|x| x.to_le_bytes()),
        );
        header.insert(
            n.into(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    write_safetensors(path, &serde_json::Value::Object(header), &data);
}

#[test]
fn gguf_out_refuses_tensor_names_llama_cpp_cannot_load() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // GGML_MAX_NAME is 64 with the NUL: 63 bytes load, 64 do not.
    let fits = d.join("fits.safetensors");
    write_flux_with(&fits, &"a".repeat(63));
    to_gguf(&fits, &d.join("fits.gguf"), &["--quantize", "q8_0"]);
    assert!(types(&d.join("fits.gguf")).contains_key(&"a".repeat(63)));
    let long = d.join("long.safetensors");
    write_flux_with(&long, &"b".repeat(64));
    refused(
        d,
        &long,
        &d.join("long.gguf"),
        &["--quantize", "q8_0"],
        &format!("long.safetensors: tensor {:?}", "b".repeat(64)),
    );
}

#[test]
fn gguf_out_an_unreadable_tokenizer_file_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("llama");
    copy_dir(&fixture("gguf/llm/llama"), &model);
    std::fs::remove_file(model.join("tokenizer.json")).unwrap();
    std::fs::create_dir(model.join("tokenizer.json")).unwrap();
    let out = convert(&model, &dir.path().join("o.gguf"), &["--quantize", "q8_0"]).code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(err.contains("tokenizer.json"), "{err}");
    // Not blamed on config.json, which is fine.
    assert!(!err.contains("config.json (in"), "{err}");
    assert!(!dir.path().join("o.gguf").exists());
}

#[test]
fn gguf_out_refuses_zero_element_tensors_with_overflowing_dims() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let v = values(64 * 256, 1);
    let data: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    // No bytes, so the safetensors size check passes; GGML's int64 counts
    // do not. A plain empty tensor still converts.
    for (shape, ok) in [
        (serde_json::json!([0, 64]), true),
        (serde_json::json!([0, 1u64 << 62]), false),
    ] {
        let src = d.join("z.safetensors");
        write_safetensors(
            &src,
            &serde_json::json!({
                "double_blocks.0.img_attn.proj.weight": {"dtype": "F32", "shape": [64, 256], "data_offsets": [0, data.len()]},
                "empty": {"dtype": "F32", "shape": shape, "data_offsets": [data.len(), data.len()]}
            }),
            &data,
        );
        let out = d.join("z.gguf");
        if ok {
            to_gguf(&src, &out, &[]);
            assert!(types(&out).contains_key("empty"));
            std::fs::remove_file(&out).unwrap();
        } else {
            refused(
                d,
                &src,
                &out,
                &[],
                "z.safetensors: tensor \"empty\" has shape",
            );
        }
    }
}
