//! GGUF out and non-finite source values (issue 28's NaN policy). In a
//! block type (Q8_0, Q4_0, Q4_K, Q6_K) one NaN or infinity spoils its
//! block's scale, so the other values of the block decode as NaN (all 32
//! of Q8_0's and Q4_0's, all 256 of Q4_K's) or as zeros (Q6_K's 16-value
//! sub-block): gguf-py and llama.cpp's converter write that silently. reshard refuses
//! it, naming the file and tensor (exit 2, nothing written), unless
//! `--on-overflow inf` or `saturate` asks for gguf-py's bytes. F16, BF16
//! and F32 carry NaN and infinity through as they are.

use std::path::Path;

use crate::common::*;

/// A FLUX-named F32 source whose `double_blocks.0.img_attn.proj.weight`
/// holds one +inf and `double_blocks.0.img_mlp.0.weight` one NaN.
fn poisoned_flux(path: &Path) {
    let shapes: [(&str, [usize; 2]); 3] = [
        ("double_blocks.0.img_attn.proj.weight", [64, 256]),
        ("double_blocks.0.img_mlp.0.weight", [32, 256]),
        ("img_in.weight", [32, 64]),
    ];
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (i, (name, [rows, cols])) in shapes.iter().enumerate() {
        let mut v: Vec<f32> = (0..rows * cols)
            .map(|k| ((k * 7 + i * 13) % 101) as f32 / 50.0 - 1.0)
            .collect();
        match i {
            0 => v[3 * cols + 5] = f32::INFINITY,
            1 => v[cols + 1] = f32::NAN,
            _ => {}
        }
        let start = data.len();
        data.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        header.insert(
            (*name).into(),
            serde_json::json!({"dtype": "F32", "shape": [rows, cols], "data_offsets": [start, data.len()]}),
        );
    }
    write_safetensors(path, &serde_json::Value::Object(header), &data);
}

#[test]
fn a_nan_or_infinity_in_a_block_type_is_refused_unless_on_overflow_asks_for_ggufpys_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("flux.safetensors");
    poisoned_flux(&src);
    for scheme in ["q8_0", "q4_0", "q4_k", "q6_k"] {
        let out = tmp.path().join(format!("{scheme}.gguf"));
        let run = reshard()
            .arg("convert")
            .arg(&src)
            .arg(&out)
            .args(["--quantize", scheme, "--no-progress"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{scheme}: {err}");
        assert!(
            err.contains("flux.safetensors")
                && err.contains("double_blocks.0.img_attn.proj.weight")
                && err.contains("spoils the other values")
                && err.contains("--on-overflow inf"),
            "{scheme}: {err}"
        );
        assert!(!out.exists(), "{scheme}: an output was written");
        for policy in ["inf", "saturate"] {
            convert(
                &src,
                &out,
                &["--quantize", scheme, "--on-overflow", policy, "--overwrite"],
            )
            .success();
            // The bytes are the source encoded again (gguf-py's), and the
            // error figures count the values that decode as NaN (Q6_K's
            // zeros are finite: only the infinity itself is counted).
            let validated = reshard()
                .arg("validate")
                .arg(&out)
                .arg("--against")
                .arg(&src)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&validated.stdout);
            assert!(validated.status.success(), "{scheme} {policy}: {text}");
            let not_finite = match scheme {
                "q4_k" => 256,
                "q6_k" => 1,
                _ => 32,
            };
            assert!(
                text.contains(&format!("({not_finite} not finite)")),
                "{scheme} {policy}: {text}"
            );
        }
    }
}

#[test]
fn nan_and_infinity_pass_through_f16_bf16_and_f32() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("flux.safetensors");
    poisoned_flux(&src);
    for dtype in ["f16", "bf16", "f32"] {
        let out = tmp.path().join(format!("{dtype}.gguf"));
        convert(&src, &out, &["--dtype", dtype]).success();
        validate_against(&out, &src).success();
    }
}

#[test]
fn a_block_of_finite_values_whose_f16_scale_overflows_is_refused_unless_on_overflow() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("flux.safetensors");
    let mut v = vec![0.25f32; 64 * 256];
    v[1000] = 1.0e6; // Q4_0's d = max / -8 is past F16; Q8_0's is not
    let data: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let header = serde_json::json!({
        "double_blocks.0.img_attn.proj.weight": {"dtype": "F32", "shape": [64, 256], "data_offsets": [0, data.len()]}
    });
    write_safetensors(&src, &header, &data);
    let out = tmp.path().join("q4.gguf");
    let run = reshard()
        .arg("convert")
        .arg(&src)
        .arg(&out)
        .args(["--quantize", "q4_0", "--no-progress"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{err}");
    assert!(
        err.contains("1 Q4_0 block holds values too large for an F16 block scale"),
        "{err}"
    );
    assert!(!out.exists());
    convert(&src, &out, &["--quantize", "q4_0", "--on-overflow", "inf"]).success();
    convert(&src, &tmp.path().join("q8.gguf"), &["--quantize", "q8_0"]).success();
}
