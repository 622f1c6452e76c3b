//! `reshard convert model.gguf DST --dtype ...`: GGUF back to safetensors.
//! The f32 output equals gguf-py's dequantization (tests/fixtures/gguf/
//! expected.json) bit for bit, a 16-bit output equals reshard's own cast of
//! it, ComfyUI-GGUF's recorded shapes come back, every tensor's source type
//! is recorded, and what cannot be converted is refused before anything is
//! written.

use std::path::Path;

use crate::common::*;

fn expected_of(file: &str) -> serde_json::Value {
    let all: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("gguf/expected.json")).unwrap()).unwrap();
    all["files"][file].clone()
}

/// The `__metadata__` of a safetensors file.
fn shard_metadata(path: &Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header["__metadata__"].clone()
}

#[test]
fn every_type_dequantizes_to_gguf_pys_f32_and_shapes_and_sources_are_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("out");
    convert(&fixture("gguf/dequant.gguf"), &dst, &["--dtype", "f32"]).success();
    let got = read_all(&dst);
    let expected = expected_of("dequant.gguf");
    let expected = expected.as_object().unwrap();
    assert_eq!(got.len(), expected.len());
    let meta = shard_metadata(&dst.join("model.safetensors"));
    let from: serde_json::Value =
        serde_json::from_str(meta["reshard.gguf.dequantized_from"].as_str().unwrap()).unwrap();
    assert_eq!(meta["reshard.gguf.source"], "dequant.gguf");
    for (name, e) in expected {
        let (dtype, shape, sha) = &got[name];
        assert_eq!(dtype, "F32", "{name}");
        assert_eq!(sha, e["sha256"].as_str().unwrap(), "values of {name}");
        assert_eq!(from[name], e["type"], "recorded source type of {name}");
        if name == "reshaped.weight" {
            assert_eq!(shape, &[4, 16, 16], "comfy.gguf.orig_shape");
        } else {
            let want: Vec<u64> = serde_json::from_value(e["shape"].clone()).unwrap();
            assert_eq!(shape, &want, "{name}");
        }
    }
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dst.join("reshard.json")).unwrap()).unwrap();
    let tensors = manifest["gguf"]["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), expected.len());
    assert!(tensors
        .iter()
        .any(|t| t["tensor"] == "q4_k.weight" && t["from"] == "Q4_K"));
}

#[test]
fn a_16_bit_output_is_the_cast_of_the_f32_dequantization() {
    let dir = tempfile::tempdir().unwrap();
    let f32_out = dir.path().join("f32");
    convert(&fixture("gguf/dequant.gguf"), &f32_out, &["--dtype", "f32"]).success();
    for dtype in ["bf16", "f16"] {
        let direct = dir.path().join(format!("direct-{dtype}"));
        let via_f32 = dir.path().join(format!("via-{dtype}"));
        convert(
            &fixture("gguf/dequant.gguf"),
            &direct,
            &["--dtype", dtype, "--on-overflow", "inf"],
        )
        .success();
        convert(
            &f32_out,
            &via_f32,
            &["--dtype", dtype, "--on-overflow", "inf"],
        )
        .success();
        let (a, b) = (read_all(&direct), read_all(&via_f32));
        assert_eq!(a, b, "{dtype}");
        assert!(a.values().all(|(d, _, _)| d == &dtype.to_uppercase()));
    }
}

#[test]
fn quantized_tensors_without_dtype_and_types_reshard_cannot_read_are_refused_first() {
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("out");
    let out = convert(&fixture("gguf/dequant.gguf"), &dst, &[]).code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(
        err.contains("dequant.gguf") && err.contains("is Q") && err.contains("--dtype"),
        "{err}"
    );
    assert!(!dst.join("model.safetensors").exists());

    let out = convert(
        &fixture("gguf/types.gguf"),
        &dst,
        &["--dtype", "bf16", "--keep-gguf-names"],
    )
    .code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(
        err.contains("\"iq4_nl.weight\"") && err.contains("IQ4_NL"),
        "{err}"
    );
    assert!(!dst.join("model.safetensors").exists());

    // A llama-architecture file whose tensors are not a llama's.
    let out = convert(&fixture("gguf/types.gguf"), &dst, &["--dtype", "bf16"]).code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(
        err.contains("\"f32.weight\" has no name") && err.contains("--keep-gguf-names"),
        "{err}"
    );
}

