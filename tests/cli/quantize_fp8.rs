//! `convert --quantize fp8|fp8-e5m2`: Linear weights stored as plain FP8,
//! bit for bit as torch's `clamp(±max).to(float8_*)`, everything else kept
//! byte for byte (or cast by --dtype), the family keep lists honoured, and
//! bad flags and already quantized sources refused with exit 2.

use serde_json::json;

use crate::common::*;

fn stderr_of(out: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&out.get_output().stderr).into_owned()
}

#[test]
fn bad_flags_and_quantized_sources_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("out");
    let llama = fixture("tiny-llama");
    convert(&llama, &dst, &["--quantize", "int4"]).code(2);
    convert(&llama, &dst, &["--keep", "*.mlp.*"]).code(2);
    let out = convert(&llama, &dst, &["--quantize", "fp8", "--keep", "a[b"]).code(2);
    assert!(stderr_of(&out).contains("--keep"), "{}", stderr_of(&out));
    let out = convert(
        &fixture("gguf/dequant.gguf"),
        &dst,
        &["--quantize", "fp8", "--dtype", "bf16"],
    )
    .code(2);
    assert!(
        stderr_of(&out).contains("already quantized"),
        "{}",
        stderr_of(&out)
    );
    assert!(!dst.exists() || std::fs::read_dir(&dst).unwrap().count() == 0);
}

/// A tiny FLUX-shaped single file: real FLUX key names, small dims.
fn flux_file(path: &std::path::Path) -> Vec<&'static str> {
    let names = [
        ("img_in.weight", vec![64u64, 32]),
        ("time_in.in_layer.weight", vec![64, 32]),
        ("double_blocks.0.img_attn.qkv.weight", vec![96, 64]),
        ("double_blocks.0.img_attn.norm.query_norm.scale", vec![32]),
        ("double_blocks.0.img_mlp.0.weight", vec![128, 64]),
        ("double_blocks.0.img_mlp.0.bias", vec![128]),
        ("double_blocks.0.img_mod.lin.weight", vec![96, 64]),
        ("single_blocks.0.linear1.weight", vec![96, 64]),
        ("final_layer.linear.weight", vec![64, 64]),
    ];
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    let mut i = 0u32;
    for (name, shape) in &names {
        let n: u64 = shape.iter().product();
        let start = data.len();
        for _ in 0..n {
            // bf16 values across the range, some past 448 (clamped).
            i = i.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let v = ((i >> 8) as f32 / (1 << 24) as f32 - 0.5) * 1200.0;
            data.extend(&((v.to_bits() >> 16) as u16).to_le_bytes());
        }
        header.insert(
            name.to_string(),
            json!({"dtype": "BF16", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    write_safetensors(path, &serde_json::Value::Object(header), &data);
    names.iter().map(|(n, _)| *n).collect()
}

#[test]
fn a_flux_file_quantizes_its_blocks_and_keeps_the_family_list_bit_exact_with_torch() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("flux.safetensors");
    let names = flux_file(&src);
    for (scheme, dtype, max) in [("fp8", "F8_E4M3", 448.0), ("fp8-e5m2", "F8_E5M2", 57344.0)] {
        let dst = dir.path().join(scheme);
        convert(&src, &dst, &["--quantize", scheme]).success();
        let got = read_all(&dst);
        let before = read_all(&src);
        let quantized = [
            "double_blocks.0.img_attn.qkv.weight",
            "double_blocks.0.img_mlp.0.weight",
            "double_blocks.0.img_mod.lin.weight",
            "single_blocks.0.linear1.weight",
        ];
        for name in &names {
            let (d, shape, sha) = &got[*name];
            if quantized.contains(name) {
                assert_eq!(d, dtype, "{scheme}: {name}");
                assert_eq!(shape, &before[*name].1);
            } else {
                assert_eq!(
                    (d, sha),
                    (&before[*name].0, &before[*name].2),
                    "{scheme}: {name} kept"
                );
            }
        }
        let Some(python) = python_with("torch, safetensors") else {
            continue;
        };
        let code = "import sys, torch, safetensors.torch as st\n\
                    a = st.load_file(sys.argv[1]); b = st.load_file(sys.argv[2])\n\
                    m = float(sys.argv[3]); t = getattr(torch, sys.argv[4])\n\
                    bad = [k for k in b if b[k].dtype == t and not torch.equal(\n\
                      a[k].clamp(-m, m).to(t).view(torch.uint8), b[k].view(torch.uint8))]\n\
                    print('bad', bad, 'n', sum(b[k].dtype == t for k in b))";
        let torch_dtype = if scheme == "fp8" {
            "float8_e4m3fn"
        } else {
            "float8_e5m2"
        };
        let shard = std::fs::read_dir(&dst)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .unwrap();
        let out = run_python(
            &python,
            Program::Code(code),
            &[
                src.as_os_str(),
                shard.as_os_str(),
                max.to_string().as_ref(),
                torch_dtype.as_ref(),
            ],
        );
        assert_eq!(out.trim(), "bad [] n 4", "{scheme}");
    }
}
