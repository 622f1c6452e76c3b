//! GGUF out, proven through diffusers (issue 28): a diffusion transformer
//! reshard writes as GGUF loads through diffusers' single-file loader with
//! `GGUFQuantizationConfig` (given a local config, so nothing comes from
//! the Hub), and its output for a fixed input is within each type's bound
//! of the original safetensors loaded the same way.
//!
//! The model is a tiny LTX-Video transformer
//! (tests/fixtures/gguf/diffusion/ltxv.py): diffusers' FLUX single-file
//! converter has FLUX.1's width written into it (3072, which makes even a
//! one-block FLUX about 2 GB), while its LTX-Video converter takes every
//! dimension from the config. Measured max |output difference| (outputs up
//! to 1.96): F16 0.00056, BF16 0.0047, Q8_0 0.0117, Q6_K 0.0082, Q4_K 0.034,
//! Q4_0 0.203; each bound below is about three times that.

use crate::common::*;

fn script() -> std::path::PathBuf {
    fixture("gguf/diffusion/ltxv.py")
}

#[test]
fn ltx_video_ggufs_load_in_diffusers_within_each_types_bound() {
    let Some(python) = python_with("torch, diffusers, gguf") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    run_python(
        &python,
        Program::Script(&script()),
        &["build".as_ref(), dir.as_os_str()],
    );
    let src = dir.join("ltxv.safetensors");
    // (args, bound, GGML-block parameters at least: 287 when every
    // quantizable weight is a block type; the K-quants take only rows of
    // 256, the 64-wide rest falls back to F16).
    let cases: [(&[&str], &str, &str); 6] = [
        (&["--dtype", "f16"], "0.005", "0"),
        (&["--dtype", "bf16"], "0.03", "287"),
        (&["--quantize", "q8_0"], "0.05", "287"),
        (&["--quantize", "q6_k"], "0.05", "29"),
        (&["--quantize", "q4_k"], "0.15", "29"),
        (&["--quantize", "q4_0"], "0.6", "287"),
    ];
    for (args, bound, least) in cases {
        let name = format!("ltxv-{}.gguf", args[1]);
        convert(&src, &dir.join(&name), args).success();
        let out = run_python(
            &python,
            Program::Script(&script()),
            &["check", &dir.display().to_string(), &name, bound, least],
        );
        assert!(out.contains("ok"), "{args:?}: {out}");
    }
    validate_against(&dir.join("ltxv-q8_0.gguf"), &src).success();
}