#[test]
fn a_split_set_converts_as_one_model_from_any_member() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for n in ["split-00001-of-00002.gguf", "split-00002-of-00002.gguf"] {
        std::fs::copy(fixture("gguf").join(n), src.join(n)).unwrap();
    }
    let expected = [
        expected_of("split-00001-of-00002.gguf"),
        expected_of("split-00002-of-00002.gguf"),
    ];
    for member in ["split-00001-of-00002.gguf", "split-00002-of-00002.gguf"] {
        // A DST ending in .gguf would name a GGUF file: a folder per member.
        let dst = dir.path().join(member.replace(".gguf", ""));
        convert(
            &src.join(member),
            &dst,
            &["--dtype", "f32", "--keep-gguf-names"],
        )
        .success();
        let got = read_all(&dst);
        let names: Vec<&str> = got.keys().map(String::as_str).collect();
        assert_eq!(names, ["blk.0.weight", "blk.1.weight", "blk.2.weight"]);
        for (name, (_, _, sha)) in &got {
            let e = expected.iter().find_map(|f| f.get(name)).unwrap();
            assert_eq!(sha, e["sha256"].as_str().unwrap(), "{member}: {name}");
        }
    }
}

/// The data offset of `tensor` in a safetensors file.
fn data_offset(path: &Path, tensor: &str) -> usize {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    8 + n + header[tensor]["data_offsets"][0].as_u64().unwrap() as usize
}

#[test]
fn validate_reads_a_gguf_and_checks_an_output_against_it() {
    reshard()
        .args(["validate", "--device", "cpu"])
        .arg(fixture("gguf/dequant.gguf"))
        .assert()
        .success();
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("out");
    convert(&fixture("gguf/dequant.gguf"), &dst, &["--dtype", "bf16"]).success();
    let against = |dst: &Path| {
        reshard()
            .args(["validate", "--device", "cpu"])
            .arg(dst)
            .arg("--against")
            .arg(fixture("gguf/dequant.gguf"))
            .assert()
    };
    let out = against(&dst).success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(
        text.contains("15 tensors compared") && text.contains("12 through dequantization"),
        "{text}"
    );
    // One flipped bit of one dequantized value, with the manifest gone so
    // only the comparison can see it.
    let shard = dst.join("model.safetensors");
    let at = data_offset(&shard, "q4_k.weight") + 2 * 77;
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[at] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    std::fs::remove_file(dst.join("reshard.json")).unwrap();
    let out = against(&dst).code(1);
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(
        text.contains("\"q4_k.weight\"")
            && text.contains("GGUF tensor \"q4_k.weight\" (Q4_K) dequantized at element 77"),
        "{text}"
    );
}

#[test]
fn a_diffusion_gguf_becomes_one_file_unless_a_shard_size_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("one");
    convert(&fixture("gguf/dequant.gguf"), &one, &["--dtype", "bf16"]).success();
    let files: Vec<String> = std::fs::read_dir(&one)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".safetensors") || n.ends_with(".json") && n != "reshard.json")
        .collect();
    assert_eq!(files, ["model.safetensors"], "one file, no index");
    if let Some(python) = python_with("safetensors, torch") {
        // What ComfyUI's loader does with a single file.
        let code = "import sys, safetensors.torch as st\n\
                    sd = st.load_file(sys.argv[1])\n\
                    print(len(sd), tuple(sd['reshaped.weight'].shape), sd['q8_0.weight'].dtype)";
        let out = run_python(
            &python,
            Program::Code(code),
            &[one.join("model.safetensors").as_os_str()],
        );
        assert_eq!(out.trim(), "15 (4, 16, 16) torch.bfloat16");
    }
    let sharded = dir.path().join("sharded");
    convert(
        &fixture("gguf/dequant.gguf"),
        &sharded,
        &["--dtype", "bf16", "--max-shard-size", "20KB"],
    )
    .success();
    assert!(sharded.join("model.safetensors.index.json").is_file());
}
